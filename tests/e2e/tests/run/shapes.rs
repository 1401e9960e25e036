//! Shapes, host capacity and devices (issue 42) through `rm-agent run`, the fake GitHub and the
//! fake runner package.
//!
//! - Two jobs of different shapes (`rm-cpu`/`rm-mem` labels, and a named shape) each get a
//!   runner whose JIT registration carries the policy's labels plus exactly that job's `rm-`
//!   labels, whose private `/tmp` is sized from the shape's memory (half of it), and, where the
//!   runner cgroups' cgroup v2 offers the memory and cpu controllers, whose `memory.max` and
//!   `cpu.max` are the shape's (a recorded skip of that part elsewhere).
//! - A `shape_max` beyond `host.capacity` stops the agent at start (exit 2) with the fix; the
//!   same file within the host starts. A job over `shape_max`, one with an unreadable shape label
//!   and one asking for a device the host has none of are each named by `explain` and never get
//!   a runner, while a job within bounds queued after them does.
//! - Two device nodes the test makes (`/dev/null` clones) as two `[[host.device]]` of group
//!   `gpu`, three jobs asking `rm-gpu=1`: two run at once, each seeing and opening only its own
//!   node; the third waits (`waiting_for_device`); the agent SIGKILLed while both run and started
//!   again: no device ever has two holders, the third runs on a device freed by a cleaned
//!   attempt, and nothing is left. The control: an isolated runner on a host without devices
//!   sees and opens both nodes.
//!
//! The jobs are the package's `bin/Runner.Listener`, wrapped (`Fleet::wrap_listener`): a POSIX
//! sh script, run as the runner's uid in its namespaces, that writes what it sees to a report
//! named after its runtime and then `exec`s the real fake listener.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rm_e2e::fleet::{Fleet, FleetOptions, PolicySpec, REPO, reason_codes, wait_until};
use rm_fake_github::RunnerBehavior;
use rm_journal::{AttemptRecord, AttemptState, Reader};

use crate::isolation::base_dir;
use crate::skip;

/// The labels that pick every policy of these tests.
const LABELS: &[&str] = &["self-hosted", "linux"];

/// A MiB, in bytes.
const MIB: u64 = 1 << 20;

/// How long the tests wait for anything the agent does (runners start in their own namespaces
/// on a busy two-core machine): generous, never a measure.
const PATIENCE: Duration = Duration::from_secs(120);

/// `runner.idle_timeout` of the fleets that start runners: demand is advisory (a runner started
/// for a job another runner took is a surplus, stopped at its idle timeout), short here so the
/// tests can see every attempt cleaned.
const IDLE_TIMEOUT: &str = "5s";

/// The shaped policy of the first two tests: sizes up to 2 CPUs and 1 GiB, and a named shape
/// `small` (half a CPU, 256 MiB). The `[[policy.shape]]` table ends the policy.
const SHAPED: &str = "shape_max = { cpu = 2, memory = \"1G\" }\n\n[[policy.shape]]\nname = \"small\"\ncpu = 0.5\nmemory = \"256M\"\n";

/// What the host offers shapes: the shaped policy's `shape_max` fits (a machine's own size
/// less its reserve may not, on a two-core test machine).
const CAPACITY: &str = "capacity = { cpu = 2, memory = \"4G\" }\n";

/// The job of the first test: what its `/tmp` is, from its own mount table.
const TMP_SCRIPT: &str = r#"#!/bin/sh
HERE=$(cd "$(dirname "$0")/.." 2>/dev/null && pwd -P)
OUT='@REPORT@'/"${HERE##*/}.txt"
# The last mount on /tmp is the one the job sees.
echo "tmp_mount=$(awk '$5 == "/tmp"' /proc/self/mountinfo | tail -n 1)" >"$OUT" 2>&1
exec "$HERE/bin/Runner.Listener.real" "$@"
"#;

