//! The allow list of `policy.egress.allow` and `host.egress_allow`: its grammar (exact names,
//! `*.` wildcards, IPv4 networks), the decisions read from it (may this name be answered, is
//! this address in an allowed network, which of GitHub's endpoints does it leave out) and the
//! list proposed from what jobs really used (`rm-agent egress --policy P --since 7d`).
//!
//! Everything here is pure: the resolver asks [`AllowList::allows_name`] for each query and
//! the runner's table is loaded with [`AllowList::networks`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::str::FromStr;

use rm_runner::network::Cidr;

/// The longest name, in characters of its text form without the trailing dot (RFC 1035 2.3.4:
/// 255 bytes on the wire are 253 characters of text).
pub const MAX_NAME: usize = 253;

/// The longest label (RFC 1035 2.3.4).
pub const MAX_LABEL: usize = 63;

/// How many distinct names directly under one parent make [`propose`] write `*.parent` instead
/// of each name: fewer are listed one by one (a short list an operator reads), this many are
/// taken as a family of hosts (CDN shards, mirrors) that will grow.
pub const WILDCARD_AT: usize = 3;

/// GitHub's published endpoints a runner needs, in the wildcard form of GitHub's docs
/// ("Communicating with self-hosted runners" in "About self-hosted runners", and the same list
/// in `https://api.github.com/meta`'s `domains.actions`): `host.egress_allow`'s default.
pub const GITHUB_DEFAULTS: &[&str] = &[
    // The site: the runner's registration, `actions/checkout` over https, and the job's links.
    "github.com",
    // The API (api.github.com), codeload.github.com (action and repository tarballs),
    // pkg.github.com and the runner's own services (pipelines, broker, run-actions-*).
    "*.github.com",
    // Actions' services (*.actions.githubusercontent.com: job messages, results-receiver),
    // raw and release downloads (objects.githubusercontent.com, release-assets...), the
    // runner's updates and GitHub Packages' registries (*.pkg.githubusercontent.com).
    "*.githubusercontent.com",
    // The container registry (GitHub Packages' `ghcr.io`): service containers and actions
    // shipped as images.
    "ghcr.io",
    // Azure blob storage: the cache (`actions/cache`), artifacts and job logs are uploaded
    // to and downloaded from accounts GitHub names in its answers (`productionresultssa*`,
    // `actions-results-receiver-*`), so no narrower name holds for every repository.
    "*.blob.core.windows.net",
];

/// The endpoints without which a runner cannot take a job at all (it registers, asks for a job,
/// downloads the actions and reports its results): checked against each egress policy's list
/// with [`uncovered`] at start, which warns for any left out.
pub const GITHUB_ESSENTIAL: &[&str] = &[
    "github.com",
    "api.github.com",
    "*.actions.githubusercontent.com",
    "codeload.github.com",
    "results-receiver.actions.githubusercontent.com",
];

/// One written entry of an allow list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// An exact name (`github.com`), lowercase, without a trailing dot.
    Name(String),
    /// `*.suffix`: every name strictly under `suffix`, at any depth, not `suffix` itself. Holds
    /// the suffix (`githubusercontent.com` for `*.githubusercontent.com`).
    Wildcard(String),
    /// An IPv4 network (a bare address is its /32), its host bits cleared.
    Network(Cidr),
}

/// One written entry: `github.com` (exact name), `*.githubusercontent.com` (every name strictly
/// under it, at any depth; not the apex), `10.20.0.0/16` or `203.0.113.7` (a network; a bare
/// address is /32). Names: case-insensitive (stored lowercase), one trailing dot allowed and
/// dropped, labels 1..=63 of [a-z0-9-_] not starting/ending with '-', total <= 253; `*` only as
/// the whole first label. A wildcard over a top-level domain (`*.com`) is accepted: it is what
/// it says (every `.com` name), and an operator who writes it means it. IPv6 networks are
/// refused (runners have no IPv6). Errors name the entry, what is wrong and how to write it.
impl FromStr for Entry {
    type Err = String;

