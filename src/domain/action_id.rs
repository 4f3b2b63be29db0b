//! Action ids: a UUID v7 names one action end to end — the Control reply, the queue
//! entry, the JSON-RPC id of the dispatched request, every log entry it caused, and the folded
//! message's `request_id`.

use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::error::{Error, Result};

/// A UUID v7 naming one action, always in its canonical lower-case hyphenated form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ActionId(Uuid);

impl ActionId {
    /// A fresh id, ordered by minting time.
    pub fn mint() -> Self {
        Self(Uuid::now_v7())
    }

    /// Validates a caller-minted id: a hyphenated UUID of version 7.
    pub fn parse_v7(text: &str) -> Result<Self> {
        let uuid = parse_hyphenated(text)
            .ok_or_else(|| Error::invalid(format!("action_id {text:?} is not a UUID")))?;
        if uuid.get_version_num() != 7 {
            return Err(Error::invalid(format!(
                "action_id {text:?} is a UUID v{}, not a v7",
                uuid.get_version_num()
            )));
        }
        Ok(Self(uuid))
    }

    /// Reads an id the harness itself stored (any UUID version).
    pub fn from_stored(text: &str) -> Option<Self> {
        parse_hyphenated(text).map(Self)
    }

    /// A JSON-RPC id is an action id only if it is a string that parses as a UUID; the harness's
    /// own handshake ids (`harness:{epoch}:{n}`) and agents' numeric ids never do.
    pub fn from_jsonrpc_id(id: &serde_json::Value) -> Option<Self> {
        id.as_str().and_then(parse_hyphenated).map(Self)
    }

    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

fn parse_hyphenated(text: &str) -> Option<Uuid> {
    // Only the 36-character hyphenated form, so one action has exactly one spelling.
    if text.len() != 36 {
        return None;
    }
    Uuid::try_parse(text).ok()
}

impl fmt::Display for ActionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

/// Parses a session id: any hyphenated UUID.
pub fn parse_session_id(text: &str) -> Result<Uuid> {
    parse_hyphenated(text)
        .ok_or_else(|| Error::invalid(format!("session_id {text:?} is not a UUID")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_minted_action_id_is_a_v7_that_parses_back() {
        let id = ActionId::mint();
        assert_eq!(id.as_uuid().get_version_num(), 7);
        assert_eq!(ActionId::parse_v7(&id.to_string()).unwrap(), id);
    }

    #[test]
    fn an_upper_case_v7_is_read_in_its_canonical_spelling() {
        let id = ActionId::mint();
        let upper = id.to_string().to_uppercase();
        assert_eq!(
            ActionId::parse_v7(&upper).unwrap().to_string(),
            id.to_string()
        );
    }

    #[test]
    fn a_v4_uuid_or_garbage_is_not_a_valid_action_id() {
        let v4 = "6f1c1c1e-8d3b-4d51-9a47-2f7bb8c1a0d2";
        assert!(ActionId::parse_v7(v4).unwrap_err().message.contains("v4"));
        assert!(ActionId::parse_v7("not-a-uuid").is_err());
        assert!(ActionId::parse_v7("").is_err());
        let simple = ActionId::mint().to_string().replace('-', "");
        assert!(ActionId::parse_v7(&simple).is_err());
    }

    #[test]
    fn handshake_ids_and_numbers_are_not_action_ids() {
        assert_eq!(ActionId::from_jsonrpc_id(&json!("harness:1:0")), None);
        assert_eq!(ActionId::from_jsonrpc_id(&json!(7)), None);
        assert_eq!(ActionId::from_jsonrpc_id(&json!("7")), None);
        assert_eq!(ActionId::from_jsonrpc_id(&json!(null)), None);
        let id = ActionId::mint();
        assert_eq!(ActionId::from_jsonrpc_id(&json!(id.to_string())), Some(id));
    }
}
