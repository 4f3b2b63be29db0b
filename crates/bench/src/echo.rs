//! The baseline of the translator figure: a bare tonic echo service in this same binary, served
//! only by `agent-harness-bench --serve-echo ADDR` (a hidden flag the benchmark uses to start it
//! as a child process). It is never part of `serve`, its reflection or its health.
//!
//! `agent_harness.bench.Echo/Echo` takes a `TranslateChannelMessageRequest` and answers with the
//! same message: the same bytes decoded as the translator decodes, and about as many encoded
//! back, with nothing in between — no authentication, no conversion, no translation. It is
//! written by hand as tonic's generated code would be (one boxed future per call, the prost
//! codec), and served with the transport settings of `serve` (`TCP_NODELAY`, HTTP/2 keepalive).

use std::{
    convert::Infallible,
    net::SocketAddr,
    task::{Context, Poll},
    time::Duration,
};

use tonic::{
    Request, Response, Status,
    body::Body as TonicBody,
    codegen::{Body, BoxFuture, StdError, http},
    server::NamedService,
    transport::{Channel, Server},
};

use agent_harness::pb::v1::TranslateChannelMessageRequest;

/// The echo's full service name (deliberately outside `agent_harness.v1`).
pub const SERVICE: &str = "agent_harness.bench.Echo";
/// The echo method's path.
pub const PATH: &str = "/agent_harness.bench.Echo/Echo";

/// What the echo takes and gives back.
pub type EchoMessage = TranslateChannelMessageRequest;

/// The echo service.
#[derive(Debug, Clone, Copy, Default)]
pub struct EchoService;

impl NamedService for EchoService {
    const NAME: &'static str = SERVICE;
}

struct EchoMethod;

impl tonic::server::UnaryService<EchoMessage> for EchoMethod {
    type Response = EchoMessage;
    type Future = BoxFuture<Response<EchoMessage>, Status>;

    fn call(&mut self, request: Request<EchoMessage>) -> Self::Future {
        Box::pin(async move { Ok(Response::new(request.into_inner())) })
    }
}

impl<B> tower::Service<http::Request<B>> for EchoService
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<TonicBody>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != PATH {
            return Box::pin(async {
                Ok(Status::unimplemented("the echo serves only Echo").into_http())
            });
        }
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<EchoMessage, EchoMessage>::default();
            let mut grpc = tonic::server::Grpc::new(codec);
            Ok(grpc.unary(EchoMethod, request).await)
        })
    }
}

/// One echo call.
pub async fn call(channel: Channel, message: EchoMessage) -> Result<EchoMessage, Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unknown(format!("the echo channel is not ready: {e}")))?;
    let codec = tonic_prost::ProstCodec::<EchoMessage, EchoMessage>::default();
    grpc.unary(
        Request::new(message),
        http::uri::PathAndQuery::from_static(PATH),
        codec,
    )
    .await
    .map(Response::into_inner)
}

/// Whether an echo server answers on `addr` (readiness of the child).
pub async fn answers(addr: SocketAddr) -> bool {
    let Ok(channel) = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("valid")
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
    else {
        return false;
    };
    matches!(
        tokio::time::timeout(
            Duration::from_secs(2),
            call(channel, EchoMessage::default())
        )
        .await,
        Ok(Ok(_))
    )
}

/// `agent-harness-bench --serve-echo ADDR`: serves the echo until SIGTERM or Ctrl-C, on the
/// same kind of runtime as `serve`.
pub fn serve(addr: SocketAddr) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        Server::builder()
            .tcp_nodelay(true)
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(20)))
            .add_service(EchoService)
            .serve_with_shutdown(addr, async move {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            })
            .await?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_harness::pb::v1::ChannelMessage;

    #[tokio::test]
    async fn the_echo_answers_with_the_message_it_was_sent_and_refuses_other_paths() {
        tokio::time::timeout(Duration::from_secs(20), async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let server = tokio::spawn(
                Server::builder()
                    .add_service(EchoService)
                    .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
            );
            let channel = crate::server::connect(addr).await.unwrap();
            let message = EchoMessage {
                message: Some(ChannelMessage {
                    message_id: "m-1".into(),
                    content: "hello".into(),
                    ..Default::default()
                }),
            };
            assert_eq!(
                call(channel.clone(), message.clone()).await.unwrap(),
                message
            );

            let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
            let refused = health
                .check(tonic_health::pb::HealthCheckRequest::default())
                .await
                .unwrap_err();
            assert_eq!(refused.code(), tonic::Code::Unimplemented);
            server.abort();
        })
        .await
        .expect("the echo test finishes");
    }
}
