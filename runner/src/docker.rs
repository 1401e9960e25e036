//! A rootless Docker daemon per runner (issue 30): what gives a job `docker`, `services:` and
//! `container:` without the host's root daemon. The daemon runs as the runner's uid, its
//! containers under that uid's subordinate ids, in the runner's cgroup (killing the cgroup ends
//! the whole tree, containers running under subordinate ids included: a sweep by uid misses
//! those) and, when given, the runner's network namespace; everything it keeps lies under the
//! runner's runtime.
//!
//! - [`subid`]: each pool uid's range in `/etc/subuid` and `/etc/subgid` (decided purely,
//!   appended atomically).
//! - [`launch`]: starting one daemon and waiting until it answers.
//! - [`mirror`]: the pull-through registry mirror as the daemon must address it.
//! - [`host`]: whether this host can, and why not.

pub mod host;
pub(crate) mod launch;
pub mod mirror;
pub mod subid;

pub use host::{Facts, Lack, Tools, judge};
pub use launch::{Daemon, DaemonSpec, DockerError, ImageError, Layout, load_images, start};
pub use mirror::{DaemonMirror, RegistryMirror, Route, daemon_mirror};

use std::path::PathBuf;

/// What a policy's runners get of Docker (`policy.docker`, `policy.docker_images`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DockerPolicy {
    /// Image tarballs (`docker save` output, absolute paths) loaded into each runner's daemon
    /// before the runner starts: images a job finds without a registry round trip.
    pub images: Vec<PathBuf>,
    /// `docker_registry_mirror`: the pull-through mirror the daemon pulls Docker Hub images
    /// through (as written; [`mirror`] says how the daemon reaches it).
    pub registry_mirror: Option<RegistryMirror>,
}
