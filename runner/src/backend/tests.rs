//! The user backend on the real system (as root): a runner started through it runs as its pool
//! uid with no other group, `no_new_privs`, in its cgroup, with an empty private `/tmp` and its
//! HOME in its runtime; what it leaves (a `setsid` daemon, files in `/tmp`) is gone after
//! `clean`, and so are its cgroup and runtime. Where the agent could not isolate, it says so.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use secrecy::SecretString;

use super::*;
use crate::cgroup::CgroupRoot;
use crate::isolate::{Account, Pool};
use crate::store::Store;

/// A listener that reports what it is, leaves a daemon and a file in /tmp, and exits.
const LISTENER_SCRIPT: &str = r#"#!/bin/sh
cd "$(dirname "$0")/.."
{
  echo "uid=$(id -u)"
  echo "groups=$(id -G)"
  echo "nnp=$(grep NoNewPrivs /proc/self/status | tr -d ' \t' | cut -d: -f2)"
  echo "cgroup=$(grep '^0::' /proc/self/cgroup | cut -d: -f3)"
  echo "home=$HOME"
  echo "tmpdir=$TMPDIR"
  echo "tmp_entries=$(ls -A /tmp | tr '\n' ' ')"
  echo "jit=${ACTIONS_RUNNER_INPUT_JITCONFIG:-unset}"
  if echo x > bin/Runner.Listener 2>/dev/null; then echo "package_write=ok"; else echo "package_write=denied"; fi
  if (: </dev/tty) 2>/dev/null; then echo "tty=ok"; else echo "tty=denied"; fi
  if ls /proc/self/fd | grep -qE '^(9[4-9][0-9]|[0-9]{4,})$'; then echo "inherited_fd=ok"; else echo "inherited_fd=denied"; fi
  if grep -q rm-backend-test-key /proc/keys 2>/dev/null; then echo "session_key=ok"; else echo "session_key=denied"; fi
  echo "processes=$(ls /proc | grep -c '^[0-9]')"
  echo "hostname=$(cat /proc/sys/kernel/hostname)"
  echo "run_entries=$(ls -A /run | tr '\n' ' ')"
  if [ -S "$KEPT_SOCKET" ]; then echo "kept_socket=ok"; else echo "kept_socket=denied"; fi
  if [ -e "$HIDDEN_SOCKET" ]; then echo "hidden_socket=ok"; else echo "hidden_socket=denied"; fi
} > report.txt
echo poison > /tmp/rm-backend-test-poison
setsid -f sleep 300 </dev/null >/dev/null 2>&1
echo done >> report.txt
"#;

