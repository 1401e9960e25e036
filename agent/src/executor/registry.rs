//! The executor's view of GitHub's runner registry: JIT registration with its retry rules and
//! the choice of the installation it goes through (several Apps may cover a target: [`pick`]),
//! what GitHub lists for a target, and the DELETE of a registration (which ones go is
//! [`super::deregister`]'s). A thin adapter over `rm-github`; the
//! rules it applies (what is terminal, what a 409 means, which installation) are pure
//! functions below.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use rm_github::types::{JitConfig, JitRequest, Runner};
use rm_github::{GithubClient, GithubError, Target};
use rm_vocab::RunnerId;

use crate::lifecycle::GithubObservation;

/// The work folder every JIT runner gets (CONTRACT §5).
pub(crate) const WORK_FOLDER: &str = "_work";

/// How a failed JIT request is handled next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JitRetry {
    /// Never retried: credentials or permissions are wrong; the detail says which.
    Terminal,
    /// A registration with this name already exists (a crashed attempt's): remove it, retry.
    RemoveStaleName,
    /// Try again, not before this time when GitHub named one.
    Later(Option<SystemTime>),
}

/// Decides what a JIT failure leads to.
pub(crate) fn jit_retry(error: &GithubError) -> JitRetry {
    match error {
        GithubError::Unauthorized { .. }
        | GithubError::Forbidden { .. }
        | GithubError::NotFound { .. }
        | GithubError::Unprocessable { .. } => JitRetry::Terminal,
        GithubError::Conflict { .. } => JitRetry::RemoveStaleName,
        GithubError::RateLimited { retry_at, .. } => JitRetry::Later(Some(*retry_at)),
        GithubError::Server { .. }
        | GithubError::Unreachable { .. }
        | GithubError::Unexpected { .. } => JitRetry::Later(None),
    }
}

/// One runner as GitHub lists it, reduced to what supervision needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listed {
    pub runner_id: RunnerId,
    /// The runner process connected (`online`) or has a job.
    pub registered: bool,
    pub busy: bool,
}

impl From<&Runner> for Listed {
    fn from(runner: &Runner) -> Self {
        Listed {
            runner_id: runner.id,
            registered: runner.status == "online" || runner.busy,
            busy: runner.busy,
        }
    }
}

/// A target's runners by name, or why they could not be read.
pub(crate) type Listing = Result<HashMap<String, Listed>, GithubError>;

/// What the lifecycle decision sees of one runner name in a listing. A JIT registration that
/// no process has connected to yet is listed `offline`: not registered for the decision (the
/// registration timeout still runs), but still listed for deregistration.
pub(crate) fn observation(listing: &Listing, runner_name: &str) -> GithubObservation {
    match listing {
        Err(_) => GithubObservation::Unreachable,
        Ok(runners) => match runners.get(runner_name) {
            Some(listed) if listed.registered => {
                GithubObservation::Registered { busy: listed.busy }
            }
            _ => GithubObservation::NotRegistered,
        },
    }
}

/// One installation a registration for a target may go through, and when its budget lets a
/// registration leave (`None`: now).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub installation: u64,
    pub free_at: Option<SystemTime>,
}

impl Candidate {
    fn ready(&self, now: SystemTime) -> bool {
        self.free_at.is_none_or(|at| at <= now)
    }
}

/// The installation a registration goes through, and whether it can leave now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Choice {
    pub installation: u64,
    pub ready: bool,
}

/// Which installation a registration goes through: among the candidates that can leave at
/// `now`, the `turn`-th in rotation (each registration takes the next turn, so the Apps share
/// a burst instead of the first one spending its minute's worth while the others idle); when
/// none can, the one that can leave earliest (the first listed, the primary, on a tie), for
/// the retry to wait for. `None` without candidates.
pub(crate) fn pick(candidates: &[Candidate], now: SystemTime, turn: u64) -> Option<Choice> {
    let ready: Vec<&Candidate> = candidates.iter().filter(|c| c.ready(now)).collect();
    if let Some(len) = u64::try_from(ready.len()).ok().filter(|n| *n > 0) {
        let index = usize::try_from(turn % len).unwrap_or_default();
        return ready.get(index).map(|c| Choice {
            installation: c.installation,
            ready: true,
        });
    }
    candidates.iter().min_by_key(|c| c.free_at).map(|c| Choice {
        installation: c.installation,
        ready: false,
    })
}

/// How long an installation of a further App that refused a registration for a reason retrying
/// cannot fix (its App's key or permission, or it is gone) is left out of the choice: the
/// other Apps' installations take its share meanwhile; `check` names the App.
pub(crate) const SET_ASIDE: Duration = Duration::from_secs(10 * 60);

/// Whether a registration refused with `error` through an installation of App `app` (not the
/// `primary`) sets the installation aside ([`SET_ASIDE`]) and retries through another, instead
/// of failing the launch: the refusals [`jit_retry`] calls terminal. The primary's stay
/// terminal: it is what every single-App setup has, and what everything else goes through.
pub(crate) fn sets_aside(error: &GithubError, app: u64, primary: u64) -> bool {
    app != primary && jit_retry(error) == JitRetry::Terminal
}

