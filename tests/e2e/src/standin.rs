//! Stand-ins for what lies beyond a runner host, made inside network namespaces of the test's
//! own (nothing is sent past this machine): web servers ("public", "forbidden", "direct") and a
//! "cloud metadata" server in a namespace routed from the host, a second DNS server there ("another
//! resolver", at the public address), and a DNS resolver on the host's loopback (as
//! systemd-resolved listens at 127.0.0.53). Both DNS servers know the same names ([`Zone`]),
//! answer over UDP and TCP, and count the queries they receive per name ([`Counts`]). An agent
//! started in a mount namespace whose `/etc/resolv.conf` names the loopback resolver
//! ([`StandIn::resolv_conf`], [`StandIn::agent_mount_namespace`]) gives its runners the same view,
//! and its own resolver (issue 41) the loopback one as its upstream.
//!
//! Each stand-in takes an index of its own (two tests of one binary run at once), and removes
//! its namespace, veth and routes when dropped.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the public server answers.
pub const PUBLIC_BODY: &str = "PUBLIC-OK";
/// What the metadata stand-in answers: a job that prints it reached it.
pub const METADATA_BODY: &str = "METADATA-SECRET";
/// What the forbidden server answers: a job that prints it got past its egress rules.
pub const FORBIDDEN_BODY: &str = "FORBIDDEN-REACHED";
/// What the direct server answers.
pub const DIRECT_BODY: &str = "DIRECT-OK";
/// The name the DNS stand-ins resolve to the public server.
pub const PUBLIC_NAME: &str = "public.rm-e2e.test";
/// The name the DNS stand-ins resolve to the forbidden server (a name no allow list names).
pub const DENIED_NAME: &str = "denied.rm-e2e.test";
/// The name the DNS stand-ins resolve to the direct server: an allowed name whose address a job
/// dials before asking for it.
pub const DIRECT_NAME: &str = "direct.rm-e2e.test";
/// Every name under this zone resolves to the public server (for `*.cdn.rm-e2e.test`).
pub const CDN_ZONE: &str = "cdn.rm-e2e.test";
/// Every name under this zone is NXDOMAIN: the denied zone a tunnelling burst asks in.
pub const EXFIL_ZONE: &str = "exfil.rm-e2e.test";
/// The TTL of every answer, in seconds.
pub const TTL: u32 = 60;

/// How long a DNS server over TCP waits for the next message of a connection.
const TCP_IDLE: Duration = Duration::from_secs(2);

static NEXT: AtomicU8 = AtomicU8::new(1);

/// The stand-ins of one test.
pub struct StandIn {
    index: u8,
    netns: String,
    veth: String,
    /// The "public" server (TEST-NET-3, routed to the stand-in namespace); the other resolver
    /// listens at port 53 of it.
    pub public: Ipv4Addr,
    /// The "forbidden" server (TEST-NET-3): [`DENIED_NAME`] resolves to it.
    pub forbidden: Ipv4Addr,
    /// The "direct" server (TEST-NET-3): [`DIRECT_NAME`] resolves to it.
    pub direct: Ipv4Addr,
    /// A link-local address standing for the metadata service (169.254.169.254 itself is
    /// left alone: the machine running the tests may be a cloud VM that uses it).
    pub metadata: Ipv4Addr,
    /// The DNS resolver on the host's loopback.
    pub resolver: Ipv4Addr,
    /// The queries the loopback resolver received (the upstream of the agent's resolver).
    pub loopback_queries: Counts,
    /// The queries the other resolver (at `public:53`) received.
    pub other_queries: Counts,
    /// The connections each web server (by its address) accepted: a job that reached one.
    pub connections: Counts,
    stop: Arc<AtomicBool>,
    dir: tempfile::TempDir,
}

/// What a stand-in received, per key: the queries of a DNS stand-in per name (lowercase,
/// without the trailing dot, of any type and over either transport), the connections of the web
/// servers per address.
#[derive(Debug, Clone, Default)]
pub struct Counts(Arc<Mutex<BTreeMap<String, u64>>>);

impl Counts {
    fn count(&self, name: &str) {
        let mut counts = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *counts.entry(name.to_owned()).or_default() += 1;
    }

