//! Egress by name inside a runner's own table (`policy.egress`, issue 41): the part of the
//! runner's nftables table that lets it reach only what the agent's resolver opened for it,
//! and the two adapters the agent uses on a running runner's table: [`open`] (the addresses
//! of an allowed answer, each for its TTL) and [`observe`] (what the runner reached and was
//! refused, read back from the kernel).
//!
//! The table lives in the runner's network namespace, where the job has no capability to
//! change it, and dies with the namespace: nothing of a runner's egress state outlives it.
//! While the agent is down the table keeps enforcing: the addresses opened expire, the DNS
//! rewrite leads to a port nobody answers, so a runner can reach less, never more.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::time::Duration;

use super::{Addresses, Cidr, DNS_PORT, Names, NetworkError, open_netns, set_of};

/// The port at the host end of a runner's veth its DNS is rewritten to; the host's table
/// rewrites it again to the agent's resolver on the host's loopback. Not 53: the host end's
/// port 53 leads to the host's own loopback resolver for runners without egress.
pub const EGRESS_DNS_PORT: u16 = 5300;

/// The most addresses a runner's allowed set holds at once: a job that resolves more (a
/// flood of allowed names) gets answers whose addresses no longer fit refused, and only it.
pub const MAX_ADDRESSES: u32 = 4096;

/// The most distinct address-and-port pairs kept of what a runner reached, and of what it was
/// refused: beyond, new ones are let through or refused as before but not recorded.
pub const MAX_RECORDED: u32 = 4096;

/// Packets a second a runner may send to the agent's resolver (and the burst before the rate
/// applies), past which its own table drops them: a flood is stopped in the flooding runner's
/// namespace, before it costs the agent anything, so other runners' answers are not held up
/// behind it. Above the resolver's own rate (`rm_egress::resolver::QUERIES_PER_SECOND`, whose
/// excess is answered REFUSED): a job asking a little too fast is told, a flood is dropped.
pub const RESOLVER_PACKETS_PER_SECOND: u32 = 250;
pub const RESOLVER_PACKET_BURST: u32 = 500;

/// How a runner's egress is decided: by the agent's resolver ([`EgressRules`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressRules {
    /// `audit`: nothing is refused, everything is recorded.
    pub audit: bool,
    /// The allow list's IPv4 networks: reached without a name.
    pub networks: Vec<Cidr>,
    /// The nameservers the runner's `resolv.conf` names (the host's): DNS to them is rewritten
    /// to the agent's resolver; DNS to any other address is refused and counted.
    pub nameservers: Vec<Ipv4Addr>,
}

/// The declarations and chains of a runner table under egress by name, after its NAT chains
/// (which [`super::runner_table`] writes). `host_ports` are the host ports rewritten to the
/// host end, which stay reachable.
pub(super) fn chains(
    t: &mut String,
    addresses: Addresses,
    host_ports: &[u16],
    rules: &EgressRules,
) {
    let host = addresses.host;
    let _ = writeln!(
        t,
        "  set allowed {{\n    type ipv4_addr; flags timeout; size {MAX_ADDRESSES};\n  }}"
    );
    let nets: Vec<String> = rules
        .networks
        .iter()
        .filter(|c| c.addr.is_ipv4())
        .map(ToString::to_string)
        .collect();
    if !nets.is_empty() {
        let _ = writeln!(
            t,
            "  set nets {{\n    type ipv4_addr; flags interval;\n    elements = {}\n  }}",
            set_of(&nets)
        );
    }
    for set in ["reached", "denied"] {
        let _ = writeln!(
            t,
            "  set {set} {{\n    type ipv4_addr . inet_service; size {MAX_RECORDED}; flags dynamic; counter;\n  }}"
        );
    }
    t.push_str("  counter dns_other {}\n  counter dns_flood {}\n");
    let verdict = if rules.audit {
        "accept"
    } else {
        "reject with icmp type admin-prohibited"
    };
    t.push_str("  chain output {\n    type filter hook output priority 0; policy accept;\n");
    // What goes to the agent's resolver, at a bounded rate, first: DNS to a loopback nameserver
    // rewritten to the host end still leaves by `lo` here, and one socket's queries are one
    // established flow once the first is answered; neither must pass it.
    let _ = writeln!(
        t,
        "    ip daddr {host} meta l4proto {{ tcp, udp }} th dport {EGRESS_DNS_PORT} limit rate over {RESOLVER_PACKETS_PER_SECOND}/second burst {RESOLVER_PACKET_BURST} packets counter name dns_flood drop"
    );
    t.push_str("    oifname \"lo\" accept\n    ct state established,related accept\n");
    let _ = writeln!(
        t,
        "    ip daddr {host} meta l4proto {{ tcp, udp }} th dport {EGRESS_DNS_PORT} accept"
    );
    if !host_ports.is_empty() {
        let _ = writeln!(
            t,
            "    ip daddr {host} tcp dport {} accept",
            set_of(host_ports)
        );
    }
    // DNS to anything but the resolver: another resolver, DNS over TCP elsewhere.
    let _ = writeln!(
        t,
        "    meta l4proto {{ tcp, udp }} th dport {DNS_PORT} counter name dns_other {verdict}"
    );
    let mut allowed = vec!["@allowed".to_owned()];
    if !nets.is_empty() {
        allowed.push("@nets".to_owned());
    }
    for set in &allowed {
        let _ = writeln!(
            t,
            "    ip daddr {set} meta l4proto {{ tcp, udp }} update @reached {{ ip daddr . th dport }} accept"
        );
        let _ = writeln!(t, "    ip daddr {set} accept");
    }
    if rules.audit {
        // Recorded as reached; the agent tells what it would have refused.
        t.push_str(
            "    meta l4proto { tcp, udp } update @reached { ip daddr . th dport } accept\n",
        );
    } else {
        t.push_str(
            "    meta l4proto { tcp, udp } update @denied { ip daddr . th dport } reject with icmp type admin-prohibited\n",
        );
        t.push_str("    reject with icmp type admin-prohibited\n");
    }
    t.push_str("  }\n");
}

