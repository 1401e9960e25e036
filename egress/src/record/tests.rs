use std::net::Ipv4Addr;

use rm_runner::network::egress::Observed;

use super::*;

fn allow(entries: &[&str]) -> AllowList {
    AllowList::parse(&entries.iter().map(|e| (*e).to_owned()).collect::<Vec<_>>()).unwrap()
}

const PUBLIC: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 11);
const FORBIDDEN: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 101);
const NET: Ipv4Addr = Ipv4Addr::new(10, 20, 1, 2);

#[test]
fn names_are_counted_once_each_with_their_addresses() {
    let mut tally = Tally::new(Mode::Enforce);
    tally.query("public.test", Verdict::Allowed, &[PUBLIC], 6);
    tally.query("public.test", Verdict::Allowed, &[PUBLIC, PUBLIC], 6);
    tally.query("denied.test", Verdict::Denied, &[], 6);
    let record = tally.record(None, &AllowList::empty());
    assert_eq!(
        record.names,
        vec![
            NameUse {
                name: "denied.test".into(),
                verdict: Verdict::Denied,
                queries: 1,
                addresses: vec![]
            },
            NameUse {
                name: "public.test".into(),
                verdict: Verdict::Allowed,
                queries: 2,
                addresses: vec![PUBLIC]
            },
        ]
    );
    assert!(record.tunnelling.is_empty());
}

