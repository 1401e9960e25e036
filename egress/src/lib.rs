//! rm-egress: egress by name (`policy.egress`, issue 41). A policy says which names, `*.`
//! wildcards and networks its jobs may reach ([`allow`]); every runner's DNS is rewritten
//! inside its own network namespace to one resolver the agent runs per host ([`resolver`]),
//! which tells each runner by its namespace address, answers allowed names from the host's
//! upstream and refuses the rest, and puts each answer's addresses into that runner's
//! allowed set in its nftables table for the answer's TTL (bounded). What each runner asked
//! for and reached is kept per attempt ([`record`]). DNS messages are read and written by
//! [`dns`], bounded and without trusting a byte of them.
//!
//! The crate knows nothing of policies' other keys, the journal or the agent's loop: the
//! agent registers each runner with the resolver before it starts, flushes its records to the
//! journal and unregisters it at cleanup; the firewall is a trait ([`resolver::Firewall`])
//! that `rm-runner`'s network implements with `nft`.

pub mod allow;
pub mod dns;
pub mod record;
pub mod resolver;
