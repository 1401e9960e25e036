//! A network namespace per runner (`host.network = "private"`, CONTRACT §7, issue 25): what a
//! runner may reach, and the kernel objects that enforce it.
//!
//! Each isolated runner gets a named network namespace `rm-<short attempt id>` joined to the host
//! by a veth pair (`rmv<short id>` on the host, `eth0` inside), a /30 of [`RUNNER_NET`] chosen
//! by its uid ([`slot_of`]), a default route through the host, and NAT out of the host's own
//! interfaces. What it may reach is said in two nftables tables:
//!
//! - **the host's** ([`host_table`], one per agent, loaded at start): no packet from a runner
//!   reaches an address of the host itself (its loopback included) or a service the host
//!   publishes through DNAT, another runner, the link-local and cloud metadata addresses
//!   ([`BUILTIN_DENY`]) or `host.network_deny`; only the `host.network_host_ports` and a
//!   loopback DNS resolver are let through, rewritten to the host's loopback.
//! - **the runner's own** ([`runner_table`], inside its namespace, where the job has no
//!   capability to change it): `127.0.0.1:PORT` of each host port and the host's loopback
//!   resolver are rewritten to the host end of the veth, and `policy.network_allow`, when set,
//!   is the only egress.
//!
//! Runners have no IPv6 beyond their own loopback: it is off on `eth0` and on any interface
//! made later in the namespace ([`RUNNER_IPV6`]), so a router advertisement reaching the veth
//! (a host that runs `radvd` on every interface) gives a runner no address and no route around
//! the IPv4 rules above, and the host's table drops any IPv6 a runner's veth still forwards.
//! Both tables are IPv4 rules; there is no key to turn runner IPv6 on, as there is no IPv6
//! `network_allow`, deny list or NAT for it to go through.
//!
//! The rules are pure functions of the configuration (table tests below); the adapter
//! ([`HostNetwork::install`], [`create`], [`remove`]) runs `ip` and `nft`. Nothing here is a
//! process that outlives a step: a runner's namespace, veth and table are kernel objects, kept
//! while the agent is down (a runner keeps working through an agent restart) and removed by
//! the attempt's cleanup, after a crash at any step too ([`remove`] is idempotent).

use std::fmt;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rustix::fs::{Mode, OFlags};

mod cidr;
pub mod egress;
pub use cidr::{Cidr, NETWORK_SLOTS};
pub use egress::{EGRESS_DNS_PORT, EgressRules};

/// The addresses runner namespaces are numbered from: a /30 per runner (the host end `.1`, the
/// runner `.2` of it), 16,384 runners. Private, and outside the ranges cloud networks and
/// Docker's bridges use by default.
pub(crate) const RUNNER_NET: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 213, 0, 0), 16);

/// Where `ip netns` names namespaces (a bind mount each, so a runner's namespace outlives the
/// agent that made it).
pub(crate) const NETNS_DIR: &str = "/run/netns";

/// A runner namespace's name: this and the attempt's short id (12 hex).
pub(crate) const NETNS_PREFIX: &str = "rm-";

/// The host end of a runner's veth: this and the attempt's short id (15 characters, the most an
/// interface name holds). The host table matches runners by it.
pub const VETH_PREFIX: &str = "rmv";

/// The runner's end of its veth, inside its namespace.
const RUNNER_IF: &str = "eth0";

/// Never reachable from a runner, whatever the configuration says: link-local addresses (the
/// cloud metadata services at 169.254.169.254, AWS's IPv6 one and the link-local resolvers
/// among them) and the runners' own network.
pub const BUILTIN_DENY: &[&str] = &["169.254.0.0/16", "fd00:ec2::254/128", "fe80::/10"];

/// The resolver configuration runners read (their mount namespace shares the host's `/etc`).
pub const RESOLV_CONF: &str = "/etc/resolv.conf";

/// DNS's port, let through to the host's loopback resolver.
const DNS_PORT: u16 = 53;

