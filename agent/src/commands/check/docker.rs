//! `check`'s `docker` findings, only where a policy sets `docker = true` (issue 30): whether this
//! host can give runners a rootless Docker daemon ([`rm_runner::docker::host`]: the tools,
//! the tun device, the kernel, the agent's `no_new_privs`, user namespaces, the pool's
//! subordinate id ranges), and whether each policy's `docker_images` can be read. Looks only:
//! it writes no `/etc/subuid` line (`run` does) and starts no daemon.

use std::path::{Path, PathBuf};

use super::Finding;
use crate::config::Config;
use rm_runner::docker::host::{Facts, judge};
use rm_runner::docker::subid::Files;
use rm_runner::isolate::Pool;

/// A `policy.docker_images` file that cannot be loaded: the policy, the file, why.
type BadImage = (String, PathBuf, String);

pub(super) fn docker(config: &Config) -> Vec<Finding> {
    let with_docker: Vec<_> = config
        .policies
        .iter()
        .filter_map(|p| {
            p.docker
                .as_ref()
                .map(|d| (p.name.clone(), d.images.clone()))
        })
        .collect();
    if with_docker.is_empty() {
        return Vec::new();
    }
    let pool = match Pool::resolve(&config.host.runner_uids) {
        Ok(pool) => pool,
        Err(problem) => {
            return vec![Finding::fail(
                "docker",
                format!("the runner uid pool cannot be used: {problem}"),
                "fix `host.runner_uids`",
            )];
        }
    };
    let accounts: Vec<(u32, u32)> = pool.accounts().iter().map(|a| (a.uid, a.gid)).collect();
    let facts = Facts::gather(&accounts, &Files::host());
    let bad_images = with_docker
        .iter()
        .flat_map(|(policy, images)| {
            images.iter().filter_map(move |image| {
                unreadable(image).map(|why| (policy.clone(), image.clone(), why))
            })
        })
        .collect();
    findings(&facts, bad_images)
}

/// Why an image tarball cannot be loaded, if it cannot.
fn unreadable(image: &Path) -> Option<String> {
    match std::fs::File::open(image).and_then(|f| f.metadata()) {
        Ok(meta) if meta.is_file() => None,
        Ok(_) => Some("not a file".to_owned()),
        Err(e) => Some(e.to_string()),
    }
}

/// The findings for what was found. Pure.
fn findings(facts: &Facts, bad_images: Vec<BadImage>) -> Vec<Finding> {
    let mut out: Vec<Finding> = judge(facts)
        .into_iter()
        .map(|lack| Finding::fail("docker", lack.what, lack.remedy))
        .collect();
    for (policy, image, why) in bad_images {
        let mut finding = Finding::fail(
            "docker",
            format!("docker_images: cannot read {}: {why}", image.display()),
            "make it an image tarball (`docker save -o FILE IMAGE`) the agent can read, or remove it from docker_images",
        );
        finding.policy = Some(policy);
        out.push(finding);
    }
    if out.is_empty() {
        let to_add = facts.subids.clone().unwrap_or_default();
        out.push(Finding::ok(
            "docker",
            format!(
                "rootless Docker per runner: tools, tun device, kernel and user namespaces ready; subordinate ids {}",
                if to_add.is_empty() {
                    "in place for every runner uid".to_owned()
                } else {
                    // Named in full: an agent that may not write /etc (systemd's
                    // ProtectSystem=strict) needs the operator to add them.
                    format!(
                        "free: `run` adds {} lines ({})",
                        to_add.len(),
                        to_add.join("; ")
                    )
                }
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::check::Status;
    use rm_runner::docker::host::{Found, TOOLS};

    /// A host that lacks nothing: every tool at `/usr/bin`, the two id mappers setuid root, a
    /// kernel of 6.1 with overlay (as `rm_runner::docker::host`'s own tests have it: a test
    /// fixture is not part of that crate's product, so each test module has its own).
    fn all_there() -> Facts {
        Facts {
            tools: TOOLS
                .iter()
                .map(|t| {
                    (
                        *t,
                        Found::At {
                            path: PathBuf::from("/usr/bin").join(t.name),
                            setuid_root: t.setuid,
                        },
                    )
                })
                .collect(),
            tun: true,
            tun_open: false,
            can_mknod: true,
            overlay: true,
            kernel: Some((6, 1)),
            no_new_privs: false,
            max_user_namespaces: Some(15_000),
            subids: Ok(vec![]),
        }
    }

    fn ready() -> Facts {
        Facts {
            tun_open: true,
            can_mknod: false,
            subids: Ok(vec![
                "/etc/subuid: 64290:1000000000:65536".into(),
                "/etc/subgid: 64290:1000000000:65536".into(),
            ]),
            ..all_there()
        }
    }

    #[test]
    fn a_ready_host_is_one_ok_saying_what_run_will_add() {
        let out = findings(&ready(), vec![]);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].status, Status::Ok);
        assert!(
            out[0]
                .what
                .contains("adds 2 lines (/etc/subuid: 64290:1000000000:65536; /etc/subgid"),
            "{}",
            out[0].what
        );
    }

    #[test]
    fn each_lack_and_each_unreadable_image_fails_with_its_remedy() {
        let mut facts = ready();
        facts.tun = false;
        facts.subids = Err("uid 64290 has 2 entries".into());
        let out = findings(
            &facts,
            vec![("ci".into(), "/srv/pg.tar".into(), "No such file".into())],
        );
        assert_eq!(out.len(), 3, "{out:?}");
        assert!(out.iter().all(|f| f.status == Status::Fail));
        assert!(out.iter().all(|f| !f.remedy.is_empty()));
        assert_eq!(out[2].policy.as_deref(), Some("ci"));
        assert!(out[2].what.contains("/srv/pg.tar"));
    }
}
