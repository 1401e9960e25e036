//! Runner isolation (CONTRACT §7, issue 11) attacked through `rm-agent run`: the runner
//! package's `bin/Runner.Listener` is a hostile job (a POSIX sh script) that tries each attack
//! the issue lists, writes one line per attack (`name=ok|denied detail`) to a report directory,
//! then `exec`s the real fake listener so the runner registers and completes its job. Under
//! `isolation = "user"` every attack must be denied and nothing of the runners may be left;
//! under `isolation = "none"` the same package shows the attacks that then succeed, so the suite
//! can fail. A crash test SIGKILLs the agent while isolated runners run.
//!
//! The setup lives under `CARGO_TARGET_TMPDIR` (or, for a checkout under `/tmp`, under
//! `/var/lib/rm-e2e-isolation`), never under `/tmp`: an isolated runner gets its own empty
//! `/tmp`, which would hide the key, the journal and the other runners' paths instead of the
//! permissions having to stop the job.

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rm_e2e::fleet::{Fleet, FleetOptions, PolicySpec, REPO, wait_until};
use rm_e2e::standin::{self, StandIn};
use rm_fake_github::RunnerBehavior;
use rm_journal::{AttemptOutcome, AttemptRecord, AttemptState};

const LABELS: &[&str] = &["self-hosted", "linux"];
const HOSTILE: &[&str] = &["self-hosted", "hostile"];
const VICTIM: &[&str] = &["self-hosted", "victim"];

/// `pids_max` of the hostile policy.
const PIDS_MAX: u32 = 40;
/// How many processes the fork attack tries to start.
const FORKS: u32 = 100;

/// A package data file the job tries to rewrite.
const MARKER: &str = "the package as the agent unpacked it\n";

/// What the job tries while other runners of the fleet may run (phase 1): each must be denied
/// under `isolation = "user"`.
const ATTACKS: &[(&str, &str)] = &[
    ("key", "read the App's private key file"),
    ("agent_environ", "read /proc/<agent>/environ"),
    ("agent_mem", "read /proc/<agent>/mem"),
    ("journal", "read the journal"),
    ("journal_write", "open the journal for writing"),
    ("status", "read status.json"),
    ("data_write", "create a file in the data directory"),
    ("signal", "signal the agent (kill -0)"),
    ("root_list", "list the runner root"),
    ("store_list", "list the package store"),
    ("store_write", "write a file of the package store"),
    (
        "pkg_runtime_write",
        "append to a package file in its own runtime",
    ),
    (
        "pkg_runtime_chmod",
        "chmod a package file in its own runtime",
    ),
    ("pkg_source_write", "append to the package source directory"),
    ("slot_read", "read another policy's persistent slot"),
    ("slot_write", "write another policy's persistent slot"),
    ("peer_environ", "read a concurrent runner's environment"),
    ("peer_cwd", "list a concurrent runner's /proc/<pid>/cwd"),
    ("peer_runtime", "list a concurrent runner's runtime"),
    ("peer_signal", "signal a concurrent runner (kill -0)"),
    ("peer_found", "see a concurrent runner's process"),
    (
        "host_loopback",
        "connect to a service on the host's loopback",
    ),
    ("receiver_port", "connect to the agent's receiver port"),
    (
        "host_unix_socket",
        "connect to a host service's unix socket under /run",
    ),
    ("metadata", "reach the (stand-in) cloud metadata address"),
    (
        "agent_session_key",
        "read a key of the agent's session keyring",
    ),
    (
        "inherited_fd",
        "write through a descriptor the agent inherited",
    ),
    ("tty", "open the agent's controlling terminal"),
];

/// What a job must still be able to do in its own network (phase 1): each must succeed.
const WORKS: &[(&str, &str)] = &[
    (
        "egress_public",
        "reach a public server (a stand-in) by address",
    ),
    ("dns", "resolve a name through the host's loopback resolver"),
    ("egress_by_name", "reach the public server by name"),
    (
        "allowed_host_port",
        "reach an allowed host port (the fake GitHub)",
    ),
];

/// What the next job finds of the previous jobs' writes (phase 2).
const LEFTOVERS: &[(&str, &str)] = &[
    ("leftover_home", "$HOME/.gitconfig of an earlier job"),
    ("leftover_tmp", "/tmp of an earlier job"),
    ("leftover_var_tmp", "/var/tmp of an earlier job"),
    ("leftover_dev_shm", "/dev/shm of an earlier job"),
];

/// The writes phase 2 looks for: they must work (in the job's own places) for the leftover
/// checks to mean anything.
const POISON: &[&str] = &[
    "poison_home",
    "poison_tmp",
    "poison_var_tmp",
    "poison_dev_shm",
];

/// The key the agent's parent puts in the agent's session keyring ([`agent_inherits`]), and what
/// it holds: the job's `agent_session_key` attack succeeds only if it reads exactly this.
const AGENT_KEY: &str = "rm-e2e-agent-key";
const AGENT_KEY_SECRET: &str = "agent-secret-5d1c";

/// What an attacker runs to take a key by name (perl, which the job has; `keyctl` of keyutils
/// may not be installed): `request_key(2)` without a callout searches every keyring the caller
/// possesses (its thread's, process's and session keyrings, then its user's), finding a key the
/// caller may search; then `KEYCTL_READ` (11) reads it, which a key's possessor may. Prints the
/// key's payload; dies with the errno otherwise (`ENOKEY`: not found, `EACCES`: found, not
/// readable). Perl's `syscall` passes a string argument as a pointer to its bytes and writes into
/// it, hence the variables rather than literals.
fn steal_key_program() -> String {
    format!(
        r#"my ($type, $name) = ("user", $ARGV[0]); my $id = syscall({request_key}, $type, $name, 0, 0); die "request_key: $!\n" if $id < 0; my $buf = "\0" x 4096; my $n = syscall({keyctl}, 11, $id, $buf, 4096); die "KEYCTL_READ of key $id: $!\n" if $n < 0; print substr($buf, 0, $n);"#,
        request_key = libc::SYS_request_key,
        keyctl = libc::SYS_keyctl,
    )
}

/// The hostile job. `@NAME@` are replaced with the fleet's paths.
const SCRIPT: &str = r#"#!/bin/sh
# A hostile job (issue 11): tries each attack, reports `name=ok|denied detail` for each, then
# runs the real listener so the runner registers and completes its job.
REPORT='@REPORT@'
KEY='@KEY@'
DATA='@DATA@'
JOURNAL='@JOURNAL@'
ROOT='@ROOT@'
PKG='@PKG@'
SLOT='@SLOT@'
MARK='@MARK@'
SLEEP='@SLEEP@'
HERE=$(cd "$(dirname "$0")/.." 2>/dev/null && pwd -P)
REAL="$HERE/bin/Runner.Listener.real"
case "$HERE" in
*/victim/s*) exec "$REAL" "$@" ;;
esac
OUT="$REPORT/${HERE##*/}.txt"
PHASE=$(cat "$REPORT/phase" 2>/dev/null)
AGENT=$(cat "$REPORT/agent.pid" 2>/dev/null)

# Connects to ADDR:PORT, sends a request, prints the answer; fails if it cannot connect.
GET='my $s = IO::Socket::INET->new(PeerAddr => $ARGV[0], Timeout => 3) or die "$!\n"; print $s "GET / HTTP/1.0\r\n\r\n"; print while <$s>;'

# Connects to ADDR:PORT and leaves; fails if it cannot connect.
CONNECT='IO::Socket::INET->new(PeerAddr => $ARGV[0], Timeout => 3) or die "$!\n";'

# Finds the key named $ARGV[0] in the keyrings this job possesses and prints what it holds.
STEAL_KEY='@STEAL_KEY@'

say() {
    printf '%s=%s %s\n' "$1" "$2" "$3" >>"$OUT" 2>/dev/null
}

# try NAME COMMAND...: `ok` if the command succeeds, `denied` with what it said otherwise.
try() {
    name=$1
    shift
    if out=$(timeout 10 "$@" 2>&1 </dev/null); then
        say "$name" ok "$(printf '%s' "$out" | tr '\n' ' ' | head -c 160)"
    else
        say "$name" denied "$(printf '%s' "$out" | tr '\n' ' ' | head -c 160)"
    fi
}