/// `net.ipv4.ip_forward`: runners' packets are routed through the host.
const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// A namespace's IPv6 settings; absent when the kernel has no IPv6 (`ipv6.disable=1`), and
/// then there is nothing to turn off.
const IPV6_CONF: &str = "/proc/sys/net/ipv6/conf";

/// `disable_ipv6` inside a runner's namespace, written in this order before `eth0` comes up:
/// `all` turns IPv6 off on the interfaces there (`lo`, `eth0`) and `default` on any made later,
/// `eth0` is said by name; then `lo` alone gets it back, so that `::1` stays: the runner reads
/// the host's `/etc/hosts`, where `localhost` is `::1` too, and a job's server bound to it must
/// not fail. `lo` leaves nothing out of the namespace.
const RUNNER_IPV6: &[(&str, &str)] = &[
    ("all", "1"),
    ("default", "1"),
    (RUNNER_IF, "1"),
    ("lo", "0"),
];

/// Why a runner's network could not be made or removed. Carries `ip`'s or `nft`'s own words.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("cannot run `{program}` ({source}); install {package}")]
    Missing {
        program: &'static str,
        package: &'static str,
        source: std::io::Error,
    },
    #[error("`{command}` failed: {stderr}")]
    Failed { command: String, stderr: String },
    /// The uid's slot is held by a veth named like an rm runner's (`rmv<short>`) that is not
    /// this runner's: a runner no journal knows any more left it (see
    /// `UserIsolation::start`, which removes it when nothing runs as the uid, and tries again).
    #[error(
        "{address} is already the address of {VETH_PREFIX}{short}: another runner's network holds this uid's slot (two agents with overlapping host.runner_uids, or a runner left running)"
    )]
    HeldByRunner { address: Ipv4Addr, short: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

/// A runner's addresses: the host end and the runner end of its /30.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addresses {
    pub host: Ipv4Addr,
    pub runner: Ipv4Addr,
}

/// The slot of a runner uid in [`RUNNER_NET`]: two runners of one agent never share one while
/// the pool's uids differ modulo [`NETWORK_SLOTS`] ([`slots_collide`] tells the configuration).
pub fn slot_of(uid: u32) -> u32 {
    uid % NETWORK_SLOTS
}

/// Two uids of `uids` that would get the same slot, if any.
pub fn slots_collide(uids: impl IntoIterator<Item = u32>) -> Option<(u32, u32)> {
    let mut seen = std::collections::HashMap::new();
    for uid in uids {
        if let Some(other) = seen.insert(slot_of(uid), uid) {
            return Some((other, uid));
        }
    }
    None
}

/// The /30 of a slot.
pub fn addresses(slot: u32) -> Addresses {
    let base = u32::from(RUNNER_NET.0) + (slot % NETWORK_SLOTS) * 4;
    Addresses {
        host: Ipv4Addr::from(base + 1),
        runner: Ipv4Addr::from(base + 2),
    }
}

/// The names of one runner's namespace and host-side interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub netns: String,
    pub veth: String,
}

impl Names {
    /// From the attempt's short id (its 12 hex characters).
    pub fn of(short_id: &str) -> Names {
        Names {
            netns: format!("{NETNS_PREFIX}{short_id}"),
            veth: format!("{VETH_PREFIX}{short_id}"),
        }
    }

    /// The namespace's bind mount.
    pub(crate) fn netns_path(&self) -> PathBuf {
        Path::new(NETNS_DIR).join(&self.netns)
    }
}

/// The nameservers of a `resolv.conf`, in order.
pub fn nameservers(resolv_conf: &str) -> Vec<IpAddr> {
    resolv_conf
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()? == "nameserver").then_some(())?;
            // `fe80::1%eth0`: a scoped address is link-local, which runners never reach.
            words.next()?.parse().ok()
        })
        .collect()
}

