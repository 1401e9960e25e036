//! Where a PostgreSQL journal is and how rm logs in to it (CONTRACT §9, `[journal] url`): the
//! connection string as configured, checked for what rm cannot honour or must not hold, and the
//! password kept apart from it in a `secrecy` value until the moment a connection is made.
//!
//! A password written in the connection string is refused: the configuration file is not where
//! secrets live (it is readable by whoever may read the agent's settings, and ends up in
//! backups and tickets). The password comes from the environment (`RM_JOURNAL_PASSWORD`, read
//! by the agent) or from the server's own authentication (peer, trust on a socket).

use std::str::FromStr;

use postgres::Config;
use postgres::config::SslMode;
use secrecy::{ExposeSecret as _, SecretString};

/// Why a connection string is refused. The text never repeats the string (it may hold a
/// password): it names the part that is wrong and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PgUrlError {
    #[error(
        "is not a PostgreSQL connection string ({0}); write it like \"postgres://rm@db.example.net/rm\" or \"host=/run/postgresql dbname=rm\""
    )]
    Invalid(String),
    #[error(
        "holds a password; secrets do not live in the configuration file: remove it from the URL and set RM_JOURNAL_PASSWORD in the agent's environment (or use the server's peer or certificate authentication)"
    )]
    Password,
    #[error(
        "names a `passfile`, which rm does not read yet; remove it and set RM_JOURNAL_PASSWORD in the agent's environment instead"
    )]
    Passfile,
    #[error(
        "asks for TLS (sslmode=require), which rm's PostgreSQL client does not speak yet; use a unix socket or a trusted network with sslmode=disable or prefer"
    )]
    Tls,
}

/// A PostgreSQL journal's connection settings: the parsed connection string and, apart from
/// it, the password from the environment. `Debug` shows neither the string nor the password.
#[derive(Clone)]
pub struct PgTarget {
    config: Config,
    password: Option<SecretString>,
}

impl std::fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTarget")
            .field("server", &self.describe())
            .field("password", &self.password.as_ref().map(|_| "[redacted]"))
            .finish()
    }
}

impl PgTarget {
    /// Parses `url` (a `postgres://` URL or libpq `key=value` pairs); refuses a password in it,
    /// a `passfile`, and TLS, which the client cannot do yet.
    pub fn parse(url: &str) -> Result<PgTarget, PgUrlError> {
        if names_passfile(url) {
            return Err(PgUrlError::Passfile);
        }
        let config = Config::from_str(url).map_err(|e| PgUrlError::Invalid(e.to_string()))?;
        if config.get_password().is_some() {
            return Err(PgUrlError::Password);
        }
        if config.get_ssl_mode() == SslMode::Require {
            return Err(PgUrlError::Tls);
        }
        Ok(PgTarget {
            config,
            password: None,
        })
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
        use postgres::config::Host;
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

    /// The client's settings for one connection named `application`, with the password set:
    /// made only where a connection is opened, so the password leaves its `secrecy` value only
    /// for the client that sends it.
    pub(crate) fn client_config(&self, application: &str) -> Config {
        let mut config = super::writer::with_defaults(self.config.clone(), application);
        if let Some(password) = &self.password {
            config.password(password.expose_secret());
        }
        config
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
        assert_eq!(
            PgTarget::parse("postgres://rm@db/rm?sslmode=require").unwrap_err(),
            PgUrlError::Tls
        );
        let err = PgTarget::parse("host=db port=notaport-s3cret").unwrap_err();
        assert!(matches!(err, PgUrlError::Invalid(_)), "{err:?}");
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }

    #[test]
    fn the_password_is_set_only_on_the_client_s_settings_and_never_shown() {
        let target = PgTarget::parse("postgres://rm@db/rm")
            .unwrap()
            .with_password(SecretString::from("hunter2"));
        assert!(!format!("{target:?}").contains("hunter2"));
        assert!(!target.describe().contains("hunter2"));
        let config = target.client_config("test");
        assert_eq!(config.get_password(), Some(&b"hunter2"[..]));
        assert_eq!(config.get_application_name(), Some("test"));
    }
}
