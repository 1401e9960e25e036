//! The claims room (CONTRACT §9): in a fleet, which of the queued jobs this host serves. A host
//! holds a lease in the shared journal ([`rm_journal::Fleet`]) and claims the jobs it starts
//! runners for, so a queued job gets one runner fleet-wide and a host's ceiling never hides a
//! job another host could start. It owns the rules of how many jobs to claim and which claim to
//! give back, as pure functions; the journal's claims are made under its locks.
//!
//! A JIT runner takes whichever job GitHub hands it, not the one it was started for, so claims
//! count runners rather than bind them: a host keeps as many claims on queued jobs as it has
//! runners waiting (or about to start) for them. When one of its runners takes a job it did not
//! claim, the host gives one of its claims on a queued job back ([`claim_to_release`]): that
//! job is now another host's to serve (the host whose claimed job this runner took has a
//! runner waiting and no claim for it, so it claims the freed job). A host that dies stops
//! renewing its lease; after [`LEASE_TTL`] its claims stop counting and other hosts claim their
//! jobs.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rm_github::GithubClient;
use rm_github::pacing::{MUTATION_POINTS, PACED_HOUR, PACED_MINUTE, Pacing};
use rm_journal::{
    ClaimRequest, Claimed, Fleet, FleetError, FleetView, HostInfo, JournalError, Lease,
    SpendWindow, Store,
};
use rm_vocab::{JobId, JobState};

/// How long a host's lease lasts without a renewal: a host that dies loses its claims after
/// this, and other hosts serve their jobs.
pub const LEASE_TTL: Duration = Duration::from_secs(30);

/// How often the lease is renewed: three tries before it runs out.
pub const LEASE_RENEW: Duration = Duration::from_secs(10);

/// A fleet host's settings. The fleet's shared state is where the executor's store keeps it
/// ([`rm_journal::Store::fleet`]): the shared journal, or this host's file for a fleet of one.
#[derive(Debug, Clone)]
pub struct FleetSettings {
    /// A policy's fleet-wide ceiling on live runners (claims), by policy name.
    pub max_runners: HashMap<String, u32>,
    /// The windows of GitHub's limits on one installation's JIT registrations, which the
    /// fleet's hosts spend together.
    pub registrations: RegistrationWindows,
}

/// Where a fleet host's registration windows come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistrationWindows {
    /// From the configured pacing and, per registration, whether this host's client counts the
    /// installation's `POST`s as content now ([`shared_windows`]): production.
    Paced(Pacing),
    /// The same windows for every registration (a test's).
    Fixed(Vec<SpendWindow>),
}

/// A window that never binds but keeps an hour of the fleet's reservations: the journal forgets
/// what is older than the longest window of the call, so a host that does not count content
/// must not let the hour's reservations go, which another host counting content reads.
pub(crate) const KEEP_THE_HOUR: SpendWindow = SpendWindow {
    limit: u32::MAX,
    span: PACED_HOUR,
};

/// The `spends.scope` under which the fleet's hosts count one installation's JIT registrations:
/// GitHub counts them per installation, and an installation belongs to one App; the App is
/// named so that an operator reading the table sees which. A free-text key, not a column: no
/// migration, and rows under the key of an older rm (`installation:{id}:registrations`) leave
/// the windows within the longest of them (an hour).
pub(crate) fn registration_scope(app: u64, installation: u64) -> String {
    format!("app:{app}:installation:{installation}:registrations")
}

/// The windows the fleet's hosts share per installation for its JIT registrations, from the
/// configured pacing and whether the installation's `POST`s count as content now (`content`:
/// this host learned the content limit from a secondary limit, or paces cautiously). GitHub
/// counts its secondary limits per installation, not per host, so N hosts pacing on their own
/// would send up to N times them. Documented or cautious pacing: the JIT template's points
/// (900 a minute at 5 a registration: 180) over rm's paced minute, and while content counts,
/// the content-creation limits (80 a minute, 500 an hour) over rm's paced spans; one mutation
/// per interval: one registration per interval fleet-wide. An organization's and a
/// repository's registrations are two templates at GitHub but share one window here: the
/// cautious side. Each host learns the content limit at its own first limit (the learned
/// state is this host's client's, not shared); until then the other hosts' registrations are
/// held by the points window alone, and they meet GitHub's limit themselves once.
pub fn shared_windows(pacing: Pacing, content: bool) -> Vec<SpendWindow> {
    match pacing {
        Pacing::Documented(limits) | Pacing::Cautious(limits) => {
            let mut windows = vec![SpendWindow {
                limit: limits.points_per_minute / MUTATION_POINTS,
                span: PACED_MINUTE,
            }];
            if content || matches!(pacing, Pacing::Cautious(_)) {
                windows.push(SpendWindow {
                    limit: limits.creations_per_minute,
                    span: PACED_MINUTE,
                });
                windows.push(SpendWindow {
                    limit: limits.creations_per_hour,
                    span: PACED_HOUR,
                });
            } else {
                windows.push(KEEP_THE_HOUR);
            }
            windows
        }
        Pacing::Spaced(interval) => vec![SpendWindow {
            limit: 1,
            span: interval,
        }],
    }
}

