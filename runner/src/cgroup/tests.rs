//! The pure parsers and decisions of the cgroup adapter, then the real thing: runner cgroups
//! created under the cgroup root this test process resolves, with real processes (and a
//! `setsid` escapee) killed through them.

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::process::ExitStatusExt as _;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicU32;

use super::*;
use crate::process::read_stat;

/// This machine's layout: systemd's hybrid mode, v2 at `unified`, a memory cgroup in v1.
const HYBRID_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

const HYBRID_CGROUP: &str = "\
9:name=systemd:/
4:memory:/process_api/429cfe8a92b324cd02a926d1157aa7e5
1:cpu:/
0::/
";

/// A current systemd host: only v2, with optional `shared:` tags before the `-`.
const UNIFIED_MOUNTINFO: &str = "\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
25 22 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:2 - sysfs sysfs rw
29 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

#[test]
fn the_cgroup2_mount_is_found_in_a_hybrid_layout() {
    assert_eq!(
        cgroup2_mount(HYBRID_MOUNTINFO),
        Some(PathBuf::from("/sys/fs/cgroup/unified"))
    );
}

#[test]
fn the_cgroup2_mount_is_found_past_optional_fields() {
    assert_eq!(
        cgroup2_mounts(UNIFIED_MOUNTINFO),
        vec![Cgroup2Mount {
            root: "/".into(),
            mount_point: PathBuf::from("/sys/fs/cgroup"),
        }]
    );
}

#[test]
fn escaped_mount_paths_are_unescaped() {
    let line = r"50 22 0:40 /a\134b /mnt/my\040cgroups\011x rw - cgroup2 none rw";
    assert_eq!(
        cgroup2_mounts(line),
        vec![Cgroup2Mount {
            root: r"/a\b".into(),
            mount_point: PathBuf::from("/mnt/my cgroups\tx"),
        }]
    );
    // Not an octal escape: kept as written.
    assert_eq!(unescape_mountinfo(r"/x\9y\04"), r"/x\9y\04");
}

#[test]
fn only_the_filesystem_type_makes_a_cgroup2_mount() {
    // `cgroup2` as the source or in the options of another filesystem does not count.
    let text = "60 22 0:50 / /mnt/cgroup2 rw - tmpfs cgroup2 rw,cgroup2\n\
                61 22 0:51 / /mnt/v1 rw - cgroup cgroup2 rw\n";
    assert_eq!(cgroup2_mount(text), None);
    assert_eq!(cgroup2_mount(""), None);
    assert_eq!(cgroup2_mount("garbage line\n"), None);
}

#[test]
fn the_own_cgroup_is_the_v2_line() {
    assert_eq!(own_cgroup_path(HYBRID_CGROUP).as_deref(), Some("/"));
    assert_eq!(
        own_cgroup_path("0::/system.slice/rm-agent.service\n").as_deref(),
        Some("/system.slice/rm-agent.service")
    );
    // cgroup v1 only.
    assert_eq!(own_cgroup_path("4:memory:/x\n1:cpu:/\n"), None);
}

#[test]
fn the_own_cgroup_maps_into_the_mount_that_holds_it() {
    let whole = cgroup2_mounts(UNIFIED_MOUNTINFO);
    assert_eq!(
        cgroup_dir(&whole, "/system.slice/rm-agent.service"),
        Some(PathBuf::from(
            "/sys/fs/cgroup/system.slice/rm-agent.service"
        ))
    );
    assert_eq!(
        cgroup_dir(&whole, "/"),
        Some(PathBuf::from("/sys/fs/cgroup"))
    );
    // A container without a cgroup namespace: its own subtree bind-mounted.
    let bound = [Cgroup2Mount {
        root: "/docker/abc".into(),
        mount_point: PathBuf::from("/sys/fs/cgroup"),
    }];
    assert_eq!(
        cgroup_dir(&bound, "/docker/abc/agent"),
        Some(PathBuf::from("/sys/fs/cgroup/agent"))
    );
    assert_eq!(cgroup_dir(&bound, "/docker/abcdef"), None);
    assert_eq!(cgroup_dir(&bound, "/other"), None);
    // Outside a cgroup namespace's view.
    assert_eq!(cgroup_dir(&whole, "/../.."), None);
}

