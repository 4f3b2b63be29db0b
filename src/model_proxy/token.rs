//! Capability tokens: what an agent holds in place of the provider's key. One per session, the
//! same at every start of its runtime (Codex copies its key into a file of its HOME; a token
//! that changed at a reopen would leave that copy stale), derived from the session's id with a
//! key only the server holds, so it is never stored and a token of one session is worth nothing
//! to another.

use ring::hmac;
use uuid::Uuid;

/// What every token starts with, so one found in a log is known for what it is.
const PREFIX: &str = "ahm-";

/// The server's key for tokens.
pub struct TokenKey(hmac::Key);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

impl TokenKey {
    /// A key from at least 32 secret bytes.
    pub fn new(secret: &[u8]) -> Result<Self, String> {
        if secret.len() < 32 {
            return Err(format!(
                "a token key needs at least 32 bytes, this one has {}",
                secret.len()
            ));
        }
        Ok(Self(hmac::Key::new(hmac::HMAC_SHA256, secret)))
    }

    /// A fresh random key (a server whose tokens need not outlive it).
    pub fn random() -> Self {
        Self::new(&random_secret()).expect("32 bytes")
    }

    /// The token of `session`.
    pub fn token(&self, session: Uuid) -> String {
        let tag = hmac::sign(&self.0, session.as_bytes());
        format!("{PREFIX}{}", hex::encode(&tag.as_ref()[..24]))
    }

    /// Whether `token` is `session`'s, compared in constant time.
    pub fn is_of(&self, token: &str, session: Uuid) -> bool {
        let Some(tag) = token
            .strip_prefix(PREFIX)
            .and_then(|hex_tag| hex::decode(hex_tag).ok())
            .filter(|tag| tag.len() == 24)
        else {
            return false;
        };
        let full = hmac::sign(&self.0, session.as_bytes());
        subtle::ConstantTimeEq::ct_eq(&full.as_ref()[..24], tag.as_slice()).into()
    }
}

/// 32 random bytes from the system.
pub fn random_secret() -> [u8; 32] {
    let mut secret = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
        .expect("the system's random source");
    secret
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sessions_token_is_the_same_at_every_start_and_no_other_sessions() {
        let key = TokenKey::new(&[7; 32]).unwrap();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let token = key.token(a);
        assert!(token.starts_with("ahm-"));
        assert_eq!(token, TokenKey::new(&[7; 32]).unwrap().token(a));
        assert!(key.is_of(&token, a));
        assert!(!key.is_of(&token, b));
        assert!(!TokenKey::new(&[8; 32]).unwrap().is_of(&token, a));
        for forged in [
            "",
            "ahm-",
            "ahm-zz",
            &token[..token.len() - 2],
            &token.to_uppercase(),
        ] {
            assert!(!key.is_of(forged, a), "{forged:?}");
        }
        assert!(TokenKey::new(&[1; 31]).is_err());
    }
}
