//! OTLP trace export, off by default. On when `--otlp-endpoint` (or `otlp_endpoint` in the
//! config file) names a collector, or when the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_ENDPOINT` variable is set (the exporter honours the other
//! `OTEL_EXPORTER_OTLP_*` variables too: headers, timeout, compression; `OTEL_SERVICE_NAME`
//! names the service, `agent-harness` unless set).
//!
//! Nothing here may slow or fail a call: an ended span is handed to a bounded queue without
//! waiting, and one task exports batches from it. A full queue, or a batch the collector did not
//! take in time, is dropped and counted (`agent_harness_trace_spans_dropped_total`).
//!
//! Also the RPC span: a tower layer opening a server span per gRPC call (under the caller's
//! `traceparent`, when it sent one) and handing its context on as the call's `traceparent`, so
//! the turns it starts hang under it.

use std::{
    task::{Context as TaskContext, Poll},
    time::Duration,
};

use anyhow::Context as _;
use http::{HeaderValue, Request, Response};
use opentelemetry::{
    KeyValue,
    trace::{SpanKind, TraceContextExt, TracerProvider as _},
};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::{
    Resource,
    error::OTelSdkResult,
    trace::{SdkTracerProvider, SpanData, SpanExporter, SpanProcessor},
};
use tokio::sync::mpsc;
use tower::{Layer, Service};

use crate::session::traces::{self, Parent, Traces};

pub(crate) const SPANS_EXPORTED: &str = "agent_harness_trace_spans_exported_total";
pub(crate) const SPANS_DROPPED: &str = "agent_harness_trace_spans_dropped_total";

/// Ended spans waiting for export; beyond this they are dropped.
const QUEUE_SPANS: usize = 4096;
/// Spans exported in one request at most.
const BATCH_SPANS: usize = 512;
/// How long a batch gathers spans after its first one.
const BATCH_DELAY: Duration = Duration::from_millis(200);
/// How long one export may take before its batch is dropped.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the standard variables ask for trace export.
fn env_asks_for_export() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
        || std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.trim() == "none");
    !disabled && (set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") || set("OTEL_EXPORTER_OTLP_ENDPOINT"))
}

/// The running export: the tracer for spans, and the provider that owns the pipeline.
pub(crate) struct TraceExport {
    pub traces: Traces,
    provider: SdkTracerProvider,
}

impl TraceExport {
    /// Stops taking spans (the queued ones are still sent by the export task while it runs).
    pub(crate) fn shutdown(&self) {
        let _ = self.provider.shutdown();
    }
}

/// Starts trace export when configured (`endpoint`, else the standard variables); `None`: off.
/// Call within the runtime: the export task and the exporter's channel live on it.
pub(crate) fn start(endpoint: Option<&str>) -> anyhow::Result<Option<TraceExport>> {
    if endpoint.is_none() && !env_asks_for_export() {
        return Ok(None);
    }
    let mut builder = opentelemetry_otlp::SpanExporter::builder().with_tonic();
    if let Some(endpoint) = endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    let mut exporter = builder.build().context("the OTLP trace exporter")?;
    let mut resource = Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name("agent-harness");
    }
    let resource = resource
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    exporter.set_resource(&resource);
    let (tx, rx) = mpsc::channel(QUEUE_SPANS);
    tokio::spawn(export_batches(exporter, rx));
    let provider = SdkTracerProvider::builder()
        .with_resource(resource)
        .with_span_processor(QueueProcessor { tx })
        .build();
    let tracer = provider.tracer("agent-harness");
    tracing::info!(
        endpoint = endpoint.unwrap_or("(from OTEL_EXPORTER_OTLP_* variables)"),
        "exporting traces over OTLP"
    );
    Ok(Some(TraceExport {
        traces: Traces::new(tracer),
        provider,
    }))
}

