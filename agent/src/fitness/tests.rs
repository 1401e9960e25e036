//! The gate's rules: thresholds as configured, the judgement of measured facts (timed-out
//! probes included), transitions, and probes under a deadline.

use std::sync::Mutex;
use std::sync::mpsc;

use super::probe::Probes;
use super::*;
use crate::config::fitness::{DEFAULT_DATA_DIR_MIN_FREE_SPACE, Thresholds, parse_size, thresholds};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn required() -> Requirements {
    Requirements {
        dirs: vec![
            DirRequirement {
                role: DirRole::RunnerRoot,
                path: PathBuf::from("/srv/runners"),
                min_free: 2 * GIB,
            },
            DirRequirement {
                role: DirRole::DataDir,
                path: PathBuf::from("/var/lib/rm-agent"),
                min_free: 256 * MIB,
            },
        ],
        memory: Some((8 * GIB, "linux".to_owned())),
        tools: vec!["git".to_owned(), "/usr/bin/docker".to_owned()],
        path: OsString::from("/usr/bin:/bin"),
        deadline: PROBE_DEADLINE,
    }
}

fn fine() -> Facts {
    Facts {
        dirs: vec![
            DirFacts {
                free: Probed::Answered(Ok(10 * GIB)),
                write: Probed::Answered(Ok(())),
            },
            DirFacts {
                free: Probed::Answered(Ok(10 * GIB)),
                write: Probed::Answered(Ok(())),
            },
        ],
        mem_available: Probed::Answered(Some(16 * GIB)),
        tools: vec![
            Probed::Answered(Some(PathBuf::from("/usr/bin/git"))),
            Probed::Answered(Some(PathBuf::from("/usr/bin/docker"))),
        ],
    }
}

fn codes(problems: &[FitnessProblem]) -> Vec<&str> {
    problems.iter().map(|p| p.code.as_str()).collect()
}

#[test]
fn a_host_with_room_memory_and_its_tools_is_fit() {
    assert!(judge(&required(), &fine()).is_empty());
}

#[test]
fn free_space_below_a_threshold_is_a_disk_space_problem_naming_the_key() {
    let mut facts = fine();
    facts.dirs[0].free = Probed::Answered(Ok(2 * GIB - 1));
    let problems = judge(&required(), &facts);
    assert_eq!(codes(&problems), ["disk_space"]);
    assert!(problems[0].message.contains("/srv/runners"), "{problems:?}");
    assert!(
        problems[0]
            .message
            .contains("host.min_free_space (2.0 GiB)"),
        "{problems:?}"
    );
    facts.dirs[0].free = Probed::Answered(Ok(2 * GIB));
    facts.dirs[1].free = Probed::Answered(Ok(100 * MIB));
    let problems = judge(&required(), &facts);
    assert_eq!(codes(&problems), ["disk_space"]);
    assert!(
        problems[0].message.contains("host.data_dir_min_free_space"),
        "{problems:?}"
    );
}

#[test]
fn a_failed_write_is_not_writable_and_a_full_disk_is_both() {
    let mut facts = fine();
    facts.dirs[1].write = Probed::Answered(Err("Read-only file system (os error 30)".to_owned()));
    let problems = judge(&required(), &facts);
    assert_eq!(codes(&problems), ["not_writable"]);
    assert!(problems[0].message.contains("Read-only"), "{problems:?}");

    let mut facts = fine();
    facts.dirs[0] = DirFacts {
        free: Probed::Answered(Ok(0)),
        write: Probed::Answered(Err("No space left on device (os error 28)".to_owned())),
    };
    assert_eq!(
        codes(&judge(&required(), &facts)),
        ["not_writable", "disk_space"]
    );
    // A directory that is gone: one problem, not two.
    facts.dirs[0] = DirFacts {
        free: Probed::Answered(Err("No such file or directory".to_owned())),
        write: Probed::Answered(Err("No such file or directory".to_owned())),
    };
    assert_eq!(codes(&judge(&required(), &facts)), ["not_writable"]);
    facts.dirs[0].write = Probed::Answered(Ok(()));
    assert_eq!(codes(&judge(&required(), &facts)), ["not_writable"]);
}

