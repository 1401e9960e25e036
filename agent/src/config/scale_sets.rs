//! `[[scale_set]]`: a GitHub runner scale set, served by one policy's runners (issue 29). This
//! module owns the section's shape and its rules: a scale set names an existing policy, which
//! serves it alone; its labels (its name when none are written) are its own; and no webhook
//! policy carries one of them, since a job for the scale set also arrives as a webhook and would
//! then start a second runner (the double-demand guard, which `rm-agent check` reports the
//! same way, being this validation). It also owns where a scale set lives: its policy's target
//! (the App's installation), or an enterprise (`enterprise`, with the classic PAT in
//! `token_file`; the file itself is read and refused by `crate::secrets`, never here).

use std::collections::HashSet;
use std::path::PathBuf;

use serde::Deserialize;

use super::Policy;

/// The longest scale-set name accepted (GitHub's runner names are limited to 64 characters).
pub const MAX_NAME_LEN: usize = 64;

/// The runner group a scale set is created in when the file names none (GitHub's `Default`).
pub const DEFAULT_RUNNER_GROUP: u64 = 1;

/// `[[scale_set]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScaleSetSection {
    /// The scale set's name at GitHub; workflows say `runs-on: <name>`.
    pub name: String,
    /// The policy whose runners serve it: its target, isolation, limits, `min_runners` (the
    /// idle runners kept ready) and `max_runners`.
    pub policy: String,
    /// Extra labels of the scale set (multi-label scale sets); absent: its name alone.
    pub labels: Option<Vec<String>>,
    /// The runner group it is created in; absent: the policy's, else `Default` (1).
    pub runner_group_id: Option<u64>,
    /// The enterprise (its slug, as in `https://github.com/enterprises/<slug>`) the scale set
    /// lives in instead of the policy's target.
    pub enterprise: Option<String>,
    /// The file holding the classic personal access token (`manage_runners:enterprise`) of an
    /// enterprise scale set: the one credential GitHub takes for that scope.
    pub token_file: Option<PathBuf>,
}

/// An enterprise scale set's scope and credential (`enterprise`, `token_file`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enterprise {
    /// The enterprise's slug.
    pub slug: String,
    /// Where its classic PAT is read from (`crate::secrets::enterprise_token`).
    pub token_file: PathBuf,
}

/// A validated scale set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleSet {
    pub name: String,
    pub policy: String,
    /// Its labels, its name first.
    pub labels: Vec<String>,
    pub runner_group_id: u64,
    /// `Some`: an enterprise scale set, registered with its PAT (no App request is made for
    /// it); `None`: it lives in its policy's target, through the App's installation there.
    pub enterprise: Option<Enterprise>,
}

/// Validates the sections against the policies and marks each served policy
/// ([`Policy::scale_set`]). The error is `(key, problem)`.
pub(super) fn validate(
    sections: Vec<ScaleSetSection>,
    policies: &mut [Policy],
) -> Result<Vec<ScaleSet>, (String, String)> {
    let mut sets: Vec<ScaleSet> = Vec::with_capacity(sections.len());
    for (index, section) in sections.into_iter().enumerate() {
        let key = |field: &str| format!("scale_set[{index}].{field}");
        let set = one(section, policies).map_err(|(field, problem)| (key(field), problem))?;
        if let Some(other) = sets.iter().find(|s| s.name.eq_ignore_ascii_case(&set.name)) {
            return Err((
                key("name"),
                format!(
                    "`{}` is used by another scale set; names must be unique",
                    other.name
                ),
            ));
        }
        if let Some(other) = sets.iter().find(|s| s.policy == set.policy) {
            return Err((
                key("policy"),
                format!(
                    "policy `{}` already serves scale set `{}`; a policy serves one scale set",
                    set.policy, other.name
                ),
            ));
        }
        if let Some((label, other)) =
            shared_label(&set.labels, sets.iter().map(|s| (&s.name, &s.labels)))
        {
            return Err((
                key("labels"),
                format!(
                    "label `{label}` is also scale set `{other}`'s; GitHub assigns a job to either at random, so give each scale set labels of its own"
                ),
            ));
        }
        sets.push(set);
    }
    for (index, set) in sets.iter().enumerate() {
        let webhook_policies = policies
            .iter()
            .filter(|p| p.scale_set.is_none() && p.name != set.policy)
            .map(|p| (&p.name, &p.labels));
        if let Some((label, policy)) = shared_label(&set.labels, webhook_policies) {
            return Err((
                format!("scale_set[{index}].labels"),
                format!(
                    "label `{label}` is also carried by policy `{policy}`: a job with `runs-on: {label}` would be served both by the scale set and, through its webhook, by that policy (two runners for one job); remove the label from the policy or rename the scale set"
                ),
            ));
        }
        if let Some(policy) = policies.iter_mut().find(|p| p.name == set.policy) {
            policy.scale_set = Some(set.clone());
        }
    }
    Ok(sets)
}

