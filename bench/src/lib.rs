//! rm-bench: the receiver benchmark's load generator. Builds signed `workflow_job` deliveries from
//! the real fixtures ([`delivery`]) and drives a receiver with them over keep-alive connections
//! ([`load`]). `bench/receiver.sh` runs it against rm-agent and the Node receiver side by side;
//! docs/performance.md says what it measures and why. [`local`] holds what the benchmarks that
//! start real binaries (`runner-latency`, `relay-latency`, `cleanup-latency`) share, and
//! [`package`] the synthetic runner package shaped like an actions/runner release that
//! `runtime-create` and `runner-latency --compare-runtimes` make runtimes from. [`intake`] is
//! `receiver-load --intake`: the journals' intake (SQLite against PostgreSQL) without HTTP.
//! [`judge`] is `receiver-load --judge`: what judging a delivery costs, on the worker or off it.
//! [`fleet`] is `runner-latency --compare-fleet`: runner starts per second of a fleet, one host
//! against three.

pub mod agent;
pub mod delivery;
pub mod fleet;
pub mod intake;
pub mod judge;
pub mod load;
pub mod local;
pub mod package;
/// The PostgreSQL server the intake benchmark starts (the tests' helper, shared by path).
#[path = "../../tests/support/postgres.rs"]
pub mod pg_server;
pub mod rng;