/// What the registry remembers between registrations to spread them.
#[derive(Debug, Default)]
struct Spread {
    /// The next registration's turn in [`pick`]'s rotation.
    turn: u64,
    /// Installations GitHub or the pacing refused a registration until a time: the budget's
    /// own check does not see a full pacing window, so the refusal's time is kept here.
    held: HashMap<u64, SystemTime>,
}

/// GitHub's runner registry, through the Apps' installation tokens: registrations through any
/// App's installation covering the target, everything else through the primary App's.
#[derive(Debug, Clone)]
pub struct Registry {
    client: GithubClient,
    spread: Arc<Mutex<Spread>>,
}

impl Registry {
    pub fn new(client: GithubClient) -> Self {
        Registry {
            client,
            spread: Arc::default(),
        }
    }

    pub fn client(&self) -> &GithubClient {
        &self.client
    }

    fn spread(&self) -> std::sync::MutexGuard<'_, Spread> {
        self.spread.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every App's installation covering `target`, with when each could take a registration
    /// (the budget's check and the refusals remembered), and the turn of this registration.
    pub(crate) async fn candidates(
        &self,
        target: &Target,
        now: SystemTime,
    ) -> Result<(Vec<Candidate>, u64), GithubError> {
        let installations = self.client.registration_installations(target).await?;
        let mut spread = self.spread();
        spread.held.retain(|_, until| *until > now);
        let candidates = installations
            .into_iter()
            .map(|installation| Candidate {
                installation,
                free_at: self
                    .client
                    .registration_admitted(installation, target)
                    .max(spread.held.get(&installation).copied()),
            })
            .collect();
        let turn = spread.turn;
        spread.turn = spread.turn.wrapping_add(1);
        Ok((candidates, turn))
    }

    /// After `error` from a registration through `installation`: whether it is set aside and the
    /// registration retried through another App's installation ([`sets_aside`]).
    pub(crate) fn set_aside(
        &self,
        installation: u64,
        error: &GithubError,
        now: SystemTime,
    ) -> bool {
        let app = self.app_of(installation);
        if !sets_aside(error, app, self.client.primary_app()) {
            return false;
        }
        tracing::warn!(app, installation, %error, "this App's installation refused a registration; leaving it out for 10 minutes (`rm-agent check` names what it lacks)");
        self.spread().held.insert(installation, now + SET_ASIDE);
        true
    }

    /// The App `installation` belongs to (the primary's when the client has not looked it up).
    pub(crate) fn app_of(&self, installation: u64) -> u64 {
        self.client
            .app_of(installation)
            .unwrap_or_else(|| self.client.primary_app())
    }

    /// One `generate-jitconfig` call through `installation`; a rate limit is remembered
    /// against the installation until its time, so the next registrations go elsewhere.
    pub async fn generate_in(
        &self,
        installation: u64,
        target: &Target,
        request: &JitRequest,
    ) -> Result<JitConfig, GithubError> {
        let result = self
            .client
            .generate_jitconfig_in(installation, target, request)
            .await;
        if let Err(GithubError::RateLimited { retry_at, .. }) = &result {
            self.spread().held.insert(installation, *retry_at);
        }
        result
    }

    /// The registration called `name`, if the target has one (after a 409).
    pub async fn find(&self, target: &Target, name: &str) -> Result<Option<Listed>, GithubError> {
        Ok(self
            .client
            .find_runner_by_name(target, name)
            .await?
            .as_ref()
            .map(Listed::from))
    }

    /// The target's runners (a conditional request: an unchanged list costs no quota).
    pub async fn list(&self, target: &Target) -> Listing {
        let polled = self.client.list_runners(target).await?;
        Ok(polled
            .value
            .iter()
            .map(|r| (r.name.clone(), Listed::from(r)))
            .collect())
    }

