//! The unpacked package new runtimes are made from under `isolation = "none"` (a copy each),
//! and the package the isolated store is installed from: one path, swapped in one step when
//! `runner.version = "latest"` moves to a new release ([`super::latest`]). A runtime being made
//! holds the path it started from, so the follower knows a superseded package is still being
//! copied and keeps it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// A shared, swappable package directory.
#[derive(Debug, Clone)]
pub struct CurrentPackage {
    inner: Arc<Mutex<Arc<PathBuf>>>,
}

impl CurrentPackage {
    pub fn new(dir: &Path) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Arc::new(dir.to_path_buf()))),
        }
    }

    /// The package now; hold the handle while a runtime is made from it.
    pub fn get(&self) -> Arc<PathBuf> {
        Arc::clone(&self.inner.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Makes `dir` the package from now on; returns the one it replaces.
    pub(crate) fn set(&self, dir: &Path) -> Arc<PathBuf> {
        let mut current = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::replace(&mut *current, Arc::new(dir.to_path_buf()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_swap_leaves_holders_of_the_old_package_with_it() {
        let current = CurrentPackage::new(Path::new("/p/old"));
        let held = current.get();
        let replaced = current.set(Path::new("/p/new"));
        assert_eq!(*replaced, PathBuf::from("/p/old"));
        assert_eq!(*held, PathBuf::from("/p/old"));
        // The holder and the one returned: a follower sees it is still in use.
        assert_eq!(Arc::strong_count(&replaced), 2);
        drop(held);
        assert_eq!(Arc::strong_count(&replaced), 1);
        assert_eq!(*current.get(), PathBuf::from("/p/new"));
    }
}
