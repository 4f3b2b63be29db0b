//! ACP v1 frames the mock agent writes, appended as single lines to an output buffer. The hot
//! path (text chunks) is written directly, without building a `Value`.

use agent_client_protocol_schema::v1::{ErrorCode, StopReason};
use serde::Serialize;
use serde_json::{Value, json};

/// A tiny 1x1 transparent PNG, base64.
pub const PIXEL_PNG_BASE64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

fn end(buf: &mut Vec<u8>) {
    buf.push(b'\n');
}

fn json_into<T: Serialize + ?Sized>(buf: &mut Vec<u8>, value: &T) {
    serde_json::to_writer(&mut *buf, value).expect("serialising to memory cannot fail");
}

/// `{"jsonrpc":"2.0","id":ID,"result":RESULT}`.
pub fn response(buf: &mut Vec<u8>, id: &Value, result: &impl Serialize) {
    buf.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    json_into(buf, id);
    buf.extend_from_slice(br#","result":"#);
    json_into(buf, result);
    buf.push(b'}');
    end(buf);
}

/// `{"jsonrpc":"2.0","id":ID,"error":{"code":CODE,"message":MESSAGE}}`.
pub fn error(buf: &mut Vec<u8>, id: &Value, code: ErrorCode, message: &str) {
    json_into(
        buf,
        &json!({"jsonrpc": "2.0", "id": id, "error": {"code": i32::from(code), "message": message}}),
    );
    end(buf);
}

/// A request of the agent's own, with a numeric id.
pub fn request(buf: &mut Vec<u8>, id: i64, method: &str, params: &Value) {
    json_into(
        buf,
        &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
    );
    end(buf);
}

pub fn notification(buf: &mut Vec<u8>, method: &str, params: &Value) {
    json_into(
        buf,
        &json!({"jsonrpc": "2.0", "method": method, "params": params}),
    );
    end(buf);
}

/// `session/update` with an arbitrary update object (which carries its own `sessionUpdate`).
pub fn update(buf: &mut Vec<u8>, session_id: &str, update: &Value) {
    buf.extend_from_slice(br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"#);
    json_into(buf, session_id);
    buf.extend_from_slice(br#","update":"#);
    json_into(buf, update);
    buf.extend_from_slice(b"}}");
    end(buf);
}

/// The kinds of content chunk updates.
#[derive(Debug, Clone, Copy)]
pub enum ChunkKind {
    User,
    Agent,
    Thought,
}

impl ChunkKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::User => "user_message_chunk",
            Self::Agent => "agent_message_chunk",
            Self::Thought => "agent_thought_chunk",
        }
    }
}

/// A content chunk update whose content is one `text` block.
pub fn text_chunk(buf: &mut Vec<u8>, session_id: &str, kind: ChunkKind, text: &str) {
    buf.extend_from_slice(br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"#);
    json_into(buf, session_id);
    buf.extend_from_slice(br#","update":{"sessionUpdate":""#);
    buf.extend_from_slice(kind.as_str().as_bytes());
    buf.extend_from_slice(br#"","content":{"type":"text","text":"#);
    json_into(buf, text);
    buf.extend_from_slice(b"}}}}");
    end(buf);
}

/// An `agent_message_chunk` whose content is the given block, as is.
pub fn block_chunk(buf: &mut Vec<u8>, session_id: &str, block: &Value) {
    buf.extend_from_slice(br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"#);
    json_into(buf, session_id);
    buf.extend_from_slice(br#","update":{"sessionUpdate":"agent_message_chunk","content":"#);
    json_into(buf, block);
    buf.extend_from_slice(b"}}}");
    end(buf);
}

/// The prompt's answer: `{"stopReason": REASON}`.
pub fn stop(buf: &mut Vec<u8>, id: &Value, reason: StopReason) {
    stop_with_usage(buf, id, reason, None);
}

/// The prompt's answer, with the turn's token usage (input, output) when given:
/// `{"stopReason": REASON, "usage": {"totalTokens", "inputTokens", "outputTokens"}}`.
pub fn stop_with_usage(
    buf: &mut Vec<u8>,
    id: &Value,
    reason: StopReason,
    usage: Option<(u64, u64)>,
) {
    buf.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    json_into(buf, id);
    buf.extend_from_slice(br#","result":{"stopReason":"#);
    json_into(buf, &reason);
    if let Some((input, output)) = usage {
        buf.extend_from_slice(br#","usage":"#);
        json_into(
            buf,
            &serde_json::json!({"totalTokens": input + output, "inputTokens": input, "outputTokens": output}),
        );
    }
    buf.extend_from_slice(b"}}");
    end(buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(write: impl FnOnce(&mut Vec<u8>)) -> Value {
        let mut buf = Vec::new();
        write(&mut buf);
        assert_eq!(buf.last(), Some(&b'\n'), "every frame ends its line");
        assert_eq!(
            buf.iter().filter(|b| **b == b'\n').count(),
            1,
            "one line per frame"
        );
        serde_json::from_slice(&buf).expect("valid JSON")
    }

    #[test]
    fn a_text_chunk_is_a_session_update_with_one_escaped_text_block() {
        let frame = line(|b| text_chunk(b, "s\"1", ChunkKind::Agent, "a\nb\"c"));
        assert_eq!(
            frame,
            json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s\"1",
                "update": {"sessionUpdate": "agent_message_chunk",
                           "content": {"type": "text", "text": "a\nb\"c"}}}})
        );
        let thought = line(|b| text_chunk(b, "s", ChunkKind::Thought, "hm"));
        assert_eq!(
            thought["params"]["update"]["sessionUpdate"],
            "agent_thought_chunk"
        );
        let user = line(|b| text_chunk(b, "s", ChunkKind::User, "hi"));
        assert_eq!(
            user["params"]["update"]["sessionUpdate"],
            "user_message_chunk"
        );
    }

    #[test]
    fn responses_keep_the_request_id_exactly() {
        for id in [
            json!(7),
            json!("7"),
            json!("018f0000-0000-7000-8000-000000000000"),
        ] {
            assert_eq!(
                line(|b| stop(b, &id, StopReason::EndTurn)),
                json!({"jsonrpc": "2.0", "id": id, "result": {"stopReason": "end_turn"}})
            );
            assert_eq!(
                line(|b| error(b, &id, ErrorCode::MethodNotFound, "no")),
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "no"}})
            );
            assert_eq!(
                line(|b| response(b, &id, &json!({"a": 1}))),
                json!({"jsonrpc": "2.0", "id": id, "result": {"a": 1}})
            );
        }
    }

    #[test]
    fn block_chunks_and_updates_wrap_their_payload_unchanged() {
        let block = json!({"type": "resource_link", "name": "n", "uri": "https://x", "size": 2});
        assert_eq!(
            line(|b| block_chunk(b, "s", &block)),
            json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s",
                "update": {"sessionUpdate": "agent_message_chunk", "content": block}}})
        );
        let plan = json!({"sessionUpdate": "plan", "entries": []});
        assert_eq!(
            line(|b| update(b, "s", &plan)),
            json!({"jsonrpc": "2.0", "method": "session/update",
                   "params": {"sessionId": "s", "update": plan}})
        );
    }

    #[test]
    fn the_pixel_is_valid_base64() {
        use base64::Engine as _;
        let png = base64::engine::general_purpose::STANDARD
            .decode(PIXEL_PNG_BASE64)
            .unwrap();
        assert_eq!(&png[1..4], b"PNG");
    }
}
