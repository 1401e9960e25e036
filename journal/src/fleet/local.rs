//! The fleet on the SQLite journal: one host, the same rules as on PostgreSQL (`super`'s pure
//! functions), so an agent without a shared database behaves as a fleet of one and the same
//! tests hold for both. Every call is one `BEGIN IMMEDIATE` transaction: SQLite serialises the
//! writers of the file, so no two claims (even from two connections) interleave. "Now" is this
//! host's clock ([`crate::now_ms`]): no other host reads these leases.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use rm_vocab::{JobId, UnixMs};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::{
    ClaimRequest, ClaimRow, ClaimView, Claimed, Fleet, FleetError, FleetView, HostInfo, HostRow,
    Lead, LeaderView, Lease, Renewal, SpendWindow, assemble, choose, expiry, json_names, lead,
    lease_live, longest_ms, renewal, room_after,
};
use crate::{JournalError, connection};

/// The fleet's tables in the SQLite journal. Not shared between threads: wrap it in a mutex.
pub struct LocalFleet {
    conn: Connection,
}

impl LocalFleet {
    /// Opens (creating and migrating if needed) the journal at `path`.
    pub fn open(path: &Path) -> Result<LocalFleet, JournalError> {
        Ok(LocalFleet {
            conn: connection::open_writer(path)?,
        })
    }

    fn begin(&mut self) -> rusqlite::Result<rusqlite::Transaction<'_>> {
        self.conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
    }
}

