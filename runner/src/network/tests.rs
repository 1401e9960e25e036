use super::*;

#[test]
fn networks_are_read_as_operators_write_them() {
    let cases: &[(&str, Option<&str>)] = &[
        ("10.0.0.0/8", Some("10.0.0.0/8")),
        ("192.168.1.7", Some("192.168.1.7/32")),
        ("2001:db8::/32", Some("2001:db8::/32")),
        ("::1", Some("::1/128")),
        ("10.0.0.0/33", None),
        ("10.0.0/8", None),
        ("example.com", None),
        ("10.0.0.0/x", None),
    ];
    for (text, want) in cases {
        let got = text.parse::<Cidr>().ok().map(|c| c.to_string());
        assert_eq!(got.as_deref(), *want, "{text}");
    }
}

#[test]
fn each_uid_has_its_own_slash_30() {
    assert_eq!(
        addresses(0),
        Addresses {
            host: Ipv4Addr::new(10, 213, 0, 1),
            runner: Ipv4Addr::new(10, 213, 0, 2)
        }
    );
    assert_eq!(
        addresses(slot_of(64200)),
        addresses(64200 % NETWORK_SLOTS),
        "the slot is the uid modulo the slots"
    );
    let last = addresses(NETWORK_SLOTS - 1);
    assert_eq!(last.runner, Ipv4Addr::new(10, 213, 255, 254));
    assert_eq!(slots_collide(64200..64264), None);
    assert_eq!(
        slots_collide([1000, 1000 + NETWORK_SLOTS]),
        Some((1000, 1000 + NETWORK_SLOTS))
    );
}

#[test]
fn names_fit_an_interface_name() {
    let names = Names::of("0123456789ab");
    assert_eq!(names.veth, "rmv0123456789ab");
    assert!(names.veth.len() <= 15, "IFNAMSIZ - 1");
    assert_eq!(names.netns_path(), Path::new("/run/netns/rm-0123456789ab"));
}

#[test]
fn resolvers_are_sorted_into_loopback_and_others() {
    let conf = "# generated\nnameserver 127.0.0.53\nnameserver 10.0.0.2\noptions edns0\nnameserver fe80::1%eth0\nnameserver 127.0.0.1\n";
    let rules = HostRules::new(&[8080], &[], conf, [64200, 64201]);
    assert_eq!(
        rules.loopback_resolver,
        Some(Ipv4Addr::new(127, 0, 0, 53)),
        "the first loopback resolver"
    );
    assert_eq!(rules.resolvers, vec!["10.0.0.2".parse::<IpAddr>().unwrap()]);
    assert_eq!(rules.deny.len(), BUILTIN_DENY.len());
    assert_eq!(rules.runner_nets.len(), 2);
}

