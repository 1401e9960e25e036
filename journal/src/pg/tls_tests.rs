//! TLS to a real PostgreSQL server (`tests/support/postgres.rs`, [`TlsServer`]): TCP on
//! 127.0.0.1 only over TLS (`hostssl`), a certificate for `localhost` signed by a test CA. What
//! each `sslmode` connects to, and what it says when it does not. One server for the whole test:
//! starting one is most of its cost.

use crate::PgTarget;
use crate::intake_tests::off_runtime;
use crate::pg_server::TlsServer;

/// Connects to the server as `url` says and answers whether the session is encrypted, or the
/// error's text.
fn session(url: &str) -> Result<bool, String> {
    let target = PgTarget::parse(url).map_err(|e| e.to_string())?;
    off_runtime(|| {
        let mut client = target
            .client_config("rm-tls-test")
            .connect()
            .map_err(|e| crate::pg::describe(&e))?;
        let row = client
            .query_one(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .map_err(|e| crate::pg::describe(&e))?;
        Ok(row.get::<_, bool>(0))
    })
}

#[test]
fn sslmodes_against_a_server_that_takes_tcp_only_over_tls() {
    const TEST: &str = "sslmodes_against_a_server_that_takes_tcp_only_over_tls";
    let server = match TlsServer::start("tls") {
        Ok(server) => server,
        Err(why) => {
            crate::skip::cannot_run(TEST, "postgres", &why);
            return;
        }
    };
    let port = server.port();
    let ca = server.ca();
    let other = server.other_ca();
    let url = |host: &str, tls: &str| format!("host={host} port={port} user=rm dbname=rm {tls}");

    // verify-full with the CA that signed the certificate, by the name it holds: encrypted.
    assert_eq!(
        session(&url(
            "localhost",
            &format!("sslmode=verify-full sslrootcert={}", ca.display())
        )),
        Ok(true)
    );
    // The same in URL form, the root file's path percent-encoded as a URL may hold it.
    let encoded = ca.display().to_string().replace('/', "%2F");
    assert_eq!(
        session(&format!(
            "postgres://rm@localhost:{port}/rm?sslmode=verify-full&sslrootcert={encoded}"
        )),
        Ok(true)
    );

    // Another CA: refused, saying what was checked and what to set.
    let wrong = session(&url(
        "localhost",
        &format!("sslmode=verify-full sslrootcert={}", other.display()),
    ))
    .unwrap_err();
    assert!(
        wrong.contains("not signed by a certificate authority of sslrootcert="),
        "{wrong}"
    );
    assert!(wrong.contains(&other.display().to_string()), "{wrong}");

    // The certificate names `localhost`, not the address: verify-full refuses the address,
    // verify-ca (the chain only) takes it.
    let by_address = session(&url(
        "127.0.0.1",
        &format!("sslmode=verify-full sslrootcert={}", ca.display()),
    ))
    .unwrap_err();
    assert!(
        by_address.contains("does not name the host `127.0.0.1`"),
        "{by_address}"
    );
    assert_eq!(
        session(&url(
            "127.0.0.1",
            &format!("sslmode=verify-ca sslrootcert={}", ca.display())
        )),
        Ok(true)
    );
    // verify-ca still checks the chain.
    assert!(
        session(&url(
            "127.0.0.1",
            &format!("sslmode=verify-ca sslrootcert={}", other.display())
        ))
        .is_err()
    );

    // require: encrypted, nothing checked (libpq's meaning); with a root file, the chain is.
    assert_eq!(session(&url("127.0.0.1", "sslmode=require")), Ok(true));
    assert!(
        session(&url(
            "localhost",
            &format!("sslmode=require sslrootcert={}", other.display())
        ))
        .is_err()
    );
    // prefer (the default): TLS when the server offers it.
    assert_eq!(session(&url("127.0.0.1", "")), Ok(true));

    // disable against a server that takes TCP only over TLS: the server refuses the login.
    let plain = session(&url("127.0.0.1", "sslmode=disable")).unwrap_err();
    assert!(plain.contains("no pg_hba.conf entry"), "{plain}");
    assert!(plain.contains("no encryption"), "{plain}");
}