#[test]
fn controllers_are_read_by_name() {
    assert_eq!(
        parse_controllers("cpuset cpu io memory hugetlb pids rdma misc\n"),
        Controllers {
            memory: true,
            pids: true,
            cpu: true,
        }
    );
    // This machine: everything but hugetlb is bound to v1. `cpuset` is not `cpu`.
    assert_eq!(parse_controllers("hugetlb\n"), Controllers::default());
    assert_eq!(parse_controllers("cpuset\n"), Controllers::default());
    assert_eq!(parse_controllers(""), Controllers::default());
}

#[test]
fn populated_is_read_from_cgroup_events() {
    assert_eq!(parse_populated("populated 1\nfrozen 0\n"), Some(true));
    assert_eq!(parse_populated("frozen 0\npopulated 0\n"), Some(false));
    assert_eq!(parse_populated("frozen 0\n"), None);
    assert_eq!(parse_populated("populated yes\n"), None);
}

#[test]
fn runner_names_are_plain_and_never_the_agent_leaf() {
    for good in ["0123456789ab", "rm-7_x", "A"] {
        assert!(valid_runner_name(good), "{good}");
    }
    for bad in [
        "",
        AGENT_LEAF,
        ".",
        "..",
        "a/b",
        "a.b",
        "système",
        "rm-probe.1.2",
        "a b",
    ] {
        assert!(!valid_runner_name(bad), "{bad:?}");
    }
    let root = CgroupRoot {
        path: PathBuf::from("/sys/fs/cgroup/x"),
        available: Controllers::default(),
    };
    assert_eq!(
        root.runner_path("abc").unwrap(),
        PathBuf::from("/sys/fs/cgroup/x/abc")
    );
    assert!(matches!(
        root.runner_path("../x"),
        Err(CgroupError::Name { .. })
    ));
}

#[test]
fn limits_are_written_only_where_their_controller_is() {
    let limits = Limits {
        memory_max: Some(8 << 30),
        pids_max: Some(4096),
        cpu_weight: Some(100),
        cpu_max: Some(2000),
    };
    let all = Controllers {
        memory: true,
        pids: true,
        cpu: true,
    };
    assert_eq!(
        limit_writes(&limits, all).unwrap(),
        vec![
            ("memory.max", "8589934592".to_owned()),
            ("memory.oom.group", "1".to_owned()),
            ("pids.max", "4096".to_owned()),
            ("cpu.weight", "100".to_owned()),
            ("cpu.max", "200000 100000".to_owned()),
        ]
    );
    assert!(limits.unapplied(all).is_empty());

    let pids_only = Controllers {
        pids: true,
        ..Controllers::default()
    };
    assert_eq!(
        limit_writes(&limits, pids_only).unwrap(),
        vec![("pids.max", "4096".to_owned())]
    );
    assert_eq!(
        limits.unapplied(pids_only),
        vec!["memory_max", "cpu_weight", "cpu"]
    );
    assert!(
        Limits::default()
            .unapplied(Controllers::default())
            .is_empty()
    );
    assert!(limit_writes(&Limits::default(), all).unwrap().is_empty());
}

#[test]
fn cpu_max_is_a_quota_of_a_hundred_microseconds_per_milli_over_a_100ms_period() {
    for (millis, written) in [
        (1000, "100000 100000"),
        (4000, "400000 100000"),
        (2500, "250000 100000"),
        (500, "50000 100000"),
        (16, "1600 100000"),
        // The kernel's smallest quota is 1 ms: a smaller share is raised to it.
        (10, "1000 100000"),
        (1, "1000 100000"),
        (0, "1000 100000"),
        (u64::MAX, "18446744073709551615 100000"),
    ] {
        assert_eq!(cpu_max_value(millis), written, "{millis} millis");
        let limits = Limits {
            cpu_max: Some(millis),
            ..Limits::default()
        };
        let cpu = Controllers {
            cpu: true,
            ..Controllers::default()
        };
        assert_eq!(
            limit_writes(&limits, cpu).unwrap(),
            vec![("cpu.max", written.to_owned())]
        );
        assert!(limits.unapplied(cpu).is_empty());
        // Without the cpu controller: nothing written, and `cpu` named unapplied.
        assert!(
            limit_writes(&limits, Controllers::default())
                .unwrap()
                .is_empty()
        );
        assert_eq!(limits.unapplied(Controllers::default()), vec!["cpu"]);
    }
}