/// What the host's table lets runners reach besides the world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRules {
    /// `host.network_host_ports`: host loopback TCP ports runners reach at `127.0.0.1:PORT`.
    pub host_ports: Vec<u16>,
    /// [`BUILTIN_DENY`] and `host.network_deny`.
    pub deny: Vec<Cidr>,
    /// The host's first loopback resolver, which runners reach at the same address.
    pub loopback_resolver: Option<Ipv4Addr>,
    /// The host's other resolvers: reachable on port 53 even inside a denied network (a cloud
    /// VM's resolver is often link-local).
    pub resolvers: Vec<IpAddr>,
    /// This agent's runners' /30s (from its uid pool): the host ports are rewritten for them
    /// alone, so another agent's runners on the same host do not reach this one's ports.
    pub runner_nets: Vec<Ipv4Addr>,
    /// The port of the agent's egress resolver on the host's loopback (`policy.egress`):
    /// [`EGRESS_DNS_PORT`] at a runner's host end is rewritten to it. `None`: no resolver.
    pub egress_resolver: Option<u16>,
}

impl HostRules {
    /// The rules for a configuration: `deny` from `host.network_deny`, the resolvers read from
    /// the host's `resolv.conf` text, the slots of the pool's uids.
    pub fn new(
        host_ports: &[u16],
        deny: &[Cidr],
        resolv_conf: &str,
        uids: impl IntoIterator<Item = u32>,
    ) -> HostRules {
        let mut all_deny: Vec<Cidr> = BUILTIN_DENY.iter().filter_map(|c| c.parse().ok()).collect();
        all_deny.extend_from_slice(deny);
        let servers = nameservers(resolv_conf);
        let loopback_resolver = servers.iter().find_map(|s| match s {
            IpAddr::V4(v4) if v4.is_loopback() => Some(*v4),
            _ => None,
        });
        let resolvers = servers.into_iter().filter(|s| !s.is_loopback()).collect();
        let mut runner_nets: Vec<Ipv4Addr> = uids
            .into_iter()
            .map(|uid| addresses(slot_of(uid)).host)
            .map(|host| Ipv4Addr::from(u32::from(host) - 1))
            .collect();
        runner_nets.sort();
        runner_nets.dedup();
        HostRules {
            host_ports: host_ports.to_vec(),
            deny: all_deny,
            loopback_resolver,
            resolvers,
            runner_nets,
            egress_resolver: None,
        }
    }
}

/// The name of this agent's host table: one per data directory, so two agents on one host (the
/// tests do that) keep their own.
pub fn host_table_name(data_dir: &Path) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(data_dir.as_os_str().as_encoded_bytes());
    format!("rm_{}", hex::encode(&digest[..4]))
}

fn set_of<T: fmt::Display>(items: &[T]) -> String {
    let items: Vec<String> = items.iter().map(ToString::to_string).collect();
    format!("{{ {} }}", items.join(", "))
}

