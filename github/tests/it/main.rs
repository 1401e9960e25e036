//! The client against the fake GitHub, in one test binary: endpoints, credentials, several Apps, the budget,
//! and conformance of both sides to GitHub's own description.

mod apps;
mod archives;
mod common;
mod conformance;
mod credentials;
mod endpoints;
mod fake_limits;
mod limits;
mod scaleset;
