//! The poller's blocking seams: its poll store ([`Store`]: SQLite or PostgreSQL, the
//! `rm_journal::PollStore` behind it) and, in a fleet, the fleet's leases (`rm_journal::Fleet`).
//! Both block (a SQLite commit with an fsync, a PostgreSQL round trip), and the PostgreSQL
//! client cannot run on a runtime's worker at all (it starts a runtime of its own), so every
//! call runs on the blocking pool ([`Blocking::call`]), and the handle is dropped off the
//! runtime too. Nothing here decides anything.

use std::sync::{Arc, Mutex, PoisonError};

use rm_journal::{Fleet, JournalError, PollStore};

/// The poller's poll store.
pub(super) type Store = Blocking<dyn PollStore>;

/// The fleet's leases, as the poller's election uses them.
pub(super) type FleetHandle = Blocking<dyn Fleet + Send>;

/// A blocking handle used only from the blocking pool. Cloning shares it.
pub(super) struct Blocking<T: ?Sized + Send + 'static> {
    /// `None` only while the last handle is dropped.
    inner: Arc<Mutex<Option<Box<T>>>>,
}

impl<T: ?Sized + Send + 'static> Clone for Blocking<T> {
    fn clone(&self) -> Self {
        Blocking {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<T: ?Sized + Send + 'static> Blocking<T> {
    pub(super) fn new(value: Box<T>) -> Blocking<T> {
        Blocking {
            inner: Arc::new(Mutex::new(Some(value))),
        }
    }

    /// Runs `call` on the handle, on a blocking thread. A panic in `call` is the caller's.
    pub(super) async fn call<R, E, F>(&self, call: F) -> Result<R, E>
    where
        F: FnOnce(&mut T) -> Result<R, E> + Send + 'static,
        R: Send + 'static,
        E: From<JournalError> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        let ran = tokio::task::spawn_blocking(move || {
            let mut guard = inner.lock().unwrap_or_else(PoisonError::into_inner);
            match guard.as_deref_mut() {
                Some(value) => call(value),
                // Only the drop of the last handle empties it, and this closure holds one.
                None => Err(E::from(JournalError::WriterStopped)),
            }
        })
        .await;
        match ran {
            Ok(result) => result,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            // The runtime is shutting down: the call never ran.
            Err(_) => Err(E::from(JournalError::WriterStopped)),
        }
    }
}

impl<T: ?Sized + Send + 'static> Drop for Blocking<T> {
    fn drop(&mut self) {
        // The last handle: a PostgreSQL client closes its connection on drop, which blocks (and
        // panics on a runtime's worker), so it goes on a thread of its own. A call still in
        // flight holds a handle of its own and drops the value on its blocking thread instead.
        if Arc::strong_count(&self.inner) == 1 {
            let value = self
                .inner
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if value.is_some() {
                std::thread::spawn(move || drop(value));
            }
        }
    }
}
