//! How the fake checks credentials: App JWTs against the App's public key and GitHub's time
//! rules, installation tokens against the ones it issued.

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

/// GitHub refuses an App JWT whose `exp` is further ahead than this.
pub const JWT_MAX_AHEAD_SECS: u64 = 600;

/// Who a request speaks for (and whose secondary limits it spends).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Caller {
    App,
    Installation(u64),
}

#[derive(Debug, Deserialize)]
struct Claims {
    iat: u64,
    exp: u64,
    iss: serde_json::Value,
}

/// GitHub's time rules for an App JWT, at `now` (seconds since the epoch).
pub fn check_jwt_times(iat: u64, exp: u64, now: u64) -> Result<(), &'static str> {
    if iat > now {
        return Err(
            "'Issued at' claim ('iat') must be an Integer representing a time in the past.",
        );
    }
    if exp <= now {
        return Err(
            "'Expiration time' claim ('exp') must be a numeric value representing the future time at which the assertion expires.",
        );
    }
    if exp > now + JWT_MAX_AHEAD_SECS {
        return Err("'Expiration time' claim ('exp') is too far in the future.");
    }
    Ok(())
}

/// Verifies an App JWT: RS256 signature by the App's key, issuer, times.
pub fn verify_jwt(token: &str, public_pem: &str, app_id: u64, now: u64) -> Result<(), String> {
    let key = DecodingKey::from_rsa_pem(public_pem.as_bytes())
        .map_err(|e| format!("the fake's App key is unusable: {e}"))?;
    let mut validation = Validation::new(Algorithm::RS256);
    // The time rules are GitHub's, checked against the fake's own (shiftable) clock below.
    validation.validate_exp = false;
    validation.required_spec_claims.clear();
    let data = jsonwebtoken::decode::<Claims>(token, &key, &validation)
        .map_err(|_| "A JSON web token could not be decoded".to_owned())?;
    let iss = match &data.claims.iss {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if iss != app_id.to_string() {
        return Err(format!("Integration not found for issuer {iss:?}"));
    }
    check_jwt_times(data.claims.iat, data.claims.exp, now).map_err(str::to_owned)
}

/// The credential of an `Authorization` header (`Bearer x` or `token x`).
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let h = header?;
    h.strip_prefix("Bearer ")
        .or_else(|| h.strip_prefix("bearer "))
        .or_else(|| h.strip_prefix("token "))
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwt_time_rules() {
        assert!(check_jwt_times(940, 1540, 1000).is_ok());
        assert!(
            check_jwt_times(1001, 1500, 1000).is_err(),
            "iat in the future"
        );
        assert!(check_jwt_times(900, 1000, 1000).is_err(), "expired");
        assert!(
            check_jwt_times(900, 1601, 1000).is_err(),
            "exp too far ahead"
        );
    }

    #[test]
    fn bearer_accepts_both_schemes() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("token abc")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(None), None);
    }
}