/// A directory of the host's removed when the test ends, failed or not.
struct RemovedOnDrop(std::path::PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A package with the reporting listener, and a runner root runners can reach, in a temporary
/// directory.
fn package_and_root() -> (tempfile::TempDir, std::path::PathBuf, RunnerRoot) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let package = dir.path().join("package");
    std::fs::create_dir_all(package.join("bin")).unwrap();
    std::fs::write(package.join("bin/Runner.Listener"), LISTENER_SCRIPT).unwrap();
    std::fs::set_permissions(
        package.join("bin/Runner.Listener"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let root = RunnerRoot::open(&dir.path().join("runners")).unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    (dir, package, root)
}

/// A store changed after it was verified (a file replaced: here by the test, as root) makes the
/// next runtime fail its check; the store is then verified, rebuilt from the package, and the
/// runtime made again from the rebuilt store.
#[test]
fn a_runtime_that_fails_its_check_rebuilds_the_store() {
    if !rustix::process::geteuid().is_root() {
        crate::test_skip::cannot_run(
            "a_runtime_that_fails_its_check_rebuilds_the_store",
            "root",
            "only root can give a runtime to a runner uid",
        );
        return;
    }
    // A uid no account of this host has: cleanup kills every process of it.
    let uid = 3_100_000 + std::process::id() % 100_000;
    let (_dir, package, root) = package_and_root();
    let pool = Pool::new(vec![Account { uid, gid: uid }]);
    let linked =
        LinkedPackage::install(Store::open(root.path()).unwrap(), &package, &pool).unwrap();
    let stored = linked.current().tree().join("bin/Runner.Listener");
    std::fs::remove_file(&stored).unwrap();
    std::fs::write(&stored, "#!/bin/sh\necho replaced\n").unwrap();
    std::fs::set_permissions(&stored, std::fs::Permissions::from_mode(0o555)).unwrap();
    let backend = UserIsolation {
        root: root.clone(),
        package: Some(std::sync::Arc::new(linked)),
        pool: Pool::new(vec![Account { uid, gid: uid }]),
        cgroups: None,
        network: None,
        docker: None,
        run_keep: vec![],
    };
    let attempt_id = format!("abcdef012345{}", "0".repeat(20));
    let plan = Plan {
        attempt_id: attempt_id.clone(),
        workspace: WorkspaceKind::Ephemeral,
        runtime_dir: root.ephemeral_path(&attempt_id).unwrap(),
        uid: Some(uid),
        cgroup: None,
        limits: Limits::default(),
        env: Default::default(),
        network_allow: None,
        egress: None,
        egress_report: None,
        docker: None,
        cache: None,
        image: None,
        devices: None,
    };
    let runtime = backend.prepare(&plan).unwrap();
    assert_eq!(
        std::fs::read_to_string(runtime.dir().join("bin/Runner.Listener")).unwrap(),
        LISTENER_SCRIPT,
        "the runtime links the rebuilt store, not the replaced file"
    );
    backend
        .package
        .as_ref()
        .unwrap()
        .current()
        .verify()
        .unwrap();
    assert_eq!(backend.clean(&plan).unwrap().runtime, Removal::Removed);
}

#[test]
#[allow(
    unsafe_code,
    reason = "the test plants a descriptor and a key as an agent's parent would"
)]
fn a_runner_started_isolated_is_its_own_uid_and_leaves_nothing() {
    if !rustix::process::geteuid().is_root() {
        crate::test_skip::cannot_run(
            "a_runner_started_isolated_is_its_own_uid_and_leaves_nothing",
            "root",
            "only root can switch users",
        );
        return;
    }
    let (_dir, package, root) = package_and_root();
    let stored = LinkedPackage::install(
        Store::open(root.path()).unwrap(),
        &package,
        &Pool::new(Vec::new()),
    )
    .unwrap();
    let resolved = {
        let _one_at_a_time = crate::cgroup::TEST_RESOLVING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        CgroupRoot::resolve(None)
    };
    let cgroups = match resolved {
        Ok(cgroups) => Some(cgroups),
        Err(e) => {
            crate::test_skip::cannot_run(
                "a_runner_started_isolated_is_its_own_uid_and_leaves_nothing (its cgroup part)",
                "cgroup",
                &format!("no writable cgroup v2 here: {e}"),
            );
            None
        }
    };
    let uid = 3_000_000 + std::process::id() % 100_000;
    // Two host services' sockets under /run, any uid may connect to: the operator keeps one
    // (`host.runner_run_keep`), the runner's empty /run hides the other.
    let services = Path::new("/run").join(format!("rm-backend-test-{}", std::process::id()));
    std::fs::create_dir_all(&services).unwrap();
    let _remove = RemovedOnDrop(services.clone());
    let _kept = std::os::unix::net::UnixListener::bind(services.join("kept.sock")).unwrap();
    let _hidden = std::os::unix::net::UnixListener::bind(services.join("hidden.sock")).unwrap();
    let backend = UserIsolation {
        root: root.clone(),
        package: Some(std::sync::Arc::new(stored)),
        pool: Pool::new(vec![Account { uid, gid: uid }]),
        cgroups: cgroups.clone(),
        network: None,
        docker: None,
        run_keep: vec![services.join("kept.sock"), services.join("absent.sock")],
    };
    let attempt_id = format!("{:012x}{}", u64::from(uid), "0".repeat(20));
    let plan = Plan {
        attempt_id: attempt_id.clone(),
        workspace: WorkspaceKind::Ephemeral,
        runtime_dir: root.ephemeral_path(&attempt_id).unwrap(),
        uid: Some(uid),
        cgroup: cgroups
            .as_ref()
            .map(|c| c.runner_path(&format!("rm-{}", &attempt_id[..12])).unwrap()),
        limits: Limits::default(),
        env: OperatorEnv::new(vec![
            (
                "KEPT_SOCKET".to_owned(),
                services.join("kept.sock").display().to_string(),
            ),
            (
                "HIDDEN_SOCKET".to_owned(),
                services.join("hidden.sock").display().to_string(),
            ),
        ]),
        network_allow: None,
        egress: None,
        egress_report: None,
        docker: None,
        cache: None,
        image: None,
        devices: None,
    };
    let runtime = backend.prepare(&plan).unwrap();
    let meta = std::fs::metadata(runtime.dir()).unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&meta),
        uid,
        "the runtime is the runner's"
    );
    // What the agent may hold that no runner may: a descriptor inherited from whatever started
    // it (not close-on-exec, as a shell's redirection is) and a key in its session keyring.
    let leaked = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDONLY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    // At a number no other test's descriptor has (F_DUPFD: the lowest free one from 947; a dup2
    // would close whatever another test thread holds there).
    // SAFETY: fcntl(F_DUPFD) on a descriptor this test owns.
    let leaked_at =
        unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&leaked), libc::F_DUPFD, 947) };
    assert!(leaked_at >= 947, "{}", std::io::Error::last_os_error());
    // SAFETY: add_key with NUL-terminated strings and a buffer of the given length.
    let key = unsafe {
        libc::syscall(
            libc::SYS_add_key,
            c"user".as_ptr(),
            c"rm-backend-test-key".as_ptr(),
            c"secret".as_ptr(),
            6usize,
            -3i64, // KEY_SPEC_SESSION_KEYRING
        )
    };
    assert!(key > 0, "add_key: {}", std::io::Error::last_os_error());
    let mut spawned = backend
        .start(&plan, &runtime, &SecretString::from("jit-value"))
        .unwrap();
    // SAFETY: closes the descriptor planted above.
    unsafe { libc::close(leaked_at) };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while spawned.child.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the listener did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let report = std::fs::read_to_string(runtime.dir().join("report.txt")).unwrap();
    let get = |key: &str| {
        report
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key} in {report}"))
            .to_owned()
    };
    assert_eq!(get("uid"), uid.to_string());
    assert_eq!(get("groups"), uid.to_string(), "no supplementary group");
    assert_eq!(get("nnp"), "1");
    assert_eq!(
        get("home"),
        runtime.dir().join("home").display().to_string()
    );
    assert_eq!(get("tmpdir"), runtime.tmp().display().to_string());
    // A fresh private /tmp: nothing in it but the way to the runtime, when the runtime itself
    // lives under /tmp (as this test's does).
    let way: String = match runtime.dir().strip_prefix("/tmp") {
        Ok(below) => below
            .components()
            .next()
            .map(|c| format!("{} ", c.as_os_str().to_string_lossy()))
            .unwrap_or_default(),
        Err(_) => String::new(),
    };
    assert_eq!(get("tmp_entries"), way, "a fresh private /tmp");
    assert_eq!(get("jit"), "jit-value");
    assert_eq!(get("package_write"), "denied");
    if let Some(path) = &plan.cgroup {
        assert!(
            path.ends_with(get("cgroup").trim_start_matches('/')),
            "in its cgroup {}: {report}",
            path.display()
        );
    }
    assert!(report.ends_with("done\n"), "{report}");
    assert!(
        !Path::new("/tmp/rm-backend-test-poison").exists(),
        "/tmp of the host untouched"
    );
    assert_eq!(get("tty"), "denied", "no controlling terminal");
    assert_eq!(get("inherited_fd"), "denied", "no inherited descriptor");
    assert_eq!(
        get("session_key"),
        "denied",
        "not the agent's session keyring"
    );
    let processes: usize = get("processes").parse().unwrap();
    assert!(
        processes <= 6,
        "only its own processes in its /proc: {report}"
    );
    assert!(get("hostname").starts_with("rm-"), "{report}");
    // Its /run: empty but for its lock directory and what the operator kept (an entry absent
    // when the runner starts is left out).
    assert_eq!(
        get("run_entries"),
        format!("lock {} ", services.file_name().unwrap().to_string_lossy()),
        "{report}"
    );
    assert_eq!(get("kept_socket"), "ok", "the kept socket: {report}");
    assert_eq!(get("hidden_socket"), "denied", "a host socket: {report}");
    // The daemon it left died with its PID namespace when the runner exited.
    assert!(
        uid::processes_of(uid).unwrap().is_empty(),
        "the setsid daemon outlived its runner"
    );

    let cleaned = backend.clean(&plan).unwrap();
    assert_eq!(cleaned.runtime, Removal::Removed);
    assert!(
        uid::processes_of(uid).unwrap().is_empty(),
        "nothing of the uid is left"
    );
    assert!(!runtime.dir().exists());
    if let Some(path) = &plan.cgroup {
        assert!(!path.exists(), "the cgroup is removed");
    }
    // Idempotent: a second clean after a crash finds nothing to do.
    assert_eq!(backend.clean(&plan).unwrap().runtime, Removal::Absent);
}