/// Hands ended spans to the export task, never waiting.
#[derive(Debug)]
struct QueueProcessor {
    tx: mpsc::Sender<SpanData>,
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        if self.tx.try_send(span).is_err() {
            metrics::counter!(SPANS_DROPPED, "reason" => "queue_full").increment(1);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Exports queued spans in batches until every sender is gone.
async fn export_batches(
    exporter: opentelemetry_otlp::SpanExporter,
    mut rx: mpsc::Receiver<SpanData>,
) {
    let mut failing = ExportFailures::default();
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let gather = tokio::time::sleep(BATCH_DELAY);
        tokio::pin!(gather);
        while batch.len() < BATCH_SPANS {
            tokio::select! {
                span = rx.recv() => match span {
                    Some(span) => batch.push(span),
                    None => break,
                },
                _ = &mut gather => break,
            }
        }
        let count = batch.len() as u64;
        match tokio::time::timeout(EXPORT_TIMEOUT, exporter.export(batch)).await {
            Ok(Ok(())) => {
                metrics::counter!(SPANS_EXPORTED).increment(count);
                failing.recovered();
            }
            Ok(Err(error)) => {
                metrics::counter!(SPANS_DROPPED, "reason" => "export_failed").increment(count);
                failing.failed(&error.to_string(), count);
            }
            Err(_) => {
                metrics::counter!(SPANS_DROPPED, "reason" => "export_failed").increment(count);
                failing.failed(
                    &format!(
                        "no answer within {}",
                        humantime::format_duration(EXPORT_TIMEOUT)
                    ),
                    count,
                );
            }
        }
    }
}

/// How often a collector that keeps failing is logged again.
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);

/// Export failures, as the log says them: the first at once, then at most one line a minute
/// with how many spans were dropped since, and one line when export works again.
#[derive(Default)]
struct ExportFailures {
    since: Option<tokio::time::Instant>,
    logged: Option<tokio::time::Instant>,
    dropped: u64,
}

impl ExportFailures {
    fn failed(&mut self, why: &str, spans: u64) {
        self.dropped += spans;
        self.since.get_or_insert_with(tokio::time::Instant::now);
        if self
            .logged
            .is_none_or(|at| at.elapsed() >= FAILURE_LOG_EVERY)
        {
            tracing::warn!(
                error = why,
                dropped = self.dropped,
                "trace export to the OTLP collector failed; its spans are dropped (counted in \
                 agent_harness_trace_spans_dropped_total)"
            );
            self.logged = Some(tokio::time::Instant::now());
            self.dropped = 0;
        }
    }

    fn recovered(&mut self) {
        if let Some(since) = self.since.take() {
            tracing::info!(
                failing_for_ms = since.elapsed().as_millis() as u64,
                dropped = self.dropped,
                "trace export to the OTLP collector works again"
            );
            *self = Self::default();
        }
    }
}

/// A server span per gRPC call, from the request to the response head (for a stream, its
/// opening). The span's context replaces the call's `traceparent` for the handlers.
#[derive(Debug, Clone, Default)]
pub(crate) struct RpcSpanLayer {
    traces: Traces,
}

impl RpcSpanLayer {
    pub(crate) fn new(traces: Traces) -> Self {
        Self { traces }
    }
}

impl<S> Layer<S> for RpcSpanLayer {
    type Service = RpcSpans<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcSpans {
            inner,
            traces: self.traces.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct RpcSpans<S> {
    inner: S,
    traces: Traces,
}

impl<S, B, R> Service<Request<B>> for RpcSpans<S>
where
    S: Service<Request<B>, Response = Response<R>> + Send,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        if !self.traces.is_on() {
            return Box::pin(self.inner.call(request));
        }
        let method = super::metrics::method_label(request.uri().path());
        let incoming = request
            .headers()
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let (service, name) = method
            .trim_start_matches('/')
            .split_once('/')
            .unwrap_or(("unknown", "unknown"));
        let span = self.traces.start(
            if method == "unknown" {
                "unknown"
            } else {
                method.trim_start_matches('/')
            },
            SpanKind::Server,
            Parent::Traceparent(incoming.as_deref()),
            vec![
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", service.to_owned()),
                KeyValue::new("rpc.method", name.to_owned()),
            ],
        );
        if let Some(span) = &span
            && let Ok(value) = HeaderValue::from_str(&traces::traceparent(span))
        {
            request.headers_mut().insert("traceparent", value);
        }
        let future = self.inner.call(request);
        Box::pin(async move {
            let result = future.await;
            if let Some(span) = span {
                let code = match &result {
                    Ok(response) => response
                        .headers()
                        .get("grpc-status")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<i64>().ok())
                        .unwrap_or(0),
                    Err(_) => 2,
                };
                span.span()
                    .set_attribute(KeyValue::new("rpc.grpc.status_code", code));
                let error = (code != 0).then_some("the call failed");
                traces::end(&span, error);
            }
            result
        })
    }
}
