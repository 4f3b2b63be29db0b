//! A turn's trace: its span from dispatch to its end, a child span per tool call (first update
//! to final status) and per wait for a person (permission, elicitation), and the metrics timed
//! the same way (time to the agent's first output, permission wait). With traces off only the
//! metrics are kept.

use std::{collections::HashMap, time::Instant};

use opentelemetry::{Context, KeyValue, trace::SpanKind};
use serde_json::Value;

use super::Actor;
use crate::{
    acp::views::ConfigOptionUpdate,
    domain::{ActionId, JsonRpcId},
    session::{
        metrics,
        traces::{self, Parent, Traces},
    },
};

/// What a person is waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WaitKind {
    Permission,
    Elicitation,
}

impl WaitKind {
    fn span_name(self) -> &'static str {
        match self {
            Self::Permission => "permission_wait",
            Self::Elicitation => "elicitation_wait",
        }
    }
}

struct Wait {
    kind: WaitKind,
    since: Instant,
    span: Option<Context>,
}

/// The spans of one turn and what they time.
pub(super) struct TurnTrace {
    started: Instant,
    span: Option<Context>,
    traces: Traces,
    /// Whether the agent has said anything in this turn yet.
    spoke: bool,
    tools: HashMap<String, Context>,
    waits: HashMap<JsonRpcId, Wait>,
}

impl TurnTrace {
    pub(super) fn start(
        traces: &Traces,
        session: uuid::Uuid,
        action_id: ActionId,
        profile: &str,
        parent: Option<&str>,
    ) -> Self {
        let span = traces.start(
            "turn",
            SpanKind::Internal,
            Parent::Traceparent(parent),
            vec![
                KeyValue::new("agent_harness.session_id", session.to_string()),
                KeyValue::new("agent_harness.profile", profile.to_owned()),
                KeyValue::new("agent_harness.action_id", action_id.to_string()),
            ],
        );
        Self {
            started: Instant::now(),
            span,
            traces: traces.clone(),
            spoke: false,
            tools: HashMap::new(),
            waits: HashMap::new(),
        }
    }

    /// The turn's own span, when traced.
    pub(super) fn context(&self) -> Option<&Context> {
        self.span.as_ref()
    }

    /// The `traceparent` the agent gets: the turn's own span, when traced.
    pub(super) fn traceparent(&self) -> Option<String> {
        self.span.as_ref().map(traces::traceparent)
    }

    pub(super) fn ended(&self, stop_reason: &str) {
        if let Some(span) = &self.span {
            use opentelemetry::trace::TraceContextExt;
            span.span().set_attribute(KeyValue::new(
                "agent_harness.stop_reason",
                stop_reason.to_owned(),
            ));
            let error = (stop_reason == "failed").then_some("the turn failed");
            traces::end(span, error);
        }
    }

    fn child(&self, name: &'static str, attributes: Vec<KeyValue>) -> Option<Context> {
        let parent = self.span.as_ref()?;
        self.traces
            .start(name, SpanKind::Internal, Parent::Span(parent), attributes)
    }

    /// A `session/update` of the turn: the first one times the agent's first output; tool
    /// calls open and close their spans.
    pub(super) fn on_update(&mut self, update: &ConfigOptionUpdate<'_>) {
        if !self.spoke {
            self.spoke = true;
            metrics::first_output(self.started.elapsed());
        }
        let (Some(kind), Some(id)) = (update.session_update, update.tool_call_id) else {
            return;
        };
        if !matches!(kind, "tool_call" | "tool_call_update") {
            return;
        }
        if !self.tools.contains_key(id) {
            let mut attributes = vec![KeyValue::new("agent_harness.tool_call_id", id.to_owned())];
            if let Some(title) = update.title {
                attributes.push(KeyValue::new("agent_harness.tool_title", bounded(title)));
            }
            if let Some(kind) = update.kind {
                attributes.push(KeyValue::new("agent_harness.tool_kind", bounded(kind)));
            }
            let Some(span) = self.child("tool_call", attributes) else {
                return;
            };
            self.tools.insert(id.to_owned(), span);
        }
        if let Some(status @ ("completed" | "failed")) = update.status
            && let Some(span) = self.tools.remove(id)
        {
            let error = (status == "failed").then_some("the tool call failed");
            traces::end(&span, error);
        }
    }

    pub(super) fn wait_began(&mut self, id: &JsonRpcId, kind: WaitKind) {
        let span = self.child(
            kind.span_name(),
            vec![KeyValue::new("agent_harness.request_id", id.to_string())],
        );
        self.waits.insert(
            id.clone(),
            Wait {
                kind,
                since: Instant::now(),
                span,
            },
        );
    }

    /// The wait for `id` is over: answered by a person, a rule or the timeout, or withdrawn.
    pub(super) fn wait_ended(&mut self, id: &JsonRpcId, how: &str) {
        let Some(wait) = self.waits.remove(id) else {
            return;
        };
        if wait.kind == WaitKind::Permission {
            metrics::permission_waited(wait.since.elapsed());
        }
        if let Some(span) = &wait.span {
            use opentelemetry::trace::TraceContextExt;
            span.span()
                .set_attribute(KeyValue::new("agent_harness.outcome", how.to_owned()));
            traces::end(span, None);
        }
    }
}

/// Attribute text from the agent, kept short.
fn bounded(text: &str) -> String {
    text.chars().take(256).collect()
}

impl Actor {
    /// The running turn's trace, if a turn runs.
    pub(super) fn turn_trace(&mut self) -> Option<&mut TurnTrace> {
        self.work.turn.as_mut().map(|t| &mut t.trace)
    }

    pub(super) fn trace_update(&mut self, frame: &Value) {
        use crate::acp::views::{Params, UpdateParams, view};
        let Some(trace) = self.turn_trace() else {
            return;
        };
        let params: Params<UpdateParams> = view(frame);
        if let Some(update) = params.params.and_then(|p| p.update) {
            trace.on_update(&update);
        }
    }
}
