//! The relay's names and secrets: channel and host names, the two random ids of a channel
//! (ingest and smee, independent 128-bit values), subscriber tokens and the digest that is all
//! the relay keeps of one. Generation reads the OS random generator; everything else is pure.

use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};

/// Random bytes in a channel's ingest id and smee id: 128 bits, written as 32 lowercase hex.
const ID_BYTES: usize = 16;
/// Random bytes in a subscriber token: 256 bits, written as 64 lowercase hex.
const TOKEN_BYTES: usize = 32;
/// Every subscriber token starts with this, so a leaked one is recognisable (secret scanners).
pub const TOKEN_PREFIX: &str = "rmr_";
/// The longest channel name.
const MAX_CHANNEL_NAME: usize = 64;
/// The longest host name: a DNS name's limit, since hosts are usually named after theirs.
const MAX_HOST_NAME: usize = 253;

/// The OS random generator failed; nothing secret can be made without it.
#[derive(Debug, thiserror::Error)]
#[error("the operating system's random generator failed: {0}")]
pub struct RandomError(getrandom::Error);

fn random_hex<const N: usize>() -> Result<String, RandomError> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(RandomError)?;
    Ok(hex::encode(bytes))
}

/// A new ingest id or smee id: 32 lowercase hex (128 random bits).
pub fn new_channel_id() -> Result<String, RandomError> {
    random_hex::<ID_BYTES>()
}

/// A new subscriber token: `rmr_` and 64 lowercase hex (256 random bits).
pub fn new_token() -> Result<SecretString, RandomError> {
    Ok(SecretString::from(format!(
        "{TOKEN_PREFIX}{}",
        random_hex::<TOKEN_BYTES>()?
    )))
}

/// What the relay stores of a token, and looks tokens up by: hex SHA-256 of its text. A token
/// has 256 random bits, so a plain hash (no salt, no stretching) is enough to make the stored
/// value useless to whoever reads the file.
pub fn token_digest(token: &SecretString) -> String {
    hex::encode(Sha256::digest(token.expose_secret().as_bytes()))
}

/// Whether `token` has the shape of one this relay issues; anything else is refused without a
/// database lookup.
pub fn is_token_shaped(token: &SecretString) -> bool {
    token
        .expose_secret()
        .strip_prefix(TOKEN_PREFIX)
        .is_some_and(|hex| is_lower_hex(hex, 2 * TOKEN_BYTES))
}

/// Whether `id` has the shape of an ingest or smee id (so a path that cannot be one is answered
/// without a database lookup).
pub fn is_channel_id_shaped(id: &str) -> bool {
    is_lower_hex(id, 2 * ID_BYTES)
}

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Channel names: `[A-Za-z0-9_-]{1,64}`; they appear in subscribe URLs.
pub fn is_valid_channel_name(name: &str) -> bool {
    (1..=MAX_CHANNEL_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Host names: `[A-Za-z0-9_.-]{1,253}`, so a host can be named after its DNS name.
pub fn is_valid_host_name(name: &str) -> bool {
    (1..=MAX_HOST_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_tokens_have_their_documented_shape_and_differ() {
        let a = new_channel_id().unwrap();
        let b = new_channel_id().unwrap();
        assert!(is_channel_id_shaped(&a) && is_channel_id_shaped(&b));
        assert_ne!(a, b);
        let token = new_token().unwrap();
        assert!(is_token_shaped(&token));
        assert_eq!(token.expose_secret().len(), 4 + 64);
        assert_ne!(token.expose_secret(), new_token().unwrap().expose_secret());
    }

    #[test]
    fn malformed_tokens_and_ids_are_recognised() {
        for bad in [
            "",
            "rmr_",
            "rmx_0000000000000000000000000000000000000000000000000000000000000000",
            "rmr_000000000000000000000000000000000000000000000000000000000000000",
            "rmr_00000000000000000000000000000000000000000000000000000000000000000",
            "rmr_000000000000000000000000000000000000000000000000000000000000000G",
            "rmr_000000000000000000000000000000000000000000000000000000000000000A",
        ] {
            assert!(!is_token_shaped(&SecretString::from(bad)), "{bad}");
        }
        assert!(!is_channel_id_shaped("0123456789abcdef0123456789abcdeF"));
        assert!(!is_channel_id_shaped("0123456789abcdef"));
        assert!(!is_channel_id_shaped("../../0123456789abcdef0123456789"));
    }

    #[test]
    fn the_digest_is_hex_sha256_of_the_token_text() {
        // sha256("abc"), the FIPS 180-2 test vector.
        assert_eq!(
            token_digest(&SecretString::from("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn names_follow_their_patterns() {
        assert!(is_valid_channel_name("ci"));
        assert!(is_valid_channel_name("Acme_ci-2"));
        assert!(is_valid_channel_name(&"a".repeat(64)));
        for bad in ["", "a b", "a/b", "a.b", "é", &"a".repeat(65)] {
            assert!(!is_valid_channel_name(bad), "{bad}");
        }
        assert!(is_valid_host_name("builder-01.example.com"));
        for bad in ["", "a b", "a/b", "a:b", &"a".repeat(254)] {
            assert!(!is_valid_host_name(bad), "{bad}");
        }
    }
}
