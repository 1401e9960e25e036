//! The listener task of one scale set: finds or creates the scale set, holds its message
//! session (journalled as soon as it exists, so a successor after a crash deletes it by id),
//! long-polls the queue, and for each message: acquires its `JobAvailable` jobs where the
//! service wants that (GHES), journals it, tells the executor, and only then acknowledges it.
//! A message that cannot be journalled is not acknowledged (it comes again); an event inside
//! one that cannot be handled is journalled as such and never blocks the queue.
//!
//! Each poll sends the capacity the allocation pass last published ([`super::capacity`]; 0
//! before its first pass: recovery is incomplete and the host takes nothing). A poll held while
//! the capacity changes is cut short and sent again with the new one, no sooner than
//! [`CAPACITY_RECUT_AFTER`] after it began, so the service learns of freed (or lost) room
//! within about a second instead of at the end of its ~50 s hold.
//!
//! The rules of the protocol (sessions, eviction, back-off, standby) are
//! `rm_github::scaleset::listener`'s; this task only adds the journal, the agent and the
//! operator's notification: a back-off after an answer the listener does not know, or after
//! [`NOTIFY_AFTER_FAILURES`] failures in a row, is told once per streak ([`tell_backoff`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rm_github::scaleset::listener::{Activity, Listener};
use rm_github::scaleset::{JobMessage, Message, MessageBody, ScaleSetError, Statistics};
use rm_journal::{IncomingMessage, JobEvent, MessageRecorded, ScaleSetStatistics, ScaleSets};
use tokio::sync::watch;

use super::{Board, Source};
use crate::notify::{Notifier, OperatorEvent};

/// How long the task waits after an error that waiting does not fix (a refused credential, a
/// 403) before it tries again from the start: an operator may fix it meanwhile.
pub const GIVE_UP_RETRY: Duration = Duration::from_secs(300);

/// How long the task waits before trying a journal write again that failed (a full disk):
/// the message is not acknowledged meanwhile, so nothing is lost.
pub const JOURNAL_RETRY: Duration = Duration::from_secs(5);

/// How long the task waits after failing to find or create the scale set.
pub const SETUP_RETRY: Duration = Duration::from_secs(30);

/// How long a poll is held at least before a capacity change cuts it short (to be sent again
/// with the new capacity): a capacity that changes at every allocation pass costs at most one
/// poll a second, never a loop of them.
pub const CAPACITY_RECUT_AFTER: Duration = Duration::from_secs(1);

/// Failures in a row after which a back-off is told the operator even when each one passes by
/// itself (a 5xx, no answer): with the listener's doubling back-off from 1 s, about half a
/// minute without the service, long enough not to be a blip.
pub const NOTIFY_AFTER_FAILURES: u32 = 5;

/// Whether a back-off that begins after `failures` failures in a row is told the operator: not
/// if this streak was told already (`told`; a streak ends at the next answered poll), else when
/// the last answer is one the listener does not know (`unrecognised`, the listener's own
/// judgement, `Outcome::Unrecognised`), or after [`NOTIFY_AFTER_FAILURES`]. Pure.
pub fn tell_backoff(told: bool, failures: u32, unrecognised: bool) -> bool {
    !told && (failures >= NOTIFY_AFTER_FAILURES || unrecognised)
}

/// The journal's scale-set record, one write connection for the task's life (not one per
/// message); used off the async workers ([`blocking`]), or, from the listener's hooks, for one
/// short write in place.
type Journal = Arc<Mutex<ScaleSets>>;

fn lock(journal: &Journal) -> MutexGuard<'_, ScaleSets> {
    journal.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Opens the journal's scale-set record off the async workers.
async fn open(path: &Path) -> Result<Journal, rm_journal::JournalError> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || ScaleSets::open(&path))
        .await
        .unwrap_or_else(|e| {
            Err(rm_journal::JournalError::Commit(format!(
                "the journal task failed: {e}"
            )))
        })
        .map(|j| Arc::new(Mutex::new(j)))
}