/// This host's standing in the fleet, as one pass reads it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Standing {
    /// This host's claims on queued jobs, per policy, oldest first.
    pub(super) mine: HashMap<String, Vec<JobId>>,
    /// Every job this host holds a live claim on, queued or in progress.
    pub(super) held: HashSet<JobId>,
    /// Every job a live claim holds, this host's or another's.
    pub(super) taken: HashSet<JobId>,
}

impl Standing {
    /// This host's standing in `view`.
    pub(super) fn of(view: &FleetView, host: &str) -> Standing {
        let mut standing = Standing::default();
        for other in view.hosts.iter().filter(|h| h.live) {
            for claim in &other.claims {
                standing.taken.insert(claim.job_id);
                if other.host == host {
                    standing.held.insert(claim.job_id);
                }
                if other.host == host && claim.job_state == JobState::Queued {
                    standing
                        .mine
                        .entry(claim.policy.clone())
                        .or_default()
                        .push(claim.job_id);
                }
            }
        }
        standing
    }

    /// This host's claims on `policy`'s queued jobs.
    pub(super) fn mine(&self, policy: &str) -> &[JobId] {
        self.mine.get(policy).map_or(&[], Vec::as_slice)
    }
}

/// The jobs a host may claim for a policy: those routed to it (`routed`, oldest first) that no
/// live claim holds.
pub(super) fn candidates(routed: &[JobId], taken: &HashSet<JobId>) -> Vec<JobId> {
    routed
        .iter()
        .copied()
        .filter(|id| !taken.contains(id))
        .collect()
}

/// How many more jobs to claim: as many as the runners this host could have for the policy's
/// jobs (those waiting, `unassigned`, and those the ceilings let it start now, `could_start`)
/// exceed its claims on queued jobs (`mine`), at most the `candidates` there are.
pub(super) fn claims_to_make(could_start: u32, unassigned: u32, mine: u32, candidates: u32) -> u32 {
    could_start
        .saturating_add(unassigned)
        .saturating_sub(mine)
        .min(candidates)
}

/// Which claim to give back when one of this host's runners took `taken`: none if `taken` is
/// one of its own claims (`held`, in any state), else the newest of its claims on the policy's
/// queued jobs (`mine`, oldest first: the oldest has waited longest for its runner).
pub(super) fn claim_to_release(
    taken: JobId,
    held: &HashSet<JobId>,
    mine: &[JobId],
) -> Option<JobId> {
    if held.contains(&taken) {
        return None;
    }
    mine.last().copied()
}

/// This host's membership of the fleet: its lease, its claims. Cheap to clone; every call runs
/// on the blocking pool (the fleet's clients block).
#[derive(Clone)]
pub(super) struct Membership {
    connection: Arc<Mutex<Connection>>,
    info: Arc<HostInfo>,
    max_runners: Arc<HashMap<String, u32>>,
    registrations: Arc<RegistrationWindows>,
    /// This host's client: whether it counts an installation's `POST`s as content now.
    github: GithubClient,
}

/// The fleet's connection, made again after it was lost.
struct Connection {
    store: Store,
    fleet: Option<Box<dyn Fleet + Send>>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        // A PostgreSQL client closes its connection on drop, which blocks and panics on a
        // runtime's worker (it runs a runtime of its own): the last holder may be the loop.
        if let Some(fleet) = self.fleet.take() {
            std::thread::spawn(move || drop(fleet));
        }
    }
}

impl Connection {
    fn with<R>(
        &mut self,
        call: impl FnOnce(&mut dyn Fleet) -> Result<R, FleetError>,
    ) -> Result<R, FleetError> {
        let fleet = match &mut self.fleet {
            Some(fleet) => fleet,
            None => {
                let opened = self.store.fleet()?;
                self.fleet.insert(opened)
            }
        };
        let result = call(fleet.as_mut());
        if matches!(result, Err(FleetError::Journal(_))) {
            // Connect afresh next time: the server may have restarted.
            self.fleet = None;
        }
        result
    }
}