    fn from_str(written: &str) -> Result<Entry, String> {
        let text = written.trim();
        if text.is_empty() {
            return Err("an empty entry: write a name (\"github.com\"), a wildcard \
                        (\"*.githubusercontent.com\") or a network (\"10.20.0.0/16\")"
                .to_string());
        }
        if looks_like_address(text) {
            return network(written, text).map(Entry::Network);
        }
        if text.contains('*') {
            return match text.strip_prefix("*.") {
                Some(suffix) if !suffix.contains('*') => {
                    let suffix = name(written, suffix, 2)?;
                    Ok(Entry::Wildcard(suffix))
                }
                _ if text == "*" => Err(format!(
                    "`{written}`: a lone `*` would allow every name; leave `policy.egress` out \
                     (or use mode = \"audit\") rather than allow everything"
                )),
                _ => Err(format!(
                    "`{written}`: `*` may only be the whole first label, as in \
                     \"*.githubusercontent.com\" (every name under githubusercontent.com)"
                )),
            };
        }
        name(written, text, 0).map(Entry::Name)
    }
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Entry::Name(name) => f.write_str(name),
            Entry::Wildcard(suffix) => write!(f, "*.{suffix}"),
            Entry::Network(cidr) => write!(f, "{cidr}"),
        }
    }
}

/// Whether an entry is meant as an address or network: only digits, dots and a `/prefix`, or
/// any `:` (IPv6). A name's last label is never all digits (no top-level domain is), so
/// `10.0.0` is a mistyped address, not a name.
fn looks_like_address(text: &str) -> bool {
    text.contains(':')
        || text.contains('/')
        || text
            .trim_end_matches('.')
            .rsplit('.')
            .next()
            .is_some_and(|last| !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()))
}

/// An IPv4 network as written (`10.20.0.0/16`, `203.0.113.7`), host bits cleared (nftables
/// sets hold networks, and `10.20.1.0/16` can only mean `10.20.0.0/16`).
fn network(written: &str, text: &str) -> Result<Cidr, String> {
    let cidr: Cidr = text.parse().map_err(|_| {
        format!(
            "`{written}` is neither a name nor an IPv4 address or network: write \
             \"203.0.113.7\" or \"10.20.0.0/16\""
        )
    })?;
    match cidr.addr {
        IpAddr::V4(addr) => Ok(Cidr {
            addr: IpAddr::V4(Ipv4Addr::from(u32::from(addr) & mask(cidr.prefix))),
            prefix: cidr.prefix,
        }),
        IpAddr::V6(_) => Err(format!(
            "`{written}`: IPv6 networks cannot be allowed: runners have no IPv6 (only IPv4 \
             leaves their namespace); write the IPv4 network, or the name"
        )),
    }
}

/// The netmask of an IPv4 prefix length (0..=32).
fn mask(prefix: u8) -> u32 {
    match prefix {
        0 => 0,
        p => u32::MAX << (32 - u32::from(p.min(32))),
    }
}

/// A name checked and normalised: lowercase, one trailing dot dropped. `reserved` is how many
/// characters of the written form go before it (`*.` of a wildcard), counted in the length.
fn name(written: &str, text: &str, reserved: usize) -> Result<String, String> {
    if !text.is_ascii() {
        return Err(format!(
            "`{written}`: a name is ASCII; write an internationalised name in its punycode \
             form (\"xn--...\")"
        ));
    }
    let lower = text.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    if name.is_empty() {
        return Err(format!(
            "`{written}`: no name; write one like \"github.com\" or \"*.github.com\""
        ));
    }
    if name.len() + reserved > MAX_NAME {
        return Err(format!(
            "`{written}`: {} characters, a name has at most {MAX_NAME}",
            name.len() + reserved
        ));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(format!(
                "`{written}`: an empty label (two dots in a row, or a leading dot); write \
                 labels separated by single dots, like \"api.github.com\""
            ));
        }
        if label.len() > MAX_LABEL {
            return Err(format!(
                "`{written}`: the label `{label}` has {} characters, a label has at most \
                 {MAX_LABEL}",
                label.len()
            ));
        }
        if let Some(bad) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
        {
            return Err(format!(
                "`{written}`: `{bad}` in the label `{label}`; a label has only letters, \
                 digits, `-` and `_`"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!(
                "`{written}`: the label `{label}` starts or ends with `-`, which no host \
                 name does"
            ));
        }
    }
    Ok(name.to_string())
}

/// A name as asked (any case, a trailing dot or not) in the form the list stores.
fn asked(name: &str) -> String {
    let lower = name.to_ascii_lowercase();
    match lower.strip_suffix('.') {
        Some(stripped) => stripped.to_string(),
        None => lower,
    }
}

/// Whether `network` holds `addr` (both IPv4; an IPv6 network holds nothing here).
fn holds(network: &Cidr, addr: Ipv4Addr) -> bool {
    match network.addr {
        IpAddr::V4(net) => {
            let mask = mask(network.prefix);
            u32::from(net) & mask == u32::from(addr) & mask
        }
        IpAddr::V6(_) => false,
    }
}

