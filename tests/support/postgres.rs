//! A real PostgreSQL server for tests and benchmarks, started by the test code itself: `initdb`
//! into a temporary directory, `postgres` listening only on a unix socket in that directory (no
//! TCP port to clash with anything), one database per test. One server per test binary
//! ([`shared`]); each test takes its own database ([`PgServer::database`]), dropped with it.
//!
//! PostgreSQL refuses to run as root. As root, `initdb` and `postgres` run under `setpriv` as the
//! system user `postgres` (created by Debian's `postgresql` package), else `nobody`, owning the
//! temporary directory. The server is started under `setpriv --pdeathsig` from a thread that
//! lives as long as the process, so it stops (fast shutdown) when the test binary exits, and a
//! shell around it removes the directory once it has stopped.
//!
//! Where it cannot run (no `initdb`, no `setpriv` as root), [`shared`] says why; the caller
//! applies the skip policy (`tests/support/skip.rs`, need `postgres`).
//!
//! One file, included by path (`#[path = ".../tests/support/postgres.rs"] mod postgres;`) into
//! the journal's unit tests and the intake benchmark; it spawns the PostgreSQL client tools
//! (`createdb`, `dropdb`) rather than linking a client, so it works with any.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The role the tests connect as (`initdb -U`), trusted on the socket.
pub(crate) const ROLE: &str = "rm";

/// How long the server may take to accept connections after it is started: generous, the
/// machine is shared by several builds.
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// Where Debian's `postgresql` package puts the server binaries (not on the PATH).
const DEBIAN_BIN_DIRS: &str = "/usr/lib/postgresql";

/// A running server.
#[derive(Debug)]
pub(crate) struct PgServer {
    /// The directory holding the cluster and the socket (`.s.PGSQL.<port>`).
    dir: PathBuf,
    /// Where `createdb` and `dropdb` are.
    bin: PathBuf,
    /// The port: names the socket file, and the TCP port of a [`TlsServer`].
    port: u16,
}

/// PostgreSQL's own port: the socket file of a server that listens on no TCP port.
const DEFAULT_PORT: u16 = 5432;

/// A database of its own for one test (or one benchmark run), dropped with this value.
#[derive(Debug)]
pub(crate) struct PgDatabase {
    server: &'static PgServer,
    name: String,
}

static SHARED: OnceLock<Result<PgServer, String>> = OnceLock::new();

/// The test binary's one server with `fsync` off (tests need no durability across a power loss),
/// started on first use; `Err` says why it cannot run here.
pub(crate) fn shared() -> Result<&'static PgServer, String> {
    SHARED
        .get_or_init(|| PgServer::start(false))
        .as_ref()
        .map_err(Clone::clone)
}

/// A server of its own that a test stops and starts again on the same socket (the database
/// going away under a fleet). Not [`shared`]: every test of the binary uses that one, and the
/// shell around it removes its directory when it stops. Started under `setpriv --pdeathsig`
/// from a thread that lives as long as the server, so it gets a fast shutdown if the test binary
/// exits; dropped, it is stopped and its directory removed.
#[derive(Debug)]
pub(crate) struct StoppableServer {
    server: PgServer,
    user: Option<(u32, u32, String)>,
    /// Settings beyond the defaults (`-c name=value`), applied at every start.
    settings: Vec<String>,
    /// Waits on the running `postgres` (ends when it exits).
    running: Option<std::thread::JoinHandle<()>>,
}

impl StoppableServer {
    /// `initdb` into a directory of its own (named after `label`), then starts the server and
    /// creates the database `rm`.
    pub(crate) fn start(label: &str) -> Result<StoppableServer, String> {
        Self::start_with(label, DEFAULT_PORT, |_, _| Ok(Vec::new()))
    }

