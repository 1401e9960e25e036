//! App authentication: the RS256 JWT that speaks for the App, and the installation tokens it
//! buys, cached per installation and renewed well before they expire. Keys and tokens live in
//! `secrecy` values or in types whose `Debug` prints nothing of them.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use secrecy::{ExposeSecret, SecretString};
use serde::Serialize;

use crate::wire::unix_secs;

/// How far in the past the JWT's `iat` is set, against clock drift (GitHub's recommendation).
pub const JWT_BACKDATE: Duration = Duration::from_secs(60);
/// How long a JWT is valid. GitHub refuses `exp` more than 10 minutes ahead; staying under it
/// leaves room for our clock running a little fast.
pub const JWT_LIFETIME: Duration = Duration::from_secs(9 * 60);
/// Renew an installation token this long before it expires (they live one hour), so a token
/// never expires between being handed out and being used by a slow request.
pub const TOKEN_RENEW_BEFORE: Duration = Duration::from_secs(10 * 60);

/// The claims GitHub reads from an App JWT.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JwtClaims {
    pub iat: u64,
    pub exp: u64,
    pub iss: String,
}

/// The claims of a JWT minted at `now`.
pub fn jwt_claims(app_id: u64, now: SystemTime) -> JwtClaims {
    let now = unix_secs(now);
    JwtClaims {
        iat: now.saturating_sub(JWT_BACKDATE.as_secs()),
        exp: now + JWT_LIFETIME.as_secs(),
        iss: app_id.to_string(),
    }
}

/// Whether a token expiring at `expires_at` must be replaced before use at `now`.
pub fn needs_renewal(expires_at: SystemTime, now: SystemTime) -> bool {
    now + TOKEN_RENEW_BEFORE >= expires_at
}

/// Why App credentials could not be made or used.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("the GitHub App private key is not an RSA key in PEM form: {0}")]
    BadKey(String),
    #[error("could not sign the App JWT: {0}")]
    Sign(String),
}

/// The App's identity: its id and private key.
pub struct AppCredentials {
    app_id: u64,
    key: EncodingKey,
}

impl std::fmt::Debug for AppCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppCredentials")
            .field("app_id", &self.app_id)
            .field("key", &"<redacted>")
            .finish()
    }
}

impl AppCredentials {
    /// Reads the key from PEM text (PKCS#1 as GitHub hands it out, or PKCS#8).
    pub fn new(app_id: u64, private_key_pem: &SecretString) -> Result<Self, AuthError> {
        // Never put the key's text in the error: jsonwebtoken's message names only the problem.
        let key = EncodingKey::from_rsa_pem(private_key_pem.expose_secret().as_bytes())
            .map_err(|e| AuthError::BadKey(e.to_string()))?;
        Ok(Self { app_id, key })
    }

    pub fn app_id(&self) -> u64 {
        self.app_id
    }

    /// A fresh App JWT.
    pub fn jwt(&self, now: SystemTime) -> Result<SecretString, AuthError> {
        let claims = jwt_claims(self.app_id, now);
        jsonwebtoken::encode(&Header::new(Algorithm::RS256), &claims, &self.key)
            .map(SecretString::from)
            .map_err(|e| AuthError::Sign(e.to_string()))
    }
}

/// An installation token and when it expires.
#[derive(Clone)]
pub struct InstallationToken {
    pub token: SecretString,
    pub expires_at: SystemTime,
}

impl std::fmt::Debug for InstallationToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstallationToken")
            .field("token", &"<redacted>")
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// Installation tokens by installation id.
#[derive(Debug, Default)]
pub struct TokenCache {
    tokens: Mutex<HashMap<u64, InstallationToken>>,
}

impl TokenCache {
    /// The cached token of `installation`, unless it is due for renewal at `now`.
    pub fn get(&self, installation: u64, now: SystemTime) -> Option<SecretString> {
        let tokens = self.tokens.lock().unwrap_or_else(PoisonError::into_inner);
        tokens
            .get(&installation)
            .filter(|t| !needs_renewal(t.expires_at, now))
            .map(|t| t.token.clone())
    }

    pub fn put(&self, installation: u64, token: InstallationToken) {
        let mut tokens = self.tokens.lock().unwrap_or_else(PoisonError::into_inner);
        tokens.insert(installation, token);
    }

    /// Forgets a token GitHub no longer accepts.
    pub fn invalidate(&self, installation: u64) {
        let mut tokens = self.tokens.lock().unwrap_or_else(PoisonError::into_inner);
        tokens.remove(&installation);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::from_unix_secs;

    #[test]
    fn jwt_is_backdated_and_expires_within_ten_minutes() {
        let c = jwt_claims(42, from_unix_secs(1_000_000));
        assert_eq!(c.iat, 1_000_000 - 60);
        assert!(c.exp > 1_000_000 && c.exp <= 1_000_000 + 600);
        assert_eq!(c.iss, "42");
    }

    #[test]
    fn tokens_are_renewed_ten_minutes_before_expiry() {
        let exp = from_unix_secs(10_000);
        assert!(!needs_renewal(exp, from_unix_secs(10_000 - 601)));
        assert!(needs_renewal(exp, from_unix_secs(10_000 - 600)));
        assert!(needs_renewal(exp, from_unix_secs(20_000)));
    }

    #[test]
    fn cache_hands_out_only_tokens_that_are_not_due() {
        let cache = TokenCache::default();
        cache.put(
            1,
            InstallationToken {
                token: SecretString::from("ghs_x"),
                expires_at: from_unix_secs(3600),
            },
        );
        assert!(cache.get(1, from_unix_secs(0)).is_some());
        assert!(cache.get(1, from_unix_secs(3000)).is_none());
        assert!(cache.get(2, from_unix_secs(0)).is_none());
        cache.invalidate(1);
        assert!(cache.get(1, from_unix_secs(0)).is_none());
    }

    #[test]
    fn debug_never_shows_secrets() {
        let t = InstallationToken {
            token: SecretString::from("ghs_supersecret"),
            expires_at: from_unix_secs(0),
        };
        assert!(!format!("{t:?}").contains("supersecret"));
    }

    #[test]
    fn a_key_that_is_not_pem_is_refused_without_echoing_it() {
        let err = AppCredentials::new(1, &SecretString::from("not a key secretbits"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("PEM"));
        assert!(!err.contains("secretbits"));
    }
}