#[test]
fn usage_is_read_from_cpu_stat_and_memory_peak() {
    // A cgroup without the cpu controller (this machine's): the core's three keys only.
    let core = "usage_usec 1520441\nuser_usec 1201356\nsystem_usec 319085\n";
    assert_eq!(parse_cpu_usage(core), Some(1_520_441));
    // With the cpu controller: the bandwidth keys follow (and one is named like ours).
    let full = "usage_usec 93211\nuser_usec 61200\nsystem_usec 32011\nnr_periods 12\n\
                nr_throttled 3\nthrottled_usec 48112\nnr_bursts 0\nburst_usec 0\n";
    assert_eq!(parse_cpu_usage(full), Some(93_211));
    assert_eq!(parse_cpu_usage("user_usec 5\nsystem_usec 6\n"), None);
    assert_eq!(parse_cpu_usage("usage_usec x\n"), None);
    assert_eq!(parse_cpu_usage("usage_usecs 5\n"), None);
    assert_eq!(parse_cpu_usage(""), None);
    assert_eq!(parse_memory_peak("268435456\n"), Some(268_435_456));
    assert_eq!(parse_memory_peak("0\n"), Some(0));
    assert_eq!(parse_memory_peak("max\n"), None);
    assert_eq!(parse_memory_peak(""), None);
    // The reader on files as the kernel writes them; absent files are `None`.
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(read_usage(dir.path()), Usage::default());
    fs::write(dir.path().join("cpu.stat"), full).unwrap();
    assert_eq!(
        read_usage(dir.path()),
        Usage {
            peak_memory: None,
            cpu_usec: Some(93_211)
        }
    );
    fs::write(dir.path().join("memory.peak"), "268435456\n").unwrap();
    assert_eq!(read_usage(dir.path()).peak_memory, Some(268_435_456));
    assert_eq!(memory_report(dir.path()), (0, Some(268_435_456)));
}

#[test]
fn a_cpu_weight_out_of_range_is_refused_on_every_host() {
    for weight in [0, 10_001] {
        let limits = Limits {
            cpu_weight: Some(weight),
            ..Limits::default()
        };
        assert!(matches!(
            limit_writes(&limits, Controllers::default()),
            Err(CgroupError::CpuWeight { weight: w }) if w == weight
        ));
    }
}

#[test]
fn the_auto_plan_follows_where_the_agent_is() {
    assert_eq!(auto_plan("/", true), AutoPlan::Subdir);
    assert_eq!(
        auto_plan("/system.slice/rm-agent.service", false),
        AutoPlan::MoveToLeaf
    );
    assert_eq!(
        auto_plan("/system.slice/rm-agent.service/rm-agent", false),
        AutoPlan::Parent
    );
    assert_eq!(auto_plan("/x/rm-agent-old", false), AutoPlan::MoveToLeaf);
    // A cgroup namespace's root is not the kernel's: the agent still has to leave it.
    assert_eq!(auto_plan("/", false), AutoPlan::MoveToLeaf);
}

// ---- Real cgroups. ----

static UNIQUE: AtomicU32 = AtomicU32::new(0);

/// A cgroup name no other test (in this binary or another running at the same time) uses.
fn unique(tag: &str) -> String {
    let n = UNIQUE.fetch_add(1, Ordering::Relaxed);
    format!("test-{}-{n}-{tag}", std::process::id())
}

/// Why the real-cgroup tests cannot run here, if they cannot. Anything else that goes wrong
/// fails the test.
fn unusable() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("the tests do not run as root".into());
    }
    let Some(mount) = fs::read_to_string(MOUNTINFO)
        .ok()
        .and_then(|text| cgroup2_mount(&text))
    else {
        return Some("no cgroup v2 filesystem is mounted".into());
    };
    if let Err(e) = rustix::fs::access(mount.join("cgroup.procs"), Access::WRITE_OK) {
        return Some(format!("{} is not writable: {e}", mount.display()));
    }
    None
}

