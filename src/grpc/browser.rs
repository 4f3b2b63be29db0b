//! The browser's way in: gRPC-Web beside native gRPC on the same port, a CORS
//! allowlist for pages served elsewhere, and the built-in console at `/`.
//!
//! Everything here is off unless configured, so a deployment that asks for none of it sees no
//! change: nothing is served at `/`, and a gRPC-Web request is refused with 415 before it reaches
//! a service. HTTP/1.1 is always spoken, but only to say so: a browser opened on the port without
//! `--console` gets a short plain-text page saying what the port is, not HTTP/2 bytes it shows as
//! garbage.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, Version, header};
use tonic::body::Body;
use tower::{Layer, Service};
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::grpc::console;

/// What the browser's way in serves: the entry point (`app`) fills it from the configuration.
#[derive(Debug, Clone, Default)]
pub(crate) struct BrowserOptions {
    /// Origins allowed by CORS, exactly as browsers send them (`https://ui.example:8443`).
    pub cors_allow_origins: Vec<String>,
    /// gRPC-Web (and with it HTTP/1.1) is accepted.
    pub grpc_web: bool,
    /// The built-in console at `/`.
    pub console: bool,
    /// The working directory the console offers for a new session (`/defaults.json`).
    pub default_cwd: Option<String>,
}

/// Request headers a gRPC-Web page sends: the protocol's own, the bearer token and the acting
/// user (docs/security.md).
const ALLOWED_HEADERS: [&str; 7] = [
    "content-type",
    "x-grpc-web",
    "x-user-agent",
    "grpc-timeout",
    "authorization",
    "x-acting-user",
    "accept",
];

/// Response headers a page must be able to read: the status travels in headers when a call fails
/// before its first message (trailers-only), and the ErrorInfo details with it.
const EXPOSED_HEADERS: [&str; 3] = ["grpc-status", "grpc-message", "grpc-status-details-bin"];

/// gRPC-Web translation with CORS in front, when the options enable gRPC-Web. CORS answers
/// preflights itself and adds `access-control-allow-origin` only for listed origins, so a page
/// from any other origin cannot read a response.
pub(crate) fn grpc_web_layer(
    options: &BrowserOptions,
) -> anyhow::Result<Option<tower::layer::util::Stack<tonic_web::GrpcWebLayer, CorsLayer>>> {
    if !options.grpc_web {
        return Ok(None);
    }
    let origins = options
        .cors_allow_origins
        .iter()
        .map(|origin| {
            HeaderValue::from_str(origin).map_err(|_| {
                anyhow::anyhow!("cors_allow_origins: {origin:?} is not a header value")
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let cors = CorsLayer::new()
        .allow_origin(AllowOrigin::list(origins))
        .allow_methods([Method::POST])
        .allow_headers(ALLOWED_HEADERS.map(HeaderName::from_static))
        .expose_headers(EXPOSED_HEADERS.map(HeaderName::from_static))
        .max_age(Duration::from_secs(600));
    Ok(Some(tower::layer::util::Stack::new(
        tonic_web::GrpcWebLayer::new(),
        cors,
    )))
}

/// Serves the console's files (when on) and refuses gRPC-Web (when off); passes everything else
/// through untouched.
#[derive(Debug, Clone)]
pub(crate) struct FrontLayer {
    console: bool,
    grpc_web: bool,
    /// `/defaults.json`, when the console is on.
    defaults: Option<tonic::codegen::Bytes>,
}

impl FrontLayer {
    pub(crate) fn new(options: &BrowserOptions) -> Self {
        let defaults = options.console.then(|| {
            serde_json::json!({ "cwd": options.default_cwd })
                .to_string()
                .into()
        });
        Self {
            console: options.console,
            grpc_web: options.grpc_web,
            defaults,
        }
    }
}

impl<S> Layer<S> for FrontLayer {
    type Service = Front<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Front {
            inner,
            layer: self.clone(),
        }
    }
}

/// See [`FrontLayer`].
#[derive(Debug, Clone)]
pub(crate) struct Front<S> {
    inner: S,
    layer: FrontLayer,
}

pub(crate) type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B> Service<Request<B>> for Front<S>
where
    S: Service<Request<B>, Response = Response<Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Response<Body>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if self.layer.console
            && matches!(*request.method(), Method::GET | Method::HEAD)
            && let Some(response) = console::respond(request.uri().path())
        {
            return Box::pin(std::future::ready(Ok(response)));
        }
        if let Some(defaults) = &self.layer.defaults
            && *request.method() == Method::GET
            && request.uri().path() == "/defaults.json"
        {
            return Box::pin(std::future::ready(Ok(console::defaults(defaults.clone()))));
        }
        if request.version() < Version::HTTP_2
            && matches!(*request.method(), Method::GET | Method::HEAD)
            && !is_grpc_web(&request)
        {
            let hint = if self.layer.console {
                NOT_A_CONSOLE_PAGE
            } else {
                NO_CONSOLE
            };
            return Box::pin(std::future::ready(Ok(plain(StatusCode::NOT_FOUND, hint))));
        }
        if !self.layer.grpc_web && is_grpc_web(&request) {
            return Box::pin(std::future::ready(Ok(plain(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "gRPC-Web is not enabled on this server (see --grpc-web, --cors-allow-origin, --console)\n",
            ))));
        }
        Box::pin(self.inner.call(request))
    }
}

/// What a browser sees on the port when the console is off.
const NO_CONSOLE: &str = "This is agent-harness's gRPC port (HTTP/2): it serves no web pages.

For the web console, start the server with --console and open this address again.
From a terminal: agent-harness sessions list --server http://HOST:PORT (see docs/cli.md).
";

/// What a browser sees at a path that is not one of the console's.
const NOT_A_CONSOLE_PAGE: &str = "Not found. The agent-harness console is at / on this port.\n";

fn is_grpc_web<B>(request: &Request<B>) -> bool {
    request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc-web"))
}

pub(crate) fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut response = Response::new(Body::new(http_body_util::Full::new(bytes_of(
        text.as_bytes(),
    ))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

pub(crate) fn bytes_of(bytes: &'static [u8]) -> tonic::codegen::Bytes {
    tonic::codegen::Bytes::from_static(bytes)
}
