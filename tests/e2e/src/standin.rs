//! Stand-ins for what lies beyond a runner host, made inside network namespaces of the test's
//! own (nothing is sent past this machine): a "public" web server and a "cloud metadata"
//! server in a namespace routed from the host, and a DNS resolver on the host's loopback (as
//! systemd-resolved listens at 127.0.0.53) that knows one name. An agent started in a mount
//! namespace whose `/etc/resolv.conf` names that resolver ([`StandIn::resolv_conf`],
//! [`StandIn::agent_mount_namespace`]) gives its runners the same view.
//!
//! Each stand-in takes an index of its own (two tests of one binary run at once), and removes
//! its namespace, veth and routes when dropped.

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

/// What the public server answers.
pub const PUBLIC_BODY: &str = "PUBLIC-OK";
/// What the metadata stand-in answers: a job that prints it reached it.
pub const METADATA_BODY: &str = "METADATA-SECRET";
/// The name the DNS stand-in resolves to the public server.
pub const PUBLIC_NAME: &str = "public.rm-e2e.test";

static NEXT: AtomicU8 = AtomicU8::new(1);

/// The stand-ins of one test.
pub struct StandIn {
    index: u8,
    netns: String,
    veth: String,
    /// The "public" server (TEST-NET-3, routed to the stand-in namespace).
    pub public: Ipv4Addr,
    /// A link-local address standing for the metadata service (169.254.169.254 itself is
    /// left alone: the machine running the tests may be a cloud VM that uses it).
    pub metadata: Ipv4Addr,
    /// The DNS resolver on the host's loopback.
    pub resolver: Ipv4Addr,
    stop: Arc<AtomicBool>,
    dir: tempfile::TempDir,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("ip (iproute2)");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl StandIn {
    /// Makes the namespace, its routes from the host, the servers and the resolver.
    pub fn start() -> StandIn {
        let index = NEXT.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id() % 10_000;
        let netns = format!("rme2e-{pid}-{index}");
        // Not `rmv*`: the agent's tables treat those as runners.
        let veth = format!("rmt{pid}x{index}");
        let host_end = Ipv4Addr::new(100, 64, 213, 4 * index + 1);
        let far_end = Ipv4Addr::new(100, 64, 213, 4 * index + 2);
        let public = Ipv4Addr::new(203, 0, 113, 10 + index);
        let metadata = Ipv4Addr::new(169, 254, 213, 10 + index);
        let resolver = Ipv4Addr::new(127, 0, 0, 53 + index);
        let _ = Command::new("ip").args(["netns", "del", &netns]).output();
        let _ = Command::new("ip").args(["link", "del", &veth]).output();
        ip(&["netns", "add", &netns]);
        ip(&[
            "link", "add", &veth, "type", "veth", "peer", "name", "up0", "netns", &netns,
        ]);
        ip(&["addr", "add", &format!("{host_end}/30"), "dev", &veth]);
        ip(&["link", "set", &veth, "up"]);
        for args in [
            vec!["link", "set", "lo", "up"],
            vec!["addr", "add", &format!("{far_end}/30"), "dev", "up0"],
            vec!["link", "set", "up0", "up"],
            vec!["addr", "add", &format!("{public}/32"), "dev", "lo"],
            vec!["addr", "add", &format!("{metadata}/32"), "dev", "lo"],
            vec!["route", "add", "default", "via", &host_end.to_string()],
        ] {
            let mut full = vec!["-n", netns.as_str()];
            full.extend(args);
            ip(&full);
        }
        ip(&[
            "route",
            "replace",
            &format!("{public}/32"),
            "via",
            &far_end.to_string(),
        ]);
        ip(&[
            "route",
            "replace",
            &format!("{metadata}/32"),
            "via",
            &far_end.to_string(),
        ]);
        let stop = Arc::new(AtomicBool::new(false));
        let path = PathBuf::from("/run/netns").join(&netns);
        serve_http_in(&path, SocketAddr::from((public, 80)), PUBLIC_BODY, &stop);
        serve_http_in(
            &path,
            SocketAddr::from((metadata, 80)),
            METADATA_BODY,
            &stop,
        );
        serve_dns(SocketAddr::from((resolver, 53)), public, &stop);
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let conf = dir.path().join("resolv.conf");
        std::fs::write(
            &conf,
            format!("nameserver {resolver}\noptions timeout:2 attempts:1\n"),
        )
        .unwrap();
        std::fs::set_permissions(&conf, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        StandIn {
            index,
            netns,
            veth,
            public,
            metadata,
            resolver,
            stop,
            dir,
        }
    }

    /// A `resolv.conf` naming only the stand-in resolver.
    pub fn resolv_conf(&self) -> PathBuf {
        self.dir.path().join("resolv.conf")
    }

    /// Configures `command` (an agent) to start in a mount namespace of its own where
    /// `/etc/resolv.conf` is [`Self::resolv_conf`]: the agent and its runners resolve through
    /// the stand-in, and no test query leaves the machine.
    #[allow(unsafe_code)]
    pub fn agent_mount_namespace(&self, command: &mut Command) {
        let conf = std::ffi::CString::new(self.resolv_conf().display().to_string()).unwrap();
        // SAFETY: the closure runs between fork and exec and makes raw system calls only, on a
        // string made before the fork.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(command, move || {
                if libc::unshare(libc::CLONE_NEWNS) != 0
                    || libc::mount(
                        std::ptr::null(),
                        c"/".as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_SLAVE,
                        std::ptr::null(),
                    ) != 0
                    || libc::mount(
                        conf.as_ptr(),
                        c"/etc/resolv.conf".as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND,
                        std::ptr::null(),
                    ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// The index of this stand-in (its addresses' last octets).
    pub fn index(&self) -> u8 {
        self.index
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for addr in [self.public, self.metadata] {
            let _ = Command::new("ip")
                .args(["route", "del", &format!("{addr}/32")])
                .output();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.veth])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .output();
    }
}

/// Binds `addr` inside the namespace at `netns` (from a thread that joins it) and answers
/// every connection with `body`, until `stop`.
fn serve_http_in(netns: &Path, addr: SocketAddr, body: &'static str, stop: &Arc<AtomicBool>) {
    let ns = std::fs::File::open(netns).unwrap();
    let stop = stop.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // SAFETY: setns on a descriptor this thread holds; only this thread moves.
        #[allow(unsafe_code)]
        let joined = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(joined, 0, "setns: {}", std::io::Error::last_os_error());
        let listener = TcpListener::bind(addr).unwrap();
        listener.set_nonblocking(true).unwrap();
        tx.send(()).unwrap();
        while !stop.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((mut conn, _)) => {
                    let _ = conn.set_nonblocking(false);
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                    let mut buf = [0u8; 1024];
                    let _ = conn.read(&mut buf);
                    let _ = write!(
                        conn,
                        "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(5)).unwrap();
}

/// A DNS resolver at `addr` that answers `A` for [`PUBLIC_NAME`] with `public`, no address
/// for other questions about it, and NXDOMAIN for every other name.
fn serve_dns(addr: SocketAddr, public: Ipv4Addr, stop: &Arc<AtomicBool>) {
    let socket = UdpSocket::bind(addr)
        .unwrap_or_else(|e| panic!("the DNS stand-in cannot bind {addr}: {e}"));
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let stop = stop.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while !stop.load(Ordering::SeqCst) {
            let Ok((n, from)) = socket.recv_from(&mut buf) else {
                continue;
            };
            if let Some(answer) = dns_answer(&buf[..n], public) {
                let _ = socket.send_to(&answer, from);
            }
        }
    });
}

fn dns_answer(query: &[u8], public: Ipv4Addr) -> Option<Vec<u8>> {
    if query.len() < 12 {
        return None;
    }
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = *query.get(at)? as usize;
        at += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + len)?).to_lowercase());
        at += len;
    }
    let qtype = u16::from_be_bytes([*query.get(at)?, *query.get(at + 1)?]);
    let question_end = at + 4;
    let ours = labels.join(".") == PUBLIC_NAME;
    let a = ours && qtype == 1;
    let mut out = Vec::with_capacity(question_end + 16);
    out.extend_from_slice(&query[..2]);
    // A response, recursion available; NXDOMAIN for names it does not know.
    out.extend_from_slice(&[0x81, if ours { 0x80 } else { 0x83 }]);
    out.extend_from_slice(&[0, 1, 0, u8::from(a), 0, 0, 0, 0]);
    out.extend_from_slice(query.get(12..question_end)?);
    if a {
        out.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
        out.extend_from_slice(&public.octets());
    }
    Some(out)
}