    /// As [`Self::start`], on `port`; `setup` runs after `initdb` with the cluster's data
    /// directory and the user the server runs as, and answers extra settings.
    fn start_with(
        label: &str,
        port: u16,
        setup: impl FnOnce(&Path, &Option<(u32, u32, String)>) -> Result<Vec<String>, String>,
    ) -> Result<StoppableServer, String> {
        let bin = find_bin_dir().ok_or_else(|| {
            format!(
                "no `initdb` on the PATH or under {DEBIAN_BIN_DIRS}/*/bin (install Debian's \
                 `postgresql` package)"
            )
        })?;
        let user = unprivileged_user()?;
        let dir = base_dir(user.is_some()).join(format!("rm-pg-{}-{label}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        if let Some((uid, gid, _)) = &user {
            std::os::unix::fs::chown(&dir, Some(*uid), Some(*gid))
                .map_err(|e| format!("cannot give {} to uid {uid}: {e}", dir.display()))?;
        }
        init_cluster(&user, &bin, &dir.join("data"), &dir)?;
        let settings = setup(&dir.join("data"), &user)?;
        let mut server = StoppableServer {
            server: PgServer { dir, bin, port },
            user,
            settings,
            running: None,
        };
        server.resume()?;
        server.server.client_tool("createdb", &["rm"])?;
        Ok(server)
    }

    /// The connection string of its database `rm`.
    pub(crate) fn url(&self) -> String {
        self.server.url("rm")
    }

    /// Stops the postmaster (`pg_ctl stop -m fast`: connections are ended, the server shuts
    /// down cleanly) and waits until it has exited; the socket is gone until [`Self::resume`].
    pub(crate) fn stop(&mut self) -> Result<(), String> {
        let out = as_user(&self.user, &self.server.bin.join("pg_ctl"))
            .arg("stop")
            .arg("-D")
            .arg(self.server.dir.join("data"))
            .args(["-m", "fast", "-w", "-t", "60"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run pg_ctl: {e}"))?;
        if let Some(running) = self.running.take() {
            let _ = running.join();
        }
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "pg_ctl stop failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Starts the server again on the same directory and socket, and waits until it accepts
    /// connections.
    pub(crate) fn resume(&mut self) -> Result<(), String> {
        let dir = &self.server.dir;
        let mut postgres = as_user(&self.user, &self.server.bin.join("postgres"));
        postgres
            .arg("-D")
            .arg(dir.join("data"))
            .arg("-k")
            .arg(dir)
            .args(["-c", "listen_addresses=", "-c", "fsync=off"])
            .args([
                "-c",
                "max_connections=200",
                "-c",
                "log_min_messages=warning",
            ])
            .arg("-p")
            .arg(self.server.port.to_string());
        for setting in &self.settings {
            postgres.arg("-c").arg(setting);
        }
        postgres.stdin(Stdio::null()).stdout(Stdio::null());
        if self.user.is_none() {
            // Not root: no `setpriv` around it yet; one that only sets the parent-death signal.
            let mut wrapped = Command::new("setpriv");
            wrapped
                .arg("--pdeathsig=INT")
                .arg(postgres.get_program())
                .args(postgres.get_args())
                .stdin(Stdio::null())
                .stdout(Stdio::null());
            postgres = wrapped;
        }
        if let Ok(log) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("server.log"))
        {
            postgres.stderr(log);
        }
        let (started, outcome) = std::sync::mpsc::channel();
        let running = std::thread::Builder::new()
            .name("rm-test-postgres-stoppable".to_owned())
            .spawn(move || match postgres.spawn() {
                Ok(mut child) => {
                    let _ = started.send(Ok(()));
                    // This thread is the parent of record: it lives until the server exits.
                    let _ = child.wait();
                }
                Err(e) => {
                    let _ = started.send(Err(format!("cannot start postgres: {e}")));
                }
            })
            .map_err(|e| format!("cannot start the server thread: {e}"))?;
        outcome
            .recv()
            .map_err(|_| "the server thread ended before starting postgres".to_owned())??;
        self.running = Some(running);
        self.server.wait_ready()
    }
}

impl Drop for StoppableServer {
    fn drop(&mut self) {
        if self.running.is_some() {
            let _ = as_user(&self.user, &self.server.bin.join("pg_ctl"))
                .arg("stop")
                .arg("-D")
                .arg(self.server.dir.join("data"))
                .args(["-m", "immediate", "-w"])
                .stdin(Stdio::null())
                .output();
            if let Some(running) = self.running.take() {
                let _ = running.join();
            }
        }
        let _ = std::fs::remove_dir_all(&self.server.dir);
    }
}

/// A server that takes TCP connections on 127.0.0.1 only over TLS (`hostssl` in pg_hba.conf,
/// no `host` line: a plain TCP login is refused), with a test CA and a server certificate for
/// `localhost` (not for `127.0.0.1`) made by `openssl` (Debian's `postgresql` depends on it
/// through `ssl-cert`). Its unix socket stays trusted, for the client tools. Dropped, it stops.
#[derive(Debug)]
pub(crate) struct TlsServer {
    server: StoppableServer,
    /// Holds `ca.crt` (the CA that signed the server's certificate) and `other-ca.crt` (one that
    /// did not).
    certs: tempfile::TempDir,
}

impl TlsServer {
    pub(crate) fn start(label: &str) -> Result<TlsServer, String> {
        let certs = tempfile::tempdir().map_err(|e| format!("cannot make a directory: {e}"))?;
        make_certificates(certs.path())?;
        let port = free_port()?;
        let from = certs.path().to_owned();
        let server = StoppableServer::start_with(label, port, move |data, user| {
            for file in ["server.crt", "server.key"] {
                let to = data.join(file);
                std::fs::copy(from.join(file), &to)
                    .map_err(|e| format!("cannot copy {file}: {e}"))?;
                std::fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                    .map_err(|e| format!("cannot chmod {file}: {e}"))?;
                if let Some((uid, gid, _)) = user {
                    std::os::unix::fs::chown(&to, Some(*uid), Some(*gid))
                        .map_err(|e| format!("cannot chown {file}: {e}"))?;
                }
            }
            std::fs::write(
                data.join("pg_hba.conf"),
                "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
            )
            .map_err(|e| format!("cannot write pg_hba.conf: {e}"))?;
            Ok(vec![
                "listen_addresses=127.0.0.1".to_owned(),
                "ssl=on".to_owned(),
                "ssl_cert_file=server.crt".to_owned(),
                "ssl_key_file=server.key".to_owned(),
            ])
        })?;
        Ok(TlsServer { server, certs })
    }

    /// The TCP port on 127.0.0.1.
    pub(crate) fn port(&self) -> u16 {
        self.server.server.port
    }

    /// The CA that signed the server's certificate.
    pub(crate) fn ca(&self) -> PathBuf {
        self.certs.path().join("ca.crt")
    }

    /// A CA that did not.
    pub(crate) fn other_ca(&self) -> PathBuf {
        self.certs.path().join("other-ca.crt")
    }
}

/// A TCP port on 127.0.0.1 nobody listens on now.
fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("cannot find a free port: {e}"))
}

/// `ca.crt` with `server.crt`/`server.key` it signed (for `localhost` only), and
/// `other-ca.crt`, in `dir`: P-256 keys, valid for two days.
fn make_certificates(dir: &Path) -> Result<(), String> {
    let openssl = |args: &[&str]| -> Result<(), String> {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run openssl: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "openssl {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    for ca in ["ca", "other-ca"] {
        let (key, crt, subject) = (
            format!("{ca}.key"),
            format!("{ca}.crt"),
            format!("/CN=rm test {ca}"),
        );
        let mut args = vec!["req", "-x509"];
        args.extend(ec);
        args.extend([
            "-keyout",
            &key,
            "-out",
            &crt,
            "-days",
            "2",
            "-subj",
            &subject,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        openssl(&args)?;
    }
    let mut args = vec!["req"];
    args.extend(ec);
    args.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    openssl(&args)?;
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .map_err(|e| format!("cannot write server.ext: {e}"))?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "server.ext",
    ])
}

static DURABLE: OnceLock<Result<PgServer, String>> = OnceLock::new();

/// A server with PostgreSQL's default durability (`fsync` on, synchronous commit): what a
/// benchmark compares against SQLite's full sync.
pub(crate) fn durable() -> Result<&'static PgServer, String> {
    DURABLE
        .get_or_init(|| PgServer::start(true))
        .as_ref()
        .map_err(Clone::clone)
}

