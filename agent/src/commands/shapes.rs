//! `rm-agent shapes --policy P [--since 7d] [--json]` (issue 42): right-sizing. Per job name and
//! shape, what a policy's runners asked of the host (CPUs, memory, disk) against what they used
//! (peak memory, and CPU as average CPUs over the run), with a one-word hint an operator acts on.
//!
//! The rules are [`report`] and [`hint`], pure; the command only reads the journal and prints.
//! Usage is recorded in this host's journal at each runner's cleanup (`memory.peak`,
//! `cpu.stat`), so the report covers this host's runners; in a fleet the job names come from the
//! fleet's journal (the jobs live there). Works with the agent stopped.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use rm_journal::{AttemptShape, ShapeUsage};
use rm_vocab::{JobId, UnixMs};
use serde_json::{Value, json};

use crate::config::Config;
use crate::config::shape::{format_cpu, format_size};
use crate::exit::Exit;
use crate::output::{print_json, print_table};

/// `--since`'s default: a week of runs.
pub const DEFAULT_SINCE: Duration = Duration::from_secs(7 * 24 * 3600);

/// A shape is `oversized` when its largest run's peak memory and its largest run's average CPUs
/// are both under this share of what it asked, in percent: half of it would do.
pub(crate) const OVERSIZED_BELOW_PERCENT: u64 = 50;
/// A shape is `undersized` when its largest run's peak memory is over this share of the memory
/// it asked, in percent: a slightly larger run meets `memory.max` (the OOM killer). Memory only:
/// a CPU-bound job at its `cpu.max` is slowed, not killed.
pub(crate) const UNDERSIZED_ABOVE_PERCENT: u64 = 90;
/// The job name of a row whose runs' job the journals do not name.
pub(crate) const UNKNOWN_JOB: &str = "unknown";

/// What a shape's runs say about its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hint {
    /// Its largest run used under [`OVERSIZED_BELOW_PERCENT`] of the memory and of the CPUs
    /// asked: a smaller shape would do.
    Oversized,
    /// Its largest run's peak memory is over [`UNDERSIZED_ABOVE_PERCENT`] of the memory asked.
    Undersized,
    /// Neither.
    Fits,
    /// Not enough to judge: no peak memory recorded (no memory controller), no memory asked,
    /// or peak memory small but no CPU average (the job's start is not in this journal): never
    /// guessed.
    Unmeasured,
}

impl Hint {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Hint::Oversized => "oversized",
            Hint::Undersized => "undersized",
            Hint::Fits => "fits",
            Hint::Unmeasured => "unmeasured",
        }
    }
}

/// The largest and the median of one measure over the runs that recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spread {
    pub max: u64,
    /// The lower median (nearest rank: the `ceil(n / 2)`-th smallest), a value some run had.
    pub p50: u64,
    /// How many runs recorded it.
    pub runs: usize,
}

/// The [`Spread`] of `values`; `None` when there are none.
fn spread(mut values: Vec<u64>) -> Option<Spread> {
    values.sort_unstable();
    let max = *values.last()?;
    Some(Spread {
        max,
        p50: values[(values.len() - 1) / 2],
        runs: values.len(),
    })
}

/// One row: the runs of one job name in one shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    pub job_name: String,
    /// The shape labels its runs carried (`[]`: the policy's default shape).
    pub labels: Vec<String>,
    pub runs: usize,
    /// What its newest run with a journalled shape asked of the host (the policy as it is now);
    /// `None` when no run journalled one.
    pub asked: Option<AttemptShape>,
    /// Peak memory, bytes.
    pub peak_memory: Option<Spread>,
    /// Average CPUs over the run, in thousandths (`cpu_usec / ran_ms`).
    pub cpu_millis: Option<Spread>,
    pub hint: Hint,
}

/// The report of a policy's runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Report {
    /// By job name, then shape.
    pub rows: Vec<Row>,
    /// The runs counted in the rows.
    pub runs: usize,
    /// Runners that recorded usage but ran no job (an idle runner that expired, a registration
    /// that failed): left out, as they say nothing of any job's size.
    pub without_job: usize,
}

/// The average CPUs of a run, in thousandths: CPU time over wall time (µs over ms is
/// thousandths). `None` without either, or for a run of no measurable length.
fn average_cpu_millis(cpu_usec: Option<u64>, ran_ms: Option<u64>) -> Option<u64> {
    let ran_ms = ran_ms.filter(|ms| *ms > 0)?;
    Some(cpu_usec? / ran_ms)
}

/// `used` is over `percent` of `asked`, exactly (no overflow, no rounding).
fn over(used: u64, asked: u64, percent: u64) -> bool {
    u128::from(used) * 100 > u128::from(asked) * u128::from(percent)
}

