//! `rm-agent explain JOB_ID [--json]` (CONTRACT §8): reads the journal and the agent's last
//! status snapshot, and prints the verdict [`crate::explain::explain`] decides from them. Works
//! with the agent stopped (the snapshot outlives it; the answer says how old it is). Exit 0 when
//! the journal holds the job, 1 when it does not (the `not_seen` answer is still printed).
//! Also gathers the same facts for `status`'s waiting jobs ([`waiting`]).
//!
//! With `journal.url` (CONTRACT §9) the job, the queue and the claims come from the fleet's
//! journal and this host's runners from its own: the answer is this host's view, with the
//! job's claim first ([`crate::explain::fleet`]).

use std::time::SystemTime;

use rm_journal::{AttemptRecord, FleetView, JobReader, JobRow, Reader};
use rm_vocab::JobId;

use crate::config::{Config, Isolation};
use crate::exit::Exit;
use crate::explain::{self, Explanation, Facts, ended::RanAttempt, fleet::FleetFacts};
use crate::output::print_json;
use crate::status_file::{self, Liveness, Snapshot};
use rm_runner::logs::Store;

/// What the decision reads, owned.
struct Gathered {
    now_ms: rm_vocab::UnixMs,
    snapshot: Option<Snapshot>,
    agent: Liveness,
    queued: Vec<JobRow>,
    attempts: Vec<AttemptRecord>,
    /// In a fleet: the fleet's hosts and claims.
    fleet: Option<FleetView>,
    /// This host's attempts that ran the job explained (none for `status`'s waiting jobs).
    ran: Vec<RanAttempt>,
    /// The re-run this host journalled for the job explained.
    rerun: Option<rm_journal::RerunRecord>,
    /// This host's journalled scale sets (their listeners' notes).
    scale_sets: Vec<rm_journal::ScaleSetRecord>,
}

impl Gathered {
    fn read(config: &Config, reader: Option<&Reader>, now: SystemTime) -> anyhow::Result<Self> {
        let now_ms = rm_vocab::UnixMs::from_system_time(now);
        let (snapshot, agent) = status_file::observe(&config.data_dir, now_ms);
        let (queued, attempts) = match reader {
            Some(reader) => (reader.queued_jobs()?, reader.uncleaned_attempts()?),
            None => (Vec::new(), Vec::new()),
        };
        Ok(Gathered {
            now_ms,
            snapshot,
            agent,
            queued,
            attempts,
            fleet: None,
            ran: Vec::new(),
            rerun: None,
            scale_sets: scale_set_records(config)?,
        })
    }

    /// In a fleet: this host's attempts from `local`; from the fleet's journal its `queued`
    /// jobs and `view`, the fleet's claims.
    fn read_fleet(
        config: &Config,
        local: Option<&Reader>,
        queued: Vec<JobRow>,
        view: FleetView,
        now: SystemTime,
    ) -> anyhow::Result<Self> {
        let mut gathered = Gathered::read(config, local, now)?;
        gathered.queued = queued;
        gathered.fleet = Some(view);
        Ok(gathered)
    }

    fn facts<'a>(&'a self, config: &'a Config) -> Facts<'a> {
        Facts {
            now_ms: self.now_ms,
            policies: &config.policies,
            // The running agent's own ceiling wins over the file's (it may be edited since).
            host_max: self
                .snapshot
                .as_ref()
                .filter(|_| self.agent.is_running())
                .map_or(config.host.max_runners, |s| s.host.max_runners),
            queued: &self.queued,
            attempts: &self.attempts,
            agent: self.agent,
            snapshot: self.snapshot.as_ref(),
            uid_pool: (config.host.isolation == Isolation::User)
                .then(|| config.host.runner_uids.len()),
            fleet: self.fleet.as_ref().map(|view| FleetFacts {
                host: &config.host.name,
                view,
            }),
            ran: &self.ran,
            rerun: self.rerun.as_ref(),
            scale_sets: &self.scale_sets,
            capacity: config.host.capacity,
            devices: &config.host.devices,
        }
    }
}