impl PgServer {
    fn start(durable: bool) -> Result<PgServer, String> {
        let bin = find_bin_dir().ok_or_else(|| {
            format!(
                "no `initdb` on the PATH or under {DEBIAN_BIN_DIRS}/*/bin (install Debian's \
                 `postgresql` package)"
            )
        })?;
        let user = unprivileged_user()?;
        let dir = base_dir(user.is_some()).join(format!(
            "rm-pg-{}-{}",
            std::process::id(),
            if durable { "durable" } else { "test" }
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        if let Some((uid, gid, _)) = &user {
            std::os::unix::fs::chown(&dir, Some(*uid), Some(*gid))
                .map_err(|e| format!("cannot give {} to uid {uid}: {e}", dir.display()))?;
        }
        let data = dir.join("data");
        init_cluster(&user, &bin, &data, &dir)?;
        let fsync = if durable { "on" } else { "off" };
        let mut postgres = as_user(&user, &bin.join("postgres"));
        postgres
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(&dir)
            .args(["-c", "listen_addresses=", "-c", &format!("fsync={fsync}")])
            .args([
                "-c",
                "max_connections=200",
                "-c",
                "log_min_messages=warning",
            ]);
        spawn_for_process_lifetime(postgres, dir.clone())?;
        let server = PgServer {
            dir,
            bin,
            port: DEFAULT_PORT,
        };
        server.wait_ready()?;
        Ok(server)
    }

    /// The socket directory, as a connection string's `host`.
    pub(crate) fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// A connection string for `database` (libpq key/value form).
    pub(crate) fn url(&self, database: &str) -> String {
        if self.port == DEFAULT_PORT {
            format!("host={} user={ROLE} dbname={database}", self.dir.display())
        } else {
            format!(
                "host={} port={} user={ROLE} dbname={database}",
                self.dir.display(),
                self.port
            )
        }
    }

    /// Creates a fresh, empty database named after `label`.
    pub(crate) fn database(&'static self, label: &str) -> Result<PgDatabase, String> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let clean: String = label
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .take(40)
            .collect();
        let name = format!("t{}_{}", NEXT.fetch_add(1, Ordering::Relaxed), clean);
        self.client_tool("createdb", &[&name])?;
        Ok(PgDatabase { server: self, name })
    }

    fn client_tool(&self, tool: &str, args: &[&str]) -> Result<(), String> {
        let out = Command::new(self.bin.join(tool))
            .arg("-h")
            .arg(&self.dir)
            .args(["-p", &self.port.to_string()])
            .args(["-U", ROLE])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {tool}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{tool} {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    fn wait_ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let ready = Command::new(self.bin.join("pg_isready"))
                .arg("-h")
                .arg(&self.dir)
                .args(["-p", &self.port.to_string()])
                .args(["-U", ROLE, "-q"])
                .status()
                .map_err(|e| format!("cannot run pg_isready: {e}"))?;
            if ready.success() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
                return Err(format!(
                    "postgres did not accept connections within {START_TIMEOUT:?}: {}",
                    log.trim()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl PgDatabase {
    /// The connection string of this database.
    pub(crate) fn url(&self) -> String {
        self.server.url(&self.name)
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        // `--force` ends the connections a journal still holds.
        if let Err(e) = self
            .server
            .client_tool("dropdb", &["--force", "--if-exists", &self.name])
        {
            eprintln!("cannot drop the test database {}: {e}", self.name);
        }
    }
}

/// Where the cluster's directory goes: the temporary directory, unless the server runs as
/// another user who could not reach it (a `TMPDIR` under root's home), then `/tmp`.
/// `initdb` of a cluster in `data` (trust auth, the test role, no fsync), as `user`; on failure
/// `dir` (the cluster's whole directory) is removed.
fn init_cluster(
    user: &Option<(u32, u32, String)>,
    bin: &Path,
    data: &Path,
    dir: &Path,
) -> Result<(), String> {
    let mut initdb = as_user(user, &bin.join("initdb"));
    initdb
        .arg("-D")
        .arg(data)
        .args([
            "-U",
            ROLE,
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--locale=C",
        ])
        .stdin(Stdio::null());
    let out = initdb
        .output()
        .map_err(|e| format!("cannot run initdb: {e}"))?;
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(dir);
        return Err(format!(
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

fn base_dir(other_user: bool) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let temp = std::env::temp_dir();
    let reachable = temp
        .ancestors()
        .all(|dir| std::fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 != 0));
    if other_user && !reachable {
        PathBuf::from("/tmp")
    } else {
        temp
    }
}

/// The directory with `initdb`, `postgres` and the client tools: the PATH's, else the newest
/// Debian install.
fn find_bin_dir() -> Option<PathBuf> {
    // A link on the PATH (`/usr/local/bin/initdb`) leads to the directory with the rest.
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths).find_map(|dir| {
            let initdb = std::fs::canonicalize(dir.join("initdb")).ok()?;
            let bin = initdb.parent()?.to_owned();
            bin.join("postgres").is_file().then_some(bin)
        })
    });
    on_path.or_else(|| {
        let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(DEBIAN_BIN_DIRS)
            .ok()?
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let version = entry.file_name().to_str()?.parse().ok()?;
                let bin = entry.path().join("bin");
                bin.join("initdb").is_file().then_some((version, bin))
            })
            .collect();
        versions.sort();
        versions.pop().map(|(_, bin)| bin)
    })
}

/// As root: the uid, gid and name of the user the server runs as (`postgres`, else `nobody`).
/// Not root: `None`, the server runs as the current user.
fn unprivileged_user() -> Result<Option<(u32, u32, String)>, String> {
    use std::os::unix::fs::MetadataExt;
    // The owner of /proc/self is this process's effective uid.
    let me = std::fs::metadata("/proc/self")
        .map_err(|e| format!("cannot tell who runs the tests: {e}"))?
        .uid();
    if me != 0 {
        return Ok(None);
    }
    let passwd = std::fs::read_to_string("/etc/passwd")
        .map_err(|e| format!("cannot read /etc/passwd: {e}"))?;
    for wanted in ["postgres", "nobody"] {
        let found = passwd.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.len() > 3 && fields[0] == wanted)
                .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
                .flatten()
        });
        if let Some((uid, gid)) = found {
            return Ok(Some((uid, gid, wanted.to_owned())));
        }
    }
    Err("running as root and no `postgres` or `nobody` user to run PostgreSQL as".to_owned())
}

