//! `check`'s `egress` finding, one per policy with `[policy.egress]` (issue 41): its mode and
//! list, whether the host's `resolv.conf` names a nameserver the runners' DNS can be rewritten
//! from (`run` refuses to start without one), and which of GitHub's essential endpoints the
//! joined list leaves out (a runner then cannot take its job). Looks only.

use rm_egress::allow::{GITHUB_ESSENTIAL, uncovered};
use rm_egress::record::Mode;

use super::Finding;
use crate::config::{Config, Policy};

pub(super) fn egress(config: &Config) -> Vec<Finding> {
    let resolv = std::fs::read_to_string(rm_runner::network::RESOLV_CONF).unwrap_or_default();
    let nameservers = crate::egress::nameservers(&resolv);
    config
        .policies
        .iter()
        .filter_map(|policy| {
            Some(judge(
                policy,
                policy.egress.as_ref()?,
                !nameservers.is_empty(),
            ))
        })
        .collect()
}

/// The finding of one egress policy. Pure.
fn judge(
    policy: &Policy,
    egress: &crate::config::egress::PolicyEgress,
    has_nameserver: bool,
) -> Finding {
    if !has_nameserver {
        return Finding::fail(
            "egress",
            format!(
                "{} names no IPv4 nameserver: runners' DNS has nothing to be rewritten from",
                rm_runner::network::RESOLV_CONF
            ),
            "name the host's resolver there (runners read the same file); `run` refuses to start until then",
        )
        .for_policy(policy);
    }
    let missing = uncovered(&egress.allow, GITHUB_ESSENTIAL);
    let entries = egress.own.entries().len();
    if !missing.is_empty() {
        return Finding::warn(
            "egress",
            format!(
                "egress {} with {entries} entr(ies) of its own leaves out {}, which a runner needs to take its job",
                egress.mode.as_str(),
                missing.join(", ")
            ),
            "add them to host.egress_allow (its default lists GitHub's endpoints) or to the policy's egress.allow; on GitHub Enterprise Server, your server's name",
        )
        .for_policy(policy);
    }
    let what = match egress.mode {
        Mode::Enforce => format!(
            "egress enforce: {entries} entr(ies) of its own and host.egress_allow; other names get NXDOMAIN, other addresses are refused"
        ),
        Mode::Audit => format!(
            "egress audit: nothing is refused; what {entries} entr(ies) of its own and host.egress_allow would refuse is recorded (`rm-agent egress --policy {} --since 7d` proposes a list)",
            policy.name
        ),
    };
    Finding::ok("egress", what).for_policy(policy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::check::Status;

    fn config(egress: &str, host: &str) -> Config {
        crate::config::from_text(&format!(
            "[host]\nisolation = \"user\"\nnetwork = \"private\"\n{host}\n[[policy]]\nname = \"build\"\ntarget = \"acme\"\nlabels = [\"self-hosted\"]\n[policy.egress]\n{egress}\n"
        ))
        .unwrap()
    }

    fn judged(config: &Config, nameserver: bool) -> Finding {
        let policy = &config.policies[0];
        judge(policy, policy.egress.as_ref().unwrap(), nameserver)
    }

    #[test]
    fn an_egress_policy_is_judged_by_its_list_and_the_hosts_resolver() {
        let fine = config("allow = [\"registry.npmjs.org\"]\nmode = \"audit\"", "");
        let found = judged(&fine, true);
        assert_eq!(found.status, Status::Ok, "{found:?}");
        assert!(found.what.contains("egress audit"), "{found:?}");
        assert_eq!(found.policy.as_deref(), Some("build"));

        let no_github = config("allow = [\"registry.npmjs.org\"]", "egress_allow = []");
        let found = judged(&no_github, true);
        assert_eq!(found.status, Status::Warn, "{found:?}");
        assert!(found.what.contains("api.github.com"), "{found:?}");

        let found = judged(&fine, false);
        assert_eq!(found.status, Status::Fail, "{found:?}");
    }
}
