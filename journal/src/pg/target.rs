//! Where a PostgreSQL journal is and how rm logs in to it (CONTRACT §9, `[journal] url`): the
//! connection string as configured, checked for what rm cannot honour or must not hold, and the
//! password kept apart from it in a `secrecy` value until the moment a connection is made.
//!
//! A password written in the connection string is refused: the configuration file is not where
//! secrets live (it is readable by whoever may read the agent's settings, and ends up in
//! backups and tickets). The password comes from the environment (`RM_JOURNAL_PASSWORD`, read
//! by the agent) or from the server's own authentication (peer on a unix socket).
//!
//! `sslmode` and `sslrootcert` are read here, not by the client (whose parser knows neither
//! `verify-ca`, `verify-full` nor a root file): see [`super::tls`] for what each mode checks.

use std::path::PathBuf;
use std::str::FromStr;

use postgres::Config;
use postgres::config::{Host, SslMode};
use secrecy::{ExposeSecret as _, SecretString};

use super::surface::{PgSslMode, PgUrlError};
use super::tls::{PgConnect, PgTls, Roots, Verification};

/// libpq's `sslrootcert=system`: the operating system's store.
const SYSTEM_ROOTS: &str = "system";

/// The client's mode and the verification for `sslmode` and `sslrootcert` as written (pure).
fn tls_policy(
    sslmode: Option<&str>,
    sslrootcert: Option<&str>,
) -> Result<(PgSslMode, SslMode, Verification), String> {
    let mode = match sslmode.unwrap_or("prefer") {
        "disable" => PgSslMode::Disable,
        "prefer" => PgSslMode::Prefer,
        "require" => PgSslMode::Require,
        "verify-ca" => PgSslMode::VerifyCa,
        "verify-full" => PgSslMode::VerifyFull,
        "allow" => {
            return Err("sslmode=allow is not supported (rm's client cannot try a plain connection first and TLS second); use sslmode=verify-full, or prefer".to_owned());
        }
        _ => {
            return Err(
                "sslmode must be one of disable, prefer, require, verify-ca, verify-full"
                    .to_owned(),
            );
        }
    };
    let roots = match sslrootcert {
        None | Some("") => None,
        Some(SYSTEM_ROOTS) => Some(Roots::System),
        Some(path) => Some(Roots::File(PathBuf::from(path))),
    };
    if roots == Some(Roots::System) && mode != PgSslMode::VerifyFull {
        // libpq's rule: the public roots vouch for any name, so only the name pins the server.
        return Err(format!(
            "sslrootcert=system needs sslmode=verify-full (not {}): any certificate a public authority issued would pass otherwise",
            mode.as_str()
        ));
    }
    let verification = match (mode, roots) {
        (PgSslMode::Disable, _) => Verification::None,
        // libpq: with a root file, even `prefer` and `require` check the chain.
        (PgSslMode::Prefer | PgSslMode::Require, None) => Verification::None,
        (PgSslMode::Prefer | PgSslMode::Require | PgSslMode::VerifyCa, Some(roots)) => {
            Verification::Chain(roots)
        }
        (PgSslMode::VerifyCa, None) => Verification::Chain(Roots::System),
        (PgSslMode::VerifyFull, roots) => Verification::Full(roots.unwrap_or(Roots::System)),
    };
    let client = match mode {
        PgSslMode::Disable => SslMode::Disable,
        PgSslMode::Prefer => SslMode::Prefer,
        PgSslMode::Require | PgSslMode::VerifyCa | PgSslMode::VerifyFull => SslMode::Require,
    };
    Ok((mode, client, verification))
}

/// A connection string split into what the client parses and the TLS keys rm reads itself.
#[derive(Debug, Default, PartialEq, Eq)]
struct Split {
    rest: String,
    sslmode: Option<String>,
    sslrootcert: Option<String>,
}

/// Takes `sslmode` and `sslrootcert` out of `url` (either form), leaving the rest as written. A
/// string this cannot read is left whole, for the client's parser to refuse with its reason.
fn split_tls_keys(url: &str) -> Split {
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            return Split {
                rest: url.to_owned(),
                ..Split::default()
            };
        };
        let mut split = Split::default();
        let mut kept = Vec::new();
        for pair in query.split('&') {
            match pair.split_once('=') {
                Some(("sslmode", value)) => split.sslmode = Some(percent_decode(value)),
                Some(("sslrootcert", value)) => split.sslrootcert = Some(percent_decode(value)),
                _ => kept.push(pair),
            }
        }
        split.rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        split
    } else {
        split_key_values(url).unwrap_or_else(|| Split {
            rest: url.to_owned(),
            ..Split::default()
        })
    }
}

