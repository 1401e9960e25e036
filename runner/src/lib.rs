//! rm's runners on the host: everything between "start a runner for this attempt" and "nothing
//! of it is left", as adapters the agent's executor drives. The crate decides no lifecycle: when
//! a runner starts, is stopped or cleaned up is the agent's (`rm-agent`'s `executor` and
//! `lifecycle`); how each of those is done on this host is here.
//!
//! - [`backend`] is the execution seam (CONTRACT §7) and the one seam of this crate: a runner's
//!   runtime is made, its process started, looked at and stopped, and everything it left cleaned
//!   through the attempt's [`backend::Backend`]. A backend is also the process table its
//!   runners are seen and signalled in ([`process::Processes`], which [`process::inspect`] and
//!   [`process::stop`] read): the executor reaches a process only through a backend, and a test
//!   fakes the backend alone. `Processes` stays a trait of its own because the stop and the
//!   identity checks are written once against it, for every backend and for the host's table
//!   ([`OsProcesses`], which `none` and `user` keep); it is not a second seam to fill. A runtime
//!   directory ([`workspace`]) is made and removed only by the backends, so it has no seam.
//!   [`isolate`], [`cgroup`], [`uid`], [`network`], [`docker`], [`store`] and [`devices`] are
//!   what `isolation = "user"` is made of.
//! - [`process`] starts the runner the way CONTRACT §5 says, tells a live runner from a
//!   recycled pid, and stops a runner's whole process group; [`workspace`] makes and removes a
//!   runner's runtime directory without following a link out of it; [`slot`] is a persistent
//!   workspace's slot.
//! - [`package`] fetches, verifies and caches the package `runner.version` names, and follows
//!   releases; [`logs`] sends a runner's output to a file in its runtime and keeps its `_diag`
//!   before cleanup removes the runtime; [`disk`] measures a runtime against its bound;
//!   [`discover`] and [`refusal`] read what a runner left behind; [`trust`] judges whether a
//!   job could change what later runners get from disk (the package, env files, images).
//!
//! The value types the configuration parses into (a policy's [`cgroup::Limits`],
//! [`docker::DockerPolicy`], [`network::Cidr`], the uid pool [`isolate::RunnerUids`], the kept
//! logs' [`logs::Bounds`]) are this crate's; the agent's `config` re-exports them. This crate
//! never names the agent.

pub mod backend;
pub mod cgroup;
pub mod devices;
pub mod discover;
pub mod disk;
pub mod docker;
pub mod env_file;
/// The outbound HTTP(S) client, owned by `rm-github` (which the service client of scale sets
/// needs too); re-exported where its users always found it.
pub use rm_github::https;
pub mod image_root;
pub mod isolate;
pub mod listening;
pub mod logs;
pub mod network;
pub mod package;
pub mod process;
pub mod refusal;
pub mod slot;
pub mod store;
pub(crate) mod tmpfs;
pub mod trust;
pub mod uid;
pub mod workspace;

pub use cgroup::{Usage, read_usage};
pub use devices::{DeviceError, DevicePlan};
pub use process::{
    OsProcesses, ProcessError, ProcessIdentity, ProcessState, Processes, RunnerChild, Spawned,
    StopOutcome,
};
pub use workspace::{Removal, RunnerRoot, Runtime, WorkspaceError};

/// A unit test that cannot run here fails unless `RM_TEST_ALLOW_SKIP` names what it lacks.
#[cfg(test)]
#[path = "../../tests/support/skip.rs"]
pub(crate) mod test_skip;
