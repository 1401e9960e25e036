//! `check`'s `docker` findings, only where a policy sets `docker = true` (issue 30): whether this
//! host can give runners a rootless Docker daemon ([`rm_runner::docker::host`]: the tools,
//! the tun device, the kernel, the agent's `no_new_privs`, user namespaces, the pool's
//! subordinate id ranges), whether each policy's `docker_images` can be read, and what a
//! policy's Docker would leave unbounded here (`fail` unless its `docker_unbounded` accepts it,
//! then `warn`: [`crate::isolation::docker_bounds`], the rule `run` refuses by). Looks only:
//! it writes no `/etc/subuid` line (`run` does) and starts no daemon.

use std::path::{Path, PathBuf};

use super::Finding;
use crate::config::Config;
use crate::isolation::{DockerBounds, unbounded_refusal};
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
            p.docker.as_ref().map(|d| {
                let paths: Vec<PathBuf> = d.images.iter().map(|i| i.path.clone()).collect();
                (p.name.clone(), paths)
            })
        })
        .collect();
    if with_docker.is_empty() {
        return Vec::new();
    }
    // What `run` refuses first (crate::isolation::docker_runner_root), said whatever else fails.
    let root = runner_root_finding(config);
    let pool = match Pool::resolve(&config.host.runner_uids) {
        Ok(pool) => pool,
        Err(problem) => {
            let mut out = vec![Finding::fail(
                "docker",
                format!("the runner uid pool cannot be used: {problem}"),
                "fix `host.runner_uids`",
            )];
            out.extend(root);
            return out;
        }
    };
    let accounts: Vec<(u32, u32)> = pool.accounts().iter().map(|a| (a.uid, a.gid)).collect();
    let facts = Facts::gather(&accounts, &Files::host());
    // Where no runner cgroup can be had, `isolation` fails already; nothing is offered then.
    let available = super::isolation::cgroup_evidence(config)
        .map(|(_, controllers)| controllers)
        .unwrap_or_default();
    let bounds = crate::isolation::docker_bounds(config, available, facts.kernel);
    let bad_images = with_docker
        .iter()
        .flat_map(|(policy, images)| {
            images.iter().filter_map(move |image| {
                unreadable(image).map(|why| (policy.clone(), image.clone(), why))
            })
        })
        .collect();
    let mut out = findings(&facts, bad_images);
    out.extend(root);
    out.extend(bounds.into_iter().flat_map(unbounded_findings));
    out
}

/// `host.runner_root` where a Docker policy's runner could not start its daemon: `fail`, with
/// the words `run` refuses it with.
fn runner_root_finding(config: &Config) -> Option<Finding> {
    let root = resolved(&config.host.runner_root);
    let problem = crate::isolation::docker_runner_root(config, &root)?;
    Some(Finding::fail(
        "docker",
        format!("`rm-agent run` would refuse `host.runner_root`: {problem}"),
        "set host.runner_root to a shorter directory outside the daemon's tmpfs (docs/configuration.md, host.runner_root)",
    ))
}

/// `path` as `run` will resolve it (it makes the runner root, then canonicalizes it), without
/// making anything: its deepest existing ancestor canonicalized, the rest as written. A link
/// such as `/var/run` is judged as the `/run` it leads to.
fn resolved(path: &Path) -> PathBuf {
    let mut rest = Vec::new();
    for ancestor in path.ancestors() {
        if let Ok(real) = ancestor.canonicalize() {
            return rest.iter().rev().fold(real, |at, part| at.join(part));
        }
        match ancestor.file_name() {
            Some(name) => rest.push(name.to_owned()),
            // A `..` below what does not exist: judged as written.
            None => break,
        }
    }
    path.to_owned()
}

/// A policy's unbounded resources as findings: `fail` for those it did not accept (`run`
/// refuses them), `warn` for those it accepted by name. Pure.
fn unbounded_findings(bounds: DockerBounds) -> Vec<Finding> {
    let mut out = Vec::new();
    if !bounds.unaccepted.is_empty() {
        let mut finding = Finding::fail(
            "docker",
            format!(
                "docker_unbounded: {}",
                bounds
                    .unaccepted
                    .iter()
                    .map(|u| u.why())
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            unbounded_refusal(&bounds.unaccepted),
        );
        finding.policy = Some(bounds.policy.clone());
        out.push(finding);
    }
    for accepted in bounds.accepted {
        let mut finding = Finding::warn(
            "docker",
            format!(
                "accepted by docker_unbounded = [\"{}\"]: {}",
                accepted.as_str(),
                accepted.why()
            ),
            "give the runner cgroups the controller, then drop it from docker_unbounded",
        );
        finding.policy = Some(bounds.policy.clone());
        out.push(finding);
    }
    out
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

    /// A runner root under the daemon's tmpfs fails `check` in the words `run` refuses it
    /// with, judged where it leads (a link to `/dev/shm`), before the directory exists.
    #[test]
    fn a_runner_root_docker_cannot_serve_fails_where_it_leads() {
        let base = tempfile::tempdir().unwrap();
        let link = base.path().join("link");
        std::os::unix::fs::symlink("/dev/shm", &link).unwrap();
        let root = link.join("rm").join("runners");
        assert_eq!(resolved(&root), Path::new("/dev/shm/rm/runners"));
        let config = crate::config::from_text(&format!(
            "[host]\nrunner_root = \"{}\"\n\n[[policy]]\nname = \"ci\"\ntarget = \"acme\"\nlabels = [\"x\"]\ndocker = true\n",
            root.display()
        ))
        .unwrap();
        let failed = runner_root_finding(&config).unwrap();
        assert_eq!(failed.status, Status::Fail);
        for words in [
            "`rm-agent run` would refuse `host.runner_root`",
            "policy `ci`",
            "lies under /dev/shm",
            "choose a host.runner_root outside",
        ] {
            assert!(failed.what.contains(words), "{words}: {}", failed.what);
        }
        assert!(docker(&config).iter().any(|f| f.what == failed.what));
        let fine = crate::config::from_text(
            "[host]\nrunner_root = \"/var/lib/rm-agent/runners\"\n\n[[policy]]\nname = \"ci\"\ntarget = \"acme\"\nlabels = [\"x\"]\ndocker = true\n",
        )
        .unwrap();
        assert!(runner_root_finding(&fine).is_none());
    }

    #[test]
    fn what_docker_leaves_unbounded_fails_unless_accepted_then_warns() {
        use rm_runner::docker::unbounded::Unbounded;
        let out = unbounded_findings(DockerBounds {
            policy: "ci".into(),
            unaccepted: vec![Unbounded::Pids],
            accepted: vec![Unbounded::Memory],
        });
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(out[0].status, Status::Fail);
        assert!(
            out[0].what.contains("no pids controller"),
            "{}",
            out[0].what
        );
        assert!(
            out[0].remedy.contains("docker_unbounded = [\"pids\"]"),
            "{}",
            out[0].remedy
        );
        assert_eq!(out[1].status, Status::Warn);
        assert!(out[1].what.contains("docker_unbounded = [\"memory\"]"));
        assert!(out.iter().all(|f| f.policy.as_deref() == Some("ci")));
    }
}