impl Membership {
    /// This host (`info`) in the fleet at `settings.store`; connects on first use, so a
    /// database down at start is tried again by the next call.
    pub(super) fn new(
        settings: &FleetSettings,
        store: Store,
        info: HostInfo,
        github: GithubClient,
    ) -> Membership {
        Membership {
            connection: Arc::new(Mutex::new(Connection { store, fleet: None })),
            info: Arc::new(info),
            max_runners: Arc::new(settings.max_runners.clone()),
            registrations: Arc::new(settings.registrations.clone()),
            github,
        }
    }

    pub(super) fn host(&self) -> &str {
        &self.info.host
    }

    async fn call<R: Send + 'static>(
        &self,
        call: impl FnOnce(&mut dyn Fleet, &HostInfo) -> Result<R, FleetError> + Send + 'static,
    ) -> Result<R, FleetError> {
        let (connection, info) = (Arc::clone(&self.connection), Arc::clone(&self.info));
        let ran = tokio::task::spawn_blocking(move || {
            connection
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .with(|fleet| call(fleet, &info))
        })
        .await;
        match ran {
            Ok(result) => result,
            Err(e) => Err(not_run(e)),
        }
    }

    /// Renews this host's lease for [`LEASE_TTL`].
    pub(super) async fn renew(&self) -> Result<Lease, FleetError> {
        self.call(|fleet, info| fleet.renew_lease(info, LEASE_TTL))
            .await
    }

    /// Ends this host's lease (an orderly stop): its claims on queued jobs go to other hosts
    /// at once.
    pub(super) async fn leave(&self) -> Result<(), FleetError> {
        self.call(|fleet, info| fleet.leave(&info.host)).await
    }

    /// This host's standing now.
    pub(super) async fn standing(&self) -> Result<Standing, FleetError> {
        let view = self.call(|fleet, _| fleet.view()).await?;
        Ok(Standing::of(&view, &self.info.host))
    }

    /// Claims `job_ids` (most wanted first) for `policy`, under its fleet-wide ceiling.
    pub(super) async fn claim(
        &self,
        policy: &str,
        job_ids: Vec<JobId>,
    ) -> Result<Claimed, FleetError> {
        let policy = policy.to_owned();
        let max_runners = self.max_runners.get(&policy).copied();
        self.call(move |fleet, info| {
            fleet.claim(&ClaimRequest {
                host: &info.host,
                policy: &policy,
                job_ids: &job_ids,
                max_runners,
            })
        })
        .await
    }

    /// Gives the claim on `job_id` back: another host may serve it.
    pub(super) async fn release(&self, job_id: JobId) -> Result<bool, FleetError> {
        self.call(move |fleet, info| fleet.release(&info.host, job_id))
            .await
    }

    /// Records that `runner` took this host's claimed `job_id` (for `status`).
    pub(super) async fn name_runner(
        &self,
        job_id: JobId,
        runner: String,
    ) -> Result<bool, FleetError> {
        self.call(move |fleet, info| fleet.name_runner(&info.host, job_id, &runner))
            .await
    }

    /// Reserves one JIT registration of App `app`'s `installation` in the fleet's shared
    /// windows: `None` when reserved (send it now), else how long until there is room. The
    /// windows are computed per call: they follow whether this host counts the installation's
    /// content now.
    pub(super) async fn reserve_registration(
        &self,
        app: u64,
        installation: u64,
    ) -> Result<Option<Duration>, FleetError> {
        let windows = match self.registrations.as_ref() {
            RegistrationWindows::Paced(pacing) => {
                let content = self.github.counts_content(installation).is_some();
                shared_windows(*pacing, content)
            }
            RegistrationWindows::Fixed(windows) => windows.clone(),
        };
        self.call(move |fleet, info| {
            fleet.reserve(&registration_scope(app, installation), &info.host, &windows)
        })
        .await
    }

    /// Renews the lease every [`LEASE_RENEW`] until the loop stops (the task ends with the
    /// membership's last other holder).
    pub(super) fn spawn_renewal(&self) -> tokio::task::JoinHandle<()> {
        let membership = self.clone();
        tokio::spawn(async move {
            loop {
                match membership.renew().await {
                    Ok(lease) => {
                        if let rm_journal::Renewal::Reacquired { dropped_claims } = lease.renewal {
                            tracing::warn!(
                                dropped_claims,
                                "this host's fleet lease had expired; its claims went to other hosts"
                            );
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot renew this host's fleet lease; no job is claimed while it is expired");
                    }
                }
                tokio::time::sleep(LEASE_RENEW).await;
            }
        })
    }
}