/// The host's table (`nft -f` text): replaced whole and atomically at each start.
pub(crate) fn host_table(name: &str, rules: &HostRules) -> String {
    let veth = format!("\"{VETH_PREFIX}*\"");
    let mut t = String::new();
    // Declared first, so the delete below never fails on a first start; one transaction.
    t.push_str(&format!(
        "table inet {name} {{}}\ndelete table inet {name}\n"
    ));
    t.push_str(&format!("table inet {name} {{\n"));
    let runners: Vec<String> = rules
        .runner_nets
        .iter()
        .map(|n| format!("{n}/30"))
        .collect();
    // Rewrites to the host's loopback: only for this agent's runners, only the named ports.
    t.push_str(
        "  chain prerouting {\n    type nat hook prerouting priority -100; policy accept;\n",
    );
    if !runners.is_empty() {
        let from = format!(
            "iifname {veth} ip saddr {} fib daddr type local",
            set_of(&runners)
        );
        if !rules.host_ports.is_empty() {
            t.push_str(&format!(
                "    {from} tcp dport {} dnat ip to 127.0.0.1\n",
                set_of(&rules.host_ports)
            ));
        }
        if let Some(resolver) = rules.loopback_resolver {
            t.push_str(&format!(
                "    {from} meta l4proto {{ tcp, udp }} th dport {DNS_PORT} dnat ip to {resolver}\n"
            ));
        }
        if let Some(port) = rules.egress_resolver {
            t.push_str(&format!(
                "    {from} meta l4proto {{ tcp, udp }} th dport {EGRESS_DNS_PORT} dnat ip to 127.0.0.1:{port}\n"
            ));
        }
    }
    t.push_str("  }\n");
    // Nothing of the host itself, but what the rewrites above let in.
    t.push_str(&format!(
        "  chain input {{\n    type filter hook input priority 0; policy accept;\n    \
         iifname {veth} ct state established,related accept\n    \
         iifname {veth} ct status dnat ip daddr 127.0.0.0/8 accept\n    \
         iifname {veth} reject with icmpx type admin-prohibited\n  }}\n"
    ));
    // Through the host: no IPv6 at all (a runner has none; this holds if its namespace were
    // given some), and then not to another runner, not to a service the host publishes by DNAT
    // (a container's published port), not to a denied network; nothing new towards a runner.
    // The IPv6 entries of the deny list and IPv6 resolvers need no rule of their own: the
    // first rule drops everything they would match.
    let mut v4: Vec<String> = rules
        .deny
        .iter()
        .filter(|cidr| cidr.addr.is_ipv4())
        .map(ToString::to_string)
        .collect();
    v4.push(format!("{}/{}", RUNNER_NET.0, RUNNER_NET.1));
    t.push_str(&format!(
        "  chain forward {{\n    type filter hook forward priority 0; policy accept;\n    \
         iifname {veth} meta nfproto ipv6 counter drop\n    \
         oifname {veth} ct state established,related accept\n    \
         oifname {veth} reject with icmpx type admin-prohibited\n    \
         iifname {veth} ct state established,related accept\n    \
         iifname {veth} ct status dnat reject with icmpx type admin-prohibited\n"
    ));
    for resolver in rules.resolvers.iter().filter(|r| r.is_ipv4()) {
        t.push_str(&format!(
            "    iifname {veth} ip daddr {resolver} meta l4proto {{ tcp, udp }} th dport {DNS_PORT} accept\n"
        ));
    }
    t.push_str(&format!(
        "    iifname {veth} ip daddr {} reject with icmpx type admin-prohibited\n",
        set_of(&v4)
    ));
    t.push_str("  }\n");
    t.push_str(&format!(
        "  chain postrouting {{\n    type nat hook postrouting priority 100; policy accept;\n    \
         iifname {veth} oifname != {veth} masquerade\n  }}\n}}\n"
    ));
    t
}

