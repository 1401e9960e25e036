//! What the running cache says about itself, for `rm-agent status`, `explain` and `/metrics`:
//! its totals (hits, misses, bytes each way, entries, bytes stored) and whether the installed
//! runner package takes the redirect (cached runners are only ever redirected ones:
//! `rm_runner::backend::CachePlan`). Read every [`REPORT_EVERY`] off the async workers and kept
//! on a [`Board`], which the status publisher and the metrics collector read without I/O.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rm_receiver::prometheus_client::collector::Collector;
use rm_receiver::prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use rm_receiver::prometheus_client::metrics::MetricType;
use rm_receiver::prometheus_client::metrics::counter::ConstCounter;
use rm_receiver::prometheus_client::metrics::gauge::ConstGauge;
use rm_runner::backend::LinkedPackage;
use serde::{Deserialize, Serialize};

/// How often the totals and the redirect's verdict are read again.
pub(crate) const REPORT_EVERY: Duration = Duration::from_secs(5);

/// Whether cached runners are redirected to the local service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Redirect {
    /// The stored runner package's digest (short).
    pub package: String,
    pub active: bool,
    /// Why not, when not: the runners of cached policies then run uncached.
    #[serde(default)]
    pub why: Option<String>,
}

/// The cache's report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CacheReport {
    pub hits: u64,
    pub misses: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub entries: u64,
    pub bytes_stored: u64,
    /// `None` on an agent without a stored package (no isolated runners).
    #[serde(default)]
    pub redirect: Option<Redirect>,
}

/// The last report, shared.
pub(crate) type Board = Arc<Mutex<Option<CacheReport>>>;

/// `status`'s line: the redirect's verdict first (the reason runners would run uncached), then
/// what the cache holds and did. Pure.
pub(crate) fn status_line(report: &CacheReport) -> String {
    let mib = |bytes: u64| format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20));
    let redirect = match &report.redirect {
        Some(r) if r.active => format!("active (runner package {})", r.package),
        Some(r) => format!(
            "INACTIVE: {}",
            r.why
                .as_deref()
                .unwrap_or("the runner package does not take the redirect")
        ),
        None => "no stored runner package".to_owned(),
    };
    format!(
        "{redirect}; {} entries, {}; {} hits, {} misses; {} saved, {} restored",
        report.entries,
        mib(report.bytes_stored),
        report.hits,
        report.misses,
        mib(report.bytes_up),
        mib(report.bytes_down)
    )
}

/// The redirect's verdict on `package`.
pub(crate) fn redirect_of(package: &rm_runner::store::StoredPackage) -> Redirect {
    let digest = package.digest();
    let short = rm_runner::store::redirect::short(&digest).to_owned();
    match package.redirect_fits() {
        Ok(()) => Redirect {
            package: short,
            active: true,
            why: None,
        },
        Err(unfit) => Redirect {
            why: Some(format!(
                "runner package {short} does not fit the cache redirect: {unfit}; its jobs run uncached"
            )),
            package: short,
            active: false,
        },
    }
}

/// Keeps `board` current until the agent stops: the totals at every [`REPORT_EVERY`], the
/// redirect's verdict whenever the stored package changed.
pub(crate) fn spawn(
    service: rm_cache::Service,
    package: Option<Arc<LinkedPackage>>,
    board: Board,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut verdict: Option<(String, Redirect)> = None;
        loop {
            let service = service.clone();
            let package = package.clone();
            let known = verdict.clone();
            let read = tokio::task::spawn_blocking(move || {
                let totals = service.totals();
                let redirect = package.map(|linked| {
                    let current = linked.current();
                    match known {
                        Some((digest, redirect)) if digest == current.digest() => {
                            (digest, redirect)
                        }
                        _ => (current.digest(), redirect_of(&current)),
                    }
                });
                (totals, redirect)
            })
            .await;
            match read {
                Ok((Ok(totals), redirect)) => {
                    verdict.clone_from(&redirect);
                    let report = CacheReport {
                        hits: totals.counters.hits,
                        misses: totals.counters.misses,
                        bytes_up: totals.counters.bytes_up,
                        bytes_down: totals.counters.bytes_down,
                        entries: totals.entries,
                        bytes_stored: totals.bytes_stored,
                        redirect: redirect.map(|(_, r)| r),
                    };
                    *board.lock().unwrap_or_else(PoisonError::into_inner) = Some(report);
                }
                Ok((Err(e), _)) => tracing::warn!(error = %e, "cannot read the cache's totals"),
                Err(e) => tracing::warn!(error = %e, "the cache's report failed"),
            }
            tokio::time::sleep(REPORT_EVERY).await;
        }
    })
}

