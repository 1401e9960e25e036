//! The re-run adapter (issue 28): finds concluded attempts whose job the infrastructure killed,
//! asks `crate::rerun::decide`, journals the decision and sends GitHub's "re-run a job"
//! request, at most once per job across crashes. It owns when a scan runs (one at a time, off
//! the control loop: the loop never awaits one) and the order of the writes around the
//! request; the record is the journal's (`rm_journal::RerunState`), the request the client's.
//!
//! The order that makes it at-most-once: the decision is journalled `intended`; a
//! compare-and-set to `sending` is committed (an fsync) before the request leaves; the answer
//! moves it to `sent` or `refused` (or back to `intended` when GitHub certainly did nothing: a
//! limit, a run still running). An agent that dies after `sending` finds the row there at its
//! next start and marks it `unknown` ([`settle_at_start`]) before any scan: never sent again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rm_github::RerunError;
use rm_journal::{AttemptRecord, NewRerun, RerunRecord, RerunState};

use super::context::Context;
use crate::config::rerun::RerunPolicy;
use crate::fault;
use crate::notify::OperatorEvent;
use crate::rerun::{Concluded, JobSeen, Verdict, decide};

/// How often the journal is scanned for attempts to re-run the job of (and decided re-runs
/// are sent). A killed job's `completed` arrives minutes after its runner died; seconds more
/// cost nothing.
pub(crate) const RERUN_SCAN_INTERVAL: Duration = Duration::from_secs(5);

/// How far back a scan looks for concluded attempts: a policy given `rerun_on` today does not
/// re-run last month's jobs, and an attempt whose job GitHub never finished is let go.
pub(crate) const RERUN_LOOKBACK: Duration = Duration::from_secs(24 * 3600);

/// How long a decided re-run waits for its run to finish (GitHub refuses a re-run while any
/// job of the run is running) before it is given up, `refused`, unsent.
pub(crate) const RERUN_GIVE_UP: Duration = Duration::from_secs(6 * 3600);

/// The scan's place in the control loop: at most one scan in flight, started when due.
#[derive(Default)]
pub(crate) struct Reruns {
    scan: Option<tokio::task::JoinHandle<()>>,
    last_started_ms: Option<rm_vocab::UnixMs>,
}

impl Reruns {
    /// Starts a scan when one is due and none is running; never waits for it. Nothing at all
    /// when no policy has `rerun_on`.
    pub(crate) fn tick(&mut self, ctx: &Arc<Context>) {
        if ctx.settings.reruns.is_empty() {
            return;
        }
        if self.scan.as_ref().is_some_and(|s| !s.is_finished()) {
            return;
        }
        let now = ctx.now();
        let due = self.last_started_ms.is_none_or(|last| {
            now.saturating_sub(last)
                >= i64::try_from(RERUN_SCAN_INTERVAL.as_millis()).unwrap_or(i64::MAX)
                || now < last
        });
        if !due {
            return;
        }
        self.last_started_ms = Some(now);
        let ctx = Arc::clone(ctx);
        self.scan = Some(tokio::spawn(async move {
            if let Err(e) = scan(&ctx).await {
                tracing::warn!(error = %format!("{e:#}"), "re-run scan failed; tried again next interval");
            }
        }));
    }

    /// Waits for the scan in flight, if any (the harness, and a drain).
    #[cfg(test)]
    pub(crate) async fn settle(&mut self) {
        if let Some(scan) = self.scan.take() {
            scan.await.ok();
        }
    }
}

/// At start, before any scan: every re-run left `sending` may have reached GitHub; it becomes
/// `unknown` and is never sent again.
pub(crate) async fn settle_at_start(ctx: &Context) -> anyhow::Result<()> {
    let at = ctx.now();
    let settled = ctx
        .journal
        .write(move |attempts| attempts.settle_interrupted_reruns(at))
        .await
        .context("cannot settle the re-runs an earlier agent left sending")?;
    for job in settled {
        tracing::warn!(
            job_id = job.get(),
            "a re-run was being sent when the agent stopped: GitHub may have re-run the job; it is not asked again (unknown)"
        );
    }
    Ok(())
}

/// One scan: decide for the new candidates, then send what is decided.
pub(crate) async fn scan(ctx: &Context) -> anyhow::Result<()> {
    let rules = &ctx.settings.reruns;
    let reasons: Vec<String> = rules
        .values()
        .flat_map(|r| r.rerun_on.iter().cloned())
        .collect();
    let since = ctx.now() - RERUN_LOOKBACK;
    let candidates = ctx
        .journal
        .read(move |reader| {
            let reasons: Vec<&str> = reasons.iter().map(String::as_str).collect();
            reader.rerun_candidates(since, &reasons)
        })
        .await
        .context("cannot read the re-run candidates")?;
    for attempt in candidates {
        decide_one(ctx, rules, &attempt).await?;
    }
    let intended = ctx
        .journal
        .write(|attempts| attempts.intended_reruns())
        .await
        .context("cannot read the decided re-runs")?;
    for rerun in intended {
        send(ctx, rerun).await?;
    }
    Ok(())
}