/// The job of the device test: which nodes of the test's device directory it sees, and whether
/// it can open each (read and write) by its host path.
const DEVICE_SCRIPT: &str = r#"#!/bin/sh
HERE=$(cd "$(dirname "$0")/.." 2>/dev/null && pwd -P)
OUT='@REPORT@'/"${HERE##*/}.txt"
DIR='@DIR@'
{
    echo "seen=$(ls -A "$DIR" 2>/dev/null | sort | tr '\n' ' ')"
    for n in @NODES@; do
        if ( : <>"$DIR/$n" ) 2>/dev/null; then echo "open_$n=ok"; else echo "open_$n=denied"; fi
    done
} >"$OUT" 2>&1
exec "$HERE/bin/Runner.Listener.real" "$@"
"#;

/// A policy of `LABELS` with `extra` appended (its shapes).
fn policy(name: &'static str, extra: &'static str) -> PolicySpec {
    PolicySpec {
        name,
        target: REPO,
        labels: LABELS,
        max_runners: 4,
        workspace: "ephemeral",
        extra,
    }
}

/// `LABELS` and `more`.
fn labels_with<'a>(more: &[&'a str]) -> Vec<&'a str> {
    LABELS.iter().copied().chain(more.iter().copied()).collect()
}

/// The report the job of `attempt` wrote: its `key=value` lines.
fn report_of(reports: &Path, attempt: &AttemptRecord) -> BTreeMap<String, String> {
    let name = attempt.runtime_dir.file_name().unwrap().to_str().unwrap();
    let path = reports.join(format!("{name}.txt"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "the job of attempt {} wrote no report {}: {e}",
            attempt.attempt_id.as_str(),
            path.display()
        )
    });
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect()
}

/// The `size=` of a mountinfo line's tmpfs, in bytes (the kernel writes it in KiB: `size=262144k`).
fn tmpfs_size(mount: &str) -> Option<u64> {
    let (_, right) = mount.split_once(" - ")?;
    let mut fields = right.split_whitespace();
    if fields.next()? != "tmpfs" {
        return None;
    }
    let options = fields.nth(1)?;
    let kib = options
        .split(',')
        .find_map(|o| o.strip_prefix("size="))?
        .strip_suffix('k')?;
    kib.parse::<u64>().ok().map(|k| k * 1024)
}

/// A JIT registration's labels, by the runner name it registered.
fn jit_labels(fleet: &Fleet) -> HashMap<String, Vec<String>> {
    fleet
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/generate-jitconfig"))
        .filter_map(|r| {
            let body = r.body?;
            let name = body["name"].as_str()?.to_owned();
            let labels = body["labels"]
                .as_array()?
                .iter()
                .filter_map(|l| l.as_str().map(str::to_owned))
                .collect();
            Some((name, labels))
        })
        .collect()
}

