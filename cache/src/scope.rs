//! Who may read and write which cache entries: GitHub's scoping rules as one pure function,
//! [`scope_of`], from what GitHub's run says about a job ([`RunFacts`]), never from what the job
//! sends.
//!
//! GitHub's rules (docs "Caching dependencies", "Restrictions for accessing a cache"): an entry
//! saved by a ref is restorable by that ref; entries of the default branch are restorable by every
//! ref of the repository; a pull request's entries are not visible to the default branch nor to
//! other pull requests; another repository sees nothing.
//!
//! Fork and pull-request safety: a run whose event is a pull request one (`pull_request`,
//! `pull_request_target`, `pull_request_review`, ...) or whose head repository is not the
//! repository itself never writes a branch scope, even when its head branch is named like the
//! default branch (a fork's pull request from its own `main`). It writes a scope of its own,
//! `pr:<head_repository>:<head_branch>`, which only runs of that same pull-request head read. The
//! repository is stored beside every scope, so equal scope strings of two repositories never meet.

/// What GitHub's run says about who a job is (`GET /repos/{o}/{r}/actions/runs/{run_id}`, or the
/// journalled `workflow_job` delivery): the agent's facts, not the job's claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFacts {
    /// `owner/name` of the repository the run belongs to.
    pub repository: String,
    /// That repository's default branch, e.g. `main`.
    pub default_branch: String,
    /// The branch the run is for (`head_branch`).
    pub head_branch: String,
    /// The event that started the run (`push`, `pull_request`, `schedule`, ...).
    pub event: String,
    /// `owner/name` of the repository the head commit comes from (a fork for a fork's pull
    /// request).
    pub head_repository: String,
}

/// Where a caller may read (in order) and write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// `owner/name`: every read and write is confined to it.
    pub repository: String,
    /// The one scope the caller's saves go to.
    pub write: String,
    /// The scopes a restore searches, first to last (the caller's own first).
    pub read: Vec<String>,
}

/// The scope prefix of a trusted run's branch.
const BRANCH_PREFIX: &str = "refs/heads/";

/// The scope prefix of a pull request's (or a fork's) own entries.
const PULL_REQUEST_PREFIX: &str = "pr:";

/// Whether a run may write its branch's scope: not a pull request event, and its head commit
/// comes from the repository itself. An unknown head repository counts as foreign (fail closed).
fn trusted(facts: &RunFacts) -> bool {
    !facts.event.starts_with("pull_request")
        && !facts.head_repository.is_empty()
        // GitHub's owner and repository names are case-insensitive.
        && facts.head_repository.eq_ignore_ascii_case(&facts.repository)
}

/// The read and write scopes of a run, by GitHub's rules (module doc).
pub fn scope_of(facts: &RunFacts) -> Scope {
    let write = if trusted(facts) {
        format!("{BRANCH_PREFIX}{}", facts.head_branch)
    } else {
        format!(
            "{PULL_REQUEST_PREFIX}{}:{}",
            facts.head_repository.to_ascii_lowercase(),
            facts.head_branch
        )
    };
    let mut read = vec![write.clone()];
    if !facts.default_branch.is_empty() {
        let default = format!("{BRANCH_PREFIX}{}", facts.default_branch);
        if default != write {
            read.push(default);
        }
    }
    Scope {
        repository: facts.repository.to_ascii_lowercase(),
        write,
        read,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(event: &str, head_repository: &str, head_branch: &str) -> RunFacts {
        RunFacts {
            repository: "acme/app".into(),
            default_branch: "main".into(),
            head_branch: head_branch.into(),
            event: event.into(),
            head_repository: head_repository.into(),
        }
    }

    #[test]
    fn scopes_follow_githubs_rules() {
        // (event, head repository, head branch) -> (write, read)
        let table: &[(&str, &str, &str, &str, &[&str])] = &[
            // The default branch writes its own scope and reads only it.
            (
                "push",
                "acme/app",
                "main",
                "refs/heads/main",
                &["refs/heads/main"],
            ),
            // A feature branch reads its own, then the default branch's.
            (
                "push",
                "acme/app",
                "feature",
                "refs/heads/feature",
                &["refs/heads/feature", "refs/heads/main"],
            ),
            (
                "schedule",
                "acme/app",
                "main",
                "refs/heads/main",
                &["refs/heads/main"],
            ),
            (
                "workflow_dispatch",
                "ACME/App",
                "dev",
                "refs/heads/dev",
                &["refs/heads/dev", "refs/heads/main"],
            ),
            // A pull request from a branch of the repository: its own scope, never a branch's.
            (
                "pull_request",
                "acme/app",
                "feature",
                "pr:acme/app:feature",
                &["pr:acme/app:feature", "refs/heads/main"],
            ),
            // A fork's pull request from its own `main` never writes the default branch's scope.
            (
                "pull_request",
                "mallory/app",
                "main",
                "pr:mallory/app:main",
                &["pr:mallory/app:main", "refs/heads/main"],
            ),
            (
                "pull_request_target",
                "mallory/app",
                "main",
                "pr:mallory/app:main",
                &["pr:mallory/app:main", "refs/heads/main"],
            ),
            (
                "pull_request_review",
                "acme/app",
                "main",
                "pr:acme/app:main",
                &["pr:acme/app:main", "refs/heads/main"],
            ),
            // A head commit from another repository is foreign whatever the event says.
            (
                "push",
                "mallory/app",
                "main",
                "pr:mallory/app:main",
                &["pr:mallory/app:main", "refs/heads/main"],
            ),
            // An unknown head repository counts as foreign.
            (
                "push",
                "",
                "main",
                "pr::main",
                &["pr::main", "refs/heads/main"],
            ),
        ];
        for (event, head_repository, head_branch, write, read) in table {
            let scope = scope_of(&facts(event, head_repository, head_branch));
            assert_eq!(scope.repository, "acme/app");
            assert_eq!(
                &scope.write, write,
                "{event} {head_repository} {head_branch}"
            );
            assert_eq!(&scope.read, read, "{event} {head_repository} {head_branch}");
        }
    }

    #[test]
    fn a_pull_requests_write_scope_is_read_by_no_default_branch_nor_other_pull_request() {
        let main = scope_of(&facts("push", "acme/app", "main"));
        let pr_a = scope_of(&facts("pull_request", "acme/app", "a"));
        let pr_b = scope_of(&facts("pull_request", "mallory/app", "b"));
        assert!(!main.read.contains(&pr_a.write));
        assert!(!pr_b.read.contains(&pr_a.write));
        assert!(!pr_a.read.contains(&pr_b.write));
        // Every ref reads the default branch's entries.
        assert!(pr_a.read.contains(&main.write));
        assert!(pr_b.read.contains(&main.write));
    }

    #[test]
    fn no_default_branch_reads_only_its_own_scope() {
        let mut run = facts("push", "acme/app", "x");
        run.default_branch.clear();
        assert_eq!(scope_of(&run).read, vec!["refs/heads/x".to_owned()]);
    }
}