/// Decides for one concluded attempt and journals a re-run when the decision says so.
async fn decide_one(
    ctx: &Context,
    rules: &BTreeMap<String, RerunPolicy>,
    attempt: &AttemptRecord,
) -> anyhow::Result<()> {
    let (Some(job_id), Some(outcome)) = (attempt.job_id, attempt.outcome) else {
        return Ok(());
    };
    let job = ctx
        .journal
        .job(job_id)
        .await
        .context("cannot read the job of a re-run candidate")?;
    let verdict = decide(
        rules.get(&attempt.policy),
        Concluded {
            outcome,
            reason: attempt.reason.as_deref(),
        },
        job.as_ref().map(|j| JobSeen {
            state: j.state,
            conclusion: j.conclusion.as_deref(),
            run_attempt: j.run_attempt,
        }),
        None,
    );
    let (Verdict::Rerun, Some(job)) = (verdict.clone(), job) else {
        if let Verdict::No(why) = verdict {
            tracing::debug!(job_id = job_id.get(), attempt = %attempt.attempt_id.as_str(), why, "no re-run");
        }
        return Ok(());
    };
    let (attempt_id, policy) = (attempt.attempt_id.clone(), attempt.policy.clone());
    let reason = attempt.reason.clone().unwrap_or_default();
    let at = ctx.now();
    let won = ctx
        .journal
        .write(move |attempts| {
            attempts.intend_rerun(
                &NewRerun {
                    job_id,
                    attempt_id: &attempt_id,
                    policy: &policy,
                    reason: &reason,
                    repository: &job.repository,
                    run_id: job.run_id,
                    run_attempt: job.run_attempt,
                },
                at,
            )
        })
        .await
        .context("cannot journal a re-run")?;
    if won {
        tracing::info!(job_id = job_id.get(), policy = %attempt.policy, reason = attempt.reason.as_deref().unwrap_or(""), "re-run decided");
    }
    Ok(())
}

/// What came of one request.
enum Sent {
    Done(RerunState, Option<String>),
    /// GitHub did nothing; the row goes back to `intended`.
    Later(String),
}

/// Sends one decided re-run: `intended → sending` journalled first, then the request, then
/// its answer journalled. A row that waited past [`RERUN_GIVE_UP`] is given up unsent.
async fn send(ctx: &Context, rerun: RerunRecord) -> anyhow::Result<()> {
    let job_id = rerun.job_id;
    let now = ctx.now();
    let give_up = i64::try_from(RERUN_GIVE_UP.as_millis()).unwrap_or(i64::MAX);
    if now.saturating_sub(rerun.created_at_ms) > give_up {
        let detail = format!(
            "given up unsent: its workflow run was still running {} h after the decision",
            RERUN_GIVE_UP.as_secs() / 3600
        );
        let journalled = detail.clone();
        ctx.journal
            .write(move |a| {
                a.advance_rerun(
                    job_id,
                    RerunState::Intended,
                    RerunState::Refused,
                    Some(&journalled),
                    now,
                )
            })
            .await?;
        notify(ctx, &rerun, RerunState::Refused, &detail);
        return Ok(());
    }
    let won = ctx
        .journal
        .write(move |a| {
            a.advance_rerun(job_id, RerunState::Intended, RerunState::Sending, None, now)
        })
        .await
        .context("cannot journal a re-run as sending")?;
    if !won {
        return Ok(());
    }
    // The crash test's point: `sending` is on disk, the request not sent.
    fault::crash_point("rerun_sending");
    let (owner, repo) = rerun
        .repository
        .split_once('/')
        .unwrap_or((rerun.repository.as_str(), ""));
    let result = ctx.registry.client().rerun_job(owner, repo, job_id).await;
    journal_answer(ctx, &rerun, sent(result)).await
}

/// What GitHub's answer to a re-run request means.
fn sent(result: Result<(), RerunError>) -> Sent {
    match result {
        Ok(()) => Sent::Done(RerunState::Sent, None),
        Err(e) if e.not_acted() => Sent::Later(e.to_string()),
        Err(e @ (RerunError::MissingActionsWrite { .. } | RerunError::Refused { .. })) => {
            Sent::Done(RerunState::Refused, Some(e.to_string()))
        }
        Err(e) => Sent::Done(
            RerunState::Unknown,
            Some(format!("no answer to tell whether GitHub re-ran it: {e}")),
        ),
    }
}

/// Journals what came of a re-run sent, and tells the operator of an end.
async fn journal_answer(ctx: &Context, rerun: &RerunRecord, sent: Sent) -> anyhow::Result<()> {
    let (job_id, at) = (rerun.job_id, ctx.now());
    match sent {
        Sent::Later(why) => {
            tracing::info!(job_id = job_id.get(), %why, "GitHub did not act on the re-run; sent again later");
            ctx.journal
                .write(move |a| {
                    a.advance_rerun(job_id, RerunState::Sending, RerunState::Intended, None, at)
                })
                .await
                .context("cannot journal a re-run as intended again")?;
        }
        Sent::Done(state, detail) => {
            let journalled = detail.clone();
            ctx.journal
                .write(move |a| {
                    a.advance_rerun(
                        job_id,
                        RerunState::Sending,
                        state,
                        journalled.as_deref(),
                        at,
                    )
                })
                .await
                .context("cannot journal a re-run's answer")?;
            let detail = detail.unwrap_or_default();
            match state {
                RerunState::Sent => {
                    tracing::info!(job_id = job_id.get(), reason = %rerun.reason, "GitHub re-runs the job")
                }
                _ => {
                    tracing::warn!(job_id = job_id.get(), reason = %rerun.reason, result = state.as_str(), %detail, "re-run not done")
                }
            }
            notify(ctx, rerun, state, &detail);
        }
    }
    Ok(())
}

/// Tells the operator (and `/metrics`) what came of a re-run.
fn notify(ctx: &Context, rerun: &RerunRecord, state: RerunState, detail: &str) {
    super::tally::rerun(&rerun.policy, &rerun.reason, state.as_str());
    ctx.notifier.notify(OperatorEvent::JobRerun {
        policy: rerun.policy.clone(),
        job_id: rerun.job_id.get(),
        reason: rerun.reason.clone(),
        result: state.as_str().to_owned(),
        detail: detail.to_owned(),
    });
}
