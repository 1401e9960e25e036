//! GitHub's runner scale sets as a demand source (issue 29). This module owns the agent's side
//! of it: one [`Source`] per `[[scale_set]]` (its client of the Actions service, the scale set's
//! id once found, what its listener last saw), the [`Board`] the listener tasks and the
//! executor share, and the rule that turns a scale set's statistics into runners
//! ([`runners_wanted`]), and the rule that says how many jobs the scale set may have assigned
//! at once on this host now ([`capacity`]: the allocation pass publishes it on the [`Board`],
//! the listener sends it as `X-ScaleSetMaxCapacity` at its next poll). The listener task is
//! [`listen`]; the protocol is `rm_github::scaleset`.
//!
//! The delivery contract: a message is journalled (`rm_journal::ScaleSets::record_message`)
//! before it is acknowledged, so a crash on either side of the write loses nothing and handles
//! nothing twice (a redelivered message is recognised as already journalled). Runners are not
//! tied to jobs: the service hands any job of the scale set to any of its idle runners, so
//! demand is a count, `min(min_idle + assigned, max)`, not a list of jobs.

pub mod listen;
pub mod metrics;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rm_github::scaleset::{ScaleSetClient, Statistics};
use tokio::sync::watch;

use crate::config::scale_sets::ScaleSet;

/// How many runners of a scale set's policy are wanted besides its busy ones: the scale set's
/// target `min(min_idle + assigned, max)` (ARC's, GARM's and GitHub's own example's rule,
/// `github-scale-sets.md` §1.14) less the runners busy with a job. `assigned` counts the jobs
/// assigned to the scale set, running ones included; the executor offsets the runners still
/// starting or idle itself, so a job assigned while its runner starts never causes a second.
pub fn runners_wanted(min_idle: u32, max: u32, assigned: i64, busy: u32) -> u32 {
    let assigned = u32::try_from(assigned.max(0)).unwrap_or(u32::MAX);
    min_idle
        .saturating_add(assigned)
        .min(max.max(min_idle))
        .saturating_sub(busy)
}

/// How long a scale set's runner must have been idle before it may be scaled down: longer than
/// a new job's `JobAssigned` takes to come (the statistics the surplus is computed from lag
/// it), so a runner about to be given a job is not removed for a count a moment old.
pub const SCALE_DOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(15);

/// Which idle runners go when a scale set has `surplus` more runners than it wants: of those
/// idle since `idle_since` (by index), only those idle for [`SCALE_DOWN_GRACE`], the longest
/// idle first (the nearest to their idle timeout anyway), at most `surplus`. Busy runners are
/// never among them: the caller offers idle ones only, and the service refuses to remove one
/// that took a job meanwhile.
pub fn scale_down(
    surplus: u32,
    idle_since: &[rm_vocab::UnixMs],
    now: rm_vocab::UnixMs,
) -> Vec<usize> {
    let grace = rm_vocab::millis(SCALE_DOWN_GRACE);
    let mut eligible: Vec<usize> = (0..idle_since.len())
        .filter(|&i| now.saturating_sub(idle_since[i]) >= grace)
        .collect();
    eligible.sort_by_key(|&i| (idle_since[i], i));
    eligible.truncate(usize::try_from(surplus).unwrap_or(usize::MAX));
    eligible
}

/// What a scale set's capacity is computed from: numbers the allocation pass already has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacityInput {
    /// Whether this host takes a new runner of the scale set's policy now: the allocation pass
    /// ran (recovery is complete), the agent is not draining, the host is fit (disk, memory and
    /// the other fitness fences), and the policy is not in its launch back-off.
    pub open: bool,
    /// The policy's `max_runners` and `min_runners` (its ceiling is the larger, as allocation
    /// reads it).
    pub max_runners: u32,
    pub min_runners: u32,
    /// The policy's live runners, busy ones included, this pass's starts included.
    pub policy_live: u32,
    /// Live runners of every policy on this host, this pass's starts included.
    pub host_live: u32,
    /// `host.max_runners`.
    pub host_max: u32,
    /// Runner uids no attempt holds, after this pass's starts (`None`: no uid pool).
    pub free_uids: Option<u32>,
}