/// A listener that says which interfaces its network has and exits.
const NETWORK_SCRIPT: &str = r#"#!/bin/sh
cd "$(dirname "$0")/.."
awk -F: 'NR > 2 { gsub(/ /, "", $1); printf "%s ", $1 }' /proc/net/dev > report.txt
"#;

/// A backend whose runners get a private network (or not), its package printing the runner's
/// interfaces, and a plan maker: what the network test and the start-cost measurement share.
fn network_backend(
    private: bool,
    table: &str,
) -> (
    tempfile::TempDir,
    UserIsolation,
    impl Fn(u32, usize) -> Plan,
) {
    let (dir, package, root) = package_and_root();
    std::fs::write(package.join("bin/Runner.Listener"), NETWORK_SCRIPT).unwrap();
    let stored = LinkedPackage::install(
        Store::open(root.path()).unwrap(),
        &package,
        &Pool::new(Vec::new()),
    )
    .unwrap();
    let cgroups = {
        let _one_at_a_time = crate::cgroup::TEST_RESOLVING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        CgroupRoot::resolve(None).ok()
    };
    let base = 3_100_000 + (std::process::id() % 1000) * 16;
    let network = private.then(|| {
        let host = HostNetwork {
            table: table.to_owned(),
            rules: network::HostRules::new(&[], &[], "", base..base + 16),
        };
        host.install().unwrap();
        Arc::new(host)
    });
    let backend = UserIsolation {
        root: root.clone(),
        package: Some(Arc::new(stored)),
        pool: Pool::new(
            (base..base + 16)
                .map(|uid| Account { uid, gid: uid })
                .collect(),
        ),
        cgroups: cgroups.clone(),
        network,
        docker: None,
        run_keep: vec![],
    };
    let plan = move |uid: u32, n: usize| {
        let attempt_id = format!("{:08x}{n:04x}{}", uid, "0".repeat(20));
        Plan {
            attempt_id: attempt_id.clone(),
            workspace: WorkspaceKind::Ephemeral,
            runtime_dir: root.ephemeral_path(&attempt_id).unwrap(),
            uid: Some(uid),
            cgroup: cgroups
                .as_ref()
                .map(|c| c.runner_path(&format!("rm-{}", &attempt_id[..12])).unwrap()),
            limits: Limits::default(),
            env: Default::default(),
            network_allow: None,
            egress: None,
            egress_report: None,
            docker: None,
            cache: None,
            image: None,
            devices: None,
        }
    };
    (dir, backend, plan)
}

/// Starts one runner of `plan` and waits for it to exit; how long `start` took.
fn run_once(backend: &UserIsolation, plan: &Plan) -> (Duration, String) {
    let runtime = backend.prepare(plan).unwrap();
    let started = std::time::Instant::now();
    let mut spawned = backend
        .start(plan, &runtime, &SecretString::from("jit"))
        .unwrap();
    let took = started.elapsed();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while spawned.child.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the listener did not exit"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let report = std::fs::read_to_string(runtime.dir().join("report.txt")).unwrap_or_default();
    backend.clean(plan).unwrap();
    (took, report)
}

