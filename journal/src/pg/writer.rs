//! The PostgreSQL journal's group-commit writer: one thread owns one connection, takes every
//! request that queued up while the previous commit was in flight, records them in one
//! transaction and answers each caller only after COMMIT returned (PostgreSQL's synchronous
//! commit: the WAL is flushed). Any number of these writers (one per receiver, on any host) may
//! record into one database: a GUID is applied once because its row is inserted first with
//! `ON CONFLICT (guid) DO NOTHING`, which waits for a concurrent insert of the same GUID to
//! commit or abort before deciding.
//!
//! A group that fails for a reason that may pass (a deadlock between two writers, a lost
//! connection) is retried whole on a fresh transaction: nothing of it was committed, and a
//! commit whose answer was lost is found again by its GUIDs and answered as already journalled.

use std::collections::HashMap;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::{Client, Config};

use super::tls::PgConnect;
use rm_handlers::Verdict;

use super::apply::{ApplyError, Sql, StatementCache, apply_verdict};
use super::schema;
use crate::judged::{Judged, Stored};
use crate::metrics::JournalMetrics;
use crate::queue::{self, Queue, Request};
use crate::{Incoming, JournalError, Outcome, Recorded};

/// How many times a group is tried before its callers are answered with the error: a deadlock
/// between writers or a lost connection usually passes on the next try.
const MAX_TRIES: usize = 3;

/// How long a (re)connection may take before the group fails: a receiver answers 503 rather
/// than holding GitHub's request past its 10 s timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What the server is told a writer's connection is (`pg_stat_activity`).
pub(crate) const WRITER_APPLICATION: &str = "rm-journal-writer";

/// A cheap, cloneable handle to one PostgreSQL writer (one connection).
#[derive(Clone)]
pub struct PgJournal {
    queue: Queue,
    metrics: JournalMetrics,
    /// The writer's settings, named as a reader: for [`PgJournal::reader`].
    reads: PgConnect,
}

impl PgJournal {
    /// Connects to `url` (a libpq connection string or `postgresql://` URL), migrates the
    /// database to this build's schema, and starts the writer thread. The thread stops when the
    /// last handle is dropped, after answering everything queued.
    ///
    /// Blocks until connected and migrated. The connection is made on the writer thread (the
    /// sync client runs a runtime of its own, which cannot start inside the caller's), so this
    /// may be called from async code, as [`crate::Journal::open`] is.
    pub fn connect(url: &str) -> Result<PgJournal, JournalError> {
        Self::start(config(url, WRITER_APPLICATION)?)
    }

    /// As [`PgJournal::connect`], to a configured target (the agent's `[journal] url` and the
    /// password from its environment).
    pub fn open(target: &super::PgTarget) -> Result<PgJournal, JournalError> {
        Self::start(target.client_config(WRITER_APPLICATION))
    }