/// How many jobs the scale set may have assigned at once on this host now, sent as
/// `X-ScaleSetMaxCapacity` (`github-scale-sets.md` §1.8): the service assigns the set no job
/// beyond it, so a job is never assigned here while this host cannot start its runner, and
/// stays free for the service to hold until it can. At most the policy's ceiling; at most its
/// live runners (each can take an assigned job) plus the host's free slots, which other
/// policies' live runners take too (and free uids, under `isolation = "user"`); 0 while the
/// host takes no new runner of the policy at all (`open`). The host's room is allocation's own
/// rule ([`crate::allocation::host_headroom`]).
pub fn capacity(input: CapacityInput) -> u32 {
    if !input.open {
        return 0;
    }
    let free = crate::allocation::host_headroom(input.host_max, input.host_live);
    let free = input.free_uids.map_or(free, |uids| free.min(uids));
    input
        .max_runners
        .max(input.min_runners)
        .min(input.policy_live.saturating_add(free))
}

/// The scope's URL as the Actions service knows it (`https://github.com/acme`), from the REST
/// API's URL: `api.github.com` and `api.<host>` (GHE.com) drop the `api.`, GHES drops `/api/v3`;
/// anything else (a test's fake) is taken as it is.
pub fn config_url(api_url: &str, target: &rm_github::Target) -> String {
    let web = web_url(api_url);
    match target {
        rm_github::Target::Org(org) => format!("{web}/{org}"),
        rm_github::Target::Repo { owner, repo } => format!("{web}/{owner}/{repo}"),
    }
}

/// An enterprise's URL as the Actions service knows it (`https://github.com/enterprises/octo`),
/// by the same host rules as [`config_url`].
pub fn enterprise_config_url(api_url: &str, slug: &str) -> String {
    format!("{}/enterprises/{slug}", web_url(api_url))
}

/// GitHub's web URL from its REST API's: `api.github.com` and `api.<host>` (GHE.com) drop the
/// `api.`, GHES drops `/api/v3`; anything else (a test's fake) is taken as it is.
fn web_url(api_url: &str) -> String {
    let api = api_url.trim_end_matches('/');
    if let Some(host) = api.strip_prefix("https://api.") {
        format!("https://{host}")
    } else if let Some(base) = api.strip_suffix("/api/v3") {
        base.to_owned()
    } else {
        api.to_owned()
    }
}

/// Removes the scale set's runner `name` (an earlier try's registration whose answer was
/// lost, met as `AgentExistsException`). Best effort: a failure is logged, and the JIT request
/// that follows says whether the name is still taken.
pub async fn remove_by_name(source: &Source, name: &str) {
    match source.client.find_runner(name).await {
        Ok(Some(runner)) => {
            if let Err(e) = source.client.remove_runner(runner.id).await {
                tracing::warn!(runner = name, error = %e, "cannot remove the scale set's stale runner");
            }
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(runner = name, error = %e, "cannot look the scale set's stale runner up")
        }
    }
}

/// The statistics' `assigned` less the jobs of `finished` runners whose `JobCompleted` is not
/// among `completed` yet: the statistics came before it, and still count those jobs.
pub fn still_assigned(
    assigned: i64,
    finished: &[&str],
    completed: &std::collections::VecDeque<String>,
) -> i64 {
    let unseen = finished
        .iter()
        .filter(|name| !completed.iter().any(|c| c == *name))
        .count();
    assigned.saturating_sub(i64::try_from(unseen).unwrap_or(i64::MAX))
}

/// How many runner names with a journalled `JobCompleted` a [`Seen`] remembers: far more than
/// the runners that can finish between two messages.
pub const REMEMBERED_COMPLETIONS: usize = 4096;

/// What the listener of one scale set last saw, for the executor and `status`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// The last statistics (a session's or a message's); `None` before the first.
    pub statistics: Option<Statistics>,
    /// The runners whose `JobCompleted` was journalled, the newest [`REMEMBERED_COMPLETIONS`]:
    /// a runner of ours that finished its job and is not among them is still counted in the
    /// statistics as assigned (the message saying so has not come yet).
    pub completed_runners: std::collections::VecDeque<String>,
    /// The session held, if any.
    pub session_id: Option<String>,
    /// The last message journalled.
    pub last_message_id: u64,
    /// What the listener is doing, in words (`polling`, `on standby: …`, `backing off: …`).
    pub activity: String,
}

/// What tells one [`Seen`] from another ([`Source::update`]): every field but the remembered
/// completions, which only [`Seen::remember_completed`] changes (a name not remembered yet
/// pushed at the back, the oldest dropped at the front), by their count and their newest.
type Fingerprint = (
    Option<Statistics>,
    Option<String>,
    u64,
    String,
    usize,
    Option<String>,
);

impl Seen {
    fn fingerprint(&self) -> Fingerprint {
        (
            self.statistics.clone(),
            self.session_id.clone(),
            self.last_message_id,
            self.activity.clone(),
            self.completed_runners.len(),
            self.completed_runners.back().cloned(),
        )
    }

