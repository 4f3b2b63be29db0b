//! `--json` output: one compact JSON object per line. Enum values are the proto names in lower
//! case without their prefix (`end_turn`, `running`); JSON carried as a string by the contract
//! (log frames, tool content) is embedded as JSON.

use prost_types::Timestamp;
use serde_json::{Map, Value, json};

use crate::pb::v1::{self as pb, message_part::Kind, subscribe_response::Event};

/// `STOP_REASON_END_TURN` → `end_turn`.
pub(crate) fn enum_name(full: &str, prefix: &str) -> String {
    full.strip_prefix(prefix)
        .unwrap_or(full)
        .to_ascii_lowercase()
}

pub(crate) fn status_name(status: pb::SessionStatus) -> String {
    enum_name(status.as_str_name(), "SESSION_STATUS_")
}

pub(crate) fn stop_reason_name(reason: pb::StopReason) -> String {
    enum_name(reason.as_str_name(), "STOP_REASON_")
}

pub(crate) fn outcome_name(outcome: pb::InteractionOutcome) -> String {
    enum_name(outcome.as_str_name(), "INTERACTION_OUTCOME_")
}

fn timestamp(ts: &Option<Timestamp>) -> Value {
    ts.as_ref()
        .map_or(Value::Null, |ts| Value::String(ts.to_string()))
}