# Another runner of this fleet (not this one, nor a process of this one): "pid runtime". As an
# attacker would, one whose environment shows its JIT configuration if any does (a runner's own
# subshells carry the same name); else, after 2 s of looking, the first one seen.
find_peer() {
    i=0
    first=""
    while [ "$i" -lt 100 ]; do
        for d in /proc/[0-9]*; do
            comm=""
            { read -r comm <"$d/comm"; } 2>/dev/null
            case "$comm" in
            Runner.Listene*) ;;
            *) continue ;;
            esac
            cmd=$(tr '\0' ' ' <"$d/cmdline" 2>/dev/null)
            case "$cmd" in
            *"$HERE/"*) continue ;;
            *"$ROOT/"*) ;;
            *) continue ;;
            esac
            for w in $cmd; do
                case "$w" in
                "$ROOT"/*)
                    seen="${d#/proc/} ${w%/bin/Runner.Listener*}"
                    if tr '\0' '\n' <"$d/environ" 2>/dev/null | grep -q '^ACTIONS_RUNNER_INPUT_JITCONFIG='; then
                        echo "$seen"
                        return 0
                    fi
                    [ -n "$first" ] || first=$seen
                    break
                    ;;
                esac
            done
        done
        if [ -n "$first" ] && [ "$i" -ge 20 ]; then
            echo "$first"
            return 0
        fi
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

attacks() {
    say uid "$(id -u)" "phase $PHASE"
    say agent_pid "$AGENT" ""
    try key sh -c 'head -c 64 "$1" | grep -q "PRIVATE KEY"' _ "$KEY"
    try agent_environ sh -c 'tr "\0" "\n" <"/proc/$1/environ" | grep -q "^RM_WEBHOOK_SECRET="' _ "$AGENT"
    try agent_mem sh -c 'start=$(head -n 1 "/proc/$1/maps" | cut -d- -f1)
        if [ -z "$start" ]; then dd if="/proc/$1/mem" of=/dev/null bs=1 count=1; exit 1; fi
        n=$(dd if="/proc/$1/mem" bs=1 count=16 skip=$(printf %d "0x$start") 2>/dev/null | wc -c)
        [ "$n" -eq 16 ]' _ "$AGENT"
    try journal sh -c 'head -c 15 "$1" | grep -q "SQLite format"' _ "$JOURNAL"
    try journal_write sh -c ': >>"$1"' _ "$JOURNAL"
    try status sh -c 'c=$(head -c 1 "$1") && [ -n "$c" ]' _ "$DATA/status.json"
    try data_write sh -c 'echo pwned >"$1/pwned-$2"' _ "$DATA" "$$"
    try signal sh -c 'kill -0 "$1"' _ "$AGENT"
    try root_list sh -c 'ls -a "$1" | grep -q .' _ "$ROOT"
    try store_list sh -c 'ls -a "$1/.rm-package" | grep -q .' _ "$ROOT"
    try store_write sh -c 'for f in "$1"/.rm-package/*/*/bin/marker.txt "$1"/.rm-package/*/bin/marker.txt; do
            if [ -e "$f" ]; then echo pwned >>"$f" && exit 0; fi
        done
        ls "$1/.rm-package"; exit 1' _ "$ROOT"
    try pkg_runtime_write sh -c 'echo pwned >>"$1/bin/marker.txt"' _ "$HERE"
    try pkg_runtime_chmod sh -c 'chmod 0666 "$1/bin/marker.txt"' _ "$HERE"
    try pkg_source_write sh -c 'echo pwned >>"$1/bin/marker.txt"' _ "$PKG"
    try slot_read sh -c 'cat "$1/_work/widgets/widgets/job.txt"' _ "$SLOT"
    try slot_write sh -c 'echo pwned >"$1/_work/pwned-$2"' _ "$SLOT" "$$"
    try poison_home sh -c 'printf "[core]\n\thooksPath = /tmp/%s\n" "$1" >>"$HOME/.gitconfig"' _ "$MARK"
    try poison_tmp sh -c 'echo "$1" >>"/tmp/rm-poison-$1"' _ "$MARK"
    try poison_var_tmp sh -c 'echo "$1" >>"/var/tmp/rm-poison-$1"' _ "$MARK"
    try poison_dev_shm sh -c 'echo "$1" >>"/dev/shm/rm-poison-$1"' _ "$MARK"

    try host_loopback perl -MIO::Socket::INET -e "$CONNECT" '@LOOPBACK@'
    try receiver_port perl -MIO::Socket::INET -e "$CONNECT" '@RECEIVER@'
    try host_unix_socket perl -MIO::Socket::UNIX -e 'IO::Socket::UNIX->new(Peer => $ARGV[0]) or die "$!\n"' '@UNIX_SOCKET@'
    try metadata sh -c 'perl -MIO::Socket::INET -e "$1" "$2" | grep -q METADATA-SECRET' _ "$GET" '@METADATA@:80'
    try agent_session_key sh -c 'perl -e "$1" "$2" | grep -x "$3"' _ "$STEAL_KEY" '@AGENT_KEY@' '@AGENT_KEY_SECRET@'
    try inherited_fd sh -c 'echo pwned >&47'
    try tty sh -c ': </dev/tty'
    try egress_public sh -c 'perl -MIO::Socket::INET -e "$1" "$2" | grep -q PUBLIC-OK' _ "$GET" '@PUBLIC@:80'
    try dns sh -c 'getent ahostsv4 "$1" | grep -q "^$2 "' _ '@NAME@' '@PUBLIC@'
    try egress_by_name sh -c 'perl -MIO::Socket::INET -e "$1" "$2" | grep -q PUBLIC-OK' _ "$GET" '@NAME@:80'
    try allowed_host_port perl -MIO::Socket::INET -e "$CONNECT" '@FAKE@'
    say tmp_kib "$(df -Pk /tmp | awk 'NR == 2 { print $2 }')" "the size of /tmp"

    found=$(find_peer)
    if [ -n "$found" ]; then
        peer=${found%% *}
        peer_runtime=${found#* }
        say peer_found ok "$found"
        try peer_environ sh -c 'tr "\0" "\n" <"/proc/$1/environ" | grep -q "^ACTIONS_RUNNER_INPUT_JITCONFIG="' _ "$peer"
        try peer_cwd sh -c 'ls -a "/proc/$1/cwd/" | grep -q .' _ "$peer"
        try peer_runtime sh -c 'ls -a "$1/" | grep -q .' _ "$peer_runtime"
        try peer_signal sh -c 'kill -0 "$1"' _ "$peer"
    else
        say peer_found denied "no other runner seen within 10 s"
        for a in peer_environ peer_cwd peer_runtime peer_signal; do
            say "$a" denied "no other runner's process is visible"
        done
    fi

    # Fork past pids_max: perl counts the forks that worked, then kills and reaps them (a shell
    # whose fork fails exits, which must not happen to this script before its exec).
    forks=$(timeout 60 perl -e 'my @k; for (1 .. @FORKS@) { my $p = fork; last unless defined $p; if (!$p) { sleep 30; exit 0 } push @k, $p } print scalar(@k); kill 9, @k; waitpid($_, 0) for @k;' 2>/dev/null)
    say forks "${forks:-none}" "of @FORKS@"

    # Leave a daemon and a double-forked process behind, both outside the runtime.
    setsid -f sh -c 'cd / && exec sleep "$1"' _ "${SLEEP}1" </dev/null >/dev/null 2>&1
    (cd / && (sleep "${SLEEP}2" </dev/null >/dev/null 2>&1 &) &)
    say daemons ok "sleep ${SLEEP}1, sleep ${SLEEP}2"
}

leftovers() {
    say uid "$(id -u)" "phase $PHASE"
    try leftover_home grep -q "$MARK" "$HOME/.gitconfig"
    try leftover_tmp grep -q "$MARK" "/tmp/rm-poison-$MARK"
    try leftover_var_tmp grep -q "$MARK" "/var/tmp/rm-poison-$MARK"
    try leftover_dev_shm grep -q "$MARK" "/dev/shm/rm-poison-$MARK"
}

case "$PHASE" in
1) attacks ;;
2) leftovers ;;
esac
exec "$REAL" "$@"
"#;

/// One line of a report: the outcome (`ok`, `denied`, or a count) and what the job saw.
type Report = BTreeMap<String, (String, String)>;

/// A fleet whose runner package is the hostile job, and what the test needs to judge it.
struct Hostile {
    fleet: Fleet,
    reports: PathBuf,
    real_listener: Vec<u8>,
    script: String,
    leftovers: Leftovers,
    /// Listening on the host's loopback while the jobs try to connect.
    _loopback: std::net::TcpListener,
    /// A host service's unix socket under `/run` that any uid may connect to.
    _unix: HostSocket,
    standin: StandIn,
    /// Opened for writing by the agent's parent and left to the agent as descriptor 47.
    root_only: PathBuf,
}

/// What a job under `isolation = "none"` may leave on the host: removed when the test ends,
/// whatever its outcome.
struct Leftovers {
    mark: String,
    sleep: String,
}

impl Leftovers {
    fn daemon_argvs(&self) -> [Vec<String>; 2] {
        [1, 2].map(|n| vec!["sleep".to_owned(), format!("{}{n}", self.sleep)])
    }

    /// The processes the job left behind: pid and argv.
    fn daemons(&self) -> Vec<(u32, Vec<String>)> {
        let wanted = self.daemon_argvs();
        processes()
            .into_iter()
            .filter(|p| wanted.contains(&p.argv))
            .map(|p| (p.pid, p.argv))
            .collect()
    }
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        for (pid, _) in self.daemons() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        for dir in ["/tmp", "/var/tmp", "/dev/shm"] {
            let _ = std::fs::remove_file(Path::new(dir).join(format!("rm-poison-{}", self.mark)));
        }
    }
}

/// A unique number for this test's names (marker, daemon argv).
fn unique() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "7{:05}{n}{:04}",
        std::process::id() % 100_000,
        nanos % 10_000
    )
}

pub(crate) use crate::runner_base::base_dir;

/// The hostile and the victim policy; the package replaced by the hostile job.
async fn hostile_fleet(isolation: Option<&'static str>) -> Hostile {
    let fleet = Fleet::start(FleetOptions {
        host_max: 4,
        policies: vec![
            PolicySpec {
                name: "hostile",
                target: "acme",
                labels: HOSTILE,
                max_runners: 3,
                workspace: "ephemeral",
                extra: "pids_max = 40\n",
            },
            PolicySpec {
                name: "victim",
                target: REPO,
                labels: VICTIM,
                max_runners: 1,
                workspace: "persistent",
                extra: "",
            },
        ],
        isolation,
        base_dir: Some(base_dir()),
        ..FleetOptions::default()
    })
    .await;
    let setup = fleet.setup.dir.path();
    let reports = fleet.reports_dir();
    let home = setup.join("agent-home");
    std::fs::create_dir(&home).unwrap();

    let bin = fleet.package.join("bin");
    std::fs::write(bin.join("marker.txt"), MARKER).unwrap();
    std::fs::set_permissions(
        bin.join("marker.txt"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    // A service only the host's loopback should reach, and what lies beyond the host.
    let loopback = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let unix = HostSocket::new();
    let standin = StandIn::start();
    // The agent's own descriptor (not close-on-exec, as a shell's redirection leaves it) on a
    // file only root may write.
    let root_only = setup.join("root-only.txt");
    std::fs::write(&root_only, "").unwrap();
    std::fs::set_permissions(&root_only, std::fs::Permissions::from_mode(0o600)).unwrap();
    let leftovers = Leftovers {
        mark: format!("m{}", unique()),
        sleep: unique(),
    };
    let path = |p: &Path| p.display().to_string();
    let script = SCRIPT
        .replace("@REPORT@", &path(&reports))
        .replace("@KEY@", &path(&setup.join("app.pem")))
        .replace("@DATA@", &path(&setup.join("data")))
        .replace("@JOURNAL@", &path(&fleet.setup.journal()))
        .replace("@ROOT@", &path(&fleet.runner_root))
        .replace("@PKG@", &path(&fleet.package))
        .replace(
            "@SLOT@",
            &path(&fleet.runner_root.join("victim").join("s0")),
        )
        .replace("@MARK@", &leftovers.mark)
        .replace("@SLEEP@", &leftovers.sleep)
        .replace("@FORKS@", &FORKS.to_string())
        .replace("@LOOPBACK@", &loopback.local_addr().unwrap().to_string())
        .replace("@RECEIVER@", &fleet.setup.addr.to_string())
        .replace("@UNIX_SOCKET@", &unix.path.display().to_string())
        .replace("@FAKE@", &format!("127.0.0.1:{}", fleet.fake.port()))
        .replace("@PUBLIC@", &standin.public.to_string())
        .replace("@METADATA@", &standin.metadata.to_string())
        .replace("@NAME@", standin::PUBLIC_NAME)
        .replace("@STEAL_KEY@", &steal_key_program())
        .replace("@AGENT_KEY@", AGENT_KEY)
        .replace("@AGENT_KEY_SECRET@", AGENT_KEY_SECRET);
    let real_listener = fleet.wrap_listener(&script);
    Hostile {
        fleet,
        reports,
        real_listener,
        script,
        leftovers,
        _loopback: loopback,
        _unix: unix,
        standin,
        root_only,
    }
}

/// A host service's unix socket in `/run/rm-e2e-<unique>/`, mode 0777 (as a PostgreSQL under
/// `local trust`, or any service that lets every local user connect): removed on drop.
pub(crate) struct HostSocket {
    pub(crate) path: PathBuf,
    _listener: std::os::unix::net::UnixListener,
}

impl HostSocket {
    pub(crate) fn new() -> HostSocket {
        let dir = PathBuf::from(format!("/run/rm-e2e-{}", unique()));
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.join("service.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
        HostSocket {
            path,
            _listener: listener,
        }
    }
}

impl Drop for HostSocket {
    fn drop(&mut self) {
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// What an agent may get from whatever starts it, and no job may reach: a descriptor open for
/// writing on a root-only file (number 47, not close-on-exec), a session keyring of its own
/// holding a key, and a controlling terminal (a pty whose master the test keeps open, as a
/// root shell would).
#[allow(unsafe_code)]
pub(crate) fn agent_inherits(command: &mut std::process::Command, root_only: &Path) {
    let path = std::ffi::CString::new(root_only.display().to_string()).unwrap();
    // SAFETY: posix_openpt and friends on a descriptor this test owns; the master is leaked on
    // purpose (kept open while the agent runs: the terminal stays alive).
    let master = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY) };
    assert!(
        master >= 0,
        "posix_openpt: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: as above.
    let slave = unsafe {
        assert_eq!(libc::grantpt(master), 0);
        assert_eq!(libc::unlockpt(master), 0);
        std::ffi::CStr::from_ptr(libc::ptsname(master)).to_owned()
    };
    let key = SessionKey::new();
    // SAFETY: the closure runs between fork and exec and makes raw system calls only, on
    // strings made before the fork.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(command, move || {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY);
            if fd < 0 || libc::dup2(fd, 47) != 47 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd);
            // A session of its own with the pty as its controlling terminal.
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let tty = libc::open(slave.as_ptr(), libc::O_RDWR);
            if tty < 0 || libc::ioctl(tty, libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(tty);
            key.plant()
        });
    }
}

/// [`AGENT_KEY`] in a session keyring of its own, as a root shell's `keyctl add user NAME DATA
/// @s` leaves it: planted between fork and exec, made before the fork.
struct SessionKey {
    name: std::ffi::CString,
    secret: std::ffi::CString,
}

impl SessionKey {
    fn new() -> SessionKey {
        SessionKey {
            name: std::ffi::CString::new(AGENT_KEY).unwrap(),
            secret: std::ffi::CString::new(AGENT_KEY_SECRET).unwrap(),
        }
    }

    /// Joins a new session keyring and adds the key to it, with the kernel's default
    /// permissions for a `user` key: its possessor may find and read it (any uid: possession is
    /// reaching the key from one's own keyrings), its owner only see it. So a process that
    /// shares this session keyring (a runner the agent started without a keyring of its own,
    /// whatever its uid) possesses the key and reads it. Raw system calls only.
    #[allow(unsafe_code)]
    fn plant(&self) -> std::io::Result<()> {
        // SAFETY: `keyctl` with integer arguments and a null name; `add_key` with
        // NUL-terminated strings and the payload's length.
        unsafe {
            // KEYCTL_JOIN_SESSION_KEYRING with no name: a new, empty session keyring.
            if libc::syscall(libc::SYS_keyctl, 1, std::ptr::null::<libc::c_char>()) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let key = libc::syscall(
                libc::SYS_add_key,
                c"user".as_ptr(),
                self.name.as_ptr(),
                self.secret.as_ptr(),
                self.secret.as_bytes().len(),
                // KEY_SPEC_SESSION_KEYRING
                -3 as libc::c_long,
            );
            if key < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// The hostile job's `agent_session_key` attack, shown able to succeed: a process of another
/// uid that shares the session keyring the key was planted in (a runner started without a
/// keyring of its own) takes the key; the same process after joining a session keyring of its
/// own (what a runner does) finds nothing. So `agent_session_key=denied` in the suite means the
/// runner left the agent's keyring, not that the probe cannot find or read a planted key.
#[test]
#[allow(unsafe_code)]
fn the_session_key_attack_takes_a_key_only_from_a_shared_session_keyring() {
    /// An unprivileged uid for the thief (`nobody`): the key's owner is root.
    const THIEF: libc::uid_t = 65_534;
    for own_keyring in [false, true] {
        let key = SessionKey::new();
        let mut command = std::process::Command::new("perl");
        command.args(["-e", &steal_key_program(), AGENT_KEY]);
        // SAFETY: raw system calls between fork and exec, on strings made before the fork.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                key.plant()?;
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setresgid(THIEF, THIEF, THIEF) != 0
                    || libc::setresuid(THIEF, THIEF, THIEF) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                if own_keyring
                    && libc::syscall(libc::SYS_keyctl, 1, std::ptr::null::<libc::c_char>()) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let out = command.output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        if own_keyring {
            assert!(
                !out.status.success() && stdout.is_empty() && stderr.contains("request_key"),
                "a keyring of its own: the key was found ({}: {stdout:?} {stderr:?})",
                out.status
            );
        } else {
            assert!(
                out.status.success() && stdout == AGENT_KEY_SECRET,
                "the shared session keyring: the key was not taken ({}: {stdout:?} {stderr:?})",
                out.status
            );
        }
    }
}

/// The attempts of each phase, and what was seen while they ran.
struct Phases {
    /// Alive until the test ends: a zombie it never reaped would show.
    _agent: rm_e2e::Agent,
    agent_pid: u32,
    victim: AttemptRecord,
    /// Owner and mode of the victim's slot and its `_work` once the victim was cleaned.
    victim_slot: String,
    attackers: Vec<AttemptRecord>,
    next: AttemptRecord,
    /// The job's daemons alive right after the attackers were cleaned.
    daemons_after_cleanup: Vec<(u32, Vec<String>)>,
    /// Two live attempts holding one uid, as sampled.
    shared_uids: Vec<String>,
    /// The most attackers live at once.
    most_live_attackers: usize,
}

pub(crate) fn attempt_of(fleet: &Fleet, job: u64) -> AttemptRecord {
    let job = i64::try_from(job).unwrap();
    let mut of_job: Vec<AttemptRecord> = fleet
        .attempts()
        .into_iter()
        .filter(|a| a.job_id == Some(rm_vocab::JobId::new(job)))
        .collect();
    assert_eq!(of_job.len(), 1, "one attempt took job {job}");
    of_job.remove(0)
}

/// Uids held by more than one uncleaned attempt in `attempts`.
fn shared_uids(attempts: &[AttemptRecord]) -> Vec<String> {
    let mut by_uid: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
    for a in attempts.iter().filter(|a| a.state != AttemptState::Cleaned) {
        if let Some(uid) = a.uid {
            by_uid.entry(uid).or_default().push(a.attempt_id.short());
        }
    }
    by_uid
        .into_iter()
        .filter(|(_, held)| held.len() > 1)
        .map(|(uid, held)| format!("uid {uid} held by {held:?}"))
        .collect()
}

/// Waits (bounded, without failing) until no process of the fleet's runner uids is left, not
/// even a zombie: the allocator does not give out a uid some process still has, and init
/// reaps a runner's killed orphans with a delay.
async fn runner_uids_reaped(fleet: &Fleet) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !processes_of_fleet(fleet).is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Phase 0: a victim job fills its persistent slot. Phase 1: two hostile jobs at once attack.
/// Phase 2: one more hostile job looks for what phase 1 left.
async fn run_phases(hostile: &Hostile) -> Phases {
    let fleet = &hostile.fleet;
    let phase = |n: &str| std::fs::write(hostile.reports.join("phase"), n).unwrap();
    phase("0");
    let agent = fleet
        .start_agent_with(
            &[(
                "HOME",
                fleet.setup.dir.path().join("agent-home").to_str().unwrap(),
            )],
            |command| {
                hostile.standin.agent_mount_namespace(command);
                agent_inherits(command, &hostile.root_only);
            },
        )
        .await;
    let agent_pid = agent.child.id();
    std::fs::write(hostile.reports.join("agent.pid"), agent_pid.to_string()).unwrap();

    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 500,
        ..RunnerBehavior::default()
    });
    let victim_job = fleet.fake.queue_job(REPO, "victim", VICTIM).unwrap();
    wait_until(Duration::from_secs(40), "the victim job done", || {
        fleet.completed(victim_job) && fleet.all_cleaned()
    })
    .await;
    let victim = attempt_of(fleet, victim_job);
    let victim_slot = owners(&fleet.runner_root.join("victim/s0"), &["", "_work"]);

    // An attacker should get the lowest free uid: the one the victim had.
    runner_uids_reaped(fleet).await;

    phase("1");
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 3_000,
        ..RunnerBehavior::default()
    });
    let attack_jobs = fleet
        .fake
        .queue_matrix(REPO, "attack", HOSTILE, &["a", "b"])
        .unwrap();
    let mut shared = Vec::new();
    let mut most_live = 0;
    wait_until(Duration::from_secs(90), "the attacking jobs done", || {
        let attempts = fleet.attempts();
        shared.extend(shared_uids(&attempts));
        most_live = most_live.max(
            attempts
                .iter()
                .filter(|a| a.policy == "hostile" && a.state != AttemptState::Cleaned)
                .count(),
        );
        attack_jobs.iter().all(|j| fleet.completed(*j)) && fleet.all_cleaned()
    })
    .await;
    let daemons_after_cleanup = hostile.leftovers.daemons();
    let attackers: Vec<AttemptRecord> = attack_jobs.iter().map(|j| attempt_of(fleet, *j)).collect();

    // The next job should get the lowest free uid, one an attacker had.
    runner_uids_reaped(fleet).await;

    phase("2");
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 500,
        ..RunnerBehavior::default()
    });
    let next_job = fleet.fake.queue_job(REPO, "next", HOSTILE).unwrap();
    wait_until(Duration::from_secs(40), "the next job done", || {
        let attempts = fleet.attempts();
        shared.extend(shared_uids(&attempts));
        fleet.completed(next_job) && fleet.all_cleaned()
    })
    .await;
    let next = attempt_of(fleet, next_job);
    Phases {
        _agent: agent,
        agent_pid,
        victim,
        victim_slot,
        attackers,
        next,
        daemons_after_cleanup,
        shared_uids: shared,
        most_live_attackers: most_live,
    }
}

/// `name: uid gid mode` of each of `names` below `dir` (`""` for `dir` itself).
fn owners(dir: &Path, names: &[&str]) -> String {
    use std::os::unix::fs::MetadataExt as _;
    names
        .iter()
        .map(|name| match std::fs::symlink_metadata(dir.join(name)) {
            Ok(m) => format!(
                "{}: uid {} gid {} mode {:o}",
                dir.join(name).display(),
                m.uid(),
                m.gid(),
                m.mode() & 0o7777
            ),
            Err(e) => format!("{}: {e}", dir.join(name).display()),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The report the job of `attempt` wrote (named after its runtime directory).
fn report_of(hostile: &Hostile, attempt: &AttemptRecord) -> Report {
    let name = attempt.runtime_dir.file_name().unwrap().to_str().unwrap();
    let path = hostile.reports.join(format!("{name}.txt"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "the job of attempt {} wrote no report {}: {e}",
            attempt.attempt_id.as_str(),
            path.display()
        )
    });
    text.lines()
        .filter_map(|line| {
            let (name, rest) = line.split_once('=')?;
            let (outcome, detail) = rest.split_once(' ').unwrap_or((rest, ""));
            Some((name.to_owned(), (outcome.to_owned(), detail.to_owned())))
        })
        .collect()
}

fn outcome<'r>(report: &'r Report, name: &str) -> Option<&'r str> {
    report.get(name).map(|(o, _)| o.as_str())
}

fn fork_count(report: &Report) -> Option<u32> {
    outcome(report, "forks").and_then(|n| n.parse().ok())
}

/// A process: pid, parent, state letter, real/effective/saved/fs uids, argv.
pub(crate) struct Proc {
    pub(crate) pid: u32,
    pub(crate) ppid: u32,
    pub(crate) state: String,
    pub(crate) uids: Vec<u32>,
    pub(crate) argv: Vec<String>,
}

impl Proc {
    /// Exited, waiting for its parent (or init) to reap it: it can do nothing any more.
    pub(crate) fn zombie(&self) -> bool {
        self.state == "Z"
    }

    pub(crate) fn describe(&self) -> String {
        format!(
            "pid {} ppid {} state {} uids {:?} argv {:?}",
            self.pid, self.ppid, self.state, self.uids, self.argv
        )
    }
}

pub(crate) fn processes() -> Vec<Proc> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .unwrap_or_default()
                .trim()
                .to_owned()
        };
        let uids = field("Uid:")
            .split_whitespace()
            .filter_map(|u| u.parse().ok())
            .collect();
        let ppid = field("PPid:").parse().unwrap_or(0);
        let state = field("State:").chars().take(1).collect();
        let argv = std::fs::read(entry.path().join("cmdline"))
            .unwrap_or_default()
            .split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect();
        all.push(Proc {
            pid,
            ppid,
            state,
            uids,
            argv,
        });
    }
    all
}

/// This fleet's runner uid range.
fn uid_range(fleet: &Fleet) -> std::ops::RangeInclusive<u32> {
    let (first, last) = fleet.uids.split_once('-').unwrap();
    first.parse().unwrap()..=last.parse().unwrap()
}

/// Every process running as one of the fleet's runner uids, zombies too.
fn processes_of_fleet(fleet: &Fleet) -> Vec<Proc> {
    let range = uid_range(fleet);
    processes()
        .into_iter()
        .filter(|p| p.uids.iter().any(|u| range.contains(u)))
        .collect()
}

/// What is left of the fleet's runner uids: processes still alive at once (none may be, once
/// every attempt is cleaned); then zombies not reaped within 15 s. A runner's killed orphans
/// are reaped by init, which may take a moment (this host's init polls); a zombie that stays
/// is a child some agent never waited for.
async fn left_of_runner_uids(fleet: &Fleet) -> (Vec<String>, Vec<String>) {
    let describe = |ps: Vec<Proc>| ps.iter().map(Proc::describe).collect::<Vec<_>>();
    let (mut zombies, alive): (Vec<Proc>, Vec<Proc>) = processes_of_fleet(fleet)
        .into_iter()
        .partition(Proc::zombie);
    let alive = describe(alive);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !zombies.is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        zombies = processes_of_fleet(fleet)
            .into_iter()
            .filter(Proc::zombie)
            .collect();
    }
    (alive, describe(zombies))
}

/// Where cgroup v2 is mounted on this host, from `/proc/self/mountinfo`.
fn cgroup2_mounts() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split_whitespace().nth(4)?;
            (right.split_whitespace().next()? == "cgroup2").then(|| PathBuf::from(mount_point))
        })
        .collect()
}

/// Directories named `rm-<short id>` of `attempts` anywhere (a few levels) under the cgroup v2
/// mounts.
pub(crate) fn cgroups_left(attempts: &[AttemptRecord]) -> Vec<PathBuf> {
    let names: HashSet<String> = attempts
        .iter()
        .map(|a| format!("rm-{}", a.attempt_id.short()))
        .collect();
    let mut found = Vec::new();
    let mut stack: Vec<(PathBuf, usize)> = cgroup2_mounts().into_iter().map(|m| (m, 0)).collect();
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let path = entry.path();
            if entry
                .file_name()
                .to_str()
                .is_some_and(|n| names.contains(n))
            {
                found.push(path.clone());
            }
            if depth < 4 {
                stack.push((path, depth + 1));
            }
        }
    }
    for a in attempts {
        if let Some(cgroup) = &a.cgroup
            && cgroup.exists()
            && !found.contains(cgroup)
        {
            found.push(cgroup.clone());
        }
    }
    found
}

/// Every file named `name` below `dir`.
fn files_named(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            found.extend(files_named(&path, name));
        } else if entry.file_name() == name {
            found.push(path);
        }
    }
    found
}

/// Names in `dir` starting with `prefix`.
pub(crate) fn names_with_prefix(dir: &Path, prefix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

fn uid_of(a: &AttemptRecord) -> String {
    a.uid.map_or_else(|| "none".to_owned(), |u| u.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_job_under_user_isolation_reaches_nothing() {
    let hostile = hostile_fleet(None).await;
    let fleet = &hostile.fleet;
    let phases = run_phases(&hostile).await;
    let mut findings: Vec<String> = Vec::new();

    for attacker in &phases.attackers {
        let report = report_of(&hostile, attacker);
        let who = format!(
            "runner {} (uid {})",
            attacker.attempt_id.short(),
            uid_of(attacker)
        );
        eprintln!("{who}: {report:?}");
        // What makes the report mean something.
        if outcome(&report, "agent_pid") != Some(phases.agent_pid.to_string().as_str()) {
            findings.push(format!(
                "{who}: the job was not pointed at the agent (pid {}): {:?}",
                phases.agent_pid,
                report.get("agent_pid")
            ));
        }
        // In its own PID namespace a job sees no other runner's process: finding one is an
        // attack (`peer_found`); that two attackers overlapped is proven below, from the journal.
        for name in POISON {
            if outcome(&report, name) != Some("ok") {
                findings.push(format!(
                    "{who}: could not even write its own {name}: {:?}",
                    report.get(*name)
                ));
            }
        }
        // Each attack, separately.
        for (name, what) in ATTACKS {
            match report.get(*name) {
                Some((o, _)) if o == "denied" => {}
                Some((o, detail)) => findings.push(format!(
                    "ISOLATION BREACH: {who} could {what} ({name}={o} {detail})"
                )),
                None => findings.push(format!("{who}: attack {name} ({what}) not reported")),
            }
        }
        for (name, what) in WORKS {
            if outcome(&report, name) != Some("ok") {
                findings.push(format!(
                    "{who}: could not {what} in its own network: {:?}",
                    report.get(*name)
                ));
            }
        }
        // Unbounded, a tmpfs may take half the host's memory (the kernel's default); bounded,
        // `/tmp` gets half of the policy's default memory_max, itself 3/4 of the host's memory
        // over max_runners (4 here).
        let tmp_bound = host_memory_kib() / 2 / 4;
        match outcome(&report, "tmp_kib").and_then(|k| k.parse::<u64>().ok()) {
            Some(kib) if kib <= tmp_bound => {}
            other => findings.push(format!(
                "ISOLATION BREACH: {who}'s /tmp holds {other:?} KiB, more than its bound {tmp_bound}"
            )),
        }
        match fork_count(&report) {
            Some(n) if n < PIDS_MAX => {}
            other => findings.push(format!(
                "ISOLATION BREACH: {who} started {other:?} of {FORKS} processes with pids_max = {PIDS_MAX}"
            )),
        }
    }

    let next = report_of(&hostile, &phases.next);
    eprintln!("next runner {}: {next:?}", phases.next.attempt_id.short());
    for (name, what) in LEFTOVERS {
        match next.get(*name) {
            Some((o, _)) if o == "denied" => {}
            Some((o, detail)) => findings.push(format!(
                "ISOLATION BREACH: the next job (uid {}) found {what} ({name}={o} {detail})",
                uid_of(&phases.next)
            )),
            None => findings.push(format!("the next job did not report {name}")),
        }
    }

    // Uids: every isolated attempt had one; the overlapping attackers had different ones; the
    // next job got one the attackers had (the lowest free), so its clean HOME and /tmp are the
    // isolation's doing, not another uid's.
    let all = fleet.attempts();
    for a in &all {
        if a.uid.is_none() {
            findings.push(format!(
                "attempt {} ran without a uid",
                a.attempt_id.short()
            ));
        }
        if a.state != AttemptState::Cleaned {
            findings.push(format!(
                "attempt {} is {}",
                a.attempt_id.short(),
                a.state.as_str()
            ));
        }
        if a.cgroup.is_none() {
            findings.push(format!(
                "attempt {} ran without a cgroup although cgroup v2 is mounted here ({:?})",
                a.attempt_id.short(),
                cgroup2_mounts()
            ));
        }
    }
    if phases.most_live_attackers < 2 {
        findings.push(format!(
            "the two attacking runners never ran at once (most live: {})",
            phases.most_live_attackers
        ));
    }
    let attacker_uids: Vec<Option<u32>> = phases.attackers.iter().map(|a| a.uid).collect();
    if attacker_uids[0] == attacker_uids[1] {
        findings.push(format!(
            "the overlapping attackers shared uid {:?}",
            attacker_uids[0]
        ));
    }
    findings.extend(phases.shared_uids.iter().map(|s| format!("sampled: {s}")));
    if !attacker_uids.contains(&phases.victim.uid) {
        findings.push(format!(
            "no attacker got the victim's uid {:?} (attackers: {attacker_uids:?}): the slot \
             attack then only tries a foreign uid and proves less than it should",
            phases.victim.uid
        ));
    }
    if !attacker_uids.contains(&phases.next.uid) {
        findings.push(format!(
            "the next job got uid {:?}, none of the attackers' {attacker_uids:?}: the leftover \
             checks prove less than they should",
            phases.next.uid
        ));
    }
    eprintln!(
        "uids: victim {}, attackers {attacker_uids:?}, next {}",
        uid_of(&phases.victim),
        uid_of(&phases.next)
    );

    // Nothing of the attackers outlived their cleanup.
    if !phases.daemons_after_cleanup.is_empty() {
        findings.push(format!(
            "ISOLATION BREACH: processes the job left survived its cleanup: {:?}",
            phases.daemons_after_cleanup
        ));
    }
    let (alive, zombies) = left_of_runner_uids(fleet).await;
    if !alive.is_empty() {
        findings.push(format!(
            "processes of runner uids alive after cleanup: {alive:?}"
        ));
    }
    if !zombies.is_empty() {
        findings.push(format!("zombies of runner uids never reaped: {zombies:?}"));
    }
    let cgroups = cgroups_left(&all);
    if !cgroups.is_empty() {
        findings.push(format!("runner cgroups left: {cgroups:?}"));
    }
    let ephemeral_left: Vec<PathBuf> = fleet
        .runtimes()
        .into_iter()
        .filter(|p| p.file_name() != Some(std::ffi::OsStr::new("victim")))
        .collect();
    if !ephemeral_left.is_empty() {
        findings.push(format!("runtimes left: {ephemeral_left:?}"));
    }

    // The package: its source and the store unchanged.
    let bin = fleet.package.join("bin");
    if std::fs::read_to_string(bin.join("marker.txt")).unwrap() != MARKER {
        findings.push("ISOLATION BREACH: the package source's bin/marker.txt changed".to_owned());
    }
    if std::fs::read(bin.join("Runner.Listener.real")).unwrap() != hostile.real_listener
        || std::fs::read_to_string(bin.join("Runner.Listener")).unwrap() != hostile.script
    {
        findings.push("ISOLATION BREACH: the package source's listener changed".to_owned());
    }
    let stored = files_named(&fleet.runner_root.join(".rm-package"), "marker.txt");
    if stored.is_empty() {
        findings.push("no bin/marker.txt in the package store to check".to_owned());
    }
    for file in &stored {
        let meta = std::fs::metadata(file).unwrap();
        if std::fs::read_to_string(file).unwrap() != MARKER
            || meta.permissions().mode() & 0o022 != 0
        {
            findings.push(format!(
                "ISOLATION BREACH: the stored {} changed (mode {:o})",
                file.display(),
                meta.permissions().mode()
            ));
        }
    }

    // The victim's slot and the agent's data directory hold nothing of the job.
    let work = fleet.runner_root.join("victim/s0/_work");
    let planted = names_with_prefix(&work, "pwned");
    if !planted.is_empty() {
        findings.push(format!(
            "ISOLATION BREACH: the job wrote {planted:?} into the victim's slot {} (victim uid {}; \
             after the victim's cleanup: {})",
            work.display(),
            uid_of(&phases.victim),
            phases.victim_slot
        ));
    }
    let data = fleet.setup.dir.path().join("data");
    let planted = names_with_prefix(&data, "pwned");
    if !planted.is_empty() {
        findings.push(format!(
            "ISOLATION BREACH: the job wrote {planted:?} into the data directory"
        ));
    }

    assert!(
        findings.is_empty(),
        "under isolation = \"user\":\n{}",
        findings.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_hostile_job_under_isolation_none_reaches_everything() {
    let hostile = hostile_fleet(Some("none")).await;
    let fleet = &hostile.fleet;
    let phases = run_phases(&hostile).await;
    let mut findings: Vec<String> = Vec::new();
    // With no isolation, what the job could reach (as the agent's user, root here).
    let expected = [
        "key",
        "journal",
        "status",
        "signal",
        "pkg_source_write",
        "slot_write",
        "peer_environ",
        "peer_found",
        "host_loopback",
        "receiver_port",
        "host_unix_socket",
        "metadata",
    ];
    for attacker in &phases.attackers {
        let report = report_of(&hostile, attacker);
        let who = format!("runner {}", attacker.attempt_id.short());
        eprintln!("{who}: {report:?}");
        assert_eq!(attacker.uid, None, "{who} got a uid under none");
        for name in expected {
            if outcome(&report, name) != Some("ok") {
                findings.push(format!(
                    "{who}: {name} did not succeed under none: {:?}",
                    report.get(name)
                ));
            }
        }
        if outcome(&report, "agent_environ") != Some("ok")
            && outcome(&report, "agent_mem") != Some("ok")
        {
            findings.push(format!(
                "{who}: reached neither the agent's environ nor its memory: {:?} {:?}",
                report.get("agent_environ"),
                report.get("agent_mem")
            ));
        }
        if fork_count(&report) != Some(FORKS) {
            findings.push(format!(
                "{who}: started {:?} of {FORKS} processes under none",
                report.get("forks")
            ));
        }
    }
    let next = report_of(&hostile, &phases.next);
    eprintln!("next runner {}: {next:?}", phases.next.attempt_id.short());
    for name in ["leftover_home", "leftover_tmp"] {
        if outcome(&next, name) != Some("ok") {
            findings.push(format!(
                "the next job did not find {name} under none: {:?}",
                next.get(name)
            ));
        }
    }
    let daemon = &hostile.leftovers.daemon_argvs()[0];
    if !phases
        .daemons_after_cleanup
        .iter()
        .any(|(_, argv)| argv == daemon)
    {
        findings.push(format!(
            "the setsid daemon did not outlive its runner under none: {:?}",
            phases.daemons_after_cleanup
        ));
    }
    if std::fs::read_to_string(fleet.package.join("bin/marker.txt")).unwrap() == MARKER {
        findings.push("the package source was not rewritten under none".to_owned());
    }
    if names_with_prefix(&fleet.runner_root.join("victim/s0/_work"), "pwned").is_empty() {
        findings.push("nothing was planted in the victim's slot under none".to_owned());
    }
    // `Leftovers` kills the daemons and removes the /tmp files when `hostile` is dropped.
    assert!(
        findings.is_empty(),
        "under isolation = \"none\" (the suite must be able to fail):\n{}",
        findings.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_runners_survive_an_agent_crash_and_leave_nothing() {
    let fleet = Fleet::start(FleetOptions::default()).await;
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 10_000,
        // A process that outlives its runner's process group: cleanup must still find it.
        fork_background: true,
        // Each job binds the agent's receiver port while the agent is down: in its own
        // network namespace, which leaves the host's port to the next agent.
        squat_port: Some(fleet.setup.addr.port()),
        ..RunnerBehavior::default()
    });
    let first = fleet.start_agent(&[]).await;
    let jobs = fleet
        .fake
        .queue_matrix(REPO, "build", LABELS, &["a", "b", "c"])
        .unwrap();
    let mut shared: Vec<String> = Vec::new();
    let mut busy: Vec<AttemptRecord> = Vec::new();
    wait_until(
        Duration::from_secs(40),
        "three isolated runners busy",
        || {
            let attempts = fleet.attempts();
            shared.extend(shared_uids(&attempts));
            busy = attempts
                .into_iter()
                .filter(|a| a.state == AttemptState::Busy)
                .collect();
            busy.len() == 3
        },
    )
    .await;
    let pids: Vec<u32> = busy.iter().map(|a| a.pid.unwrap()).collect();
    first.kill();
    for (a, pid) in busy.iter().zip(&pids) {
        assert!(
            Path::new(&format!("/proc/{pid}")).exists(),
            "runner {} (pid {pid}) did not survive the agent's SIGKILL",
            a.attempt_id.short()
        );
    }

    // The squatters hold the port in their namespaces: the new agent binds the host's (the
    // start waits for its receiver's /healthz) and is the one deliveries reach.
    let squats: Vec<String> = fleet
        .runtimes()
        .iter()
        .filter_map(|rt| std::fs::read_to_string(rt.join("_diag/squat.txt")).ok())
        .collect();
    let _second = fleet.start_agent(&[]).await;
    assert!(
        squats.iter().any(|s| s.starts_with("bound")),
        "no job could bind the port in its own namespace: {squats:?}"
    );
    wait_until(
        Duration::from_secs(60),
        "every job completed and every attempt cleaned",
        || {
            let attempts = fleet.attempts();
            shared.extend(shared_uids(&attempts));
            jobs.iter().all(|j| fleet.completed(*j)) && fleet.all_cleaned()
        },
    )
    .await;

    let attempts = fleet.attempts();
    let summary: Vec<String> = attempts
        .iter()
        .map(|a| {
            format!(
                "{} {} uid={} cgroup={:?} {:?}",
                a.attempt_id.short(),
                a.state.as_str(),
                uid_of(a),
                a.cgroup,
                a.outcome
            )
        })
        .collect();
    assert!(
        shared.is_empty(),
        "a uid was held by two uncleaned attempts: {shared:?}"
    );
    assert_eq!(attempts.len(), 3, "one attempt per job: {summary:?}");
    let uids: HashSet<Option<u32>> = attempts.iter().map(|a| a.uid).collect();
    assert_eq!(
        uids.len(),
        3,
        "the three runners had distinct uids: {summary:?}"
    );
    for a in &attempts {
        assert!(a.uid.is_some(), "an attempt without a uid: {summary:?}");
        assert!(
            a.cgroup.is_some(),
            "an attempt without a cgroup although cgroup v2 is mounted here ({:?}): {summary:?}",
            cgroup2_mounts()
        );
        assert_eq!(a.outcome, Some(AttemptOutcome::CompletedJob), "{summary:?}");
    }
    let cgroups = cgroups_left(&attempts);
    assert!(cgroups.is_empty(), "runner cgroups left: {cgroups:?}");
    let (alive, zombies) = left_of_runner_uids(&fleet).await;
    assert!(
        alive.is_empty(),
        "processes of runner uids alive after cleanup: {alive:?}"
    );
    assert!(
        zombies.is_empty(),
        "zombies of runner uids never reaped: {zombies:?}"
    );
    for pid in &pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "runner pid {pid} is still there"
        );
    }
    assert!(
        fleet.runtimes().is_empty(),
        "runtimes left: {:?}",
        fleet.runtimes()
    );
    assert!(fleet.our_registrations().is_empty(), "registration left");
}

/// How deep the `deep_tree` job nests its trees (issue 25): past the 1 024 levels at which
/// removal and `chown_tree` used to give up.
const DEEP_LEVELS: u32 = 1100;
const DEEP: &[&str] = &["self-hosted", "deep"];
const DEEP_SLOT: &[&str] = &["self-hosted", "deep-slot"];

/// The `deep_tree` attack: a job nests a tree [`DEEP_LEVELS`] deep in its runtime's `_work`, and
/// in a persistent slot in `_work` (kept for the next job) and beside it (scrubbed). Before
/// removal walked without a depth limit, such a runtime was never removed, its attempt never
/// `cleaned` and its uid never released; such a `_work` could not be handed to the slot's next
/// runner. A later job of the slot checks that it owns the tree to the bottom. Each step appends
/// `<runtime> <step> <result>` to the report.
const DEEP_SCRIPT: &str = r#"#!/bin/sh
HERE=$(cd "$(dirname "$0")/.." 2>/dev/null && pwd -P)
REAL="$HERE/bin/Runner.Listener.real"
REPORT='@REPORT@/deep.txt'
say() {
    printf '%s %s %s\n' "${HERE##*/}" "$1" "$2" >>"$REPORT" 2>/dev/null
}
# nest DIR: `d/d/...` @LEVELS@ deep below DIR, one chdir at a time (no path length limit);
# prints how deep it got.
nest() {
    mkdir -p "$1" && cd "$1" && perl -e 'my $n = 0; for (1 .. $ARGV[0]) { mkdir "d" or last; chdir "d" or last; $n++ } print $n' @LEVELS@
}
if [ -d "$HERE/_work/deep" ]; then
    # A later job of the slot: the tree is its own, down to the bottom.
    out=$(cd "$HERE/_work/deep" && perl -e 'for (1 .. $ARGV[0]) { chdir "d" or die "level $_: $!\n" } open(my $f, ">", "mine") or die "the bottom: $!\n"; print "ok"' @LEVELS@ 2>&1)
    say bottom "$out"