    /// Remembers that `runner`'s `JobCompleted` was journalled, forgetting the oldest past
    /// [`REMEMBERED_COMPLETIONS`].
    pub(crate) fn remember_completed(&mut self, runner: String) {
        if self.completed_runners.contains(&runner) {
            return;
        }
        if self.completed_runners.len() >= REMEMBERED_COMPLETIONS {
            self.completed_runners.pop_front();
        }
        self.completed_runners.push_back(runner);
    }
}

/// One `[[scale_set]]` while the agent runs.
#[derive(Debug)]
pub struct Source {
    pub set: ScaleSet,
    pub client: Arc<ScaleSetClient>,
    /// The scale set's id at GitHub; 0 until the listener found or created it.
    id: AtomicU64,
    seen: Mutex<Seen>,
    /// The capacity the allocation pass last published ([`capacity`]); the listener sends it
    /// at its next poll. `None` until the first pass (sent as 0: before recovery completes
    /// this host takes nothing).
    capacity: watch::Sender<Option<u32>>,
}

impl Source {
    pub fn new(set: ScaleSet, client: Arc<ScaleSetClient>) -> Self {
        Self {
            set,
            client,
            id: AtomicU64::new(0),
            seen: Mutex::new(Seen::default()),
            capacity: watch::channel(None).0,
        }
    }

    /// The capacity the allocation pass last published; `None` before its first pass.
    pub fn current_capacity(&self) -> Option<u32> {
        *self.capacity.borrow()
    }

    /// Watches the capacity the allocation pass publishes (the listener, to cut a held poll
    /// short when it changes).
    pub(crate) fn watch_capacity(&self) -> watch::Receiver<Option<u32>> {
        self.capacity.subscribe()
    }

    /// Publishes the capacity (the allocation pass); a watcher is told only of a change.
    pub(crate) fn set_capacity(&self, capacity: u32) {
        self.capacity.send_if_modified(|c| {
            let changed = *c != Some(capacity);
            *c = Some(capacity);
            changed
        });
    }

    /// The scale set's id, once found.
    pub fn id(&self) -> Option<u64> {
        Some(self.id.load(Ordering::Acquire)).filter(|id| *id != 0)
    }

    pub(crate) fn set_id(&self, id: u64) {
        self.id.store(id, Ordering::Release);
    }

    pub fn seen(&self) -> Seen {
        self.read(Seen::clone)
    }

