//! Crash injection for the crash tests: `RM_FAULT_CRASH_AT=<point>` makes the agent SIGKILL
//! itself when it reaches that point of a runner's lifecycle, so a test can prove that a
//! restart recovers from exactly there. Unset (always, outside tests), it costs one cached
//! lookup. The variable starts with `RM_`, so it never reaches a runner's environment.

use std::sync::OnceLock;

/// The variable naming the crash point.
pub const CRASH_ENV: &str = "RM_FAULT_CRASH_AT";

/// The points a test can crash the agent at, in lifecycle order.
pub const CRASH_POINTS: [&str; 6] = [
    "attempt_journalled",
    "jit_received",
    "process_spawned",
    "runner_started",
    "runner_busy",
    "cleanup",
];

/// Kills the agent with SIGKILL if `point` is the configured crash point.
pub fn crash_point(point: &'static str) {
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