else
    say work "$(nest "$HERE/_work/deep")"
    say beside "$(nest "$HERE/deep")"
fi
exec "$REAL" "$@"
"#;

/// The `deep_tree` attack through `rm-agent run` under `isolation = "user"`: a job's tree
/// nested 1 100 deep is removed with its runtime, the attempt is `cleaned` and the next runner
/// gets the uid again; in a persistent slot, the tree beside `_work` is scrubbed and the one in
/// `_work` is handed to the slot's next runner whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_nesting_a_tree_past_a_thousand_levels_is_cleaned_and_its_uid_reused() {
    let fleet = Fleet::start(FleetOptions {
        host_max: 2,
        policies: vec![
            PolicySpec {
                name: "deep",
                target: "acme",
                labels: DEEP,
                max_runners: 1,
                workspace: "ephemeral",
                extra: "",
            },
            PolicySpec {
                name: "deep-slot",
                target: REPO,
                labels: DEEP_SLOT,
                max_runners: 1,
                workspace: "persistent",
                extra: "",
            },
        ],
        base_dir: Some(base_dir()),
        ..FleetOptions::default()
    })
    .await;
    let reports = fleet.reports_dir();
    fleet.wrap_listener(
        &DEEP_SCRIPT
            .replace("@REPORT@", &reports.display().to_string())
            .replace("@LEVELS@", &DEEP_LEVELS.to_string()),
    );
    let _agent = fleet.start_agent(&[]).await;
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 500,
        ..RunnerBehavior::default()
    });

    // Each job alone, so the next one can only get the uid again if the last was released.
    let run = async |name: &str, labels: &'static [&'static str]| {
        let job = fleet.fake.queue_job(REPO, name, labels).unwrap();
        wait_until(
            Duration::from_secs(90),
            &format!("job {name} done and its attempt cleaned (a runtime removal that gives up on a deep tree never cleans it)"),
            || fleet.completed(job) && fleet.all_cleaned(),
        )
        .await;
        runner_uids_reaped(&fleet).await;
        attempt_of(&fleet, job)
    };
    let first = run("deep-1", DEEP).await;
    let second = run("deep-2", DEEP).await;
    let slot_first = run("slot-1", DEEP_SLOT).await;
    let slot_second = run("slot-2", DEEP_SLOT).await;

    let report = std::fs::read_to_string(reports.join("deep.txt")).unwrap_or_default();
    eprintln!("{report}");
    let line = |attempt: &AttemptRecord, step: &str| {
        let runtime = attempt.runtime_dir.file_name().unwrap().to_str().unwrap();
        report
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("{runtime} {step} ")))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let levels = DEEP_LEVELS.to_string();
    for attempt in [&first, &second, &slot_first] {
        for step in ["work", "beside"] {
            assert!(
                line(attempt, step).contains(&levels),
                "the job of {} did not nest {step} {levels} deep: {report}",
                attempt.attempt_id.short()
            );
        }
    }
    assert_eq!(
        line(&slot_second, "bottom"),
        ["ok"],
        "the slot's next job does not own its `_work` to the bottom: {report}"
    );
    assert!(first.uid.is_some(), "not isolated: {first:?}");
    assert_eq!(
        second.uid, first.uid,
        "the next runner did not get the released uid again"
    );
    assert_eq!(slot_second.uid, slot_first.uid);
    for a in fleet.attempts() {
        assert_eq!(a.state, AttemptState::Cleaned, "{a:?}");
        assert_eq!(a.outcome, Some(AttemptOutcome::CompletedJob), "{a:?}");
    }
    assert!(
        !first.runtime_dir.exists() && !second.runtime_dir.exists(),
        "an ephemeral runtime is left"
    );
    let slot = &slot_second.runtime_dir;
    let mut kept: Vec<String> = std::fs::read_dir(slot)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    kept.sort();
    assert_eq!(kept, ["_work"], "the slot was not scrubbed down to `_work`");
}

