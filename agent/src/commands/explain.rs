//! `rm-agent explain JOB_ID [--json]` (CONTRACT §8): reads the journal and the agent's last
//! status snapshot, and prints the verdict [`crate::explain::explain`] decides from them. Works
//! with the agent stopped (the snapshot outlives it; the answer says how old it is). Exit 0 when
//! the journal holds the job, 1 when it does not (the `not_seen` answer is still printed).
//! Also gathers the same facts for `status`'s waiting jobs ([`waiting`]).

use std::time::SystemTime;

use rm_journal::{AttemptRecord, JobId, JobRow, Reader};

use crate::config::{Config, Isolation};
use crate::exit::Exit;
use crate::explain::{self, Explanation, Facts};
use crate::output::print_json;
use crate::status_file::{self, Liveness, Snapshot, unix_ms};

/// What the decision reads, owned.
struct Gathered {
    now_ms: i64,
    snapshot: Option<Snapshot>,
    agent: Liveness,
    queued: Vec<JobRow>,
    attempts: Vec<AttemptRecord>,
}

impl Gathered {
    fn read(config: &Config, reader: Option<&Reader>, now: SystemTime) -> anyhow::Result<Self> {
        let now_ms = unix_ms(now);
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
        })
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
        }
    }
}

pub fn run(config: &Config, job_id: JobId, json: bool) -> Result<(), Exit> {
    let reader = super::open_reader_or_empty(config, json)?;
    let gathered =
        Gathered::read(config, reader.as_ref(), SystemTime::now()).map_err(Exit::runtime)?;
    let job = match &reader {
        Some(reader) => reader.job(job_id).map_err(Exit::runtime)?,
        None => None,
    };
    let facts = gathered.facts(config);
    let explanation = explain::explain(job_id, job.as_ref(), &facts);
    if json {
        print_json(&explain::to_json(&explanation, &facts));
    } else {
        crate::out!("{}", explain::render(&explanation));
    }
    match job {
        Some(_) => Ok(()),
        None => Err(Exit::runtime(anyhow::anyhow!(
            "the journal in {} has no job {job_id}: no delivery named it and no poll found it \
             yet; check the id (the job's URL ends in it) and `rm-agent jobs`",
            config.data_dir.display()
        ))),
    }
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
