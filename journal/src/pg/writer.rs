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

use std::str::FromStr;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::{Client, Config, NoTls};
use rm_handlers::Verdict;
use tokio::sync::oneshot;

use super::apply::{ApplyError, Sql, StatementCache, apply_verdict};
use super::schema;
use crate::metrics::JournalMetrics;
use crate::writer::{Stored, prepare};
use crate::{Incoming, JournalError, Outcome, Recorded};

/// The most deliveries one transaction takes (as SQLite's writer).
const MAX_BATCH: usize = 1024;

/// How many times a group is tried before its callers are answered with the error: a deadlock
/// between writers or a lost connection usually passes on the next try.
const MAX_TRIES: usize = 3;

/// How long a (re)connection may take before the group fails: a receiver answers 503 rather
/// than holding GitHub's request past its 10 s timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What the server is told this connection is (`pg_stat_activity`).
const APPLICATION_NAME: &str = "rm-journal";

type Reply = oneshot::Sender<Result<Recorded, JournalError>>;

#[expect(
    clippy::large_enum_variant,
    reason = "nearly every request is a Record; boxing it would add an allocation per delivery"
)]
enum Request {
    Record {
        incoming: Incoming,
        verdict: Verdict,
        stored: Stored,
        reply: Reply,
    },
    Probe(oneshot::Sender<Result<(), JournalError>>),
}

/// A cheap, cloneable handle to one PostgreSQL writer (one connection).
#[derive(Clone)]
pub struct PgJournal {
    tx: mpsc::Sender<Request>,
    metrics: JournalMetrics,
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
        let config = config(url)?;
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready) = mpsc::channel();
        let metrics = JournalMetrics::default();
        let writer_metrics = metrics.clone();
        thread::Builder::new()
            .name("rm-pg-journal-writer".to_owned())
            .spawn(move || {
                let connected = config
                    .connect(NoTls)
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
        Ok(PgJournal { tx, metrics })
    }

    /// The writer's metrics (commits, group sizes), as SQLite's.
    pub fn metrics(&self) -> &JournalMetrics {
        &self.metrics
    }

    /// Records a delivery (see [`crate::Journal::record`]): the handler runs on the caller's
    /// thread; the answer comes after the COMMIT that holds it.
    pub async fn record(&self, incoming: Incoming) -> Result<Recorded, JournalError> {
        let (verdict, stored) = prepare(&incoming)?;
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Request::Record {
                incoming,
                verdict,
                stored,
                reply,
            })
            .map_err(|_| JournalError::WriterStopped)?;
        answer.await.map_err(|_| JournalError::WriterStopped)?
    }

    /// Succeeds when the writer is alive and its database answers a transaction.
    pub async fn probe(&self) -> Result<(), JournalError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Request::Probe(reply))
            .map_err(|_| JournalError::WriterStopped)?;
        answer.await.map_err(|_| JournalError::WriterStopped)?
    }
}

impl crate::Intake for PgJournal {
    fn record(
        &self,
        incoming: Incoming,
    ) -> impl Future<Output = Result<Recorded, JournalError>> + Send {
        PgJournal::record(self, incoming)
    }

    fn probe(&self) -> impl Future<Output = Result<(), JournalError>> + Send {
        PgJournal::probe(self)
    }
}

/// The connection settings from `url`, with rm's defaults where it says nothing.
pub(crate) fn config(url: &str) -> Result<Config, JournalError> {
    let mut config = Config::from_str(url)?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name(APPLICATION_NAME);
    }
    Ok(config)
}

