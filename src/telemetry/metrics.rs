//! Prometheus metrics: sessions by status, turns by stop reason, queue depth, frames
//! appended, subscribers, RPCs by method and code with latency. Counters are recorded where things
//! happen (the engine pushes its own, see `session::metrics`); gauges of the session registry are
//! read through `Sessions::gauges` when scraped, so they are exact.

use std::{
    net::SocketAddr,
    sync::{Arc, OnceLock},
    task::{Context, Poll},
    time::Instant,
};

use http::{Request, Response};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tower::{Layer, Service};

use crate::session::{Sessions, metrics::Gauges};
pub(crate) const RPCS: &str = "agent_harness_rpcs_total";
pub(crate) const RPC_LATENCY: &str = "agent_harness_rpc_duration_seconds";
pub(crate) const SESSIONS: &str = "agent_harness_sessions";
pub(crate) const QUEUE_DEPTH: &str = "agent_harness_queue_depth";
pub(crate) const SUBSCRIBERS: &str = "agent_harness_subscribers";
pub(crate) const RUNTIMES: &str = "agent_harness_live_runtimes";
pub(crate) const WARM_POOL_SIZE: &str = "agent_harness_warm_pool_size";
pub(crate) const WARM_POOL_READY: &str = "agent_harness_warm_pool_ready";

/// The process-wide recorder (the `metrics` facade has one global recorder).
fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full(RPC_LATENCY.to_owned()),
                &[
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0,
                ],
            )
            .expect("buckets are not empty")
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full(
                    crate::session::metrics::FIRST_OUTPUT.to_owned(),
                ),
                &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
            )
            .expect("buckets are not empty")
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full(
                    crate::session::metrics::PERMISSION_WAIT.to_owned(),
                ),
                &[
                    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
                ],
            )
            .expect("buckets are not empty")
            .build_recorder();
        let handle = recorder.handle();
        // Another recorder may already be installed (e.g. by an embedding program); then these
        // metrics are recorded there and this endpoint shows the registry gauges only.
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

/// Makes sure the recorder exists before anything is recorded.
pub(crate) fn install() {
    handle();
}

/// Renders the exposition text, with the registry gauges computed now.
pub(crate) fn render(sessions: Option<&Sessions>) -> String {
    if let Some(sessions) = sessions {
        set_gauges(&sessions.gauges());
    }
    let handle = handle();
    handle.run_upkeep();
    let mut text = handle.render();
    // Per-bridge series are rendered from the bridges held now, so they go with their bridge.
    if let Some(sessions) = sessions {
        text.push_str(&sessions.context().gateway().exposition());
    }
    text
}

fn set_gauges(gauges: &Gauges) {
    for (status, count) in &gauges.by_status {
        metrics::gauge!(SESSIONS, "status" => status.as_str()).set(*count as f64);
    }
    metrics::gauge!(QUEUE_DEPTH).set(gauges.queued as f64);
    metrics::gauge!(SUBSCRIBERS).set(gauges.subscribers as f64);
    metrics::gauge!(RUNTIMES).set(gauges.live_runtimes as f64);
    for (profile, size, ready) in &gauges.warm_pools {
        metrics::gauge!(WARM_POOL_SIZE, "profile" => profile.clone()).set(*size as f64);
        metrics::gauge!(WARM_POOL_READY, "profile" => profile.clone()).set(*ready as f64);
    }
}

/// Serves `GET /metrics` on its own port until `shutdown` resolves.
pub(crate) async fn serve(
    listener: TcpListener,
    sessions: Option<Arc<Sessions>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    use hyper::{body::Incoming, server::conn::http1, service::service_fn};
    use hyper_util::rt::TokioIo;
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "metrics endpoint: accept failed");
                    continue;
                }
            },
            _ = &mut shutdown => return,
        };
        let sessions = sessions.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let sessions = sessions.clone();
                async move {
                    if request.uri().path() == "/metrics" {
                        Response::builder()
                            .header("content-type", "text/plain; version=0.0.4")
                            .body(http_body_util::Full::new(bytes_of(render(
                                sessions.as_deref(),
                            ))))
                    } else {
                        Response::builder()
                            .status(404)
                            .body(http_body_util::Full::new(bytes_of(
                                "not found: try /metrics\n".into(),
                            )))
                    }
                }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn bytes_of(text: String) -> hyper::body::Bytes {
    hyper::body::Bytes::from(text)
}

