//! rm-github: everything rm says to GitHub's REST API.
//!
//! It owns the App JWT and the installation tokens ([`auth`]), the request budget shared by
//! every caller in the process ([`budget`]), conditional requests ([`etag`]), the error classes
//! callers act on ([`error`]), the transport ([`client`]) and the endpoints on it (`endpoints`,
//! methods of [`GithubClient`]), and the Actions service of runner scale sets ([`scaleset`]).
//! It knows nothing about policies, the journal or runners' processes. It reads the time of day from an `rm_vocab::Clock` (tests pass a `ManualClock`),
//! and its job and runner types hold `rm_vocab`'s ids.
//!
//! ```no_run
//! # async fn demo(pem: secrecy::SecretString) -> anyhow::Result<()> {
//! use rm_github::{ClientConfig, GithubClient, Target, types::JitRequest};
//! let client = GithubClient::new(ClientConfig::new("https://api.github.com", 123456, pem))?;
//! let target: Target = "acme".parse()?;
//! let jit = client
//!     .generate_jitconfig(&target, &JitRequest {
//!         name: "rm-builder-01-0123456789ab".into(),
//!         runner_group_id: 1,
//!         labels: vec!["self-hosted".into(), "linux".into()],
//!         work_folder: "_work".into(),
//!     })
//!     .await?;
//! # let _ = jit; Ok(()) }
//! ```

pub mod archives;
pub mod auth;
pub mod budget;
pub mod client;
mod endpoints;
pub mod error;
pub mod etag;
pub mod https;
pub mod pacing;
pub mod scaleset;
pub mod stats;
pub mod target;
pub mod types;
pub mod wire;

pub use archives::ArchiveError;
pub use auth::AppCredentials;
pub use budget::{BudgetSnapshot, PacingSnapshot, Scope};
pub use client::{AppKey, ClientConfig, GithubClient, Polled};
pub use error::{GithubError, LimitKind, RerunError};
pub use target::Target;
