use super::*;

fn list(entries: &[&str]) -> AllowList {
    let entries: Vec<String> = entries.iter().map(|e| e.to_string()).collect();
    AllowList::parse(&entries).unwrap()
}

#[test]
fn entries_are_read_as_operators_write_them() {
    let long_label = "a".repeat(63);
    let too_long_label = "a".repeat(64);
    // 4 labels of 63 and the dots: 255 characters, over the 253 a name may have.
    let too_long_name = [long_label.as_str(); 4].join(".");
    let longest_name = format!("{}.{}", [long_label.as_str(); 3].join("."), "a".repeat(61));
    assert_eq!(longest_name.len(), MAX_NAME);
    let longest_wildcard = format!("*.{}", &longest_name[2..]);
    let too_long_wildcard = format!("*.{longest_name}");
    let cases: Vec<(&str, Option<&str>)> = vec![
        ("github.com", Some("github.com")),
        ("GitHub.COM", Some("github.com")),
        ("github.com.", Some("github.com")),
        ("  github.com ", Some("github.com")),
        ("github.com..", None),
        ("a..b", None),
        (".github.com", None),
        ("", None),
        (".", None),
        ("localhost", Some("localhost")),
        (
            "_acme-challenge.example.com",
            Some("_acme-challenge.example.com"),
        ),
        ("1password.com", Some("1password.com")),
        ("-bad.example", None),
        ("bad-.example", None),
        ("in-side.example", Some("in-side.example")),
        ("exa mple.com", None),
        ("exa/mple.com", None),
        ("bücher.example", None),
        ("xn--bcher-kva.example", Some("xn--bcher-kva.example")),
        (long_label.as_str(), Some(long_label.as_str())),
        (too_long_label.as_str(), None),
        (longest_name.as_str(), Some(longest_name.as_str())),
        (too_long_name.as_str(), None),
        ("*.githubusercontent.com", Some("*.githubusercontent.com")),
        ("*.GitHubUserContent.com.", Some("*.githubusercontent.com")),
        // Wide, but what it says: documented, accepted.
        ("*.com", Some("*.com")),
        (longest_wildcard.as_str(), Some(longest_wildcard.as_str())),
        (too_long_wildcard.as_str(), None),
        ("*", None),
        ("*.", None),
        ("*github.com", None),
        ("**.github.com", None),
        ("*.*.github.com", None),
        ("api.*.github.com", None),
        ("github.*", None),
        ("*..github.com", None),
        ("10.20.0.0/16", Some("10.20.0.0/16")),
        ("203.0.113.7", Some("203.0.113.7/32")),
        ("10.20.1.5/16", Some("10.20.0.0/16")),
        ("0.0.0.0/0", Some("0.0.0.0/0")),
        ("10.20.0.0/33", None),
        ("10.0.0", None),
        ("300.1.1.1", None),
        ("2001:db8::/32", None),
        ("::1", None),
    ];
    for (written, want) in cases {
        let got = written.parse::<Entry>().map(|e| e.to_string());
        assert_eq!(
            got.as_ref().ok().map(String::as_str),
            want,
            "{written}: {got:?}"
        );
    }
}

#[test]
fn errors_name_the_entry_and_how_to_write_it() {
    let cases: &[(&str, &[&str])] = &[
        (
            "*github.com",
            &[
                "`*github.com`",
                "whole first label",
                "*.githubusercontent.com",
            ],
        ),
        ("a..b", &["`a..b`", "empty label"]),
        ("2001:db8::/32", &["`2001:db8::/32`", "IPv6", "no IPv6"]),
        ("10.0.0", &["`10.0.0`", "10.20.0.0/16"]),
        ("-x.example", &["`-x.example`", "`-x`"]),
        ("a b.example", &["`a b.example`", "` `", "letters, digits"]),
        ("bücher.example", &["punycode"]),
        ("*", &["every name"]),
        ("", &["empty entry", "github.com"]),
    ];
    for (written, parts) in cases {
        let err = written.parse::<Entry>().unwrap_err();
        for part in *parts {
            assert!(err.contains(part), "{written}: {err:?} lacks {part:?}");
        }
    }
    let entries = vec![
        "github.com".to_string(),
        "a..b".to_string(),
        "*x".to_string(),
    ];
    let err = AllowList::parse(&entries).unwrap_err();
    assert!(err.contains("`a..b`"), "the first bad entry: {err}");
}