/// libpq's `key = value` form: values bare or in single quotes, `\` escaping the next character.
/// `None` when it does not read as such (the client's parser then says why).
fn split_key_values(url: &str) -> Option<Split> {
    let bytes = url.as_bytes();
    let mut split = Split::default();
    let mut kept: Vec<&str> = Vec::new();
    let mut i = 0;
    let skip_space = |mut i: usize| {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    loop {
        i = skip_space(i);
        if i >= bytes.len() {
            break;
        }
        let start = i;
        while i < bytes.len() && bytes[i] != b'=' && !bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = &url[start..i];
        i = skip_space(i);
        if bytes.get(i) != Some(&b'=') {
            return None;
        }
        i = skip_space(i + 1);
        let mut value = String::new();
        if bytes.get(i) == Some(&b'\'') {
            i += 1;
            loop {
                match bytes.get(i)? {
                    b'\'' => {
                        i += 1;
                        break;
                    }
                    b'\\' => {
                        value.push(char::from(*bytes.get(i + 1)?));
                        i += 2;
                    }
                    _ => {
                        let c = url[i..].chars().next()?;
                        value.push(c);
                        i += c.len_utf8();
                    }
                }
            }
        } else {
            while i < bytes.len() && !bytes[i].is_ascii_whitespace() {
                if bytes[i] == b'\\' {
                    value.push(char::from(*bytes.get(i + 1)?));
                    i += 2;
                } else {
                    let c = url[i..].chars().next()?;
                    value.push(c);
                    i += c.len_utf8();
                }
            }
        }
        match key {
            "sslmode" => split.sslmode = Some(value),
            "sslrootcert" => split.sslrootcert = Some(value),
            _ => kept.push(&url[start..i]),
        }
    }
    split.rest = kept.join(" ");
    Some(split)
}

/// `%XX` escapes of a URL's query value (a path may hold them); anything else as written.
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push(((hex(h).unwrap_or(0) << 4) | hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The client's settings and rm's TLS for `url`, without the refusals of [`PgTarget::parse`]
/// (a test's or a benchmark's own string).
pub(crate) fn parse_unchecked(url: &str) -> Result<(Config, PgSslMode, PgTls), PgUrlError> {
    let split = split_tls_keys(url);
    // The client's reasons name the option, never its value (which may be a password).
    let mut config = Config::from_str(&split.rest).map_err(|e| {
        PgUrlError::Invalid(match std::error::Error::source(&e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        })
    })?;
    let (mode, client, verification) =
        tls_policy(split.sslmode.as_deref(), split.sslrootcert.as_deref())
            .map_err(PgUrlError::Tls)?;
    config.ssl_mode(client);
    let tls = PgTls::new(verification).map_err(PgUrlError::Tls)?;
    Ok((config, mode, tls))
}

/// A PostgreSQL journal's connection settings: the parsed connection string and, apart from
/// it, the password from the environment. `Debug` shows neither the string nor the password.
#[derive(Clone)]
pub struct PgTarget {
    config: Config,
    password: Option<SecretString>,
    sslmode: PgSslMode,
    tls: PgTls,
}

impl std::fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTarget")
            .field("server", &self.describe())
            .field("password", &self.password.as_ref().map(|_| "[redacted]"))
            .field("sslmode", &self.sslmode)
            .finish()
    }
}

impl PgTarget {
    /// Parses `url` (a `postgres://` URL or libpq `key=value` pairs); refuses a password in it
    /// and a `passfile`; reads `sslrootcert`'s roots now (an unreadable file is refused here,
    /// at start).
    pub fn parse(url: &str) -> Result<PgTarget, PgUrlError> {
        if names_passfile(url) {
            return Err(PgUrlError::Passfile);
        }
        let (config, sslmode, tls) = parse_unchecked(url)?;
        if config.get_password().is_some() {
            return Err(PgUrlError::Password);
        }
        Ok(PgTarget {
            config,
            password: None,
            sslmode,
            tls,
        })
    }

    /// Whether any host is reached over TCP (a name, an address, or `hostaddr`); `false` when
    /// every host is a unix socket directory, where the server can tell the connecting uid.
    pub fn over_tcp(&self) -> bool {
        !self.config.get_hostaddrs().is_empty()
            || self
                .config
                .get_hosts()
                .iter()
                .any(|host| matches!(host, Host::Tcp(_)))
    }

    /// Whether every TCP host is this machine's loopback (`localhost`, `127.0.0.0/8`, `::1`).
    pub fn loopback_only(&self) -> bool {
        let tcp_loopback = self.config.get_hosts().iter().all(|host| match host {
            Host::Tcp(name) => {
                name.eq_ignore_ascii_case("localhost")
                    || name
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback())
            }
            Host::Unix(_) => true,
        });
        tcp_loopback
            && self
                .config
                .get_hostaddrs()
                .iter()
                .all(|ip| ip.is_loopback())
    }

    /// Whether TLS checks the server's certificate (`verify-ca`, `verify-full`, or any mode
    /// with an `sslrootcert` file, as libpq).
    pub fn verifies_server(&self) -> bool {
        self.sslmode != PgSslMode::Disable && self.tls.verifies()
    }

    /// The `sslmode` the string asks for (`prefer` when it names none, as libpq).
    pub fn sslmode(&self) -> PgSslMode {
        self.sslmode
    }

    /// The same target, logging in with `password`.
    pub fn with_password(mut self, password: SecretString) -> PgTarget {
        self.password = Some(password);
        self
    }

    /// Whether a password (from the environment) is set.
    pub fn has_password(&self) -> bool {
        self.password.is_some()
    }

    /// The role the connection logs in as, when the string names one (else the server takes the
    /// operating-system user's name).
    pub fn user(&self) -> Option<&str> {
        self.config.get_user()
    }

    /// Where the journal is, for logs and findings: user, hosts, ports and database; never a
    /// password.
    pub fn describe(&self) -> String {
        let hosts: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .map(|host| match host {
                Host::Tcp(name) => name.clone(),
                Host::Unix(path) => path.display().to_string(),
            })
            .collect();
        let ports: Vec<String> = self.config.get_ports().iter().map(u16::to_string).collect();
        format!(
            "{}@{}{}/{}",
            self.config.get_user().unwrap_or("(os user)"),
            if hosts.is_empty() {
                "localhost".to_owned()
            } else {
                hosts.join(",")
            },
            if ports.is_empty() {
                String::new()
            } else {
                format!(":{}", ports.join(","))
            },
            self.config.get_dbname().unwrap_or("(default database)")
        )
    }

    /// The client's settings for connections named `application`, with the password set and
    /// the target's TLS: made only where a connection is opened, so the password leaves its
    /// `secrecy` value only for the client that sends it.
    pub(crate) fn client_config(&self, application: &str) -> PgConnect {
        let mut config = super::writer::with_defaults(self.config.clone(), application);
        if let Some(password) = &self.password {
            config.password(password.expose_secret());
        }
        PgConnect {
            config,
            tls: self.tls.clone(),
        }
    }
}

