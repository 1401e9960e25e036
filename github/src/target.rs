//! Where runners register: an organization or one repository, as written in a policy's
//! `target` ("acme" or "acme/widgets").

use std::fmt;
use std::str::FromStr;

/// An organization or a repository target.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    Org(String),
    Repo { owner: String, repo: String },
}

/// Why a target string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid target {0:?}: expected \"org\" or \"owner/repo\" (letters, digits, '-', '_', '.')"
)]
pub struct InvalidTarget(pub String);

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl FromStr for Target {
    type Err = InvalidTarget;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || InvalidTarget(s.to_owned());
        match s.split_once('/') {
            None if valid_name(s) => Ok(Target::Org(s.to_owned())),
            Some((owner, repo)) if valid_name(owner) && valid_name(repo) => Ok(Target::Repo {
                owner: owner.to_owned(),
                repo: repo.to_owned(),
            }),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Org(org) => f.write_str(org),
            Target::Repo { owner, repo } => write!(f, "{owner}/{repo}"),
        }
    }
}

impl Target {
    /// Whether `repository` ("owner/name", as webhooks and the journal name it) is this target
    /// or inside it. GitHub's names are case-insensitive.
    pub fn contains(&self, repository: &str) -> bool {
        let (owner, name) = repository.split_once('/').unwrap_or((repository, ""));
        match self {
            Target::Org(org) => owner.eq_ignore_ascii_case(org),
            Target::Repo { owner: o, repo: r } => {
                owner.eq_ignore_ascii_case(o) && name.eq_ignore_ascii_case(r)
            }
        }
    }

    /// The REST path prefix of this target's self-hosted runner endpoints.
    pub fn runners_path(&self) -> String {
        match self {
            Target::Org(org) => format!("/orgs/{org}/actions/runners"),
            Target::Repo { owner, repo } => format!("/repos/{owner}/{repo}/actions/runners"),
        }
    }

    /// The REST path that names the App installation covering this target.
    pub fn installation_path(&self) -> String {
        match self {
            Target::Org(org) => format!("/orgs/{org}/installation"),
            Target::Repo { owner, repo } => format!("/repos/{owner}/{repo}/installation"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_contains_its_repositories_whatever_their_case() {
        let org: Target = "acme".parse().unwrap();
        let repo: Target = "acme/widgets".parse().unwrap();
        assert!(org.contains("acme/anything"));
        assert!(org.contains("ACME/Widgets"));
        assert!(!org.contains("acme-corp/widgets"));
        assert!(!org.contains("other/acme"));
        assert!(repo.contains("Acme/WIDGETS"));
        assert!(!repo.contains("acme/widgets2"));
        assert!(!repo.contains("acme/gadgets"));
        assert!(!repo.contains("acme"));
    }

    #[test]
    fn parses_org_and_repo_targets() {
        assert_eq!("acme".parse(), Ok(Target::Org("acme".into())));
        assert_eq!(
            "acme/widgets.rs".parse(),
            Ok(Target::Repo {
                owner: "acme".into(),
                repo: "widgets.rs".into()
            })
        );
    }

    #[test]
    fn refuses_malformed_targets() {
        for bad in [
            "",
            "/",
            "acme/",
            "/widgets",
            "a/b/c",
            "acme/..",
            "ac me",
            "acme/wid?gets",
        ] {
            assert!(bad.parse::<Target>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn paths_follow_the_target_kind() {
        let org: Target = "acme".parse().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(org.runners_path(), "/orgs/acme/actions/runners");
        assert_eq!(org.installation_path(), "/orgs/acme/installation");
        let repo: Target = "acme/w".parse().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(repo.runners_path(), "/repos/acme/w/actions/runners");
        assert_eq!(repo.to_string(), "acme/w");
    }
}