/// Under `host.network = "private"` a runner's network has its loopback and its veth end and
/// nothing else of the host's; cleanup leaves no namespace and no veth.
#[test]
fn a_runner_in_a_private_network_sees_only_its_own_interfaces_and_leaves_none() {
    if !rustix::process::geteuid().is_root() {
        crate::test_skip::cannot_run(
            "a_runner_in_a_private_network_sees_only_its_own_interfaces_and_leaves_none",
            "root",
            "only root can make network namespaces",
        );
        return;
    }
    let table = format!("rm_test_{}", std::process::id());
    let (_dir, backend, plan_of) = network_backend(true, &table);
    let uid = backend.pool.accounts()[0].uid;
    let plan = plan_of(uid, 1);
    let (_, report) = run_once(&backend, &plan);
    assert_eq!(report.trim(), "lo eth0", "its own interfaces only");
    let names = network_names(&plan);
    assert!(!network::exists(&names), "{names:?} left after cleanup");
    // The control: the same runner in the host's network sees the host's interfaces.
    let (_dir2, host_backend, host_plan) = network_backend(false, &table);
    let uid = host_backend.pool.accounts()[1].uid;
    let (_, report) = run_once(&host_backend, &host_plan(uid, 2));
    assert_ne!(
        report.trim(),
        "lo eth0",
        "the control saw only a runner's interfaces"
    );
    // A leftover holding the slot's address (another agent with the same uids) is refused, not
    // shared: replies would go to the other runner.
    let squat = format!("rmsq{}", std::process::id() % 100_000);
    let ip = |args: &[&str]| {
        assert!(
            std::process::Command::new("ip")
                .args(args)
                .status()
                .unwrap()
                .success()
        );
    };
    ip(&[
        "link",
        "add",
        &squat,
        "type",
        "veth",
        "peer",
        "name",
        &format!("{squat}p"),
    ]);
    let held = network::addresses(network::slot_of(backend.pool.accounts()[2].uid)).host;
    ip(&["addr", "add", &format!("{held}/30"), "dev", &squat]);
    let plan3 = plan_of(backend.pool.accounts()[2].uid, 3);
    let runtime = backend.prepare(&plan3).unwrap();
    let refused = backend.start(&plan3, &runtime, &SecretString::from("jit"));
    ip(&["link", "del", &squat]);
    let why = refused.expect_err("a start on a held address").to_string();
    assert!(why.contains("already the address of"), "{why}");
    backend.clean(&plan3).unwrap();
    assert!(!network::exists(&network_names(&plan3)));

    // A runner no journal knows (its attempt lost with a poisoned journal's last writes) left
    // its veth on a uid's slot and its empty cgroup: with nothing running as the uid, both go
    // and the start goes on. (The squatter above, not named like a runner's veth, is refused.)
    let lost = format!("{:06x}ab5e17", std::process::id() % 0x100_0000);
    let lost_names = network::Names::of(&lost);
    let uid4 = backend.pool.accounts()[3].uid;
    ip(&["netns", "add", &lost_names.netns]);
    ip(&[
        "link",
        "add",
        &lost_names.veth,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        &lost_names.netns,
    ]);
    let slot4 = network::addresses(network::slot_of(uid4)).host;
    ip(&[
        "addr",
        "add",
        &format!("{slot4}/30"),
        "dev",
        &lost_names.veth,
    ]);
    let lost_cgroup = backend
        .cgroups
        .as_ref()
        .map(|root| root.runner_path(&format!("rm-{lost}")).unwrap());
    if let Some(path) = &lost_cgroup {
        std::fs::create_dir(path).unwrap();
    }
    let plan4 = plan_of(uid4, 4);
    let (_, report) = run_once(&backend, &plan4);
    assert_eq!(
        report.trim(),
        "lo eth0",
        "the new runner got the uid's network"
    );
    assert!(
        !network::exists(&lost_names),
        "the lost runner's network is left"
    );
    if let Some(path) = &lost_cgroup {
        assert!(
            !path.exists(),
            "the lost runner's cgroup {} is left",
            path.display()
        );
    }
    backend.network.as_ref().unwrap().uninstall().unwrap();
}

/// What a private network adds to a runner's start: `start` (namespace, veth, tables, then the
/// fork and exec) measured for runners with and without one, in one run. Prints p50/p99 for
/// docs/performance.md; asserts nothing about time.
/// `cargo test -p rm-agent --lib -- --ignored runner_start_cost --nocapture`
#[test]
#[ignore = "a measurement: run by hand for docs/performance.md"]
fn runner_start_cost_with_and_without_a_private_network() {
    const RUNS: usize = 40;
    let table = format!("rm_bench_{}", std::process::id());
    let mut results = Vec::new();
    for private in [false, true] {
        let (_dir, backend, plan) = network_backend(private, &table);
        let uid = backend.pool.accounts()[0].uid;
        let mut took: Vec<Duration> = (0..RUNS)
            .map(|n| run_once(&backend, &plan(uid, n)).0)
            .collect();
        took.sort();
        let p = |q: f64| took[((took.len() as f64 * q) as usize).min(took.len() - 1)];
        results.push((private, p(0.5), p(0.99)));
        if let Some(network) = &backend.network {
            network.uninstall().unwrap();
        }
    }
    for (private, p50, p99) in results {
        println!(
            "runner start ({}): p50 {:.1} ms, p99 {:.1} ms over {RUNS} runners",
            if private {
                "host.network = \"private\""
            } else {
                "host.network = \"host\""
            },
            p50.as_secs_f64() * 1000.0,
            p99.as_secs_f64() * 1000.0
        );
    }
}

#[test]
fn a_cached_runner_is_pointed_at_the_host_end_of_its_network_and_keeps_an_operators_hook() {
    let host_end = std::net::Ipv4Addr::new(10, 213, 0, 5);
    let plan = CachePlan {
        port: 8736,
        archives: Some(PathBuf::from("/var/lib/rm-agent/cache/actions")),
        hook: Some(PathBuf::from(
            "/var/lib/rm-agent/cache/hooks/job-started.sh",
        )),
    };
    let get = |env: &[(OsString, OsString)], key: &str| {
        env.iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.to_string_lossy().into_owned())
    };
    let env = cache_environment(&plan, host_end, None);
    for key in ["ACTIONS_RESULTS_URL", "ACTIONS_CACHE_URL", "RM_CACHE_URL"] {
        assert_eq!(
            get(&env, key).as_deref(),
            Some("http://10.213.0.5:8736/"),
            "{key}"
        );
    }
    assert_eq!(
        get(&env, "ACTIONS_RUNNER_ACTION_ARCHIVE_CACHE").as_deref(),
        Some(ARCHIVES_IN_RUN)
    );
    assert_eq!(get(&env, JOB_STARTED_HOOK).as_deref(), Some(HOOK_IN_RUN));
    assert_eq!(get(&env, OPERATOR_JOB_STARTED_HOOK), None);
    // The operator's hook is run by the agent's.
    let theirs = std::ffi::OsString::from("/etc/rm-agent/hooks/started.sh");
    let env = cache_environment(&plan, host_end, Some(&theirs));
    assert_eq!(
        get(&env, OPERATOR_JOB_STARTED_HOOK).as_deref(),
        Some("/etc/rm-agent/hooks/started.sh")
    );
    // Nothing kept, no hook: only the URLs.
    let bare = CachePlan {
        archives: None,
        hook: None,
        ..plan
    };
    let env = cache_environment(&bare, host_end, Some(&theirs));
    assert_eq!(env.len(), 3, "{env:?}");
}