struct Writer {
    config: Config,
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
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(request) => batch.push(request),
                    Err(_) => break,
                }
            }
            self.commit(batch);
        }
        tracing::debug!("PostgreSQL journal writer stopped");
    }

    /// Commits one batch (retrying what may pass) and answers every caller.
    fn commit(&mut self, batch: Vec<Request>) {
        let started = Instant::now();
        let mut tries = 0;
        let result = loop {
            tries += 1;
            match self.write(&batch) {
                Ok(answers) => break Ok(answers),
                Err(err) if tries < MAX_TRIES && may_pass(&err) => {
                    tracing::debug!(error = %err, tries, "PostgreSQL journal group retried");
                }
                Err(err) => break Err(err),
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
                tracing::error!(error = %err, deliveries = batch.len(), "PostgreSQL journal commit failed");
                let message = err.to_string();
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
    fn write(&mut self, batch: &[Request]) -> Result<Vec<Answer>, postgres::Error> {
        let client = match &mut self.client {
            Some(client) if !client.is_closed() => client,
            _ => {
                self.cache.clear();
                self.client = None;
                self.client.insert(self.config.connect(NoTls)?)
            }
        };
        let result = write_batch(client, &mut self.cache, batch);
        if result
            .as_ref()
            .is_err_and(|err| err.is_closed() || err.code().is_none())
        {
            // The connection's state is unknown: the next try starts on a new one.
            self.client = None;
        }
        result
    }
}

fn write_batch(
    client: &mut Client,
    cache: &mut StatementCache,
    batch: &[Request],
) -> Result<Vec<Answer>, postgres::Error> {
    let mut tx = client.transaction()?;
    let mut answers = vec![Recorded::AlreadyJournalled; batch.len()];
    // GUIDs are taken in one order by every writer, so two writers holding the same
    // redelivered GUIDs never wait on each other in a cycle.
    let mut order: Vec<usize> = (0..batch.len()).collect();
    order.sort_by(|&a, &b| guid_of(&batch[a]).cmp(guid_of(&batch[b])));
    let mut sql = Sql { tx: &mut tx, cache };
    let mut probed = false;
    for index in order {
        match &batch[index] {
            Request::Record {
                incoming,
                verdict,
                stored,
                ..
            } => answers[index] = record_one(&mut sql, incoming, verdict, stored)?,
            Request::Probe(_) if !probed => {
                sql.execute("SELECT 1", &[])?;
                probed = true;
            }
            Request::Probe(_) => {}
        }
    }
    tx.commit()?;
    Ok(answers)
}

fn guid_of(request: &Request) -> &str {
    match request {
        Request::Record { incoming, .. } => &incoming.guid,
        Request::Probe(_) => "",
    }
}

/// Records one delivery inside the group's transaction: its row first (the GUID's claim, once
/// fleet-wide), then its verdict in a savepoint, then its outcome on the row. A GUID already
/// journalled (by any writer, or earlier in this group) is answered as such and changes nothing.
fn record_one(
    sql: &mut Sql<'_, '_>,
    incoming: &Incoming,
    verdict: &Verdict,
    stored: &Stored,
) -> Result<Recorded, postgres::Error> {
    let inserted = sql.query_opt(
        "INSERT INTO deliveries (guid, event, action, source, received_at, headers, body,
             outcome)
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'rejected')
         ON CONFLICT (guid) DO NOTHING
         RETURNING id",
        &[
            &incoming.guid,
            &incoming.event,
            &verdict.action(),
            &incoming.source.as_str(),
            &incoming.received_at_ms,
            &stored.headers,
            &stored.body,
        ],
    )?;
    let Some(row) = inserted else {
        return Ok(Recorded::AlreadyJournalled);
    };
    let id: i64 = row.get(0);
    // As in SQLite: changes that cannot be applied are undone and the delivery is still
    // journalled, as rejected with the reason, to be replayed.
    sql.tx.batch_execute("SAVEPOINT delivery")?;
    let (outcome, reason) = match apply_verdict(sql, verdict, incoming.received_at_ms) {
        Ok(applied) => {
            sql.tx.batch_execute("RELEASE delivery")?;
            (applied.outcome, applied.reason)
        }
        Err(ApplyError::Postgres(err)) if !is_data_error(&err) => return Err(err),
        Err(err) => {
            sql.tx
                .batch_execute("ROLLBACK TO delivery; RELEASE delivery")?;
            (
                Outcome::Rejected,
                Some(format!("the journal could not apply this delivery: {err}")),
            )
        }
    };
    sql.execute(
        "UPDATE deliveries SET outcome = $2, reason = $3 WHERE id = $1",
        &[&id, &outcome.as_str(), &reason],
    )?;
    Ok(Recorded::New(outcome))
}

/// An error about this delivery's data (a value or a constraint), which a replay after a fix
/// may get past: journalled as rejected. Anything else fails the group.
fn is_data_error(err: &postgres::Error) -> bool {
    err.code()
        .is_some_and(|code| code.code().starts_with("22") || code.code().starts_with("23"))
}

/// Whether trying the group again may succeed: a deadlock or serialization failure between
/// writers, a lost connection, a server shutting down or restarting.
fn may_pass(err: &postgres::Error) -> bool {
    match err.code() {
        None => true,
        Some(code) => {
            *code == SqlState::T_R_DEADLOCK_DETECTED
                || *code == SqlState::T_R_SERIALIZATION_FAILURE
                || code.code().starts_with("08")
                || code.code().starts_with("57P")
        }
    }
}
