//! Whether the way this host logs in to the fleet's PostgreSQL journal (CONTRACT §9) keeps the
//! jobs it runs out of it. rm cannot read the server's `pg_hba.conf`; what it can see is whether
//! it sends a password, whether it connects over TCP or a unix socket, and what TLS checks. A
//! server that lets this host in without a password over TCP (`trust`) lets in whoever else
//! reaches it the same way, and a job reaches it: from its own network namespace through the
//! host's NAT (the server sees the host's address), or on loopback under `host.network =
//! "host"`. Such a job connects as the fleet's role and can take every host's claims and leases.
//! A unix socket is no different to rm: the server could tell the uids apart (`peer`), but rm
//! cannot see that it does, and under `local ... trust` a job that reaches the socket got in as
//! the fleet's role (tried: a fleet's socket under `/run`). So a passwordless login is refused
//! over either where isolated runners run.
//!
//! The decision is [`judge`], a pure function of [`Facts`]: `run` refuses (exit 2) what it says
//! to refuse and logs the warnings; `receive` runs no jobs and only warns.

use crate::config::{Config, Isolation};

/// Which command is starting: only `run` runs jobs on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// `rm-agent run`, its runners under `isolation`.
    Run(Isolation),
    /// `rm-agent receive`: deliveries only.
    Receive,
}

/// What rm can see of its login to the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Facts {
    /// Some host of `journal.url` is reached over TCP (a name, an address, `hostaddr`).
    pub over_tcp: bool,
    /// Every TCP host is this machine's loopback.
    pub loopback_only: bool,
    /// `RM_JOURNAL_PASSWORD` is set.
    pub password: bool,
    /// TLS checks the server's certificate (`verify-ca`, `verify-full`, or a root file).
    pub verified: bool,
    /// `sslmode` as written (`prefer` when none is).
    pub sslmode: &'static str,
}

impl Facts {
    pub(crate) fn of(target: &rm_journal::PgTarget) -> Facts {
        Facts {
            over_tcp: target.over_tcp(),
            loopback_only: target.loopback_only(),
            password: target.has_password(),
            verified: target.verifies_server(),
            sslmode: target.sslmode().as_str(),
        }
    }
}

/// One thing to say about the login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// `run` does not start (exit 2).
    Refuse(String),
    /// Logged at start; the command goes on.
    Warn(String),
}

/// Why a passwordless TCP login is dangerous, said once for every verdict that needs it.
const TRUST_OVER_TCP: &str = "the server then lets this host in on its address alone (`trust` in pg_hba.conf), and so it lets in a job of this host too (its traffic leaves through the host), as the fleet's role, able to take every host's claims and leases";

/// What to do instead of a passwordless TCP login.
const TCP_FIX: &str = "set RM_JOURNAL_PASSWORD in the agent's environment (the role's password, `scram-sha-256` on the role's `host`/`hostssl` line in pg_hba.conf, never `trust`)";

/// Why a passwordless login over a unix socket is refused too: what the server checks there is
/// invisible to rm, and `trust` is a common default for `local` lines.
const TRUST_OVER_SOCKET: &str = "rm cannot read pg_hba.conf to tell `peer` from `trust`, and under `trust` the server lets in whoever can open the socket, so a job of this host that can reach the socket's path logs in as the fleet's role, able to take every host's claims and leases";

/// What to do instead of a passwordless login over a unix socket.
const SOCKET_FIX: &str = "set RM_JOURNAL_PASSWORD in the agent's environment (the role's password) and make the role's `local` line in pg_hba.conf `scram-sha-256`, never `trust`";

/// The verdicts for `role` logging in as `facts` says, refusals first.
pub(crate) fn judge(role: Role, facts: Facts) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    let runs_jobs = matches!(role, Role::Run(_));
    let isolated = role == Role::Run(Isolation::User);
    match (facts.over_tcp, facts.password, role) {
        (true, false, Role::Run(Isolation::User)) => verdicts.push(Verdict::Refuse(format!(
            "connects over TCP without a password: {TRUST_OVER_TCP}; {TCP_FIX}"
        ))),
        (true, false, _) => verdicts.push(Verdict::Warn(format!(
            "connects over TCP without a password: the server must not let hosts in by address (`trust`), or {} connects as the fleet's role; {TCP_FIX}",
            if runs_jobs {
                "a job of this host"
            } else {
                "a job on any runner host that reaches it"
            }
        ))),
        (false, false, Role::Run(Isolation::User)) => verdicts.push(Verdict::Refuse(format!(
            "connects over a unix socket without a password: {TRUST_OVER_SOCKET}; {SOCKET_FIX}"
        ))),
        _ => {}
    }
    if runs_jobs && !isolated {
        verdicts.push(Verdict::Warn(
            "host.isolation = \"none\": jobs run as the agent's own user, so a job can log in to the fleet's journal whatever its authentication (it can read the agent's environment, RM_JOURNAL_PASSWORD included)".to_owned(),
        ));
    }
    if facts.over_tcp && !facts.loopback_only && !facts.verified {
        verdicts.push(Verdict::Warn(format!(
            "the server's certificate is not checked (sslmode={}): a machine on the path can pose as the server and read or change what the fleet writes; set sslmode=verify-full (and sslrootcert= to the CA file that signed the server's certificate)",
            facts.sslmode
        )));
    }
    verdicts
}

