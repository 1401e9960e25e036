//! Who a connection to the host-local cache comes from ([`rm_cache::Callers`]): the runner whose
//! network the address is (each runner's namespace has one address, chosen by its uid:
//! `rm_runner::network`), the live attempt holding that uid (this host's journal), the job the
//! attempt runs, and what GitHub's run says about that job ([`rm_cache::scope::RunFacts`]: one
//! `GET` of the run per run, kept while the agent runs). Nothing the job sends is believed: its
//! runtime token and its claims are the job's to forge.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rm_cache::scope::{RunFacts, scope_of};
use rm_cache::{Caller, Callers, Refusal};
use rm_github::GithubClient;
use rm_journal::{AttemptRecord, JobReader, Reader};
use rm_vocab::JobId;

/// How long a request waits for its runner's job to be journalled: a runner asks the cache in
/// its job's first step, which may come before the `in_progress` delivery naming the runner.
const JOB_KNOWN_WAIT: Duration = Duration::from_secs(15);

/// How often the journal is read again while waiting for the job.
const JOB_KNOWN_POLL: Duration = Duration::from_millis(200);

/// How long a run GitHub would not describe is not asked about again: its jobs' requests are
/// refused meanwhile (uncached, never scoped by a guess).
const RUN_FAILURE_BACKOFF: Duration = Duration::from_secs(30);

/// The most runs kept described; the oldest go first past it (a run's jobs come close together).
const RUNS_KEPT: usize = 4096;

/// The runner's address of each uid of the pool: the inverse of `network::addresses(slot_of)`.
pub(crate) fn runner_addresses(uids: impl IntoIterator<Item = u32>) -> HashMap<Ipv4Addr, u32> {
    uids.into_iter()
        .map(|uid| {
            let slot = rm_runner::network::slot_of(uid);
            (rm_runner::network::addresses(slot).runner, uid)
        })
        .collect()
}

/// The live attempt holding `uid`: neither released nor cleaned. Pure.
pub(crate) fn holder(attempts: &[AttemptRecord], uid: u32) -> Option<&AttemptRecord> {
    attempts
        .iter()
        .find(|a| a.uid == Some(uid) && a.released_at_ms.is_none())
}

/// A run as the cache scopes it, from GitHub's answer. Pure.
pub(crate) fn facts_of(run: &rm_github::types::RunIdentity) -> Result<RunFacts, String> {
    let default_branch = run
        .repository
        .default_branch
        .clone()
        .ok_or_else(|| format!("GitHub's run {} names no default branch", run.id))?;
    Ok(RunFacts {
        repository: run.repository.full_name.clone(),
        default_branch,
        // A run on a tag or a detached commit has no branch: it writes a scope of its own.
        head_branch: run.head_branch.clone().unwrap_or_default(),
        event: run.event.clone(),
        // A deleted head repository is foreign (fail closed: never the default branch's).
        head_repository: run
            .head_repository
            .as_ref()
            .map(|r| r.full_name.clone())
            .unwrap_or_default(),
    })
}

enum Described {
    Facts(RunFacts),
    Failed { at: Instant, why: String },
}

/// The agent's [`Callers`].
pub(crate) struct RunnerCallers {
    addresses: HashMap<Ipv4Addr, u32>,
    /// The service's port: a runner's signed URLs are on the host end of its network.
    port: u16,
    /// This host's journal file (its attempts).
    journal: PathBuf,
    jobs: Mutex<JobReader>,
    client: GithubClient,
    runs: Mutex<HashMap<u64, Described>>,
}

impl RunnerCallers {
    pub(crate) fn new(
        uids: impl IntoIterator<Item = u32>,
        port: u16,
        journal: PathBuf,
        jobs: JobReader,
        client: GithubClient,
    ) -> RunnerCallers {
        RunnerCallers {
            addresses: runner_addresses(uids),
            port,
            journal,
            jobs: Mutex::new(jobs),
            client,
            runs: Mutex::new(HashMap::new()),
        }
    }

    /// The attempt holding `uid` and its job, read from the journal (blocking).
    fn attempt_of(&self, uid: u32) -> Result<Option<(String, Option<JobId>)>, String> {
        let reader = Reader::open(&self.journal).map_err(|e| e.to_string())?;
        let attempts = reader.uncleaned_attempts().map_err(|e| e.to_string())?;
        Ok(holder(&attempts, uid).map(|a| (a.attempt_id.as_str().to_owned(), a.job_id)))
    }

    fn job_of(&self, job: JobId) -> Result<Option<(String, u64)>, String> {
        let mut jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        let row = jobs.job(job).map_err(|e| e.to_string())?;
        Ok(row.map(|r| (r.repository, u64::try_from(r.run_id).unwrap_or(0))))
    }