/// The NAT rule that rewrites the runner's DNS to its nameservers towards the host end.
pub(super) fn dns_rewrite(t: &mut String, host: Ipv4Addr, rules: &EgressRules) {
    if rules.nameservers.is_empty() {
        return;
    }
    let _ = writeln!(
        t,
        "    ip daddr {} meta l4proto {{ tcp, udp }} th dport {DNS_PORT} dnat to {host}:{EGRESS_DNS_PORT}",
        set_of(&rules.nameservers)
    );
}

/// The `nft` text that opens `addresses` (each for its duration, whole seconds, at least one)
/// in a runner's allowed set. An address already there gets the new timeout: added (a no-op
/// when present), deleted and added again in one transaction, as kernels before 6.x keep an
/// element's old timeout on a second add.
pub fn open_script(addresses: &[(Ipv4Addr, Duration)]) -> String {
    let mut t = String::new();
    for (addr, ttl) in addresses {
        let secs = ttl.as_secs().max(1);
        let _ = writeln!(t, "add element ip rm allowed {{ {addr} timeout {secs}s }}");
        let _ = writeln!(t, "delete element ip rm allowed {{ {addr} }}");
        let _ = writeln!(t, "add element ip rm allowed {{ {addr} timeout {secs}s }}");
    }
    t
}

/// Opens `addresses` in the allowed set of the runner named `names` (its namespace must
/// exist). One `nft` transaction: all or none.
pub fn open(names: &Names, addresses: &[(Ipv4Addr, Duration)]) -> Result<(), NetworkError> {
    if addresses.is_empty() {
        return Ok(());
    }
    let script = open_script(addresses);
    in_namespace(names, || super::nft(&script))
}

/// `statfs`'s type of the namespace file system: what a usable `/run/netns/<name>` is.
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// Makes the runner's named namespace usable by this agent again, from its process
/// (`identity`, the journalled runner process): an agent started in another mount namespace
/// than the one that named it (a restart under systemd's `ProtectSystem`, a test's own mount
/// namespace) finds `/run/netns/<name>` an empty file, not the namespace. The namespace is
/// opened through the process, whose start time is checked after the open (so a pid taken by
/// another process since is never named), and bound at the name. `Ok(false)`: the name was
/// usable already; an error: the process is gone or is another.
pub fn reattach(
    names: &Names,
    identity: crate::process::ProcessIdentity,
) -> Result<bool, NetworkError> {
    let path = names.netns_path();
    if usable(&path) {
        return Ok(false);
    }
    let io = |what: String| move |source: std::io::Error| NetworkError::Io { what, source };
    let ns = std::fs::File::open(format!("/proc/{}/ns/net", identity.pid)).map_err(io(format!(
        "cannot open the network namespace of runner process {}",
        identity.pid
    )))?;
    let same = crate::process::read_stat(identity.pid)
        .map_err(io(format!("cannot read process {}", identity.pid)))?
        .is_some_and(|stat| stat.start_time == identity.start_time);
    if !same {
        return Err(NetworkError::Failed {
            command: format!("reattach {}", names.netns),
            stderr: format!(
                "process {} is no longer the runner's: its namespace is not named again",
                identity.pid
            ),
        });
    }
    // What the other mount namespace left under the name: an empty file, no namespace.
    if path.exists() {
        std::fs::remove_file(&path).map_err(io(format!("cannot remove {}", path.display())))?;
    }
    std::fs::create_dir_all(super::NETNS_DIR)
        .map_err(io(format!("cannot make {}", super::NETNS_DIR)))?;
    std::fs::File::create(&path).map_err(io(format!("cannot make {}", path.display())))?;
    let source = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&ns));
    rustix::mount::mount_bind(source.as_str(), &path).map_err(|e| NetworkError::Io {
        what: format!("cannot bind the runner's namespace at {}", path.display()),
        source: e.into(),
    })?;
    Ok(true)
}

