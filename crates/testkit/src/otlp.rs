//! A test OTLP/gRPC trace receiver: a real `TraceService` server on `127.0.0.1:0` that keeps
//! every span it is sent, so a test can wait for the spans it expects and check their parents.

use std::{net::SocketAddr, sync::Arc};

use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
    trace_service_server::{TraceService, TraceServiceServer},
};
use tokio::sync::{Mutex, Notify};
use tonic::{Request, Response, Status};

/// One received span, flattened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedSpan {
    pub name: String,
    /// Lower-case hex, as in a `traceparent`.
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// Attributes whose value is a string or an integer, as text.
    pub attributes: Vec<(String, String)>,
    /// The resource's `service.name`.
    pub service_name: String,
}

impl ReceivedSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct Received {
    spans: Mutex<Vec<ReceivedSpan>>,
    arrived: Notify,
}

struct Receiver(Arc<Received>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        use opentelemetry_proto::tonic::common::v1::any_value::Value;
        let text = |value: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>| match value
            .as_ref()
            .and_then(|v| v.value.as_ref())
        {
            Some(Value::StringValue(s)) => Some(s.clone()),
            Some(Value::IntValue(i)) => Some(i.to_string()),
            Some(Value::BoolValue(b)) => Some(b.to_string()),
            _ => None,
        };
        let mut flat = Vec::new();
        for resource_spans in request.into_inner().resource_spans {
            let service_name = resource_spans
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
                .and_then(|a| text(&a.value))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    flat.push(ReceivedSpan {
                        name: span.name,
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        attributes: span
                            .attributes
                            .iter()
                            .filter_map(|a| Some((a.key.clone(), text(&a.value)?)))
                            .collect(),
                        service_name: service_name.clone(),
                    });
                }
            }
        }
        self.0.spans.lock().await.extend(flat);
        self.0.arrived.notify_waiters();
        Ok(Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The running receiver.
pub struct OtlpReceiver {
    addr: SocketAddr,
    received: Arc<Received>,
    task: tokio::task::JoinHandle<()>,
}

impl OtlpReceiver {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the OTLP receiver");
        let addr = listener.local_addr().expect("its address");
        let received = Arc::new(Received::default());
        let service = TraceServiceServer::new(Receiver(received.clone()));
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream_of(listener))
                .await;
        });
        Self {
            addr,
            received,
            task,
        }
    }

    /// The endpoint to export to: `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub async fn spans(&self) -> Vec<ReceivedSpan> {
        self.received.spans.lock().await.clone()
    }

    /// Waits until the spans received satisfy `done`, then returns them all.
    pub async fn wait_for(&self, done: impl Fn(&[ReceivedSpan]) -> bool) -> Vec<ReceivedSpan> {
        loop {
            let arrived = self.received.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            {
                let spans = self.received.spans.lock().await;
                if done(&spans) {
                    return spans.clone();
                }
            }
            arrived.await;
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn tokio_stream_of(listener: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener)
}
