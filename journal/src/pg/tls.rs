//! TLS to the journal's PostgreSQL server (`sslmode`, `sslrootcert`), over rustls: what each
//! mode verifies ([`Verification`], decided by [`super::target`] from the connection string) and
//! the small adapter that gives the `postgres` client a rustls stream ([`PgTls`]).
//!
//! The client's own parser knows `sslmode=disable|prefer|require` and nothing about
//! certificates; rm reads `sslmode` and `sslrootcert` itself, tells the client only whether to
//! ask for TLS (`disable`, `prefer`, `require`), and does the verification here, as libpq does:
//!
//! - `prefer` and `require`: encrypted, the server's certificate not checked (a machine in the
//!   path can pose as the server), unless `sslrootcert` names a file: then its chain is checked
//!   against it, as `verify-ca` (libpq's rule when a root file exists).
//! - `verify-ca`: the chain is checked against the roots; any host name is taken.
//! - `verify-full`: the chain and the host name the connection string names.
//!
//! The roots are the file `sslrootcert` names (PEM, one or more certificates), or the system's
//! store (`sslrootcert=system`, or no `sslrootcert` under `verify-ca`/`verify-full`).

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use postgres::Socket;
use postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Where the certificate authorities a verified connection trusts come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Roots {
    /// The operating system's store (`sslrootcert=system`, or none named).
    System,
    /// The PEM file `sslrootcert` names.
    File(PathBuf),
}

impl std::fmt::Display for Roots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Roots::System => f.write_str("the system's certificate store"),
            Roots::File(path) => write!(f, "sslrootcert={}", path.display()),
        }
    }
}

/// What is checked of the server's certificate once TLS is up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verification {
    /// Nothing (`prefer`, `require` without `sslrootcert`): encrypted against a passive
    /// listener only.
    None,
    /// The chain up to one of the roots; any name (`verify-ca`, `require` with `sslrootcert`).
    Chain(Roots),
    /// The chain and the host name (`verify-full`).
    Full(Roots),
}

/// The client side of TLS for every connection of one target: the rustls settings made once
/// (roots read at start), cloned cheaply into each connection.
#[derive(Clone)]
pub(crate) struct PgTls {
    config: Arc<ClientConfig>,
    /// Said in a failed handshake's error: what the certificate was checked against.
    verification: Arc<Verification>,
}

impl std::fmt::Debug for PgTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTls")
            .field("verification", &self.verification)
            .finish()
    }
}

impl PgTls {
    /// Whether the server's certificate is checked at all.
    pub(crate) fn verifies(&self) -> bool {
        *self.verification != Verification::None
    }

    /// The settings for `verification`, reading its roots now: an unreadable or empty
    /// `sslrootcert` is an error at start, not at the first connection.
    pub(crate) fn new(verification: Verification) -> Result<PgTls, String> {
        // The provider hyper-rustls already builds for the GitHub client (ring), named here
        // rather than taken from a process-wide default another crate might install.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("cannot set up TLS: {e}"))?;
        let algorithms = provider.signature_verification_algorithms;
        let without_names = |roots: Option<RootCertStore>| {
            builder
                .clone()
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NameUnchecked { roots, algorithms }))
                .with_no_client_auth()
        };
        let config = match &verification {
            Verification::None => without_names(None),
            Verification::Chain(roots) => without_names(Some(load_roots(roots)?)),
            Verification::Full(roots) => builder
                .with_root_certificates(load_roots(roots)?)
                .with_no_client_auth(),
        };
        Ok(PgTls {
            config: Arc::new(config),
            verification: Arc::new(verification),
        })
    }
}

/// The roots `roots` names, refusing a source that holds none (every verification would fail,
/// later and less clearly).
fn load_roots(roots: &Roots) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    match roots {
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(
                    "sslmode asks to verify the server, but the system's certificate store holds no certificate authority; install the ca-certificates package or name the CA file with sslrootcert=".to_owned(),
                );
            }
        }
        Roots::File(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("sslrootcert: cannot read {} ({e})", path.display()))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("sslrootcert: {} is not PEM ({e})", path.display()))?;
            let (added, _) = store.add_parsable_certificates(certs);
            if added == 0 {
                return Err(format!(
                    "sslrootcert: {} holds no certificate (a PEM file with the CA that signed the server's certificate)",
                    path.display()
                ));
            }
        }
    }
    Ok(store)
}