    /// Removes a registration; one that is already gone is fine. Whether one goes, and what a
    /// `422` (still busy) leads to, is [`super::deregister`]'s.
    pub async fn deregister(
        &self,
        target: &Target,
        runner_id: RunnerId,
    ) -> Result<(), GithubError> {
        match self.client.delete_runner(target, runner_id).await {
            Ok(()) | Err(GithubError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// How long to wait before JIT retry `n` (1-based): doubling from a second, capped.
pub(crate) fn jit_backoff(retry: u32) -> Duration {
    const FIRST: Duration = Duration::from_secs(1);
    const CAP: Duration = Duration::from_secs(30);
    FIRST
        .saturating_mul(1u32 << retry.saturating_sub(1).min(5))
        .min(CAP)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(entries: &[(&str, &str, bool)]) -> Listing {
        Ok(entries
            .iter()
            .enumerate()
            .map(|(i, (name, status, busy))| {
                (
                    (*name).to_owned(),
                    Listed {
                        runner_id: RunnerId::new(i as i64 + 1),
                        registered: *status == "online" || *busy,
                        busy: *busy,
                    },
                )
            })
            .collect())
    }

    #[test]
    fn an_offline_jit_registration_is_not_registered_yet() {
        let l = listing(&[
            ("a", "offline", false),
            ("b", "online", false),
            ("c", "online", true),
        ]);
        assert_eq!(observation(&l, "a"), GithubObservation::NotRegistered);
        assert_eq!(
            observation(&l, "b"),
            GithubObservation::Registered { busy: false }
        );
        assert_eq!(
            observation(&l, "c"),
            GithubObservation::Registered { busy: true }
        );
        assert_eq!(observation(&l, "zz"), GithubObservation::NotRegistered);
        let failed: Listing = Err(GithubError::Unreachable {
            endpoint: "orgs.runners.list",
            reason: "connection refused".into(),
        });
        assert_eq!(observation(&failed, "a"), GithubObservation::Unreachable);
    }

    #[test]
    fn permissions_are_terminal_conflicts_remove_the_stale_name_and_outages_retry() {
        let forbidden = GithubError::Forbidden {
            endpoint: "orgs.runners.jit",
            message: "Resource not accessible by integration".into(),
            remedy: "grant",
        };
        assert_eq!(jit_retry(&forbidden), JitRetry::Terminal);
        assert_eq!(
            jit_retry(&GithubError::Unauthorized {
                message: "bad".into()
            }),
            JitRetry::Terminal
        );
        assert_eq!(
            jit_retry(&GithubError::Conflict {
                endpoint: "orgs.runners.jit",
                message: "exists".into()
            }),
            JitRetry::RemoveStaleName
        );
        assert_eq!(
            jit_retry(&GithubError::Server {
                endpoint: "orgs.runners.jit",
                status: 502,
                message: String::new()
            }),
            JitRetry::Later(None)
        );
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(99);
        assert_eq!(
            jit_retry(&GithubError::RateLimited {
                kind: rm_github::LimitKind::Secondary,
                resource: "core".into(),
                retry_at: at
            }),
            JitRetry::Later(Some(at))
        );
    }

    #[test]
    fn backoff_doubles_from_a_second_and_is_capped() {
        let waits: Vec<u64> = (1..=8).map(|n| jit_backoff(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn candidate(installation: u64, free_at: Option<u64>) -> Candidate {
        Candidate {
            installation,
            free_at: free_at.map(at),
        }
    }

    #[test]
    fn registrations_rotate_over_the_installations_that_can_leave_else_wait_for_the_earliest() {
        let now = at(100);
        // (candidates as (installation, free at), turn, the choice as (installation, ready))
        type Case<'a> = (&'a [(u64, Option<u64>)], u64, Option<(u64, bool)>);
        let cases: [Case; 9] = [
            (&[], 0, None),
            (&[(1, None)], 0, Some((1, true))),
            (&[(1, None)], 7, Some((1, true))),
            // Every one ready: the turn rotates over them, in order.
            (&[(1, None), (2, None), (3, None)], 0, Some((1, true))),
            (&[(1, None), (2, None), (3, None)], 4, Some((2, true))),
            // A time already past is ready; one still ahead is skipped by the rotation.
            (
                &[(1, Some(150)), (2, Some(90)), (3, None)],
                1,
                Some((3, true)),
            ),
            (
                &[(1, Some(150)), (2, Some(90)), (3, None)],
                2,
                Some((2, true)),
            ),
            // None ready: the earliest, whatever the turn; on a tie the first listed.
            (
                &[(1, Some(150)), (2, Some(120)), (3, Some(130))],
                5,
                Some((2, false)),
            ),
            (&[(1, Some(120)), (2, Some(120))], 1, Some((1, false))),
        ];
        for (listed, turn, expected) in cases {
            let candidates: Vec<Candidate> =
                listed.iter().map(|(i, f)| candidate(*i, *f)).collect();
            let choice = pick(&candidates, now, turn).map(|c| (c.installation, c.ready));
            assert_eq!(choice, expected, "{listed:?} turn {turn}");
        }
    }

    #[test]
    fn only_a_further_app_s_terminal_refusal_sets_its_installation_aside() {
        let forbidden = GithubError::Forbidden {
            endpoint: "orgs.runners.jit",
            message: "Resource not accessible by integration".into(),
            remedy: "",
        };
        let busy = GithubError::Server {
            endpoint: "orgs.runners.jit",
            status: 502,
            message: String::new(),
        };
        // (error, the installation's App, set aside)
        for (error, app, aside) in [
            (&forbidden, 2, true),
            (&forbidden, 1, false),
            (&busy, 2, false),
        ] {
            assert_eq!(sets_aside(error, app, 1), aside, "{error} of App {app}");
        }
    }

    #[test]
    fn consecutive_turns_share_a_burst_evenly() {
        let candidates: Vec<Candidate> = (1..=3).map(|i| candidate(i, None)).collect();
        let mut counts = HashMap::new();
        for turn in 0..30 {
            if let Some(c) = pick(&candidates, at(0), turn) {
                *counts.entry(c.installation).or_insert(0) += 1;
            }
        }
        assert_eq!(counts, HashMap::from([(1, 10), (2, 10), (3, 10)]));
    }
}
