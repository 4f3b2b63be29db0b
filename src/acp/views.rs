//! What the harness reads of ACP frames, as small lenient serde views over their parsed JSON
//! (built with `acp/lenient.rs`): the JSON-RPC envelope, the replies the session actor reacts
//! to, the outbound frames `acp/frames.rs` reads back, and the advertised config options. The
//! fold's own views (`acp/fold/views.rs`) build on these. A field that is missing or of another
//! shape reads as absent, so a misbehaving runtime can make the harness skip a field, never fail
//! on a frame or panic. Each view names only the fields read; everything else is ignored. Only
//! the reading is typed: the log keeps every frame word for word.

use std::collections::BTreeMap;

use serde::{Deserialize, de::IgnoredAny};
use serde_json::Value;
use serde_with::{DefaultOnError, serde_as};

pub use super::lenient::{Field, view};
use super::lenient::{object, objects, present, present_object};

// ---- JSON-RPC ----------------------------------------------------------------------------------

/// Any JSON-RPC frame: a request (`method` and `id`), a notification (`method`), a reply (`id`
/// and no `method` at all, with `result` or `error`).
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct Envelope<'a> {
    #[serde(borrow)]
    pub method: Field<&'a str>,
    #[serde(deserialize_with = "present")]
    pub id: Option<Value>,
    #[serde(deserialize_with = "present")]
    pub error: Option<Value>,
}

/// A request's or notification's `params`, when an object.
#[derive(Deserialize, Default)]
#[serde(default, bound(deserialize = "P: Deserialize<'de> + Default"))]
pub struct Params<P> {
    #[serde(deserialize_with = "object")]
    pub params: Option<P>,
}

/// A request's `params` as they came.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct RawParams {
    #[serde(deserialize_with = "present")]
    pub params: Option<Value>,
}

/// A reply. `result` and `error` count whenever they are there, in any shape: one that is not
/// an object reads as the view's default (`"result": null` still answers the request).
#[derive(Deserialize, Default)]
#[serde(default, bound(deserialize = "'de: 'a, R: Deserialize<'de> + Default"))]
pub struct Reply<'a, R> {
    #[serde(deserialize_with = "present")]
    pub id: Option<Value>,
    #[serde(deserialize_with = "present_object")]
    pub result: Option<R>,
    #[serde(borrow, deserialize_with = "present_object")]
    pub error: Option<RpcError<'a>>,
}

/// A JSON-RPC error object.
#[serde_as]
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct RpcError<'a> {
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub code: Option<i64>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub message: Option<&'a str>,
    /// Agents put the detail here: Codex a `message` ("Internal error" says nothing, its
    /// `data.message` says what the model API answered), others a string.
    #[serde(deserialize_with = "present")]
    pub data: Option<Value>,
}

impl RpcError<'_> {
    /// The error as a person reads it: the message, and the detail from `data` (its
    /// `message`, its `details` as the ACP TypeScript SDK sends an internal error's cause, or
    /// `data` itself when a string) unless the message already says it.
    pub fn describe(&self) -> Option<String> {
        let detail = match &self.data {
            Some(Value::String(text)) => Some(text.as_str()),
            Some(data) => ["message", "details"]
                .iter()
                .find_map(|key| data.get(*key).and_then(Value::as_str)),
            None => None,
        }
        .map(str::trim)
        .filter(|d| !d.is_empty());
        match (
            self.message.map(str::trim).filter(|m| !m.is_empty()),
            detail,
        ) {
            (Some(message), Some(detail)) if !message.contains(detail) => {
                Some(format!("{message}: {detail}"))
            }
            (Some(message), _) => Some(message.to_owned()),
            (None, detail) => detail.map(str::to_owned),
        }
    }
}

// ---- replies the session reacts to -------------------------------------------------------------

/// `session/prompt` → `result`.
#[serde_as]
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct PromptResult<'a> {
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub stop_reason: Option<&'a str>,
    /// The turn's token usage, when the agent reports it (an unstable ACP field).
    #[serde(deserialize_with = "object")]
    pub usage: Option<TurnUsage>,
}