/// For `run`: the refusal (a usage error on `journal.url`, with its reason and fix), else the
/// warnings logged.
pub(crate) fn enforce(
    config: &Config,
    role: Role,
    target: &rm_journal::PgTarget,
) -> Result<(), crate::exit::Exit> {
    let mut refused = None;
    for verdict in judge(role, Facts::of(target)) {
        match verdict {
            Verdict::Refuse(why) => {
                refused.get_or_insert(why);
            }
            Verdict::Warn(why) => {
                tracing::warn!(journal = %target.describe(), "journal.url {why}");
            }
        }
    }
    match refused {
        Some(why) => Err(crate::exit::Exit::usage(format!(
            "{}: `journal.url` ({}) {why}",
            crate::config::display_file(config.source.as_deref()),
            target.describe()
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: Facts = Facts {
        over_tcp: true,
        loopback_only: false,
        password: false,
        verified: false,
        sslmode: "prefer",
    };
    const RUN: Role = Role::Run(Isolation::User);

    fn refused(verdicts: &[Verdict]) -> bool {
        verdicts.iter().any(|v| matches!(v, Verdict::Refuse(_)))
    }

    fn warnings(verdicts: &[Verdict]) -> Vec<&str> {
        verdicts
            .iter()
            .filter_map(|v| match v {
                Verdict::Warn(why) => Some(why.as_str()),
                Verdict::Refuse(_) => None,
            })
            .collect()
    }

    /// The facts of a real connection string, parsed as the agent parses `journal.url`.
    fn facts(url: &str, password: bool) -> Facts {
        let mut target = rm_journal::PgTarget::parse(url).unwrap();
        if password {
            target = target.with_password(secrecy::SecretString::from("pw"));
        }
        Facts::of(&target)
    }

    #[test]
    fn the_rule_over_connection_strings_roles_and_passwords() {
        // (url, password set, role, refused, warnings)
        let table: &[(&str, bool, Role, bool, usize)] = &[
            // TCP without a password: refused where isolated runners run, warned elsewhere.
            ("postgres://rm@127.0.0.1/rm", false, RUN, true, 0),
            ("postgres://rm@localhost:5433/rm", false, RUN, true, 0),
            (
                "host=db.example.net user=rm dbname=rm sslmode=verify-full",
                false,
                RUN,
                true,
                0,
            ),
            (
                "host=/run/postgresql hostaddr=10.0.0.5 user=rm",
                false,
                RUN,
                true,
                1,
            ),
            ("postgres://rm@127.0.0.1/rm", false, Role::Receive, false, 1),
            // Over TCP to another host, unverified: also the TLS warning.
            (
                "postgres://rm@db.example.net/rm",
                false,
                Role::Receive,
                false,
                2,
            ),
            (
                "postgres://rm@127.0.0.1/rm",
                false,
                Role::Run(Isolation::None),
                false,
                2,
            ),
            // A password from the environment: taken; TLS unchecked off this host is warned.
            ("postgres://rm@127.0.0.1/rm", true, RUN, false, 0),
            (
                "postgres://rm@db.example.net/rm?sslmode=require",
                true,
                RUN,
                false,
                1,
            ),
            (
                "postgres://rm@db.example.net/rm?sslmode=verify-full",
                true,
                RUN,
                false,
                0,
            ),
            (
                "postgres://rm@db.example.net/rm?sslmode=verify-ca",
                true,
                Role::Receive,
                false,
                0,
            ),
            (
                "postgres://rm@db.example.net/rm?sslmode=disable",
                true,
                Role::Receive,
                false,
                1,
            ),
            // A unix socket without a password: refused as TCP is (rm cannot tell `peer` from
            // `trust`); a receiver runs no jobs, and under `none` the isolation warning says it.
            (
                "host=/var/run/postgresql user=rm dbname=rm",
                false,
                RUN,
                true,
                0,
            ),
            ("postgresql:///rm?host=/run/postgresql", false, RUN, true, 0),
            (
                "host=/var/run/postgresql user=rm dbname=rm",
                false,
                Role::Receive,
                false,
                0,
            ),
            (
                "host=/var/run/postgresql user=rm dbname=rm",
                true,
                RUN,
                false,
                0,
            ),
            (
                "host=/var/run/postgresql user=rm",
                false,
                Role::Run(Isolation::None),
                false,
                1,
            ),
        ];
        for (url, password, role, refuse, warned) in table {
            let verdicts = judge(*role, facts(url, *password));
            assert_eq!(refused(&verdicts), *refuse, "{url} {role:?}: {verdicts:?}");
            assert_eq!(
                warnings(&verdicts).len(),
                *warned,
                "{url} password={password} {role:?}: {verdicts:?}"
            );
        }
    }

    #[test]
    fn a_refusal_says_why_and_the_fix() {
        let socket = Facts {
            over_tcp: false,
            loopback_only: true,
            ..TCP
        };
        for (facts, over, because) in [
            (TCP, "over TCP", "address alone"),
            (socket, "over a unix socket", "cannot read pg_hba.conf"),
        ] {
            let verdicts = judge(RUN, facts);
            let Some(Verdict::Refuse(why)) = verdicts.first() else {
                panic!("{verdicts:?}")
            };
            for says in [
                over,
                "without a password",
                because,
                "`trust`",
                "RM_JOURNAL_PASSWORD",
                "scram-sha-256",
            ] {
                assert!(why.contains(says), "{says}: {why}");
            }
        }
    }

    #[test]
    fn a_password_or_tls_verification_alone_changes_only_its_own_verdict() {
        let with_password = judge(
            RUN,
            Facts {
                password: true,
                ..TCP
            },
        );
        assert!(!refused(&with_password));
        assert_eq!(warnings(&with_password).len(), 1, "{with_password:?}");
        let verified = judge(
            RUN,
            Facts {
                verified: true,
                ..TCP
            },
        );
        assert!(refused(&verified), "TLS does not authenticate the client");
    }
}
