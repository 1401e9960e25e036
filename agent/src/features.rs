//! Which optional parts this build carries, as `rm-agent --version` says them. A default build
//! (`cargo build -p rm-agent`, `cargo install --path agent`) has none, and prints the bare
//! version. The cargo features (agent/Cargo.toml):
//!
//! - `fleet`: the journal a fleet shares on PostgreSQL (`journal.url`, CONTRACT §9); without
//!   it a `journal.url` is refused, naming the build that takes one;
//! - `demo` (test code): `rm-agent demo`'s embedded simulated GitHub and fake-runner mode
//!   ([`crate::commands::demo`]);
//! - `fault-injection` (test code): the crash points `RM_FAULT_CRASH_AT` trips
//!   ([`crate::executor::fault`]).
//!
//! The end-to-end tests enable all three (tests/e2e's Cargo.toml) and read this line to refuse,
//! with the build command, an agent built without what they need rather than wait for it in
//! vain.

use std::sync::LazyLock;

/// The features this build has, in the order `--version` names them.
pub const ENABLED: &[&str] = &[
    #[cfg(feature = "demo")]
    "demo",
    #[cfg(feature = "fault-injection")]
    "fault-injection",
    #[cfg(feature = "fleet")]
    "fleet",
];

/// `rm-agent --version`'s text after the name: the version, then the features if any
/// (`0.1.0 (features: demo, fault-injection, fleet)`).
pub fn version() -> &'static str {
    static VERSION: LazyLock<String> = LazyLock::new(|| match ENABLED {
        [] => env!("CARGO_PKG_VERSION").to_owned(),
        enabled => format!(
            "{} (features: {})",
            env!("CARGO_PKG_VERSION"),
            enabled.join(", ")
        ),
    });
    &VERSION
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_names_exactly_the_enabled_features() {
        let version = version();
        assert!(version.starts_with(env!("CARGO_PKG_VERSION")), "{version}");
        if ENABLED.is_empty() {
            assert_eq!(version, env!("CARGO_PKG_VERSION"));
        } else {
            assert!(
                version.ends_with(&format!(" (features: {})", ENABLED.join(", "))),
                "{version}"
            );
        }
        // The agent's own tests build it with `fleet` (its dev-dependency on itself).
        assert!(ENABLED.contains(&"fleet"), "{version}");
    }
}
