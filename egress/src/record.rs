//! What one runner asked for and reached ([`Record`], kept per attempt in the journal and
//! shown by `explain` and `rm-agent egress`), and the bounded tally the resolver keeps while
//! the runner runs ([`Tally`]). Pure: the resolver feeds the tally, the kernel's counts come
//! from the runner's table (`rm_runner::network::egress::observe`), and [`Tally::record`]
//! joins them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use rm_runner::network::egress::Observed;
use serde::{Deserialize, Serialize};

use crate::allow::{AllowList, zones_of};

/// The most distinct names kept per runner: past it, a name's queries are still decided and
/// answered but only counted in [`Record::names_dropped`].
pub const MAX_NAMES: usize = 1024;

/// The most addresses kept per name.
pub const MAX_ADDRESSES_PER_NAME: usize = 16;

/// The most distinct refused names counted per zone (by a hash each): a tunnelling burst is
/// told at [`TUNNEL_UNIQUE_NAMES`], long before; a count past it stays there.
pub const MAX_UNIQUE_PER_ZONE: usize = 256;

/// The most zones a runner's refused names are counted under (every zone above each name):
/// past it, names of new zones are not counted.
pub const MAX_ZONES: usize = 256;

/// A zone with at least this many distinct refused names is said to be tunnelled through:
/// ordinary lookups of a refused zone repeat a few names, a channel through DNS makes a new
/// name per message.
pub const TUNNEL_UNIQUE_NAMES: usize = 16;

/// A refused name with a label at least this long is said to tunnel too: encoded data fills
/// labels up to DNS's 63, names people choose rarely pass 30.
pub const TUNNEL_LABEL: usize = 40;

/// `policy.egress.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Only allowed names resolve and only what they resolved to (and the allowed networks) is
    /// reached.
    #[default]
    Enforce,
    /// Nothing is refused; what would be is recorded.
    Audit,
}

impl Mode {
    /// `enforce` or `audit`.
    pub fn parse(text: &str) -> Result<Mode, String> {
        match text {
            "enforce" => Ok(Mode::Enforce),
            "audit" => Ok(Mode::Audit),
            other => Err(format!("`{other}` is not a mode: \"enforce\" or \"audit\"")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Audit => "audit",
        }
    }
}

/// What was decided for a name or an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Allowed,
    Denied,
    /// Audit mode: let through, would have been refused.
    WouldDeny,
}

impl Verdict {
    /// A name's verdict under `mode`.
    pub fn of_name(allowed: bool, mode: Mode) -> Verdict {
        match (allowed, mode) {
            (true, _) => Verdict::Allowed,
            (false, Mode::Enforce) => Verdict::Denied,
            (false, Mode::Audit) => Verdict::WouldDeny,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allowed => "allowed",
            Verdict::Denied => "denied",
            Verdict::WouldDeny => "would_deny",
        }
    }
}

/// One name a runner asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameUse {
    pub name: String,
    pub verdict: Verdict,
    pub queries: u64,
    /// The IPv4 addresses its answers gave (at most [`MAX_ADDRESSES_PER_NAME`]).
    pub addresses: Vec<Ipv4Addr>,
}

/// One address and port a runner opened a connection to (or tried).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressUse {
    pub address: Ipv4Addr,
    pub port: u16,
    pub verdict: Verdict,
    pub connections: u64,
    /// The name whose answer gave the address, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A zone refused names were asked under as a channel would.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tunnelling {
    pub zone: String,
    pub unique_names: u64,
}

/// What one runner asked for and reached: the journal keeps it per attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Record {
    pub mode: Mode,
    pub names: Vec<NameUse>,
    pub addresses: Vec<AddressUse>,
    /// DNS packets sent to anything but the agent's resolver (refused in enforce mode).
    pub other_resolver: u64,
    pub tunnelling: Vec<Tunnelling>,
    /// Queries answered REFUSED because the runner asked faster than its bound.
    pub rate_limited: u64,
    /// Packets to the resolver its own table dropped, past the packet rate a runner may send
    /// it (a flood stopped before the agent).
    #[serde(default)]
    pub rate_dropped: u64,
    /// Queries of names past [`MAX_NAMES`].
    pub names_dropped: u64,
}

/// The most names or connections one line of [`Record::job_log`] names.
pub const LOG_LISTED: usize = 10;

impl Record {
    /// The verdict of what this record's mode refuses (or, in audit mode, would).
    pub fn refusing(&self) -> Verdict {
        match self.mode {
            Mode::Enforce => Verdict::Denied,
            Mode::Audit => Verdict::WouldDeny,
        }
    }

    /// Each name refused (or that would be), `name (Nx)`.
    pub fn refused_names(&self) -> Vec<String> {
        let refused = self.refusing();
        self.names
            .iter()
            .filter(|n| n.verdict == refused)
            .map(|n| format!("{} ({}x)", n.name, n.queries))
            .collect()
    }

