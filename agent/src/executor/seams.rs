//! The executor's seams: what it reads the time from, and which backend runs, looks at and
//! stops an attempt's runner. Production passes [`Seams::production`] (the system clock, the
//! configured [`Backends`]); the in-process harness (`executor/harness`) passes a manual clock
//! and one fake backend, so the lifecycle rules run in milliseconds without a runner binary.
//! Nothing here decides anything.
//!
//! A runner's process is reached only through its attempt's backend: `rm_runner`'s `Backend`
//! is also the process table its runners are seen and signalled in (`process::inspect`,
//! `process::stop`), so a test fakes one thing, and a backend whose runners are not host
//! processes (a container, a microVM) can answer for them.

use std::sync::Arc;

use rm_journal::IsolationKind;
use rm_runner::backend::Backend;

use super::Backends;

/// Which backend drives an attempt journalled under `kind`. [`Backends`] is the production
/// choice; a single backend drives the attempts of its own kind (the harness's).
pub(crate) trait Execution: Send + Sync {
    /// `None` when this agent cannot drive `kind` (an isolated attempt, and the agent may no
    /// longer switch users).
    fn of(&self, kind: IsolationKind) -> Option<&dyn Backend>;

    /// Where a runner of `kind` is looked at and stopped: its own backend, or, for one this agent
    /// cannot drive, a backend whose runners are host processes as that one's were, so that it
    /// is still seen and stopped (`none` and `user` both run runners as host processes).
    fn processes_of(&self, kind: IsolationKind) -> &dyn Backend;
}

impl Execution for Backends {
    fn of(&self, kind: IsolationKind) -> Option<&dyn Backend> {
        Backends::of(self, kind)
    }

    fn processes_of(&self, kind: IsolationKind) -> &dyn Backend {
        Backends::of(self, kind).unwrap_or(&self.none)
    }
}

impl<B: Backend> Execution for B {
    fn of(&self, kind: IsolationKind) -> Option<&dyn Backend> {
        (kind == self.kind()).then_some(self as &dyn Backend)
    }

    fn processes_of(&self, _: IsolationKind) -> &dyn Backend {
        self
    }
}

/// What the executor reads the world through.
pub(crate) struct Seams {
    /// Every time the executor journals or decides by (`now` of a lifecycle decision, fences,
    /// back-offs, JIT retry times).
    pub clock: Arc<dyn rm_vocab::Clock>,
    pub execution: Arc<dyn Execution>,
}

impl Seams {
    /// The real clock, the configured backends.
    pub(crate) fn production(backends: Arc<Backends>) -> Seams {
        Seams {
            clock: Arc::new(rm_vocab::SystemClock),
            execution: backends,
        }
    }
}
