//! Standard Webhooks signatures: `v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

const SECRET_PREFIX: &str = "whsec_";

/// Why a signing secret cannot be used. Never holds the secret itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("the secret must start with \"{SECRET_PREFIX}\"")]
    NoPrefix,
    #[error("the part after \"{SECRET_PREFIX}\" is not valid base64")]
    NotBase64,
    #[error("the part after \"{SECRET_PREFIX}\" is empty")]
    Empty,
}

/// The decoded key behind an endpoint's signing secret, `whsec_<base64>`.
#[derive(Clone)]
pub struct SigningKey(Vec<u8>);

impl SigningKey {
    pub fn parse(secret: &str) -> Result<SigningKey, SecretError> {
        let encoded = secret.strip_prefix(SECRET_PREFIX).ok_or(SecretError::NoPrefix)?;
        let key = BASE64.decode(encoded).map_err(|_| SecretError::NotBase64)?;
        if key.is_empty() {
            return Err(SecretError::Empty);
        }
        Ok(SigningKey(key))
    }

    /// The `webhook-signature` header value for one attempt.
    pub fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
    }
}

// Never print the key itself, not even in a debug log line.
impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_standard_webhooks_test_vector() {
        let key = SigningKey::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap();
        let body = br#"{"email":"test@example.com","username":"test_user"}"#;
        assert_eq!(key.sign("msg_27UH4WbU6Z5A5EzD8u03UvzRbpk", 1649367553, body), "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=");
    }

    #[test]
    fn a_different_body_gives_a_different_signature() {
        let key = SigningKey::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap();
        assert_ne!(key.sign("1", 1, b"{}"), key.sign("1", 1, b"{ }"));
    }

    #[test]
    fn rejects_malformed_secrets_with_a_reason() {
        assert_eq!(SigningKey::parse("C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap_err(), SecretError::NoPrefix);
        assert_eq!(SigningKey::parse("whsec_not base64!").unwrap_err(), SecretError::NotBase64);
        assert_eq!(SigningKey::parse("whsec_").unwrap_err(), SecretError::Empty);
        // Trailing bits that are not zero: outbox_endpoint_rotate_secret refuses it too.
        assert_eq!(SigningKey::parse("whsec_eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eB==").unwrap_err(), SecretError::NotBase64);
    }

    #[test]
    fn debug_output_hides_the_key() {
        let key = SigningKey::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap();
        assert_eq!(format!("{key:?}"), "SigningKey(..)");
    }
}