    /// Each connection refused (or that would be), `address:port (Nx)`, or with the name that
    /// gave the address, `address:port (name, Nx)`, when `named`.
    pub fn refused_connections(&self, named: bool) -> Vec<String> {
        let refused = self.refusing();
        self.addresses
            .iter()
            .filter(|a| a.verdict == refused)
            .map(|a| match (&a.name, named) {
                (Some(name), true) => {
                    format!("{}:{} ({name}, {}x)", a.address, a.port, a.connections)
                }
                _ => format!("{}:{} ({}x)", a.address, a.port, a.connections),
            })
            .collect()
    }

    /// The lines the job's own log ends with (the agent's job-completed hook prints them), so
    /// a workflow's author sees why a connection failed. Pure.
    pub fn job_log(&self) -> String {
        let word = match self.mode {
            Mode::Enforce => "refused",
            Mode::Audit => "would have been refused (audit mode)",
        };
        let mode = self.mode.as_str();
        let listed = |items: Vec<String>| {
            let more = items.len().saturating_sub(LOG_LISTED);
            let mut out: Vec<String> = items.into_iter().take(LOG_LISTED).collect();
            if more > 0 {
                out.push(format!("and {more} more"));
            }
            out.join(", ")
        };
        let names = self.refused_names();
        let connections = self.refused_connections(false);
        let mut lines = Vec::new();
        if !names.is_empty() {
            lines.push(format!(
                "rm egress ({mode}): {} of {} name(s) asked {word}: {}",
                names.len(),
                self.names.len(),
                listed(names)
            ));
        }
        if !connections.is_empty() {
            lines.push(format!(
                "rm egress ({mode}): {} connection(s) {word}: {}",
                connections.len(),
                listed(connections)
            ));
        }
        if self.other_resolver > 0 {
            lines.push(format!(
                "rm egress ({mode}): {} DNS packet(s) to a resolver other than the host's {}",
                self.other_resolver,
                if self.mode == Mode::Enforce {
                    "refused"
                } else {
                    "let through"
                }
            ));
        }
        for t in &self.tunnelling {
            lines.push(format!(
                "rm egress ({mode}): {} distinct refused name(s) under {}: a channel through DNS, or a misconfigured tool",
                t.unique_names, t.zone
            ));
        }
        if self.rate_limited > 0 || self.rate_dropped > 0 {
            lines.push(format!(
                "rm egress ({mode}): {} DNS query(ies) refused and {} packet(s) dropped for their rate",
                self.rate_limited, self.rate_dropped
            ));
        }
        if lines.is_empty() {
            lines.push(format!(
                "rm egress ({mode}): nothing refused ({} name(s) asked, all allowed)",
                self.names.len()
            ));
        } else {
            lines.push(format!(
                "rm egress ({mode}): the runner's host lists everything with `rm-agent egress <job id>`; allowed names go in the policy's egress.allow"
            ));
        }
        let mut text = lines.join("\n");
        text.push('\n');
        text
    }
}

/// The resolver's running tally of one runner.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    mode: Mode,
    names: BTreeMap<String, NameUse>,
    /// Per zone above a refused name ([`zones_of`]): the distinct refused names under it (their
    /// hashes), and whether one right under it had a long label.
    refused_zones: BTreeMap<String, (BTreeSet<u64>, bool)>,
    rate_limited: u64,
    names_dropped: u64,
    /// Kernel counts seen before the last restart of the resolver (kept by the journal), so
    /// that a record never goes backwards.
    earlier: Option<Record>,
}

impl Tally {
    pub fn new(mode: Mode) -> Tally {
        Tally {
            mode,
            ..Tally::default()
        }
    }