/// A listener that reports what of the host and of the image it sees, then writes into the
/// image's tree.
const IMAGE_SCRIPT: &str = r#"#!/bin/sh
cd "$(dirname "$0")/.."
{
  echo "os=$(cat /etc/os-release)"
  echo "user=$(id -un)"
  echo "path=$PATH"
  echo "from_image=${TEST_FROM_IMAGE:-unset}"
  echo "root=$(ls -A / | tr '\n' ' ')"
  echo "dev=$(ls -A /dev | tr '\n' ' ')"
  if [ -e "$HOST_MARKER" ]; then echo "host_marker=seen"; else echo "host_marker=hidden"; fi
  if [ -e /srv/scratch/left ]; then echo "left=seen"; else echo "left=absent"; fi
  if echo x > /etc/rm-written 2>/dev/null; then echo "etc_write=ok"; else echo "etc_write=denied"; fi
  if echo x > /dev/null; then echo "dev_null=ok"; else echo "dev_null=broken"; fi
  echo "tmp_entries=$(ls -A /tmp | tr '\n' ' ')"
} > report.txt
echo left > /srv/scratch/left
echo done >> report.txt
"#;

/// A root filesystem of the host's static busybox: `/bin/<applet>` links, an `os-release` of
/// its own, a world-writable `/srv/scratch` and a set-uid-free tree.
fn busybox_rootfs(dir: &Path) -> Option<std::path::PathBuf> {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists())?;
    let root = dir.join("rootfs");
    for d in ["bin", "etc", "srv/scratch"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::set_permissions(
        root.join("srv/scratch"),
        std::fs::Permissions::from_mode(0o1777),
    )
    .unwrap();
    std::fs::copy(busybox, root.join("bin/busybox")).unwrap();
    for applet in ["sh", "cat", "ls", "id", "echo", "tr", "dirname"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    std::fs::write(root.join("etc/os-release"), "ID=rm-test-image\n").unwrap();
    Some(root)
}

#[test]
fn a_runner_with_an_image_sees_the_image_and_none_of_the_host() {
    let name = "a_runner_with_an_image_sees_the_image_and_none_of_the_host";
    if !rustix::process::geteuid().is_root() {
        crate::test_skip::cannot_run(name, "root", "only root can mount and switch users");
        return;
    }
    let (dir, package, root) = package_and_root();
    std::fs::write(package.join("bin/Runner.Listener"), IMAGE_SCRIPT).unwrap();
    let Some(rootfs) = busybox_rootfs(dir.path()) else {
        crate::test_skip::cannot_run(name, "busybox", "busybox-static is not installed");
        return;
    };
    let marker = Path::new("/etc").join(format!("rm-image-test-marker-{}", std::process::id()));
    std::fs::write(&marker, "host").unwrap();
    let _marker = RemovedOnDrop(marker.clone());
    let uid = 3_200_000 + std::process::id() % 100_000;
    let stored = LinkedPackage::install(
        Store::open(root.path()).unwrap(),
        &package,
        &Pool::new(Vec::new()),
    )
    .unwrap();
    let backend = UserIsolation {
        root: root.clone(),
        package: Some(Arc::new(stored)),
        pool: Pool::new(vec![Account { uid, gid: uid }]),
        cgroups: None,
        network: None,
        docker: None,
        run_keep: vec![],
    };
    let run = |n: u64| {
        let attempt_id = format!("{:012x}{}", u64::from(uid) * 16 + n, "0".repeat(20));
        let plan = Plan {
            attempt_id: attempt_id.clone(),
            workspace: WorkspaceKind::Ephemeral,
            runtime_dir: root.ephemeral_path(&attempt_id).unwrap(),
            uid: Some(uid),
            cgroup: None,
            limits: Limits::default(),
            env: OperatorEnv::new(vec![(
                "HOST_MARKER".to_owned(),
                marker.display().to_string(),
            )]),
            network_allow: None,
            egress: None,
            egress_report: None,
            docker: None,
            cache: None,
            image: Some(crate::image_root::ImagePlan {
                id: "sha256:test".to_owned(),
                rootfs: rootfs.clone(),
                env: vec![
                    ("PATH".to_owned(), "/bin".to_owned()),
                    ("TEST_FROM_IMAGE".to_owned(), "yes".to_owned()),
                    ("HOME".to_owned(), "/root".to_owned()),
                ],
            }),
            devices: None,
        };
        let runtime = backend.prepare(&plan).unwrap();
        let mut spawned = backend
            .start(&plan, &runtime, &SecretString::from("jit-value"))
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while spawned.child.try_wait().unwrap().is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "the listener did not exit"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let report = std::fs::read_to_string(runtime.dir().join("report.txt"))
            .unwrap_or_else(|e| panic!("no report ({e}): {}", backend_log(runtime.dir())));
        assert_eq!(backend.clean(&plan).unwrap().runtime, Removal::Removed);
        assert!(!runtime.dir().exists());
        report
    };
    let first = run(1);
    let get = |report: &str, key: &str| {
        report
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key} in {report}"))
            .to_owned()
    };
    assert_eq!(get(&first, "os"), "ID=rm-test-image", "{first}");
    assert_eq!(get(&first, "user"), "runner", "{first}");
    assert_eq!(get(&first, "path"), "/bin", "the image's PATH: {first}");
    assert_eq!(get(&first, "from_image"), "yes", "{first}");
    assert_eq!(get(&first, "host_marker"), "hidden", "{first}");
    assert_eq!(
        get(&first, "etc_write"),
        "denied",
        "the image's /etc is root's: {first}"
    );
    assert_eq!(get(&first, "dev_null"), "ok", "{first}");
    assert_eq!(get(&first, "left"), "absent", "{first}");
    assert!(first.ends_with("done\n"), "{first}");
    let dev = get(&first, "dev");
    for want in [
        "null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm",
    ] {
        assert!(
            dev.split(' ').any(|d| d == want),
            "/dev lacks {want}: {first}"
        );
    }
    assert!(
        !dev.split(' ')
            .any(|d| d == "sda" || d == "mem" || d == "kmsg"),
        "{first}"
    );
    // The second runner does not see what the first wrote into the image's tree, and the
    // image's own directory in the store is untouched.
    let second = run(2);
    assert_eq!(get(&second, "left"), "absent", "{second}");
    assert!(
        !rootfs.join("srv/scratch/left").exists(),
        "the store's tree was written"
    );
}

