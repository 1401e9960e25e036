//! App key pairs made on the spot, for tests and `rm-agent demo`: the private half goes to the
//! client under test, the public half to the fake, which checks every JWT against it. No key is
//! ever committed.

use rsa::pkcs1::{EncodeRsaPrivateKey, EncodeRsaPublicKey, LineEnding};
use secrecy::SecretString;

/// Key size: GitHub issues 2048-bit App keys.
pub const KEY_BITS: usize = 2048;

/// A freshly generated RSA key pair in PEM (PKCS#1, as GitHub hands App keys out).
pub struct AppKeyPair {
    pub private_pem: SecretString,
    pub public_pem: String,
}

impl std::fmt::Debug for AppKeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppKeyPair")
            .field("private_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

impl AppKeyPair {
    pub fn generate() -> anyhow::Result<Self> {
        let mut rng = rsa::rand_core::OsRng;
        let private = rsa::RsaPrivateKey::new(&mut rng, KEY_BITS)?;
        let private_pem = private.to_pkcs1_pem(LineEnding::LF)?;
        let public_pem = private.to_public_key().to_pkcs1_pem(LineEnding::LF)?;
        Ok(Self {
            private_pem: SecretString::from(private_pem.as_str()),
            public_pem,
        })
    }
}