/// `used` is under `percent` of `asked`.
fn under(used: u64, asked: u64, percent: u64) -> bool {
    u128::from(used) * 100 < u128::from(asked) * u128::from(percent)
}

/// The hint for a shape that asked `asked`, from its runs' largest peak memory and largest
/// average CPUs (a shape must fit its largest run, so it is oversized only when even that run
/// used under half). Pure.
pub(crate) fn hint(
    asked: Option<&AttemptShape>,
    peak_memory: Option<u64>,
    cpu_millis: Option<u64>,
) -> Hint {
    let (Some(asked), Some(peak)) = (asked, peak_memory) else {
        return Hint::Unmeasured;
    };
    if asked.memory == 0 {
        return Hint::Unmeasured;
    }
    if over(peak, asked.memory, UNDERSIZED_ABOVE_PERCENT) {
        return Hint::Undersized;
    }
    if !under(peak, asked.memory, OVERSIZED_BELOW_PERCENT) {
        return Hint::Fits;
    }
    match cpu_millis {
        Some(used) if asked.cpu_millis > 0 => {
            if under(used, asked.cpu_millis, OVERSIZED_BELOW_PERCENT) {
                Hint::Oversized
            } else {
                Hint::Fits
            }
        }
        // Memory says half would do; whether CPU does too is not known.
        _ => Hint::Unmeasured,
    }
}

/// The shape key of journalled labels: the same labels in any order or case are one shape.
fn shape_key(labels: &[String]) -> String {
    let mut key: Vec<String> = labels.iter().map(|l| l.to_ascii_lowercase()).collect();
    key.sort();
    key.join(",")
}

/// The report of `usages` (oldest first, as the journal reads them). Pure.
pub(crate) fn report(usages: &[ShapeUsage]) -> Report {
    // (job name, shape key) -> that row's runs, oldest first.
    let mut groups: BTreeMap<(String, String), Vec<&ShapeUsage>> = BTreeMap::new();
    let mut without_job = 0;
    for usage in usages {
        if usage.job_id.is_none() {
            without_job += 1;
            continue;
        }
        let name = usage
            .job_name
            .clone()
            .unwrap_or_else(|| UNKNOWN_JOB.to_owned());
        let key = usage
            .shape
            .as_ref()
            .map_or_else(String::new, |s| shape_key(&s.labels));
        groups.entry((name, key)).or_default().push(usage);
    }
    let mut runs = 0;
    let rows = groups
        .into_iter()
        .map(|((job_name, _), group)| {
            runs += group.len();
            let asked = group.iter().rev().find_map(|u| u.shape.clone());
            let peak_memory = spread(group.iter().filter_map(|u| u.peak_memory).collect());
            let cpu_millis = spread(
                group
                    .iter()
                    .filter_map(|u| average_cpu_millis(u.cpu_usec, u.ran_ms))
                    .collect(),
            );
            Row {
                hint: hint(
                    asked.as_ref(),
                    peak_memory.map(|s| s.max),
                    cpu_millis.map(|s| s.max),
                ),
                job_name,
                labels: asked.as_ref().map(|s| s.labels.clone()).unwrap_or_default(),
                runs: group.len(),
                asked,
                peak_memory,
                cpu_millis,
            }
        })
        .collect();
    Report {
        rows,
        runs,
        without_job,
    }
}

/// CPUs in thousandths as a JSON number of CPUs.
fn cpus(millis: u64) -> Value {
    // Thousandths of a CPU are far inside f64's exact integers.
    #[expect(clippy::cast_precision_loss, reason = "CPUs for people and scripts")]
    let cpus = millis as f64 / 1000.0;
    json!(cpus)
}

/// `shapes --json` (CONTRACT §3).
pub(crate) fn to_json(policy: &str, since: UnixMs, report: &Report) -> Value {
    let spread_json = |s: Option<Spread>, value: &dyn Fn(u64) -> Value| {
        s.map(|s| json!({"max": value(s.max), "p50": value(s.p50), "runs": s.runs}))
    };
    json!({
        "policy": policy,
        "since": since.to_rfc3339(),
        "runs": report.runs,
        "without_job": report.without_job,
        "rows": report.rows.iter().map(|r| json!({
            "job_name": r.job_name,
            "labels": r.labels,
            "runs": r.runs,
            "asked": r.asked.as_ref().map(|a| json!({
                "cpu": cpus(a.cpu_millis),
                "memory": a.memory,
                "disk": a.disk,
            })),
            "peak_memory": spread_json(r.peak_memory, &|b| json!(b)),
            "cpu": spread_json(r.cpu_millis, &cpus),
            "hint": r.hint.as_str(),
        })).collect::<Vec<_>>(),
    })
}