    fn start(config: PgConnect) -> Result<PgJournal, JournalError> {
        let mut reads = config.clone();
        reads
            .config
            .application_name(super::read::READER_APPLICATION);
        let (queue, rx) = Queue::new();
        let (ready_tx, ready) = mpsc::channel();
        let metrics = JournalMetrics::default();
        let writer_metrics = metrics.clone();
        thread::Builder::new()
            .name("rm-pg-journal-writer".to_owned())
            .spawn(move || {
                let connected = config
                    .connect()
                    .map_err(JournalError::from)
                    .and_then(|mut client| schema::migrate(&mut client).map(|()| client));
                let client = match connected {
                    Ok(client) => client,
                    Err(err) => {
                        let _ = ready_tx.send(Err(err));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                let writer = Writer {
                    config,
                    client: Some(client),
                    cache: StatementCache::default(),
                    metrics: writer_metrics,
                };
                writer.run(rx);
            })
            .map_err(|e| JournalError::Commit(format!("cannot start the writer thread: {e}")))?;
        ready.recv().map_err(|_| JournalError::WriterStopped)??;
        Ok(PgJournal {
            queue,
            metrics,
            reads,
        })
    }

    /// A new read connection to the same database, as the same role (blocking: call it off
    /// the async runtime). `/metrics` reads the job counts through one.
    pub fn reader(&self) -> Result<super::PgReader, JournalError> {
        super::PgReader::start(&self.reads)
    }

    /// Jobs by state, read on a connection of its own (blocking: call it off the async
    /// runtime): what `/metrics` shows.
    pub fn job_counts(&self) -> Result<Vec<(String, i64)>, JournalError> {
        self.reader()?.job_counts()
    }

    /// The writer's metrics (commits, group sizes), as SQLite's.
    pub fn metrics(&self) -> &JournalMetrics {
        &self.metrics
    }

    /// Records a judged delivery (see [`crate::Journal::record_judged`]): the answer comes
    /// after the COMMIT that holds it.
    pub async fn record_judged(&self, judged: Judged) -> Result<Recorded, JournalError> {
        self.queue.record(judged).await
    }

    /// Judges `incoming` on the caller's thread and records it (see [`crate::Journal::record`]).
    pub async fn record(&self, incoming: Incoming) -> Result<Recorded, JournalError> {
        self.record_judged(Judged::of(incoming)?).await
    }

    /// Succeeds when the writer is alive and its database answers a transaction.
    pub async fn probe(&self) -> Result<(), JournalError> {
        self.queue.probe().await
    }
}

impl crate::Intake for PgJournal {
    fn record_judged(
        &self,
        judged: Judged,
    ) -> impl Future<Output = Result<Recorded, JournalError>> + Send {
        PgJournal::record_judged(self, judged)
    }

    fn probe(&self) -> impl Future<Output = Result<(), JournalError>> + Send {
        PgJournal::probe(self)
    }
}

/// The connection settings from `url`, with rm's defaults where it says nothing; `application`
/// names the connection to the server.
pub(crate) fn config(url: &str, application: &str) -> Result<PgConnect, JournalError> {
    let (config, _, tls) = super::target::parse_unchecked(url)?;
    Ok(PgConnect {
        config: with_defaults(config, application),
        tls,
    })
}

/// `config` with rm's defaults where it says nothing; `application` names the connection.
pub(crate) fn with_defaults(mut config: Config, application: &str) -> Config {
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name(application);
    }
    config
}

struct Writer {
    config: PgConnect,
    /// `None` after the connection was lost; the next group connects again.
    client: Option<Client>,
    /// The statements prepared on `client`.
    cache: StatementCache,
    metrics: JournalMetrics,
}

/// A request's answer before the commit (a probe's is a placeholder).
type Answer = Recorded;

impl Writer {
    fn run(mut self, rx: mpsc::Receiver<Request>) {
        while let Ok(first) = rx.recv() {
            self.commit(queue::group(first, &rx));
        }
        tracing::debug!("PostgreSQL journal writer stopped");
    }

    /// Commits one batch (retrying what may pass) and answers every caller.
    fn commit(&mut self, batch: Vec<Request>) {
        let started = Instant::now();
        let mut tries = 0;
        let mut unappliable = HashMap::new();
        let result = loop {
            match self.write(&batch, &unappliable) {
                Ok(answers) => break Ok(answers),
                // Tried again without applying it: at most once per delivery of the group.
                Err(TryError::Apply { index, reason }) => {
                    unappliable.insert(index, reason);
                }
                Err(TryError::Postgres(err)) => {
                    tries += 1;
                    if tries >= MAX_TRIES || !may_pass(&err) {
                        break Err(err);
                    }
                    tracing::debug!(error = %super::describe(&err), tries, "PostgreSQL journal group retried");
                }
            }
        };
        self.metrics
            .observe_commit(started.elapsed(), batch.len(), result.is_ok());
        match result {
            Ok(answers) => {
                for (request, answer) in batch.into_iter().zip(answers) {
                    match request {
                        Request::Record { reply, .. } => {
                            let _ = reply.send(Ok(answer));
                        }
                        Request::Probe(reply) => {
                            let _ = reply.send(Ok(()));
                        }
                    }
                }
            }
            Err(err) => {
                let message = super::describe(&err);
                tracing::error!(error = %message, deliveries = batch.len(), "PostgreSQL journal commit failed");
                for request in batch {
                    match request {
                        Request::Record { reply, .. } => {
                            let _ = reply.send(Err(JournalError::Commit(message.clone())));
                        }
                        Request::Probe(reply) => {
                            let _ = reply.send(Err(JournalError::Commit(message.clone())));
                        }
                    }
                }
            }
        }
    }