/// This host's journalled scale sets, read-only (as `status` reads them); none without scale
/// sets or a journal.
fn scale_set_records(config: &Config) -> anyhow::Result<Vec<rm_journal::ScaleSetRecord>> {
    if config.scale_sets.is_empty() {
        return Ok(Vec::new());
    }
    let file = super::store(config).file().to_owned();
    if !file.exists() {
        return Ok(Vec::new());
    }
    Ok(rm_journal::ScaleSets::open_read_only(&file)?.all()?)
}

pub fn run(config: &Config, job_id: JobId, json: bool) -> Result<(), Exit> {
    let now = SystemTime::now();
    let store = super::store(config);
    let (gathered, job, journal) = match store.is_shared() {
        false => {
            let reader = super::open_reader_or_empty(config, json)?;
            let gathered = Gathered::read(config, reader.as_ref(), now).map_err(Exit::runtime)?;
            let job = match &reader {
                Some(reader) => reader.job(job_id).map_err(Exit::runtime)?,
                None => None,
            };
            (
                gathered,
                job,
                format!("the journal in {}", config.data_dir.display()),
            )
        }
        true => {
            // This host's runners are in its own journal (it may have none yet).
            let local = super::open_local_reader(config)?;
            let journal = store.describe();
            let read = |jobs: &mut JobReader| -> anyhow::Result<(Gathered, Option<JobRow>)> {
                let view = super::fleet_view(&store)?;
                let queued = jobs.queued_jobs()?;
                let gathered = Gathered::read_fleet(config, local.as_ref(), queued, view, now)?;
                Ok((gathered, jobs.job(job_id)?))
            };
            let (gathered, job) = store
                .jobs()
                .map_err(anyhow::Error::new)
                .and_then(|mut pg| read(&mut pg))
                .map_err(|e| Exit::runtime(e.context(format!("cannot read {journal}"))))?;
            (gathered, job, journal)
        }
    };
    let mut gathered = gathered;
    gathered.ran = ran_the_job(config, job_id, job.as_ref()).map_err(Exit::runtime)?;
    gathered.rerun = match super::open_local_reader(config)? {
        Some(reader) => reader.rerun_for_job(job_id).map_err(Exit::runtime)?,
        None => None,
    };
    let facts = gathered.facts(config);
    let mut explanation = explain::explain(job_id, job.as_ref(), &facts);
    let cache_facts = job_cache(config, job_id, &gathered)?;
    explanation
        .reasons
        .extend(explain::cache::reasons(&explain::cache::JobCache {
            policy: cache_facts
                .policy
                .as_ref()
                .map(|(name, cached)| (name.as_str(), *cached)),
            redirect: gathered
                .snapshot
                .as_ref()
                .and_then(|s| s.cache.as_ref())
                .and_then(|c| c.redirect.as_ref()),
            counters: cache_facts.counters,
        }));
    let egress = egress_of(config, &gathered.ran)?;
    explanation.reasons.extend(explain::egress::reasons(
        &egress
            .iter()
            .map(|e| (e.runner_name.clone(), e.egress.clone()))
            .collect::<Vec<_>>(),
    ));
    if json {
        let mut value = explain::to_json(&explanation, &facts);
        value["egress"] = serde_json::json!(egress);
        value["cache"] = serde_json::json!(cache_facts.counters.map(|c| serde_json::json!({
            "hits": c.hits,
            "misses": c.misses,
            "bytes_up": c.bytes_up,
            "bytes_down": c.bytes_down,
        })));
        print_json(&value);
    } else {
        crate::out!("{}", explain::render(&explanation));
    }
    match job {
        Some(_) => Ok(()),
        None => Err(Exit::runtime(anyhow::anyhow!(
            "{journal} has no job {job_id}: no delivery named it and no poll found it yet; \
             check the id (the job's URL ends in it) and `rm-agent jobs`"
        ))),
    }
}