#[test]
fn addresses_are_told_by_the_names_that_gave_them_and_the_networks() {
    let observed = Observed {
        reached: vec![(PUBLIC, 80, 2), (NET, 22, 1), (FORBIDDEN, 80, 1)],
        denied: vec![(FORBIDDEN, 443, 3)],
        dns_other: 4,
        dns_flood: 0,
    };
    let list = allow(&["10.20.0.0/16"]);
    let mut audit = Tally::new(Mode::Audit);
    audit.query("public.test", Verdict::Allowed, &[PUBLIC], 6);
    audit.query("denied.test", Verdict::WouldDeny, &[FORBIDDEN], 6);
    let record = audit.record(Some(&observed), &list);
    let verdicts: Vec<(Ipv4Addr, u16, Verdict, u64, Option<&str>)> = record
        .addresses
        .iter()
        .map(|a| {
            (
                a.address,
                a.port,
                a.verdict,
                a.connections,
                a.name.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        verdicts,
        vec![
            (NET, 22, Verdict::Allowed, 1, None),
            (PUBLIC, 80, Verdict::Allowed, 2, Some("public.test")),
            (FORBIDDEN, 80, Verdict::WouldDeny, 1, Some("denied.test")),
            (FORBIDDEN, 443, Verdict::Denied, 3, Some("denied.test")),
        ]
    );
    assert_eq!(record.other_resolver, 4);
    assert_eq!(record.rate_dropped, 0);
    assert_eq!(record.mode, Mode::Audit);
    // What the runner's table dropped for its rate is the record's too.
    let flooded = audit.record(
        Some(&Observed {
            dns_flood: 12,
            ..Observed::default()
        }),
        &list,
    );
    assert_eq!(flooded.rate_dropped, 12);
    assert!(
        flooded
            .job_log()
            .contains("0 DNS query(ies) refused and 12 packet(s) dropped"),
        "{}",
        flooded.job_log()
    );
}

#[test]
fn a_burst_of_unique_refused_names_or_a_long_label_is_tunnelling() {
    let mut tally = Tally::new(Mode::Enforce);
    for i in 0..TUNNEL_UNIQUE_NAMES - 1 {
        tally.query(&format!("x{i}.exfil.test"), Verdict::Denied, &[], 3);
    }
    // The same refused name again and again is not a channel.
    for _ in 0..50 {
        tally.query("telemetry.vendor.test", Verdict::Denied, &[], 9);
    }
    assert!(
        tally
            .record(None, &AllowList::empty())
            .tunnelling
            .is_empty()
    );
    tally.query("last.exfil.test", Verdict::Denied, &[], 4);
    let long = "a".repeat(TUNNEL_LABEL);
    tally.query(
        &format!("{long}.other.test"),
        Verdict::Denied,
        &[],
        TUNNEL_LABEL,
    );
    // Allowed names are never counted as a channel.
    for i in 0..100 {
        tally.query(&format!("x{i}.allowed.test"), Verdict::Allowed, &[], 60);
    }
    let record = tally.record(None, &AllowList::empty());
    assert_eq!(
        record.tunnelling,
        vec![
            Tunnelling {
                zone: "exfil.test".into(),
                unique_names: TUNNEL_UNIQUE_NAMES as u64
            },
            Tunnelling {
                zone: "other.test".into(),
                unique_names: 1
            },
        ]
    );
}

#[test]
fn names_past_the_bound_are_only_counted() {
    let mut tally = Tally::new(Mode::Audit);
    for i in 0..MAX_NAMES + 10 {
        tally.query(&format!("n{i}.test"), Verdict::Allowed, &[], 3);
    }
    let record = tally.record(None, &AllowList::empty());
    assert_eq!(record.names.len(), MAX_NAMES);
    assert_eq!(record.names_dropped, 10);
}

#[test]
fn a_resumed_tally_never_goes_backwards() {
    let mut before = Tally::new(Mode::Enforce);
    before.query("public.test", Verdict::Allowed, &[PUBLIC], 6);
    before.rate_limited();
    let kept = before.record(
        Some(&Observed {
            reached: vec![(PUBLIC, 80, 5)],
            denied: vec![],
            dns_other: 2,
            dns_flood: 0,
        }),
        &AllowList::empty(),
    );
    // The agent restarted: the resolver knows nothing more, the kernel still counts.
    let mut after = Tally::resume(kept.clone());
    after.query("public.test", Verdict::Allowed, &[PUBLIC], 6);
    let record = after.record(None, &AllowList::empty());
    assert_eq!(record.names[0].queries, 2);
    assert_eq!(record.rate_limited, 1);
    assert_eq!(record.addresses, kept.addresses);
    assert_eq!(record.other_resolver, 2);
    let json = serde_json::to_value(&record).unwrap();
    assert_eq!(json["mode"], "enforce");
    assert_eq!(json["names"][0]["verdict"], "allowed");
    let back: Record = serde_json::from_value(json).unwrap();
    assert_eq!(back, record);
}

#[test]
fn modes_and_verdicts_read_and_say_their_names() {
    assert_eq!(Mode::parse("audit"), Ok(Mode::Audit));
    assert_eq!(Mode::parse("enforce"), Ok(Mode::Enforce));
    assert!(Mode::parse("Enforce").is_err());
    assert_eq!(Verdict::of_name(true, Mode::Audit), Verdict::Allowed);
    assert_eq!(Verdict::of_name(false, Mode::Audit), Verdict::WouldDeny);
    assert_eq!(Verdict::of_name(false, Mode::Enforce), Verdict::Denied);
    assert_eq!(Verdict::WouldDeny.as_str(), "would_deny");
}

#[test]
fn the_job_log_says_what_was_refused_or_that_nothing_was() {
    let mut tally = Tally::new(Mode::Enforce);
    tally.query("public.test", Verdict::Allowed, &[PUBLIC], 6);
    tally.query("denied.test", Verdict::Denied, &[], 6);
    let observed = Observed {
        reached: vec![(PUBLIC, 80, 1)],
        denied: vec![(FORBIDDEN, 80, 2)],
        dns_other: 1,
        dns_flood: 0,
    };
    let log = tally.record(Some(&observed), &AllowList::empty()).job_log();
    assert_eq!(
        log,
        "rm egress (enforce): 1 of 2 name(s) asked refused: denied.test (1x)\n\
         rm egress (enforce): 1 connection(s) refused: 203.0.113.101:80 (2x)\n\
         rm egress (enforce): 1 DNS packet(s) to a resolver other than the host's refused\n\
         rm egress (enforce): the runner's host lists everything with `rm-agent egress <job id>`; allowed names go in the policy's egress.allow\n"
    );
    let mut quiet = Tally::new(Mode::Audit);
    quiet.query("public.test", Verdict::Allowed, &[PUBLIC], 6);
    assert_eq!(
        quiet.record(None, &AllowList::empty()).job_log(),
        "rm egress (audit): nothing refused (1 name(s) asked, all allowed)\n"
    );
    let mut many = Tally::new(Mode::Audit);
    for i in 0..LOG_LISTED + 3 {
        many.query(&format!("n{i}.test"), Verdict::WouldDeny, &[], 3);
    }
    let log = many.record(None, &AllowList::empty()).job_log();
    assert!(
        log.contains("would have been refused (audit mode)"),
        "{log}"
    );
    assert!(log.contains(", and 3 more"), "{log}");
}

#[test]
fn a_channel_is_told_at_its_nearest_zone_whatever_labels_it_varies() {
    let mut tally = Tally::new(Mode::Enforce);
    for i in 0..20 {
        // One varying label under exfil.e2e.test, beside a name refused once above it.
        tally.query(&format!("x{i}.exfil.e2e.test"), Verdict::Denied, &[], 3);
        // Two varying labels under zone.test (dnscat2 writes data so).
        tally.query(&format!("a{i}.b{i}.zone.test"), Verdict::Denied, &[], 3);
    }
    tally.query("denied.e2e.test", Verdict::Denied, &[], 6);
    let zones: Vec<(String, u64)> = tally
        .record(None, &AllowList::empty())
        .tunnelling
        .into_iter()
        .map(|t| (t.zone, t.unique_names))
        .collect();
    assert_eq!(
        zones,
        vec![
            ("exfil.e2e.test".to_owned(), 20),
            ("zone.test".to_owned(), 20)
        ]
    );
}

#[test]
fn zones_counted_are_bounded() {
    let mut tally = Tally::new(Mode::Enforce);
    for i in 0..MAX_ZONES + 50 {
        tally.query(&format!("a.z{i}.test"), Verdict::Denied, &[], 1);
    }
    // Every name is still a name of the record; the zones past the bound are not counted.
    let record = tally.record(None, &AllowList::empty());
    assert_eq!(record.names.len(), MAX_ZONES + 50);
    assert!(record.tunnelling.is_empty());
}