    async fn run_facts(&self, repository: &str, run_id: u64) -> Result<RunFacts, String> {
        {
            let runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
            match runs.get(&run_id) {
                Some(Described::Facts(facts)) => return Ok(facts.clone()),
                Some(Described::Failed { at, why }) if at.elapsed() < RUN_FAILURE_BACKOFF => {
                    return Err(why.clone());
                }
                _ => {}
            }
        }
        let (owner, repo) = repository
            .split_once('/')
            .ok_or_else(|| format!("job repository `{repository}` is not owner/name"))?;
        let described = match self.client.get_run(owner, repo, run_id).await {
            Ok(run) => facts_of(&run),
            Err(e) => Err(format!("cannot read run {run_id} of {repository}: {e}")),
        };
        let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        if runs.len() >= RUNS_KEPT {
            runs.clear();
        }
        match &described {
            Ok(facts) => runs.insert(run_id, Described::Facts(facts.clone())),
            Err(why) => runs.insert(
                run_id,
                Described::Failed {
                    at: Instant::now(),
                    why: why.clone(),
                },
            ),
        };
        described
    }

    async fn caller(self: &RunnerCallers, peer: IpAddr) -> Result<Caller, Refusal> {
        let v4 = match peer {
            IpAddr::V4(v4) => v4,
            IpAddr::V6(v6) => v6.to_ipv4_mapped().ok_or(Refusal::NotARunner)?,
        };
        let uid = *self.addresses.get(&v4).ok_or(Refusal::NotARunner)?;
        let started = Instant::now();
        let (attempt, job) = loop {
            let found = {
                let this = self;
                tokio::task::block_in_place(|| this.attempt_of(uid))
            }
            .map_err(Refusal::Unscoped)?;
            match found {
                None => return Err(Refusal::NotARunner),
                Some((attempt, Some(job))) => break (attempt, job),
                Some(_) if started.elapsed() >= JOB_KNOWN_WAIT => {
                    return Err(Refusal::Unscoped(
                        "the runner's job is not journalled yet".to_owned(),
                    ));
                }
                Some(_) => tokio::time::sleep(JOB_KNOWN_POLL).await,
            }
        };
        let (repository, run_id) = tokio::task::block_in_place(|| self.job_of(job))
            .map_err(Refusal::Unscoped)?
            .ok_or_else(|| Refusal::Unscoped(format!("job {job} is not in the journal")))?;
        let facts = self
            .run_facts(&repository, run_id)
            .await
            .map_err(Refusal::Unscoped)?;
        if !facts.repository.eq_ignore_ascii_case(&repository) {
            return Err(Refusal::Unscoped(format!(
                "GitHub's run {run_id} is of {}, not of the job's {repository}",
                facts.repository
            )));
        }
        let host_end = rm_runner::network::addresses(rm_runner::network::slot_of(uid)).host;
        Ok(Caller {
            job: job.get(),
            attempt,
            scope: scope_of(&facts),
            // Where the runner, and its containers, reach the service.
            base: Some(format!("http://{host_end}:{}/", self.port)),
        })
    }
}

impl Callers for RunnerCallers {
    fn identify(
        &self,
        peer: IpAddr,
    ) -> Pin<Box<dyn Future<Output = Result<Caller, Refusal>> + Send + '_>> {
        Box::pin(self.caller(peer))
    }
}

/// The callers as the service holds them.
pub(crate) fn shared(callers: RunnerCallers) -> Arc<dyn Callers> {
    Arc::new(callers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runner_address_names_its_uid_and_nothing_else_does() {
        let uids = 64200..=64263;
        let map = runner_addresses(uids.clone());
        for uid in uids {
            let at = rm_runner::network::addresses(rm_runner::network::slot_of(uid));
            assert_eq!(map.get(&at.runner), Some(&uid));
            // The host end of the veth is the agent's, never a runner.
            assert_eq!(map.get(&at.host), None);
        }
        assert_eq!(map.get(&Ipv4Addr::LOCALHOST), None);
    }

    #[test]
    fn a_run_without_a_default_branch_or_head_repository_fails_closed() {
        let repo = |name: &str, default: Option<&str>| rm_github::types::RunRepository {
            full_name: name.to_owned(),
            default_branch: default.map(str::to_owned),
        };
        let run = rm_github::types::RunIdentity {
            id: 7,
            event: "push".to_owned(),
            head_branch: Some("main".to_owned()),
            repository: repo("acme/app", None),
            head_repository: Some(repo("acme/app", None)),
        };
        assert!(facts_of(&run).is_err());
        let run = rm_github::types::RunIdentity {
            repository: repo("acme/app", Some("main")),
            head_repository: None,
            ..run
        };
        let facts = facts_of(&run).unwrap();
        // A deleted head repository never writes the default branch's scope.
        assert_ne!(scope_of(&facts).write, "refs/heads/main");
    }
}