/// The text table's header and rows. Pure.
pub(crate) fn table(report: &Report) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let header = vec![
        "JOB",
        "SHAPE",
        "RUNS",
        "ASKED CPU",
        "ASKED MEMORY",
        "ASKED DISK",
        "PEAK MEMORY MAX/P50",
        "CPUS MAX/P50",
        "HINT",
    ];
    let pair = |s: Option<Spread>, show: fn(u64) -> String| {
        s.map_or_else(
            || "-".to_owned(),
            |s| format!("{}/{}", show(s.max), show(s.p50)),
        )
    };
    let asked = |r: &Row, show: fn(&AttemptShape) -> String| {
        r.asked.as_ref().map_or_else(|| "-".to_owned(), show)
    };
    let rows = report
        .rows
        .iter()
        .map(|r| {
            vec![
                r.job_name.clone(),
                if r.labels.is_empty() {
                    "(default)".to_owned()
                } else {
                    r.labels.join(",")
                },
                r.runs.to_string(),
                asked(r, |a| format_cpu(a.cpu_millis)),
                asked(r, |a| format_size(a.memory)),
                asked(r, |a| format_size(a.disk)),
                pair(r.peak_memory, crate::fitness::bytes),
                pair(r.cpu_millis, format_cpu),
                r.hint.as_str().to_owned(),
            ]
        })
        .collect();
    (header, rows)
}

/// Exit 2 naming the configured policies when `policy` is not one of them.
pub(crate) fn known_policy(config: &Config, policy: &str) -> Result<(), Exit> {
    if config.policies.iter().any(|p| p.name == policy) {
        return Ok(());
    }
    let names: Vec<&str> = config.policies.iter().map(|p| p.name.as_str()).collect();
    Err(Exit::usage(if names.is_empty() {
        format!("no policy `{policy}`: the configuration has no [[policy]]")
    } else {
        format!(
            "no policy `{policy}` in the configuration; its policies are: {}",
            names.join(", ")
        )
    }))
}

/// Names the runs' jobs from the fleet's journal, where a fleet's jobs are (this host's file has
/// none of them): each job looked up once; a job it does not have stays unnamed.
fn name_from_fleet(store: &rm_journal::Store, usages: &mut [ShapeUsage]) -> Result<(), Exit> {
    let mut jobs = store
        .jobs()
        .map_err(|e| super::journal_failed(store, "read", e))?;
    let mut names: HashMap<JobId, Option<String>> = HashMap::new();
    for usage in usages.iter_mut().filter(|u| u.job_name.is_none()) {
        let Some(job_id) = usage.job_id else {
            continue;
        };
        let name = match names.entry(job_id) {
            Entry::Occupied(known) => known.get().clone(),
            Entry::Vacant(unknown) => {
                let row = jobs
                    .job(job_id)
                    .map_err(|e| super::journal_failed(store, "read", e))?;
                unknown.insert(row.and_then(|r| r.job_name)).clone()
            }
        };
        usage.job_name = name;
    }
    Ok(())
}