/// `rm-agent check --json` of `fleet`'s configuration: its findings of `check` names.
async fn check_findings(fleet: &Fleet, names: &[&str]) -> (Option<i32>, Vec<serde_json::Value>) {
    let mut command = fleet.setup.command(&["check", "--json"]);
    let out = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check printed no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let findings = doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| names.iter().any(|n| f["check"] == *n))
        .cloned()
        .collect();
    (out.status.code(), findings)
}

/// What the agent hands every runner must be out of every job's reach (issues 25 and 38): a
/// `runner.package_dir` owned by a runner uid (the classic layout: a runner account's home) or
/// writable by others, anything inside it so (a 0777 `bin/`, a file a runner uid owns) or a link
/// out of it, an `env_file` or a `docker_images` tarball others may write, is refused by `run`
/// (exit 2, naming the key, the path and the fix, before any runner) and fails `check`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_package_source_or_env_file_a_job_could_change_is_refused_at_start() {
    use std::os::unix::fs::chown;
    let fleet = Fleet::start(FleetOptions::default()).await;
    let runner_uid: u32 = fleet.uids.split('-').next().unwrap().parse().unwrap();
    let package = fleet.package.clone();
    let shown = package.display().to_string();

    let refused = async |what: &str, names: &[&str]| {
        let (status, stderr) = fleet.run_agent_until_exit(Duration::from_secs(30)).await;
        assert_eq!(status.code(), Some(2), "{what}: run must refuse: {stderr}");
        let (code, findings) =
            check_findings(&fleet, &["runner_package", "env_file", "docker_images"]).await;
        assert_eq!(code, Some(1), "{what}: check must fail: {findings:?}");
        let failed: Vec<&serde_json::Value> =
            findings.iter().filter(|f| f["status"] == "fail").collect();
        assert!(
            !failed.is_empty(),
            "{what}: no failing finding: {findings:?}"
        );
        for name in names {
            assert!(
                stderr.contains(name),
                "{what}: run does not name {name}: {stderr}"
            );
            assert!(
                failed
                    .iter()
                    .any(|f| format!("{} {}", f["what"], f["remedy"]).contains(name)),
                "{what}: check does not name {name}: {failed:?}"
            );
        }
        assert!(fleet.attempts().is_empty(), "{what}: a runner was started");
        stderr
    };

    // The package in a runner uid's hands.
    chown(&package, Some(runner_uid), None).unwrap();
    let stderr = refused(
        "package owned by a runner uid",
        &["runner.package_dir", &shown, "chown root:root"],
    )
    .await;
    assert!(
        stderr.contains(&format!("runner uid {runner_uid}")),
        "{stderr}"
    );
    chown(&package, Some(0), None).unwrap();

    // The package writable by every user.
    std::fs::set_permissions(&package, std::fs::Permissions::from_mode(0o777)).unwrap();
    refused("package mode 0777", &[&shown, "chmod go-w"]).await;
    std::fs::set_permissions(&package, std::fs::Permissions::from_mode(0o755)).unwrap();

    // Inside a root-owned package: its `bin/` writable by every user (a job could replace the
    // listener).
    let bin = package.join("bin");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o777)).unwrap();
    refused(
        "a 0777 subdirectory",
        &[
            "runner.package_dir",
            &format!("chmod go-w {}", bin.display()),
        ],
    )
    .await;
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A file inside the package a runner uid owns, or a link out of it, are the same rule and
    // walk (`runner/src/trust/tests.rs`, `agent/src/trust/tests.rs`, in process).

    // An env_file every user may write.
    let env_file = fleet.setup.dir.path().join("runner.env");
    std::fs::write(&env_file, "LANG=C.UTF-8\n").unwrap();
    std::fs::set_permissions(&env_file, std::fs::Permissions::from_mode(0o666)).unwrap();
    let config = std::fs::read_to_string(fleet.setup.config()).unwrap();
    std::fs::write(
        fleet.setup.config(),
        format!("{config}env_file = \"{}\"\n", env_file.display()),
    )
    .unwrap();
    refused(
        "env_file mode 0666",
        &[
            "policy[0].env_file",
            &env_file.display().to_string(),
            "chmod go-w",
        ],
    )
    .await;

    std::fs::set_permissions(&env_file, std::fs::Permissions::from_mode(0o600)).unwrap();

    // A `docker_images` tarball every user may write (a job could save a trojaned image over
    // it).
    let image = fleet.setup.dir.path().join("pg.tar");
    std::fs::write(&image, "a tarball").unwrap();
    std::fs::set_permissions(&image, std::fs::Permissions::from_mode(0o666)).unwrap();
    let config = std::fs::read_to_string(fleet.setup.config()).unwrap();
    std::fs::write(
        fleet.setup.config(),
        format!(
            "{config}docker = true\ndocker_images = [\"{}\"]\n",
            image.display()
        ),
    )
    .unwrap();
    refused(
        "docker_images mode 0666",
        &[
            "policy[0].docker_images",
            &format!("chmod go-w {}", image.display()),
        ],
    )
    .await;
    std::fs::set_permissions(&image, std::fs::Permissions::from_mode(0o644)).unwrap();

    // Put right, none is refused any more.
    let (_, findings) = check_findings(&fleet, &["runner_package", "env_file"]).await;
    assert!(findings.iter().all(|f| f["status"] == "ok"), "{findings:?}");
}

/// `MemTotal` of the host, in KiB.
fn host_memory_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}
