//! The fleet on PostgreSQL: many hosts claim jobs, renew leases and elect leaders in one
//! database, with the rules of `crate::fleet` applied under row locks so that no two hosts
//! ever both win. Every call is one READ COMMITTED transaction on this handle's connection.
//!
//! The order every call keeps: lock the rows a decision rests on, *then* read the server's clock
//! (`clock_timestamp()`, not the transaction's start time) in a later statement, then decide.
//! A lease judged expired is judged so while its row is locked, so a renewal of it either
//! commits before (and the judge sees it live) or waits, reads a later clock and finds it
//! expired too (and drops the old claims instead of reviving them).
//!
//! A claim:
//! 1. `FOR SHARE` on the claimant's own host row (its renewal waits until the claim is done);
//! 2. with a fleet-wide `max_runners`, the policy's advisory lock: claimers of one policy take
//!    turns, so each counts the claims the one before committed;
//! 3. the candidate job rows still `queued`, `FOR UPDATE SKIP LOCKED`: a row another claimer
//!    (or the intake writer) holds is skipped, not waited for;
//! 4. in a new statement, so in a snapshot taken after those locks were granted, the existing
//!    claims on the locked jobs and their hosts' rows (`FOR SHARE`): any claim made by a claimer
//!    that held one of these job rows before was committed when it let go, so it is seen here;
//! 5. the clock; then the pure decision (`crate::fleet::choose`) and one upsert of the claims.
//!
//! Steps 1, 3 and 4 never wait on each other across claimers (share locks, skipped rows), and
//! the intake writer takes no lock of the fleet's, so claimers and writers do not deadlock.

use std::collections::HashSet;
use std::time::Duration;

use postgres::{Client, Transaction};

use super::tls::PgConnect;
use rm_vocab::{JobId, UnixMs};

use crate::JournalError;
use crate::fleet::{
    ClaimRequest, ClaimRow, ClaimView, Claimed, Fleet, FleetError, FleetView, HostInfo, HostRow,
    Lead, LeaderView, Lease, Renewal, SpendWindow, assemble, choose, expiry, json_names, lead,
    lease_live, longest_ms, renewal, room_after,
};

/// What the server is told a fleet connection is (`pg_stat_activity`).
const FLEET_APPLICATION: &str = "rm-journal-fleet";

/// The first key of the two-key advisory locks that serialise the claimers of one policy under
/// a fleet-wide `max_runners` (the second is the policy name's hash). Distinct from the
/// migration lock's single-key space; "rmcl" in ASCII.
const CLAIM_LOCK_SPACE: i32 = 0x726d_636c;

/// The first key of the two-key advisory locks that serialise the hosts reserving in one shared
/// window (the second is the scope's hash): each counts what the one before reserved. "rmsp".
const SPEND_LOCK_SPACE: i32 = 0x726d_7370;

/// The server's clock, in the journal's unit (ms since the Unix epoch).
const NOW_MS: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// The fleet's tables in the PostgreSQL journal, on a connection of its own. Its calls block:
/// make them off the async runtime (`spawn_blocking`, or a thread).
pub struct PgFleet {
    config: PgConnect,
    /// `None` after the connection was lost; the next call connects again.
    client: Option<Client>,
}

impl PgFleet {
    /// Connects to `url`; refuses a database this build has not migrated to its version (the
    /// journal's writer, [`crate::PgJournal::connect`], migrates).
    pub fn connect(url: &str) -> Result<PgFleet, JournalError> {
        let config = super::writer::config(url, FLEET_APPLICATION)?;
        let mut fleet = PgFleet {
            config,
            client: None,
        };
        fleet.client()?;
        Ok(fleet)
    }

    /// As [`PgFleet::connect`], to a configured target (its password from the environment).
    pub fn open(target: &super::PgTarget) -> Result<PgFleet, JournalError> {
        let mut fleet = PgFleet {
            config: target.client_config(FLEET_APPLICATION),
            client: None,
        };
        fleet.client()?;
        Ok(fleet)
    }

    /// The connection, made again if the last one was lost (a server restart).
    fn client(&mut self) -> Result<&mut Client, JournalError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            let mut client = self.config.connect()?;
            super::schema::require_current(&mut client)?;
            self.client = Some(client);
        }
        // Set just above when it was missing.
        self.client.as_mut().ok_or(JournalError::WriterStopped)
    }

    fn begin(&mut self) -> Result<Transaction<'_>, FleetError> {
        Ok(self.client()?.transaction()?)
    }
}

