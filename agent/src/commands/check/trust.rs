//! `check`'s findings on what a job could change ([`crate::trust`]): a `runner.package_dir` or
//! an `env_file` a runner uid owns or others may write, on the way or itself (`fail`, as `run`
//! refuses to start), and the kernel's link protections (`protected_links`: `fail` when off).

use super::Finding;
use crate::config::Config;
use crate::trust;

pub(super) fn trust(config: &Config) -> Vec<Finding> {
    let pool = trust::pool_of(config);
    let mut out: Vec<Finding> = trust::trusted_paths(config)
        .into_iter()
        .filter_map(|(key, policy, path)| {
            let why = trust::changeable(&path, &pool)?;
            let (problem, remedy) = super::split_remedy(&why);
            let check = if policy.is_some() {
                "env_file"
            } else {
                "runner_package"
            };
            let mut finding = Finding::fail(
                check,
                format!(
                    "`{key}` {}: a job could change what every later runner gets: {problem}",
                    path.display()
                ),
                format!("{remedy}; `rm-agent run` refuses to start until then"),
            );
            finding.policy = policy;
            Some(finding)
        })
        .collect();
    let off = trust::protected_links_off();
    out.push(if off.is_empty() {
        Finding::ok(
            "protected_links",
            "fs.protected_symlinks and fs.protected_hardlinks are on",
        )
    } else {
        Finding::fail(
            "protected_links",
            format!(
                "{}: the isolation relies on the kernel's link protections",
                off.join(", ")
            ),
            trust::PROTECTED_LINKS_FIX,
        )
    });
    out
}