/// A prompt reply's `usage`: tokens of this turn.
#[serde_as]
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct TurnUsage {
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub input_tokens: Option<u64>,
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub output_tokens: Option<u64>,
}

/// The `result` of a handshake step (`initialize`, `session/new`, `fork`, `resume`, `load`) or
/// of `session/set_config_option`.
#[serde_as]
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct SessionResult<'a> {
    #[serde(deserialize_with = "object")]
    pub agent_capabilities: Option<AgentCapabilities>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub session_id: Option<&'a str>,
    /// The advertised config options, when an array (each kept as it came).
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub config_options: Option<Vec<Value>>,
    /// `initialize` → the ways the agent can be signed in (each kept as it came).
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub auth_methods: Option<Vec<Value>>,
}

/// `initialize` → `agentCapabilities`, as far as sessions go.
#[serde_as]
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct AgentCapabilities {
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub load_session: Option<bool>,
    #[serde(deserialize_with = "object")]
    pub session_capabilities: Option<SessionCapabilities>,
}

/// `agentCapabilities.sessionCapabilities`: a capability is advertised by any value but `null`.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct SessionCapabilities {
    pub resume: Option<IgnoredAny>,
    pub fork: Option<IgnoredAny>,
}

/// `session/update` → `params`, for a `config_option_update`.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct UpdateParams<'a> {
    #[serde(borrow, deserialize_with = "object")]
    pub update: Option<ConfigOptionUpdate<'a>>,
}

/// One `session/update`, as far as the session reads it.
#[serde_as]
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct ConfigOptionUpdate<'a> {
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub session_update: Option<&'a str>,
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub config_options: Option<Vec<Value>>,
    /// A `usage_update`'s cumulative cost.
    #[serde(borrow, deserialize_with = "object")]
    pub cost: Option<UpdateCost<'a>>,
    /// A `tool_call` or `tool_call_update`: which call, its title, kind and status.
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub tool_call_id: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub title: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub kind: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub status: Option<&'a str>,
}

/// A `usage_update`'s `cost`: the session's cumulative cost so far.
#[serde_as]
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct UpdateCost<'a> {
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub amount: Option<f64>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub currency: Option<&'a str>,
}

/// `$/cancel_request` → `params`.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct CancelParams {
    #[serde(deserialize_with = "present")]
    pub request_id: Option<Value>,
}

// ---- outbound frames read back -----------------------------------------------------------------

/// `session/prompt` → `params`.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct PromptParams<'a> {
    #[serde(borrow, deserialize_with = "objects")]
    pub prompt: Option<Vec<ContentBlock<'a>>>,
}

/// A content block: its type, its text when text, its link when a `resource_link`, and the
/// keys of its `_meta` (which mark the hidden invocation block).
#[serde_as]
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct ContentBlock<'a> {
    #[serde(borrow, rename = "type")]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub kind: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub text: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub uri: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub name: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub mime_type: Option<&'a str>,
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub size: Option<i64>,
    #[serde(borrow, rename = "_meta", deserialize_with = "object")]
    pub meta: Option<BTreeMap<&'a str, IgnoredAny>>,
}

/// `session/set_config_option` → `params`: the value as it came (a string or a boolean when
/// the harness wrote it).
#[serde_as]
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct SetConfigParams<'a> {
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub config_id: Option<&'a str>,
    #[serde(deserialize_with = "present")]
    pub value: Option<Value>,
}

/// A reply's `result` as it came.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct RawResult {
    #[serde(deserialize_with = "present")]
    pub result: Option<Value>,
}

/// The `result` of the harness's answer to an agent's request: a permission `outcome`, or an
/// elicitation's `action` (with the rest of the answer beside it).
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct AnswerResult {
    #[serde(deserialize_with = "present")]
    pub outcome: Option<Value>,
    pub action: Field<IgnoredAny>,
}

// ---- config options ----------------------------------------------------------------------------

