//! `rm-agent egress JOB [--json]` and `rm-agent egress --policy P [--since 7d] [--json]`
//! (`policy.egress`, issue 41): what the runners that ran a job asked for and reached, each
//! name and address with its verdict and count; or, from every runner of a policy since a
//! time, a proposed `allow` list of what jobs really used (`rm_egress::allow::propose`),
//! leaving out what `host.egress_allow` already allows. Reads this host's journal only; works
//! with the agent stopped.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, SystemTime};

use rm_egress::allow::propose;
use rm_egress::record::Record;
use rm_vocab::{JobId, UnixMs};

use super::explain::{AttemptEgress, egress_of, ran_the_job};
use crate::config::Config;
use crate::exit::Exit;
use crate::output::print_json;

/// `--since`'s default: a week of jobs.
pub const DEFAULT_SINCE: Duration = Duration::from_secs(7 * 24 * 3600);

/// `rm-agent egress JOB`.
pub fn job(config: &Config, job_id: JobId, json: bool) -> Result<(), Exit> {
    let store = super::store(config);
    let row = if store.is_shared() {
        store
            .jobs()
            .map_err(Exit::runtime)?
            .job(job_id)
            .map_err(Exit::runtime)?
    } else {
        match super::open_local_reader(config)? {
            Some(reader) => reader.job(job_id).map_err(Exit::runtime)?,
            None => None,
        }
    };
    let ran = ran_the_job(config, job_id, row.as_ref()).map_err(Exit::runtime)?;
    let records = egress_of(config, &ran)?;
    if json {
        print_json(&serde_json::json!({ "job": job_id.get(), "attempts": records }));
    } else {
        crate::out!("{}", render(&records));
    }
    if records.is_empty() {
        return Err(Exit::runtime(anyhow::anyhow!(
            "no runner of this host with an egress record ran job {job_id} (its policy has no `[policy.egress]`, or no runner took it yet)"
        )));
    }
    Ok(())
}

