//! Crash injection for the crash tests (tests/e2e/tests/run/crash.rs), and only in an agent built
//! with the `fault-injection` feature: `RM_FAULT_CRASH_AT=<point>` makes that agent SIGKILL
//! itself when it reaches that point of a runner's lifecycle, so a test can prove that a restart
//! recovers from exactly there. Test code is not part of the product: without the feature (any
//! `cargo build -p rm-agent` or `cargo install`) [`crash_point`] is an empty function, the
//! variable is never read, and no environment can make an installed agent kill itself. With it,
//! unset, it costs one cached lookup; the variable starts with `RM_`, so it never reaches a
//! runner's environment. `rm-agent --version` names the feature ([`crate::features`]), and the
//! crash tests refuse an agent without it rather than wait for a crash that cannot come.

/// The variable naming the crash point: `jobs_claimed` (a fleet host, right after it claimed
/// jobs), `attempt_journalled`, `jit_issued` (GitHub's JIT answer in hand, not yet journalled),
/// `jit_received`, `process_spawned`, `runner_started`, `runner_busy`, `cleanup` (concluded, its
/// runtime not removed yet) or `released` (its runtime removed and its uid released, its
/// registration not removed yet), in lifecycle order; `scale_down_intended` and
/// `scale_down_removed` (a scale set's surplus runner's stop intent journalled, and then it
/// removed from the scale set, not yet stopped; `executor/effects.rs`); `rerun_sending` (a
/// re-run journalled `sending`, its request not sent; `executor/rerun.rs`) (the `crash_point`
/// calls in the executor name them); `scale_set_message_received` and
/// `scale_set_message_journalled` (a scale-set message received and not yet journalled, and
/// journalled and not yet acknowledged; `scaleset/listen.rs`).
#[cfg(feature = "fault-injection")]
const CRASH_ENV: &str = "RM_FAULT_CRASH_AT";

/// Kills the agent with SIGKILL if `point` is the configured crash point.
#[cfg(feature = "fault-injection")]
pub(crate) fn crash_point(point: &'static str) {
    use std::sync::OnceLock;

    static CONFIGURED: OnceLock<Option<String>> = OnceLock::new();
    let configured = CONFIGURED.get_or_init(|| std::env::var(CRASH_ENV).ok());
    if configured.as_deref() == Some(point) {
        eprintln!("rm-agent: {CRASH_ENV}={point}: killing this agent with SIGKILL");
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        // SIGKILL cannot be caught; should the call have failed, die anyway.
        std::process::abort();
    }
}

/// Without `fault-injection`: nothing, and the call compiles away.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) fn crash_point(_point: &'static str) {}