/// One advertised config option (`configOptions[i]`).
#[serde_as]
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct ConfigOption<'a> {
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub id: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub category: Option<&'a str>,
    /// `select` or `boolean`.
    #[serde(borrow, rename = "type")]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub kind: Option<&'a str>,
    /// As it came: a select's value id, a boolean's flag.
    #[serde(deserialize_with = "present")]
    pub current_value: Option<Value>,
}

impl ConfigOption<'_> {
    /// The current value when it is a string (a select's value id).
    pub fn current_id(&self) -> Option<&str> {
        self.current_value.as_ref().and_then(Value::as_str)
    }
}

/// One entry of a select config option's `options`: a choice (it has a `value`), or a group of
/// further entries.
#[serde_as]
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct Choice<'a> {
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub value: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub name: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub description: Option<&'a str>,
    /// A group's entries.
    #[serde(borrow, deserialize_with = "objects")]
    pub options: Option<Vec<Choice<'a>>>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Shapes a misbehaving runtime may send where an object is expected.
    fn not_objects() -> [Value; 6] {
        [
            json!(null),
            json!(true),
            json!(7),
            json!("text"),
            json!([{"method": "session/update", "id": 1}]),
            json!([]),
        ]
    }

    #[test]
    fn an_envelope_tells_a_missing_method_from_one_of_another_shape() {
        let frame = json!({"id": 1});
        let missing: Envelope = view(&frame);
        assert!(missing.method.is_missing());
        assert_eq!(missing.id, Some(json!(1)));
        for odd in [json!(null), json!(5), json!(["session/update"]), json!({})] {
            let frame = json!({"id": 1, "method": odd});
            let envelope: Envelope = view(&frame);
            assert_eq!(envelope.method, Field::Other, "{frame}");
            assert_eq!(envelope.method.ok(), None, "{frame}");
        }
        let frame = json!({"id": null, "method": "session/update"});
        let request: Envelope = view(&frame);
        assert_eq!(request.method, Field::Is("session/update"));
        assert_eq!(request.id, Some(Value::Null), "a null id is there");
        for frame in not_objects() {
            let envelope: Envelope = view(&frame);
            assert!(
                envelope.method.is_missing() && envelope.id.is_none(),
                "{frame}"
            );
            assert!(envelope.error.is_none(), "{frame}");
        }
    }

    #[test]
    fn a_reply_field_counts_when_it_is_there_in_any_shape_and_reads_what_it_can() {
        let frame = json!({"id": 1});
        let missing: Reply<PromptResult> = view(&frame);
        assert!(missing.result.is_none() && missing.error.is_none());
        for odd in not_objects() {
            let frame = json!({"id": 1, "result": odd, "error": odd});
            let reply: Reply<PromptResult> = view(&frame);
            let result = reply.result.expect("a result is there");
            assert_eq!(result.stop_reason, None, "{frame}");
            let error = reply.error.expect("an error is there");
            assert_eq!((error.code, error.message), (None, None), "{frame}");
        }
        let frame = json!({"id": 1,
            "result": {"stopReason": "cancelled", "extra": [1, 2]},
            "error": {"code": -32603, "message": "internal", "data": {"x": 1}}});
        let reply: Reply<PromptResult> = view(&frame);
        assert_eq!(
            reply.result.expect("a result").stop_reason,
            Some("cancelled")
        );
        let error = reply.error.expect("an error");
        assert_eq!(
            (error.code, error.message),
            (Some(-32603), Some("internal"))
        );
    }

    #[test]
    fn an_error_object_of_odd_fields_reads_as_far_as_it_goes() {
        for (error, code, message) in [
            (json!({"code": "-1", "message": 5}), None, None),
            (json!({"code": 1.5, "message": ["m"]}), None, None),
            (
                json!({"code": 18446744073709551615_u64, "message": "big"}),
                None,
                Some("big"),
            ),
            (json!({"code": -1, "message": null}), Some(-1), None),
        ] {
            let read: RpcError = view(&error);
            assert_eq!((read.code, read.message), (code, message), "{error}");
        }
    }

    #[test]
    fn a_session_result_keeps_config_options_only_when_an_array_and_each_as_it_came() {
        let result = json!({"sessionId": "s-1", "configOptions": [{"id": "model"}, "odd", null]});
        let read: SessionResult = view(&result);
        assert_eq!(read.session_id, Some("s-1"));
        assert_eq!(
            read.config_options,
            Some(vec![json!({"id": "model"}), json!("odd"), json!(null)])
        );
        for odd in [
            json!(null),
            json!({"id": "model"}),
            json!("model"),
            json!(3),
        ] {
            let result = json!({"sessionId": 7, "configOptions": odd});
            let read: SessionResult = view(&result);
            assert_eq!(read.session_id, None, "{result}");
            assert_eq!(read.config_options, None, "{result}");
        }
    }

    #[test]
    fn an_update_is_read_only_when_params_and_update_are_objects() {
        let frame = json!({"method": "session/update", "params": {"update":
            {"sessionUpdate": "config_option_update", "configOptions": [{"id": "mode"}]}}});
        let update = view::<Params<UpdateParams>>(&frame)
            .params
            .and_then(|p| p.update)
            .expect("an update");
        assert_eq!(update.session_update, Some("config_option_update"));
        assert_eq!(update.config_options, Some(vec![json!({"id": "mode"})]));
        for odd in [
            json!({"params": [{"update": {}}]}),
            json!({"params": "update"}),
            json!({"params": {"update": [{"sessionUpdate": "config_option_update"}]}}),
            json!({"params": {"update": null}}),
        ] {
            let update = view::<Params<UpdateParams>>(&odd)
                .params
                .and_then(|p| p.update);
            assert!(update.is_none(), "{odd}");
        }
        let odd = json!({"params": {"update": {"sessionUpdate": 1, "configOptions": "x"}}});
        let update = view::<Params<UpdateParams>>(&odd)
            .params
            .and_then(|p| p.update)
            .expect("an update");
        assert_eq!((update.session_update, update.config_options), (None, None));
    }

    #[test]
    fn a_cancel_request_keeps_its_request_id_as_it_came() {
        for id in [
            json!(7),
            json!("7"),
            json!(null),
            json!(1.5),
            json!({"id": 1}),
        ] {
            let frame = json!({"method": "$/cancel_request", "params": {"requestId": id}});
            let params = view::<Params<CancelParams>>(&frame).params.expect("params");
            assert_eq!(params.request_id, Some(id.clone()), "{frame}");
        }
        let params = view::<Params<CancelParams>>(&json!({"params": {}})).params;
        assert_eq!(params.expect("params").request_id, None);
    }

    #[test]
    fn a_content_block_reads_each_field_leniently_and_meta_only_as_an_object() {
        let block = json!({"type": "resource_link", "uri": "u", "name": "n",
            "mimeType": "image/png", "size": 2048, "_meta": {"k": null, "j": [1]}});
        let read: ContentBlock = view(&block);
        assert_eq!(read.kind, Some("resource_link"));
        assert_eq!((read.uri, read.name), (Some("u"), Some("n")));
        assert_eq!((read.mime_type, read.size), (Some("image/png"), Some(2048)));
        let keys: Vec<&str> = read.meta.expect("meta").into_keys().collect();
        assert_eq!(keys, ["j", "k"]);
        let odd = json!({"type": 1, "text": {"t": "x"}, "uri": null, "name": ["n"],
            "mimeType": 5, "size": 2048.0, "_meta": ["k"]});
        let read: ContentBlock = view(&odd);
        assert_eq!(
            (read.kind, read.text, read.uri, read.name),
            (None, None, None, None)
        );
        assert_eq!((read.mime_type, read.size), (None, None));
        assert!(read.meta.is_none());
        for size in [json!(-1.5), json!("2048"), json!(18446744073709551615_u64)] {
            let block = json!({"size": size});
            let read: ContentBlock = view(&block);
            assert_eq!(read.size, None, "{size}");
        }
        for meta in [json!("k"), json!(null), json!(1)] {
            let block = json!({"_meta": meta});
            let read: ContentBlock = view(&block);
            assert!(read.meta.is_none(), "{meta}");
        }
    }

    #[test]
    fn prompt_params_read_each_block_that_is_not_an_object_as_an_empty_one() {
        let frame = json!({"params": {"prompt": [{"type": "text", "text": "hi"}, "hi", 3, null]}});
        let blocks = view::<Params<PromptParams>>(&frame)
            .params
            .and_then(|p| p.prompt)
            .expect("blocks");
        assert_eq!(blocks.len(), 4);
        assert_eq!(blocks[0].text, Some("hi"));
        assert!(
            blocks[1..]
                .iter()
                .all(|b| b.kind.is_none() && b.text.is_none())
        );
        for odd in [
            json!({"prompt": "hi"}),
            json!({"prompt": {"0": {}}}),
            json!({}),
        ] {
            let frame = json!({"params": odd});
            let params = view::<Params<PromptParams>>(&frame).params.expect("params");
            assert!(params.prompt.is_none(), "{frame}");
        }
    }

    #[test]
    fn set_config_params_keep_a_value_there_even_as_null() {
        let null_value = json!({"configId": "mode", "value": null});
        let params: SetConfigParams = view(&null_value);
        assert_eq!(params.config_id, Some("mode"));
        assert_eq!(params.value, Some(Value::Null));
        let odd = json!({"configId": 5});
        let params: SetConfigParams = view(&odd);
        assert_eq!((params.config_id, params.value), (None, None));
    }

    #[test]
    fn an_answer_tells_an_outcome_from_an_action_there_in_any_shape() {
        let permission: AnswerResult = view(&json!({"outcome": {"outcome": "cancelled"}}));
        assert_eq!(permission.outcome, Some(json!({"outcome": "cancelled"})));
        assert!(permission.action.is_missing());
        for action in [json!(null), json!("accept"), json!(3)] {
            let answer: AnswerResult = view(&json!({"action": action}));
            assert!(!answer.action.is_missing(), "{action}");
            assert!(answer.outcome.is_none(), "{action}");
        }
        let raw: RawResult = view(&json!({"id": 1, "result": null}));
        assert_eq!(raw.result, Some(Value::Null));
    }

    #[test]
    fn a_config_option_reads_its_current_value_as_it_came() {
        let option = json!({"id": "model", "category": "model", "type": "select",
            "currentValue": "fast", "options": []});
        let read: ConfigOption = view(&option);
        assert_eq!(
            (read.id, read.category, read.kind),
            (Some("model"), Some("model"), Some("select"))
        );
        assert_eq!(read.current_id(), Some("fast"));
        let flag = json!({"id": "thinking", "type": "boolean", "currentValue": true});
        let flag: ConfigOption = view(&flag);
        assert_eq!(flag.current_value, Some(json!(true)));
        assert_eq!(flag.current_id(), None);
        let odd = json!({"id": 1, "category": ["model"], "type": null, "currentValue": null});
        let odd: ConfigOption = view(&odd);
        assert_eq!((odd.id, odd.category, odd.kind), (None, None, None));
        assert_eq!(odd.current_value, Some(Value::Null));
        for odd in not_objects() {
            let read: ConfigOption = view(&odd);
            assert!(read.id.is_none() && read.current_value.is_none(), "{odd}");
        }
    }

    #[test]
    fn choices_nest_in_groups_and_garbage_entries_read_as_empty_ones() {
        let option = json!({"options": [
            {"value": "a", "name": "A", "description": 5},
            {"group": "g", "options": [{"value": "b"}, "c", {"options": "d"}]},
            7,
        ]});
        let entries = view::<Choice>(&option).options.expect("entries");
        assert_eq!(entries.len(), 3);
        assert_eq!((entries[0].value, entries[0].name), (Some("a"), Some("A")));
        assert_eq!(entries[0].description, None);
        let group = entries[1].options.as_ref().expect("a group");
        assert_eq!(group[0].value, Some("b"));
        assert!(group[1].value.is_none() && group[1].options.is_none());
        assert!(
            group[2].options.is_none(),
            "a group that is not an array has no entries"
        );
        assert!(entries[2].value.is_none() && entries[2].options.is_none());
        for odd in [
            json!({"options": {"value": "a"}}),
            json!({"options": "a"}),
            json!({}),
        ] {
            assert!(view::<Choice>(&odd).options.is_none(), "{odd}");
        }
    }
}