/// The auto-resolved root, or `None` after a loud skip.
fn real_root(test: &str) -> Option<CgroupRoot> {
    if let Some(why) = unusable() {
        let need = if rustix::process::geteuid().is_root() {
            "cgroup"
        } else {
            "root"
        };
        crate::test_skip::cannot_run(test, need, &why);
        return None;
    }
    let _one_at_a_time = super::TEST_RESOLVING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    Some(CgroupRoot::resolve(None).expect("cgroup v2 is writable, so auto must resolve"))
}

fn sleep(secs: u32) -> Child {
    Command::new("sleep")
        .arg(secs.to_string())
        .stdin(Stdio::null())
        .spawn()
        .unwrap()
}

fn move_in(cgroup: &Path, pid: u32) {
    fs::write(cgroup.join("cgroup.procs"), pid.to_string()).unwrap();
}

fn members(cgroup: &Path) -> Vec<u32> {
    read_pids(&cgroup.join("cgroup.procs")).unwrap()
}

/// The start time of a live `pid`, so its death can be told from a recycled pid.
fn start_time(pid: u32) -> u64 {
    read_stat(pid).unwrap().unwrap().start_time
}

/// Whether the process `(pid, start)` is gone or a zombie.
fn dead(pid: u32, start: u64) -> bool {
    match read_stat(pid).unwrap() {
        None => true,
        Some(stat) => stat.start_time != start || stat.is_dead(),
    }
}

fn killed_by_sigkill(mut child: Child) {
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(9), "{status:?}");
}

