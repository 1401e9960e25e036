//! Conditional requests for polled lists: the last ETag and body of each URL, per scope, so a
//! repeated poll sends `If-None-Match` and a `304` (which costs no quota) is answered from here.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use bytes::Bytes;

use crate::budget::Scope;

/// Most URLs remembered; past it the cache starts over (a poll then costs one full answer).
pub const MAX_ENTRIES: usize = 4096;

#[derive(Debug, Clone)]
struct Entry {
    etag: String,
    body: Bytes,
}

/// ETags and bodies by scope and URL.
#[derive(Debug, Default)]
pub struct EtagCache {
    entries: Mutex<HashMap<(Scope, String), Entry>>,
}

impl EtagCache {
    /// The ETag to send for `url`, if a body for it is cached.
    pub fn etag(&self, scope: Scope, url: &str) -> Option<String> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries
            .get(&(scope, url.to_owned()))
            .map(|e| e.etag.clone())
    }

    /// The cached body for `url`, used when GitHub answers `304`.
    pub fn body(&self, scope: Scope, url: &str) -> Option<Bytes> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries
            .get(&(scope, url.to_owned()))
            .map(|e| e.body.clone())
    }

    pub fn store(&self, scope: Scope, url: &str, etag: String, body: Bytes) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= MAX_ENTRIES {
            entries.clear();
        }
        entries.insert((scope, url.to_owned()), Entry { etag, body });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_kept_per_scope_and_url() {
        let c = EtagCache::default();
        c.store(
            Scope::Installation(1),
            "/a",
            "\"e1\"".into(),
            Bytes::from_static(b"[1]"),
        );
        assert_eq!(
            c.etag(Scope::Installation(1), "/a").as_deref(),
            Some("\"e1\"")
        );
        assert_eq!(
            c.body(Scope::Installation(1), "/a").as_deref(),
            Some(&b"[1]"[..])
        );
        assert!(c.etag(Scope::Installation(2), "/a").is_none());
        assert!(c.etag(Scope::Installation(1), "/b").is_none());
    }

    #[test]
    fn a_full_cache_starts_over() {
        let c = EtagCache::default();
        for i in 0..MAX_ENTRIES {
            c.store(Scope::App(1), &format!("/{i}"), "e".into(), Bytes::new());
        }
        c.store(Scope::App(1), "/new", "e".into(), Bytes::new());
        assert!(c.etag(Scope::App(1), "/0").is_none());
        assert!(c.etag(Scope::App(1), "/new").is_some());
    }
}