/// `rm-agent explain JOB --json` as JSON, whatever its exit status (a job the journal has not
/// seen yet exits 1 with an answer too); `Null` when stdout is no JSON.
fn explain(fleet: &Fleet, job: u64) -> serde_json::Value {
    let out = fleet.setup.run(&["explain", &job.to_string(), "--json"]);
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

/// Sorted, for comparing label sets.
fn sorted(mut labels: Vec<String>) -> Vec<String> {
    labels.sort();
    labels
}

/// Which of the memory and cpu controllers the runner cgroups' cgroup v2 offers, found as the
/// agent finds it.
fn controllers() -> rm_runner::cgroup::Controllers {
    rm_runner::cgroup::CgroupRoot::resolve(None)
        .map(|root| root.available())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shapes_reach_their_runners_and_their_registrations() {
    let test = "shapes::two_shapes_reach_their_runners_and_their_registrations";
    // The cgroup files are checked where their controller exists; elsewhere that part alone is
    // skipped (and the skip recorded), the labels and the tmpfs are checked everywhere.
    let available = controllers();
    if !available.memory {
        skip::cannot_run(
            &format!("{test}::memory.max"),
            "memory-controller",
            "the runner cgroups' cgroup v2 offers no memory controller here",
        );
    }
    if !available.cpu {
        skip::cannot_run(
            &format!("{test}::cpu.max"),
            "cpu-controller",
            "the runner cgroups' cgroup v2 offers no cpu controller here",
        );
    }
    let fleet = Fleet::start(FleetOptions {
        policies: vec![policy("shaped", SHAPED)],
        isolation: Some("user"),
        host_extra: CAPACITY.to_owned(),
        base_dir: Some(base_dir()),
        idle_timeout: IDLE_TIMEOUT,
        ..FleetOptions::default()
    })
    .await;
    let reports = fleet.reports_dir();
    fleet.wrap_listener(&TMP_SCRIPT.replace("@REPORT@", &reports.display().to_string()));
    // Long enough to read a busy runner's cgroup files from the host.
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 3_000,
        ..RunnerBehavior::default()
    });
    let _agent = fleet.start_agent(&[]).await;
    let sized = fleet
        .fake
        .queue_job(REPO, "sized", &labels_with(&["rm-cpu=1", "rm-mem=512m"]))
        .unwrap();
    let named = fleet
        .fake
        .queue_job(REPO, "named", &labels_with(&["rm-shape=small"]))
        .unwrap();

    // What each busy runner's cgroup says, read from the host while it runs.
    let mut cgroup_files: HashMap<String, (Option<String>, Option<String>)> = HashMap::new();
    wait_until(
        PATIENCE,
        "both jobs completed, every attempt cleaned",
        || {
            for a in fleet.attempts() {
                if a.state != AttemptState::Busy {
                    continue;
                }
                if let Some(dir) = &a.cgroup {
                    let read = |f: &str| {
                        std::fs::read_to_string(dir.join(f))
                            .ok()
                            .map(|t| t.trim().to_owned())
                    };
                    let entry = cgroup_files
                        .entry(a.attempt_id.as_str().to_owned())
                        .or_default();
                    entry.0 = read("memory.max").or(entry.0.take());
                    entry.1 = read("cpu.max").or(entry.1.take());
                }
            }
            fleet.completed(sized) && fleet.completed(named) && fleet.all_cleaned()
        },
    )
    .await;

    // (shape labels, CPU millis, memory bytes) each job's runner must have had.
    let expected: HashMap<u64, (Vec<&str>, u64, u64)> = HashMap::from([
        (sized, (vec!["rm-cpu=1", "rm-mem=512m"], 1_000, 512 * MIB)),
        (named, (vec!["rm-shape=small"], 500, 256 * MIB)),
    ]);
    let registrations = jit_labels(&fleet);
    let served: Vec<AttemptRecord> = fleet
        .attempts()
        .into_iter()
        .filter(|a| a.job_id.is_some())
        .collect();
    assert_eq!(served.len(), 2, "one runner per job: {served:?}");
    // A surplus (a runner started for a job another runner took) ran nothing and says so.
    for a in fleet.attempts().iter().filter(|a| a.job_id.is_none()) {
        eprintln!(
            "surplus runner {} of shape {:?}: {:?}",
            a.runner_name,
            a.shape.as_ref().map(|s| &s.labels),
            a.outcome
        );
    }
    for a in &served {
        let job = u64::try_from(a.job_id.unwrap().get()).unwrap();
        let (shape_labels, cpu_millis, memory) = &expected[&job];
        let who = format!("the runner {} of job {job}", a.runner_name);
        // The journal's shape is the job's.
        let shape = a
            .shape
            .as_ref()
            .unwrap_or_else(|| panic!("{who}: no shape"));
        assert_eq!(shape.labels, *shape_labels, "{who}: {shape:?}");
        assert_eq!(shape.cpu_millis, *cpu_millis, "{who}: {shape:?}");
        assert_eq!(shape.memory, *memory, "{who}: {shape:?}");
        // GitHub routed the job to the runner registered with exactly its labels.
        let registered = registrations
            .get(&a.runner_name)
            .unwrap_or_else(|| panic!("{who}: no JIT registration in {registrations:?}"));
        let want: Vec<String> = labels_with(shape_labels)
            .iter()
            .map(|l| (*l).to_owned())
            .collect();
        assert_eq!(sorted(registered.clone()), sorted(want), "{who}");
        assert_eq!(
            fleet.fake.job(job).unwrap().runner_name.as_deref(),
            Some(a.runner_name.as_str()),
            "{who}: GitHub gave the job to another runner"
        );
        // Its private /tmp is half the shape's memory.
        let report = report_of(&reports, a);
        let mount = report.get("tmp_mount").cloned().unwrap_or_default();
        assert_eq!(
            tmpfs_size(&mount),
            Some(memory / 2),
            "{who}: its /tmp is not half of {memory} bytes: {mount}"
        );
        let (memory_max, cpu_max) = cgroup_files
            .get(a.attempt_id.as_str())
            .cloned()
            .unwrap_or_default();
        if available.memory {
            assert_eq!(memory_max, Some(memory.to_string()), "{who}: memory.max");
        }
        if available.cpu {
            assert_eq!(
                cpu_max,
                Some(rm_runner::cgroup::cpu_max_value(*cpu_millis)),
                "{who}: cpu.max"
            );
        }
    }
    let ran: Vec<u64> = served
        .iter()
        .map(|a| u64::try_from(a.job_id.unwrap().get()).unwrap())
        .collect();
    assert!(
        ran.contains(&sized) && ran.contains(&named),
        "each job by its own runner: {ran:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shape_larger_than_the_host_is_refused_with_the_fix() {
    // (a) A shape_max no runner of this host could ever have: refused at start, with the fix.
    let mut fleet = Fleet::start(FleetOptions {
        policies: vec![policy("shaped", "shape_max = { cpu = 8 }\n")],
        host_extra: "capacity = { cpu = 2 }\n".to_owned(),
        idle_timeout: IDLE_TIMEOUT,
        ..FleetOptions::default()
    })
    .await;
    let (status, stderr) = fleet.run_agent_until_exit(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    for said in [
        "shape_max.cpu",
        "host.capacity.cpu",
        "lower shape_max.cpu to 2",
    ] {
        assert!(
            stderr.contains(said),
            "the refusal does not say {said:?}: {stderr}"
        );
    }
    // The control: the same file with shape_max within the host starts.
    fleet.options.policies = vec![policy("shaped", "shape_max = { cpu = 2 }\n")];
    fleet.configure(&fleet.options.clone());
    let _agent = fleet.start_agent(&[]).await;

    // (b) Jobs whose shape the policy refuses, or the host could never fit: named by explain,
    // never a runner. Each `(job, verdict, reason code, what the reason names)`.
    let over = fleet
        .fake
        .queue_job(REPO, "over", &labels_with(&["rm-cpu=4"]))
        .unwrap();
    let unreadable = fleet
        .fake
        .queue_job(REPO, "unreadable", &labels_with(&["rm-memory=8g"]))
        .unwrap();
    let no_device = fleet
        .fake
        .queue_job(REPO, "no device", &labels_with(&["rm-gpu=1"]))
        .unwrap();
    let refused = [
        (over, "shape_refused", "shape_refused", "shape_max.cpu (2)"),
        (unreadable, "shape_refused", "shape_refused", "rm-memory=8g"),
        (no_device, "shape_refused", "shape_exceeds_host", "gpu"),
    ];
    for (job, verdict, code, names) in refused {
        let mut last = serde_json::Value::Null;
        wait_until(PATIENCE, &format!("explain {job} says {code}"), || {
            last = explain(&fleet, job);
            last["verdict"] == verdict
                && reason_codes(&last).first().map(String::as_str) == Some(code)
        })
        .await;
        let message = last["reasons"][0]["message"].as_str().unwrap_or_default();
        assert!(message.contains(names), "job {job}: {last}");
    }
    // A job within bounds, queued after them, is served: the allocation passes that served it
    // weighed the refused jobs too, and started nothing for them.
    let within = fleet
        .fake
        .queue_job(REPO, "within", &labels_with(&["rm-cpu=1"]))
        .unwrap();
    wait_until(
        PATIENCE,
        "the job within bounds served, attempts cleaned",
        || fleet.completed(within) && fleet.all_cleaned(),
    )
    .await;
    // Every runner was of the job within bounds' shape: none for a refused job.
    let shapes: Vec<(String, Option<Vec<String>>, Option<i64>)> = fleet
        .attempts()
        .iter()
        .map(|a| {
            (
                a.runner_name.clone(),
                a.shape.as_ref().map(|s| s.labels.clone()),
                a.job_id.map(|j| j.get()),
            )
        })
        .collect();
    assert!(
        shapes
            .iter()
            .all(|(_, labels, _)| labels.as_deref() == Some(&["rm-cpu=1".to_owned()][..])),
        "a runner of another shape: {shapes:?}"
    );
    let want = sorted(
        labels_with(&["rm-cpu=1"])
            .iter()
            .map(|l| (*l).to_owned())
            .collect(),
    );
    for (name, labels) in jit_labels(&fleet) {
        assert_eq!(sorted(labels), want, "the registration of {name}");
    }
    for (job, verdict, code, _) in refused {
        let answer = fleet.explain(job);
        assert_eq!(
            answer["verdict"], verdict,
            "job {job} after the others: {answer}"
        );
        assert_eq!(reason_codes(&answer)[0], code, "{answer}");
        assert_eq!(
            fleet.fake.job(job).unwrap().status,
            rm_fake_github::JobStatus::Queued,
            "job {job}"
        );
    }
}

/// Device nodes the test makes under `/dev/rm-e2e-<pid>/` (character devices 1:3, as
/// `/dev/null`, mode 0666), removed with the directory when dropped.
struct DeviceNodes {
    dir: PathBuf,
    names: Vec<String>,
}

impl DeviceNodes {
    fn make(names: &[&str]) -> DeviceNodes {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = PathBuf::from(format!("/dev/rm-e2e-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let nodes = DeviceNodes {
            dir,
            names: names.iter().map(|n| (*n).to_owned()).collect(),
        };
        for path in nodes.paths() {
            mknod_null_clone(&path);
            // The umask took bits off the mode.
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        }
        nodes
    }

    fn paths(&self) -> Vec<PathBuf> {
        self.names.iter().map(|n| self.dir.join(n)).collect()
    }

    /// `[[host.device]]` of group `gpu`, one per node.
    fn host_devices(&self) -> String {
        self.paths()
            .iter()
            .map(|p| {
                format!(
                    "\n[[host.device]]\ngroup = \"gpu\"\nnodes = [\"{}\"]\n",
                    p.display()
                )
            })
            .collect()
    }

    /// [`DEVICE_SCRIPT`] writing to `reports`.
    fn script(&self, reports: &Path) -> String {
        DEVICE_SCRIPT
            .replace("@REPORT@", &reports.display().to_string())
            .replace("@DIR@", &self.dir.display().to_string())
            .replace("@NODES@", &self.names.join(" "))
    }
}

/// Makes `path` a character device of `/dev/null`'s number (1:3).
#[allow(unsafe_code)]
fn mknod_null_clone(path: &Path) {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mknod of a NUL-terminated path this test owns.
    let made = unsafe { libc::mknod(c_path.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    assert_eq!(
        made,
        0,
        "mknod {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

impl Drop for DeviceNodes {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What the journal says of device holds, sampled while the agents run: every sample must show
/// each device held by at most one attempt not yet released, and no hold of an attempt already
/// released.
#[derive(Default)]
struct HoldWatch {
    violations: Vec<String>,
    /// The most attempts busy at once in one sample.
    most_busy: usize,
}

impl HoldWatch {
    fn sample(&mut self, fleet: &Fleet) {
        let Ok(reader) = Reader::open(&fleet.setup.journal()) else {
            return;
        };
        // Attempts first, then holds: an attempt released in between has no hold left, and a
        // hold of an attempt made in between names an attempt this sample does not know.
        let Ok(attempts) = reader.attempts(10_000) else {
            return;
        };
        let Ok(holds) = reader.held_devices() else {
            return;
        };
        self.most_busy = self.most_busy.max(
            attempts
                .iter()
                .filter(|a| a.state == AttemptState::Busy)
                .count(),
        );
        let mut holders: HashMap<&str, Vec<&str>> = HashMap::new();
        for a in attempts.iter().filter(|a| unreleased(a)) {
            for device in a.shape.iter().flat_map(|s| &s.devices) {
                holders
                    .entry(device.as_str())
                    .or_default()
                    .push(a.attempt_id.short());
            }
        }
        for (device, by) in holders {
            if by.len() > 1 {
                self.violations
                    .push(format!("{device} held by {by:?} at once"));
            }
        }
        for (device, holder) in &holds {
            if let Some(a) = attempts.iter().find(|a| a.attempt_id == *holder)
                && !unreleased(a)
            {
                self.violations.push(format!(
                    "{device} still held by {} ({})",
                    holder.short(),
                    a.state.as_str()
                ));
            }
        }
    }
}

/// Whether `a` still holds what it took: neither released nor cleaned.
fn unreleased(a: &AttemptRecord) -> bool {
    a.released_at_ms.is_none() && a.state != AttemptState::Cleaned
}

/// When `a` gave its devices back (its release; a cleaned attempt without one: when it was
/// cleaned); `None` while it holds them.
fn freed_at(a: &AttemptRecord) -> Option<i64> {
    a.released_at_ms
        .map(|t| t.get())
        .or_else(|| (a.state == AttemptState::Cleaned).then(|| a.state_changed_at_ms.get()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_are_handed_out_one_job_at_a_time_and_survive_an_agent_crash() {
    let nodes = DeviceNodes::make(&["gpu0", "gpu1"]);
    let [gpu0, gpu1] = [nodes.paths()[0].clone(), nodes.paths()[1].clone()];

    // The control: on a host without devices, an isolated runner sees the host's /dev, both
    // nodes among it, and opens them: what the private /dev takes away below.
    {
        let control = Fleet::start(FleetOptions {
            policies: vec![policy("plain", "")],
            isolation: Some("user"),
            idle_timeout: IDLE_TIMEOUT,
            base_dir: Some(base_dir()),
            ..FleetOptions::default()
        })
        .await;
        let reports = control.reports_dir();
        control.wrap_listener(&nodes.script(&reports));
        let _agent = control.start_agent(&[]).await;
        let job = control.fake.queue_job(REPO, "plain", LABELS).unwrap();
        wait_until(PATIENCE, "the control job served and cleaned", || {
            control.completed(job) && control.all_cleaned()
        })
        .await;
        let attempts = control.attempts();
        let report = report_of(&reports, &attempts[0]);
        assert_eq!(report["seen"], "gpu0 gpu1", "control: {report:?}");
        assert_eq!(report["open_gpu0"], "ok", "control: {report:?}");
        assert_eq!(report["open_gpu1"], "ok", "control: {report:?}");
    }

    let fleet = Fleet::start(FleetOptions {
        policies: vec![policy("gpu", "shape_max = { gpu = 1 }\n")],
        isolation: Some("user"),
        base_dir: Some(base_dir()),
        tail: nodes.host_devices(),
        idle_timeout: IDLE_TIMEOUT,
        ..FleetOptions::default()
    })
    .await;
    let reports = fleet.reports_dir();
    fleet.wrap_listener(&nodes.script(&reports));
    // Long enough for both to run while the test explains, kills and restarts the agent.
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 10_000,
        ..RunnerBehavior::default()
    });
    let agent = fleet.start_agent(&[]).await;
    let gpu = labels_with(&["rm-gpu=1"]);
    let jobs: Vec<u64> = ["one", "two", "three"]
        .iter()
        .map(|name| fleet.fake.queue_job(REPO, name, &gpu).unwrap())
        .collect();
    let mut watch = HoldWatch::default();

    // Two run at once, each known to have taken its job.
    let mut busy: Vec<u64> = Vec::new();
    wait_until(PATIENCE, "two runners busy at once with their jobs", || {
        watch.sample(&fleet);
        busy = fleet
            .attempts()
            .iter()
            .filter(|a| a.state == AttemptState::Busy)
            .filter_map(|a| a.job_id.map(|j| u64::try_from(j.get()).unwrap()))
            .collect();
        busy.len() >= 2
    })
    .await;
    assert!(watch.most_busy >= 2);
    let waiting: Vec<u64> = jobs.iter().copied().filter(|j| !busy.contains(j)).collect();
    assert_eq!(waiting.len(), 1, "busy {busy:?} of {jobs:?}");
    let third = waiting[0];
    // The third waits for a device.
    let mut answer = serde_json::Value::Null;
    wait_until(
        Duration::from_secs(30),
        "explain says waiting_for_device",
        || {
            watch.sample(&fleet);
            answer = explain(&fleet, third);
            answer["verdict"] == "at_capacity"
                && reason_codes(&answer).first().map(String::as_str) == Some("waiting_for_device")
        },
    )
    .await;
    // `status` names both devices held, by the two busy runners, and none free.
    let status = rm_e2e::json_stdout(&fleet.setup.run(&["status", "--json"]));
    let gpu = &status["capacity"]["devices"][0];
    assert_eq!(
        (
            gpu["group"].as_str(),
            gpu["total"].as_u64(),
            gpu["held"].as_u64(),
            gpu["free"].as_u64()
        ),
        (Some("gpu"), Some(2), Some(2), Some(0)),
        "{status}"
    );
    let holders: Vec<&str> = gpu["holders"]
        .as_array()
        .map(|h| h.iter().filter_map(|h| h["runner"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(holders.len(), 2, "{status}");
    // SIGKILL while both still run, then a fresh agent on the same journal.
    assert!(
        busy.iter().all(|j| !fleet.completed(*j)),
        "a job ended before the kill: make the jobs longer"
    );
    agent.kill();
    watch.sample(&fleet);
    let _second = fleet.start_agent(&[]).await;
    wait_until(
        PATIENCE,
        "every job completed, every attempt cleaned",
        || {
            watch.sample(&fleet);
            jobs.iter().all(|j| fleet.completed(*j)) && fleet.all_cleaned()
        },
    )
    .await;
    assert!(watch.violations.is_empty(), "{:?}", watch.violations);

    // Each attempt held one device, and the journal's hold intervals of one device never
    // overlap: the third took its device only after the one before it gave it back.
    let attempts = fleet.attempts();
    let mut by_device: HashMap<String, Vec<&AttemptRecord>> = HashMap::new();
    for a in &attempts {
        let devices = a
            .shape
            .as_ref()
            .map(|s| s.devices.clone())
            .unwrap_or_default();
        assert_eq!(
            devices.len(),
            1,
            "attempt {} held {devices:?}",
            a.attempt_id
        );
        by_device.entry(devices[0].clone()).or_default().push(a);
    }
    for (device, mut holders) in by_device {
        holders.sort_by_key(|a| a.created_at_ms.get());
        for pair in holders.windows(2) {
            let freed = freed_at(pair[0]).unwrap();
            assert!(
                pair[1].created_at_ms.get() >= freed,
                "{device}: {} took it at {} before {} gave it back at {freed}",
                pair[1].attempt_id,
                pair[1].created_at_ms.get(),
                pair[0].attempt_id
            );
        }
    }
    let third_runner = attempts
        .iter()
        .find(|a| a.job_id.map(|j| j.get()) == Some(i64::try_from(third).unwrap()))
        .unwrap_or_else(|| panic!("no attempt ran job {third}: {attempts:?}"));
    let third_device = &third_runner.shape.as_ref().unwrap().devices[0];
    assert!(
        attempts
            .iter()
            .any(|a| a.attempt_id != third_runner.attempt_id
                && a.shape.as_ref().unwrap().devices[0] == *third_device
                && freed_at(a).is_some_and(|t| t <= third_runner.created_at_ms.get())),
        "the third job's device {third_device} was not freed by an earlier attempt: {attempts:?}"
    );

    // Each job saw only its own node, and opened it and not the other.
    for a in attempts.iter().filter(|a| a.job_id.is_some()) {
        let own = Path::new(&a.shape.as_ref().unwrap().devices[0]).to_path_buf();
        let (mine, other) = if own == gpu0 {
            ("gpu0", "gpu1")
        } else {
            ("gpu1", "gpu0")
        };
        assert!(own == gpu0 || own == gpu1, "{}", own.display());
        let report = report_of(&reports, a);
        let who = format!("attempt {} holding {mine}", a.attempt_id.short());
        assert_eq!(report["seen"], mine, "{who}: {report:?}");
        assert_eq!(report[&format!("open_{mine}")], "ok", "{who}: {report:?}");
        assert_eq!(
            report[&format!("open_{other}")],
            "denied",
            "{who}: {report:?}"
        );
    }

    // Nothing is left: no hold, process, mount, network namespace, cgroup or runtime.
    let holds = Reader::open(&fleet.setup.journal())
        .unwrap()
        .held_devices()
        .unwrap();
    assert!(holds.is_empty(), "holds left: {holds:?}");
    let left = crate::docker::left_of(&fleet, &attempts, &[]);
    assert!(left.is_empty(), "left: {left:?}");
}

/// `explain`'s packing reasons are sentences an operator reads: no run of spaces inside them
/// (a string literal broken over source lines without `\` keeps the indentation). The reason
/// here is `shape_exceeds_host`, of a job asking for a device group the host has none of; the
/// control is the `shape_refused` reason of a job over `shape_max`, from the same answer path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_s_shape_reasons_read_as_single_spaced_sentences() {
    let fleet = Fleet::start(FleetOptions {
        policies: vec![policy("shaped", "shape_max = { cpu = 1 }\n")],
        host_extra: "capacity = { cpu = 2 }\n".to_owned(),
        ..FleetOptions::default()
    })
    .await;
    let _agent = fleet.start_agent(&[]).await;
    let over = fleet
        .fake
        .queue_job(REPO, "over", &labels_with(&["rm-cpu=2"]))
        .unwrap();
    let no_device = fleet
        .fake
        .queue_job(REPO, "no device", &labels_with(&["rm-gpu=1"]))
        .unwrap();
    for (job, code) in [(over, "shape_refused"), (no_device, "shape_exceeds_host")] {
        let mut last = serde_json::Value::Null;
        wait_until(PATIENCE, &format!("explain {job} says {code}"), || {
            last = explain(&fleet, job);
            reason_codes(&last).first().map(String::as_str) == Some(code)
        })
        .await;
        let message = last["reasons"][0]["message"].as_str().unwrap_or_default();
        assert!(
            !message.contains("  "),
            "the {code} reason has a run of spaces: {message:?}"
        );
    }
}