/// Starts `sh` inside `cgroup`, has it start a `setsid` sleep in the background (a new session
/// and process group, reparented away from everything when `sh` exits), and returns the
/// escapee's pid. `sh` waits on its stdin until it has been moved, so the escapee is forked
/// inside the cgroup.
fn escapee_in(cgroup: &Path) -> u32 {
    let mut sh = Command::new("sh")
        .args([
            "-c",
            "read go; setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $!",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    move_in(cgroup, sh.id());
    sh.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut line = String::new();
    BufReader::new(sh.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(sh.wait().unwrap().success());
    line.trim().parse().unwrap()
}

#[test]
fn auto_resolves_to_a_writable_root_without_leftovers() {
    let Some(root) = real_root("auto_resolves_to_a_writable_root_without_leftovers") else {
        return;
    };
    assert!(root.path().is_dir());
    assert!(is_cgroup2(root.path()));
    // The agent is never among the runners, and neither is a probe.
    let children = root.children().unwrap();
    assert!(!children.iter().any(|c| c == AGENT_LEAF));
    let _one_at_a_time = super::TEST_RESOLVING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let probes = fs::read_dir(root.path())
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().ok())
        .filter(|n| n.starts_with(&format!("{PROBE_PREFIX}{}.", std::process::id())))
        .count();
    assert_eq!(probes, 0);
    // Resolving again (an agent restart) gives the same root.
    assert_eq!(CgroupRoot::resolve(None).unwrap().path(), root.path());
}

#[test]
fn a_runner_cgroup_takes_processes_and_dies_with_its_escapees() {
    let Some(root) = real_root("a_runner_cgroup_takes_processes_and_dies_with_its_escapees") else {
        return;
    };
    let name = unique("kill");
    let cgroup = root.create(&name, &Limits::default()).unwrap();
    assert_eq!(cgroup.path, root.path().join(&name));
    assert!(root.children().unwrap().contains(&name));
    assert!(!is_populated(&cgroup.path).unwrap());

    let runner = sleep(60);
    move_in(&cgroup.path, runner.id());
    let escapee = escapee_in(&cgroup.path);
    let escapee_start = start_time(escapee);
    let inside = members(&cgroup.path);
    assert!(
        inside.contains(&runner.id()) && inside.contains(&escapee),
        "{inside:?}"
    );
    assert!(is_populated(&cgroup.path).unwrap());

    assert_eq!(
        kill_and_remove(&cgroup.path, KILL_WAIT).unwrap(),
        Removal::Removed
    );
    assert!(!cgroup.path.exists());
    assert!(dead(escapee, escapee_start));
    killed_by_sigkill(runner);
    // Idempotent.
    assert_eq!(
        kill_and_remove(&cgroup.path, KILL_WAIT).unwrap(),
        Removal::Absent
    );
}

#[test]
fn the_procs_descriptor_moves_a_process_in() {
    let Some(root) = real_root("the_procs_descriptor_moves_a_process_in") else {
        return;
    };
    let cgroup = root.create(&unique("fd"), &Limits::default()).unwrap();
    let runner = sleep(60);
    // What the runner's child does with `0` for itself, done here with the pid.
    rustix::io::write(&cgroup.procs, runner.id().to_string().as_bytes()).unwrap();
    assert_eq!(members(&cgroup.path), vec![runner.id()]);
    kill_and_remove(&cgroup.path, KILL_WAIT).unwrap();
    killed_by_sigkill(runner);
}

#[test]
fn creating_over_a_populated_leftover_kills_it_first() {
    let Some(root) = real_root("creating_over_a_populated_leftover_kills_it_first") else {
        return;
    };
    let name = unique("leftover");
    let first = root.create(&name, &Limits::default()).unwrap();
    let survivor = sleep(60);
    move_in(&first.path, survivor.id());

    let second = root.create(&name, &Limits::default()).unwrap();
    assert_eq!(second.path, first.path);
    killed_by_sigkill(survivor);
    assert!(members(&second.path).is_empty());
    kill_and_remove(&second.path, KILL_WAIT).unwrap();
}

#[test]
fn what_is_not_written_is_exactly_what_is_reported_unapplied() {
    let Some(root) = real_root("what_is_not_written_is_exactly_what_is_reported_unapplied") else {
        return;
    };
    let limits = Limits {
        memory_max: Some(256 << 20),
        pids_max: Some(64),
        cpu_weight: Some(50),
        cpu_max: Some(1500),
    };
    let cgroup = root.create(&unique("limits"), &limits).unwrap();
    let available = root.available();
    let written = [
        ("memory.max", available.memory),
        ("pids.max", available.pids),
        ("cpu.weight", available.cpu),
        ("cpu.max", available.cpu),
    ]
    .iter()
    .filter(|(file, on)| {
        // A control file exists only where its controller is enabled.
        assert_eq!(cgroup.path.join(file).exists(), *on, "{file}");
        *on
    })
    .count();
    assert_eq!(written + limits.unapplied(available).len(), 4);
    kill_and_remove(&cgroup.path, KILL_WAIT).unwrap();
}

/// The root, if it hands `controller` to runner cgroups; otherwise a loud skip for
/// `<controller>-controller` (tests/support/skip.rs): a limit that cannot be applied here is
/// not tested here, and says so.
fn root_with(test: &str, controller: &str) -> Option<CgroupRoot> {
    let root = real_root(test)?;
    let available = root.available();
    let offered = match controller {
        "memory" => available.memory,
        "pids" => available.pids,
        "cpu" => available.cpu,
        other => panic!("no such limit controller: {other}"),
    };
    if !offered {
        crate::test_skip::cannot_run(
            test,
            &format!("{controller}-controller"),
            &format!(
                "the cgroup root {} does not hand the {controller} controller to runner cgroups (cgroup.subtree_control)",
                root.path().display()
            ),
        );
        return None;
    }
    Some(root)
}

#[test]
fn memory_max_lands_in_memory_max_with_oom_group_set() {
    let test = "memory_max_lands_in_memory_max_with_oom_group_set";
    let Some(root) = root_with(test, "memory") else {
        return;
    };
    let limits = Limits {
        memory_max: Some(256 << 20),
        ..Limits::default()
    };
    let cgroup = root.create(&unique("memory"), &limits).unwrap();
    let read = |file: &str| fs::read_to_string(cgroup.path.join(file)).unwrap();
    assert_eq!(read("memory.max").trim(), "268435456");
    assert_eq!(read("memory.oom.group").trim(), "1");
    kill_and_remove(&cgroup.path, KILL_WAIT).unwrap();
}

#[test]
fn pids_max_lands_in_pids_max() {
    let test = "pids_max_lands_in_pids_max";
    let Some(root) = root_with(test, "pids") else {
        return;
    };
    let limits = Limits {
        pids_max: Some(64),
        ..Limits::default()
    };
    let cgroup = root.create(&unique("pids"), &limits).unwrap();
    assert_eq!(
        fs::read_to_string(cgroup.path.join("pids.max"))
            .unwrap()
            .trim(),
        "64"
    );
    kill_and_remove(&cgroup.path, KILL_WAIT).unwrap();
}

#[test]
fn cpu_weight_lands_in_cpu_weight() {
    let test = "cpu_weight_lands_in_cpu_weight";
    let Some(root) = root_with(test, "cpu") else {
        return;
    };
    let limits = Limits {
        cpu_weight: Some(50),
        ..Limits::default()
    };
    let cgroup = root.create(&unique("cpu"), &limits).unwrap();
    assert_eq!(
        fs::read_to_string(cgroup.path.join("cpu.weight"))
            .unwrap()
            .trim(),
        "50"
    );
    kill_and_remove(&cgroup.path, KILL_WAIT).unwrap();
}

#[test]
fn cpu_max_lands_in_cpu_max() {
    let test = "cpu_max_lands_in_cpu_max";
    let Some(root) = root_with(test, "cpu") else {
        return;
    };
    let limits = Limits {
        cpu_max: Some(1500),
        ..Limits::default()
    };
    let cgroup = root.create(&unique("cpumax"), &limits).unwrap();
    assert_eq!(
        fs::read_to_string(cgroup.path.join("cpu.max"))
            .unwrap()
            .trim(),
        "150000 100000"
    );
    kill_and_remove(&cgroup.path, KILL_WAIT).unwrap();
}

/// A process that burnt CPU in a runner cgroup shows in what the cgroup says it used: the
/// core's `cpu.stat`, there with or without the cpu controller.
#[test]
fn a_runner_cgroup_reports_the_cpu_time_its_processes_used() {
    let Some(root) = real_root("a_runner_cgroup_reports_the_cpu_time_its_processes_used") else {
        return;
    };
    let cgroup = root.create(&unique("usage"), &Limits::default()).unwrap();
    let before = read_usage(&cgroup.path);
    assert_eq!(before.cpu_usec, Some(0), "a new cgroup has used nothing");
    // It waits on its stdin until it has been moved, so all its work is counted in there.
    let mut burner = Command::new("sh")
        .args([
            "-c",
            "read go; i=0; while [ $i -lt 300000 ]; do i=$((i + 1)); done",
        ])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    move_in(&cgroup.path, burner.id());
    burner.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(burner.wait().unwrap().success());
    let after = read_usage(&cgroup.path);
    let used = after.cpu_usec.unwrap();
    // 300 000 shell iterations take tens of milliseconds at the least.
    assert!(used > 10_000, "{after:?}");
    // The memory peak is there exactly where the memory controller is.
    assert_eq!(
        after.peak_memory.is_some(),
        root.available().memory && cgroup.path.join("memory.peak").exists(),
        "{after:?}"
    );
    kill_and_remove(&cgroup.path, KILL_WAIT).unwrap();
}

#[test]
fn without_cgroup_kill_signals_empty_nested_cgroups() {
    let Some(root) = real_root("without_cgroup_kill_signals_empty_nested_cgroups") else {
        return;
    };
    let cgroup = root.create(&unique("signals"), &Limits::default()).unwrap();
    // Runners cannot make child cgroups, but removal must cope with one all the same.
    let nested = cgroup.path.join("inner");
    fs::create_dir(&nested).unwrap();
    let outer = sleep(60);
    let inner = sleep(60);
    move_in(&cgroup.path, outer.id());
    move_in(&nested, inner.id());
    let escapee = escapee_in(&nested);
    let escapee_start = start_time(escapee);

    assert_eq!(
        kill_and_remove_with(&cgroup.path, KILL_WAIT, KillMethod::Signals).unwrap(),
        Removal::Removed
    );
    assert!(!cgroup.path.exists());
    killed_by_sigkill(outer);
    killed_by_sigkill(inner);
    assert!(dead(escapee, escapee_start));
}

#[test]
fn the_cgroup_kill_path_removes_nested_cgroups_too() {
    let Some(root) = real_root("the_cgroup_kill_path_removes_nested_cgroups_too") else {
        return;
    };
    let cgroup = root.create(&unique("nested"), &Limits::default()).unwrap();
    let deep = cgroup.path.join("a").join("b");
    fs::create_dir_all(&deep).unwrap();
    let inner = sleep(60);
    move_in(&deep, inner.id());
    kill_and_remove(&cgroup.path, KILL_WAIT).unwrap();
    assert!(!cgroup.path.exists());
    killed_by_sigkill(inner);
}

#[test]
fn auto_moves_the_agent_into_its_leaf_and_finds_it_there_after() {
    let Some(root) = real_root("auto_moves_the_agent_into_its_leaf_and_finds_it_there_after")
    else {
        return;
    };
    let mounts = cgroup2_mounts(&fs::read_to_string(MOUNTINFO).unwrap());
    // A stand-in agent in a cgroup of its own (this test process must stay where it is).
    let own_dir = root.path().join(unique("agent"));
    fs::create_dir(&own_dir).unwrap();
    let agent = sleep(60);
    move_in(&own_dir, agent.id());
    let mount = &mounts
        .iter()
        .find(|m| own_dir.starts_with(&m.mount_point))
        .unwrap()
        .mount_point;
    let own = Path::new("/").join(own_dir.strip_prefix(mount).unwrap());
    let own = own.to_str().unwrap();

    let resolved = resolve_with(None, &mounts, Some(own), agent.id()).unwrap();
    assert_eq!(resolved.path(), own_dir);
    assert_eq!(members(&own_dir), Vec::<u32>::new());
    assert_eq!(members(&own_dir.join(AGENT_LEAF)), vec![agent.id()]);
    assert!(resolved.children().unwrap().is_empty());

    // After a restart the agent is found in its leaf: the root is the same.
    let in_leaf = format!("{own}/{AGENT_LEAF}");
    let again = resolve_with(None, &mounts, Some(&in_leaf), agent.id()).unwrap();
    assert_eq!(again.path(), own_dir);
    assert_eq!(members(&own_dir.join(AGENT_LEAF)), vec![agent.id()]);

    kill_and_remove(&own_dir, KILL_WAIT).unwrap();
    killed_by_sigkill(agent);
}

#[test]
fn an_explicit_root_is_created_inside_the_cgroup2_mount_only() {
    let Some(root) = real_root("an_explicit_root_is_created_inside_the_cgroup2_mount_only") else {
        return;
    };
    let top = root.path().join(unique("explicit"));
    let configured = top.join("runners");
    let explicit = {
        let _one_at_a_time = super::TEST_RESOLVING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        CgroupRoot::resolve(Some(&configured)).unwrap()
    };
    assert_eq!(explicit.path(), configured);
    assert!(configured.is_dir());
    let cgroup = explicit.create("r1", &Limits::default()).unwrap();
    assert_eq!(explicit.children().unwrap(), vec!["r1".to_owned()]);
    kill_and_remove(&cgroup.path, KILL_WAIT).unwrap();
    kill_and_remove(&top, KILL_WAIT).unwrap();
    assert!(!top.exists());

    let outside = tempfile::tempdir().unwrap();
    for bad in [
        outside.path().join("runners"),
        PathBuf::from("relative/runners"),
        root.path().join("..").join("x"),
    ] {
        assert!(
            matches!(
                CgroupRoot::resolve(Some(&bad)),
                Err(CgroupError::NotCgroup2 { .. })
            ),
            "{}",
            bad.display()
        );
    }
    assert!(!outside.path().join("runners").exists());
}

#[test]
fn kill_and_remove_refuses_what_is_not_a_cgroup() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    fs::write(&file, "x").unwrap();
    for path in [dir.path(), file.as_path()] {
        assert!(matches!(
            kill_and_remove(path, KILL_WAIT),
            Err(CgroupError::NotRunnerCgroup { .. })
        ));
    }
    assert!(dir.path().exists() && file.exists());
    assert_eq!(
        kill_and_remove(&dir.path().join("absent"), KILL_WAIT).unwrap(),
        Removal::Absent
    );
}