/// Runs the listener of `source` until `shutdown` turns true, then closes its session.
pub async fn run(
    source: Arc<Source>,
    board: Arc<Board>,
    journal: PathBuf,
    owner: String,
    notifier: Arc<Notifier>,
    mut shutdown: watch::Receiver<bool>,
) {
    let name = source.set.name.clone();
    // Whether this back-off streak was told the operator: across the listener's lives, so a
    // listener that gives up and starts again does not tell the same trouble twice.
    let told = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Nothing is polled before the journal can take what comes.
    let journal = loop {
        match open(&journal).await {
            Ok(opened) => break opened,
            Err(e) => {
                tracing::error!(scale_set = name, error = %e, "cannot open the journal's scale-set record; trying again");
                if source.update(|seen| seen.activity = format!("cannot open the journal: {e}")) {
                    board.changed();
                }
                tokio::select! {
                    _ = tokio::time::sleep(SETUP_RETRY) => {}
                    _ = shutdown.changed() => return,
                }
            }
        }
    };
    loop {
        if *shutdown.borrow() {
            return;
        }
        // `serve` watches `shutdown` itself, to close its session first.
        let outcome = serve(
            &source,
            &board,
            &journal,
            &owner,
            (&notifier, &told),
            &mut shutdown,
        )
        .await;
        let wait = match outcome {
            Served::Shutdown => return,
            Served::ScaleSetGone => {
                tracing::warn!(
                    scale_set = name,
                    "the scale set was deleted at GitHub; finding or creating it again"
                );
                Duration::ZERO
            }
            Served::SetupFailed(e) => {
                let (text, wait) = after_setup_failure(&e);
                tracing::warn!(scale_set = name, error = %e, wait_s = wait.as_secs(), "cannot find or create the scale set; trying again");
                note(&source, &board, &journal, text).await;
                wait
            }
            Served::GaveUp(e) => {
                tracing::error!(scale_set = name, error = %e, "the scale-set listener was refused; trying again in 5 minutes");
                note(&source, &board, &journal, format!("refused: {e}")).await;
                GIVE_UP_RETRY
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// What `status` is told, and how long to wait, after the scale set could not be found or
/// created: a refusal that waiting does not fix (a refused credential, an enterprise's PAT
/// among them; a 403) is reported as one and tried again after [`GIVE_UP_RETRY`], as a
/// refusal later in the listener's life is; anything else after [`SETUP_RETRY`].
fn after_setup_failure(error: &ScaleSetError) -> (String, Duration) {
    use rm_github::scaleset::listener::Outcome;
    match Outcome::of(error) {
        Outcome::Permanent => (format!("refused: {error}"), GIVE_UP_RETRY),
        _ => (
            format!("cannot find or create the scale set: {error}"),
            SETUP_RETRY,
        ),
    }
}

enum Served {
    Shutdown,
    ScaleSetGone,
    SetupFailed(ScaleSetError),
    GaveUp(ScaleSetError),
}

/// Says what stops the listener, in memory and in the journal (for `status`).
async fn note(source: &Source, board: &Board, journal: &Journal, activity: String) {
    let name = source.set.name.clone();
    let text = activity.clone();
    if let Err(e) = blocking(journal, move |j| {
        j.record_note(&name, Some(&text), rm_vocab::now())
    })
    .await
    {
        tracing::warn!(scale_set = source.set.name, error = %e, "cannot journal the scale set's note");
    }
    if source.update(|seen| seen.activity = activity) {
        board.changed();
    }
}

/// Runs `work` on the journal's scale-set record off the async workers.
async fn blocking<T: Send + 'static>(
    journal: &Journal,
    work: impl FnOnce(&ScaleSets) -> Result<T, rm_journal::JournalError> + Send + 'static,
) -> Result<T, rm_journal::JournalError> {
    let journal = Arc::clone(journal);
    tokio::task::spawn_blocking(move || work(&lock(&journal)))
        .await
        .unwrap_or_else(|e| {
            Err(rm_journal::JournalError::Commit(format!(
                "the journal task failed: {e}"
            )))
        })
}

/// One life of the listener: from finding the scale set to the error that ends it.
async fn serve(
    source: &Arc<Source>,
    board: &Arc<Board>,
    journal: &Journal,
    owner: &str,
    (notifier, told): (&Arc<Notifier>, &Arc<std::sync::atomic::AtomicBool>),
    shutdown: &mut watch::Receiver<bool>,
) -> Served {
    let set = &source.set;
    let name = set.name.clone();
    let known = {
        let name = name.clone();
        blocking(journal, move |j| j.get(&name))
            .await
            .ok()
            .flatten()
    };
    let found = match source
        .client
        .get_scale_set(set.runner_group_id, &set.name)
        .await
    {
        Ok(Some(found)) => found,
        Ok(None) => match source
            .client
            .create_scale_set(set.runner_group_id, &set.name, &set.labels)
            .await
        {
            Ok(created) => {
                tracing::info!(scale_set = name, id = created.id, "scale set created");
                created
            }
            Err(e) => return Served::SetupFailed(e),
        },
        Err(e) => return Served::SetupFailed(e),
    };
    let id = found.id;
    source.set_id(id);
    let journalled_id = known.as_ref().and_then(|k| k.scale_set_id);
    let mut last_message_id = match journalled_id {
        // Another scale set than the one the cursor belongs to (deleted and made again): its
        // queue starts over.
        Some(old) if old != id as i64 => {
            let name = name.clone();
            let at = rm_vocab::now();
            if let Err(e) = blocking(journal, move |j| j.reset_cursor(&name, id as i64, at)).await {
                tracing::warn!(scale_set = set.name, error = %e, "cannot journal the new scale set's id");
            }
            0
        }
        _ => known
            .as_ref()
            .map_or(0, |k| u64::try_from(k.last_message_id).unwrap_or(0)),
    };
    let stale = known.as_ref().and_then(|k| k.session_id.clone());
    let (record, record_name) = (Arc::clone(journal), name.clone());
    // Whether the step `next` is in may be cut short for a capacity change: a poll, with a
    // session held. Set before each call, and by the session's creation within one (what
    // follows it is the poll); never while a session is being made, whose answer a cut would
    // lose (the session left behind is waited out on standby).
    let cuttable = Arc::new(watch::channel(false).0);
    let opened = Arc::clone(&cuttable);
    let listener = Listener::new(Arc::clone(&source.client), id, owner, stale).on_session(
        move |session_id| {
            opened.send_replace(true);
            // Before the session is first polled: a successor deletes it by this id.
            let at = rm_vocab::now();
            let written =
                lock(&record).record_session(&record_name, id as i64, Some(session_id), at);
            if let Err(e) = written {
                tracing::warn!(scale_set = record_name, error = %e, "cannot journal the scale-set session");
            }
        },
    );
    // A wait is journalled as the scale set's note for `status` (another process), and cleared
    // by the next answered poll; a back-off worth it is told the operator, once a streak.
    let noted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let listener = {
        let (record, name, noted) = (Arc::clone(journal), name.clone(), Arc::clone(&noted));
        let (notifier, told) = (Arc::clone(notifier), Arc::clone(told));
        listener.on_wait(move |waiting| {
            if let Activity::BackingOff {
                failures,
                reason,
                unrecognised,
                ..
            } = waiting
                && tell_backoff(
                    told.load(std::sync::atomic::Ordering::Acquire),
                    *failures,
                    *unrecognised,
                )
            {
                told.store(true, std::sync::atomic::Ordering::Release);
                notifier.notify(OperatorEvent::ScaleSetBackingOff {
                    scale_set: name.clone(),
                    reason: reason.clone(),
                });
            }
            let text = activity(waiting);
            let written = lock(&record).record_note(&name, Some(&text), rm_vocab::now());
            match written {
                Ok(()) => noted.store(true, std::sync::atomic::Ordering::Release),
                Err(e) => tracing::warn!(scale_set = name, error = %e, "cannot journal the scale set's note"),
            }
        })
    };
    let mut listener = listener;
    // The runners whose `JobCompleted` an earlier process journalled (and acknowledged: it
    // never comes again): a runner of ours recovered as finished at this start must not be
    // taken for one whose job the statistics still count (`still_assigned`), or it hides a
    // job assigned meanwhile until it is forgotten.
    let journalled_completions: Vec<String> = {
        let name = name.clone();
        blocking(journal, move |j| j.jobs(Some(&name), super::REMEMBERED_COMPLETIONS))
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(scale_set = set.name, error = %e, "cannot read the scale set's journalled jobs");
                Vec::new()
            })
            .into_iter()
            .rev()
            .filter(|row| row.state == rm_journal::ScaleSetJobState::Completed)
            .filter_map(|row| row.runner_name)
            .collect()
    };
    if source.update(|seen| {
        for runner in journalled_completions {
            seen.remember_completed(runner);
        }
        seen.last_message_id = last_message_id;
        seen.activity = "opening a session".to_owned();
    }) {
        board.changed();
    }
    let mut capacities = source.watch_capacity();
    let mut sent = None;
    loop {
        let capacity = capacities.borrow_and_update().unwrap_or(0);
        if sent != Some(capacity) {
            tracing::debug!(scale_set = set.name, capacity, "the scale set's capacity");
            sent = Some(capacity);
        }
        // With a session held and no failure behind, `next` is one poll: cutting it short
        // costs that poll only (a back-off or standby wait cut short would be waited again in
        // full, so those are left alone).
        cuttable.send_replace(listener.session_id().is_some() && listener.state().failures == 0);
        let next = tokio::select! {
            next = listener.next(last_message_id, capacity) => next,
            () = capacity_changed(&mut capacities, capacity, cuttable.subscribe()) => continue,
            _ = shutdown.changed() => {
                close(listener, journal, &name, id).await;
                return Served::Shutdown;
            }
        };
        let session_statistics = listener.session().and_then(|s| s.statistics.clone());
        let mut first_statistics = None;
        let changed = source.update(|seen| {
            seen.session_id = listener.session_id().map(str::to_owned);
            seen.activity = activity(listener.activity());
            if seen.statistics.is_none() && session_statistics.is_some() {
                // The session's statistics are the starting state (a cold start with jobs
                // already assigned scales on them before any message).
                seen.statistics = session_statistics.clone();
                first_statistics = session_statistics;
            }
        });
        if let Some(first) = first_statistics {
            let (name, first) = (name.clone(), statistics(&first));
            if let Err(e) = blocking(journal, move |j| {
                j.record_statistics(&name, &first, rm_vocab::now())
            })
            .await
            {
                tracing::warn!(scale_set = set.name, error = %e, "cannot journal the session's statistics");
            }
        }
        if changed {
            board.changed();
        }
        if next.is_ok() {
            // Answered: the streak is over; the next one is told again.
            told.store(false, std::sync::atomic::Ordering::Release);
        }
        if next.is_ok() && noted.swap(false, std::sync::atomic::Ordering::AcqRel) {
            let name = name.clone();
            if let Err(e) = blocking(journal, move |j| {
                j.record_note(&name, None, rm_vocab::now())
            })
            .await
            {
                tracing::warn!(scale_set = set.name, error = %e, "cannot clear the scale set's note");
            }
        }
        let message = match next {
            Ok(Some(message)) => message,
            // Held and answered `202`: nothing new (the update above said whether the session
            // or its statistics changed).
            Ok(None) => continue,
            Err(ScaleSetError::ScaleSetNotFound { .. }) => return Served::ScaleSetGone,
            Err(e) => return Served::GaveUp(e),
        };
        crate::fault::crash_point("scale_set_message_received");
        acquire_available(&mut listener, &message, &name).await;
        let incoming = incoming(&message);
        let completed: Vec<String> = incoming
            .events
            .iter()
            .filter(|e| e.kind == "JobCompleted")
            .filter_map(|e| e.runner_name.clone())
            .collect();
        let statistics = message.statistics.clone();
        let message_id = message.id;
        loop {
            let (set_name, incoming) = (name.clone(), incoming.clone());
            match blocking(journal, move |j| j.record_message(&set_name, &incoming)).await {
                Ok(MessageRecorded::New) => break,
                Ok(MessageRecorded::AlreadyJournalled) => {
                    tracing::info!(
                        scale_set = set.name,
                        message_id,
                        "message redelivered; already journalled"
                    );
                    break;
                }
                Err(e) => {
                    // Not acknowledged: it comes again; the write is tried again meanwhile.
                    tracing::error!(scale_set = set.name, message_id, error = %e, "cannot journal a scale-set message; it is not acknowledged");
                    tokio::select! {
                        _ = tokio::time::sleep(JOURNAL_RETRY) => {}
                        _ = shutdown.changed() => {
                            close(listener, journal, &name, id).await;
                            return Served::Shutdown;
                        }
                    }
                }
            }
        }
        crate::fault::crash_point("scale_set_message_journalled");
        source.update(|seen| {
            if let Some(statistics) = statistics {
                seen.statistics = Some(statistics);
            }
            for runner in completed {
                seen.remember_completed(runner);
            }
            seen.last_message_id = message_id;
        });
        board.changed();
        if let Err(e) = listener.ack(message_id).await {
            // Journalled: the redelivery is recognised. Nothing else to do.
            tracing::warn!(scale_set = set.name, message_id, error = %e, "cannot acknowledge a scale-set message; it comes again and is recognised");
        }
        last_message_id = message_id;
    }
}

/// Completes once the published capacity is other than `sent` while the step in flight may
/// be cut (`cuttable`), no sooner than [`CAPACITY_RECUT_AFTER`] from now; never if either
/// publisher is gone.
async fn capacity_changed(
    capacities: &mut watch::Receiver<Option<u32>>,
    sent: u32,
    mut cuttable: watch::Receiver<bool>,
) {
    tokio::time::sleep(CAPACITY_RECUT_AFTER).await;
    if cuttable.wait_for(|cut| *cut).await.is_err()
        || capacities.wait_for(|c| *c != Some(sent)).await.is_err()
    {
        std::future::pending::<()>().await;
    }
}

/// Acquires the message's `JobAvailable` jobs (GHES assigns a job only once acquired, §1.11;
/// github.com announces none). A failure is logged: the service announces them again.
async fn acquire_available(listener: &mut Listener, message: &Message, name: &str) {
    let MessageBody::Jobs(jobs) = &message.body else {
        return;
    };
    let ids: Vec<i64> = jobs
        .iter()
        .filter(|j| j.message_type == "JobAvailable" && j.runner_request_id > 0)
        .map(|j| j.runner_request_id)
        .collect();
    if ids.is_empty() {
        return;
    }
    match listener.acquire(&ids).await {
        Ok(acquired) => {
            tracing::info!(
                scale_set = name,
                offered = ids.len(),
                acquired = acquired.len(),
                "scale-set jobs acquired"
            );
        }
        Err(e) => {
            tracing::warn!(scale_set = name, error = %e, "cannot acquire the scale set's available jobs");
        }
    }
}

async fn close(listener: Listener, journal: &Journal, name: &str, id: u64) {
    match listener.close().await {
        Ok(()) => {
            let (name, at) = (name.to_owned(), rm_vocab::now());
            if let Err(e) = blocking(journal, move |j| {
                j.record_session(&name, id as i64, None, at)
            })
            .await
            {
                tracing::warn!(error = %e, "cannot journal that the scale-set session is closed");
            }
        }
        Err(e) => {
            tracing::warn!(scale_set = name, error = %e, "cannot close the scale-set session; the next start deletes it by its journalled id");
        }
    }
}

fn activity(activity: &Activity) -> String {
    match activity {
        Activity::Idle | Activity::Polling { .. } => "polling".to_owned(),
        Activity::Opening => "opening a session".to_owned(),
        Activity::Standby { until, .. } => format!(
            "on standby: another listener holds the scale set's session (next try at {})",
            rm_vocab::UnixMs::from(*until)
        ),
        // The last failure's error says why: an answer the listener does not know is said,
        // never waited out silently.
        Activity::BackingOff {
            until,
            failures,
            reason,
            ..
        } => format!(
            "backing off after {failures} failure(s): {reason} (next try at {})",
            rm_vocab::UnixMs::from(*until)
        ),
    }
}

/// The message as the journal keeps it.
pub(crate) fn incoming(message: &Message) -> IncomingMessage {
    let (events, unknown_type) = match &message.body {
        MessageBody::Jobs(jobs) => (jobs.iter().map(event).collect(), None),
        MessageBody::Unknown { message_type, .. } => (Vec::new(), Some(message_type.clone())),
    };
    IncomingMessage {
        message_id: i64::try_from(message.id).unwrap_or(i64::MAX),
        statistics: message.statistics.as_ref().map(statistics),
        events,
        unknown_type,
        received_at: rm_vocab::now(),
    }
}

fn event(job: &JobMessage) -> JobEvent {
    JobEvent {
        kind: job.message_type.clone(),
        job_id: job.job_id.clone(),
        runner_request_id: job.runner_request_id,
        repository: String::new(),
        workflow_run_id: None,
        display_name: job.job_display_name.clone(),
        labels: job.request_labels.clone(),
        runner_name: job.runner_name.clone(),
        result: job.result.clone(),
    }
}

pub(crate) fn statistics(s: &Statistics) -> ScaleSetStatistics {
    ScaleSetStatistics {
        available: s.total_available_jobs,
        acquired: s.total_acquired_jobs,
        assigned: s.total_assigned_jobs,
        running: s.total_running_jobs,
        registered: s.total_registered_runners,
        busy: s.total_busy_runners,
        idle: s.total_idle_runners,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[tokio::test]
    async fn a_capacity_change_cuts_a_held_poll_short_but_not_within_its_first_second() {
        let (publisher, mut capacities) = watch::channel(Some(2u32));
        let (polling, cuttable) = watch::channel(true);
        // Changed at once: the poll is still held its first second.
        publisher.send_replace(Some(3));
        let started = Instant::now();
        capacity_changed(&mut capacities, 2, cuttable.clone()).await;
        assert!(started.elapsed() >= CAPACITY_RECUT_AFTER);
        // The capacity the poll sent: nothing to cut.
        let wait = CAPACITY_RECUT_AFTER + Duration::from_millis(300);
        assert!(
            tokio::time::timeout(wait, capacity_changed(&mut capacities, 3, cuttable.clone()))
                .await
                .is_err()
        );
        // Not a poll in flight (a session being made, a back-off): not until it is one.
        polling.send_replace(false);
        {
            let cut = capacity_changed(&mut capacities, 2, cuttable.clone());
            tokio::pin!(cut);
            assert!(tokio::time::timeout(wait, &mut cut).await.is_err());
            polling.send_replace(true);
            tokio::time::timeout(Duration::from_millis(300), &mut cut)
                .await
                .expect("cut once the session is made");
        }
        // No publisher any more: never (not a loop of polls).
        drop(publisher);
        assert!(
            tokio::time::timeout(wait, capacity_changed(&mut capacities, 3, cuttable))
                .await
                .is_err()
        );
    }

    /// A back-off is told once a streak: at once for an answer the listener does not know,
    /// after [`NOTIFY_AFTER_FAILURES`] for failures that pass, never twice.
    #[test]
    fn a_back_off_is_told_once_a_streak_when_it_is_worth_it() {
        use rm_github::scaleset::listener::Outcome;
        // What the listener judges each failure (`Outcome::of`), as its back-off carries it.
        let unrecognised = |e: ScaleSetError| Outcome::of(&e) == Outcome::Unrecognised;
        let service = |status| {
            unrecognised(ScaleSetError::Service {
                endpoint: "poll",
                status,
                type_name: "SomeNewException".into(),
                message: "no idea".into(),
            })
        };
        let unreachable = unrecognised(ScaleSetError::Unreachable {
            endpoint: "poll",
            reason: "reset".into(),
        });
        let n = NOTIFY_AFTER_FAILURES;
        // (told already, failures, the last answer unrecognised, told now)
        let cases = [
            (false, 1, service(418), true),
            (false, 1, service(400), true),
            (true, 1, service(418), false),
            (true, n + 3, service(418), false),
            (false, 1, service(503), false),
            (false, 1, service(429), false),
            (false, 1, service(408), false),
            (false, 1, unreachable, false),
            (false, n - 1, unreachable, false),
            (false, n, unreachable, true),
            (false, n, service(503), true),
            (true, n, unreachable, false),
        ];
        for (told, failures, unknown, tell) in cases {
            assert_eq!(
                tell_backoff(told, failures, unknown),
                tell,
                "{told} {failures} {unknown}"
            );
        }
    }

    /// A refusal at setup (an enterprise's PAT refused, a 403) is reported as one and waits
    /// like a refusal later on; a failure that passes is tried again sooner.
    #[test]
    fn a_refusal_at_setup_is_reported_as_one() {
        let service = |status| ScaleSetError::Service {
            endpoint: "e",
            status,
            type_name: String::new(),
            message: String::new(),
        };
        let refused_pat = ScaleSetError::TokenRefused {
            endpoint: "e",
            status: 401,
            message: "Bad credentials".into(),
        };
        let unreachable = ScaleSetError::Unreachable {
            endpoint: "e",
            reason: "reset".into(),
        };
        // (error, the note starts with, the wait)
        let cases = [
            (
                refused_pat,
                "refused: GitHub refused the enterprise's",
                GIVE_UP_RETRY,
            ),
            (service(403), "refused: ", GIVE_UP_RETRY),
            (
                service(503),
                "cannot find or create the scale set: ",
                SETUP_RETRY,
            ),
            (
                unreachable,
                "cannot find or create the scale set: ",
                SETUP_RETRY,
            ),
        ];
        for (error, note, wait) in cases {
            let (text, waited) = after_setup_failure(&error);
            assert!(text.starts_with(note), "{text}");
            assert_eq!(waited, wait, "{text}");
        }
    }
}