/// The table inside a runner's namespace (`nft -f` text): the host ports and the loopback
/// resolver rewritten to the host end of the veth, and `allow`, when set, the only egress; or,
/// under egress by name (`egress`), the runner's DNS rewritten to the agent's resolver and
/// only what it opened reachable ([`egress`]).
pub fn runner_table(
    addresses: Addresses,
    host_ports: &[u16],
    loopback_resolver: Option<Ipv4Addr>,
    resolvers: &[IpAddr],
    allow: Option<&[Cidr]>,
    egress: Option<&EgressRules>,
) -> String {
    let host = addresses.host;
    let mut t = String::from("table ip rm {\n");
    t.push_str("  chain output_nat {\n    type nat hook output priority -100; policy accept;\n");
    if !host_ports.is_empty() {
        t.push_str(&format!(
            "    ip daddr 127.0.0.1 tcp dport {} dnat to {host}\n",
            set_of(host_ports)
        ));
    }
    match egress {
        Some(rules) => egress::dns_rewrite(&mut t, host, rules),
        None => {
            if let Some(resolver) = loopback_resolver {
                t.push_str(&format!(
                    "    ip daddr {resolver} meta l4proto {{ tcp, udp }} th dport {DNS_PORT} dnat to {host}\n"
                ));
            }
        }
    }
    t.push_str("  }\n");
    // What was rewritten leaves with the runner's address, not a loopback one.
    t.push_str(&format!(
        "  chain postrouting {{\n    type nat hook postrouting priority 100; policy accept;\n    \
         oifname \"{RUNNER_IF}\" ip saddr 127.0.0.0/8 snat to {}\n  }}\n",
        addresses.runner
    ));
    if let Some(rules) = egress {
        egress::chains(&mut t, addresses, host_ports, rules);
    } else if let Some(allow) = allow {
        t.push_str(&format!(
            "  chain output {{\n    type filter hook output priority 0; policy accept;\n    \
             oifname \"lo\" accept\n    ct state established,related accept\n    \
             ip daddr {host} accept\n"
        ));
        for resolver in resolvers.iter().filter(|r| r.is_ipv4()) {
            t.push_str(&format!(
                "    ip daddr {resolver} meta l4proto {{ tcp, udp }} th dport {DNS_PORT} accept\n"
            ));
        }
        let v4: Vec<String> = allow
            .iter()
            .filter(|c| c.addr.is_ipv4())
            .map(ToString::to_string)
            .collect();
        if !v4.is_empty() {
            t.push_str(&format!("    ip daddr {} accept\n", set_of(&v4)));
        }
        t.push_str("    reject with icmp type admin-prohibited\n  }\n");
    }
    t.push_str("}\n");
    t
}

/// The host's part: forwarding on and this agent's table loaded.
#[derive(Debug, Clone)]
pub struct HostNetwork {
    pub table: String,
    pub rules: HostRules,
}

impl HostNetwork {
    /// Turns forwarding on and replaces the agent's table (one `nft` transaction). Idempotent;
    /// run at every start, before any runner.
    pub fn install(&self) -> Result<(), NetworkError> {
        std::fs::write(IP_FORWARD, "1").map_err(|source| NetworkError::Io {
            what: format!("cannot turn on forwarding ({IP_FORWARD})"),
            source,
        })?;
        nft(&host_table(&self.table, &self.rules))
    }

    /// Removes the agent's table (when no runner of it is left).
    pub fn uninstall(&self) -> Result<(), NetworkError> {
        let name = &self.table;
        nft(&format!(
            "table inet {name} {{}}\ndelete table inet {name}\n"
        ))
    }

    /// The table of a runner of `uid` whose policy allows `allow`, or decides by name
    /// (`egress`).
    pub fn runner_table(
        &self,
        uid: u32,
        allow: Option<&[Cidr]>,
        egress: Option<&EgressRules>,
    ) -> String {
        runner_table(
            addresses(slot_of(uid)),
            &self.rules.host_ports,
            self.rules.loopback_resolver,
            &self.rules.resolvers,
            allow,
            egress,
        )
    }
}

/// Makes a runner's namespace, veth, addresses, route and table, replacing leftovers of the
/// same names, and returns the namespace's descriptor for the runner to join. On error, what
/// was made is removed.
pub fn create(names: &Names, uid: u32, table: &str) -> Result<OwnedFd, NetworkError> {
    remove(names)?;
    let made = build(names, addresses(slot_of(uid)), table);
    if made.is_err() {
        let _ = remove(names);
    }
    made
}