/// `rm-agent shapes --policy P --since D`.
pub fn run(config: &Config, policy: &str, since: Duration, json: bool) -> Result<(), Exit> {
    known_policy(config, policy)?;
    let from = UnixMs::from_system_time(
        SystemTime::now()
            .checked_sub(since)
            .unwrap_or(SystemTime::UNIX_EPOCH),
    );
    let mut usages = match super::open_local_reader(config)? {
        Some(reader) => reader.shape_usage(policy, from).map_err(Exit::runtime)?,
        None => Vec::new(),
    };
    let store = super::store(config);
    if store.is_shared() && !usages.is_empty() {
        name_from_fleet(&store, &mut usages)?;
    }
    let report = report(&usages);
    if json {
        print_json(&to_json(policy, from, &report));
        return Ok(());
    }
    crate::outln!(
        "# {} run(s) of policy {policy} on this host since {}{}",
        report.runs,
        humantime::format_duration(since),
        if report.without_job > 0 {
            format!(
                "; {} runner(s) that ran no job left out",
                report.without_job
            )
        } else {
            String::new()
        }
    );
    let (header, rows) = table(&report);
    print_table(&header, &rows);
    crate::outln!(
        "# oversized: the largest run's peak memory and average CPUs both under {OVERSIZED_BELOW_PERCENT}% of what was asked; undersized: its peak memory over {UNDERSIZED_ABOVE_PERCENT}% of the memory asked"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use rm_journal::AttemptId;

    use super::*;

    const GIB: u64 = 1 << 30;

    fn shape(labels: &[&str], cpu_millis: u64, memory: u64) -> AttemptShape {
        AttemptShape {
            labels: labels.iter().map(|l| (*l).to_owned()).collect(),
            cpu_millis,
            memory,
            disk: 20 * GIB,
            devices: vec![],
        }
    }

    /// One run of job `job` (`None`: the journals do not name it) that asked `shape` and peaked
    /// at `peak` bytes, using `cpu_usec` of CPU over `ran_ms`.
    fn usage(
        job: Option<&str>,
        shape: Option<AttemptShape>,
        peak: Option<u64>,
        cpu_usec: Option<u64>,
        ran_ms: Option<u64>,
    ) -> ShapeUsage {
        ShapeUsage {
            attempt_id: AttemptId::generate(),
            job_id: Some(JobId::new(7)),
            job_name: job.map(str::to_owned),
            shape,
            peak_memory: peak,
            cpu_usec,
            ran_ms,
        }
    }

    #[test]
    fn the_hint_follows_the_documented_rule() {
        let asked = shape(&["rm-cpu=4"], 4000, 8 * GIB);
        let cases = [
            // Under half of both: oversized.
            (Some(3 * GIB), Some(1999), Hint::Oversized),
            // Exactly half is not under half.
            (Some(4 * GIB), Some(1000), Hint::Fits),
            (Some(3 * GIB), Some(2000), Hint::Fits),
            // Memory under half but CPU busy: fits.
            (Some(GIB), Some(3900), Hint::Fits),
            // Over 90 % of the memory asked: undersized, whatever the CPU.
            (Some(8 * GIB - 1), Some(100), Hint::Undersized),
            (Some(9 * GIB), None, Hint::Undersized),
            // Not measured: never guessed.
            (None, Some(100), Hint::Unmeasured),
            (Some(GIB), None, Hint::Unmeasured),
            // Between the two with no CPU average: memory alone decides it fits.
            (Some(6 * GIB), None, Hint::Fits),
        ];
        for (peak, cpu, expected) in cases {
            assert_eq!(hint(Some(&asked), peak, cpu), expected, "{peak:?} {cpu:?}");
        }
        // Exactly 90 % is not over it; a byte more is.
        let ten = shape(&[], 4000, 10 * GIB);
        assert_eq!(hint(Some(&ten), Some(9 * GIB), Some(100)), Hint::Fits);
        assert_eq!(
            hint(Some(&ten), Some(9 * GIB + 1), Some(100)),
            Hint::Undersized
        );
        assert_eq!(hint(None, Some(GIB), Some(1)), Hint::Unmeasured);
        assert_eq!(
            hint(Some(&shape(&[], 4000, 0)), Some(GIB), Some(1)),
            Hint::Unmeasured
        );
        // Nothing of CPU asked (an unbounded host): the CPU half cannot be judged.
        assert_eq!(
            hint(Some(&shape(&[], 0, 8 * GIB)), Some(GIB), Some(1)),
            Hint::Unmeasured
        );
    }

    #[test]
    fn p50_is_the_lower_median_and_max_the_largest() {
        for (values, expected) in [
            (vec![5], Some((5, 5, 1))),
            (vec![4, 1, 3, 2], Some((4, 2, 4))),
            (vec![9, 1, 5], Some((9, 5, 3))),
            (vec![], None),
        ] {
            assert_eq!(
                spread(values.clone()).map(|s| (s.max, s.p50, s.runs)),
                expected,
                "{values:?}"
            );
        }
    }

    #[test]
    fn the_report_sets_each_job_and_shape_asked_against_used() {
        let large = || Some(shape(&["rm-shape=large"], 8000, 32 * GIB));
        let small = || Some(shape(&["rm-cpu=2", "rm-mem=4g"], 2000, 4 * GIB));
        let usages = [
            // build in the large shape: three runs, at most 6 GiB and 2 CPUs of 8.
            usage(
                Some("build"),
                large(),
                Some(6 * GIB),
                Some(120_000_000),
                Some(60_000),
            ),
            usage(
                Some("build"),
                large(),
                Some(2 * GIB),
                Some(30_000_000),
                Some(60_000),
            ),
            usage(
                Some("build"),
                large(),
                Some(4 * GIB),
                Some(60_000_000),
                Some(60_000),
            ),
            // build in a small shape (labels in another order and case: the same shape),
            // near its memory bound.
            usage(
                Some("build"),
                small(),
                Some(3 * GIB),
                Some(60_000_000),
                Some(60_000),
            ),
            usage(
                Some("build"),
                Some(shape(&["RM-MEM=4g", "rm-cpu=2"], 2000, 4 * GIB)),
                Some(4 * GIB - GIB / 4),
                None,
                None,
            ),
            // A job the journals do not name, without a memory controller.
            usage(None, small(), None, Some(1_000_000), Some(1_000)),
            // A runner that ran no job.
            ShapeUsage {
                job_id: None,
                ..usage(None, large(), Some(GIB), None, None)
            },
        ];
        let report = report(&usages);
        assert_eq!((report.runs, report.without_job), (6, 1));
        let rows: Vec<_> = report
            .rows
            .iter()
            .map(|r| {
                (
                    r.job_name.as_str(),
                    r.labels.join(","),
                    r.runs,
                    r.peak_memory.map(|s| (s.max, s.p50)),
                    r.cpu_millis.map(|s| (s.max, s.p50, s.runs)),
                    r.hint,
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                (
                    "build",
                    "RM-MEM=4g,rm-cpu=2".to_owned(),
                    2,
                    Some((4 * GIB - GIB / 4, 3 * GIB)),
                    // The run without a start time has no CPU average.
                    Some((1000, 1000, 1)),
                    Hint::Undersized,
                ),
                (
                    "build",
                    "rm-shape=large".to_owned(),
                    3,
                    Some((6 * GIB, 4 * GIB)),
                    // 120 s of CPU over 60 s is 2 CPUs.
                    Some((2000, 1000, 3)),
                    Hint::Oversized,
                ),
                (
                    "unknown",
                    "rm-cpu=2,rm-mem=4g".to_owned(),
                    1,
                    None,
                    Some((1000, 1000, 1)),
                    Hint::Unmeasured,
                ),
            ]
        );
        // What was asked is the newest run's shape.
        assert_eq!(
            report.rows[0].asked.as_ref().unwrap().labels[0],
            "RM-MEM=4g"
        );
        assert_eq!(report.rows[1].asked, large());
        assert_eq!(super::report(&[]), Report::default());
    }

    #[test]
    fn the_json_and_the_table_say_asked_used_and_the_hint() {
        let usages = [
            usage(
                Some("lint"),
                Some(shape(&[], 1500, 4 * GIB)),
                Some(GIB),
                Some(30_000_000),
                Some(60_000),
            ),
            usage(Some("e2e"), None, Some(GIB), None, None),
        ];
        let report = report(&usages);
        let value = to_json("build", UnixMs::new(1_700_000_000_000), &report);
        assert_eq!(value["policy"], "build");
        assert_eq!(value["since"], "2023-11-14T22:13:20.000Z");
        assert_eq!(
            (value["runs"].clone(), value["without_job"].clone()),
            (json!(2), json!(0))
        );
        assert_eq!(
            value["rows"][1],
            json!({
                "job_name": "lint",
                "labels": [],
                "runs": 1,
                "asked": {"cpu": 1.5, "memory": 4 * GIB, "disk": 20 * GIB},
                "peak_memory": {"max": GIB, "p50": GIB, "runs": 1},
                "cpu": {"max": 0.5, "p50": 0.5, "runs": 1},
                "hint": "oversized",
            })
        );
        // A run journalled without a shape: nothing asked, nothing judged.
        assert_eq!(value["rows"][0]["asked"], Value::Null);
        assert_eq!(value["rows"][0]["cpu"], Value::Null);
        assert_eq!(value["rows"][0]["hint"], "unmeasured");

        let (header, rows) = table(&report);
        assert_eq!(header.len(), rows[0].len());
        assert_eq!(
            rows[1],
            [
                "lint",
                "(default)",
                "1",
                "1.5",
                "4G",
                "20G",
                "1.0 GiB/1.0 GiB",
                "0.5/0.5",
                "oversized"
            ]
        );
        assert_eq!(rows[0][3..6], ["-", "-", "-"]);
    }

    #[test]
    fn an_unknown_policy_is_a_usage_error_naming_the_policies() {
        let config = crate::config::from_text(
            "[[policy]]\nname = \"build\"\ntarget = \"acme\"\nlabels = [\"self-hosted\"]\n[[policy]]\nname = \"gpu\"\ntarget = \"acme\"\nlabels = [\"gpu\"]\n",
        )
        .unwrap();
        assert!(known_policy(&config, "build").is_ok());
        let refused = known_policy(&config, "biuld").unwrap_err();
        assert_eq!(refused.code, crate::exit::USAGE);
        assert!(
            refused.message.contains("no policy `biuld`") && refused.message.contains("build, gpu"),
            "{}",
            refused.message
        );
    }
}
