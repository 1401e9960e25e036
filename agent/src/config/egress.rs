//! `policy.egress`, `host.egress_allow` and `host.dns_upstream` as written and validated (issue
//! 41): the names, wildcards and networks a policy's runners may reach, whether that is
//! enforced or only audited, what every such policy allows besides (GitHub's own endpoints by
//! default), and where the agent's resolver asks. The grammar is `rm_egress::allow`'s; the
//! resolver and the runners' tables are `crate::egress`'s and `rm_runner::network`'s.

use std::net::SocketAddr;
use std::sync::Arc;

use rm_egress::allow::{AllowList, GITHUB_DEFAULTS};
use rm_egress::record::Mode;
use serde::Deserialize;

/// `[policy.egress]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressSection {
    /// Names (`github.com`), wildcards (`*.githubusercontent.com`) and networks
    /// (`10.20.0.0/16`).
    pub allow: Option<Vec<String>>,
    /// `"enforce"` (the default) or `"audit"`.
    pub mode: Option<String>,
}

/// A policy's egress, validated.
#[derive(Debug, Clone)]
pub struct PolicyEgress {
    /// The policy's own list.
    pub own: AllowList,
    /// The policy's list joined with `host.egress_allow`: what its runners reach.
    pub allow: Arc<AllowList>,
    pub mode: Mode,
}

/// The host's part, validated.
#[derive(Debug, Clone)]
pub struct HostEgress {
    /// `host.egress_allow`; absent: [`GITHUB_DEFAULTS`].
    pub allow: AllowList,
    /// `host.dns_upstream`; `None`: the host's `resolv.conf` nameservers.
    pub dns_upstream: Option<SocketAddr>,
}

/// Validates `[policy.egress]`; the error names the key and why. Pure.
pub fn validate_policy(
    section: Option<EgressSection>,
) -> Result<Option<PolicyEgress>, (&'static str, String)> {
    let Some(section) = section else {
        return Ok(None);
    };
    let mode = match section.mode.as_deref() {
        None => Mode::Enforce,
        Some(text) => Mode::parse(text).map_err(|problem| ("egress.mode", problem))?,
    };
    let own = AllowList::parse(&section.allow.unwrap_or_default())
        .map_err(|problem| ("egress.allow", problem))?;
    Ok(Some(PolicyEgress {
        allow: Arc::new(own.clone()),
        own,
        mode,
    }))
}

/// Validates `host.egress_allow` and `host.dns_upstream`. Pure.
pub fn validate_host(
    egress_allow: Option<Vec<String>>,
    dns_upstream: Option<String>,
) -> Result<HostEgress, (&'static str, String)> {
    let written =
        egress_allow.unwrap_or_else(|| GITHUB_DEFAULTS.iter().map(|e| (*e).to_owned()).collect());
    let allow = AllowList::parse(&written).map_err(|problem| ("egress_allow", problem))?;
    let dns_upstream = dns_upstream
        .map(|text| {
            text.parse::<SocketAddr>()
                .ok()
                .filter(SocketAddr::is_ipv4)
                .ok_or_else(|| {
                    (
                        "dns_upstream",
                        format!(
                            "`{text}` is not an IPv4 address and port like \"10.0.0.2:53\" (the resolver the agent forwards allowed names to)"
                        ),
                    )
                })
        })
        .transpose()?;
    Ok(HostEgress {
        allow,
        dns_upstream,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(allow: &[&str], mode: Option<&str>) -> Option<EgressSection> {
        Some(EgressSection {
            allow: Some(allow.iter().map(|e| (*e).to_owned()).collect()),
            mode: mode.map(ToOwned::to_owned),
        })
    }

    #[test]
    fn a_policys_egress_is_read_with_its_mode() {
        assert!(validate_policy(None).unwrap().is_none());
        let enforce = validate_policy(section(&["github.com", "10.0.0.0/8"], None))
            .unwrap()
            .unwrap();
        assert_eq!(enforce.mode, Mode::Enforce);
        assert!(enforce.allow.allows_name("github.com"));
        let audit = validate_policy(section(&[], Some("audit")))
            .unwrap()
            .unwrap();
        assert_eq!(audit.mode, Mode::Audit);
        let (key, _) = validate_policy(section(&[], Some("block"))).unwrap_err();
        assert_eq!(key, "egress.mode");
        let (key, problem) = validate_policy(section(&["*github.com"], None)).unwrap_err();
        assert_eq!(key, "egress.allow");
        assert!(problem.contains("*github.com"), "{problem}");
    }

    #[test]
    fn a_cached_egress_policy_must_allow_the_caches_upstream() {
        let text = |host: &str, mode: &str| {
            format!(
                "[host]\nisolation = \"user\"\nnetwork = \"private\"\n{host}\n[cache]\n[[policy]]\nname = \"build\"\ntarget = \"acme\"\nlabels = [\"self-hosted\"]\ncache = true\n[policy.egress]\nmode = \"{mode}\"\n"
            )
        };
        // The default host list covers GitHub's results service.
        crate::config::from_text(&text("", "enforce")).unwrap();
        let refused = crate::config::from_text(&text("egress_allow = []", "enforce")).unwrap_err();
        assert!(refused.to_string().contains("cache.upstream"), "{refused}");
        // Audit refuses nothing, the cache's upstream included.
        crate::config::from_text(&text("egress_allow = []", "audit")).unwrap();
    }

    #[test]
    fn the_host_allows_githubs_endpoints_unless_told_otherwise() {
        let host = validate_host(None, None).unwrap();
        assert!(host.allow.allows_name("api.github.com"));
        assert!(
            host.allow
                .allows_name("pipelines.actions.githubusercontent.com")
        );
        assert!(host.dns_upstream.is_none());
        let none = validate_host(Some(vec![]), Some("10.0.0.2:53".to_owned())).unwrap();
        assert!(!none.allow.allows_name("github.com"));
        assert_eq!(none.dns_upstream, Some("10.0.0.2:53".parse().unwrap()));
        for bad in ["10.0.0.2", "[::1]:53", "resolver:53"] {
            let (key, _) = validate_host(None, Some(bad.to_owned())).unwrap_err();
            assert_eq!(key, "dns_upstream", "{bad}");
        }
    }
}
