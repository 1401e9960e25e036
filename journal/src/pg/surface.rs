//! What the agent may name of the PostgreSQL journal whether or not this build has it (the
//! `postgres` feature): the errors and modes of a connection string, and what `check` found.
//! Without the feature, [`PgUrlError::NotBuilt`] is what a `journal.url` gets.

/// Why a connection string is refused. The text never repeats the string (it may hold a
/// password): it names the part that is wrong and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PgUrlError {
    #[error(
        "is not a PostgreSQL connection string ({0}); write it like \"postgres://rm@db.example.net/rm?sslmode=verify-full\" or \"host=/run/postgresql dbname=rm\""
    )]
    Invalid(String),
    #[error(
        "holds a password; secrets do not live in the configuration file: remove it from the URL and set RM_JOURNAL_PASSWORD in the agent's environment"
    )]
    Password,
    #[error(
        "names a `passfile`, which rm does not read yet; remove it and set RM_JOURNAL_PASSWORD in the agent's environment instead"
    )]
    Passfile,
    /// An `sslmode` or `sslrootcert` rm cannot honour, or a root file it cannot read.
    #[error("{0}")]
    Tls(String),
    /// This rm was built without the PostgreSQL journal (the `fleet` feature of `rm-agent`,
    /// `postgres` of `rm-journal`): a single-host build links no PostgreSQL client.
    #[error(
        "names a PostgreSQL journal, but this rm-agent was built without one: build it with the `fleet` feature (`cargo install --locked --path agent --features fleet`), or remove `journal.url` to journal in the data directory"
    )]
    NotBuilt,
}

/// What `sslmode` asks for (libpq's names; `allow` is refused, the client cannot try plain
/// first and TLS second).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgSslMode {
    Disable,
    /// libpq's default: TLS when the server offers it, unverified; plain otherwise.
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl PgSslMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PgSslMode::Disable => "disable",
            PgSslMode::Prefer => "prefer",
            PgSslMode::Require => "require",
            PgSslMode::VerifyCa => "verify-ca",
            PgSslMode::VerifyFull => "verify-full",
        }
    }
}

/// Where the database's schema stands against this build's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgSchemaState {
    /// At this build's version: nothing to migrate.
    Current,
    /// Older (0: never migrated): the first receiver to start migrates it, if its role may.
    Behind { found: i64 },
    /// From a newer rm: this build refuses it.
    Newer { found: i64 },
    /// The version table exists but this role may not read it.
    Unreadable,
}

/// A right the role lacks: `privilege` on `object` (`table deliveries`, `schema public`);
/// `privilege` is `OWNER` where only the owner (or a member of its role) may act.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgRight {
    pub privilege: &'static str,
    pub object: String,
}

/// What [`PgInspection::of`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgInspection {
    /// The role the connection logged in as.
    pub role: String,
    /// The schema (namespace) rm's tables are in: the connection's current schema.
    pub namespace: String,
    pub state: PgSchemaState,
    /// This build's schema version.
    pub supported: i64,
    /// Every right the role lacks for the intake (and, when behind, for migrating).
    pub missing: Vec<PgRight>,
}
