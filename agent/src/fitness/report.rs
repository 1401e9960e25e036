//! How the fitness gate's judgement is said: `status` (`host: {fit, checked_at, problems}` in
//! `--json`, a `host` line and "Needs attention" for people) from the status snapshot, and
//! `/metrics` (`rm_host_fit`, `rm_host_fitness_problem{code}`) from the live [`Gate`].

use std::fmt;

use rm_receiver::prometheus_client::collector::Collector;
use rm_receiver::prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use rm_receiver::prometheus_client::metrics::MetricType;
use rm_receiver::prometheus_client::metrics::gauge::ConstGauge;
use serde_json::{Value, json};

use super::{CODES, Fitness, Gate};
use crate::output::rfc3339;

/// `status --json`'s `host`: `fit` is null when no live agent has judged it.
pub(crate) fn status_json(fitness: Option<&Fitness>) -> Value {
    json!({
        "fit": fitness.map(|f| f.problems.is_empty()),
        "checked_at": fitness.map(|f| rfc3339(f.checked_at_ms)),
        "problems": fitness.map_or_else(Vec::new, |f| f.problems.iter().map(|p| json!({
            "code": p.code,
            "message": p.message,
        })).collect()),
    })
}

/// The `host` line of `status`.
pub(crate) fn status_line(fitness: Option<&Fitness>) -> String {
    match fitness {
        None => "fitness not known (no agent has checked it)".to_owned(),
        Some(f) if f.problems.is_empty() => "fit: disk, memory and required tools".to_owned(),
        Some(f) => {
            let mut codes: Vec<&str> = f.problems.iter().map(|p| p.code.as_str()).collect();
            codes.sort_unstable();
            codes.dedup();
            format!("UNFIT ({}): no new runner is registered", codes.join(", "))
        }
    }
}

/// The problems for "Needs attention".
pub(crate) fn degraded(fitness: Option<&Fitness>) -> Vec<String> {
    fitness.map_or_else(Vec::new, |f| {
        f.problems
            .iter()
            .map(|p| format!("Host unfit ({}): {}.", p.code, p.message))
            .collect()
    })
}

/// The gate's `/metrics` series, read at every scrape.
pub(crate) struct FitnessMetrics {
    gate: Gate,
}

impl FitnessMetrics {
    pub(crate) fn new(gate: Gate) -> FitnessMetrics {
        FitnessMetrics { gate }
    }
}

impl fmt::Debug for FitnessMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FitnessMetrics").finish_non_exhaustive()
    }
}

impl Collector for FitnessMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        // Nothing before the first check: a 1 would claim what was not measured.
        let Some(fitness) = self.gate.current() else {
            return Ok(());
        };
        let metric = encoder.encode_descriptor(
            "rm_host_fit",
            "1 while the host may register new runners, 0 while the fitness gate holds them back",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(fitness.problems.is_empty())).encode(metric)?;
        let mut family = encoder.encode_descriptor(
            "rm_host_fitness_problem",
            "1 for each kind of problem that makes the host unfit now (disk_space, not_writable, memory, missing_tool, probe_timeout)",
            None,
            MetricType::Gauge,
        )?;
        for code in CODES {
            let present = fitness.problems.iter().any(|p| p.code == code);
            ConstGauge::new(i64::from(present)).encode(family.encode_family(&[("code", code)])?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use rm_receiver::prometheus_client::encoding::text::encode;
    use rm_receiver::prometheus_client::registry::Registry;

    use super::*;
    use crate::fitness::FitnessProblem;

    fn unfit() -> Fitness {
        Fitness {
            checked_at_ms: 1_700_000_000_000,
            problems: vec![FitnessProblem {
                code: "disk_space".to_owned(),
                message: "the runner root /r has 1.0 MiB free".to_owned(),
            }],
        }
    }

    #[test]
    fn status_says_fit_unfit_or_unknown() {
        assert_eq!(status_json(None)["fit"], Value::Null);
        assert_eq!(status_json(None)["problems"], json!([]));
        let json = status_json(Some(&unfit()));
        assert_eq!(json["fit"], false);
        assert_eq!(json["problems"][0]["code"], "disk_space");
        assert_eq!(json["checked_at"], "2023-11-14T22:13:20.000Z");
        assert!(status_line(Some(&unfit())).starts_with("UNFIT (disk_space)"));
        assert_eq!(
            degraded(Some(&unfit())),
            ["Host unfit (disk_space): the runner root /r has 1.0 MiB free."]
        );
        let fit = Fitness {
            problems: Vec::new(),
            ..unfit()
        };
        assert_eq!(status_json(Some(&fit))["fit"], true);
        assert!(degraded(Some(&fit)).is_empty());
    }

    #[test]
    fn metrics_follow_the_gate() {
        let gate = Gate::default();
        let mut registry = Registry::default();
        registry.register_collector(Box::new(FitnessMetrics::new(gate.clone())));
        let scrape = || {
            let mut out = String::new();
            encode(&mut out, &registry).unwrap();
            out
        };
        assert!(!scrape().contains("rm_host_fit"), "{}", scrape());
        gate.record(unfit());
        let text = scrape();
        for line in [
            "rm_host_fit 0",
            "rm_host_fitness_problem{code=\"disk_space\"} 1",
            "rm_host_fitness_problem{code=\"memory\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        gate.record(Fitness {
            problems: Vec::new(),
            ..unfit()
        });
        let text = scrape();
        assert!(text.lines().any(|l| l == "rm_host_fit 1"), "{text}");
        assert!(
            text.lines()
                .any(|l| l == "rm_host_fitness_problem{code=\"disk_space\"} 0"),
            "{text}"
        );
    }
}