    /// One try at writing the batch in one transaction; one answer per request, in order.
    fn write(
        &mut self,
        batch: &[Request],
        unappliable: &HashMap<usize, String>,
    ) -> Result<Vec<Answer>, TryError> {
        let client = match &mut self.client {
            Some(client) if !client.is_closed() => client,
            _ => {
                self.cache.clear();
                self.client = None;
                self.client.insert(self.config.connect()?)
            }
        };
        let result = write_batch(client, &mut self.cache, batch, unappliable);
        if let Err(TryError::Postgres(err)) = &result
            && connection_lost(err)
        {
            // The connection's state is unknown: the next try starts on a new one.
            self.client = None;
        }
        result
    }
}

/// Why one try at a group failed.
#[derive(Debug)]
enum TryError {
    Postgres(postgres::Error),
    /// The verdict of the delivery at this index could not be applied (a data error, which
    /// aborts the transaction): the group is tried again with it journalled as rejected.
    Apply {
        index: usize,
        reason: String,
    },
}

impl From<postgres::Error> for TryError {
    fn from(err: postgres::Error) -> Self {
        TryError::Postgres(err)
    }
}

/// A delivery of the group: its index, what came in, the verdict, the stored columns.
type Record<'a> = (usize, &'a Incoming, &'a Verdict, &'a Stored);

/// One try at a group, in two phases whose locks every writer takes in one order, so writers
/// never wait on each other in a cycle: first every delivery row (one statement, GUIDs in
/// order: a GUID another writer holds waits for its commit, then is answered as journalled),
/// then the new deliveries' verdicts ordered by the job they touch (each job row locked in
/// job order). `unappliable` holds the deliveries (by index) a previous try could not apply:
/// they are journalled as rejected with the reason, to be replayed, as SQLite does.
fn write_batch(
    client: &mut Client,
    cache: &mut StatementCache,
    batch: &[Request],
    unappliable: &HashMap<usize, String>,
) -> Result<Vec<Answer>, TryError> {
    let mut tx = client.transaction()?;
    let mut answers = vec![Recorded::AlreadyJournalled; batch.len()];
    let mut sql = Sql { tx: &mut tx, cache };
    let records: Vec<Record<'_>> = batch
        .iter()
        .enumerate()
        .filter_map(|(index, request)| match request {
            Request::Record {
                incoming,
                verdict,
                stored,
                ..
            } => Some((index, incoming, verdict, stored)),
            Request::Probe(_) => None,
        })
        .collect();
    if records.len() < batch.len() {
        // A probe: the transaction must reach the server.
        sql.execute("SELECT 1", &[])?;
    }
    let ids = insert_deliveries(&mut sql, &records)?;
    // The new deliveries: the first request of each GUID this group inserted.
    let mut new: Vec<(usize, i64, &Incoming, &Verdict)> = Vec::new();
    let mut claimed = std::collections::HashSet::new();
    for &(index, incoming, verdict, _) in &records {
        if let Some(&id) = ids.get(incoming.guid.as_str())
            && claimed.insert(id)
        {
            new.push((index, id, incoming, verdict));
        }
    }
    // Stable: one job's deliveries keep their arrival order.
    new.sort_by_key(|(_, _, _, verdict)| first_job(verdict));
    let mut outcomes: Vec<(i64, &'static str, Option<String>)> = Vec::with_capacity(new.len());
    for (index, id, incoming, verdict) in new {
        let (outcome, reason) = match unappliable.get(&index) {
            Some(reason) => (Outcome::Rejected, Some(reason.clone())),
            None => match apply_verdict(&mut sql, verdict, incoming.received_at_ms) {
                Ok(applied) => (applied.outcome, applied.reason),
                Err(ApplyError::Postgres(err)) if !is_data_error(&err) => return Err(err.into()),
                Err(err) => {
                    return Err(TryError::Apply {
                        index,
                        reason: format!("the journal could not apply this delivery: {err}"),
                    });
                }
            },
        };
        answers[index] = Recorded::New(outcome);
        outcomes.push((id, outcome.as_str(), reason));
    }
    set_outcomes(&mut sql, &outcomes)?;
    tx.commit()?;
    Ok(answers)
}

/// The job a verdict touches first (its lock order); verdicts without one go first.
fn first_job(verdict: &Verdict) -> i64 {
    match verdict {
        Verdict::Apply { changes, .. } => changes
            .iter()
            .find_map(|change| match change {
                rm_handlers::Change::Job(job) => Some(job.job_id.get()),
                _ => None,
            })
            .unwrap_or(i64::MIN),
        _ => i64::MIN,
    }
}

/// Inserts every delivery row of the group in one statement, GUIDs in order, each once; a GUID
/// already journalled (by any writer, or earlier in the group) is skipped. Returns the id of
/// each GUID inserted.
fn insert_deliveries<'r>(
    sql: &mut Sql<'_, '_>,
    records: &[Record<'r>],
) -> Result<HashMap<&'r str, i64>, postgres::Error> {
    if records.is_empty() {
        return Ok(HashMap::new());
    }
    let mut sorted: Vec<&Record<'r>> = records.iter().collect();
    sorted.sort_by(|a, b| a.1.guid.cmp(&b.1.guid));
    let guids: Vec<&str> = sorted.iter().map(|r| r.1.guid.as_str()).collect();
    let events: Vec<&str> = sorted.iter().map(|r| r.1.event.as_str()).collect();
    let actions: Vec<Option<&str>> = sorted.iter().map(|r| r.2.action()).collect();
    let sources: Vec<&str> = sorted.iter().map(|r| r.1.source.as_str()).collect();
    let received: Vec<i64> = sorted.iter().map(|r| r.1.received_at_ms.get()).collect();
    let headers: Vec<&str> = sorted.iter().map(|r| r.3.headers.as_str()).collect();
    let bodies: Vec<&[u8]> = sorted.iter().map(|r| r.3.body.as_slice()).collect();
    let rows = sql.query(
        "INSERT INTO deliveries (guid, event, action, source, received_at, headers, body,
             outcome)
         SELECT guid, event, action, source, received_at, headers, body, 'rejected'
         FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[],
             $7::bytea[]) WITH ORDINALITY
             AS d (guid, event, action, source, received_at, headers, body, n)
         ORDER BY n
         ON CONFLICT (guid) DO NOTHING
         RETURNING guid, id",
        &[
            &guids, &events, &actions, &sources, &received, &headers, &bodies,
        ],
    )?;
    let by_guid: HashMap<&str, &'r str> = records
        .iter()
        .map(|r| (r.1.guid.as_str(), r.1.guid.as_str()))
        .collect();
    let mut ids = HashMap::with_capacity(rows.len());
    for row in &rows {
        let guid: &str = row.get(0);
        if let Some(&guid) = by_guid.get(guid) {
            ids.insert(guid, row.get(1));
        }
    }
    Ok(ids)
}

