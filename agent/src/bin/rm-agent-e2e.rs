//! `rm-agent-e2e`: `rm-agent`'s own command line (`src/main.rs`, compiled in here unchanged)
//! in a binary that exists only in builds with the test features `demo` and `fault-injection`
//! (agent/Cargo.toml's `required-features`). The end-to-end tests run it, so a featureless build
//! of the product (`cargo build -p rm-agent`, `cargo test -p rm-agent`) never replaces the binary
//! they drive, and `cargo install --path agent` never installs it.

#[path = "../main.rs"]
mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