#[test]
fn names_are_allowed_exactly_or_strictly_under_a_wildcard() {
    let allow = list(&[
        "github.com",
        "*.githubusercontent.com",
        "*.com.",
        "x",
        "*.x",
    ]);
    let cases: &[(&str, bool)] = &[
        ("github.com", true),
        ("GITHUB.com.", true),
        ("api.github.com", true), // under *.com only
        ("github.com.evil.test", false),
        ("evilgithub.com", true),        // under *.com
        ("githubusercontent.com", true), // under *.com, not under its own wildcard
        ("raw.githubusercontent.com", true),
        ("a.b.c.githubusercontent.com", true),
        ("x", true),
        ("a.x", true),
        ("a.b.x", true),
        ("evilx", false),
        ("x.evil", false),
        ("", false),
        (".", false),
        ("com", false),
    ];
    for (name, want) in cases {
        assert_eq!(allow.allows_name(name), *want, "{name}");
    }
    let narrow = list(&["*.githubusercontent.com"]);
    for (name, want) in [
        ("githubusercontent.com", false),
        ("evilgithubusercontent.com", false),
        ("objects.githubusercontent.com", true),
        ("objects.githubusercontent.com.", true),
        ("objects.githubusercontent.com.evil.test", false),
        ("objects.githubusercontent.com..", false),
    ] {
        assert_eq!(narrow.allows_name(name), want, "{name}");
    }
}

#[test]
fn addresses_are_allowed_by_networks_only() {
    let allow = list(&["10.20.0.0/16", "203.0.113.7", "github.com", "0.0.0.0/32"]);
    let cases: &[(Ipv4Addr, bool)] = &[
        (Ipv4Addr::new(10, 20, 0, 1), true),
        (Ipv4Addr::new(10, 20, 255, 255), true),
        (Ipv4Addr::new(10, 21, 0, 0), false),
        (Ipv4Addr::new(203, 0, 113, 7), true),
        (Ipv4Addr::new(203, 0, 113, 8), false),
        (Ipv4Addr::new(140, 82, 112, 3), false),
    ];
    for (addr, want) in cases {
        assert_eq!(allow.allows_address(*addr), *want, "{addr}");
    }
    assert!(list(&["0.0.0.0/0"]).allows_address(Ipv4Addr::new(8, 8, 8, 8)));
    assert!(!AllowList::empty().allows_address(Ipv4Addr::new(8, 8, 8, 8)));
    let nets: Vec<String> = allow.networks().iter().map(|c| c.to_string()).collect();
    assert_eq!(nets, ["10.20.0.0/16", "203.0.113.7/32", "0.0.0.0/32"]);
}

#[test]
fn lists_join_and_write_back_normalised() {
    let policy = list(&["Public.rm-e2e.test.", "10.20.1.0/16", "*.PKG.rm-e2e.test"]);
    let host = list(&["github.com", "10.20.0.0/16", "public.rm-e2e.test"]);
    let both = policy.with(&host);
    assert_eq!(
        both.entries(),
        [
            "*.pkg.rm-e2e.test",
            "10.20.0.0/16",
            "github.com",
            "public.rm-e2e.test"
        ]
    );
    assert_eq!(both.networks().len(), 1, "one network, each once");
    assert!(both.allows_name("github.com") && both.allows_name("a.pkg.rm-e2e.test"));
    assert!(
        !policy.allows_name("github.com"),
        "with() leaves its operands alone"
    );
    assert_eq!(
        AllowList::parse(&both.entries()).unwrap(),
        both,
        "entries parse back"
    );
    assert!(AllowList::empty().is_empty());
    assert!(AllowList::parse(&[]).unwrap().is_empty());
    assert!(!list(&["10.0.0.0/8"]).is_empty());
    assert!(!list(&["*.x.test"]).is_empty());
    assert_eq!(AllowList::empty().with(&both), both);
}

#[test]
fn the_defaults_parse_and_cover_what_a_runner_cannot_do_without() {
    let defaults: Vec<String> = GITHUB_DEFAULTS.iter().map(|e| e.to_string()).collect();
    let defaults = AllowList::parse(&defaults).unwrap();
    assert_eq!(uncovered(&defaults, GITHUB_ESSENTIAL), Vec::<&str>::new());
    for entry in GITHUB_ESSENTIAL {
        entry.parse::<Entry>().unwrap();
    }
    assert_eq!(
        uncovered(&AllowList::empty(), GITHUB_ESSENTIAL),
        GITHUB_ESSENTIAL
    );
}

#[test]
fn uncovered_says_what_a_list_leaves_out() {
    let allow = list(&[
        "github.com",
        "*.actions.githubusercontent.com",
        "10.0.0.0/8",
    ]);
    let needed = [
        "github.com",
        "api.github.com",
        "*.actions.githubusercontent.com",
        "*.x.actions.githubusercontent.com",
        "results-receiver.actions.githubusercontent.com",
        "*.githubusercontent.com",
        "10.1.0.0/16",
        "10.1.2.3",
        "11.0.0.0/8",
        "0.0.0.0/0",
        "*bad",
    ];
    assert_eq!(
        uncovered(&allow, &needed),
        [
            "api.github.com",
            "*.githubusercontent.com",
            "11.0.0.0/8",
            "0.0.0.0/0",
            "*bad"
        ]
    );
    // A name never covers a wildcard, even its own apex.
    let names_only = list(&[
        "actions.githubusercontent.com",
        "a.actions.githubusercontent.com",
    ]);
    assert_eq!(
        uncovered(&names_only, &["*.actions.githubusercontent.com"]),
        ["*.actions.githubusercontent.com"]
    );
}

