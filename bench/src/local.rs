//! What the benchmarks that start real binaries share: finding a binary built next to the
//! benchmark, and a free loopback port.

use std::path::PathBuf;

use anyhow::{Context as _, Result, ensure};

/// The command that builds every binary the process benchmarks start.
pub const BUILD: &str =
    "cargo build --release -p rm-agent -p rm-relay -p rm-fake-runner -p rm-bench";

/// The binary `name` in the directory of the running benchmark.
pub fn sibling(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe.parent().context("no directory")?.join(name);
    ensure!(path.is_file(), "{} is missing: `{BUILD}`", path.display());
    Ok(path)
}

/// A port on loopback that was free a moment ago.
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