/// This host's attempts that ran `job_id` (named by the job's row, or naming the job), oldest
/// first, as `rm-agent logs` finds them: from this host's own journal and its kept logs.
pub(crate) fn ran_the_job(
    config: &Config,
    job_id: JobId,
    job: Option<&JobRow>,
) -> anyhow::Result<Vec<RanAttempt>> {
    let store = Store::new(&config.data_dir, config.logs);
    let records = match super::open_local_reader(config).map_err(|e| anyhow::anyhow!("{e}"))? {
        Some(reader) => reader.attempts(usize::MAX)?,
        None => Vec::new(),
    };
    let kept = store.entries()?;
    let found = super::logs::resolve(
        &job_id.get().to_string(),
        job.and_then(|j| j.runner_name.as_deref()),
        &records,
        kept.into_iter().filter_map(|(_, manifest)| manifest),
    );
    Ok(found
        .into_iter()
        .map(|found| {
            let entry = store.entry(&found.attempt_id);
            let record = found.record.as_ref();
            RanAttempt {
                runner_name: found.runner_name.clone(),
                outcome: record.and_then(|r| r.outcome),
                reason: record.and_then(|r| r.reason.clone()),
                detail: record.and_then(|r| r.detail.clone()),
                live: record.is_some_and(|r| r.state != rm_journal::AttemptState::Cleaned),
                logs: entry.is_dir().then_some(entry),
                image: record.and_then(|r| r.image.clone()),
                attempt_id: found.attempt_id,
            }
        })
        .collect())
}

/// One runner's egress record, as `explain --json` and `rm-agent egress --json` show it.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct AttemptEgress {
    pub attempt_id: String,
    pub runner_name: String,
    pub egress: rm_egress::record::Record,
}

/// The egress records of the runners that ran the job (`ran`), oldest first; none for runners
/// of policies without egress. A record that does not read is said in the log and left out.
pub(crate) fn egress_of(config: &Config, ran: &[RanAttempt]) -> Result<Vec<AttemptEgress>, Exit> {
    let Some(reader) = super::open_local_reader(config)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for attempt in ran {
        let Ok(id) = rm_journal::AttemptId::parse(&attempt.attempt_id) else {
            continue;
        };
        let Some(json) = reader.egress(&id).map_err(Exit::runtime)? else {
            continue;
        };
        match serde_json::from_str(&json) {
            Ok(egress) => out.push(AttemptEgress {
                attempt_id: attempt.attempt_id.clone(),
                runner_name: attempt.runner_name.clone(),
                egress,
            }),
            Err(e) => {
                tracing::warn!(attempt = %attempt.attempt_id, error = %e, "an egress record does not read")
            }
        }
    }
    Ok(out)
}

/// What `explain` reads about a job's cache: the policy of the last attempt of this host that
/// ran it (and whether it sets `cache`), and the job's counters in the cache's index.
struct CacheFacts {
    policy: Option<(String, bool)>,
    counters: Option<rm_cache::Counters>,
}

fn job_cache(config: &Config, job_id: JobId, gathered: &Gathered) -> Result<CacheFacts, Exit> {
    let last = gathered.ran.last().map(|ran| ran.attempt_id.as_str());
    let policy = match (last, super::open_local_reader(config)?) {
        (Some(attempt), Some(reader)) => reader
            .attempts(usize::MAX)
            .map_err(Exit::runtime)?
            .into_iter()
            .find(|a| a.attempt_id.as_str() == attempt)
            .map(|a| {
                let cached = config
                    .policies
                    .iter()
                    .any(|p| p.name == a.policy && p.cache);
                (a.policy, cached)
            }),
        _ => None,
    };
    let counters = match &config.cache {
        Some(cache) if policy.as_ref().is_some_and(|(_, cached)| *cached) => {
            rm_cache::job_counters(&cache.dir, job_id.get()).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "cannot read the cache's counters");
                None
            })
        }
        _ => None,
    };
    Ok(CacheFacts { policy, counters })
}

/// The verdict of every queued job, oldest first, for `status`.
pub(crate) fn waiting(
    config: &Config,
    reader: Option<&Reader>,
    now: SystemTime,
) -> anyhow::Result<Vec<Explanation>> {
    let gathered = Gathered::read(config, reader, now)?;
    let facts = gathered.facts(config);
    Ok(explain::explain_queued(&facts))
}

/// [`waiting`] on a fleet host: the fleet's `queued` jobs as this host sees them (their
/// claims first), its own runners from `local`.
pub(crate) fn waiting_in_fleet(
    config: &Config,
    local: Option<&Reader>,
    queued: Vec<JobRow>,
    view: FleetView,
    now: SystemTime,
) -> anyhow::Result<Vec<Explanation>> {
    let gathered = Gathered::read_fleet(config, local, queued, view, now)?;
    let facts = gathered.facts(config);
    Ok(explain::explain_queued(&facts))
}