fn build(names: &Names, addresses: Addresses, table: &str) -> Result<OwnedFd, NetworkError> {
    let Names { netns, veth } = names;
    // Two veths with one /30 would send one runner's replies to the other: a leftover of
    // another agent given the same uids, or of a runner something outside rm keeps alive.
    if let Some(holder) = address_holder(addresses.host)? {
        if let Some(short) = runner_short_of_veth(&holder) {
            return Err(NetworkError::HeldByRunner {
                address: addresses.host,
                short: short.to_owned(),
            });
        }
        return Err(NetworkError::Failed {
            command: format!("ip addr add {}/30 dev {veth}", addresses.host),
            stderr: format!(
                "{} is already the address of {holder}: another runner's network holds this uid's slot (two agents with overlapping host.runner_uids, or a runner left running)",
                addresses.host
            ),
        });
    }
    ip(&["netns", "add", netns])?;
    ip(&[
        "link", "add", veth, "type", "veth", "peer", "name", RUNNER_IF, "netns", netns,
    ])?;
    ip(&[
        "addr",
        "add",
        &format!("{}/30", addresses.host),
        "dev",
        veth,
    ])?;
    // The host end lets the rewritten host ports reach the host's loopback.
    write_sysctl(&format!("/proc/sys/net/ipv4/conf/{veth}/route_localnet"))?;
    ip(&["link", "set", veth, "up"])?;
    let fd = open_netns(&names.netns_path())?;
    let runner = addresses.runner;
    let host = addresses.host;
    inside(&fd, netns, || {
        // Before `eth0` is up: no router advertisement is ever taken.
        runner_ipv6_off()?;
        ip_batch(&format!(
            "link set lo up\naddr add {runner}/30 dev {RUNNER_IF}\nlink set {RUNNER_IF} up\nroute add default via {host}\n"
        ))?;
        // Inside too: the rewritten loopback connections leave through eth0.
        write_sysctl("/proc/sys/net/ipv4/conf/all/route_localnet")?;
        write_sysctl(&format!(
            "/proc/sys/net/ipv4/conf/{RUNNER_IF}/route_localnet"
        ))?;
        nft(table)
    })?;
    Ok(fd)
}

/// Runs `step` on a thread that joined the namespace `fd` (named `netns`, for errors): a
/// thread's namespace is its own and the programs it starts inherit it, so the agent's other
/// threads stay where they are.
pub(crate) fn inside<T: Send>(
    fd: &OwnedFd,
    netns: &str,
    step: impl FnOnce() -> Result<T, NetworkError> + Send,
) -> Result<T, NetworkError> {
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                rustix::thread::move_into_link_name_space(
                    fd.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .map_err(|e| NetworkError::Io {
                    what: format!("cannot enter the runner's namespace {netns}"),
                    source: e.into(),
                })?;
                step()
            })
            .join()
            .unwrap_or_else(|_| {
                Err(NetworkError::Io {
                    what: format!("working in the runner's namespace {netns}"),
                    source: std::io::Error::other("the thread panicked"),
                })
            })
    })
}

/// The interface that has `addr`, if one has.
fn address_holder(addr: Ipv4Addr) -> Result<Option<String>, NetworkError> {
    let output = Command::new("ip")
        .args(["-o", "-4", "addr", "show", "to", &format!("{addr}/32")])
        .stderr(Stdio::null())
        .output()
        .map_err(|source| NetworkError::Missing {
            program: "ip",
            package: "iproute2",
            source,
        })?;
    // `4: rmv0123456789ab    inet 10.213.0.1/30 ...`: the second word.
    Ok(String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .nth(1)
        .map(ToOwned::to_owned))
}

/// `rmv0123456789ab` (or `rmv0123456789ab@if2`, as `ip` names a veth) → `0123456789ab`.
fn runner_short_of_veth(veth: &str) -> Option<&str> {
    let name = veth.split('@').next()?;
    let short = name.strip_prefix(VETH_PREFIX)?;
    (short.len() == 12 && short.bytes().all(|b| b.is_ascii_hexdigit())).then_some(short)
}

/// Removes a runner's veth and namespace, whichever exist. The veth first: deleting it is
/// synchronous, while a namespace's interfaces go asynchronously after its last reference.
pub fn remove(names: &Names) -> Result<(), NetworkError> {
    if Path::new("/sys/class/net").join(&names.veth).exists() {
        ip(&["link", "del", &names.veth])?;
    }
    if names.netns_path().exists() {
        ip(&["netns", "del", &names.netns])?;
    }
    Ok(())
}