/// Writes the new deliveries' outcomes in one statement.
fn set_outcomes(
    sql: &mut Sql<'_, '_>,
    outcomes: &[(i64, &'static str, Option<String>)],
) -> Result<(), postgres::Error> {
    if outcomes.is_empty() {
        return Ok(());
    }
    let ids: Vec<i64> = outcomes.iter().map(|o| o.0).collect();
    let names: Vec<&str> = outcomes.iter().map(|o| o.1).collect();
    let reasons: Vec<Option<&str>> = outcomes.iter().map(|o| o.2.as_deref()).collect();
    sql.execute(
        "UPDATE deliveries SET outcome = u.outcome, reason = u.reason
         FROM UNNEST($1::bigint[], $2::text[], $3::text[]) AS u (id, outcome, reason)
         WHERE deliveries.id = u.id",
        &[&ids, &names, &reasons],
    )?;
    Ok(())
}

/// An error about this delivery's data (a value or a constraint), which a replay after a fix
/// may get past: journalled as rejected. Anything else fails the group.
fn is_data_error(err: &postgres::Error) -> bool {
    err.code()
        .is_some_and(|code| code.code().starts_with("22") || code.code().starts_with("23"))
}

/// Whether the connection is gone or in doubt: closed, an I/O error, a connection exception
/// (class 08) or the server ending it (57P: shutdown, restart, terminated by an administrator).
fn connection_lost(err: &postgres::Error) -> bool {
    err.is_closed()
        || err
            .code()
            .is_none_or(|code| code.code().starts_with("08") || code.code().starts_with("57P"))
}

/// Whether trying the group again may succeed: a deadlock or serialization failure between
/// writers, a lost connection, a server shutting down or restarting.
fn may_pass(err: &postgres::Error) -> bool {
    connection_lost(err)
        || err.code().is_some_and(|code| {
            *code == SqlState::T_R_DEADLOCK_DETECTED || *code == SqlState::T_R_SERIALIZATION_FAILURE
        })
}
