//! Trace spans of the engine: a turn (from dispatch to its end), and as its children each tool
//! call (first update to final status) and each wait for a person (permission, elicitation).
//! The turn's context is what the agent gets in `_meta.traceparent`, so the agent's own spans
//! join the same trace. Off (no tracer) unless OTLP export is configured; then nothing here
//! blocks: ended spans go to a bounded queue (see `telemetry::traces`).

use std::fmt;

use opentelemetry::{
    Context, KeyValue,
    trace::{
        SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
        Tracer,
    },
};
use opentelemetry_sdk::trace::SdkTracer;

/// The tracer spans are made with, when traces are exported.
#[derive(Clone, Default)]
pub(crate) struct Traces(Option<SdkTracer>);

impl fmt::Debug for Traces {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Traces(on)"
        } else {
            "Traces(off)"
        })
    }
}

impl Traces {
    pub(crate) fn new(tracer: SdkTracer) -> Self {
        Self(Some(tracer))
    }

    pub(crate) fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Starts a span under `parent` (a context holding a span, or a W3C `traceparent` from the
    /// caller, or neither: a new trace). `None` when traces are off.
    pub(crate) fn start(
        &self,
        name: &'static str,
        kind: SpanKind,
        parent: Parent<'_>,
        attributes: Vec<KeyValue>,
    ) -> Option<Context> {
        let tracer = self.0.as_ref()?;
        let parent = match parent {
            Parent::Span(cx) => cx.clone(),
            Parent::Traceparent(Some(text)) => match parse_traceparent(text) {
                Some(remote) => Context::new().with_remote_span_context(remote),
                None => Context::new(),
            },
            Parent::Traceparent(None) => Context::new(),
        };
        let span = tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes)
            .start_with_context(tracer, &parent);
        Some(parent.with_span(span))
    }
}

impl Traces {
    /// A span that already ended: begun at `started`, ended now, under `parent` (a model call
    /// the model proxy reports once its answer is over).
    pub(crate) fn finished(
        &self,
        name: &'static str,
        parent: &Context,
        attributes: Vec<KeyValue>,
        started: std::time::SystemTime,
        error: Option<&str>,
    ) {
        let Some(tracer) = self.0.as_ref() else {
            return;
        };
        let span = tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .with_attributes(attributes)
            .with_start_time(started)
            .start_with_context(tracer, parent);
        end(&parent.with_span(span), error);
    }
}

/// Where a new span hangs.
pub(crate) enum Parent<'a> {
    Span(&'a Context),
    Traceparent(Option<&'a str>),
}

/// Ends the span `cx` holds, with an error status when `error` says why.
pub(crate) fn end(cx: &Context, error: Option<&str>) {
    let span = cx.span();
    if let Some(why) = error {
        span.set_status(Status::error(why.to_owned()));
    }
    span.end();
}

/// The W3C `traceparent` of the span `cx` holds.
pub(crate) fn traceparent(cx: &Context) -> String {
    let span = cx.span();
    let sc = span.span_context();
    format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    )
}

/// A W3C `traceparent` (version 00) as a remote span context.
pub(crate) fn parse_traceparent(text: &str) -> Option<SpanContext> {
    let mut parts = text.split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version != "00"
        || parts.next().is_some()
        || trace.len() != 32
        || span.len() != 16
        || flags.len() != 2
    {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    Some(SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_reads_back_as_it_was_written_and_malformed_ones_are_ignored() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let sc = parse_traceparent(text).unwrap();
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert!(sc.is_remote() && sc.is_sampled());
        let cx = Context::new().with_remote_span_context(sc);
        assert_eq!(traceparent(&cx), text);
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn with_traces_off_no_span_is_made() {
        let traces = Traces::default();
        assert!(!traces.is_on());
        assert!(
            traces
                .start(
                    "turn",
                    SpanKind::Internal,
                    Parent::Traceparent(None),
                    vec![]
                )
                .is_none()
        );
    }
}