/// A blocking fleet call that did not return: a panic in it goes on unwinding here; one the
/// runtime cancelled (it is shutting down) claimed nothing known.
fn not_run(e: tokio::task::JoinError) -> FleetError {
    match e.try_into_panic() {
        Ok(panic) => std::panic::resume_unwind(panic),
        Err(_) => FleetError::Journal(JournalError::WriterStopped),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_claims_what_its_runners_could_serve_beyond_its_claims() {
        // Room for 3 more runners, 1 waiting, 2 claims already: 2 more.
        assert_eq!(claims_to_make(3, 1, 2, 10), 2);
        // No more candidates than there are.
        assert_eq!(claims_to_make(3, 1, 0, 2), 2);
        // At the ceiling with claims covering the waiting runner: none.
        assert_eq!(claims_to_make(0, 1, 1, 5), 0);
        // A spare runner (another host's job taken by it left it without a claim) claims one.
        assert_eq!(claims_to_make(0, 1, 0, 5), 1);
        // More claims than runners (a runner gave up): none, never negative.
        assert_eq!(claims_to_make(0, 0, 3, 5), 0);
    }

    /// A table: (pacing, content counted now) → the shared windows.
    #[test]
    fn the_fleet_shares_the_template_s_points_the_learned_content_limits_or_the_spacing() {
        use rm_github::pacing::DOCUMENTED;
        let points = SpendWindow {
            limit: 180,
            span: PACED_MINUTE,
        };
        let content = [
            SpendWindow {
                limit: 80,
                span: PACED_MINUTE,
            },
            SpendWindow {
                limit: 500,
                span: PACED_HOUR,
            },
        ];
        let cases = [
            (
                "documented, not learned",
                Pacing::Documented(DOCUMENTED),
                false,
                vec![points, KEEP_THE_HOUR],
            ),
            (
                "documented, learned",
                Pacing::Documented(DOCUMENTED),
                true,
                vec![points, content[0], content[1]],
            ),
            (
                "cautious",
                Pacing::Cautious(DOCUMENTED),
                false,
                vec![points, content[0], content[1]],
            ),
        ];
        for (name, pacing, counted, want) in cases {
            assert_eq!(shared_windows(pacing, counted), want, "{name}");
        }
        let spaced = shared_windows(Pacing::Spaced(Duration::from_secs(1)), true);
        assert_eq!(
            spaced,
            [SpendWindow {
                limit: 1,
                span: Duration::from_secs(1)
            }]
        );
    }

    #[test]
    fn standing_counts_only_the_claims_of_live_hosts() {
        let host = |name: &str, live: bool, claims: &[(i64, JobState)]| rm_journal::HostView {
            host: name.to_owned(),
            labels: Vec::new(),
            policies: vec!["linux".to_owned()],
            registered_at_ms: rm_vocab::UnixMs::EPOCH,
            renewed_at_ms: rm_vocab::UnixMs::EPOCH,
            expires_at_ms: rm_vocab::UnixMs::EPOCH,
            live,
            claims: claims
                .iter()
                .map(|&(id, job_state)| rm_journal::ClaimView {
                    job_id: JobId::new(id),
                    policy: "linux".to_owned(),
                    runner_name: None,
                    claimed_at_ms: rm_vocab::UnixMs::EPOCH,
                    job_state,
                })
                .collect(),
        };
        let view = FleetView {
            now_ms: rm_vocab::UnixMs::EPOCH,
            hosts: vec![
                host(
                    "a",
                    true,
                    &[(1, JobState::Queued), (2, JobState::InProgress)],
                ),
                host("b", true, &[(3, JobState::Queued)]),
                host("dead", false, &[(4, JobState::Queued)]),
            ],
            leaders: Vec::new(),
        };
        let standing = Standing::of(&view, "a");
        assert_eq!(standing.mine("linux"), &[JobId::new(1)]);
        assert_eq!(standing.held, [JobId::new(1), JobId::new(2)].into());
        assert_eq!(standing.taken, [1, 2, 3].map(JobId::new).into());
    }

    #[test]
    fn a_runner_that_took_another_job_gives_one_claim_back() {
        let id = JobId::new;
        let held: HashSet<JobId> = [id(6), id(7), id(8)].into();
        // Its own claim (6 is already in progress: read after the runner took it).
        assert_eq!(claim_to_release(id(6), &held, &[id(7), id(8)]), None);
        assert_eq!(claim_to_release(id(7), &held, &[id(7), id(8)]), None);
        // Another host's job, or one nobody claimed: the newest queued claim goes back.
        assert_eq!(claim_to_release(id(9), &held, &[id(7), id(8)]), Some(id(8)));
        assert_eq!(claim_to_release(id(9), &HashSet::new(), &[]), None);
    }

    #[test]
    fn candidates_are_the_routed_jobs_no_live_claim_holds() {
        let id = JobId::new;
        let taken: HashSet<JobId> = [id(2), id(4)].into();
        assert_eq!(
            candidates(&[id(1), id(2), id(3), id(4), id(5)], &taken),
            vec![id(1), id(3), id(5)]
        );
    }
}