/// `/metrics`: the cache's counters and size, and whether its redirect is active.
pub(crate) struct CacheMetrics {
    board: Board,
}

impl CacheMetrics {
    pub(crate) fn new(board: Board) -> CacheMetrics {
        CacheMetrics { board }
    }
}

impl fmt::Debug for CacheMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheMetrics").finish_non_exhaustive()
    }
}

impl Collector for CacheMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let Some(report) = self
            .board
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        else {
            return Ok(());
        };
        for (name, help, value) in [
            (
                "rm_cache_hits",
                "Cache restores that found an entry in the caller's scopes",
                report.hits,
            ),
            (
                "rm_cache_misses",
                "Cache restores that found none",
                report.misses,
            ),
        ] {
            let metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(value).encode(metric)?;
        }
        let mut bytes = encoder.encode_descriptor(
            "rm_cache_bytes",
            "Bytes saved to (up) and restored from (down) the host-local cache",
            None,
            MetricType::Counter,
        )?;
        for (direction, value) in [("up", report.bytes_up), ("down", report.bytes_down)] {
            ConstCounter::new(value).encode(bytes.encode_family(&[("direction", direction)])?)?;
        }
        for (name, help, value) in [
            (
                "rm_cache_entries",
                "Entries visible in the host-local cache",
                report.entries,
            ),
            (
                "rm_cache_stored_bytes",
                "Bytes of the host-local cache's entries",
                report.bytes_stored,
            ),
        ] {
            let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX)).encode(metric)?;
        }
        if let Some(redirect) = &report.redirect {
            let metric = encoder.encode_descriptor(
                "rm_cache_redirect_active",
                "1 while the installed runner package takes the cache redirect, 0 while cached policies' runners run uncached",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(i64::from(redirect.active)).encode(metric)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use rm_receiver::prometheus_client::encoding::text::encode;
    use rm_receiver::prometheus_client::registry::Registry;

    use super::*;

    #[test]
    fn the_status_line_puts_an_inactive_redirect_first() {
        let mut report = CacheReport {
            hits: 2,
            misses: 1,
            bytes_up: 64 << 20,
            bytes_down: 128 << 20,
            entries: 1,
            bytes_stored: 64 << 20,
            redirect: Some(Redirect {
                package: "abc".to_owned(),
                active: true,
                why: None,
            }),
        };
        assert_eq!(
            status_line(&report),
            "active (runner package abc); 1 entries, 64.0 MiB; 2 hits, 1 misses; 64.0 MiB saved, 128.0 MiB restored"
        );
        report.redirect = Some(Redirect {
            package: "abc".to_owned(),
            active: false,
            why: Some("runner package abc does not fit".to_owned()),
        });
        assert!(
            status_line(&report).starts_with("INACTIVE: runner package abc does not fit;"),
            "{}",
            status_line(&report)
        );
    }

    #[test]
    fn metrics_say_what_the_board_holds_and_nothing_before() {
        let board: Board = Arc::default();
        let mut registry = Registry::default();
        registry.register_collector(Box::new(CacheMetrics::new(Arc::clone(&board))));
        let scrape = || {
            let mut out = String::new();
            encode(&mut out, &registry).unwrap();
            out
        };
        assert!(!scrape().contains("rm_cache"), "{}", scrape());
        *board.lock().unwrap() = Some(CacheReport {
            hits: 3,
            misses: 2,
            bytes_up: 100,
            bytes_down: 300,
            entries: 1,
            bytes_stored: 100,
            redirect: Some(Redirect {
                package: "abc".to_owned(),
                active: false,
                why: Some("no".to_owned()),
            }),
        });
        let text = scrape();
        for line in [
            "rm_cache_hits_total 3",
            "rm_cache_misses_total 2",
            "rm_cache_bytes_total{direction=\"up\"} 100",
            "rm_cache_bytes_total{direction=\"down\"} 300",
            "rm_cache_entries 1",
            "rm_cache_stored_bytes 100",
            "rm_cache_redirect_active 0",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