/// Binds the metrics port.
pub(crate) async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// The label for an RPC's method: its path when it names a method of a service this binary
/// knows, else `unknown`. The path is whatever the client sent; passing it through would let any
/// client grow the label set without bound.
pub fn method_label(path: &str) -> &'static str {
    static KNOWN: OnceLock<std::collections::HashSet<String>> = OnceLock::new();
    let known = KNOWN.get_or_init(|| {
        use prost::Message;
        let sets = [
            crate::pb::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
        ];
        let mut known = std::collections::HashSet::new();
        for set in sets {
            let set = prost_types::FileDescriptorSet::decode(set).expect("built-in descriptors");
            for file in set.file {
                for service in &file.service {
                    for method in &service.method {
                        known.insert(format!(
                            "/{}{}/{}",
                            file.package
                                .as_deref()
                                .map(|p| format!("{p}."))
                                .unwrap_or_default(),
                            service.name(),
                            method.name()
                        ));
                    }
                }
            }
        }
        known
    });
    known.get(path).map_or("unknown", String::as_str)
}

/// A tower layer counting RPCs by method and gRPC code, with their latency to the response head.
/// (For unary RPCs that is the whole call; an error tonic reports in the response head carries
/// its code there, and a success has none until the trailers, so it counts as OK.)
#[derive(Debug, Clone, Default)]
pub(crate) struct RpcMetricsLayer;

impl<S> Layer<S> for RpcMetricsLayer {
    type Service = RpcMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcMetrics { inner }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct RpcMetrics<S> {
    inner: S,
}

impl<S, B, R> Service<Request<B>> for RpcMetrics<S>
where
    S: Service<Request<B>, Response = Response<R>> + Send,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let method = method_label(request.uri().path());
        let started = Instant::now();
        let future = self.inner.call(request);
        Box::pin(async move {
            let result = future.await;
            let code = match &result {
                Ok(response) => response
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<i32>().ok())
                    .map(tonic::Code::from)
                    .unwrap_or(tonic::Code::Ok),
                Err(_) => tonic::Code::Unknown,
            };
            let code = format!("{code:?}");
            metrics::counter!(RPCS, "method" => method, "code" => code.clone()).increment(1);
            metrics::histogram!(RPC_LATENCY, "method" => method, "code" => code)
                .record(started.elapsed().as_secs_f64());
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_reason_the_agent_made_up_is_counted_as_other_never_as_its_own_label() {
        install();
        crate::session::metrics::turn_ended("end_turn");
        crate::session::metrics::turn_ended("made_up_by_the_agent_1f3a");
        let text = render(None);
        let turns: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(crate::session::metrics::TURNS))
            .collect();
        assert!(
            turns.iter().any(|l| l.contains(r#"stop_reason="other""#)),
            "{turns:?}"
        );
        assert!(
            turns
                .iter()
                .any(|l| l.contains(r#"stop_reason="end_turn""#)),
            "{turns:?}"
        );
        assert!(!text.contains("made_up_by_the_agent_1f3a"), "{turns:?}");
    }

    #[tokio::test]
    async fn an_rpc_to_a_path_no_service_has_is_counted_as_method_unknown_never_by_its_path() {
        install();
        let inner = tower::service_fn(|_: Request<()>| async {
            Ok::<_, std::convert::Infallible>(Response::new(()))
        });
        let mut service = RpcMetricsLayer.layer(inner);
        for path in [
            "/agent_harness.v1.AgentSessionService/GetSession",
            "/made.up.Service/Path_7c1e",
        ] {
            let request = Request::builder().uri(path).body(()).unwrap();
            service.call(request).await.unwrap();
        }
        let text = render(None);
        assert!(!text.contains("Path_7c1e"));
        let rpcs: Vec<&str> = text.lines().filter(|l| l.starts_with(RPCS)).collect();
        assert!(
            rpcs.iter().any(|l| l.contains(r#"method="unknown""#)),
            "{rpcs:?}"
        );
        assert!(
            rpcs.iter().any(|l| l
                .contains(r#"method="/agent_harness.v1.AgentSessionService/GetSession""#)),
            "{rpcs:?}"
        );
    }
}