/// The verifier of the modes that do not compare the server's name (a server reached by an
/// address its certificate does not list): with `roots` (`verify-ca`) the chain must lead to
/// one of them; without (`prefer`, `require`) the certificate itself is not checked. Either way
/// the handshake's signatures are (the session is keyed to whoever holds the certificate's key).
#[derive(Debug)]
struct NameUnchecked {
    roots: Option<RootCertStore>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for NameUnchecked {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &cert,
                roots,
                intermediates,
                now,
                self.algorithms.all,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Why a TLS connection could not be made, in words an operator can act on. Never holds the
/// connection string.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct TlsError(String);

impl MakeTlsConnect<Socket> for PgTls {
    type Stream = PgTlsStream;
    type TlsConnect = PgTlsConnect;
    type Error = TlsError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<PgTlsConnect, TlsError> {
        // Asked before every connection, a unix socket's included (with no name): PostgreSQL
        // never offers TLS there, so a missing name is an error only if a handshake comes.
        let name = ServerName::try_from(domain.to_owned()).map_err(|_| {
            if domain.is_empty() {
                TlsError("TLS needs a host name to check, and this connection has none".to_owned())
            } else {
                TlsError(format!(
                    "the host `{domain}` is not a name or address a certificate can hold"
                ))
            }
        });
        Ok(PgTlsConnect {
            tls: self.clone(),
            name,
        })
    }
}

/// One connection's handshake to come.
pub(crate) struct PgTlsConnect {
    tls: PgTls,
    name: Result<ServerName<'static>, TlsError>,
}

impl TlsConnect<Socket> for PgTlsConnect {
    type Stream = PgTlsStream;
    type Error = TlsError;
    type Future = Pin<Box<dyn Future<Output = Result<PgTlsStream, TlsError>> + Send>>;

    fn connect(self, stream: Socket) -> Self::Future {
        Box::pin(async move {
            let name = self.name?;
            let connector = tokio_rustls::TlsConnector::from(Arc::clone(&self.tls.config));
            connector
                .connect(name.clone(), stream)
                .await
                .map(PgTlsStream)
                .map_err(|e| explain(&e, &name, &self.tls.verification))
        })
    }
}

/// A failed handshake said with what was checked and the way out.
fn explain(err: &io::Error, name: &ServerName<'_>, verification: &Verification) -> TlsError {
    use rustls::CertificateError;
    let rustls_error = err
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    let roots = match verification {
        Verification::Chain(roots) | Verification::Full(roots) => roots.to_string(),
        Verification::None => "nothing".to_owned(),
    };
    let host = name.to_str();
    TlsError(match rustls_error {
        Some(rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer)) => format!(
            "the server's certificate is not signed by a certificate authority of {roots}: set sslrootcert= to the CA file that signed the server's certificate ({err})"
        ),
        Some(rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        )) => format!(
            "the server's certificate does not name the host `{host}` (sslmode=verify-full): connect by a name the certificate holds, or reissue it with this name ({err})"
        ),
        Some(rustls::Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        )) => format!("the server's certificate has expired ({err})"),
        Some(rustls::Error::InvalidCertificate(_)) => {
            format!("the server's certificate was refused, checked against {roots} ({err})")
        }
        _ => format!("the TLS handshake with `{host}` failed ({err})"),
    })
}

/// A TLS connection to the server.
pub(crate) struct PgTlsStream(tokio_rustls::client::TlsStream<Socket>);

impl TlsStream for PgTlsStream {
    fn channel_binding(&self) -> ChannelBinding {
        // SCRAM's channel binding (`tls-server-end-point`) hashes the certificate with the hash
        // of its signature algorithm; a wrong hash would fail the login, none falls back to
        // plain SCRAM (which still never sends the password).
        ChannelBinding::none()
    }
}

impl AsyncRead for PgTlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for PgTlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// One target's connection settings: the client's, with the TLS that goes with them. Every
/// connection to the journal is made through one, so none is made without its TLS.
#[derive(Clone)]
pub(crate) struct PgConnect {
    pub(crate) config: postgres::Config,
    pub(crate) tls: PgTls,
}

impl PgConnect {
    /// Connects (blocking: the sync client runs a runtime of its own).
    pub(crate) fn connect(&self) -> Result<postgres::Client, postgres::Error> {
        self.config.connect(self.tls.clone())
    }
}