#[test]
fn less_memory_available_than_the_largest_memory_max_is_a_memory_problem() {
    let mut facts = fine();
    facts.mem_available = Probed::Answered(Some(8 * GIB - 1));
    let problems = judge(&required(), &facts);
    assert_eq!(codes(&problems), ["memory"]);
    assert!(problems[0].message.contains("policy linux"), "{problems:?}");
    // Unknown memory, or no policy limiting it: nothing to judge.
    facts.mem_available = Probed::Answered(None);
    assert!(judge(&required(), &facts).is_empty());
    let mut unlimited = required();
    unlimited.memory = None;
    facts.mem_available = Probed::Answered(Some(1));
    assert!(judge(&unlimited, &facts).is_empty());
}

#[test]
fn each_missing_tool_is_named() {
    let mut facts = fine();
    facts.tools = vec![Probed::Answered(None), Probed::Answered(None)];
    let problems = judge(&required(), &facts);
    assert_eq!(codes(&problems), ["missing_tool", "missing_tool"]);
    assert!(
        problems[0]
            .message
            .contains("`git` is not on the runners' PATH (/usr/bin:/bin)")
    );
    assert!(
        problems[1]
            .message
            .contains("`/usr/bin/docker` does not exist")
    );
}

#[test]
fn the_largest_memory_max_of_the_policies_is_required() {
    let config = crate::config::from_text(
        "[host]\nmin_free_space = \"1GiB\"\nrequired_tools = [\"git\"]\n\
         [[policy]]\nname = \"a\"\ntarget = \"acme\"\nlabels = [\"x\"]\nmemory_max = \"2G\"\n\
         [[policy]]\nname = \"b\"\ntarget = \"acme\"\nlabels = [\"y\"]\nmemory_max = \"6G\"\n\
         [[policy]]\nname = \"c\"\ntarget = \"acme\"\nlabels = [\"z\"]\n",
    )
    .unwrap();
    let required = Requirements::of(&config, OsString::from("/bin"));
    assert_eq!(required.memory, Some((6 * GIB, "b".to_owned())));
    assert_eq!(required.dirs[0].min_free, GIB);
    assert_eq!(required.dirs[0].path, config.host.runner_root);
    assert_eq!(required.dirs[1].min_free, DEFAULT_DATA_DIR_MIN_FREE_SPACE);
    assert_eq!(required.dirs[1].path, config.data_dir);
    assert_eq!(required.tools, ["git"]);
}

#[test]
fn sizes_and_tools_are_validated_at_start() {
    assert_eq!(parse_size("2GiB"), Some(2 * GIB));
    assert_eq!(parse_size("2G"), Some(2 * GIB));
    assert_eq!(parse_size("512MiB"), Some(512 * MIB));
    assert_eq!(parse_size("512 MiB"), Some(512 * MIB));
    assert_eq!(parse_size("64KB"), Some(64 * 1024));
    assert_eq!(parse_size("1024"), Some(1024));
    assert_eq!(parse_size("0"), Some(0));
    for bad in ["", "GiB", "2 gigs", "-1G", "2XiB", "1.5G", "2iB"] {
        assert_eq!(parse_size(bad), None, "{bad:?}");
    }
    assert_eq!(thresholds(None, None, None), Ok(Thresholds::default()));
    for (text, key) in [
        ("[host]\nmin_free_space = \"lots\"\n", "host.min_free_space"),
        (
            "[host]\ndata_dir_min_free_space = \"1.5G\"\n",
            "host.data_dir_min_free_space",
        ),
        (
            "[host]\nrequired_tools = [\"bin/git\"]\n",
            "host.required_tools",
        ),
        ("[host]\nrequired_tools = [\"\"]\n", "host.required_tools"),
        ("[host]\nmin_free_space = 2\n", "host.min_free_space"),
    ] {
        let err = crate::config::from_text(text).unwrap_err();
        assert_eq!(err.key, key, "{text}: {err}");
    }
}

fn judged(problems: &[&str]) -> Fitness {
    Fitness {
        checked_at_ms: 1,
        problems: problems
            .iter()
            .map(|code| FitnessProblem {
                code: (*code).to_owned(),
                message: String::new(),
            })
            .collect(),
    }
}

#[test]
fn transitions_are_told_apart() {
    assert_eq!(change(None, &judged(&[])), Change::Unchanged);
    assert_eq!(change(None, &judged(&["memory"])), Change::BecameUnfit);
    assert_eq!(
        change(Some(&judged(&[])), &judged(&["disk_space"])),
        Change::BecameUnfit
    );
    assert_eq!(
        change(Some(&judged(&["disk_space"])), &judged(&[])),
        Change::BecameFit
    );
    assert_eq!(
        change(Some(&judged(&["disk_space"])), &judged(&["disk_space"])),
        Change::Unchanged
    );
    assert_eq!(
        change(Some(&judged(&["disk_space"])), &judged(&["memory"])),
        Change::ReasonsChanged
    );
}

