//! The executor's seams: what it reads the time from, how it looks at and signals processes,
//! and which backend runs an attempt. Production passes [`Seams::production`] (the system
//! clock, `/proc` and `kill(2)`, the configured [`Backends`]); the in-process harness
//! (`executor/harness`) passes a manual clock, a fake process table and a fake backend, so the
//! lifecycle rules run in milliseconds without a runner binary. Nothing here decides anything.

use std::sync::Arc;

use rm_journal::IsolationKind;

use super::Backends;
use crate::runner::backend::Backend;
use crate::runner::{OsProcesses, Processes, RunnerChild};

/// Which backend drives an attempt journalled under `kind`; `None` when this agent cannot
/// drive it. [`Backends`] is the production choice.
pub(crate) trait Execution: Send + Sync {
    fn of(&self, kind: IsolationKind) -> Option<&dyn Backend>;
}

impl Execution for Backends {
    fn of(&self, kind: IsolationKind) -> Option<&dyn Backend> {
        Backends::of(self, kind)
    }
}

/// The processes the executor observes and stops (`Processes::spawn` is the backends' business:
/// the executor starts runners only through [`Execution`]).
pub(crate) type ProcessTable = dyn Processes<Child = RunnerChild> + Send + Sync;

/// What the executor reads the world through.
pub(crate) struct Seams {
    /// Every time the executor journals or decides by (`now` of a lifecycle decision, fences,
    /// back-offs, JIT retry times).
    pub clock: Arc<dyn rm_vocab::Clock>,
    pub processes: Arc<ProcessTable>,
    pub execution: Arc<dyn Execution>,
}

impl Seams {
    /// The real clock, the real processes, the configured backends.
    pub(crate) fn production(backends: Arc<Backends>) -> Seams {
        Seams {
            clock: Arc::new(rm_vocab::SystemClock),
            processes: Arc::new(OsProcesses),
            execution: backends,
        }
    }
}