    /// Every name asked for so far, with its count.
    pub fn all(&self) -> BTreeMap<String, u64> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// How many had key `name`.
    pub fn of(&self, name: &str) -> u64 {
        self.all().get(name).copied().unwrap_or(0)
    }

    /// How many had key `zone` or a name under it.
    pub fn under(&self, zone: &str) -> u64 {
        self.all()
            .iter()
            .filter(|(name, _)| in_zone(name, zone))
            .map(|(_, n)| n)
            .sum()
    }
}

/// Whether `name` is `zone` or below it.
fn in_zone(name: &str, zone: &str) -> bool {
    name == zone
        || name
            .strip_suffix(zone)
            .is_some_and(|head| head.ends_with('.'))
}

/// The names both DNS stand-ins know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Zone {
    pub public: Ipv4Addr,
    pub forbidden: Ipv4Addr,
    pub direct: Ipv4Addr,
}

impl Zone {
    /// The address `name` has (its `A` record); `None`: NXDOMAIN.
    pub fn address(&self, name: &str) -> Option<Ipv4Addr> {
        match name {
            PUBLIC_NAME => Some(self.public),
            DENIED_NAME => Some(self.forbidden),
            DIRECT_NAME => Some(self.direct),
            _ if name != CDN_ZONE && in_zone(name, CDN_ZONE) => Some(self.public),
            _ => None,
        }
    }
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
    /// Makes the namespace, its routes from the host, the servers and the resolvers.
    pub fn start() -> StandIn {
        let index = NEXT.fetch_add(1, Ordering::SeqCst);
        // The addresses' last octets (4 * index + 2, 10 + index, 100 + index, 170 + index) stay
        // apart and below 256.
        assert!(index < 60, "more stand-ins than addresses: {index}");
        let pid = std::process::id() % 10_000;
        let netns = format!("rme2e-{pid}-{index}");
        // Not `rmv*`: the agent's tables treat those as runners.
        let veth = format!("rmt{pid}x{index}");
        let host_end = Ipv4Addr::new(100, 64, 213, 4 * index + 1);
        let far_end = Ipv4Addr::new(100, 64, 213, 4 * index + 2);
        let public = Ipv4Addr::new(203, 0, 113, 10 + index);
        let forbidden = Ipv4Addr::new(203, 0, 113, 100 + index);
        let direct = Ipv4Addr::new(203, 0, 113, 170 + index);
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
        let mut inside = vec![
            "link set lo up".to_owned(),
            format!("addr add {far_end}/30 dev up0"),
            "link set up0 up".to_owned(),
        ];
        for addr in [public, forbidden, direct, metadata] {
            inside.push(format!("addr add {addr}/32 dev lo"));
        }
        inside.push(format!("route add default via {host_end}"));
        for line in &inside {
            let mut full = vec!["-n", netns.as_str()];
            full.extend(line.split_whitespace());
            ip(&full);
        }
        for addr in [public, forbidden, direct, metadata] {
            ip(&[
                "route",
                "replace",
                &format!("{addr}/32"),
                "via",
                &far_end.to_string(),
            ]);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let connections = Counts::default();
        let path = PathBuf::from("/run/netns").join(&netns);
        for (addr, body) in [
            (public, PUBLIC_BODY),
            (metadata, METADATA_BODY),
            (forbidden, FORBIDDEN_BODY),
            (direct, DIRECT_BODY),
        ] {
            serve_http_in(
                &path,
                SocketAddr::from((addr, 80)),
                body,
                &connections,
                &stop,
            );
        }
        let zone = Zone {
            public,
            forbidden,
            direct,
        };
        let loopback_queries = Counts::default();
        let other_queries = Counts::default();
        let loopback = SocketAddr::from((resolver, 53));
        serve_dns(
            bind_udp(loopback),
            bind_tcp(loopback),
            zone,
            &loopback_queries,
            &stop,
        );
        let other = SocketAddr::from((public, 53));
        let (udp, tcp) = in_netns(&path, move || (bind_udp(other), bind_tcp(other)));
        serve_dns(udp, tcp, zone, &other_queries, &stop);
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
            forbidden,
            direct,
            metadata,
            resolver,
            loopback_queries,
            other_queries,
            connections,
            stop,
            dir,
        }
    }