#[tokio::test]
async fn the_gate_holds_while_unfit_and_wakes_allocation_when_fit_again() {
    let gate = Gate::default();
    assert!(gate.is_fit(), "not judged yet");
    let woken = gate.fit_again();
    gate.record(judged(&["disk_space"]));
    assert!(!gate.is_fit());
    assert!(!woken.has_changed().unwrap());
    gate.record(judged(&[]));
    assert!(gate.is_fit());
    assert!(woken.has_changed().unwrap());
}

#[tokio::test]
async fn a_check_of_a_real_directory_records_the_judgement() {
    let dir = tempfile::tempdir().unwrap();
    let mut required = required();
    for d in &mut required.dirs {
        d.path = dir.path().to_owned();
        d.min_free = 0;
    }
    required.memory = None;
    required.tools = vec!["sh".to_owned()];
    required.path = OsString::from("/usr/bin:/bin");
    let gate = Gate::default();
    let notifier = Notifier::new(false);
    check_once(&mut Prober::host(required.clone()), &gate, &notifier).await;
    assert_eq!(gate.current().map(|f| f.problems), Some(Vec::new()));
    // Asking for more than any filesystem has makes it unfit, and says so.
    required.dirs[0].min_free = u64::MAX;
    check_once(&mut Prober::host(required), &gate, &notifier).await;
    assert!(!gate.is_fit());
    assert_eq!(codes(&gate.current().unwrap().problems), ["disk_space"]);
}

#[test]
fn the_notification_names_the_problems_and_says_it_resumes_by_itself() {
    let event = OperatorEvent::HostUnfit {
        problems: vec!["the runner root /r has 1.0 MiB free".to_owned()],
    };
    assert_eq!(event.kind(), crate::notify::EventKind::HostUnfit);
    let (summary, body) = event.message();
    assert_eq!(summary, "rm: host unfit, no new runners");
    assert!(
        body.starts_with("the runner root /r has 1.0 MiB free."),
        "{body}"
    );
    assert!(body.contains("resumes by itself"), "{body}");
}

#[test]
fn a_policy_with_docker_requires_every_program_of_the_daemon() {
    let config = crate::config::from_text(
        "[host]\nrequired_tools = [\"git\"]\n\
         [[policy]]\nname = \"a\"\ntarget = \"acme\"\nlabels = [\"x\"]\ndocker = true\n",
    )
    .unwrap();
    let required = Requirements::of(&config, OsString::from("/bin"));
    assert_eq!(required.tools[0], "git");
    let tools = rm_runner::docker::host::TOOLS;
    assert_eq!(
        required.tools.len(),
        1 + tools.len(),
        "{:?}",
        required.tools
    );
    for (tool, required) in tools.iter().zip(&required.tools[1..]) {
        // Found here by absolute path, or named bare (then reported missing).
        assert!(
            required == tool.name || required.ends_with(&format!("/{}", tool.name)),
            "{required} for {}",
            tool.name
        );
    }
    let without =
        crate::config::from_text("[[policy]]\nname = \"a\"\ntarget = \"acme\"\nlabels = [\"x\"]\n")
            .unwrap();
    assert!(
        Requirements::of(&without, OsString::from("/bin"))
            .tools
            .is_empty()
    );
}

