//! Runner attempts: the durable record of every runner this host starts, from the row written
//! before any effect outside the process (ARCHITECTURE guarantee 3) to `cleaned`.
//!
//! This module owns the attempt's persisted vocabulary (states, outcomes, stop intents, the
//! workspace kind), the state graph the writes enforce, and the writes and reads over the
//! `attempts` table. Every transition is one compare-and-set statement
//! (`UPDATE ... WHERE attempt_id = ? AND state IN (<allowed predecessors>)`) that reports whether
//! it won, so supervision, the webhook path and recovery can race without two of them both
//! moving an attempt. Moves decided on an observation that could be stale (a conclusion, the
//! step back to `idle`) compare against exactly the state the decision was made in. The JIT
//! configuration is never written here.
//!
//! The agent's lifecycle is not on the webhook hot path, so these writes are synchronous calls on
//! a connection the agent owns ([`Attempts`]), opened with the group writer's pragmas; SQLite
//! serialises the two writers.

mod sql;
mod types;

use std::path::Path;

use rm_vocab::{JobId, RunnerId};
use rusqlite::Connection;

use sql::*;
pub(crate) use sql::{ATTEMPT_COLUMNS, attempt_row};
pub use types::*;

use crate::{JournalError, connection};
use rm_vocab::UnixMs;

/// The agent's handle on the attempt table: its own write connection, opened with the same
/// settings as the group writer (WAL, `synchronous=FULL`, busy timeout), so a call that returns
/// `Ok` is on disk. Not shared between threads: wrap it in a mutex.
pub struct Attempts {
    conn: Connection,
}

impl Attempts {
    /// Opens (creating and migrating if needed) the journal at `path`.
    pub fn open(path: &Path) -> Result<Attempts, JournalError> {
        Ok(Attempts {
            conn: connection::open_writer(path)?,
        })
    }

    /// Journals a new attempt in `allocated`. Call it under the allocation lock, before any
    /// package, GitHub or process effect.
    pub fn create(&self, new: &NewAttempt<'_>) -> Result<AttemptRecord, AttemptError> {
        create(&self.conn, new)
    }

    pub fn get(&self, id: &AttemptId) -> Result<Option<AttemptRecord>, AttemptError> {
        get(&self.conn, id)
    }

    pub fn by_runner_name(&self, runner_name: &str) -> Result<Option<AttemptRecord>, AttemptError> {
        by_runner_name(&self.conn, runner_name)
    }

    /// Attempts in `scope`, of `policy` or of every policy, oldest first.
    pub fn list(
        &self,
        scope: Scope,
        policy: Option<&str>,
    ) -> Result<Vec<AttemptRecord>, AttemptError> {
        list(&self.conn, scope, policy)
    }

    /// The runner uids that attempts neither cleaned nor released hold (allocation picks a free
    /// one).
    pub fn held_uids(&self) -> Result<Vec<u32>, AttemptError> {
        held_uids(&self.conn)
    }

    /// Live attempts per policy and host-wide.
    pub fn live_counts(&self) -> Result<LiveCounts, AttemptError> {
        live_counts(&self.conn)
    }

    /// `allocated → jit_received` with the runner id. `Ok(false)`: it was no longer allocated.
    pub fn jit_received(
        &self,
        id: &AttemptId,
        runner_id: RunnerId,
        at_ms: UnixMs,
    ) -> Result<bool, AttemptError> {
        jit_received(&self.conn, id, runner_id, at_ms)
    }

    /// `jit_received → starting` with the process identity.
    pub fn started(
        &self,
        id: &AttemptId,
        pid: u32,
        pid_start_time: u64,
        at_ms: UnixMs,
    ) -> Result<bool, AttemptError> {
        started(&self.conn, id, pid, pid_start_time, None, at_ms)
    }

    /// [`Attempts::started`] with the boot the identity belongs to.
    pub fn started_on_boot(
        &self,
        id: &AttemptId,
        pid: u32,
        pid_start_time: u64,
        boot_id: &str,
        at_ms: UnixMs,
    ) -> Result<bool, AttemptError> {
        started(&self.conn, id, pid, pid_start_time, Some(boot_id), at_ms)
    }

    /// `from → idle`, `from` being `starting` or `busy`: the state the observation was made in.
    pub fn mark_idle(
        &self,
        id: &AttemptId,
        from: AttemptState,
        at_ms: UnixMs,
    ) -> Result<bool, AttemptError> {
        mark_idle(&self.conn, id, from, at_ms)
    }

    /// `starting | idle → busy`, with the job when known.
    pub fn mark_busy(
        &self,
        id: &AttemptId,
        job_id: Option<JobId>,
        at_ms: UnixMs,
    ) -> Result<bool, AttemptError> {
        mark_busy(&self.conn, id, job_id, at_ms)
    }

    /// Records GitHub's runner id learned after the fact (an attempt whose JIT response was lost
    /// to a crash, found in GitHub's inventory). `Ok(true)` when recorded now.
    pub fn record_runner_id(
        &self,
        id: &AttemptId,
        runner_id: RunnerId,
        at_ms: UnixMs,
    ) -> Result<bool, AttemptError> {
        record_once(&self.conn, id, "runner_id", runner_id.get(), at_ms)
    }

    /// Records the job a runner took (an `in_progress` delivery naming it). `Ok(true)` when
    /// recorded now.
    pub fn record_job(
        &self,
        id: &AttemptId,
        job_id: JobId,
        at_ms: UnixMs,
    ) -> Result<bool, AttemptError> {
        record_once(&self.conn, id, "job_id", job_id.get(), at_ms)
    }