/// The text report of [`job`]. Pure.
pub(crate) fn render(records: &[AttemptEgress]) -> String {
    let mut out = String::new();
    for a in records {
        let r = &a.egress;
        out.push_str(&format!(
            "runner {} (attempt {}), egress {}\n",
            a.runner_name,
            a.attempt_id,
            r.mode.as_str()
        ));
        out.push_str("  names:\n");
        for n in &r.names {
            let addresses: Vec<String> = n.addresses.iter().map(ToString::to_string).collect();
            let line = format!(
                "    {:<10} {:>6}  {}  {}",
                n.verdict.as_str(),
                n.queries,
                n.name,
                addresses.join(" ")
            );
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out.push_str("  connections:\n");
        for c in &r.addresses {
            out.push_str(&format!(
                "    {:<10} {:>6}  {}:{}  {}\n",
                c.verdict.as_str(),
                c.connections,
                c.address,
                c.port,
                c.name.as_deref().unwrap_or("(no name asked)")
            ));
        }
        out.push_str(&format!(
            "  other resolvers: {} packet(s)\n",
            r.other_resolver
        ));
        for t in &r.tunnelling {
            out.push_str(&format!(
                "  tunnelling: {} distinct refused names under {}\n",
                t.unique_names, t.zone
            ));
        }
        out.push_str(&format!(
            "  rate limited: {} query(ies) refused, {} packet(s) dropped; names past the bound: {}\n",
            r.rate_limited, r.rate_dropped, r.names_dropped
        ));
    }
    out
}

/// The proposed list from `records`, leaving out names `host` already allows and every name of a
/// zone a job tunnelled through (no wildcard covers one either). Pure.
pub(crate) fn proposal(records: &[Record], host: &rm_egress::allow::AllowList) -> Vec<String> {
    let mut names: BTreeMap<String, u64> = BTreeMap::new();
    let mut direct: Vec<Ipv4Addr> = Vec::new();
    let mut tunnelled: Vec<String> = Vec::new();
    for record in records {
        for t in &record.tunnelling {
            if !tunnelled.contains(&t.zone) {
                tunnelled.push(t.zone.clone());
            }
        }
        for n in &record.names {
            if !host.allows_name(&n.name) {
                *names.entry(n.name.clone()).or_default() += n.queries;
            }
        }
        // An address reached without asking a name: only a network entry lets it through.
        for a in record.addresses.iter().filter(|a| a.name.is_none()) {
            if !host.allows_address(a.address) && !direct.contains(&a.address) {
                direct.push(a.address);
            }
        }
    }
    let names: Vec<(String, u64)> = names.into_iter().collect();
    propose(&names, &direct, &tunnelled)
}

/// `rm-agent egress --policy P --since D`.
pub fn policy(config: &Config, policy: &str, since: Duration, json: bool) -> Result<(), Exit> {
    if !config.policies.iter().any(|p| p.name == policy) {
        return Err(Exit::usage(format!(
            "no policy `{policy}` in the configuration"
        )));
    }
    let from = UnixMs::from_system_time(
        SystemTime::now()
            .checked_sub(since)
            .unwrap_or(SystemTime::UNIX_EPOCH),
    );
    let rows = match super::open_local_reader(config)? {
        Some(reader) => reader
            .egress_of_policy(policy, from)
            .map_err(Exit::runtime)?,
        None => Vec::new(),
    };
    let records: Vec<Record> = rows
        .iter()
        .filter_map(|(id, json)| match serde_json::from_str(json) {
            Ok(record) => Some(record),
            Err(e) => {
                tracing::warn!(attempt = %id, error = %e, "an egress record does not read");
                None
            }
        })
        .collect();
    let allow = proposal(&records, &config.host.egress.allow);
    if json {
        print_json(&serde_json::json!({
            "policy": policy,
            "attempts": records.len(),
            "allow": allow,
        }));
    } else {
        crate::outln!(
            "# from {} runner(s) of policy {policy} since {}; host.egress_allow is added to it",
            records.len(),
            humantime::format_duration(since)
        );
        let quoted: Vec<String> = allow.iter().map(|e| format!("{e:?}")).collect();
        crate::outln!("allow = [{}]", quoted.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use rm_egress::allow::AllowList;
    use rm_egress::record::{AddressUse, Mode, NameUse, Verdict};

    use super::*;

    fn used(names: &[&str], direct: &[Ipv4Addr]) -> Record {
        Record {
            mode: Mode::Audit,
            names: names
                .iter()
                .map(|n| NameUse {
                    name: (*n).to_owned(),
                    verdict: Verdict::WouldDeny,
                    queries: 1,
                    addresses: vec![],
                })
                .collect(),
            addresses: direct
                .iter()
                .map(|a| AddressUse {
                    address: *a,
                    port: 443,
                    verdict: Verdict::WouldDeny,
                    connections: 1,
                    name: None,
                })
                .collect(),
            ..Record::default()
        }
    }

    #[test]
    fn the_proposal_is_what_jobs_used_less_what_the_host_allows() {
        let host = AllowList::parse(&["github.com".to_owned()]).unwrap();
        let records = [
            used(&["github.com", "registry.npmjs.org"], &[]),
            used(
                &["registry.npmjs.org", "pypi.org"],
                &[Ipv4Addr::new(203, 0, 113, 7)],
            ),
        ];
        assert_eq!(
            proposal(&records, &host),
            vec!["203.0.113.7/32", "pypi.org", "registry.npmjs.org"]
        );
        // The proposal, applied, allows every name the jobs asked.
        let applied = AllowList::parse(&proposal(&records, &host))
            .unwrap()
            .with(&host);
        for record in &records {
            for n in &record.names {
                assert!(applied.allows_name(&n.name), "{}", n.name);
            }
        }
        assert!(proposal(&[], &host).is_empty());
        // A zone a job tunnelled through is never proposed, nor widened over.
        let mut hostile = used(
            &[
                "a.test.example",
                "b.test.example",
                "c.test.example",
                "x1.exfil.test.example",
            ],
            &[],
        );
        hostile.tunnelling.push(rm_egress::record::Tunnelling {
            zone: "exfil.test.example".to_owned(),
            unique_names: 40,
        });
        assert_eq!(
            proposal(&[hostile], &host),
            vec!["a.test.example", "b.test.example", "c.test.example"]
        );
    }

    #[test]
    fn the_report_lists_each_name_and_connection_with_its_verdict() {
        let mut record = used(&["denied.test"], &[Ipv4Addr::new(203, 0, 113, 7)]);
        record.other_resolver = 2;
        let text = render(&[AttemptEgress {
            attempt_id: "a1".into(),
            runner_name: "rm-h-a1".into(),
            egress: record,
        }]);
        for line in [
            "runner rm-h-a1 (attempt a1), egress audit",
            "would_deny      1  denied.test",
            "would_deny      1  203.0.113.7:443  (no name asked)",
            "other resolvers: 2 packet(s)",
        ] {
            assert!(text.contains(line), "{line:?} not in\n{text}");
        }
    }
}
