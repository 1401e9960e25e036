//! Demand: which journalled jobs each policy of this host should serve. Pure: it takes the
//! policies and the queued jobs as values and reports, per policy, the jobs it matches, plus the
//! jobs no policy can count (unresolvable labels) and the jobs two policies both match (refused,
//! since whichever runner came up first would take the job and the other would idle).
//!
//! A policy matches a job when the job is `queued` in the policy's target and every one of the
//! job's labels is carried by the policy, compared case-insensitively as GitHub does. A policy
//! that accepts shapes (`shape_max` or `[[policy.shape]]`, issue 42) carries every *non-shape*
//! label of the job: its shape labels (`rm-cpu=8`, [`crate::shape::is_shape_label`]) are
//! resolved into the runner's shape, not matched, since its runners are registered with the
//! job's own shape labels. A policy without shapes matches as before: every label literally
//! carried, so it never takes a job asking for a shape it cannot give. `waiting` jobs (held by an
//! environment) are not demand.

use std::collections::BTreeMap;

use rm_vocab::JobId;

use crate::config::Policy;
use crate::shape::is_shape_label;

/// The part of a journalled job that demand looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueuedJob {
    pub job_id: JobId,
    /// `owner/name`.
    pub repository: String,
    pub labels: Vec<String>,
}

impl From<&rm_journal::JobRow> for QueuedJob {
    /// A journalled job as demand sees it: the one conversion, for allocation and for every
    /// reader that explains it.
    fn from(job: &rm_journal::JobRow) -> Self {
        QueuedJob {
            job_id: job.job_id,
            repository: job.repository.clone(),
            labels: job.labels.clone(),
        }
    }
}

/// What demand found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Demand {
    /// Per policy name, the jobs it alone matches.
    pub per_policy: BTreeMap<String, Vec<JobId>>,
    /// Jobs with a label that is an unevaluated expression (`${{ ... }}`): reported, never
    /// counted, never dropped.
    pub unresolvable: Vec<JobId>,
    /// Jobs matched by more than one policy, with the policies: they start nothing.
    pub overlapping: Vec<(JobId, Vec<String>)>,
}

impl Demand {
    /// How many jobs `policy` should serve (the tests' shorthand: allocation reads
    /// `per_policy`).
    #[cfg(test)]
    pub(crate) fn of(&self, policy: &str) -> usize {
        self.per_policy.get(policy).map_or(0, Vec::len)
    }
}

/// Routes each queued job to the one policy that matches it.
pub(crate) fn route(policies: &[Policy], jobs: &[QueuedJob]) -> Demand {
    let mut demand = Demand::default();
    for policy in policies {
        demand.per_policy.entry(policy.name.clone()).or_default();
    }
    for job in jobs {
        if job.labels.iter().any(|l| is_expression(l)) {
            demand.unresolvable.push(job.job_id);
            continue;
        }
        // A scale set's policy is served by the scale set's own demand (its statistics), never
        // by journalled jobs: the same job also arrives as a webhook.
        let matching: Vec<&Policy> = policies
            .iter()
            .filter(|p| p.scale_set.is_none() && matches(p, job))
            .collect();
        match matching.as_slice() {
            [] => {}
            [policy] => demand
                .per_policy
                .entry(policy.name.clone())
                .or_default()
                .push(job.job_id),
            many => demand
                .overlapping
                .push((job.job_id, many.iter().map(|p| p.name.clone()).collect())),
        }
    }
    demand
}

/// Whether `policy` would serve `job`.
pub(crate) fn matches(policy: &Policy, job: &QueuedJob) -> bool {
    let shaped = policy.shapes.accepts_shapes();
    policy.target.contains(&job.repository)
        && job
            .labels
            .iter()
            .filter(|label| !(shaped && is_shape_label(label)))
            .all(|label| {
                policy
                    .labels
                    .iter()
                    .any(|carried| carried.eq_ignore_ascii_case(label))
            })
}

