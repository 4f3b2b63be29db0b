//! The session's log, read as ACP `session/update` notifications for the client: the agent's
//! own updates exactly as it sent them (only `sessionId` renamed to the harness session's id),
//! and each prompt a *different* client sent, as `user_message_chunk`s, so every attached client
//! reads the same conversation. The updates an agent replays while the harness reopens it with
//! `session/load` are history the log already holds, and are skipped.

use std::collections::HashSet;

use serde_json::{Value, json};

use crate::pb::v1::{self as pb, LogDirection};

/// What one log entry means to the client.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Read {
    /// `session/update` params to send, in order.
    pub(crate) updates: Vec<Value>,
    /// The agent answered a request the harness sent for an action (its id is the action id):
    /// the id and the `result` or `error`.
    pub(crate) answer: Option<(String, Result<Value, Value>)>,
    /// A prompt went to the agent: its action id (its turn has begun).
    pub(crate) dispatched: Option<String>,
}

pub(crate) struct Translator {
    session_id: String,
    /// Ids of the harness's own `session/load` requests still unanswered.
    loads: HashSet<String>,
}

impl Translator {
    pub(crate) fn new(session_id: &str) -> Self {
        Self {
            session_id: session_id.to_owned(),
            loads: HashSet::new(),
        }
    }

    /// Reads one entry; `ours` says whether an action id is a prompt this client sent (its text
    /// is already on the client's screen).
    pub(crate) fn read(&mut self, entry: &pb::LogEntry, ours: impl Fn(&str) -> bool) -> Read {
        let mut read = Read::default();
        let Ok(frame) = serde_json::from_str::<Value>(&entry.json) else {
            return read;
        };
        let method = frame.get("method").and_then(Value::as_str);
        let id = frame.get("id").filter(|id| !id.is_null());
        match (entry.direction(), method, id) {
            (LogDirection::FromRuntime, Some("session/update"), None) => {
                if self.loads.is_empty()
                    && let Some(update) = frame["params"].get("update")
                {
                    read.updates
                        .push(json!({"sessionId": self.session_id, "update": update}));
                }
            }
            (LogDirection::ToRuntime, Some("session/load"), Some(id)) => {
                self.loads.insert(id.to_string());
            }
            (LogDirection::ToRuntime, Some("session/prompt"), Some(id)) => {
                let action = id.as_str().unwrap_or_default().to_owned();
                if !ours(&action) {
                    read.updates = user_chunks(&self.session_id, &frame["params"]["prompt"]);
                }
                read.dispatched = Some(action);
            }
            (LogDirection::FromRuntime, None, Some(id)) => {
                if self.loads.remove(&id.to_string()) {
                    return read;
                }
                let outcome = match (frame.get("result"), frame.get("error")) {
                    (_, Some(error)) => Err(error.clone()),
                    (result, None) => Ok(result.cloned().unwrap_or(Value::Null)),
                };
                if let Some(action) = id.as_str() {
                    read.answer = Some((action.to_owned(), outcome));
                }
            }
            _ => {}
        }
        read
    }
}

/// A prompt's blocks as the user wrote them: text (the harness's hidden invocation block left
/// out, its escaping undone) and the rest as they were sent.
fn user_chunks(session_id: &str, prompt: &Value) -> Vec<Value> {
    let Some(blocks) = prompt.as_array() else {
        return Vec::new();
    };
    blocks
        .iter()
        .filter(|block| !(block["type"] == "text" && block.get("_meta").is_some_and(|m| !m.is_null())))
        .map(|block| {
            let content = match block["text"].as_str() {
                Some(text) if block["type"] == "text" => json!({
                    "type": "text",
                    "text": text.replace("&lt;m-agent-context", "<m-agent-context"),
                }),
                _ => block.clone(),
            };
            json!({"sessionId": session_id, "update": {"sessionUpdate": "user_message_chunk", "content": content}})
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(direction: LogDirection, frame: Value) -> pb::LogEntry {
        pb::LogEntry {
            direction: direction as i32,
            json: frame.to_string(),
            ..Default::default()
        }
    }

    #[test]
    fn agent_updates_pass_through_under_the_harness_session_id() {
        let mut t = Translator::new("h-1");
        let update = json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}});
        let read = t.read(
            &entry(
                LogDirection::FromRuntime,
                json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "agent-7", "update": update}}),
            ),
            |_| false,
        );
        assert_eq!(
            read.updates,
            vec![json!({"sessionId": "h-1", "update": update})]
        );
    }

    #[test]
    fn another_clients_prompt_shows_as_user_text_without_the_hidden_block() {
        let mut t = Translator::new("h-1");
        let prompt = json!({"jsonrpc": "2.0", "id": "a-1", "method": "session/prompt", "params": {"sessionId": "x", "prompt": [
            {"type": "text", "text": "hello &lt;m-agent-context"},
            {"type": "resource_link", "uri": "https://f.example/a.txt", "name": "a.txt"},
            {"type": "text", "text": "<m-agent-context>{}</m-agent-context>", "_meta": {"macro/invocation-context": true}},
        ]}});
        let theirs = t.read(&entry(LogDirection::ToRuntime, prompt.clone()), |_| false);
        assert_eq!(theirs.dispatched.as_deref(), Some("a-1"));
        assert_eq!(theirs.updates.len(), 2);
        assert_eq!(
            theirs.updates[0]["update"]["content"]["text"],
            "hello <m-agent-context"
        );
        assert_eq!(
            theirs.updates[1]["update"]["content"]["type"],
            "resource_link"
        );
        let ours = t.read(&entry(LogDirection::ToRuntime, prompt), |id| id == "a-1");
        assert!(ours.updates.is_empty());
    }

    #[test]
    fn what_an_agent_replays_while_the_harness_reopens_it_is_skipped() {
        let mut t = Translator::new("h-1");
        let update = |text: &str| {
            entry(
                LogDirection::FromRuntime,
                json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}}}),
            )
        };
        t.read(
            &entry(LogDirection::ToRuntime, json!({"jsonrpc": "2.0", "id": "harness:2:1", "method": "session/load", "params": {}})),
            |_| false,
        );
        assert!(t.read(&update("old"), |_| false).updates.is_empty());
        let answered = t.read(
            &entry(
                LogDirection::FromRuntime,
                json!({"jsonrpc": "2.0", "id": "harness:2:1", "result": {}}),
            ),
            |_| false,
        );
        assert_eq!(answered.answer, None);
        assert_eq!(t.read(&update("new"), |_| false).updates.len(), 1);
    }
}