impl Fleet for LocalFleet {
    fn renew_lease(&mut self, info: &HostInfo, ttl: Duration) -> Result<Lease, FleetError> {
        let tx = self.begin()?;
        let current: Option<i64> = tx
            .query_row(
                "SELECT expires_at FROM hosts WHERE host = ?1",
                [&info.host],
                |row| row.get(0),
            )
            .optional()?;
        let now = rm_vocab::now();
        let expires_at_ms = expiry(now, ttl);
        let (labels, policies) = (json_names(&info.labels), json_names(&info.policies));
        let renewal = match renewal(current.map(UnixMs::new), now) {
            Renewal::Renewed => {
                tx.execute(
                    "UPDATE hosts SET renewed_at = ?2, expires_at = ?3, labels = ?4,
                         policies = ?5
                     WHERE host = ?1",
                    params![info.host, now, expires_at_ms, labels, policies],
                )?;
                Renewal::Renewed
            }
            fresh => {
                let dropped = tx.execute("DELETE FROM claims WHERE host = ?1", [&info.host])?;
                tx.execute(
                    "INSERT INTO hosts (host, registered_at, renewed_at, expires_at, labels,
                         policies)
                     VALUES (?1, ?2, ?2, ?3, ?4, ?5)
                     ON CONFLICT (host) DO UPDATE SET registered_at = excluded.registered_at,
                         renewed_at = excluded.renewed_at, expires_at = excluded.expires_at,
                         labels = excluded.labels, policies = excluded.policies",
                    params![info.host, now, expires_at_ms, labels, policies],
                )?;
                match fresh {
                    Renewal::Reacquired { .. } => Renewal::Reacquired {
                        dropped_claims: dropped as u64,
                    },
                    other => other,
                }
            }
        };
        tx.execute(
            "DELETE FROM claims WHERE host = ?1 AND job_id NOT IN
                 (SELECT job_id FROM jobs WHERE state != 'completed')",
            [&info.host],
        )?;
        tx.commit()?;
        Ok(Lease {
            renewal,
            expires_at_ms,
        })
    }

    fn leave(&mut self, host: &str) -> Result<(), FleetError> {
        let tx = self.begin()?;
        tx.execute("DELETE FROM claims WHERE host = ?1", [host])?;
        tx.execute("DELETE FROM leaders WHERE host = ?1", [host])?;
        tx.execute("DELETE FROM hosts WHERE host = ?1", [host])?;
        tx.commit()?;
        Ok(())
    }

    fn claim(&mut self, request: &ClaimRequest<'_>) -> Result<Claimed, FleetError> {
        let tx = self.begin()?;
        let now = rm_vocab::now();
        let own: Option<i64> = tx
            .query_row(
                "SELECT expires_at FROM hosts WHERE host = ?1",
                [request.host],
                |row| row.get(0),
            )
            .optional()?;
        if !own.is_some_and(|expires| lease_live(UnixMs::new(expires), now)) {
            return Err(FleetError::LeaseExpired {
                host: request.host.to_owned(),
            });
        }
        let mut free = HashSet::new();
        {
            let mut queued =
                tx.prepare_cached("SELECT 1 FROM jobs WHERE job_id = ?1 AND state = 'queued'")?;
            let mut holder = tx.prepare_cached(
                "SELECT h.expires_at FROM claims c JOIN hosts h ON h.host = c.host
                 WHERE c.job_id = ?1",
            )?;
            for &job_id in request.job_ids {
                if !queued.exists([job_id])? {
                    continue;
                }
                let held: Option<i64> = holder.query_row([job_id], |r| r.get(0)).optional()?;
                if !held.is_some_and(|expires| lease_live(UnixMs::new(expires), now)) {
                    free.insert(job_id);
                }
            }
        }
        let live = match request.max_runners {
            None => 0,
            Some(_) => {
                let mut stmt = tx.prepare_cached(
                    "SELECT h.expires_at FROM claims c
                     JOIN hosts h ON h.host = c.host
                     JOIN jobs j ON j.job_id = c.job_id
                     WHERE c.policy = ?1 AND j.state != 'completed'",
                )?;
                let expiries = stmt.query_map([request.policy], |row| row.get::<_, i64>(0))?;
                let mut live = 0;
                for expires in expiries {
                    if lease_live(UnixMs::new(expires?), now) {
                        live += 1;
                    }
                }
                live
            }
        };
        let (job_ids, at_ceiling) = choose(request.job_ids, &free, live, request.max_runners);
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO claims (job_id, host, policy, runner_name, claimed_at)
                 VALUES (?1, ?2, ?3, NULL, ?4)
                 ON CONFLICT (job_id) DO UPDATE SET host = excluded.host,
                     policy = excluded.policy, runner_name = NULL,
                     claimed_at = excluded.claimed_at",
            )?;
            for job_id in &job_ids {
                insert.execute(params![job_id, request.host, request.policy, now])?;
            }
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
        let changed = self.conn.execute(
            "UPDATE claims SET runner_name = ?3 WHERE job_id = ?2 AND host = ?1",
            params![host, job_id, runner_name],
        )?;
        Ok(changed == 1)
    }

    fn release(&mut self, host: &str, job_id: JobId) -> Result<bool, FleetError> {
        let changed = self.conn.execute(
            "DELETE FROM claims WHERE job_id = ?2 AND host = ?1",
            params![host, job_id],
        )?;
        Ok(changed == 1)
    }

    fn try_lead(&mut self, role: &str, host: &str, ttl: Duration) -> Result<bool, FleetError> {
        let tx = self.begin()?;
        let current: Option<(String, i64)> = tx
            .query_row(
                "SELECT host, expires_at FROM leaders WHERE role = ?1",
                [role],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()?;
        let now = rm_vocab::now();
        let expires = expiry(now, ttl);
        let decision = lead(
            current.as_ref().map(|(h, e)| (h.as_str(), UnixMs::new(*e))),
            host,
            now,
        );
        match decision {
            Lead::Take => {
                tx.execute(
                    "INSERT INTO leaders (role, host, acquired_at, renewed_at, expires_at)
                     VALUES (?1, ?2, ?3, ?3, ?4)
                     ON CONFLICT (role) DO UPDATE SET host = excluded.host,
                         acquired_at = excluded.acquired_at, renewed_at = excluded.renewed_at,
                         expires_at = excluded.expires_at",
                    params![role, host, now, expires],
                )?;
            }
            Lead::Renew => {
                tx.execute(
                    "UPDATE leaders SET renewed_at = ?2, expires_at = ?3 WHERE role = ?1",
                    params![role, now, expires],
                )?;
            }
            Lead::Refuse => {}
        }
        tx.commit()?;
        Ok(decision != Lead::Refuse)
    }

    fn resign(&mut self, role: &str, host: &str) -> Result<bool, FleetError> {
        let changed = self.conn.execute(
            "DELETE FROM leaders WHERE role = ?1 AND host = ?2",
            params![role, host],
        )?;
        Ok(changed == 1)
    }

    fn reserve(
        &mut self,
        scope: &str,
        host: &str,
        windows: &[SpendWindow],
    ) -> Result<Option<Duration>, FleetError> {
        let tx = self.begin()?;
        let now = rm_vocab::now();
        tx.execute(
            "DELETE FROM spends WHERE scope = ?1 AND sent_at <= ?2",
            params![scope, now.get().saturating_sub(longest_ms(windows))],
        )?;
        let sent: Vec<i64> = tx
            .prepare("SELECT sent_at FROM spends WHERE scope = ?1 ORDER BY sent_at")?
            .query_map([scope], |row| row.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        let wait = room_after(&sent, now.get(), windows);
        if wait.is_none() {
            tx.execute(
                "INSERT INTO spends (scope, sent_at, host) VALUES (?1, ?2, ?3)",
                params![scope, now, host],
            )?;
        }
        tx.commit()?;
        Ok(wait)
    }

    fn view(&mut self) -> Result<FleetView, FleetError> {
        // A deferred transaction: one consistent snapshot of the three tables.
        let tx = self.conn.transaction()?;
        let now = rm_vocab::now();
        let hosts = tx
            .prepare(
                "SELECT host, registered_at, renewed_at, expires_at, labels, policies
                 FROM hosts ORDER BY host",
            )?
            .query_map([], |row| {
                Ok(HostRow {
                    host: row.get(0)?,
                    registered_at_ms: row.get(1)?,
                    renewed_at_ms: row.get(2)?,
                    expires_at_ms: row.get(3)?,
                    labels: row.get(4)?,
                    policies: row.get(5)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        let claims = tx
            .prepare(
                "SELECT c.host, c.job_id, c.policy, c.runner_name, c.claimed_at, j.state
                 FROM claims c JOIN jobs j ON j.job_id = c.job_id
                 ORDER BY c.host, c.claimed_at, c.job_id",
            )?
            .query_map([], |row| {
                Ok(ClaimRow {
                    host: row.get(0)?,
                    view: ClaimView {
                        job_id: row.get(1)?,
                        policy: row.get(2)?,
                        runner_name: row.get(3)?,
                        claimed_at_ms: row.get(4)?,
                        job_state: crate::types::stored_job_state(&row.get::<_, String>(5)?),
                    },
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        let leaders = tx
            .prepare(
                "SELECT role, host, acquired_at, renewed_at, expires_at FROM leaders
                 ORDER BY role",
            )?
            .query_map([], |row| {
                Ok(LeaderView {
                    role: row.get(0)?,
                    host: row.get(1)?,
                    acquired_at_ms: row.get(2)?,
                    renewed_at_ms: row.get(3)?,
                    expires_at_ms: row.get(4)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        tx.commit()?;
        Ok(assemble(now, hosts, claims, leaders))
    }
}