/// A label GitHub did not evaluate: `runs-on: ${{ matrix.os }}` sent verbatim.
fn is_expression(label: &str) -> bool {
    label.contains("${{")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Workspace;

    fn policy(name: &str, target: &str, labels: &[&str]) -> Policy {
        let target: crate::config::Target = target.parse().expect("a valid target");
        Policy {
            name: name.to_owned(),
            target,
            labels: labels.iter().map(|l| (*l).to_owned()).collect(),
            runner_group_id: 1,
            max_runners: 4,
            min_runners: 0,
            fleet_max_runners: None,
            workspace: Workspace::Ephemeral,
            docker: None,
            limits: Default::default(),
            memory_required: None,
            disk_max: None,
            disk_required: None,
            shapes: Default::default(),
            env_file: None,
            network_allow: None,
            egress: None,
            cache: false,
            image: None,
            scale_set: None,
        }
    }

    fn job(id: i64, repo: &str, labels: &[&str]) -> QueuedJob {
        QueuedJob {
            job_id: JobId::new(id),
            repository: repo.to_owned(),
            labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        }
    }

    #[test]
    fn a_job_matches_when_all_its_labels_are_carried_case_insensitively() {
        let linux = policy("linux", "acme", &["self-hosted", "Linux", "x64"]);
        assert!(matches(
            &linux,
            &job(1, "acme/widgets", &["self-hosted", "linux"])
        ));
        assert!(matches(
            &linux,
            &job(1, "ACME/widgets", &["SELF-HOSTED", "X64"])
        ));
        assert!(!matches(
            &linux,
            &job(1, "acme/widgets", &["self-hosted", "gpu"])
        ));
        assert!(!matches(&linux, &job(1, "other/widgets", &["self-hosted"])));
    }

    /// `policy` taking shapes (an empty `shape_max`: only whether it takes them matters here).
    fn shaped(mut policy: Policy) -> Policy {
        policy.shapes.max = Some(crate::config::ShapeBounds::default());
        policy
    }

    #[test]
    fn shape_labels_are_resolved_by_a_shaped_policy_and_never_matched_by_another() {
        let plain = policy("plain", "acme", &["self-hosted", "linux"]);
        let sized = shaped(policy("sized", "acme", &["self-hosted", "linux"]));
        let named = policy("named", "acme", &["self-hosted", "linux"]);
        let named = {
            let mut named = named;
            named
                .shapes
                .named
                .push(("large".to_owned(), Default::default()));
            named
        };
        // (job labels, plain matches, sized matches, named matches)
        let cases: [(&[&str], bool, bool, bool); 7] = [
            (&["self-hosted", "linux"], true, true, true),
            (&["self-hosted", "linux", "rm-cpu=4"], false, true, true),
            (&["linux", "RM-CPU=4", "Rm-Gpu=1"], false, true, true),
            (&["SELF-HOSTED", "rm-shape=large"], false, true, true),
            // Non-shape labels are still matched: a shaped policy does not take a GPU job of
            // another label set.
            (&["self-hosted", "windows", "rm-cpu=4"], false, false, false),
            // Unreadable shape labels are still shape labels: matched here, refused by
            // resolution (`explain` names them), never taken by an unshaped policy.
            (&["linux", "rm-cpu=lots"], false, true, true),
            (&["linux", "rmcpu=4"], false, false, false),
        ];
        for (labels, on_plain, on_sized, on_named) in cases {
            let job = job(1, "acme/widgets", labels);
            assert_eq!(matches(&plain, &job), on_plain, "plain {labels:?}");
            assert_eq!(matches(&sized, &job), on_sized, "sized {labels:?}");
            assert_eq!(matches(&named, &job), on_named, "named {labels:?}");
        }
        // Routed: the shaped job goes to the shaped policy alone, with no overlap.
        let demand = route(
            &[plain, sized],
            &[
                job(1, "acme/a", &["linux", "rm-cpu=4"]),
                job(2, "acme/a", &["linux"]),
            ],
        );
        assert_eq!(demand.per_policy["sized"], vec![JobId::new(1)]);
        assert_eq!(
            demand.overlapping,
            vec![(JobId::new(2), vec!["plain".to_owned(), "sized".to_owned()])]
        );
        // An unshaped policy that carries an `rm-` label literally matches it as before.
        let literal = policy("literal", "acme", &["linux", "rm-cpu=4"]);
        assert!(matches(&literal, &job(1, "acme/a", &["linux", "RM-CPU=4"])));
    }

    #[test]
    fn repository_targets_match_one_repository() {
        let p = policy("w", "acme/widgets", &["self-hosted"]);
        assert!(matches(&p, &job(1, "acme/Widgets", &["self-hosted"])));
        assert!(!matches(&p, &job(1, "acme/gadgets", &["self-hosted"])));
    }

    #[test]
    fn demand_is_counted_per_policy_and_overlaps_are_refused() {
        let policies = [
            policy("linux", "acme", &["self-hosted", "linux"]),
            policy("gpu", "acme", &["self-hosted", "linux", "gpu"]),
        ];
        let jobs = [
            job(1, "acme/a", &["self-hosted", "linux", "gpu"]),
            job(2, "acme/a", &["self-hosted", "linux"]),
            job(3, "acme/a", &["windows"]),
            job(4, "acme/a", &["self-hosted", "${{ matrix.os }}"]),
        ];
        let demand = route(&policies, &jobs);
        // Job 2 is carried by both policies' labels: both match, so it is refused.
        assert_eq!(demand.of("gpu"), 1);
        assert_eq!(demand.per_policy["gpu"], vec![JobId::new(1)]);
        assert_eq!(demand.of("linux"), 0);
        assert_eq!(
            demand.overlapping,
            vec![(JobId::new(2), vec!["linux".to_owned(), "gpu".to_owned()])]
        );
        assert_eq!(demand.unresolvable, vec![JobId::new(4)]);
    }

    #[test]
    fn policies_with_no_demand_are_listed_with_zero() {
        let demand = route(&[policy("idle", "acme", &["x"])], &[]);
        assert_eq!(demand.per_policy.get("idle"), Some(&vec![]));
    }

    #[test]
    fn a_scale_set_s_policy_never_takes_journalled_jobs() {
        // The job for a scale set arrives as a webhook too; only the scale set serves it.
        let mut set = policy("set", "acme", &["big"]);
        set.scale_set = Some(crate::config::scale_sets::ScaleSet {
            name: "big".to_owned(),
            policy: "set".to_owned(),
            labels: vec!["big".to_owned()],
            runner_group_id: 1,
            enterprise: None,
        });
        let jobs = [job(1, "acme/widgets", &["big"])];
        let demand = route(&[set.clone()], &jobs);
        assert_eq!(demand.of("set"), 0);
        assert!(demand.overlapping.is_empty());
        // Control: the same policy without its scale set takes it.
        set.scale_set = None;
        assert_eq!(route(&[set], &jobs).of("set"), 1);
    }
}