    /// A tally that goes on from a record the journal kept (the agent restarted while the
    /// runner ran).
    pub fn resume(record: Record) -> Tally {
        let mut tally = Tally::new(record.mode);
        for name in &record.names {
            tally.names.insert(name.name.clone(), name.clone());
        }
        tally.rate_limited = record.rate_limited;
        tally.names_dropped = record.names_dropped;
        tally.earlier = Some(record);
        tally
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// One query of `name` (lowercase, as `dns::parse_query` gives it), decided `verdict`,
    /// whose answer gave `addresses` (none when refused or empty). `longest_label` is the
    /// query's longest label.
    pub fn query(
        &mut self,
        name: &str,
        verdict: Verdict,
        addresses: &[Ipv4Addr],
        longest_label: usize,
    ) {
        if verdict != Verdict::Allowed {
            let hash = {
                use std::hash::{Hash as _, Hasher as _};
                let mut hasher = std::hash::DefaultHasher::new();
                name.hash(&mut hasher);
                hasher.finish()
            };
            for (depth, zone) in zones_of(name).enumerate() {
                if !self.refused_zones.contains_key(zone) && self.refused_zones.len() >= MAX_ZONES {
                    continue;
                }
                let (unique, long) = self.refused_zones.entry(zone.to_owned()).or_default();
                if unique.len() < MAX_UNIQUE_PER_ZONE {
                    unique.insert(hash);
                }
                *long |= depth == 0 && longest_label >= TUNNEL_LABEL;
            }
        }
        let full = self.names.len() >= MAX_NAMES;
        match self.names.get_mut(name) {
            Some(entry) => {
                entry.queries += 1;
                for addr in addresses {
                    if entry.addresses.len() < MAX_ADDRESSES_PER_NAME
                        && !entry.addresses.contains(addr)
                    {
                        entry.addresses.push(*addr);
                    }
                }
            }
            None if full => self.names_dropped += 1,
            None => {
                let mut kept: Vec<Ipv4Addr> = Vec::new();
                for addr in addresses {
                    if kept.len() < MAX_ADDRESSES_PER_NAME && !kept.contains(addr) {
                        kept.push(*addr);
                    }
                }
                self.names.insert(
                    name.to_owned(),
                    NameUse {
                        name: name.to_owned(),
                        verdict,
                        queries: 1,
                        addresses: kept,
                    },
                );
            }
        }
    }

    /// A query refused for its rate.
    pub fn rate_limited(&mut self) {
        self.rate_limited += 1;
    }

    /// The record: the tally joined with what the kernel counted (`observed`, `None` when the
    /// runner's table could not be read, e.g. it is gone), each address told allowed, denied or
    /// would-deny against `allow`'s networks and the names that gave it.
    pub fn record(&self, observed: Option<&Observed>, allow: &AllowList) -> Record {
        let mut by_address: BTreeMap<Ipv4Addr, &NameUse> = BTreeMap::new();
        for name in self.names.values() {
            for addr in &name.addresses {
                // An allowed name's answer wins over a refused one's for the same address.
                let keep = by_address
                    .get(addr)
                    .is_none_or(|known| known.verdict != Verdict::Allowed);
                if keep {
                    by_address.insert(*addr, name);
                }
            }
        }
        let mut addresses: BTreeMap<(Ipv4Addr, u16, Verdict), AddressUse> = BTreeMap::new();
        let earlier = self.earlier.as_ref();
        for old in earlier.into_iter().flat_map(|r| &r.addresses) {
            addresses.insert((old.address, old.port, old.verdict), old.clone());
        }
        let mut other_resolver = earlier.map_or(0, |r| r.other_resolver);
        let mut rate_dropped = earlier.map_or(0, |r| r.rate_dropped);
        if let Some(observed) = observed {
            let name_of = |addr: &Ipv4Addr| by_address.get(addr).map(|n| n.name.clone());
            let allowed_by_name = |addr: &Ipv4Addr| {
                by_address
                    .get(addr)
                    .is_some_and(|n| n.verdict == Verdict::Allowed)
            };
            for (addr, port, count) in &observed.reached {
                let verdict = if allowed_by_name(addr) || allow.allows_address(*addr) {
                    Verdict::Allowed
                } else if self.mode == Mode::Audit {
                    Verdict::WouldDeny
                } else {
                    // Let through in enforce mode: opened once for an allowed name whose
                    // answer the tally no longer holds (past its bounds).
                    Verdict::Allowed
                };
                merge(&mut addresses, *addr, *port, verdict, *count, name_of(addr));
            }
            for (addr, port, count) in &observed.denied {
                merge(
                    &mut addresses,
                    *addr,
                    *port,
                    Verdict::Denied,
                    *count,
                    name_of(addr),
                );
            }
            other_resolver = other_resolver.max(observed.dns_other);
            rate_dropped = rate_dropped.max(observed.dns_flood);
        }
        let flagged: Vec<&String> = self
            .refused_zones
            .iter()
            .filter(|(_, (unique, long))| unique.len() >= TUNNEL_UNIQUE_NAMES || *long)
            .map(|(zone, _)| zone)
            .collect();
        // The nearest zone of a channel: a flagged zone none of whose zones below is flagged.
        let nearest = |zone: &&String| {
            !flagged
                .iter()
                .any(|other| other.len() > zone.len() && other.ends_with(&format!(".{zone}")))
        };
        let tunnelling = self
            .refused_zones
            .iter()
            .filter(|(zone, _)| flagged.contains(zone) && nearest(zone))
            .map(|(zone, (unique, _))| Tunnelling {
                zone: zone.clone(),
                unique_names: unique.len() as u64,
            })
            .chain(
                earlier
                    .into_iter()
                    .flat_map(|r| &r.tunnelling)
                    .filter(|t| !self.refused_zones.contains_key(&t.zone))
                    .cloned(),
            )
            .collect();
        Record {
            mode: self.mode,
            names: self.names.values().cloned().collect(),
            addresses: addresses.into_values().collect(),
            other_resolver,
            tunnelling,
            rate_limited: self.rate_limited,
            rate_dropped,
            names_dropped: self.names_dropped,
        }
    }
}

/// Kernel counts only grow while the runner's table lives: the larger of what was kept and what
/// is read now.
fn merge(
    into: &mut BTreeMap<(Ipv4Addr, u16, Verdict), AddressUse>,
    address: Ipv4Addr,
    port: u16,
    verdict: Verdict,
    connections: u64,
    name: Option<String>,
) {
    let entry = into.entry((address, port, verdict)).or_insert(AddressUse {
        address,
        port,
        verdict,
        connections: 0,
        name: None,
    });
    entry.connections = entry.connections.max(connections);
    if name.is_some() {
        entry.name = name;
    }
}

#[cfg(test)]
mod tests;