fn now_ms(tx: &mut Transaction<'_>) -> Result<UnixMs, postgres::Error> {
    Ok(UnixMs::new(tx.query_one(NOW_MS, &[])?.get(0)))
}

impl Fleet for PgFleet {
    fn renew_lease(&mut self, info: &HostInfo, ttl: Duration) -> Result<Lease, FleetError> {
        let mut tx = self.begin()?;
        let current: Option<i64> = tx
            .query_opt(
                "SELECT expires_at FROM hosts WHERE host = $1 FOR UPDATE",
                &[&info.host],
            )?
            .map(|row| row.get(0));
        let now = now_ms(&mut tx)?;
        let expires_at_ms = expiry(now, ttl);
        let (labels, policies) = (json_names(&info.labels), json_names(&info.policies));
        let renewal = match renewal(current.map(UnixMs::new), now) {
            Renewal::Renewed => {
                tx.execute(
                    "UPDATE hosts SET renewed_at = $2, expires_at = $3, labels = $4,
                         policies = $5
                     WHERE host = $1",
                    &[
                        &info.host,
                        &now.get(),
                        &expires_at_ms.get(),
                        &labels,
                        &policies,
                    ],
                )?;
                Renewal::Renewed
            }
            fresh => {
                // A claimer that took one of these jobs over rewrote its row's host first
                // (under the lock on our host row), so only the claims nobody took are here.
                let dropped = tx.execute("DELETE FROM claims WHERE host = $1", &[&info.host])?;
                tx.execute(
                    "INSERT INTO hosts (host, registered_at, renewed_at, expires_at, labels,
                         policies)
                     VALUES ($1, $2, $2, $3, $4, $5)
                     ON CONFLICT (host) DO UPDATE SET registered_at = excluded.registered_at,
                         renewed_at = excluded.renewed_at, expires_at = excluded.expires_at,
                         labels = excluded.labels, policies = excluded.policies",
                    &[
                        &info.host,
                        &now.get(),
                        &expires_at_ms.get(),
                        &labels,
                        &policies,
                    ],
                )?;
                match fresh {
                    Renewal::Reacquired { .. } => Renewal::Reacquired {
                        dropped_claims: dropped,
                    },
                    other => other,
                }
            }
        };
        tx.execute(
            "DELETE FROM claims c WHERE c.host = $1 AND NOT EXISTS
                 (SELECT 1 FROM jobs j WHERE j.job_id = c.job_id AND j.state <> 'completed')",
            &[&info.host],
        )?;
        tx.commit()?;
        Ok(Lease {
            renewal,
            expires_at_ms,
        })
    }

    fn leave(&mut self, host: &str) -> Result<(), FleetError> {
        let mut tx = self.begin()?;
        // The host row first: claimers judging this host wait, then see no host.
        tx.execute("SELECT 1 FROM hosts WHERE host = $1 FOR UPDATE", &[&host])?;
        tx.execute("DELETE FROM claims WHERE host = $1", &[&host])?;
        tx.execute("DELETE FROM leaders WHERE host = $1", &[&host])?;
        tx.execute("DELETE FROM hosts WHERE host = $1", &[&host])?;
        tx.commit()?;
        Ok(())
    }

    fn claim(&mut self, request: &ClaimRequest<'_>) -> Result<Claimed, FleetError> {
        let mut tx = self.begin()?;
        // 1. Our lease, held still until we commit.
        let own: Option<i64> = tx
            .query_opt(
                "SELECT expires_at FROM hosts WHERE host = $1 FOR SHARE",
                &[&request.host],
            )?
            .map(|row| row.get(0));
        // 2. One claimer of this policy at a time when the fleet counts its claims.
        if request.max_runners.is_some() {
            tx.execute(
                "SELECT pg_advisory_xact_lock($1, hashtext($2))",
                &[&CLAIM_LOCK_SPACE, &request.policy],
            )?;
        }
        // 3. The candidates still queued that no other claimer is deciding about right now.
        let locked: Vec<i64> = tx
            .query(
                "SELECT job_id FROM jobs WHERE job_id = ANY($1) AND state = 'queued'
                 ORDER BY job_id FOR UPDATE SKIP LOCKED",
                &[&super::job_numbers(request.job_ids)],
            )?
            .iter()
            .map(|row| row.get(0))
            .collect();
        // 4. A fresh snapshot: the claims on them, their hosts' leases held still.
        let held: Vec<(i64, i64)> = tx
            .query(
                "SELECT c.job_id, h.expires_at FROM claims c JOIN hosts h ON h.host = c.host
                 WHERE c.job_id = ANY($1) ORDER BY h.host FOR SHARE OF h",
                &[&locked],
            )?
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect();
        // 5. The clock, after every lock the decision rests on.
        let now = now_ms(&mut tx)?;
        if !own.is_some_and(|expires| lease_live(UnixMs::new(expires), now)) {
            return Err(FleetError::LeaseExpired {
                host: request.host.to_owned(),
            });
        }
        let taken: HashSet<i64> = held
            .iter()
            .filter(|(_, expires)| lease_live(UnixMs::new(*expires), now))
            .map(|(job_id, _)| *job_id)
            .collect();
        let free: HashSet<JobId> = locked
            .into_iter()
            .filter(|id| !taken.contains(id))
            .map(JobId::new)
            .collect();
        let live = match request.max_runners {
            None => 0,
            Some(_) => tx
                .query(
                    "SELECT h.expires_at FROM claims c
                     JOIN hosts h ON h.host = c.host
                     JOIN jobs j ON j.job_id = c.job_id
                     WHERE c.policy = $1 AND j.state <> 'completed'",
                    &[&request.policy],
                )?
                .iter()
                .filter(|row| lease_live(UnixMs::new(row.get(0)), now))
                .count(),
        };
        let (job_ids, at_ceiling) = choose(request.job_ids, &free, live, request.max_runners);
        if !job_ids.is_empty() {
            tx.execute(
                "INSERT INTO claims (job_id, host, policy, runner_name, claimed_at)
                 SELECT job_id, $2, $3, NULL, $4 FROM unnest($1::bigint[]) AS job_id
                 ON CONFLICT (job_id) DO UPDATE SET host = excluded.host,
                     policy = excluded.policy, runner_name = NULL,
                     claimed_at = excluded.claimed_at",
                &[
                    &super::job_numbers(&job_ids),
                    &request.host,
                    &request.policy,
                    &now.get(),
                ],
            )?;
        }
        tx.commit()?;
        Ok(Claimed {
            job_ids,
            at_ceiling,
        })
    }

    fn name_runner(
        &mut self,
        host: &str,
        job_id: JobId,
        runner_name: &str,
    ) -> Result<bool, FleetError> {
        let changed = self.client()?.execute(
            "UPDATE claims SET runner_name = $3 WHERE job_id = $2 AND host = $1",
            &[&host, &job_id.get(), &runner_name],
        )?;
        Ok(changed == 1)
    }

    fn release(&mut self, host: &str, job_id: JobId) -> Result<bool, FleetError> {
        let changed = self.client()?.execute(
            "DELETE FROM claims WHERE job_id = $2 AND host = $1",
            &[&host, &job_id.get()],
        )?;
        Ok(changed == 1)
    }

    fn try_lead(&mut self, role: &str, host: &str, ttl: Duration) -> Result<bool, FleetError> {
        let mut tx = self.begin()?;
        // A role nobody has led yet: the first insert wins; a concurrent one waits for it to
        // commit and then does nothing. Its clock is read before that wait, which can only
        // make the lease it writes end sooner.
        let now = now_ms(&mut tx)?;
        let inserted = tx.execute(
            "INSERT INTO leaders (role, host, acquired_at, renewed_at, expires_at)
             VALUES ($1, $2, $3, $3, $4) ON CONFLICT (role) DO NOTHING",
            &[&role, &host, &now.get(), &expiry(now, ttl).get()],
        )?;
        if inserted == 1 {
            tx.commit()?;
            return Ok(true);
        }
        let current: Option<(String, i64)> = tx
            .query_opt(
                "SELECT host, expires_at FROM leaders WHERE role = $1 FOR UPDATE",
                &[&role],
            )?
            .map(|row| (row.get(0), row.get(1)));
        let now = now_ms(&mut tx)?;
        let expires = expiry(now, ttl);
        let decision = lead(
            current.as_ref().map(|(h, e)| (h.as_str(), UnixMs::new(*e))),
            host,
            now,
        );
        let leads = match decision {
            // Resigned between the insert and the lock: whoever inserts first leads.
            Lead::Take if current.is_none() => {
                tx.execute(
                    "INSERT INTO leaders (role, host, acquired_at, renewed_at, expires_at)
                     VALUES ($1, $2, $3, $3, $4) ON CONFLICT (role) DO NOTHING",
                    &[&role, &host, &now.get(), &expires.get()],
                )? == 1
            }
            Lead::Take => {
                tx.execute(
                    "UPDATE leaders SET host = $2, acquired_at = $3, renewed_at = $3,
                         expires_at = $4
                     WHERE role = $1",
                    &[&role, &host, &now.get(), &expires.get()],
                )?;
                true
            }
            Lead::Renew => {
                tx.execute(
                    "UPDATE leaders SET renewed_at = $2, expires_at = $3 WHERE role = $1",
                    &[&role, &now.get(), &expires.get()],
                )?;
                true
            }
            Lead::Refuse => false,
        };
        tx.commit()?;
        Ok(leads)
    }

    fn resign(&mut self, role: &str, host: &str) -> Result<bool, FleetError> {
        let changed = self.client()?.execute(
            "DELETE FROM leaders WHERE role = $1 AND host = $2",
            &[&role, &host],
        )?;
        Ok(changed == 1)
    }

    fn reserve(
        &mut self,
        scope: &str,
        host: &str,
        windows: &[SpendWindow],
    ) -> Result<Option<Duration>, FleetError> {
        let mut tx = self.begin()?;
        // One host at a time per scope, so each counts what the one before committed; the
        // clock is read after the lock is granted.
        tx.execute(
            "SELECT pg_advisory_xact_lock($1, hashtext($2))",
            &[&SPEND_LOCK_SPACE, &scope],
        )?;
        let now = now_ms(&mut tx)?;
        tx.execute(
            "DELETE FROM spends WHERE scope = $1 AND sent_at <= $2",
            &[&scope, &now.get().saturating_sub(longest_ms(windows))],
        )?;
        let sent: Vec<i64> = tx
            .query(
                "SELECT sent_at FROM spends WHERE scope = $1 ORDER BY sent_at",
                &[&scope],
            )?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let wait = room_after(&sent, now.get(), windows);
        if wait.is_none() {
            tx.execute(
                "INSERT INTO spends (scope, sent_at, host) VALUES ($1, $2, $3)",
                &[&scope, &now.get(), &host],
            )?;
        }
        tx.commit()?;
        Ok(wait)
    }

    fn view(&mut self) -> Result<FleetView, FleetError> {
        // One snapshot for the three tables and the clock.
        let mut tx = self
            .client()?
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()?;
        let now = now_ms(&mut tx)?;
        let hosts = tx
            .query(
                "SELECT host, registered_at, renewed_at, expires_at, labels, policies
                 FROM hosts ORDER BY host",
                &[],
            )?
            .iter()
            .map(|row| HostRow {
                host: row.get(0),
                registered_at_ms: UnixMs::new(row.get(1)),
                renewed_at_ms: UnixMs::new(row.get(2)),
                expires_at_ms: UnixMs::new(row.get(3)),
                labels: row.get(4),
                policies: row.get(5),
            })
            .collect();
        let claims = tx
            .query(
                "SELECT c.host, c.job_id, c.policy, c.runner_name, c.claimed_at, j.state
                 FROM claims c JOIN jobs j ON j.job_id = c.job_id
                 ORDER BY c.host, c.claimed_at, c.job_id",
                &[],
            )?
            .iter()
            .map(|row| ClaimRow {
                host: row.get(0),
                view: ClaimView {
                    job_id: JobId::new(row.get(1)),
                    policy: row.get(2),
                    runner_name: row.get(3),
                    claimed_at_ms: UnixMs::new(row.get(4)),
                    job_state: crate::types::stored_job_state(row.get(5)),
                },
            })
            .collect();
        let leaders = tx
            .query(
                "SELECT role, host, acquired_at, renewed_at, expires_at FROM leaders
                 ORDER BY role",
                &[],
            )?
            .iter()
            .map(|row| LeaderView {
                role: row.get(0),
                host: row.get(1),
                acquired_at_ms: UnixMs::new(row.get(2)),
                renewed_at_ms: UnixMs::new(row.get(3)),
                expires_at_ms: UnixMs::new(row.get(4)),
            })
            .collect();
        tx.commit()?;
        Ok(assemble(now, hosts, claims, leaders))
    }
}
