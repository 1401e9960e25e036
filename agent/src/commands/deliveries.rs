//! `rm-agent deliveries`: the journalled webhook deliveries, and `deliveries replay GUID` to run
//! a delivery's handler again (after an upgrade fixed what made it `rejected`). With
//! `journal.url` both work on the fleet's PostgreSQL journal.

use serde_json::json;

use crate::config::Config;
use crate::exit::Exit;
use crate::output::{or_dash, print_json, print_table, rfc3339};

pub fn list(config: &Config, json: bool, limit: usize) -> Result<(), Exit> {
    let deliveries = super::read_jobs(config, json, |reader| reader.deliveries(limit))?;
    if json {
        let list: Vec<_> = deliveries
            .iter()
            .map(|d| {
                json!({
                    "guid": d.guid,
                    "event": d.event,
                    "action": d.action,
                    "received_at": rfc3339(d.received_at_ms.get()),
                    "outcome": d.outcome.as_str(),
                    "reason": d.reason,
                    "source": d.source,
                    "replayed_at": d.replayed_at_ms.map(|t| rfc3339(t.get())),
                    "body_kept": d.body_kept,
                })
            })
            .collect();
        print_json(&serde_json::Value::Array(list));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = deliveries
        .iter()
        .map(|d| {
            vec![
                d.guid.clone(),
                d.event.clone(),
                or_dash(d.action.as_deref()),
                d.outcome.as_str().to_owned(),
                rfc3339(d.received_at_ms.get()),
                or_dash(d.reason.as_deref()),
            ]
        })
        .collect();
    print_table(
        &["GUID", "EVENT", "ACTION", "OUTCOME", "RECEIVED", "REASON"],
        &rows,
    );
    Ok(())
}

pub fn replay(config: &Config, guid: &str, json: bool) -> Result<(), Exit> {
    let now = rm_vocab::now();
    let store = super::store(config);
    let (outcome, reason) = store
        .replay(guid, now)
        .map_err(|e| super::journal_failed(&store, "replay in", e))?;
    if json {
        print_json(&json!({"guid": guid, "outcome": outcome.as_str(), "reason": reason}));
    } else {
        match reason {
            Some(reason) => crate::outln!("{guid}: {} ({reason})", outcome.as_str()),
            None => crate::outln!("{guid}: {}", outcome.as_str()),
        }
    }
    if outcome == rm_journal::Outcome::Rejected {
        return Err(Exit::runtime(anyhow::anyhow!(
            "delivery {guid} is still rejected; the handler cannot read it yet"
        )));
    }
    Ok(())
}