/// The runner's captured output, for a failure message.
fn backend_log(runtime: &Path) -> String {
    let mut out = String::new();
    for entry in walk_files(runtime) {
        if entry.extension().is_some_and(|e| e == "log") {
            out.push_str(&std::fs::read_to_string(&entry).unwrap_or_default());
        }
    }
    out
}

fn walk_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                out.extend(walk_files(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn an_egress_runner_runs_the_agents_job_completed_hook_and_keeps_an_operators() {
    let env = egress_environment(None);
    assert_eq!(
        env,
        vec![(
            OsString::from(JOB_COMPLETED_HOOK),
            OsString::from(EGRESS_HOOK_IN_RUN)
        )]
    );
    assert!(EGRESS_HOOK_IN_RUN.starts_with(EGRESS_IN_RUN));
    let theirs = OsString::from("/etc/rm-agent/hooks/completed.sh");
    let env = egress_environment(Some(&theirs));
    assert_eq!(
        env[1],
        (OsString::from(OPERATOR_JOB_COMPLETED_HOOK), theirs.clone())
    );
}

/// A listener that tries every way to a device node it knows of: the one it was given
/// (`NODE_A`), the one it was not (`NODE_B`), a clone of that one outside `/dev`
/// (`CLONE_B`, in its own runtime), making one with B's number itself, a host process's
/// `/proc` entry (the test's own pid), and the root of its namespace's pid 1. Each attempt
/// prints `ok` or the error it met.
const DEVICE_SCRIPT: &str = r#"#!/bin/sh
cd "$(dirname "$0")/.."
opens() {
  if out=$(dd if=/dev/zero of="$1" bs=1 count=1 conv=nocreat 2>&1); then echo ok; else echo "$out" | tail -n 1; fi
}
{
  echo "a=$(opens "$NODE_A")"
  echo "b=$(opens "$NODE_B")"
  echo "clone=$(opens "$CLONE_B")"
  if out=$(mknod "$TMPDIR/made" c 1 3 2>&1); then echo "mknod=ok"; else echo "mknod=$out"; fi
  echo "dev=$(ls -A /dev | tr '\n' ' ')"
  if [ -e "/proc/$AGENT_PID" ]; then echo "agent_proc=present"; else echo "agent_proc=absent"; fi
  if ls /proc/1/root/ >/dev/null 2>&1; then echo "pid1_root=ok"; else echo "pid1_root=denied"; fi
} > report.txt
echo done >> report.txt
"#;

/// Device nodes the test made under `/dev`, removed when it ends, failed or not.
struct TestDevices(Vec<PathBuf>);

impl Drop for TestDevices {
    fn drop(&mut self) {
        for dir in &self.0 {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Makes a character device of `/dev/null`'s number (1:3), mode 0666, at `path`.
fn null_clone(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::from_raw_mode(0o666),
        rustix::fs::makedev(1, 3),
    )
    .unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).unwrap();
}

/// On a host that declares devices, a runner given node A opens A and nothing else: B is not in
/// its `/dev` (ENOENT), a clone of B outside `/dev` does not open (its mount is `nodev`), it
/// cannot make B's number itself (EPERM: no capabilities), no other host node is in its `/dev`,
/// no host process is in its `/proc`, and its namespace's pid 1 (root's) does not lend it its
/// root. A runner given none opens neither. The control:
/// the same runner on a host without devices opens B and its clone (the attack works without
/// the defence). A plan naming what is not a device node under /dev/ starts no runner.
#[test]
fn a_runner_opens_only_the_devices_it_was_given() {
    let name = "a_runner_opens_only_the_devices_it_was_given";
    if !rustix::process::geteuid().is_root() {
        crate::test_skip::cannot_run(
            name,
            "root",
            "only root can make device nodes and switch users",
        );
        return;
    }
    let pid = std::process::id();
    let dirs: Vec<PathBuf> = (0..2)
        .map(|n| PathBuf::from(format!("/dev/rm-test-{pid}-{n}")))
        .collect();
    let _remove = TestDevices(dirs.clone());
    for dir in &dirs {
        std::fs::create_dir(dir).unwrap();
        null_clone(&dir.join("node"));
    }
    let (node_a, node_b) = (dirs[0].join("node"), dirs[1].join("node"));
    // A is group-only on the host (as a `render` node is): the runner, with no supplementary
    // groups, opens it because its copy in the runner's /dev is the runner's own.
    std::fs::set_permissions(&node_a, std::fs::Permissions::from_mode(0o660)).unwrap();
    let (_dir, package, root) = package_and_root();
    std::fs::write(package.join("bin/Runner.Listener"), DEVICE_SCRIPT).unwrap();
    let uid = 3_400_000 + pid % 100_000;
    let stored = LinkedPackage::install(
        Store::open(root.path()).unwrap(),
        &package,
        &Pool::new(Vec::new()),
    )
    .unwrap();
    let backend = UserIsolation {
        root: root.clone(),
        package: Some(Arc::new(stored)),
        pool: Pool::new(vec![Account { uid, gid: uid }]),
        cgroups: None,
        network: None,
        docker: None,
        run_keep: vec![],
    };
    let plan_of = |n: u64, devices: Option<crate::devices::DevicePlan>| {
        let attempt_id = format!("{:012x}{}", u64::from(uid) * 16 + n, "0".repeat(20));
        let runtime_dir = root.ephemeral_path(&attempt_id).unwrap();
        Plan {
            attempt_id,
            workspace: WorkspaceKind::Ephemeral,
            env: OperatorEnv::new(vec![
                ("NODE_A".to_owned(), node_a.display().to_string()),
                ("NODE_B".to_owned(), node_b.display().to_string()),
                (
                    "CLONE_B".to_owned(),
                    runtime_dir.join("clone-of-b").display().to_string(),
                ),
                ("AGENT_PID".to_owned(), pid.to_string()),
            ]),
            runtime_dir,
            uid: Some(uid),
            cgroup: None,
            limits: Limits::default(),
            network_allow: None,
            egress: None,
            egress_report: None,
            docker: None,
            cache: None,
            image: None,
            devices,
        }
    };
    let run = |plan: &Plan| -> String {
        let runtime = backend.prepare(plan).unwrap();
        // Another path to B's node, where the runner can reach it: its own runtime.
        null_clone(&runtime.dir().join("clone-of-b"));
        let mut spawned = backend
            .start(plan, &runtime, &SecretString::from("jit-value"))
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while spawned.child.try_wait().unwrap().is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "the listener did not exit"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let report = std::fs::read_to_string(runtime.dir().join("report.txt"))
            .unwrap_or_else(|e| panic!("no report ({e}): {}", backend_log(runtime.dir())));
        assert_eq!(backend.clean(plan).unwrap().runtime, Removal::Removed);
        assert!(report.ends_with("done\n"), "{report}");
        report
    };
    let get = |report: &str, key: &str| {
        report
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key} in {report}"))
            .to_owned()
    };
    let basic = "fd full null ptmx pts random shm stderr stdin stdout tty urandom zero";
    let sorted_dev = |report: &str| {
        let mut entries: Vec<String> = get(report, "dev")
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        entries.sort();
        entries.join(" ")
    };
    let test_dir = |n: usize| dirs[n].file_name().unwrap().to_string_lossy().into_owned();

    // Given A.
    let given_a = run(&plan_of(
        1,
        Some(crate::devices::DevicePlan {
            nodes: vec![node_a.clone()],
        }),
    ));
    assert_eq!(
        get(&given_a, "a"),
        "ok",
        "its own device, group-only on the host: {given_a}"
    );
    assert!(
        get(&given_a, "b").contains("No such file or directory"),
        "B is not in its /dev: {given_a}"
    );
    assert!(
        get(&given_a, "clone").contains("Permission denied"),
        "a clone of B outside /dev is on a nodev mount: {given_a}"
    );
    assert!(
        get(&given_a, "mknod").contains("Operation not permitted"),
        "no capability to make a node: {given_a}"
    );
    let mut want: Vec<String> = basic.split(' ').map(str::to_owned).collect();
    want.push(test_dir(0));
    want.sort();
    assert_eq!(
        sorted_dev(&given_a),
        want.join(" "),
        "only the basic nodes and A's directory"
    );
    assert_eq!(get(&given_a, "agent_proc"), "absent", "{given_a}");
    assert_eq!(
        get(&given_a, "pid1_root"),
        "denied",
        "its namespace's pid 1 is root's: {given_a}"
    );

    // Given none, on a device host.
    let given_none = run(&plan_of(2, Some(crate::devices::DevicePlan::default())));
    for node in ["a", "b"] {
        assert!(
            get(&given_none, node).contains("No such file or directory"),
            "{node}: {given_none}"
        );
    }
    assert!(
        get(&given_none, "clone").contains("Permission denied"),
        "{given_none}"
    );
    assert_eq!(sorted_dev(&given_none), basic, "{given_none}");

    // The control: a host without devices, where the runner sees the host's /dev.
    let control = run(&plan_of(3, None));
    assert_eq!(
        get(&control, "b"),
        "ok",
        "the control could not open B: {control}"
    );
    assert_eq!(
        get(&control, "clone"),
        "ok",
        "the control could not open the clone: {control}"
    );
    assert!(
        sorted_dev(&control).split(' ').any(|d| d == test_dir(1)),
        "{control}"
    );
    assert!(
        get(&control, "mknod").contains("Operation not permitted"),
        "{control}"
    );
    assert_eq!(get(&control, "agent_proc"), "absent", "{control}");
    // Without its own copy, the group-only A does not open for the runner's uid.
    assert!(
        get(&control, "a").contains("Permission denied"),
        "{control}"
    );

    // What is not a device node under /dev/ starts no runner, and says which path it is.
    let plan = plan_of(
        4,
        Some(crate::devices::DevicePlan {
            nodes: vec![node_a.clone(), PathBuf::from("/etc/passwd")],
        }),
    );
    let runtime = backend.prepare(&plan).unwrap();
    let refused = backend
        .start(&plan, &runtime, &SecretString::from("jit"))
        .expect_err("a plan naming /etc/passwd");
    assert!(
        matches!(&refused, BackendError::Device(_)) && refused.to_string().contains("/etc/passwd"),
        "{refused}"
    );
    assert!(!runtime.dir().join("report.txt").exists());
    backend.clean(&plan).unwrap();
    // Not isolated, a runner cannot be held to its devices: refused.
    let none = NoIsolation {
        root: root.clone(),
        package: crate::package::current::CurrentPackage::new(&package),
    };
    let plan = plan_of(5, Some(crate::devices::DevicePlan::default()));
    let runtime = none.prepare(&plan).unwrap();
    assert!(matches!(
        none.start(&plan, &runtime, &SecretString::from("jit")),
        Err(BackendError::Device(
            crate::devices::DeviceError::NotIsolated
        ))
    ));
    none.clean(&plan).unwrap();
}

/// [`DEVICE_SCRIPT`] for an image of busybox's few applets: shell redirections only.
const IMAGE_DEVICE_SCRIPT: &str = r#"#!/bin/sh
cd "$(dirname "$0")/.."
{
  if (echo x > "$NODE_A") 2>/dev/null; then echo "a=ok"; else echo "a=denied"; fi
  if [ -e "$NODE_B" ]; then echo "b=present"; else echo "b=absent"; fi
  if [ -c "$CLONE_B" ]; then echo "clone_node=present"; else echo "clone_node=absent"; fi
  if (echo x > "$CLONE_B") 2>/dev/null; then echo "clone=ok"; else echo "clone=denied"; fi
  echo "dev=$(ls -A /dev | tr '\n' ' ')"
} > report.txt
echo done >> report.txt
"#;

/// A runner whose root is an image gets its given nodes in the image's own `/dev`, and on a
/// device host the clone of another node in its runtime does not open there either.
#[test]
fn an_image_runner_on_a_device_host_gets_its_nodes_in_its_own_dev() {
    let name = "an_image_runner_on_a_device_host_gets_its_nodes_in_its_own_dev";
    if !rustix::process::geteuid().is_root() {
        crate::test_skip::cannot_run(name, "root", "only root can make device nodes and mount");
        return;
    }
    let (dir, package, root) = package_and_root();
    std::fs::write(package.join("bin/Runner.Listener"), IMAGE_DEVICE_SCRIPT).unwrap();
    let Some(rootfs) = busybox_rootfs(dir.path()) else {
        crate::test_skip::cannot_run(name, "busybox", "busybox-static is not installed");
        return;
    };
    let pid = std::process::id();
    // Numbered apart from the other device test's, which runs in this process at the same time.
    let dirs: Vec<PathBuf> = (2..4)
        .map(|n| PathBuf::from(format!("/dev/rm-test-{pid}-{n}")))
        .collect();
    let _remove = TestDevices(dirs.clone());
    for dir in &dirs {
        std::fs::create_dir(dir).unwrap();
        null_clone(&dir.join("node"));
    }
    let (node_a, node_b) = (dirs[0].join("node"), dirs[1].join("node"));
    let uid = 3_500_000 + pid % 100_000;
    let stored = LinkedPackage::install(
        Store::open(root.path()).unwrap(),
        &package,
        &Pool::new(Vec::new()),
    )
    .unwrap();
    let backend = UserIsolation {
        root: root.clone(),
        package: Some(Arc::new(stored)),
        pool: Pool::new(vec![Account { uid, gid: uid }]),
        cgroups: None,
        network: None,
        docker: None,
        run_keep: vec![],
    };
    let attempt_id = format!("{:012x}{}", u64::from(uid) * 16 + 1, "0".repeat(20));
    let runtime_dir = root.ephemeral_path(&attempt_id).unwrap();
    let plan = Plan {
        attempt_id,
        workspace: WorkspaceKind::Ephemeral,
        env: OperatorEnv::new(vec![
            ("NODE_A".to_owned(), node_a.display().to_string()),
            ("NODE_B".to_owned(), node_b.display().to_string()),
            (
                "CLONE_B".to_owned(),
                runtime_dir.join("clone-of-b").display().to_string(),
            ),
        ]),
        runtime_dir,
        uid: Some(uid),
        cgroup: None,
        limits: Limits::default(),
        network_allow: None,
        egress: None,
        egress_report: None,
        docker: None,
        cache: None,
        image: Some(crate::image_root::ImagePlan {
            id: "sha256:test".to_owned(),
            rootfs,
            env: vec![("PATH".to_owned(), "/bin".to_owned())],
        }),
        devices: Some(crate::devices::DevicePlan {
            nodes: vec![node_a.clone()],
        }),
    };
    let report = {
        let runtime = backend.prepare(&plan).unwrap();
        null_clone(&runtime.dir().join("clone-of-b"));
        let mut spawned = backend
            .start(&plan, &runtime, &SecretString::from("jit"))
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while spawned.child.try_wait().unwrap().is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "the listener did not exit"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let report = std::fs::read_to_string(runtime.dir().join("report.txt"))
            .unwrap_or_else(|e| panic!("no report ({e}): {}", backend_log(runtime.dir())));
        assert_eq!(backend.clean(&plan).unwrap().runtime, Removal::Removed);
        report
    };
    assert!(report.ends_with("done\n"), "{report}");
    for (key, want) in [
        ("a", "ok"),
        ("b", "absent"),
        ("clone_node", "present"),
        ("clone", "denied"),
    ] {
        assert!(
            report.contains(&format!("{key}={want}\n")),
            "{key}: {report}"
        );
    }
    let a_dir = dirs[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("dev=") && l.split(' ').any(|d| d == a_dir)),
        "{report}"
    );
}
