//! `rm-agent run` end to end, through the real binary, the fake GitHub and the fake runner
//! package, and the command line around it (`cli`, `status`, `demo`, a receiver's crash modes in
//! `receiver_crash`). One test binary for all of them (each file a module), so the suite links
//! once; `rm-agent check` on a host (tests/check.rs) stays apart: it reads the host's state,
//! which these tests change while they run.

#![allow(clippy::unwrap_used, reason = "tests")]

mod cache;
mod cache_docker;
mod cli;
mod crash;
mod crashed_runner;
mod demo;
mod disk;
mod disk_full;
mod docker;
mod egress;
mod explain;
mod failures;
mod fitness;
mod fleet;
mod image;
mod image_failures;
mod isolation;
mod job_image_support;
mod latency;
mod lifecycle;
mod limits;
mod min_runners;
mod package;
mod poisoned;
mod polling;
mod receiver_crash;
mod relay;
mod scale_set;
mod scale_set_answers;
mod scale_set_capacity;
mod scale_set_enterprise;
mod shapes;
mod status;

#[path = "../../../support/busybox_image.rs"]
mod busybox_image;
#[path = "../../../support/job_image.rs"]
mod job_image;
#[path = "../../../support/npm.rs"]
mod npm;
/// A real PostgreSQL server for the fleet's tests (fleet.rs), shared with the journal's tests.
#[path = "../../../support/postgres.rs"]
mod pg_server;
#[path = "../../../support/runner_base.rs"]
mod runner_base;
#[path = "../../../support/skip.rs"]
mod skip;
