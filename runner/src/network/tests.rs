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
        "ip6 daddr { fd00:ec2::254/128, fe80::/10 } reject",
        "iifname \"rmv*\" oifname != \"rmv*\" masquerade",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    // Without ports or a loopback resolver, nothing is rewritten to the host.
    let bare = host_table("t", &HostRules::new(&[], &[], "nameserver 1.1.1.1\n", [1]));
    assert!(!bare.contains("dnat ip to"), "{bare}");
    assert!(bare.contains("ip daddr 1.1.1.1 meta l4proto { tcp, udp } th dport 53 accept"));
}

#[test]
fn the_runner_table_rewrites_loopback_ports_and_allows_only_the_allow_list() {
    let a = addresses(3);
    let open = runner_table(a, &[8080], Some(Ipv4Addr::new(127, 0, 0, 53)), &[], None);
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
    let closed = runner_table(a, &[], None, &["10.0.0.2".parse().unwrap()], Some(&allow));
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