#[test]
fn the_host_table_lets_runners_reach_only_the_named_host_ports() {
    let deny: Vec<Cidr> = vec!["10.0.0.0/8".parse().unwrap()];
    let rules = HostRules::new(&[8080, 3128], &deny, "nameserver 127.0.0.53\n", [64200]);
    let text = host_table("rm_0000abcd", &rules);
    let net = Ipv4Addr::from(u32::from(addresses(slot_of(64200)).host) - 1);
    for want in [
        "table inet rm_0000abcd {}\ndelete table inet rm_0000abcd\n",
        &format!(
            "iifname \"rmv*\" ip saddr {{ {net}/30 }} fib daddr type local tcp dport {{ 8080, 3128 }} dnat ip to 127.0.0.1"
        ),
        "th dport 53 dnat ip to 127.0.0.53",
        "iifname \"rmv*\" reject with icmpx type admin-prohibited",
        "oifname \"rmv*\" reject",
        "iifname \"rmv*\" ct status dnat reject",
        "ip daddr { 169.254.0.0/16, 10.0.0.0/8, 10.213.0.0/16 } reject",
        "iifname \"rmv*\" oifname != \"rmv*\" masquerade",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    // No IPv6 is forwarded from a runner, counted, before anything is accepted; the IPv6 deny
    // entries (fd00:ec2::254, fe80::/10) need no rule after it.
    let forward = &text[text.find("chain forward").unwrap()..];
    let first_rule = forward.lines().nth(2).unwrap().trim();
    assert_eq!(
        first_rule, "iifname \"rmv*\" meta nfproto ipv6 counter drop",
        "{text}"
    );
    assert!(!text.contains("ip6 "), "{text}");
    // Without ports or a loopback resolver, nothing is rewritten to the host.
    let bare = host_table("t", &HostRules::new(&[], &[], "nameserver 1.1.1.1\n", [1]));
    assert!(!bare.contains("dnat ip to"), "{bare}");
    assert!(bare.contains("ip daddr 1.1.1.1 meta l4proto { tcp, udp } th dport 53 accept"));
}

#[test]
fn the_runner_table_rewrites_loopback_ports_and_allows_only_the_allow_list() {
    let a = addresses(3);
    let open = runner_table(
        a,
        &[8080],
        Some(Ipv4Addr::new(127, 0, 0, 53)),
        &[],
        None,
        None,
    );
    assert!(open.contains("ip daddr 127.0.0.1 tcp dport { 8080 } dnat to 10.213.0.13"));
    assert!(
        open.contains(
            "ip daddr 127.0.0.53 meta l4proto { tcp, udp } th dport 53 dnat to 10.213.0.13"
        )
    );
    assert!(open.contains("ip saddr 127.0.0.0/8 snat to 10.213.0.14"));
    assert!(
        !open.contains("hook output priority 0"),
        "no allow list: no filter"
    );
    let allow: Vec<Cidr> = vec!["203.0.113.0/24".parse().unwrap()];
    let closed = runner_table(
        a,
        &[],
        None,
        &["10.0.0.2".parse().unwrap()],
        Some(&allow),
        None,
    );
    for want in [
        "ip daddr 10.213.0.13 accept",
        "ip daddr 10.0.0.2 meta l4proto { tcp, udp } th dport 53 accept",
        "ip daddr { 203.0.113.0/24 } accept",
        "reject with icmp type admin-prohibited",
    ] {
        assert!(closed.contains(want), "missing {want:?} in\n{closed}");
    }
}

#[test]
fn a_table_name_is_per_data_directory() {
    let a = host_table_name(Path::new("/var/lib/rm"));
    assert_eq!(a, host_table_name(Path::new("/var/lib/rm")));
    assert_ne!(a, host_table_name(Path::new("/var/lib/rm2")));
    assert!(a.starts_with("rm_") && a.len() == 11, "{a}");
}

/// The tables are what `nft` itself accepts (`--check`: parsed and validated by the kernel,
/// nothing loaded).
#[test]
fn nft_accepts_both_tables() {
    if rustix::process::geteuid().as_raw() != 0 {
        crate::test_skip::cannot_run(
            "nft_accepts_both_tables",
            "root",
            "nft --check needs CAP_NET_ADMIN",
        );
        return;
    }
    let deny: Vec<Cidr> = vec![
        "192.168.0.0/16".parse().unwrap(),
        "fc00::/7".parse().unwrap(),
    ];
    let rules = HostRules::new(
        &[8080],
        &deny,
        "nameserver 127.0.0.53\nnameserver 10.0.0.2\nnameserver 2001:db8::53\n",
        [64200, 64201],
    );
    let allow: Vec<Cidr> = vec!["203.0.113.0/24".parse().unwrap()];
    for text in [
        host_table("rm_test_check", &rules),
        runner_table(
            addresses(1),
            &[8080],
            rules.loopback_resolver,
            &rules.resolvers,
            Some(&allow),
            None,
        ),
        runner_table(
            addresses(1),
            &[8080],
            rules.loopback_resolver,
            &rules.resolvers,
            None,
            Some(&egress_rules(false)),
        ),
        runner_table(
            addresses(1),
            &[],
            rules.loopback_resolver,
            &rules.resolvers,
            None,
            Some(&egress_rules(true)),
        ),
    ] {
        let mut child = Command::new("nft")
            .args(["--check", "-f", "-"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("nft (apt-get install nftables)");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "nft refused:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn only_a_veth_named_like_a_runners_names_a_lost_runner() {
    for (veth, short) in [
        ("rmv0123456789ab", Some("0123456789ab")),
        ("rmv0123456789ab@if2", Some("0123456789ab")),
        ("rmv0123456789a", None),
        ("rmv0123456789abc", None),
        ("rmv0123456789xz", None),
        ("rmsq12345", None),
        ("eth0", None),
    ] {
        assert_eq!(super::runner_short_of_veth(veth), short, "{veth}");
    }
}

/// A runner's namespace made by [`create`] for a test, removed on drop (even when the test fails
/// half-way).
struct TestRunner {
    names: Names,
    netns: OwnedFd,
}

impl TestRunner {
    fn new(short_id: &str, uid: u32) -> TestRunner {
        let table = runner_table(addresses(slot_of(uid)), &[], None, &[], None, None);
        TestRunner::with_table(short_id, uid, &table)
    }

    fn with_table(short_id: &str, uid: u32, table: &str) -> TestRunner {
        let names = Names::of(short_id);
        match create(&names, uid, table) {
            Ok(netns) => TestRunner { names, netns },
            Err(e) => panic!("cannot make the runner's network {short_id}: {e}"),
        }
    }

    /// Runs `f` in a thread inside the runner's namespace (its `ip` sees the runner's network).
    fn inside<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        in_netns(&self.netns, f)
    }

    /// `ip ARGS`, inside.
    fn ip(&self, args: &[&str]) -> String {
        self.inside(|| {
            let out = Command::new("ip").args(args).output().unwrap();
            assert!(out.status.success(), "ip {args:?}: {out:?}");
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
    }

    /// The interface index of the host end of the veth.
    fn host_ifindex(&self) -> u32 {
        let path = Path::new("/sys/class/net")
            .join(&self.names.veth)
            .join("ifindex");
        std::fs::read_to_string(path)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for TestRunner {
    fn drop(&mut self) {
        if let Err(e) = remove(&self.names) {
            eprintln!("cannot remove the runner's network {:?}: {e}", self.names);
        }
    }
}

/// A router advertisement (RFC 4861 §4.2), as `radvd` sends it: this host is a default router
/// for 30 minutes, and `PREFIX`/64 is on-link for stateless autoconfiguration (flags L and A).
/// The kernel fills in the ICMPv6 checksum of a raw ICMPv6 socket.
fn router_advertisement(prefix: std::net::Ipv6Addr) -> Vec<u8> {
    let mut ra = vec![134, 0, 0, 0, 64, 0];
    ra.extend_from_slice(&1800u16.to_be_bytes()); // router lifetime, seconds
    ra.extend_from_slice(&0u32.to_be_bytes()); // reachable time
    ra.extend_from_slice(&0u32.to_be_bytes()); // retransmission timer
    ra.extend_from_slice(&[3, 4, 64, 0xc0]); // prefix information, 32 bytes, /64, L and A
    ra.extend_from_slice(&86_400u32.to_be_bytes()); // valid lifetime
    ra.extend_from_slice(&14_400u32.to_be_bytes()); // preferred lifetime
    ra.extend_from_slice(&0u32.to_be_bytes());
    ra.extend_from_slice(&prefix.octets());
    ra
}

/// Sends `ra` to all nodes (`ff02::1`) on the interface `ifindex`, hop limit 255 (a router
/// advertisement with any other is dropped). `false` while the interface is not ready for IPv6:
/// its link-local address still being checked (duplicate address detection) leaves it without a
/// source, and right after it comes up it has no multicast route yet.
fn advertise(ra: &[u8], ifindex: u32) -> bool {
    use rustix::net::{AddressFamily, SendFlags, SocketType, ipproto, sockopt};
    let socket =
        rustix::net::socket(AddressFamily::INET6, SocketType::RAW, Some(ipproto::ICMPV6)).unwrap();
    sockopt::set_ipv6_multicast_if(&socket, ifindex).unwrap();
    sockopt::set_ipv6_multicast_hops(&socket, 255).unwrap();
    let all_nodes = std::net::SocketAddrV6::new("ff02::1".parse().unwrap(), 0, 0, ifindex);
    match rustix::net::sendto(&socket, ra, SendFlags::empty(), &all_nodes) {
        Ok(_) => true,
        Err(rustix::io::Errno::ADDRNOTAVAIL | rustix::io::Errno::NETUNREACH) => false,
        Err(e) => panic!("cannot send the router advertisement on {ifindex}: {e}"),
    }
}

/// How long the control waits for the advertised route: the host end's link-local address
/// takes a second or two of duplicate address detection before anything is sent.
const ADVERTISED_WITHIN: std::time::Duration = std::time::Duration::from_secs(20);

/// A runner whose host sends router advertisements on its veth gets no IPv6 address and no
/// IPv6 route (issue 38); the control, a second runner given IPv6 back on `eth0`, takes both
/// from the same advertisements, so a runner that accepted them would fail here.
#[test]
fn a_router_advertisement_gives_a_runner_no_ipv6_route() {
    const TEST: &str = "a_router_advertisement_gives_a_runner_no_ipv6_route";
    if rustix::process::geteuid().as_raw() != 0 {
        crate::test_skip::cannot_run(TEST, "root", "a network namespace needs CAP_SYS_ADMIN");
        return;
    }
    if let Some(package) = missing_tools().first() {
        crate::test_skip::cannot_run(
            TEST,
            package,
            "the runner's network is made with ip and nft",
        );
        return;
    }
    if !Path::new(IPV6_CONF).exists() {
        crate::test_skip::cannot_run(TEST, "IPv6", "the kernel has no IPv6 to advertise");
        return;
    }
    // Slots half the space away from the backend tests' block of this process.
    let uid = 3_100_000 + (std::process::id() % 1000) * 16 + NETWORK_SLOTS / 2;
    let pid = std::process::id();
    let sealed = TestRunner::new(&format!("{pid:08x}a6e0"), uid);
    let control = TestRunner::new(&format!("{pid:08x}a6e1"), uid + 1);
    control.inside(|| {
        std::fs::write(format!("{IPV6_CONF}/{RUNNER_IF}/disable_ipv6"), "0").unwrap();
    });

    let ra = router_advertisement("2001:db8:38::".parse().unwrap());
    let deadline = std::time::Instant::now() + ADVERTISED_WITHIN;
    let mut sent_to_sealed = 0;
    let has_default = |runner: &TestRunner| {
        !runner
            .ip(&["-6", "route", "show", "default"])
            .trim()
            .is_empty()
    };
    loop {
        // The sealed runner's first, so that it has had every advertisement the control had.
        sent_to_sealed += usize::from(advertise(&ra, sealed.host_ifindex()));
        advertise(&ra, control.host_ifindex());
        if sent_to_sealed > 0 && has_default(&control) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the control took no route from {sent_to_sealed} advertisements in {ADVERTISED_WITHIN:?}: {}",
            control.ip(&["-6", "addr"])
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let control_global = control.ip(&["-6", "-o", "addr", "show", "scope", "global"]);
    assert!(
        control_global.contains("2001:db8:38:"),
        "the control autoconfigured an address: {control_global}"
    );
    assert!(
        control
            .ip(&["-6", "route", "show", "default"])
            .contains("via fe80::"),
        "the control's default route is the host end"
    );

    // One more, and the time the control needed, for the last to be taken if it were.
    advertise(&ra, sealed.host_ifindex());
    std::thread::sleep(std::time::Duration::from_millis(500));
    let routes = sealed.ip(&["-6", "route"]);
    let global = sealed.ip(&["-6", "-o", "addr", "show", "scope", "global"]);
    assert!(!has_default(&sealed), "an IPv6 default route: {routes}");
    assert!(global.trim().is_empty(), "a global IPv6 address: {global}");
    assert!(
        sealed
            .ip(&["-6", "-o", "addr", "show", "dev", RUNNER_IF])
            .trim()
            .is_empty(),
        "eth0 has no IPv6 at all, not even a link-local address"
    );
    assert!(
        sealed
            .ip(&["-6", "-o", "addr", "show", "dev", "lo"])
            .contains("::1/128"),
        "the loopback keeps ::1"
    );
    // A job binding a new interface's IPv6 finds it off too.
    let default_off = sealed
        .inside(|| std::fs::read_to_string(format!("{IPV6_CONF}/default/disable_ipv6")).unwrap());
    assert_eq!(default_off.trim(), "1");
}

fn egress_rules(audit: bool) -> EgressRules {
    EgressRules {
        audit,
        networks: vec!["10.20.0.0/16".parse().unwrap()],
        nameservers: vec![Ipv4Addr::new(127, 0, 0, 53), Ipv4Addr::new(10, 0, 0, 2)],
    }
}

#[test]
fn under_egress_by_name_dns_goes_to_the_resolver_and_only_what_it_opened_is_reached() {
    let a = addresses(3);
    let enforce = runner_table(
        a,
        &[8080],
        Some(Ipv4Addr::new(127, 0, 0, 53)),
        &[],
        None,
        Some(&egress_rules(false)),
    );
    // The resolv.conf nameservers lead to the agent's resolver, at the host end.
    assert!(
        enforce.contains(&format!(
            "ip daddr {{ 127.0.0.53, 10.0.0.2 }} meta l4proto {{ tcp, udp }} th dport 53 dnat to {}:{EGRESS_DNS_PORT}",
            a.host
        )),
        "{enforce}"
    );
    // Not the host's own loopback resolver any more.
    assert!(
        !enforce.contains(&format!("th dport 53 dnat to {}\n", a.host)),
        "{enforce}"
    );
    for line in [
        "limit rate over 250/second burst 500 packets counter name dns_flood drop",
        "set allowed {\n    type ipv4_addr; flags timeout; size 4096;",
        "elements = { 10.20.0.0/16 }",
        "th dport 53 counter name dns_other reject with icmp type admin-prohibited",
        "ip daddr @allowed meta l4proto { tcp, udp } update @reached { ip daddr . th dport } accept",
        "ip daddr @nets accept",
        "update @denied { ip daddr . th dport } reject with icmp type admin-prohibited",
        "tcp dport { 8080 } accept",
    ] {
        assert!(enforce.contains(line), "missing {line:?} in\n{enforce}");
    }
    // Audit refuses nothing and records everything.
    let audit = runner_table(a, &[], None, &[], None, Some(&egress_rules(true)));
    assert!(!audit.contains("reject"), "{audit}");
    assert!(
        audit.contains("th dport 53 counter name dns_other accept"),
        "{audit}"
    );
    assert!(
        audit.contains("meta l4proto { tcp, udp } update @reached { ip daddr . th dport } accept"),
        "{audit}"
    );
    // Without egress, nothing of it.
    let plain = runner_table(a, &[], None, &[], None, None);
    assert!(!plain.contains("@allowed"), "{plain}");
}

#[test]
fn the_host_table_leads_the_egress_port_to_the_resolver_only_when_there_is_one() {
    let mut rules = HostRules::new(&[], &[], "nameserver 127.0.0.53\n", [64200]);
    assert!(!host_table("rm_t", &rules).contains(&EGRESS_DNS_PORT.to_string()));
    rules.egress_resolver = Some(40123);
    let table = host_table("rm_t", &rules);
    assert!(
        table.contains(&format!(
            "th dport {EGRESS_DNS_PORT} dnat ip to 127.0.0.1:40123"
        )),
        "{table}"
    );
}

#[test]
fn opening_an_address_renews_its_timeout_in_one_transaction() {
    let script = egress::open_script(&[
        (
            Ipv4Addr::new(203, 0, 113, 7),
            std::time::Duration::from_secs(60),
        ),
        (
            Ipv4Addr::new(203, 0, 113, 8),
            std::time::Duration::from_millis(200),
        ),
    ]);
    assert_eq!(
        script,
        "add element ip rm allowed { 203.0.113.7 timeout 60s }\n\
         delete element ip rm allowed { 203.0.113.7 }\n\
         add element ip rm allowed { 203.0.113.7 timeout 60s }\n\
         add element ip rm allowed { 203.0.113.8 timeout 1s }\n\
         delete element ip rm allowed { 203.0.113.8 }\n\
         add element ip rm allowed { 203.0.113.8 timeout 1s }\n"
    );
}

#[test]
fn what_a_runner_reached_is_read_from_nfts_own_json() {
    // `nft -j list table ip rm` of a runner table, as nftables 1.0.6 writes it.
    let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"table": {"family": "ip", "name": "rm", "handle": 1}}, {"counter": {"family": "ip", "name": "dns_other", "table": "rm", "handle": 2, "packets": 3, "bytes": 87}}, {"counter": {"family": "ip", "name": "dns_flood", "table": "rm", "handle": 6, "packets": 9, "bytes": 400}}, {"set": {"family": "ip", "name": "allowed", "table": "rm", "type": "ipv4_addr", "handle": 3, "size": 4096, "flags": ["timeout"]}}, {"set": {"family": "ip", "name": "reached", "table": "rm", "type": ["ipv4_addr", "inet_service"], "handle": 4, "size": 8, "elem": [{"elem": {"val": {"concat": ["10.77.0.1", 53]}, "counter": {"packets": 1, "bytes": 29}}}, {"elem": {"val": {"concat": ["1.2.3.4", 443]}, "counter": {"packets": 2, "bytes": 120}}}], "stmt": [{"counter": null}]}}, {"set": {"family": "ip", "name": "denied", "table": "rm", "type": ["ipv4_addr", "inet_service"], "handle": 5, "size": 8, "stmt": [{"counter": null}]}}]}"#;
    let observed = egress::parse_observed(json).unwrap();
    assert_eq!(observed.dns_other, 3);
    assert_eq!(observed.dns_flood, 9);
    assert_eq!(
        observed.reached,
        vec![
            (Ipv4Addr::new(10, 77, 0, 1), 53, 1),
            (Ipv4Addr::new(1, 2, 3, 4), 443, 2)
        ]
    );
    assert!(observed.denied.is_empty());
    assert!(egress::parse_observed("not json").is_err());
}

/// In a real namespace: an address the agent opened is reached, one it did not is refused at
/// once, DNS to another resolver is refused, and all of it is read back as the agent reads it.
#[test]
fn an_opened_address_is_reached_and_the_rest_refused_and_recorded_in_the_kernel() {
    let uid = 64_941;
    let pid = std::process::id();
    let runner = TestRunner::with_table(
        &format!("{pid:08x}e9e5"),
        uid,
        &runner_table(
            addresses(slot_of(uid)),
            &[],
            None,
            &[],
            None,
            Some(&EgressRules {
                audit: false,
                networks: vec![],
                nameservers: vec![Ipv4Addr::new(127, 0, 0, 53)],
            }),
        ),
    );
    // TEST-NET addresses. The opened one is given to the host end of the veth, so what the
    // table lets through stops at this host (which has no listener there); the closed one
    // never leaves the runner's namespace.
    let opened = Ipv4Addr::new(192, 0, 2, 77);
    let closed = Ipv4Addr::new(192, 0, 2, 78);
    super::ip(&[
        "addr",
        "add",
        &format!("{opened}/32"),
        "dev",
        &runner.names.veth,
    ])
    .unwrap();
    egress::open(
        &runner.names,
        &[(opened, std::time::Duration::from_secs(30))],
    )
    .unwrap();
    let connect = |addr: Ipv4Addr, port: u16| {
        runner.inside(|| {
            std::net::TcpStream::connect_timeout(
                &std::net::SocketAddr::from((addr, port)),
                std::time::Duration::from_millis(300),
            )
            .map(drop)
            .map_err(|e| e.kind())
        })
    };
    // The opened address passes the runner's table; past it the host answers however its
    // own rules say (nothing listens; another test's agent table may refuse it), which is why
    // the kernel's own record of the runner's table is the evidence below.
    let _ = connect(opened, 443);
    assert_eq!(
        connect(closed, 443),
        Err(std::io::ErrorKind::HostUnreachable)
    );
    // DNS to another resolver: refused (the send itself, or the ICMP error it gets, fails the
    // socket; either way it is counted).
    runner.inside(|| {
        let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        let _ = socket.send_to(b"q", (closed, 53));
    });
    // A flood of the resolver through the rewritten nameserver, from one socket (one flow): the
    // runner's own table drops what passes the rate, whatever way the packets leave.
    let sent = runner.inside(|| {
        let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        socket.connect((Ipv4Addr::new(127, 0, 0, 53), 53)).unwrap();
        (0..3 * egress::RESOLVER_PACKET_BURST)
            .filter(|_| socket.send(b"flood").is_ok())
            .count()
    });
    let observed = egress::observe(&runner.names).unwrap();
    assert!(
        observed.dns_flood >= u64::from(egress::RESOLVER_PACKET_BURST),
        "{sent} sent, {observed:?}"
    );
    assert!(sent < 3 * egress::RESOLVER_PACKET_BURST as usize, "{sent}");
    assert_eq!(observed.reached, vec![(opened, 443, 1)], "{observed:?}");
    assert!(observed.denied.contains(&(closed, 443, 1)), "{observed:?}");
    assert_eq!(observed.dns_other, 1, "{observed:?}");
    // Opening again renews, never fails on an element already there.
    egress::open(
        &runner.names,
        &[(opened, std::time::Duration::from_secs(60))],
    )
    .unwrap();
}

// Reachability with real traffic: runner networks made as the agent makes them (the host's
// table installed by `HostNetwork::install`, each runner's table from
// `HostNetwork::runner_table`, its namespace by `create`), TCP listeners in them and in
// stand-in networks, and connections that are refused or answered.

/// How long a connection that should be answered may take; a refusal comes back at once (an
/// ICMP error from a reject rule), so this bounds only the controls.
const CONNECT_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// Slots for the reachability tests: half the space away from the backend tests' block of this
/// process, after the router advertisement test's two.
fn reachability_uid(n: u32) -> u32 {
    3_100_000 + (std::process::id() % 1000) * 16 + NETWORK_SLOTS / 2 + 2 + n
}

/// Runs `f` on a thread that joined the network namespace `netns`; a socket it makes stays in
/// that namespace after the thread ends.
fn in_netns<T: Send>(netns: &OwnedFd, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                rustix::thread::move_into_link_name_space(
                    netns.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .unwrap();
                f()
            })
            .join()
            .unwrap()
    })
}

/// A TCP connection to `to` from the calling thread's namespace: answered, or why not.
fn connect(to: std::net::SocketAddr) -> Result<(), std::io::ErrorKind> {
    std::net::TcpStream::connect_timeout(&to, CONNECT_WITHIN)
        .map(drop)
        .map_err(|e| e.kind())
}

/// An agent's host table for a test, installed as the agent installs it and removed on drop.
struct TestHostTable(HostNetwork);

impl TestHostTable {
    fn install(name: &str, uids: &[u32]) -> TestHostTable {
        let host = HostNetwork {
            table: name.to_owned(),
            rules: HostRules::new(&[], &[], "", uids.iter().copied()),
        };
        // The guard first: a half-made table is removed too.
        let table = TestHostTable(host);
        table.0.install().unwrap();
        table
    }

    /// A runner of `uid` whose policy says `allow`, made as the agent makes it.
    fn runner(&self, short_id: &str, uid: u32, allow: Option<&[Cidr]>) -> TestRunner {
        TestRunner::with_table(short_id, uid, &self.0.runner_table(uid, allow, None))
    }

    fn loaded(&self) -> bool {
        nft_output(&["list", "table", "inet", &self.0.table]).is_ok()
    }
}

impl Drop for TestHostTable {
    fn drop(&mut self) {
        if let Err(e) = self.0.uninstall() {
            eprintln!("cannot remove the host table {}: {e}", self.0.table);
        }
    }
}

/// A network a runner may be allowed to reach, standing in for one outside the host: a
/// namespace joined to the host by a veth, a /30 of TEST-NET-2 (198.51.100.0/24: this host's
/// own network is TEST-NET-1, the e2e stand-ins use TEST-NET-3), and a TCP listener at the far
/// end. The host routes to it as to any network it is attached to; nothing leaves the machine.
struct StandIn {
    netns: String,
    /// Not `rmv*`: the host table would take it for a runner's.
    veth: String,
    net: Cidr,
    listener: std::net::TcpListener,
}

impl StandIn {
    /// The stand-in `index` (below 64) of this process.
    fn start(index: u8) -> StandIn {
        assert!(index < 64, "one /30 each in a /24");
        let pid = std::process::id();
        let netns = format!("rmn-{pid}-s{index}");
        let veth = format!("rmn{pid:x}s{index}");
        let base = u32::from(Ipv4Addr::new(198, 51, 100, 0)) + 4 * u32::from(index);
        let (host_end, far_end) = (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2));
        let net: Cidr = format!("{}/30", Ipv4Addr::from(base)).parse().unwrap();
        let _ = Command::new("ip").args(["link", "del", &veth]).output();
        let _ = Command::new("ip").args(["netns", "del", &netns]).output();
        // Removed on drop from here on, whatever step below fails.
        let made = StandInObjects {
            netns: netns.clone(),
            veth: veth.clone(),
        };
        super::ip(&["netns", "add", &netns]).unwrap();
        super::ip(&[
            "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &netns,
        ])
        .unwrap();
        super::ip(&["addr", "add", &format!("{host_end}/30"), "dev", &veth]).unwrap();
        super::ip(&["link", "set", &veth, "up"]).unwrap();
        for line in [
            "link set lo up".to_owned(),
            format!("addr add {far_end}/30 dev eth0"),
            "link set eth0 up".to_owned(),
            format!("route add default via {host_end}"),
        ] {
            let mut args = vec!["-n", netns.as_str()];
            args.extend(line.split_whitespace());
            super::ip(&args).unwrap();
        }
        let fd = open_netns(&Path::new(NETNS_DIR).join(&netns)).unwrap();
        let listener = in_netns(&fd, || std::net::TcpListener::bind((far_end, 0)).unwrap());
        std::mem::forget(made);
        StandIn {
            netns,
            veth,
            net,
            listener,
        }
    }

    fn address(&self) -> std::net::SocketAddr {
        self.listener.local_addr().unwrap()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        drop(StandInObjects {
            netns: std::mem::take(&mut self.netns),
            veth: std::mem::take(&mut self.veth),
        });
    }
}

/// The kernel objects of a stand-in, removed on drop.
struct StandInObjects {
    netns: String,
    veth: String,
}

impl Drop for StandInObjects {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.veth])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .output();
    }
}