    /// Journals why the process is about to be stopped. Signal only after `Ok(true)`.
    pub fn record_stop_intent(
        &self,
        id: &AttemptId,
        intent: StopIntent,
        at_ms: UnixMs,
    ) -> Result<bool, AttemptError> {
        record_stop_intent(&self.conn, id, intent, at_ms)
    }

    /// Moves an attempt still in `from` to `outcome`'s terminal state with its reason and detail.
    pub fn conclude(
        &self,
        id: &AttemptId,
        from: AttemptState,
        outcome: AttemptOutcome,
        reason: Option<&str>,
        detail: Option<&str>,
        at_ms: UnixMs,
    ) -> Result<bool, AttemptError> {
        conclude(&self.conn, id, from, outcome, reason, detail, at_ms)
    }

    // ---- re-runs (`crate::reruns`): on this connection, so a decision and its sending are
    // durable before the request leaves ----

    /// Journals the decision to re-run a job, `intended`. `Ok(false)`: the job has a row already.
    pub fn intend_rerun(
        &self,
        new: &crate::NewRerun<'_>,
        at_ms: UnixMs,
    ) -> Result<bool, AttemptError> {
        crate::reruns::intend(&self.conn, new, at_ms)
    }

    /// Moves a job's re-run from `from` to `to`, compare-and-set; `Ok(true)` when this call won.
    pub fn advance_rerun(
        &self,
        job_id: JobId,
        from: crate::RerunState,
        to: crate::RerunState,
        detail: Option<&str>,
        at_ms: UnixMs,
    ) -> Result<bool, AttemptError> {
        crate::reruns::advance(&self.conn, job_id, from, to, detail, at_ms)
    }

    /// At start: every re-run left `sending` becomes `unknown`; returns those jobs.
    pub fn settle_interrupted_reruns(&self, at_ms: UnixMs) -> Result<Vec<JobId>, AttemptError> {
        crate::reruns::settle_interrupted(&self.conn, at_ms)
    }

    /// The re-runs decided and not sent yet, oldest first.
    pub fn intended_reruns(&self) -> Result<Vec<crate::RerunRecord>, AttemptError> {
        crate::reruns::intended(&self.conn)
    }

    /// The job's re-run, if it has one.
    pub fn rerun_for_job(&self, job_id: JobId) -> Result<Option<crate::RerunRecord>, AttemptError> {
        Ok(crate::reruns::for_job(&self.conn, job_id)?)
    }

    /// Records that a concluded attempt's processes are gone and its runtime removed: its uid is
    /// free from now on, whatever its registration still waits for. `Ok(true)` the first time.
    pub fn mark_released(&self, id: &AttemptId, at_ms: UnixMs) -> Result<bool, AttemptError> {
        mark_released(&self.conn, id, at_ms)
    }

    /// `finished | failed | orphaned → cleaned`.
    pub fn mark_cleaned(&self, id: &AttemptId, at_ms: UnixMs) -> Result<bool, AttemptError> {
        mark_cleaned(&self.conn, id, at_ms)
    }

    /// Keeps `record` (JSON, `rm_egress::record::Record`) as what the attempt's runner asked
    /// for and reached, replacing what was kept.
    pub fn write_egress(
        &self,
        id: &AttemptId,
        record: &str,
        at_ms: UnixMs,
    ) -> Result<(), AttemptError> {
        crate::egress::write(&self.conn, id, record, at_ms)
    }

    /// What was kept of the attempt's egress (JSON), if anything.
    pub fn egress(&self, id: &AttemptId) -> Result<Option<String>, AttemptError> {
        crate::egress::of_attempt(&self.conn, id)
    }

    // ---- shapes, device holds and usage (`crate::shapes`, schema v15) ----

    /// Every device held on this host and the attempt holding it, by device id. A hold is
    /// written with its attempt ([`Attempts::create`]) and freed when the attempt is released
    /// or cleaned, whichever comes first.
    pub fn held_devices(&self) -> Result<Vec<(String, AttemptId)>, AttemptError> {
        Ok(crate::shapes::held_devices(&self.conn)?)
    }

    /// The shapes of the attempts neither cleaned nor released (they occupy the host: their
    /// processes may still run), oldest first; attempts without a shape are left out. What
    /// packing starts from after a restart.
    pub fn live_shapes(&self) -> Result<Vec<(AttemptId, crate::AttemptShape)>, AttemptError> {
        Ok(crate::shapes::live_shapes(&self.conn)?)
    }

    /// Records what the attempt's runner used (`memory.peak` bytes, `cpu.stat` `usage_usec`),
    /// once, at its end `at_ms`. `Ok(true)` when recorded now; `Ok(false)` when it was recorded
    /// already or the attempt is cleaned.
    pub fn record_usage(
        &self,
        id: &AttemptId,
        peak_memory: Option<u64>,
        cpu_usec: Option<u64>,
        at_ms: UnixMs,
    ) -> Result<bool, AttemptError> {
        crate::shapes::record_usage(&self.conn, id, peak_memory, cpu_usec, at_ms)
    }

    /// The attempts of `policy` created at or after `since` that recorded usage, oldest first:
    /// what each asked for against what it used.
    pub fn shape_usage(
        &self,
        policy: &str,
        since: UnixMs,
    ) -> Result<Vec<crate::ShapeUsage>, AttemptError> {
        Ok(crate::shapes::shape_usage(&self.conn, policy, since)?)
    }
}