    /// The names the DNS stand-ins know.
    pub fn zone(&self) -> Zone {
        Zone {
            public: self.public,
            forbidden: self.forbidden,
            direct: self.direct,
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
        for addr in [self.public, self.forbidden, self.direct, self.metadata] {
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

/// Runs `make` on a thread that joined the network namespace at `netns` (sockets it makes
/// belong to that namespace, wherever they are used later).
fn in_netns<T: Send + 'static>(netns: &Path, make: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = std::fs::File::open(netns).unwrap();
    std::thread::spawn(move || {
        // SAFETY: setns on a descriptor this thread holds; only this thread moves.
        #[allow(unsafe_code)]
        let joined = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(joined, 0, "setns: {}", std::io::Error::last_os_error());
        make()
    })
    .join()
    .unwrap()
}

/// Binds `addr` inside the namespace at `netns` and answers every connection with `body`,
/// counting it in `connections` under the address, until `stop`.
fn serve_http_in(
    netns: &Path,
    addr: SocketAddr,
    body: &'static str,
    connections: &Counts,
    stop: &Arc<AtomicBool>,
) {
    let listener = in_netns(netns, move || TcpListener::bind(addr).unwrap());
    listener.set_nonblocking(true).unwrap();
    let stop = stop.clone();
    let connections = connections.clone();
    let key = addr.ip().to_string();
    std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((mut conn, _)) => {
                    connections.count(&key);
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
}

fn bind_udp(addr: SocketAddr) -> UdpSocket {
    UdpSocket::bind(addr).unwrap_or_else(|e| panic!("the DNS stand-in cannot bind udp {addr}: {e}"))
}

fn bind_tcp(addr: SocketAddr) -> TcpListener {
    TcpListener::bind(addr)
        .unwrap_or_else(|e| panic!("the DNS stand-in cannot bind tcp {addr}: {e}"))
}

/// A DNS server on `udp` and `tcp` answering from `zone` ([`dns_answer`]), counting each query
/// in `queries`, until `stop`.
fn serve_dns(
    udp: UdpSocket,
    tcp: TcpListener,
    zone: Zone,
    queries: &Counts,
    stop: &Arc<AtomicBool>,
) {
    udp.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let (udp_stop, udp_queries) = (stop.clone(), queries.clone());
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while !udp_stop.load(Ordering::SeqCst) {
            let Ok((n, from)) = udp.recv_from(&mut buf) else {
                continue;
            };
            if let Some(answer) = answer_counted(&buf[..n], zone, &udp_queries) {
                let _ = udp.send_to(&answer, from);
            }
        }
    });
    tcp.set_nonblocking(true).unwrap();
    let (tcp_stop, tcp_queries) = (stop.clone(), queries.clone());
    std::thread::spawn(move || {
        while !tcp_stop.load(Ordering::SeqCst) {
            match tcp.accept() {
                Ok((conn, _)) => {
                    let queries = tcp_queries.clone();
                    std::thread::spawn(move || serve_dns_connection(conn, zone, &queries));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    });
}

/// Answers each length-prefixed message of a DNS connection over TCP (a client may send
/// several, as glibc sends `A` and `AAAA`), until the client closes it or is idle for
/// [`TCP_IDLE`].
fn serve_dns_connection(mut conn: TcpStream, zone: Zone, queries: &Counts) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(TCP_IDLE));
    loop {
        let mut len = [0u8; 2];
        if conn.read_exact(&mut len).is_err() {
            return;
        }
        let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
        if conn.read_exact(&mut query).is_err() {
            return;
        }
        let Some(answer) = answer_counted(&query, zone, queries) else {
            return;
        };
        let Ok(len) = u16::try_from(answer.len()) else {
            return;
        };
        let mut message = len.to_be_bytes().to_vec();
        message.extend_from_slice(&answer);
        if conn.write_all(&message).is_err() {
            return;
        }
    }
}

fn answer_counted(query: &[u8], zone: Zone, queries: &Counts) -> Option<Vec<u8>> {
    let (name, _, _) = question(query)?;
    queries.count(&name);
    dns_answer(query, zone)
}

/// The question of a query: its name (lowercase, no trailing dot), type, and where it ends.
fn question(query: &[u8]) -> Option<(String, u16, usize)> {
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
    Some((labels.join("."), qtype, at + 4))
}

/// The answer to `query`: `A` (TTL [`TTL`]) for a name `zone` knows, no address for other
/// questions about it, and NXDOMAIN for every other name.
pub fn dns_answer(query: &[u8], zone: Zone) -> Option<Vec<u8>> {
    let (name, qtype, question_end) = question(query)?;
    let address = zone.address(&name);
    let a = address.filter(|_| qtype == 1);
    let mut out = Vec::with_capacity(question_end + 16);
    out.extend_from_slice(&query[..2]);
    // A response, recursion desired and available; NXDOMAIN for names it does not know.
    out.extend_from_slice(&[0x81, if address.is_some() { 0x80 } else { 0x83 }]);
    out.extend_from_slice(&[0, 1, 0, u8::from(a.is_some()), 0, 0, 0, 0]);
    out.extend_from_slice(query.get(12..question_end)?);
    if let Some(addr) = a {
        out.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1]);
        out.extend_from_slice(&TTL.to_be_bytes());
        out.extend_from_slice(&[0, 4]);
        out.extend_from_slice(&addr.octets());
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ZONE: Zone = Zone {
        public: Ipv4Addr::new(203, 0, 113, 11),
        forbidden: Ipv4Addr::new(203, 0, 113, 101),
        direct: Ipv4Addr::new(203, 0, 113, 171),
    };

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            q.push(u8::try_from(label.len()).unwrap());
            q.extend_from_slice(label.as_bytes());
        }
        q.push(0);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&[0, 1]);
        q
    }

    #[test]
    fn each_name_has_its_address_or_none() {
        let cases: &[(&str, Option<Ipv4Addr>)] = &[
            (PUBLIC_NAME, Some(ZONE.public)),
            (DENIED_NAME, Some(ZONE.forbidden)),
            (DIRECT_NAME, Some(ZONE.direct)),
            ("a1.cdn.rm-e2e.test", Some(ZONE.public)),
            ("x.y.cdn.rm-e2e.test", Some(ZONE.public)),
            (CDN_ZONE, None),
            ("xcdn.rm-e2e.test", None),
            ("d1-77.exfil.rm-e2e.test", None),
            ("other.test", None),
        ];
        for (name, want) in cases {
            assert_eq!(ZONE.address(name), *want, "{name}");
        }
    }

    #[test]
    fn answers_carry_the_address_the_ttl_or_nxdomain() {
        let a = dns_answer(&query("Public.rm-e2e.test", 1), ZONE).unwrap();
        assert_eq!(&a[..2], &[0x12, 0x34], "the id");
        assert_eq!(a[3] & 0x0f, 0, "NOERROR");
        assert_eq!(&a[6..8], &[0, 1], "one answer");
        assert_eq!(&a[a.len() - 10..a.len() - 6], &TTL.to_be_bytes());
        assert_eq!(&a[a.len() - 4..], &ZONE.public.octets());
        let aaaa = dns_answer(&query(PUBLIC_NAME, 28), ZONE).unwrap();
        assert_eq!((aaaa[3] & 0x0f, aaaa[7]), (0, 0), "no address, no error");
        let nx = dns_answer(&query("d1.exfil.rm-e2e.test", 1), ZONE).unwrap();
        assert_eq!((nx[3] & 0x0f, nx[7]), (3, 0), "NXDOMAIN");
        assert_eq!(dns_answer(&[0; 5], ZONE), None);
    }

    #[test]
    fn queries_are_counted_per_name_and_zone() {
        let queries = Counts::default();
        for name in [
            "a.exfil.rm-e2e.test",
            "b.exfil.rm-e2e.test",
            PUBLIC_NAME,
            PUBLIC_NAME,
        ] {
            answer_counted(&query(name, 1), ZONE, &queries).unwrap();
        }
        assert_eq!(queries.of(PUBLIC_NAME), 2);
        assert_eq!(queries.of(DENIED_NAME), 0);
        assert_eq!(queries.under(EXFIL_ZONE), 2);
        assert_eq!(queries.under("rm-e2e.test"), 4);
    }
}