/// Whether a test of real traffic can run here; says why not when it cannot.
fn can_make_networks(test: &str) -> bool {
    if rustix::process::geteuid().as_raw() != 0 {
        crate::test_skip::cannot_run(test, "root", "a network namespace needs CAP_SYS_ADMIN");
        return false;
    }
    if let Some(package) = missing_tools().first() {
        crate::test_skip::cannot_run(
            test,
            package,
            "the runner's network is made with ip and nft",
        );
        return false;
    }
    true
}

/// "A runner cannot reach another runner" (the host table's forward chain) "nor an address of
/// the host" (its input chain), with real connections between two runner networks made as the
/// agent makes them: runner B is refused by a listener in runner A's namespace and by one on
/// A's host end, while the host itself reaches both, so they were there to be reached.
#[test]
fn a_runner_reaches_neither_another_runner_nor_its_host_end() {
    const TEST: &str = "a_runner_reaches_neither_another_runner_nor_its_host_end";
    if !can_make_networks(TEST) {
        return;
    }
    let pid = std::process::id();
    let (uid_a, uid_b) = (reachability_uid(0), reachability_uid(1));
    let host = TestHostTable::install(&format!("rm_test_n{pid}a"), &[uid_a, uid_b]);
    let a = host.runner(&format!("{pid:08x}4e00"), uid_a, None);
    let b = host.runner(&format!("{pid:08x}4e01"), uid_b, None);
    let a_addresses = addresses(slot_of(uid_a));
    // A job's server in runner A, on every address it has.
    let in_a = a.inside(|| std::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap());
    let in_a = std::net::SocketAddr::from((a_addresses.runner, in_a.local_addr().unwrap().port()));
    // A host service bound to A's end of its veth (as a daemon bound to every address is).
    let a_host_end = std::net::TcpListener::bind((a_addresses.host, 0)).unwrap();
    let a_host_end = a_host_end.local_addr().unwrap();

    // The controls: both listeners answer, from the host, and A's from inside A.
    assert_eq!(
        connect(in_a),
        Ok(()),
        "the host reaches runner A's listener"
    );
    assert_eq!(
        connect(a_host_end),
        Ok(()),
        "the host reaches its own address"
    );
    assert_eq!(
        a.inside(|| connect(in_a)),
        Ok(()),
        "runner A reaches itself"
    );

    assert_eq!(
        b.inside(|| connect(in_a)),
        Err(std::io::ErrorKind::HostUnreachable),
        "runner B reached runner A at {in_a}"
    );
    assert_eq!(
        b.inside(|| connect(a_host_end)),
        Err(std::io::ErrorKind::HostUnreachable),
        "runner B reached the host at A's end {a_host_end}"
    );
    assert_eq!(
        a.inside(|| connect(a_host_end)),
        Err(std::io::ErrorKind::HostUnreachable),
        "runner A reached the host at its own end {a_host_end}"
    );

    // Nothing is left: namespaces, veths, the table.
    let names = [a.names.clone(), b.names.clone()];
    drop((a, b));
    host.0.uninstall().unwrap();
    assert!(!host.loaded(), "the host table is left");
    for names in &names {
        assert!(!exists(names), "{names:?} is left");
    }
}

