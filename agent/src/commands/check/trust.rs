//! `check`'s findings on what a job could change ([`crate::trust`]): a `runner.package_dir`
//! (the way to it and every entry in it), an `env_file`, a `docker_images` tarball or a local
//! `image` source (an OCI layout and every entry in it, or an archive) a runner uid owns or
//! others may write, or a link out of the package or the layout (`fail`, as `run` refuses to
//! start), and the kernel's link protections (`protected_links`: `fail` when off).

use super::Finding;
use crate::config::Config;
use crate::trust::{self, Trusted};

pub(crate) fn trust(config: &Config) -> Vec<Finding> {
    let pool = trust::pool_of(config);
    let mut out: Vec<Finding> = trust::trusted_paths(config, None)
        .into_iter()
        .filter_map(|trusted| {
            let why = trust::changeable(&trusted, &pool)?;
            Some(finding(&trusted, &why))
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

/// The `fail` finding for `trusted`, which a job could change (`why`: "problem; fix"), under
/// the check its key names: `runner_package`, `env_file`, `docker_images` or `image`.
fn finding(trusted: &Trusted, why: &str) -> Finding {
    let (problem, remedy) = super::split_remedy(why);
    let check = match trusted.key.rsplit_once('.') {
        Some((_, "env_file")) => "env_file",
        Some((_, "docker_images")) => "docker_images",
        Some((_, "image")) => "image",
        _ => "runner_package",
    };
    let mut finding = Finding::fail(
        check,
        format!(
            "`{}` {}: a job could change what every later runner gets: {problem}",
            trusted.key,
            trusted.path.display()
        ),
        format!("{remedy}; `rm-agent run` refuses to start until then"),
    );
    finding.policy = trusted.policy.clone();
    finding
}
