//! An IPv4 or IPv6 network as the configuration writes it (`host.network_deny`,
//! `policy.network_allow`).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// How many runner networks (a /30 each of 10.213.0.0/16) a host numbers: a runner's is its
/// uid modulo this, so a pool of at most this many consecutive uids never shares one.
pub const NETWORK_SLOTS: u32 = 1 << (32 - 16 - 2);

/// An IPv4 or IPv6 network, as `host.network_deny` and `policy.network_allow` write it
/// (`10.0.0.0/8`, `2001:db8::/32`; a bare address is its own /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Cidr, String> {
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let addr: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("`{text}` is not an address or network like \"10.0.0.0/8\""))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("`{text}`: the prefix length must be 0 to {max}"))?,
        };
        Ok(Cidr { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}