/// The suffixes strictly under which `name` is (`a.b.c` -> `b.c`, `c`): the wildcards that
/// would cover it.
fn parents(name: &str) -> impl Iterator<Item = &str> {
    name.match_indices('.').map(move |(at, _)| &name[at + 1..])
}

/// An allow list: the union of its entries. A name is allowed when it is one of the names or
/// strictly under one of the wildcards; an address when it is in one of the networks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    names: BTreeSet<String>,
    /// The wildcards' suffixes (`github.com` for `*.github.com`).
    wildcards: BTreeSet<String>,
    /// IPv4 networks, host bits cleared, each once.
    networks: Vec<Cidr>,
}

impl AllowList {
    /// The list of `entries` as written, or the first bad entry's error.
    pub fn parse(entries: &[String]) -> Result<AllowList, String> {
        let mut list = AllowList::empty();
        for entry in entries {
            list.add(entry.parse()?);
        }
        Ok(list)
    }

    /// The list that allows nothing.
    pub fn empty() -> AllowList {
        AllowList::default()
    }

    fn add(&mut self, entry: Entry) {
        match entry {
            Entry::Name(name) => {
                self.names.insert(name);
            }
            Entry::Wildcard(suffix) => {
                self.wildcards.insert(suffix);
            }
            Entry::Network(cidr) => {
                if !self.networks.contains(&cidr) {
                    self.networks.push(cidr);
                }
            }
        }
    }

    /// This list and `other`'s entries (a policy's list with the host's defaults).
    pub fn with(&self, other: &AllowList) -> AllowList {
        let mut union = self.clone();
        union.names.extend(other.names.iter().cloned());
        union.wildcards.extend(other.wildcards.iter().cloned());
        for cidr in &other.networks {
            union.add(Entry::Network(*cidr));
        }
        union
    }

    /// Whether the name asked (any case, a trailing dot or not) may be answered: it is one of
    /// the names, or strictly under a wildcard. `github.com.evil.test` is not `github.com`,
    /// and `*.x` allows neither `x` nor `evilx`.
    pub fn allows_name(&self, name: &str) -> bool {
        let name = asked(name);
        if name.is_empty() {
            return false;
        }
        self.names.contains(&name) || self.under_wildcard(&name)
    }

    /// Whether `name` (normalised) is strictly under one of the wildcards.
    fn under_wildcard(&self, name: &str) -> bool {
        parents(name).any(|parent| self.wildcards.contains(parent))
    }

    /// Whether `addr` is in one of the networks (names' addresses are the resolver's, not this
    /// list's).
    pub fn allows_address(&self, addr: Ipv4Addr) -> bool {
        self.networks.iter().any(|net| holds(net, addr))
    }

    /// The networks, for the runner's `nets` set (all IPv4: the grammar refuses IPv6).
    pub fn networks(&self) -> Vec<Cidr> {
        self.networks
            .iter()
            .filter(|cidr| cidr.addr.is_ipv4())
            .copied()
            .collect()
    }

    /// Every entry, normalised as it would be written back (lowercase names, `*.` wildcards,
    /// `/prefix` networks), sorted and each once.
    pub fn entries(&self) -> Vec<String> {
        let written: BTreeSet<String> = self
            .names
            .iter()
            .cloned()
            .chain(self.wildcards.iter().map(|s| format!("*.{s}")))
            .chain(self.networks.iter().map(|c| c.to_string()))
            .collect();
        written.into_iter().collect()
    }

    /// Whether the list allows nothing at all.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty() && self.wildcards.is_empty() && self.networks.is_empty()
    }
}

/// Which of `needed` (names, `*.x` patterns, networks) `list` does not cover: a name is covered
/// as [`AllowList::allows_name`] says; a wildcard by an equal or wider wildcard (`*.x` by
/// `*.x` or `*.parent-of-x`, never by names, which cover only themselves); a network by a
/// network holding it all. An entry that does not parse is uncovered. Used at start to warn.
pub fn uncovered<'a>(list: &AllowList, needed: &[&'a str]) -> Vec<&'a str> {
    needed
        .iter()
        .copied()
        .filter(|need| {
            let covered = match need.parse::<Entry>() {
                Ok(Entry::Name(name)) => list.allows_name(&name),
                Ok(Entry::Wildcard(suffix)) => {
                    list.wildcards.contains(&suffix) || list.under_wildcard(&suffix)
                }
                Ok(Entry::Network(cidr)) => match cidr.addr {
                    IpAddr::V4(addr) => list
                        .networks
                        .iter()
                        .any(|net| net.prefix <= cidr.prefix && holds(net, addr)),
                    IpAddr::V6(_) => false,
                },
                Err(_) => false,
            };
            !covered
        })
        .collect()
}

