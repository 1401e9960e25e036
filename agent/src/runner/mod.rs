//! Runner processes and their workspaces: the adapters the lifecycle drives. [`workspace`] makes
//! and removes a runner's runtime directory; [`process`] starts the runner in it, tells a live
//! runner from a recycled pid, and stops the runner's whole process group. [`package`] fetches
//! the package `runner.version` names into the cache. [`backend`] is the execution seam the
//! executor drives (CONTRACT §7): [`isolate`], [`cgroup`], [`uid`] and [`store`] are what
//! `isolation = "user"` is made of. [`logs`] sends a runner's output to a file in its runtime
//! and keeps its `_diag` before cleanup removes the runtime.

pub mod backend;
pub mod cgroup;
pub mod discover;
pub mod disk;
pub mod docker;
pub mod env_file;
pub mod isolate;
pub mod logs;
pub mod network;
pub mod package;
pub mod process;
pub mod refusal;
pub mod slot;
pub mod store;
pub mod tmpfs;
pub mod uid;
pub mod workspace;

pub use process::{
    OsProcesses, ProcessError, ProcessIdentity, ProcessState, Processes, RunnerChild, Spawned,
    StopOutcome,
};
pub use workspace::{Removal, RunnerRoot, Runtime, WorkspaceError, Workspaces};
