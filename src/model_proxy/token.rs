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

    /// The key kept in `path` (64 hex digits), made there (mode 0600) when it is missing, so a
    /// session's token outlives a restart of the server.
    pub fn load_or_create(path: &std::path::Path) -> std::io::Result<Self> {
        use std::io::Write;
        let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let secret = hex::decode(text.trim())
                    .ok()
                    .filter(|s| s.len() == 32)
                    .ok_or_else(|| {
                        invalid(format!("{} does not hold 64 hex digits", path.display()))
                    })?;
                Self::new(&secret).map_err(invalid)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let secret = random_secret();
                let mut options = std::fs::OpenOptions::new();
                options.write(true).create_new(true);
                std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
                match options.open(path) {
                    Ok(mut file) => {
                        writeln!(file, "{}", hex::encode(secret))?;
                        file.sync_all()?;
                        Self::new(&secret).map_err(invalid)
                    }
                    // Made at the same moment by another: theirs is the key.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        Self::load_or_create(path)
                    }
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
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

    #[test]
    fn the_key_kept_in_a_file_gives_the_same_tokens_after_a_restart_and_a_bad_file_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model-proxy.key");
        let session = Uuid::now_v7();
        let first = TokenKey::load_or_create(&path).unwrap().token(session);
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            TokenKey::load_or_create(&path).unwrap().token(session),
            first
        );
        std::fs::write(&path, "not hex\n").unwrap();
        assert!(TokenKey::load_or_create(&path).is_err());
    }
}
