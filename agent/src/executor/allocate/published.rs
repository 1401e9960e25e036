//! What allocation remembers between passes, in the shape the executor publishes it: the status
//! snapshot carries it ([`crate::status_file::Snapshot::allocation`]) so that `rm-agent explain`
//! and `status`, separate processes, decide a waiting job's verdict with the same facts the
//! running executor has. The facts and their rules are allocation's ([`super::Allocator`] fills
//! this in, [`super::backing_off`] and [`super::counts_after_fence`] judge it), so the shape
//! lives beside them: the snapshot and `explain` read it from here.
//! Nothing here is secret: a launch failure's detail is the sentence the journal holds for the
//! attempt (never a JIT configuration or a token).

use std::collections::BTreeMap;

use rm_vocab::UnixMs;
use serde::{Deserialize, Serialize};

/// Allocation's memory at one publication. Times are milliseconds since the Unix epoch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationMemory {
    /// Per policy name, what allocation remembers of it (policies it remembers nothing of are
    /// left out).
    #[serde(default)]
    pub policies: BTreeMap<String, PolicyMemory>,
    /// Attempt ids whose launch task is running (workspace, JIT registration, process).
    #[serde(default)]
    pub launching: Vec<String>,
    /// The agent is draining: it starts no new runner.
    #[serde(default)]
    pub draining: bool,
    /// Per scale set name, the capacity the last pass published for it
    /// ([`crate::scaleset::capacity`]): the `X-ScaleSetMaxCapacity` of its next poll.
    #[serde(default)]
    pub scale_set_capacity: BTreeMap<String, u32>,
    /// The allocation plan of the loop's last pass: per policy, its demand on this host, the
    /// runners started and what held the rest back (`None`: no pass has allocated yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<crate::executor::plan::Published>,
}

/// One policy's fence and launch back-off.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyMemory {
    /// A runner of the policy gave up (idle exit, registration timeout) at this time: jobs
    /// first seen before it are not demand any more.
    #[serde(default)]
    pub fence_ms: Option<UnixMs>,
    #[serde(default)]
    pub backoff: Option<Backoff>,
}

/// A policy's launch back-off after failed launches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    /// No launch of the policy before this time.
    pub until_ms: UnixMs,
    /// Consecutive failed launches.
    pub failures: u32,
    /// The latest failure: its reason code and the journal's sentence for it.
    #[serde(default)]
    pub last_failure: Option<String>,
}
