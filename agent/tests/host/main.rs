//! The agent's adapters against the real host, one test binary (a binary per file would cost a
//! link each): runner processes and runtimes on a real filesystem, the fake runner against the
//! fake GitHub, desktop notifications over a real D-Bus, the deploy examples, and `[journal]
//! url` through the real binary on a real PostgreSQL server. Each module says what it shows.

#![allow(clippy::unwrap_used, reason = "tests")]

#[path = "../../../tests/support/busybox_image.rs"]
#[allow(dead_code, reason = "saved_image serves the end-to-end Docker tests")]
mod busybox_image;
#[path = "../../../tests/support/log_capture.rs"]
mod log_capture;
#[path = "../../../tests/support/postgres.rs"]
mod pg_server;
#[path = "../../../tests/support/runner_base.rs"]
mod runner_base;
#[path = "../../../tests/support/skip.rs"]
mod skip;

mod deploy_examples;
mod journal_url;
mod notify_dbus;
mod runner_docker;
mod runner_fake_runner;
mod runner_logs;
mod runner_process;
mod runner_workspace;