/// The reverse-lookup zones: a PTR query says nothing of where a job connects, and allowing
/// one is never what makes a job work.
const REVERSE_ZONES: &[&str] = &["in-addr.arpa", "ip6.arpa"];

/// A proposed allow list from what jobs used: `names` (every name asked, with its count of
/// queries) and `direct` (addresses reached without a name), sorted and each once, in the
/// form [`AllowList::entries`] writes (so it parses back).
///
/// The rule:
/// - every name asked is listed, however often (a name asked once is as needed as one asked a
///   thousand times: the job fails without it), save names of the reverse zones
///   (`in-addr.arpa`, `ip6.arpa`) and names that are not valid entries;
/// - when [`WILDCARD_AT`] or more distinct names sit directly under one parent of at least two
///   labels (`a.pkg.example`, `b.pkg.example`, `c.pkg.example`), they become `*.parent`
///   (`*.pkg.example`); a parent of one label (`com`) never does;
/// - names, and narrower wildcards, already under such a wildcard are dropped (the parent
///   itself is kept if it was asked: a wildcard does not cover its apex);
/// - each address becomes its `/32`.
///
/// - no name at or under a zone in `tunnelled` (zones where jobs were seen tunnelling through
///   DNS) is listed, and no wildcard is made that would cover one (its names stay listed one by
///   one).
///
/// What a hostile job asked is in `names` too: the proposal is for an operator to read, not to
/// apply unseen.
pub fn propose(names: &[(String, u64)], direct: &[Ipv4Addr], tunnelled: &[String]) -> Vec<String> {
    let in_tunnel = |name: &str| {
        tunnelled
            .iter()
            .any(|zone| name == zone || name.ends_with(&format!(".{zone}")))
    };
    let asked: BTreeSet<String> = names
        .iter()
        .filter_map(|(name, _)| match name.parse::<Entry>() {
            Ok(Entry::Name(name)) => Some(name),
            _ => None,
        })
        .filter(|name| {
            !REVERSE_ZONES
                .iter()
                .any(|zone| name == zone || name.ends_with(&format!(".{zone}")))
        })
        .filter(|name| !in_tunnel(name))
        .collect();
    let mut children: BTreeMap<&str, usize> = BTreeMap::new();
    for name in &asked {
        if let Some((_, parent)) = name.split_once('.')
            && parent.contains('.')
        {
            *children.entry(parent).or_default() += 1;
        }
    }
    let mut list = AllowList::empty();
    for (parent, count) in children {
        // A wildcard over a zone jobs tunnelled through would allow the channel.
        let covers_tunnel = tunnelled
            .iter()
            .any(|zone| zone == parent || zone.ends_with(&format!(".{parent}")));
        if count >= WILDCARD_AT && !covers_tunnel {
            list.wildcards.insert(parent.to_string());
        }
    }
    // A wildcard under a wider one adds nothing.
    let nested: Vec<String> = list
        .wildcards
        .iter()
        .filter(|suffix| list.under_wildcard(suffix))
        .cloned()
        .collect();
    for suffix in nested {
        list.wildcards.remove(&suffix);
    }
    for name in asked {
        if !list.under_wildcard(&name) {
            list.names.insert(name);
        }
    }
    for addr in direct {
        list.add(Entry::Network(Cidr {
            addr: IpAddr::V4(*addr),
            prefix: 32,
        }));
    }
    list.entries()
}

/// The zones a name is counted under for tunnelling: every suffix of it of at least two labels,
/// the name itself left out, nearest first (`a.b.exfil.test` -> `b.exfil.test`,
/// `exfil.test`); a trailing dot left out. A channel through DNS varies the labels in front of
/// a zone it controls, one label or several, so each refused name counts for every zone above
/// it and the nearest zone that many distinct names share is the channel's.
pub fn zones_of(name: &str) -> impl Iterator<Item = &str> {
    let name = name.strip_suffix('.').unwrap_or(name);
    name.match_indices('.')
        .map(move |(at, _)| &name[at + 1..])
        .filter(|zone| zone.contains('.'))
}

#[cfg(test)]
mod tests;