#[test]
fn a_probe_that_did_not_answer_is_a_probe_timeout_naming_the_probe_and_the_path() {
    struct Case {
        name: &'static str,
        facts: fn(&mut Facts),
        codes: &'static [&'static str],
        /// What the `probe_timeout` problem's message says, if one is expected.
        says: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "the runner root's statvfs hung",
            facts: |f| f.dirs[0].free = Probed::TimedOut,
            codes: &["probe_timeout"],
            says: &[
                "the free-space check (statvfs) of the runner root /srv/runners did not answer within 10s",
            ],
        },
        Case {
            name: "both probes of the data directory hung: one problem",
            facts: |f| {
                f.dirs[1].free = Probed::TimedOut;
                f.dirs[1].write = Probed::TimedOut;
            },
            codes: &["probe_timeout"],
            says: &[
                "the free-space check (statvfs) and the write probe of the data directory /var/lib/rm-agent",
            ],
        },
        Case {
            name: "a hung write beside a low free space: both",
            facts: |f| {
                f.dirs[0].write = Probed::TimedOut;
                f.dirs[0].free = Probed::Answered(Ok(MIB));
            },
            codes: &["probe_timeout", "disk_space"],
            says: &["the write probe of the runner root /srv/runners"],
        },
        Case {
            name: "a hung write beside an unreadable free space: both",
            facts: |f| {
                f.dirs[0].write = Probed::TimedOut;
                f.dirs[0].free = Probed::Answered(Err("Stale file handle".to_owned()));
            },
            codes: &["probe_timeout", "not_writable"],
            says: &["the write probe of the runner root"],
        },
        Case {
            name: "the memory read hung",
            facts: |f| f.mem_available = Probed::TimedOut,
            codes: &["probe_timeout"],
            says: &["reading /proc/meminfo did not answer within 10s"],
        },
        Case {
            name: "a tool's lookup hung",
            facts: |f| f.tools[1] = Probed::TimedOut,
            codes: &["probe_timeout"],
            says: &["the lookup of required tool /usr/bin/docker did not answer within 10s"],
        },
        Case {
            name: "a tool on the PATH hung, another is missing",
            facts: |f| {
                f.tools[0] = Probed::TimedOut;
                f.tools[1] = Probed::Answered(None);
            },
            codes: &["probe_timeout", "missing_tool"],
            says: &["the lookup of required tool `git` on the runners' PATH (/usr/bin:/bin)"],
        },
    ];
    for case in cases {
        let mut facts = fine();
        (case.facts)(&mut facts);
        let problems = judge(&required(), &facts);
        assert_eq!(codes(&problems), case.codes, "{}: {problems:?}", case.name);
        for said in case.says {
            assert!(
                problems
                    .iter()
                    .any(|p| p.code == PROBE_TIMEOUT && p.message.contains(said)),
                "{}: {said:?} in {problems:?}",
                case.name
            );
        }
    }
    // The memory read is not judged (nor made) when no policy writes a memory_max.
    let mut unlimited = required();
    unlimited.memory = None;
    let mut facts = fine();
    facts.mem_available = Probed::TimedOut;
    assert!(judge(&unlimited, &facts).is_empty());
    assert!(CODES.contains(&PROBE_TIMEOUT));
}

/// Probes that answer at once, but the free-space check of `hang` blocks until the test
/// releases it (or drops the release, as a failing test does).
struct Hanging {
    hang: PathBuf,
    release: Mutex<Option<mpsc::Receiver<()>>>,
    returned: mpsc::Sender<()>,
    /// How often each probe was started: (path or tool, calls).
    calls: Mutex<Vec<String>>,
}

impl Hanging {
    fn calls(&self, what: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| *c == what)
            .count()
    }
}

impl Probes for Hanging {
    fn free_bytes(&self, dir: &std::path::Path) -> Result<u64, String> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("free {}", dir.display()));
        if dir == self.hang {
            let release = self.release.lock().unwrap().take();
            if let Some(release) = release {
                let _ = release.recv();
                let _ = self.returned.send(());
            }
        }
        Ok(10 * GIB)
    }

    fn write(&self, dir: &std::path::Path) -> Result<(), String> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("write {}", dir.display()));
        Ok(())
    }

    fn mem_available(&self) -> Option<u64> {
        self.calls.lock().unwrap().push("memory".to_owned());
        Some(16 * GIB)
    }

    fn find_tool(&self, tool: &str, _path: &std::ffi::OsStr) -> Option<PathBuf> {
        self.calls.lock().unwrap().push(format!("tool {tool}"));
        Some(PathBuf::from("/usr/bin").join(tool))
    }
}

/// One check, failed rather than left hanging should the gate wait on a hung probe: a bound far
/// beyond the deadline, so only a gate that waits for ever meets it (the time is not asserted).
async fn check_bounded(prober: &mut Prober, gate: &Gate, notifier: &Notifier) {
    tokio::time::timeout(Duration::from_secs(60), check_once(prober, gate, notifier))
        .await
        .expect("the gate answers by its deadline, not when the probe does");
}

