//! What `explain JOB` says about a job's egress (`policy.egress`, issue 41): for each runner of
//! this host that ran the job, the names it asked for and what was decided, the addresses it
//! was refused (or, in audit mode, would have been), its queries to other resolvers, a
//! tunnelling burst and its rate limit. Pure: the command reads the records from the journal.

use rm_egress::record::{Mode, Record, Verdict};

use super::{Reason, reason};

/// The most names or addresses one reason lists before it says how many more there are.
pub(crate) const LISTED: usize = 10;

/// `first, second, ... and N more`.
fn listed(items: &[String]) -> String {
    let mut out: Vec<String> = items.iter().take(LISTED).cloned().collect();
    if items.len() > LISTED {
        out.push(format!("and {} more", items.len() - LISTED));
    }
    out.join(", ")
}

/// One `egress` reason per runner with a record, oldest first (`runs` as the command found
/// them: the runner's name and its record).
pub(crate) fn reasons(runs: &[(String, Record)]) -> Vec<Reason> {
    runs.iter()
        .map(|(runner, record)| reason("egress", message(runner, record)))
        .collect()
}

fn message(runner: &str, record: &Record) -> String {
    let word = match record.mode {
        Mode::Enforce => "refused",
        Mode::Audit => "would have been refused (audit mode: nothing was)",
    };
    let allowed = record
        .names
        .iter()
        .filter(|n| n.verdict == Verdict::Allowed)
        .count();
    let names = record.refused_names();
    let addresses = record.refused_connections(true);
    let mut parts = vec![format!(
        "Runner {runner} (egress {}) asked for {} name(s), {allowed} allowed.",
        record.mode.as_str(),
        record.names.len()
    )];
    if !names.is_empty() {
        parts.push(format!("Names that {word}: {}.", listed(&names)));
    }
    if !addresses.is_empty() {
        parts.push(format!("Connections that {word}: {}.", listed(&addresses)));
    }
    if record.other_resolver > 0 {
        parts.push(format!(
            "{} DNS packet(s) to a resolver other than the agent's {}.",
            record.other_resolver,
            match record.mode {
                Mode::Enforce => "were refused",
                Mode::Audit => "went through",
            }
        ));
    }
    for t in &record.tunnelling {
        parts.push(format!(
            "{} distinct refused name(s) under {}: a channel through DNS, or a misconfigured tool.",
            t.unique_names, t.zone
        ));
    }
    if record.rate_limited > 0 || record.rate_dropped > 0 {
        parts.push(format!(
            "{} query(ies) were refused and {} packet(s) dropped for their rate.",
            record.rate_limited, record.rate_dropped
        ));
    }
    if !names.is_empty() || !addresses.is_empty() {
        parts.push(
            "To allow what it needs, add names to policy.egress.allow; `rm-agent egress --policy P --since 7d` proposes a list from what jobs used.".to_owned(),
        );
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use rm_egress::record::{AddressUse, NameUse, Tunnelling};

    use super::*;

    fn name(n: &str, verdict: Verdict, queries: u64) -> NameUse {
        NameUse {
            name: n.into(),
            verdict,
            queries,
            addresses: vec![],
        }
    }

    #[test]
    fn an_enforced_runner_names_what_it_was_refused_and_how_to_allow_it() {
        let record = Record {
            mode: Mode::Enforce,
            names: vec![
                name("public.test", Verdict::Allowed, 3),
                name("denied.test", Verdict::Denied, 2),
            ],
            addresses: vec![AddressUse {
                address: Ipv4Addr::new(203, 0, 113, 9),
                port: 443,
                verdict: Verdict::Denied,
                connections: 1,
                name: None,
            }],
            other_resolver: 1,
            tunnelling: vec![Tunnelling {
                zone: "exfil.test".into(),
                unique_names: 50,
            }],
            rate_limited: 7,
            rate_dropped: 0,
            names_dropped: 0,
        };
        let said = reasons(&[("rm-h-a1".to_owned(), record)]);
        assert_eq!(said.len(), 1);
        assert_eq!(said[0].code, "egress");
        let m = &said[0].message;
        for part in [
            "Runner rm-h-a1 (egress enforce) asked for 2 name(s), 1 allowed.",
            "Names that refused: denied.test (2x).",
            "Connections that refused: 203.0.113.9:443 (1x).",
            "1 DNS packet(s) to a resolver other than the agent's were refused.",
            "50 distinct refused name(s) under exfil.test",
            "7 query(ies) were refused and 0 packet(s) dropped for their rate.",
            "rm-agent egress --policy P --since 7d",
        ] {
            assert!(m.contains(part), "{part:?} not in {m}");
        }
    }

    #[test]
    fn an_audited_runner_says_what_would_have_been_refused_and_a_quiet_one_little() {
        let audit = Record {
            mode: Mode::Audit,
            names: vec![name("denied.test", Verdict::WouldDeny, 1)],
            ..Record::default()
        };
        let m = &reasons(&[("r".to_owned(), audit)])[0].message;
        assert!(
            m.contains(
                "Names that would have been refused (audit mode: nothing was): denied.test (1x)."
            ),
            "{m}"
        );
        let quiet = Record {
            names: vec![name("public.test", Verdict::Allowed, 1)],
            ..Record::default()
        };
        let m = &reasons(&[("r".to_owned(), quiet)])[0].message;
        assert_eq!(
            m,
            "Runner r (egress enforce) asked for 1 name(s), 1 allowed."
        );
        assert!(reasons(&[]).is_empty());
    }

    #[test]
    fn long_lists_are_cut() {
        let names: Vec<String> = (0..LISTED + 2).map(|i| format!("n{i}")).collect();
        let text = listed(&names);
        assert!(text.ends_with(", and 2 more"), "{text}");
        assert!(!text.contains(&format!("n{}", LISTED)), "{text}");
    }
}