/// `policy.network_allow` is "the only networks reached", with real connections: a runner
/// allowed one stand-in network reaches a listener there and is refused by one in a second
/// stand-in network; the control, a runner without `network_allow` on the same host table,
/// reaches both, so the second was reachable and only the allow list kept the runner out.
#[test]
fn a_runner_with_network_allow_reaches_only_the_allowed_network() {
    const TEST: &str = "a_runner_with_network_allow_reaches_only_the_allowed_network";
    if !can_make_networks(TEST) {
        return;
    }
    let pid = std::process::id();
    let (uid_allowed, uid_open) = (reachability_uid(2), reachability_uid(3));
    let allowed = StandIn::start(0);
    let other = StandIn::start(1);
    let host = TestHostTable::install(&format!("rm_test_n{pid}b"), &[uid_allowed, uid_open]);
    let allow = [allowed.net];
    let limited = host.runner(&format!("{pid:08x}4e02"), uid_allowed, Some(&allow));
    let open = host.runner(&format!("{pid:08x}4e03"), uid_open, None);

    // The control: without an allow list, both stand-ins answer through the host.
    assert_eq!(open.inside(|| connect(allowed.address())), Ok(()));
    assert_eq!(open.inside(|| connect(other.address())), Ok(()));

    assert_eq!(
        limited.inside(|| connect(allowed.address())),
        Ok(()),
        "the allowed network {} is reached",
        allowed.net
    );
    assert_eq!(
        limited.inside(|| connect(other.address())),
        Err(std::io::ErrorKind::HostUnreachable),
        "{} is outside network_allow = [{}]",
        other.address(),
        allowed.net
    );

    let names = [limited.names.clone(), open.names.clone()];
    let stand_ins = [
        (allowed.netns.clone(), allowed.veth.clone()),
        (other.netns.clone(), other.veth.clone()),
    ];
    drop((limited, open, allowed, other));
    host.0.uninstall().unwrap();
    assert!(!host.loaded(), "the host table is left");
    for names in &names {
        assert!(!exists(names), "{names:?} is left");
    }
    for (netns, veth) in &stand_ins {
        assert!(
            !Path::new(NETNS_DIR).join(netns).exists(),
            "{netns} is left"
        );
        assert!(
            !Path::new("/sys/class/net").join(veth).exists(),
            "{veth} is left"
        );
    }
}
