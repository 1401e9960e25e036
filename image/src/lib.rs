//! rm-image: the job images of `policy.image` (issue 40). An image is named in the transport
//! syntax of skopeo and podman ([`reference`](mod@reference)), read from an OCI layout, an OCI or Docker
//! archive, or a registry ([`source`], [`registry`]), unpacked once per digest into a
//! root-owned store whose entries are complete and verified or absent ([`store`], [`unpack`]:
//! whiteouts applied, nothing written outside the entry, hostile entries refused or
//! neutralised), and judged able to run a runner package or not ([`fit`]). It knows nothing of
//! runners, policies or the journal: the agent decides which images are wanted and when, and
//! `rm-runner` mounts an entry as a runner's root.

pub mod fit;
pub mod reference;
pub mod registry;
pub mod source;
pub mod store;
pub mod unpack;

/// The shared skip rule for tests (`tests/support/skip.rs`), included once for the crate: a
/// module's tests `use crate::skip;` (including the file again trips clippy's `duplicate_mod`).
#[cfg(test)]
#[path = "../../tests/support/skip.rs"]
mod skip;