    /// Reads what the listener saw in place: the allocation pass asks on every pass, and the
    /// remembered completions are too many to copy each time.
    pub fn read<T>(&self, reading: impl FnOnce(&Seen) -> T) -> T {
        reading(&self.seen.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Applies `change`; whether it changed anything (a long poll answered `202` changes
    /// nothing, and must not wake the executor for nothing). Compared by
    /// [`Seen::fingerprint`], not by a copy of the remembered completions at every poll.
    pub(crate) fn update(&self, change: impl FnOnce(&mut Seen)) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let before = seen.fingerprint();
        change(&mut seen);
        seen.fingerprint() != before
    }
}

/// Every scale set of this agent, by the policy that serves it, and the signal that one of
/// them changed (the executor wakes on it).
#[derive(Debug)]
pub struct Board {
    by_policy: BTreeMap<String, Arc<Source>>,
    changes: watch::Sender<u64>,
}

impl Default for Board {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl Board {
    pub fn new(sources: Vec<Arc<Source>>) -> Self {
        Self {
            by_policy: sources
                .into_iter()
                .map(|s| (s.set.policy.clone(), s))
                .collect(),
            changes: watch::channel(0).0,
        }
    }

    /// The scale set `policy` serves.
    pub fn of_policy(&self, policy: &str) -> Option<&Arc<Source>> {
        self.by_policy.get(policy)
    }

    pub fn sources(&self) -> impl Iterator<Item = &Arc<Source>> {
        self.by_policy.values()
    }

    pub fn is_empty(&self) -> bool {
        self.by_policy.is_empty()
    }

    /// Wakes whoever watches (the executor's control loop).
    pub fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Every scale set's capacity 0: the host takes no new runner (the agent drains).
    pub(crate) fn close(&self) {
        for source in self.sources() {
            source.set_capacity(0);
        }
    }

    /// Each scale set's name and the capacity last published (none before the first pass),
    /// for the status snapshot and `/metrics`.
    pub fn capacities(&self) -> BTreeMap<String, u32> {
        self.sources()
            .filter_map(|s| Some((s.set.name.clone(), s.current_capacity()?)))
            .collect()
    }

    /// The jobs assigned to `policy`'s scale set, from its last statistics, less those of
    /// `finished` (this host's runners of the policy that finished a job) whose `JobCompleted`
    /// has not been journalled yet: the statistics still count them. `None` when the policy
    /// serves no scale set; 0 before the first statistics.
    pub fn assigned(&self, policy: &str, finished: &[&str]) -> Option<i64> {
        self.of_policy(policy).map(|source| {
            source.read(|seen| {
                still_assigned(
                    seen.statistics
                        .as_ref()
                        .map_or(0, |s| s.total_assigned_jobs),
                    finished,
                    &seen.completed_runners,
                )
            })
        })
    }
}

/// A source of scale set `acme-big` (policy `big`) whose client is never called: for the tests
/// of what a listener saw. Needs a runtime (the HTTP client is built on one).
#[cfg(test)]
pub(crate) fn test_source() -> Source {
    let set = crate::config::scale_sets::ScaleSet {
        name: "acme-big".into(),
        policy: "big".into(),
        labels: vec!["acme-big".into()],
        runner_group_id: 1,
        enterprise: None,
    };
    let key = rm_fake_github::AppKeyPair::generate().expect("a key");
    let client = rm_github::GithubClient::new(rm_github::ClientConfig::new(
        "http://127.0.0.1:9",
        1,
        key.private_pem.clone(),
    ))
    .expect("a client");
    let scale_set_client = rm_github::scaleset::ScaleSetClient::new(
        client,
        rm_github::Target::Org("acme".into()),
        "http://127.0.0.1:9/acme",
    )
    .expect("a client");
    Source::new(set, Arc::new(scale_set_client))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An update says whether it changed anything: an answer that changes nothing does not
    /// wake the executor; a completion remembered does, also once the memory is full.
    // A runtime: the HTTP client, never called, is built on one.
    #[tokio::test]
    async fn an_update_says_whether_it_changed_what_was_seen() {
        let source = test_source();
        assert!(!source.update(|_| {}));
        assert!(source.update(|seen| seen.activity = "polling".into()));
        assert!(!source.update(|seen| seen.activity = "polling".into()));
        assert!(source.update(|seen| seen.last_message_id = 7));
        for n in 0..REMEMBERED_COMPLETIONS {
            assert!(source.update(|seen| seen.remember_completed(format!("r{n}"))));
        }
        assert!(
            !source.update(|seen| seen.remember_completed("r5".into())),
            "known"
        );
        assert!(
            source.update(|seen| seen.remember_completed("new".into())),
            "full"
        );
        assert_eq!(
            source.read(|seen| seen.completed_runners.len()),
            REMEMBERED_COMPLETIONS
        );
    }

    #[test]
    fn the_longest_idle_past_the_grace_go_first_and_no_more_than_the_surplus() {
        let at = rm_vocab::UnixMs::new;
        let now = at(100_000);
        // Idle since: 0 → 90 s, 1 → 5 s (inside the grace), 2 → 60 s, 3 → exactly the grace.
        let idle = [at(10_000), at(95_000), at(40_000), at(85_000)];
        for (surplus, gone) in [
            (0, vec![]),
            (1, vec![0]),
            (2, vec![0, 2]),
            (3, vec![0, 2, 3]),
            // The one idle for 5 s stays whatever the surplus: its job may be on its way.
            (9, vec![0, 2, 3]),
        ] {
            assert_eq!(scale_down(surplus, &idle, now), gone, "surplus {surplus}");
        }
        assert!(scale_down(3, &[], now).is_empty());
    }

    #[test]
    fn a_scale_set_wants_min_idle_plus_assigned_capped_by_max_less_its_busy_runners() {
        // (min_idle, max, assigned, busy, wanted besides the busy ones)
        let cases: [(u32, u32, i64, u32, u32); 10] = [
            (0, 5, 0, 0, 0),
            (0, 5, 3, 0, 3),
            // Running jobs are assigned too: their busy runners are not wanted again.
            (0, 5, 3, 2, 1),
            (0, 5, 3, 3, 0),
            // Idle runners kept ready on top of the assigned jobs.
            (2, 5, 0, 0, 2),
            (2, 5, 1, 1, 2),
            // The ceiling counts busy runners.
            (0, 5, 120, 0, 5),
            (0, 5, 120, 5, 0),
            (2, 5, 4, 4, 1),
            // Statistics out of range never wrap.
            (0, 5, -3, 0, 0),
        ];
        for (min_idle, max, assigned, busy, wanted) in cases {
            assert_eq!(
                runners_wanted(min_idle, max, assigned, busy),
                wanted,
                "min_idle {min_idle} max {max} assigned {assigned} busy {busy}"
            );
        }
    }

    #[test]
    fn the_scope_url_is_the_web_url_of_the_target() {
        let org = rm_github::Target::Org("acme".into());
        let repo: rm_github::Target = "acme/widgets".parse().expect("a target");
        // (API URL, target, scope URL)
        let cases = [
            ("https://api.github.com", &org, "https://github.com/acme"),
            (
                "https://api.github.com/",
                &repo,
                "https://github.com/acme/widgets",
            ),
            (
                "https://api.octo.ghe.com",
                &org,
                "https://octo.ghe.com/acme",
            ),
            (
                "https://ghes.example/api/v3",
                &org,
                "https://ghes.example/acme",
            ),
            (
                "http://127.0.0.1:4711",
                &repo,
                "http://127.0.0.1:4711/acme/widgets",
            ),
        ];
        for (api, target, url) in cases {
            assert_eq!(config_url(api, target), url, "{api}");
        }
        // An enterprise, by the same host rules.
        let enterprises = [
            (
                "https://api.github.com/",
                "https://github.com/enterprises/octo",
            ),
            (
                "https://api.octo.ghe.com",
                "https://octo.ghe.com/enterprises/octo",
            ),
            (
                "https://ghes.example/api/v3",
                "https://ghes.example/enterprises/octo",
            ),
            (
                "http://127.0.0.1:4711",
                "http://127.0.0.1:4711/enterprises/octo",
            ),
        ];
        for (api, url) in enterprises {
            assert_eq!(enterprise_config_url(api, "octo"), url, "{api}");
        }
    }

    #[test]
    fn a_finished_runner_s_job_counts_until_its_job_completed_is_journalled() {
        let completed: std::collections::VecDeque<String> =
            ["rm-h-1".to_owned()].into_iter().collect();
        // (assigned in the statistics, runners that finished a job, still assigned)
        let cases: [(i64, &[&str], i64); 5] = [
            (2, &[], 2),
            // Its JobCompleted came: the statistics with it no longer count the job.
            (1, &["rm-h-1"], 1),
            // Not yet: the statistics still count it.
            (2, &["rm-h-2"], 1),
            (2, &["rm-h-1", "rm-h-2", "rm-h-3"], 0),
            (0, &["rm-h-2"], -1),
        ];
        for (assigned, finished, still) in cases {
            assert_eq!(
                still_assigned(assigned, finished, &completed),
                still,
                "{finished:?}"
            );
        }
        // Below zero wants nothing.
        assert_eq!(runners_wanted(0, 4, -1, 0), 0);
    }

    #[test]
    fn the_capacity_is_the_policy_s_live_runners_plus_the_host_s_free_slots_under_its_ceiling() {
        let input = |open, max, policy_live, host_live, host_max, free_uids| CapacityInput {
            open,
            max_runners: max,
            min_runners: 0,
            policy_live,
            host_live,
            host_max,
            free_uids,
        };
        // (input, capacity)
        let cases = [
            // An empty host: the policy's ceiling or the host's, the lower.
            (input(true, 8, 0, 0, 4, None), 4),
            (input(true, 2, 0, 0, 4, None), 2),
            // Its own live runners keep their jobs' places.
            (input(true, 8, 3, 3, 4, None), 4),
            (input(true, 2, 2, 2, 4, None), 2),
            // Other policies' live runners take the host's slots (scenario 14: every slot).
            (input(true, 8, 0, 4, 4, None), 0),
            (input(true, 8, 1, 3, 4, None), 2),
            (input(true, 8, 2, 4, 4, None), 2),
            // A ceiling lowered below what runs never underflows.
            (input(true, 8, 0, 6, 4, None), 0),
            (input(true, 1, 3, 3, 4, None), 1),
            // Under `isolation = "user"` a runner needs a free uid too.
            (input(true, 8, 1, 1, 4, Some(1)), 2),
            (input(true, 8, 0, 0, 4, Some(0)), 0),
            // The host takes no new runner (draining, unfit, recovering, backing off): 0,
            // whatever runs.
            (input(false, 8, 0, 0, 4, None), 0),
            (input(false, 8, 3, 3, 4, None), 0),
        ];
        for (input, expected) in cases {
            assert_eq!(capacity(input), expected, "{input:?}");
        }
        // The policy's ceiling is its `max_runners` raised to its `min_runners`.
        let raised = CapacityInput {
            min_runners: 3,
            ..input(true, 1, 0, 0, 4, None)
        };
        assert_eq!(capacity(raised), 3);
    }

    #[test]
    fn min_idle_above_max_is_the_ceiling() {
        assert_eq!(runners_wanted(3, 1, 0, 0), 3);
    }
}