/// JSON text from the contract, embedded as JSON (or kept as a string if it is not JSON).
fn embedded(text: &str) -> Value {
    if text.is_empty() {
        return Value::Null;
    }
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

fn request_id(id: &Option<pb::JsonRpcId>) -> Value {
    match id.as_ref().and_then(|id| id.id.as_ref()) {
        Some(pb::json_rpc_id::Id::Number(n)) => json!(n),
        Some(pb::json_rpc_id::Id::Text(t)) => json!(t),
        None => Value::Null,
    }
}

pub(crate) fn session(session: &pb::AgentSession) -> Value {
    json!({
        "id": session.id,
        "name": session.name,
        "owner": session.owner,
        "profile": session.profile,
        "cwd": session.cwd,
        "model": session.model,
        "status": status_name(session.status()),
        "status_reason": session.status_reason,
        "labels": session.labels,
        "editors": session.editors,
        "head_offset": session.head_offset,
        "created_at": timestamp(&session.created_at),
        "updated_at": timestamp(&session.updated_at),
    })
}

pub(crate) fn control(response: &pb::ControlResponse) -> Value {
    json!({
        "type": "control",
        "action_id": response.action_id,
        "status": enum_name(response.status().as_str_name(), "CONTROL_STATUS_"),
        "queue_position": response.queue_position,
    })
}

pub(crate) fn log_entry(entry: &pb::LogEntry) -> Value {
    json!({
        "offset": entry.offset,
        "direction": enum_name(entry.direction().as_str_name(), "LOG_DIRECTION_"),
        "actor": entry.actor,
        "action_id": entry.action_id,
        "epoch": entry.epoch,
        "created_at": timestamp(&entry.created_at),
        "frame": embedded(&entry.json),
    })
}

fn attachment(a: &pb::PromptAttachment) -> Value {
    json!({"uri": a.uri, "name": a.name, "mime_type": a.mime_type, "size": a.size})
}

fn part(part: &pb::MessagePart) -> Value {
    match &part.kind {
        Some(Kind::Text(t)) => json!({"type": "text", "text": t.text}),
        Some(Kind::Thought(t)) => json!({"type": "thought", "text": t.text}),
        Some(Kind::Attachment(a)) => {
            let mut value = attachment(a);
            value["type"] = json!("attachment");
            value
        }
        Some(Kind::Tool(t)) => json!({
            "type": "tool",
            "tool_call_id": t.tool_call_id,
            "title": t.title,
            "kind": t.kind,
            "status": t.status,
            "content": embedded(&t.content_json),
        }),
        Some(Kind::Plan(p)) => json!({
            "type": "plan",
            "entries": p.entries.iter().map(|e| json!({
                "content": e.content, "priority": e.priority, "status": e.status,
            })).collect::<Vec<_>>(),
        }),
        Some(Kind::Permission(p)) => json!({
            "type": "permission",
            "request_id": request_id(&p.request_id),
            "tool_call": embedded(&p.tool_call_json),
            "options": p.options.iter().map(|o| json!({
                "option_id": o.option_id, "name": o.name, "kind": o.kind,
            })).collect::<Vec<_>>(),
            "outcome": outcome_name(p.outcome()),
            "selected_option_id": p.selected_option_id,
        }),
        Some(Kind::Elicitation(e)) => json!({
            "type": "elicitation",
            "request_id": request_id(&e.request_id),
            "message": e.message,
            "request": embedded(&e.request_json),
            "outcome": outcome_name(e.outcome()),
            "answer": embedded(&e.answer_json),
        }),
        Some(Kind::Control(c)) => json!({
            "type": "control",
            "kind": enum_name(c.kind().as_str_name(), "CONTROL_KIND_"),
            "value": c.value,
            "outcome": outcome_name(c.outcome()),
        }),
        Some(Kind::Content(c)) => json!({"type": c.r#type, "content": embedded(&c.json)}),
        Some(Kind::ContextRebuilt(c)) => json!({
            "type": "context_rebuilt",
            "reason": c.reason,
            "turns": c.turns,
            "bytes": c.bytes,
        }),
        None => json!({"type": "unknown"}),
    }
}

pub(crate) fn message(m: &pb::TranscriptMessage) -> Value {
    json!({
        "id": m.id,
        "turn": m.turn,
        "role": enum_name(m.role().as_str_name(), "MESSAGE_ROLE_"),
        "request_id": m.request_id,
        "actor": m.actor,
        "parts": m.parts.iter().map(part).collect::<Vec<_>>(),
        "stop_reason": m.stop_reason.map(|_| stop_reason_name(m.stop_reason())),
        "error": m.error,
        "first_offset": m.first_offset,
        "last_offset": m.last_offset,
    })
}

/// One Subscribe event: `{"type": ..., "offset": N, ...}`.
pub(crate) fn event(response: &pb::SubscribeResponse) -> Value {
    let mut object = Map::new();
    let (kind, body) = match &response.event {
        Some(Event::Entry(entry)) => ("log_entry", json!({"entry": log_entry(entry)})),
        Some(Event::Message(m)) => ("message", json!({"message": message(m)})),
        Some(Event::Queue(q)) => (
            "queue",
            json!({"entries": q.entries.iter().map(|e| json!({
                "action_id": e.action_id,
                "kind": enum_name(e.kind().as_str_name(), "QUEUED_ACTION_KIND_"),
                "prompt": e.prompt,
                "attachments": e.attachments.iter().map(attachment).collect::<Vec<_>>(),
                "actor": e.actor,
            })).collect::<Vec<_>>()}),
        ),
        Some(Event::Status(s)) => (
            "status",
            json!({"status": status_name(s.status()), "reason": s.reason}),
        ),
        Some(Event::CaughtUp(c)) => ("caught_up", json!({"head_offset": c.head_offset})),
        Some(Event::Heartbeat(h)) => ("heartbeat", json!({"head_offset": h.head_offset})),
        Some(Event::TurnEnded(t)) => (
            "turn_ended",
            json!({
                "turn": t.turn,
                "request_id": t.request_id,
                "stop_reason": stop_reason_name(t.stop_reason()),
                "error": t.error,
            }),
        ),
        None => ("unknown", json!({})),
    };
    object.insert("type".into(), json!(kind));
    object.insert("offset".into(), json!(response.offset));
    if let Value::Object(fields) = body {
        object.extend(fields);
    }
    Value::Object(object)
}

fn money(cost: &pb::Money) -> Value {
    json!({"amount": cost.amount, "currency": cost.currency})
}

fn usage_totals(totals: &Option<pb::UsageTotals>) -> Value {
    let totals = totals.clone().unwrap_or_default();
    json!({
        "input_tokens": totals.input_tokens,
        "output_tokens": totals.output_tokens,
        "costs": totals
            .costs
            .iter()
            .map(money)
            .collect::<Vec<_>>(),
    })
}

fn usage_sources(sources: &[pb::SourceUsage]) -> Value {
    sources
        .iter()
        .map(|s| {
            json!({
                "source": enum_name(s.source().as_str_name(), "USAGE_SOURCE_"),
                "totals": usage_totals(&s.totals),
            })
        })
        .collect()
}

/// `usage --json`: the sums per principal, profile, source and session, and the budget.
pub(crate) fn usage(answer: &pb::GetUsageResponse) -> Value {
    json!({
        "principals": answer.principals.iter().map(|p| json!({
            "principal": p.principal, "totals": usage_totals(&p.totals),
        })).collect::<Vec<_>>(),
        "profiles": answer.profiles.iter().map(|p| json!({
            "profile": p.profile, "totals": usage_totals(&p.totals),
        })).collect::<Vec<_>>(),
        "sources": usage_sources(&answer.sources),
        "sessions": answer.sessions.iter().map(|s| json!({
            "session_id": s.session_id, "principal": s.principal, "profile": s.profile,
            "totals": usage_totals(&s.totals), "sources": usage_sources(&s.sources),
        })).collect::<Vec<_>>(),
        "budget": answer.budget.as_ref().map(|b| json!({
            "principal": b.principal,
            "period": b.period,
            "period_start": timestamp(&b.period_start),
            "cost_limit": b.cost_limit.as_ref().map(money),
            "token_limit": b.token_limit,
            "used": usage_totals(&b.used),
            "exhausted": b.exhausted,
        })),
    })
}