fn one(section: ScaleSetSection, policies: &[Policy]) -> Result<ScaleSet, (&'static str, String)> {
    if section.name.is_empty()
        || section.name.len() > MAX_NAME_LEN
        || !section
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err((
            "name",
            format!(
                "`{}` must be 1 to {MAX_NAME_LEN} letters, digits, `-`, `_` or `.` (workflows name it in `runs-on`)",
                section.name
            ),
        ));
    }
    let Some(policy) = policies.iter().find(|p| p.name == section.policy) else {
        return Err((
            "policy",
            format!(
                "`{}` is not a policy of this file; a scale set is served by one `[[policy]]`'s runners",
                section.policy
            ),
        ));
    };
    let enterprise = enterprise(
        section.enterprise,
        section.token_file,
        policy.workspace == super::Workspace::Persistent,
    )?;
    let mut labels = vec![section.name.clone()];
    for label in section.labels.unwrap_or_default() {
        if label.trim().is_empty() {
            return Err(("labels", "holds an empty label".to_owned()));
        }
        if !labels.iter().any(|l| l.eq_ignore_ascii_case(&label)) {
            labels.push(label);
        }
    }
    Ok(ScaleSet {
        name: section.name,
        policy: section.policy,
        labels,
        runner_group_id: section
            .runner_group_id
            .unwrap_or(policy.runner_group_id.max(DEFAULT_RUNNER_GROUP)),
        enterprise,
    })
}

/// The enterprise scope of a scale set from its `enterprise` and `token_file` keys: both or
/// neither (the PAT is the only credential GitHub takes for an enterprise, and the App's
/// installation the only one rm uses for anything else). A policy with a persistent workspace
/// is refused: an enterprise's jobs come from every repository of it, and a slot's `_work`
/// must not be shared across repositories.
pub(super) fn enterprise(
    slug: Option<String>,
    token_file: Option<PathBuf>,
    persistent_workspace: bool,
) -> Result<Option<Enterprise>, (&'static str, String)> {
    match (slug, token_file) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err((
            "token_file",
            "is the classic PAT of an enterprise scale set: set `enterprise` too, or remove it (an organization or repository scale set registers through the App)".to_owned(),
        )),
        (Some(_), None) => Err((
            "token_file",
            "is required with `enterprise`: GitHub takes only a classic personal access token with `manage_runners:enterprise` for an enterprise's scale sets; name the file holding it (mode 0600)".to_owned(),
        )),
        (Some(slug), Some(_)) if !valid_slug(&slug) => Err((
            "enterprise",
            format!(
                "`{slug}` is not an enterprise slug: letters, digits, `-`, `_` or `.`, as in https://github.com/enterprises/<slug>"
            ),
        )),
        (Some(_), Some(path)) if path.as_os_str().is_empty() => {
            Err(("token_file", "is empty; name the file holding the PAT".to_owned()))
        }
        (Some(_), Some(_)) if persistent_workspace => Err((
            "enterprise",
            "its policy has `workspace = \"persistent\"`: an enterprise scale set's jobs come from every repository of the enterprise, and a slot's _work must not be shared across repositories; use an ephemeral workspace".to_owned(),
        )),
        (Some(slug), Some(token_file)) => Ok(Some(Enterprise { slug, token_file })),
    }
}

/// An enterprise slug as it appears in URLs; nothing that could leave its path segment.
fn valid_slug(slug: &str) -> bool {
    !slug.is_empty()
        && slug != "."
        && slug != ".."
        && slug
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl ScaleSet {
    /// Whether a job with `labels` is this scale set's: every one of its labels is the scale
    /// set's (compared case-insensitively, as GitHub does).
    pub fn takes(&self, labels: &[String]) -> bool {
        !labels.is_empty()
            && labels
                .iter()
                .all(|l| self.labels.iter().any(|own| own.eq_ignore_ascii_case(l)))
    }
}

/// The first of `labels` another owner carries too (case-insensitively, as GitHub compares
/// labels), with that owner's name.
fn shared_label<'a>(
    labels: &[String],
    others: impl Iterator<Item = (&'a String, &'a Vec<String>)>,
) -> Option<(String, String)> {
    let ours: HashSet<String> = labels.iter().map(|l| l.to_ascii_lowercase()).collect();
    for (owner, theirs) in others {
        if let Some(label) = theirs
            .iter()
            .find(|l| ours.contains(&l.to_ascii_lowercase()))
        {
            return Some((label.clone(), owner.clone()));
        }
    }
    None
}
