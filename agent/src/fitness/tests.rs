//! The gate's rules: thresholds as configured, the judgement of measured facts, transitions.

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
    }
}

fn fine() -> Facts {
    Facts {
        dirs: vec![
            DirFacts {
                free: Ok(10 * GIB),
                write: Ok(()),
            },
            DirFacts {
                free: Ok(10 * GIB),
                write: Ok(()),
            },
        ],
        mem_available: Some(16 * GIB),
        tools: vec![
            Some(PathBuf::from("/usr/bin/git")),
            Some(PathBuf::from("/usr/bin/docker")),
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
    facts.dirs[0].free = Ok(2 * GIB - 1);
    let problems = judge(&required(), &facts);
    assert_eq!(codes(&problems), ["disk_space"]);
    assert!(problems[0].message.contains("/srv/runners"), "{problems:?}");
    assert!(
        problems[0]
            .message
            .contains("host.min_free_space (2.0 GiB)"),
        "{problems:?}"
    );
    facts.dirs[0].free = Ok(2 * GIB);
    facts.dirs[1].free = Ok(100 * MIB);
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
    facts.dirs[1].write = Err("Read-only file system (os error 30)".to_owned());
    let problems = judge(&required(), &facts);
    assert_eq!(codes(&problems), ["not_writable"]);
    assert!(problems[0].message.contains("Read-only"), "{problems:?}");

    let mut facts = fine();
    facts.dirs[0] = DirFacts {
        free: Ok(0),
        write: Err("No space left on device (os error 28)".to_owned()),
    };
    assert_eq!(
        codes(&judge(&required(), &facts)),
        ["not_writable", "disk_space"]
    );
    // A directory that is gone: one problem, not two.
    facts.dirs[0] = DirFacts {
        free: Err("No such file or directory".to_owned()),
        write: Err("No such file or directory".to_owned()),
    };
    assert_eq!(codes(&judge(&required(), &facts)), ["not_writable"]);
    facts.dirs[0].write = Ok(());
    assert_eq!(codes(&judge(&required(), &facts)), ["not_writable"]);
}

#[test]
fn less_memory_available_than_the_largest_memory_max_is_a_memory_problem() {
    let mut facts = fine();
    facts.mem_available = Some(8 * GIB - 1);
    let problems = judge(&required(), &facts);
    assert_eq!(codes(&problems), ["memory"]);
    assert!(problems[0].message.contains("policy linux"), "{problems:?}");
    // Unknown memory, or no policy limiting it: nothing to judge.
    facts.mem_available = None;
    assert!(judge(&required(), &facts).is_empty());
    let mut unlimited = required();
    unlimited.memory = None;
    facts.mem_available = Some(1);
    assert!(judge(&unlimited, &facts).is_empty());
}

#[test]
fn each_missing_tool_is_named() {
    let mut facts = fine();
    facts.tools = vec![None, None];
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
    check_once(&required, &gate, &notifier).await;
    assert_eq!(gate.current().map(|f| f.problems), Some(Vec::new()));
    // Asking for more than any filesystem has makes it unfit, and says so.
    required.dirs[0].min_free = u64::MAX;
    check_once(&required, &gate, &notifier).await;
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