fn asked(names: &[&str]) -> Vec<(String, u64)> {
    names.iter().map(|n| (n.to_string(), 1)).collect()
}

#[test]
fn proposals_list_what_jobs_used_with_families_as_wildcards() {
    let none: &[Ipv4Addr] = &[];
    let cases: &[(&[&str], &[&str])] = &[
        (&[], &[]),
        (
            &["github.com", "GitHub.com.", "github.com"],
            &["github.com"],
        ),
        // Two siblings stay names; three become the parent's wildcard.
        (&["a.pkg.test", "b.pkg.test"], &["a.pkg.test", "b.pkg.test"]),
        (
            &[
                "a.pkg.test",
                "b.pkg.test",
                "c.pkg.test",
                "pkg.test",
                "d.e.pkg.test",
            ],
            &["*.pkg.test", "pkg.test"],
        ),
        // The same name thrice is one name.
        (
            &["a.pkg.test", "A.pkg.test", "a.pkg.test."],
            &["a.pkg.test"],
        ),
        // A parent of one label is never widened.
        (&["a.com", "b.com", "c.com"], &["a.com", "b.com", "c.com"]),
        // Siblings counted directly under the parent only.
        (
            &["a.x.pkg.test", "b.y.pkg.test", "c.z.pkg.test"],
            &["a.x.pkg.test", "b.y.pkg.test", "c.z.pkg.test"],
        ),
        // A narrower family under a wider wildcard is dropped.
        (
            &[
                "a.pkg.test",
                "b.pkg.test",
                "c.pkg.test",
                "1.a.pkg.test",
                "2.a.pkg.test",
                "3.a.pkg.test",
            ],
            &["*.pkg.test"],
        ),
        // Reverse lookups and names that are not entries are left out.
        (
            &[
                "7.113.0.203.in-addr.arpa",
                "1.113.0.203.in-addr.arpa",
                "2.113.0.203.in-addr.arpa",
                "in-addr.arpa",
                "b.a.ip6.arpa",
                "bad..name",
                "evil\u{0}.test",
                "10.0.0.1",
                "*.wild.test",
                "ok.test",
            ],
            &["ok.test"],
        ),
    ];
    for (names, want) in cases {
        assert_eq!(propose(&asked(names), none, &[]), *want, "{names:?}");
    }
    // A name's count does not weigh in: asked once, it is needed.
    let counted = vec![
        ("once.test".to_string(), 1),
        ("often.test".to_string(), 1000),
    ];
    assert_eq!(propose(&counted, none, &[]), ["often.test", "once.test"]);
    let direct = [
        Ipv4Addr::new(203, 0, 113, 12),
        Ipv4Addr::new(10, 0, 0, 1),
        Ipv4Addr::new(203, 0, 113, 12),
    ];
    let proposed = propose(&asked(&["public.test"]), &direct, &[]);
    assert_eq!(proposed, ["10.0.0.1/32", "203.0.113.12/32", "public.test"]);
    AllowList::parse(&proposed).unwrap();
}

#[test]
fn a_name_counts_for_every_zone_above_it() {
    let cases: &[(&str, &[&str])] = &[
        ("a.b.exfil.test", &["b.exfil.test", "exfil.test"]),
        ("x.exfil.test.", &["exfil.test"]),
        ("exfil.test", &[]),
        ("test", &[]),
        (".", &[]),
        ("", &[]),
        ("x.co.uk", &["co.uk"]),
    ];
    for (name, want) in cases {
        assert_eq!(zones_of(name).collect::<Vec<_>>(), *want, "{name}");
    }
}

#[test]
fn a_proposal_never_allows_a_zone_jobs_tunnelled_through() {
    let used = asked(&[
        "public.e2e.test",
        "denied.e2e.test",
        "direct.e2e.test",
        "x1.exfil.e2e.test",
        "x2.exfil.e2e.test",
        "x3.exfil.e2e.test",
    ]);
    // Without the tunnel known: one wildcard over everything, the channel included.
    assert_eq!(propose(&used, &[], &[]), ["*.e2e.test"]);
    let tunnelled = ["exfil.e2e.test".to_owned()];
    let proposed = propose(&used, &[], &tunnelled);
    assert_eq!(
        proposed,
        ["denied.e2e.test", "direct.e2e.test", "public.e2e.test"]
    );
    assert!(
        !list(&proposed.iter().map(String::as_str).collect::<Vec<_>>())
            .allows_name("x9.exfil.e2e.test")
    );
}

#[test]
fn a_name_is_not_allowed_by_its_lookalikes() {
    let allow = list(&["github.com", "*.githubusercontent.com"]);
    for name in [
        "api.github.com",
        "github.com.evil.test",
        "evilgithub.com",
        "github.co",
        "github.comm",
        "githubusercontent.com",
        "evilgithubusercontent.com",
        "githubusercontent.com.evil.test",
        "xgithubusercontent.com",
    ] {
        assert!(!allow.allows_name(name), "{name}");
    }
}