/// Whether anything of a runner's network is left.
pub fn exists(names: &Names) -> bool {
    Path::new("/sys/class/net").join(&names.veth).exists() || names.netns_path().exists()
}

/// The packages whose programs a private network needs (`ip`, `nft`) and this host lacks:
/// looked for on the `PATH`, and in `/usr/sbin` and `/sbin`, where Debian puts them and a
/// user's `PATH` may not.
pub fn missing_tools() -> Vec<&'static str> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = |tool: &str| {
        std::env::split_paths(&path)
            .chain(["/usr/sbin".into(), "/sbin".into()])
            .any(|dir| {
                std::fs::metadata(dir.join(tool)).is_ok_and(|m| {
                    std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
                })
            })
    };
    [("ip", "iproute2"), ("nft", "nftables")]
        .into_iter()
        .filter(|(tool, _)| !found(tool))
        .map(|(_, package)| package)
        .collect()
}

/// Opens a named namespace for `setns`.
pub(crate) fn open_netns(path: &Path) -> Result<OwnedFd, NetworkError> {
    rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).map_err(|e| {
        NetworkError::Io {
            what: format!("cannot open the runner's namespace {}", path.display()),
            source: e.into(),
        }
    })
}

fn write_sysctl(path: &str) -> Result<(), NetworkError> {
    write_sysctl_value(path, "1")
}

fn write_sysctl_value(path: &str, value: &str) -> Result<(), NetworkError> {
    std::fs::write(path, value).map_err(|source| NetworkError::Io {
        what: format!("cannot set {path} to {value}"),
        source,
    })
}

/// Writes [`RUNNER_IPV6`] in the calling thread's network namespace (a runner's).
fn runner_ipv6_off() -> Result<(), NetworkError> {
    if !Path::new(IPV6_CONF).exists() {
        return Ok(());
    }
    for (interface, value) in RUNNER_IPV6 {
        write_sysctl_value(&format!("{IPV6_CONF}/{interface}/disable_ipv6"), value)?;
    }
    Ok(())
}

fn ip(args: &[&str]) -> Result<(), NetworkError> {
    run("ip", "iproute2", args, None)
}

fn ip_batch(script: &str) -> Result<(), NetworkError> {
    run("ip", "iproute2", &["-batch", "-"], Some(script))
}

fn nft(script: &str) -> Result<(), NetworkError> {
    run("nft", "nftables", &["-f", "-"], Some(script))
}

/// `nft ARGS`' standard output.
fn nft_output(args: &[&str]) -> Result<String, NetworkError> {
    let output = Command::new("nft")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| NetworkError::Missing {
            program: "nft",
            package: "nftables",
            source,
        })?;
    if !output.status.success() {
        return Err(NetworkError::Failed {
            command: format!("nft {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    String::from_utf8(output.stdout).map_err(|e| NetworkError::Failed {
        command: format!("nft {}", args.join(" ")),
        stderr: format!("not UTF-8: {e}"),
    })
}

fn run(
    program: &'static str,
    package: &'static str,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<(), NetworkError> {
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = command.spawn().map_err(|source| NetworkError::Missing {
        program,
        package,
        source,
    })?;
    if let (Some(text), Some(mut input)) = (stdin, child.stdin.take()) {
        input
            .write_all(text.as_bytes())
            .map_err(|source| NetworkError::Io {
                what: format!("cannot write to `{program}`"),
                source,
            })?;
    }
    let output = child
        .wait_with_output()
        .map_err(|source| NetworkError::Io {
            what: format!("waiting for `{program}`"),
            source,
        })?;
    if output.status.success() {
        return Ok(());
    }
    Err(NetworkError::Failed {
        command: format!("{program} {}", args.join(" ")),
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
    })
}

#[cfg(test)]
mod tests;