/// Whether `path` is a network namespace (not an empty file left by another mount namespace).
fn usable(path: &std::path::Path) -> bool {
    // `f_type`'s width is the architecture's (`i64` here, `u32` on some): widened to compare.
    #[allow(clippy::useless_conversion)]
    let nsfs = |f_type| i64::from(f_type) == NSFS_MAGIC;
    open_netns(path)
        .ok()
        .and_then(|fd| rustix::fs::fstatfs(&fd).ok())
        .is_some_and(|stat| nsfs(stat.f_type))
}

/// What the kernel kept of one runner's egress.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Address, port and new connections let through.
    pub reached: Vec<(Ipv4Addr, u16, u64)>,
    /// Address, port and new connections refused (enforce mode).
    pub denied: Vec<(Ipv4Addr, u16, u64)>,
    /// DNS packets to anything but the agent's resolver.
    pub dns_other: u64,
    /// Packets to the agent's resolver dropped for their rate ([`RESOLVER_PACKETS_PER_SECOND`]).
    pub dns_flood: u64,
}

/// Reads what the runner named `names` reached and was refused, from its table.
pub fn observe(names: &Names) -> Result<Observed, NetworkError> {
    let text = in_namespace(names, || {
        super::nft_output(&["-j", "list", "table", "ip", "rm"])
    })?;
    parse_observed(&text).map_err(|why| NetworkError::Failed {
        command: "nft -j list table ip rm".to_owned(),
        stderr: why,
    })
}

/// [`Observed`] from `nft -j list table ip rm`'s output. Pure.
pub fn parse_observed(json: &str) -> Result<Observed, String> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("not nft's JSON: {e}"))?;
    let items = value
        .get("nftables")
        .and_then(|v| v.as_array())
        .ok_or("no `nftables` list")?;
    let mut observed = Observed::default();
    for item in items {
        if let Some(counter) = item.get("counter") {
            let packets = counter.get("packets").and_then(|p| p.as_u64()).unwrap_or(0);
            match counter.get("name").and_then(|n| n.as_str()) {
                Some("dns_other") => observed.dns_other = packets,
                Some("dns_flood") => observed.dns_flood = packets,
                _ => {}
            }
            continue;
        }
        let Some(set) = item.get("set") else { continue };
        let into = match set.get("name").and_then(|n| n.as_str()) {
            Some("reached") => &mut observed.reached,
            Some("denied") => &mut observed.denied,
            _ => continue,
        };
        for elem in set
            .get("elem")
            .and_then(|e| e.as_array())
            .into_iter()
            .flatten()
        {
            let inner = elem.get("elem").unwrap_or(elem);
            let Some(concat) = inner
                .get("val")
                .and_then(|v| v.get("concat"))
                .and_then(|c| c.as_array())
            else {
                continue;
            };
            let addr = concat
                .first()
                .and_then(|a| a.as_str())
                .and_then(|a| a.parse::<Ipv4Addr>().ok());
            let port = concat
                .get(1)
                .and_then(|p| p.as_u64())
                .and_then(|p| u16::try_from(p).ok());
            let packets = inner
                .get("counter")
                .and_then(|c| c.get("packets"))
                .and_then(|p| p.as_u64())
                .unwrap_or(0);
            if let (Some(addr), Some(port)) = (addr, port) {
                into.push((addr, port, packets));
            }
        }
    }
    Ok(observed)
}

/// Runs `step` inside the runner's network namespace, opened by its name.
fn in_namespace<T: Send>(
    names: &Names,
    step: impl FnOnce() -> Result<T, NetworkError> + Send,
) -> Result<T, NetworkError> {
    let fd = open_netns(&names.netns_path())?;
    super::inside(&fd, &names.netns, step)
}