/// Whether a connection string names a `passfile` (URL query or `key=value` form). The client
/// would refuse it as an unknown option; this says what to do instead.
fn names_passfile(url: &str) -> bool {
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
        lower
            .split_once('?')
            .is_some_and(|(_, query)| query.split('&').any(|kv| kv.starts_with("passfile=")))
    } else {
        lower.split_whitespace().any(|kv| {
            kv.split_once('=')
                .is_some_and(|(key, _)| key.trim() == "passfile")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_url_and_key_value_pairs_are_taken() {
        let url = PgTarget::parse("postgres://rm@db.example.net:5433/rm").unwrap();
        assert_eq!(url.user(), Some("rm"));
        assert_eq!(url.describe(), "rm@db.example.net:5433/rm");
        let pairs = PgTarget::parse("host=/run/postgresql user=rm dbname=journal").unwrap();
        assert_eq!(pairs.describe(), "rm@/run/postgresql/journal");
        assert!(!pairs.has_password());
    }

    #[test]
    fn a_password_in_the_string_is_refused_in_either_form() {
        for url in [
            "postgres://rm:hunter2@db.example.net/rm",
            "host=db user=rm password=hunter2 dbname=rm",
            "postgres://rm@db/rm?password=hunter2",
        ] {
            let err = PgTarget::parse(url).unwrap_err();
            assert_eq!(err, PgUrlError::Password, "{url}");
            assert!(!err.to_string().contains("hunter2"));
        }
    }

    #[test]
    fn a_passfile_tls_and_junk_are_refused_without_repeating_the_string() {
        assert_eq!(
            PgTarget::parse("postgres://rm@db/rm?passfile=/etc/rm/pgpass").unwrap_err(),
            PgUrlError::Passfile
        );
        assert_eq!(
            PgTarget::parse("host=db passfile=/etc/rm/pgpass").unwrap_err(),
            PgUrlError::Passfile
        );
        let err = PgTarget::parse("host=db port=notaport-s3cret").unwrap_err();
        assert!(matches!(err, PgUrlError::Invalid(_)), "{err:?}");
        assert!(err.to_string().contains("`port`"), "{err}");
        let err = PgTarget::parse("host=db sslcert=/etc/rm/client.pem").unwrap_err();
        assert!(
            err.to_string().contains("unknown option `sslcert`"),
            "{err}"
        );
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }

    #[test]
    fn sslmode_and_sslrootcert_are_read_by_rm_in_either_form() {
        let split = split_tls_keys(
            "host=db port=5433 sslmode = verify-full sslrootcert='/etc/rm/my ca.pem' dbname=rm",
        );
        assert_eq!(split.rest, "host=db port=5433 dbname=rm");
        assert_eq!(split.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(split.sslrootcert.as_deref(), Some("/etc/rm/my ca.pem"));
        let split = split_tls_keys(
            "postgres://rm@db/rm?sslmode=verify-ca&connect_timeout=3&sslrootcert=%2Fetc%2Fca.pem",
        );
        assert_eq!(split.rest, "postgres://rm@db/rm?connect_timeout=3");
        assert_eq!(split.sslmode.as_deref(), Some("verify-ca"));
        assert_eq!(split.sslrootcert.as_deref(), Some("/etc/ca.pem"));
        let split = split_tls_keys("postgres://rm@db/rm?sslmode=require");
        assert_eq!(split.rest, "postgres://rm@db/rm");
        // Unreadable as key/value pairs: left whole for the client to refuse.
        assert_eq!(split_tls_keys("host=db 'x").rest, "host=db 'x");
    }

    #[test]
    fn each_sslmode_checks_what_libpq_s_does() {
        use super::Roots::{File, System};
        let file = || Some(File(PathBuf::from("/ca.pem")));
        let cases = [
            (None, None, SslMode::Prefer, Verification::None),
            (Some("disable"), None, SslMode::Disable, Verification::None),
            (Some("prefer"), None, SslMode::Prefer, Verification::None),
            (Some("require"), None, SslMode::Require, Verification::None),
            // A root file makes even `require` check the chain (libpq).
            (
                Some("require"),
                Some("/ca.pem"),
                SslMode::Require,
                Verification::Chain(File(PathBuf::from("/ca.pem"))),
            ),
            (
                Some("verify-ca"),
                None,
                SslMode::Require,
                Verification::Chain(System),
            ),
            (
                Some("verify-full"),
                None,
                SslMode::Require,
                Verification::Full(System),
            ),
            (
                Some("verify-full"),
                Some("system"),
                SslMode::Require,
                Verification::Full(System),
            ),
        ];
        for (mode, root, client, verification) in cases {
            let (_, got_client, got) = tls_policy(mode, root).unwrap();
            assert_eq!(
                (got_client, &got),
                (client, &verification),
                "{mode:?} {root:?}"
            );
        }
        assert!(matches!(
            tls_policy(Some("verify-full"), Some("/ca.pem")).unwrap().2,
            Verification::Full(ref roots) if Some(roots.clone()) == file()
        ));
        for (mode, root, says) in [
            (Some("allow"), None, "sslmode=allow is not supported"),
            (Some("verify_full"), None, "sslmode must be one of"),
            (Some("require"), Some("system"), "needs sslmode=verify-full"),
        ] {
            let err = tls_policy(mode, root).unwrap_err();
            assert!(err.contains(says), "{mode:?} {root:?}: {err}");
        }
    }

    #[test]
    fn an_unreadable_root_file_is_refused_at_parse_naming_it() {
        let err = PgTarget::parse(
            "postgres://rm@db/rm?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
        )
        .unwrap_err();
        assert!(
            matches!(&err, PgUrlError::Tls(why) if why.contains("/nonexistent/ca.pem")),
            "{err:?}"
        );
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = PgTarget::parse(&format!(
            "host=db sslmode=verify-ca sslrootcert={}",
            empty.display()
        ))
        .unwrap_err();
        assert!(
            matches!(&err, PgUrlError::Tls(why) if why.contains("holds no certificate")),
            "{err:?}"
        );
    }

    #[test]
    fn where_the_connection_goes() {
        let tcp = PgTarget::parse("postgres://rm@db.example.net/rm").unwrap();
        assert!(tcp.over_tcp() && !tcp.loopback_only());
        let local = PgTarget::parse("host=localhost,127.0.0.2,::1 user=rm").unwrap();
        assert!(local.over_tcp() && local.loopback_only());
        let socket = PgTarget::parse("host=/run/postgresql user=rm").unwrap();
        assert!(!socket.over_tcp() && socket.loopback_only());
        assert!(!tcp.verifies_server());
        assert_eq!(tcp.sslmode(), PgSslMode::Prefer);
    }

    #[test]
    fn the_password_is_set_only_on_the_client_s_settings_and_never_shown() {
        let target = PgTarget::parse("postgres://rm@db/rm")
            .unwrap()
            .with_password(SecretString::from("hunter2"));
        assert!(!format!("{target:?}").contains("hunter2"));
        assert!(!target.describe().contains("hunter2"));
        let config = target.client_config("test").config;
        assert_eq!(config.get_password(), Some(&b"hunter2"[..]));
        assert_eq!(config.get_application_name(), Some("test"));
    }
}
