//! Which test-only parts this build carries, as `rm-agent --version` says them. Test code is not
//! part of the product: a default build (`cargo build -p rm-agent`, `cargo install --path agent`)
//! has neither, and prints the bare version. The cargo features (agent/Cargo.toml):
//!
//! - `demo`: `rm-agent demo`'s embedded simulated GitHub and fake-runner mode
//!   ([`crate::commands::demo`]);
//! - `fault-injection`: the crash points `RM_FAULT_CRASH_AT` trips ([`crate::executor::fault`]).
//!
//! The end-to-end tests enable both (tests/e2e's Cargo.toml) and read this line to refuse, with
//! the build command, an agent built without what they need rather than wait for it in vain.

/// `rm-agent --version`'s text after the name: the version, then the features if any.
#[cfg(all(feature = "demo", feature = "fault-injection"))]
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (features: demo, fault-injection)"
);
#[cfg(all(feature = "demo", not(feature = "fault-injection")))]
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (features: demo)");
#[cfg(all(not(feature = "demo"), feature = "fault-injection"))]
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (features: fault-injection)");
#[cfg(not(any(feature = "demo", feature = "fault-injection")))]
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The features this build has, in [`VERSION`]'s order.
pub const ENABLED: &[&str] = &[
    #[cfg(feature = "demo")]
    "demo",
    #[cfg(feature = "fault-injection")]
    "fault-injection",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_names_exactly_the_enabled_features() {
        assert!(VERSION.starts_with(env!("CARGO_PKG_VERSION")), "{VERSION}");
        if ENABLED.is_empty() {
            assert_eq!(VERSION, env!("CARGO_PKG_VERSION"));
        } else {
            assert!(
                VERSION.ends_with(&format!(" (features: {})", ENABLED.join(", "))),
                "{VERSION}"
            );
        }
    }
}