/// `program` run as `user` (through `setpriv`) when the tests run as root.
fn as_user(user: &Option<(u32, u32, String)>, program: &Path) -> Command {
    match user {
        None => Command::new(program),
        Some((uid, gid, _)) => {
            let mut command = Command::new("setpriv");
            command
                .arg(format!("--reuid={uid}"))
                .arg(format!("--regid={gid}"))
                .arg("--clear-groups")
                .arg("--pdeathsig=INT")
                .arg(program);
            command
        }
    }
}

/// Starts the server from a thread that never ends, so the parent-death signal (which follows
/// the spawning thread, not the process) arrives only when the test binary exits. Without
/// `setpriv` (not root), `postgres` is stopped by the shell around it the same way.
fn spawn_for_process_lifetime(server: Command, dir: PathBuf) -> Result<(), String> {
    let (started, outcome) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("rm-test-postgres".to_owned())
        .spawn(move || {
            // A shell, itself told of the test binary's exit, stops the server (SIGINT: fast
            // shutdown), waits for it and removes the directory.
            let mut argv = vec![server.get_program().to_owned()];
            argv.extend(server.get_args().map(ToOwned::to_owned));
            let mut shell = Command::new("setpriv");
            shell
                .arg("--pdeathsig=TERM")
                .args(["sh", "-c"])
                .arg(
                    "trap 'kill -INT $pid 2>/dev/null; wait $pid; rm -rf \"$0\"; exit 0' TERM INT; \
                     \"$@\" & pid=$!; wait $pid; rm -rf \"$0\"",
                )
                .arg(&dir)
                .args(argv)
                .stdin(Stdio::null())
                .stdout(Stdio::null());
            // The server's stderr goes to its log (read when it does not come up).
            if let Ok(file) = std::fs::File::create(dir.join("server.log")) {
                shell.stderr(file);
            }
            match shell.spawn() {
                Ok(mut child) => {
                    let _ = started.send(Ok(()));
                    let _ = child.wait();
                }
                Err(e) => {
                    let _ = started.send(Err(format!("cannot start postgres: {e}")));
                }
            }
            // Keep the thread (the parent of record) alive until the process exits.
            loop {
                std::thread::park();
            }
        })
        .map_err(|e| format!("cannot start the server thread: {e}"))?;
    outcome
        .recv()
        .map_err(|_| "the server thread ended before starting postgres".to_owned())?
}
