//! Webhook signatures: `X-Hub-Signature-256` is `sha256=` + hex HMAC-SHA256 of the exact body
//! bytes. Every configured secret is tried (rotation: the old and the new secret are both valid
//! while GitHub's App settings change), always all of them, so the time taken does not say which
//! one matched or how close a forgery came.

use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::Sha256;

/// The prefix GitHub puts before the hex digest.
const SIGNATURE_PREFIX: &str = "sha256=";

/// The webhook secrets this receiver accepts. Deliberately without `Debug` or `Display`.
pub struct WebhookSecrets(Vec<SecretString>);

impl WebhookSecrets {
    /// Keeps the non-empty secrets; `None` when there are none, since a receiver without a
    /// secret would accept anyone's deliveries.
    pub fn new(secrets: Vec<SecretString>) -> Option<Self> {
        let secrets: Vec<_> = secrets
            .into_iter()
            .filter(|s| !s.expose_secret().is_empty())
            .collect();
        (!secrets.is_empty()).then_some(WebhookSecrets(secrets))
    }

    /// How many secrets are accepted.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always `false`: [`WebhookSecrets::new`] refuses an empty set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `header` (the `X-Hub-Signature-256` value) signs `body` under any secret.
    pub fn verify(&self, header: &[u8], body: &[u8]) -> bool {
        let Some(digest) = parse_header(header) else {
            return false;
        };
        let mut matched = false;
        for secret in &self.0 {
            let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret.expose_secret().as_bytes())
            else {
                continue;
            };
            mac.update(body);
            // `verify_slice` compares in constant time.
            matched |= mac.verify_slice(&digest).is_ok();
        }
        matched
    }
}

/// The 32 digest bytes of a well-formed header value.
fn parse_header(header: &[u8]) -> Option<[u8; 32]> {
    let hex_digest = header.strip_prefix(SIGNATURE_PREFIX.as_bytes())?;
    let mut digest = [0u8; 32];
    hex::decode_to_slice(hex_digest, &mut digest).ok()?;
    Some(digest)
}

/// The header value for `body` under `secret`, as GitHub computes it. For tests and tools that
/// play GitHub's part.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    // HMAC takes keys of any length; `new_from_slice` cannot fail for it.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(mac) => mac,
        Err(_) => return String::new(),
    };
    mac.update(body);
    format!(
        "{SIGNATURE_PREFIX}{}",
        hex::encode(mac.finalize().into_bytes())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(list: &[&str]) -> WebhookSecrets {
        WebhookSecrets::new(list.iter().map(|s| SecretString::from(*s)).collect()).unwrap()
    }

    /// GitHub's documented test vector ("Validating webhook deliveries").
    #[test]
    fn githubs_test_vector() {
        let header = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert_eq!(
            sign(b"It's a Secret to Everybody", b"Hello, World!"),
            header
        );
        let s = secrets(&["It's a Secret to Everybody"]);
        assert!(s.verify(header.as_bytes(), b"Hello, World!"));
        assert!(!s.verify(header.as_bytes(), b"Hello, World?"));
    }

    #[test]
    fn every_secret_is_accepted_during_rotation() {
        let s = secrets(&["old", "new"]);
        assert!(s.verify(sign(b"old", b"{}").as_bytes(), b"{}"));
        assert!(s.verify(sign(b"new", b"{}").as_bytes(), b"{}"));
        assert!(!s.verify(sign(b"other", b"{}").as_bytes(), b"{}"));
    }

    #[test]
    fn malformed_headers_never_verify() {
        let s = secrets(&["k"]);
        let good = sign(b"k", b"{}");
        for bad in [
            String::new(),
            good.trim_start_matches("sha256=").to_owned(),
            good.replace("sha256=", "sha1="),
            good[..good.len() - 2].to_owned(),
            format!("{good}00"),
            good.to_uppercase(),
        ] {
            assert!(!s.verify(bad.as_bytes(), b"{}"), "{bad}");
        }
    }

    #[test]
    fn empty_secrets_are_refused() {
        assert!(WebhookSecrets::new(vec![]).is_none());
        assert!(WebhookSecrets::new(vec![SecretString::from("")]).is_none());
    }
}