#[tokio::test]
async fn a_hung_probe_makes_the_host_unfit_by_the_deadline_and_is_not_started_twice() {
    let (release, released) = mpsc::channel();
    let (returned, has_returned) = mpsc::channel();
    let probes = Arc::new(Hanging {
        hang: PathBuf::from("/srv/runners"),
        release: Mutex::new(Some(released)),
        returned,
        calls: Mutex::new(Vec::new()),
    });
    let mut required = required();
    // Short, so the test is quick, and long enough that a probe which does answer (on its own
    // thread, on a machine busy with other tests) answers within it: the outcome is asserted,
    // never the time taken (300 ms failed the answering round once under a CI build's load).
    required.deadline = Duration::from_secs(2);
    let mut prober = Prober::new(required, Arc::clone(&probes) as Arc<dyn Probes>);
    let gate = Gate::default();
    let notifier = Notifier::new(false);

    // The round answers although the statvfs never does: unfit, for that probe alone.
    check_bounded(&mut prober, &gate, &notifier).await;
    let problems = gate.current().unwrap().problems;
    assert_eq!(codes(&problems), ["probe_timeout"], "{problems:?}");
    assert!(
        problems[0]
            .message
            .contains("statvfs) of the runner root /srv/runners did not answer within 2s"),
        "{problems:?}"
    );
    assert_eq!(prober.hung(), 1);

    // The next round answers too, waits on the same thread and starts no second one; the
    // probes that answered are run afresh.
    check_bounded(&mut prober, &gate, &notifier).await;
    assert_eq!(codes(&gate.current().unwrap().problems), ["probe_timeout"]);
    assert_eq!(probes.calls("free /srv/runners"), 1);
    assert_eq!(probes.calls("free /var/lib/rm-agent"), 2);
    assert_eq!(probes.calls("tool git"), 2);
    assert_eq!(prober.hung(), 1);

    // The mount comes back: the late answer is not taken for today's, the probe runs afresh and
    // the host is fit again.
    release.send(()).unwrap();
    has_returned.recv().unwrap();
    let woken = gate.fit_again();
    check_bounded(&mut prober, &gate, &notifier).await;
    assert!(gate.is_fit(), "{:?}", gate.current());
    assert!(woken.has_changed().unwrap());
    assert_eq!(probes.calls("free /srv/runners"), 2);
    assert_eq!(prober.hung(), 0);
}

#[tokio::test]
async fn one_directory_in_two_roles_is_probed_once() {
    let (_release, released) = mpsc::channel();
    let (returned, _has_returned) = mpsc::channel();
    let probes = Arc::new(Hanging {
        hang: PathBuf::from("/nowhere"),
        release: Mutex::new(Some(released)),
        returned,
        calls: Mutex::new(Vec::new()),
    });
    let mut required = required();
    required.dirs[1].path = required.dirs[0].path.clone();
    required.memory = None;
    let mut prober = Prober::new(required, Arc::clone(&probes) as Arc<dyn Probes>);
    let facts = prober.measure().await.unwrap();
    assert_eq!(facts.dirs[0], facts.dirs[1]);
    assert_eq!(facts.dirs[1].free, Probed::Answered(Ok(10 * GIB)));
    assert_eq!(probes.calls("free /srv/runners"), 1);
    assert_eq!(probes.calls("write /srv/runners"), 1);
    // No memory_max: /proc/meminfo is not read.
    assert_eq!(probes.calls("memory"), 0);
    assert_eq!(facts.mem_available, Probed::Answered(None));
}

/// Probes whose memory read panics: a thread that dies without answering.
struct Panicking;

impl Probes for Panicking {
    fn free_bytes(&self, _dir: &std::path::Path) -> Result<u64, String> {
        Ok(10 * GIB)
    }

    fn write(&self, _dir: &std::path::Path) -> Result<(), String> {
        Ok(())
    }

    fn mem_available(&self) -> Option<u64> {
        panic!("the memory probe panics on purpose")
    }

    fn find_tool(&self, tool: &str, _path: &std::ffi::OsStr) -> Option<PathBuf> {
        Some(PathBuf::from("/usr/bin").join(tool))
    }
}

#[tokio::test]
async fn a_probe_that_dies_without_answering_leaves_the_last_judgement() {
    let gate = Gate::default();
    gate.record(judged(&["disk_space"]));
    let mut prober = Prober::new(required(), Arc::new(Panicking));
    assert!(prober.measure().await.is_err());
    check_once(&mut prober, &gate, &Notifier::new(false)).await;
    assert_eq!(codes(&gate.current().unwrap().problems), ["disk_space"]);
}
