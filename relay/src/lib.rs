//! rm-relay: the relay for runner hosts behind NAT (CONTRACT §6). It takes GitHub's webhook
//! deliveries on a public address, commits them to its own SQLite file before answering, and
//! streams them byte-exact to the hosts that connect outward with a per-host token, with ack and
//! replay; a smee-compatible form of the stream serves the unmodified `smee-client`.
//!
//! The protocol is documented in docs/relay.md; the modules split it as follows:
//! - [`ids`]: random channel ids and tokens, names, token digests (pure);
//! - [`sse`]: the exact bytes of every event on both stream forms (pure);
//! - [`retention`]: what is old enough to prune, and the prune step;
//! - [`limits`]: each channel's storage quota and ingest rate (pure decisions);
//! - [`store`] and [`schema`]: the SQLite file, its migrations and every query;
//! - [`state`]: the running relay's shared state and the answers handlers build;
//! - [`server`] (accept and route), `ingest`, `subscribe`, [`stream`] and [`metrics`]: the HTTP
//!   side, each depending on [`state`], none on another;
//! - [`commands`]: `serve` and `channel add|token|revoke`.

pub mod commands;
pub mod ids;
mod ingest;
pub mod limits;
pub mod metrics;
pub mod retention;
pub mod schema;
pub mod server;
pub mod sse;
pub mod state;
pub mod store;
pub mod stream;
mod subscribe;

/// GitHub does not deliver payloads over 25 MB, so anything larger is not from GitHub.
pub const MAX_BODY_BYTES: usize = 25 * 1024 * 1024;
