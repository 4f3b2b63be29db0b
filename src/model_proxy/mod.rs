//! The model proxy (docs/model-proxy.md): where a boxed agent's model calls go, so the
//! provider's key never enters its box, what each call took is read from the provider's own
//! answer, and an owner whose budget is spent gets no further call. (Not to be confused with
//! the *runtime gateway*, `RuntimeGatewayService`, through which bridges serve runtimes.)
//!
//! One proxy serves one box, on a listener inside the box's network namespace that the harness
//! serves from its side (as it serves the egress proxy): the listener alone says which session
//! calls. The agent holds its session's capability token ([`token`]) as its key; the proxy
//! checks it, forwards only the calls agents make ([`api`]) to the provider's upstream with the
//! real key in its place, streams the answer back chunk by chunk, and reads the answer's usage
//! as it passes ([`usage`]).
//!
//! It sits beside `acp/` (an adapter to the outside, like the egress proxy): it knows nothing
//! of sessions' state; what it asks of them (a budget check, a place for usage) comes through
//! [`Meter`], which the session layer implements.

pub mod api;
pub mod token;
pub mod usage;

use std::{
    collections::BTreeMap,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{HeaderMap, Request, Response, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited, combinators::BoxBody};
use hyper::body::{Body, Frame, Incoming};
use tokio::{net::TcpListener, task::JoinHandle};
use uuid::Uuid;

pub use api::{Api, Provider, Served};

pub use token::TokenKey;
pub use usage::WireUsage;

/// The port of the model proxy inside every box that has one.
pub const MODEL_PROXY_PORT: u16 = 3129;
/// The counter of the proxy's calls, by profile, provider, model and status.
pub(crate) const MODEL_CALLS: &str = "agent_harness_model_calls_total";

/// What the proxy asks of the session layer.
pub trait Meter: Send + Sync + 'static {
    /// Before a model call is forwarded: `Err` (what to tell the agent) when the session's owner
    /// may not spend more.
    fn admit(&self, session: Uuid) -> BoxFuture<'static, Result<(), String>>;
    /// A model call ended (or was cut off): what its answer said it took.
    fn record(&self, call: ModelCall);
}

/// What a session's box needs to serve its model proxy: whose calls they are, and where to
/// check and record them.
#[derive(Clone)]
pub struct ModelCalls {
    pub session: Uuid,
    pub meter: Arc<dyn Meter>,
    /// Set by the box at the runtime's start: whether the proxy serves its calls this time (a
    /// preset's route is taken only where its key is set), so the session knows whose word its
    /// usage is.
    pub proxied: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for ModelCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelCalls")
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

/// What every box's proxy shares: the tokens' key, the upstream client, the limits.
pub struct Shared {
    /// Where the tokens' key is kept (`None`: a key of this process only).
    key_file: Option<std::path::PathBuf>,
    tokens: std::sync::OnceLock<Arc<TokenKey>>,
    client: std::sync::OnceLock<Result<UpstreamClient, String>>,
    pub limits: Limits,
}

impl Shared {
    pub fn new(key_file: Option<std::path::PathBuf>, limits: Limits) -> Self {
        Self {
            key_file,
            tokens: std::sync::OnceLock::new(),
            client: std::sync::OnceLock::new(),
            limits,
        }
    }

    /// The tokens' key, read (or made) at its first use: a server whose profiles use no model
    /// proxy never writes one.
    pub fn tokens(&self) -> Arc<TokenKey> {
        self.tokens
            .get_or_init(|| {
                let key = self.key_file.as_deref().map(|path| {
                    TokenKey::load_or_create(path).inspect_err(|error| {
                        tracing::warn!(
                            path = %path.display(),
                            %error,
                            "the model proxy's token key could not be kept: tokens last as long as this process"
                        );
                    })
                });
                Arc::new(match key {
                    Some(Ok(key)) => key,
                    _ => TokenKey::random(),
                })
            })
            .clone()
    }

    /// The client, made at its first use (reading the system's roots takes a while).
    pub fn client(&self) -> Result<UpstreamClient, String> {
        self.client
            .get_or_init(|| {
                UpstreamClient::new().map_err(|e| format!("the system's TLS roots: {e}"))
            })
            .clone()
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// One model call, as the proxy saw it.
#[derive(Debug, Clone)]
pub struct ModelCall {
    pub session: Uuid,
    pub provider: Provider,
    /// The upstream's status (or the proxy's own, when nothing was forwarded).
    pub status: u16,
    /// `None` when the answer said nothing of usage (an error, or a body cut off early).
    pub usage: Option<WireUsage>,
    pub took: Duration,
}

/// What a profile sends through the model proxy for one provider (`model_proxy` in its
/// table): the variable that holds the provider's key (one the profile takes from the harness's
/// environment or a file; its agent gets its session's token there instead) and the upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRoute {
    pub provider: Provider,
    pub key_var: String,
    /// Where its calls go as the profile writes it; `None`: the value the runtime would have had
    /// in the provider's base-URL variable (`ANTHROPIC_BASE_URL`, `OPENAI_BASE_URL`), else the
    /// provider's own API.
    pub upstream: Option<Uri>,
    /// A preset's route, taken only at a start where the key is set: an agent signed in some
    /// other way (a login in its HOME) calls its provider as before, through the egress proxy.
    pub when_key_set: bool,
}

/// A route as one start of a runtime takes it: the variable the token goes in, where calls go
/// and the real key they carry there.
#[derive(Debug, Clone)]
pub struct ActiveRoute {
    pub provider: Provider,
    pub key_var: String,
    pub upstream: Upstream,
}

impl ModelRoute {
    /// The route at a start of the runtime, given the variables it would have had (`var`):
    /// `None` for a preset's route whose key is not set. `Err` says why a base-URL variable
    /// cannot be an upstream.
    pub fn at_start(
        &self,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<ActiveRoute>, String> {
        let key = match var(&self.key_var).filter(|key| !key.is_empty()) {
            Some(key) => key,
            None if self.when_key_set => return Ok(None),
            None => String::new(),
        };
        let base = match &self.upstream {
            Some(written) => written.clone(),
            None => match var(self.provider.base_var()).filter(|v| !v.trim().is_empty()) {
                // The value is never quoted back: a base URL may carry credentials.
                Some(url) => self.provider.upstream_of(&url).map_err(|_| {
                    format!(
                        "{} cannot be the model proxy's upstream: write an http(s) URL with a \
                         host and no query{}, or name the upstream in the profile's \
                         model_proxy.{}.upstream",
                        self.provider.base_var(),
                        match self.provider {
                            Provider::OpenAi => ", ending in /v1",
                            Provider::Anthropic => "",
                        },
                        self.provider.name()
                    )
                })?,
                None => Self::parse_upstream(self.provider.default_upstream())?,
            },
        };
        Ok(Some(ActiveRoute {
            provider: self.provider,
            key_var: self.key_var.clone(),
            upstream: Upstream { base, key },
        }))
    }

    /// An upstream as a profile writes it: `http` or `https`, a host, no query.
    pub fn parse_upstream(text: &str) -> Result<Uri, String> {
        let uri: Uri = text
            .parse()
            .map_err(|e| format!("{text:?} is not a URL: {e}"))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(format!(
                "{text:?} is not an http(s) URL with a host, such as \"https://api.anthropic.com\""
            ));
        }
        if uri.query().is_some() {
            return Err(format!("{text:?} has a query; write the base URL alone"));
        }
        Ok(uri)
    }
}

/// Where one provider's calls go, and the key they carry there.
#[derive(Clone)]
pub struct Upstream {
    /// Scheme, authority and an optional path prefix (`https://api.anthropic.com`).
    pub base: Uri,
    pub key: String,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("base", &self.base)
            .field("key", &"<secret>")
            .finish()
    }
}

/// The proxy's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The longest wait for the upstream's answer to start, and between two of its chunks.
    pub timeout: Duration,
    /// The largest request body forwarded.
    pub max_request_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(600),
            max_request_bytes: 32 << 20,
        }
    }
}

type HttpsClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

/// The client every box's proxy forwards with (one connection pool for the server).
#[derive(Clone)]
pub struct UpstreamClient(HttpsClient);

impl UpstreamClient {
    /// A client trusting the system's roots (plain HTTP too, for an upstream on loopback).
    pub fn new() -> std::io::Result<Self> {
        // Without TCP_NODELAY a request's head and body, written apart, wait on a delayed ACK.
        let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()?
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(60))
                .build(connector);
        Ok(Self(client))
    }
}

/// The proxy of one box.
pub struct BoxProxy {
    pub session: Uuid,
    /// For metrics.
    pub profile: String,
    pub upstreams: BTreeMap<Provider, Upstream>,
    pub tokens: Arc<TokenKey>,
    pub meter: Arc<dyn Meter>,
    pub client: UpstreamClient,
    pub limits: Limits,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ProxyBody = BoxBody<Bytes, BoxError>;

/// Serves the proxy on `listener` until the returned task is aborted.
pub fn serve(listener: TcpListener, proxy: Arc<BoxProxy>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            // Answers stream in small chunks: each goes out as it comes.
            let _ = stream.set_nodelay(true);
            let proxy = proxy.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let proxy = proxy.clone();
                    async move { Ok::<_, std::convert::Infallible>(proxy.handle(request).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

impl BoxProxy {
    async fn handle(&self, request: Request<Incoming>) -> Response<ProxyBody> {
        let started = Instant::now();
        let path = request.uri().path().to_owned();
        // The probes agents send before their first call: answered here, as a provider does.
        if path == "/" && matches!(*request.method(), http::Method::HEAD | http::Method::GET) {
            return plain(StatusCode::OK, String::new());
        }
        let Some((provider, rest)) = Provider::of_path(&path) else {
            return plain(
                StatusCode::NOT_FOUND,
                format!("no provider at {path:?}: the model proxy serves /anthropic and /openai\n"),
            );
        };
        let refuse = |status: StatusCode, message: &str| {
            self.count(provider, None, status.as_u16());
            refusal(provider, status, message)
        };
        let Some(upstream) = self.upstreams.get(&provider) else {
            return refuse(
                StatusCode::NOT_FOUND,
                &format!(
                    "this session's profile sends no calls to {} through the model proxy",
                    provider.name()
                ),
            );
        };
        let Some(served) = provider.serves(request.method(), rest) else {
            return refuse(
                StatusCode::NOT_FOUND,
                &format!("the model proxy does not serve {} {path}", request.method()),
            );
        };
        match provider.key_of(request.headers()) {
            Some(token) if self.tokens.is_of(token, self.session) => {}
            _ => {
                return refuse(
                    StatusCode::UNAUTHORIZED,
                    "not this session's key: the model proxy takes only the token its session was given",
                );
            }
        }
        if upstream.key.is_empty() {
            return refuse(
                StatusCode::UNAUTHORIZED,
                &format!(
                    "the harness holds no {} key to call with: the variable this profile names \
                     for it is not set in the server's environment",
                    provider.name()
                ),
            );
        }
        let (parts, body) = request.into_parts();
        let body = match Limited::new(body, self.limits.max_request_bytes)
            .collect()
            .await
        {
            Ok(body) => body.to_bytes(),
            Err(e)
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some() =>
            {
                return refuse(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &format!(
                        "the request is larger than the model proxy's {} bytes",
                        self.limits.max_request_bytes
                    ),
                );
            }
            Err(_) => return refuse(StatusCode::BAD_REQUEST, "the request body was cut off"),
        };
        let api = match served {
            Served::ModelCall(api) => {
                if let Err(why) = self.meter.admit(self.session).await {
                    let mut response = refuse(StatusCode::FORBIDDEN, &why);
                    // Anthropic's SDK reads it; every SDK leaves a 403 alone.
                    response
                        .headers_mut()
                        .insert("x-should-retry", http::HeaderValue::from_static("false"));
                    return response;
                }
                Some(api)
            }
            Served::Free => None,
        };
        let forwarded = match forward_request(upstream, provider, rest, &parts, body) {
            Ok(forwarded) => forwarded,
            Err(why) => return refuse(StatusCode::BAD_GATEWAY, &why),
        };
        let answer =
            tokio::time::timeout(self.limits.timeout, self.client.0.request(forwarded)).await;
        let answer = match answer {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => {
                tracing::warn!(provider = provider.name(), error = %e, "model proxy: upstream unreachable");
                return refuse(
                    StatusCode::BAD_GATEWAY,
                    &format!("the model API could not be reached: {e}"),
                );
            }
            Err(_) => {
                return refuse(
                    StatusCode::GATEWAY_TIMEOUT,
                    &format!(
                        "the model API did not answer within {}",
                        humantime::format_duration(self.limits.timeout)
                    ),
                );
            }
        };
        let (mut parts, body) = answer.into_parts();
        let status = parts.status.as_u16();
        strip_hop_by_hop(&mut parts.headers);
        let Some(api) = api else {
            self.count(provider, None, status);
            return Response::from_parts(parts, body.map_err(BoxError::from).boxed());
        };
        let content_type = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        let streamed = content_type.starts_with("text/event-stream");
        // A model call's answer is JSON or an event stream, or its usage cannot be read: an
        // upstream that answers otherwise (a login page, a proxy's error page) is not the API.
        if parts.status.is_success() && !streamed && !content_type.starts_with("application/json") {
            return refuse(
                StatusCode::BAD_GATEWAY,
                &format!(
                    "the model API's answer is not the API's (content-type {content_type:?}, \
                     not JSON or an event stream)"
                ),
            );
        }
        let metered = Metered {
            inner: body,
            reader: Some(usage::UsageReader::new(api, streamed)),
            gap: self.limits.timeout,
            idle: None,
            done: Some(Done {
                call: ModelCall {
                    session: self.session,
                    provider,
                    status,
                    usage: None,
                    took: Duration::ZERO,
                },
                started,
                meter: self.meter.clone(),
                profile: self.profile.clone(),
            }),
        };
        Response::from_parts(parts, metered.boxed())
    }

    fn count(&self, provider: Provider, model: Option<&str>, status: u16) {
        count_call(&self.profile, provider, model, status);
    }
}

fn count_call(profile: &str, provider: Provider, model: Option<&str>, status: u16) {
    metrics::counter!(
        MODEL_CALLS,
        "profile" => profile.to_owned(),
        "provider" => provider.name(),
        "model" => model.unwrap_or("").to_owned(),
        "status" => status.to_string(),
    )
    .increment(1);
}

/// The request as the upstream gets it: its path under the upstream's base, the caller's
/// query, the caller's headers less those of this hop, and the real key.
fn forward_request(
    upstream: &Upstream,
    provider: Provider,
    rest: &str,
    parts: &http::request::Parts,
    body: Bytes,
) -> Result<Request<Full<Bytes>>, String> {
    let base = &upstream.base;
    let mut path = base.path().trim_end_matches('/').to_owned();
    path.push_str(rest);
    if let Some(query) = parts.uri.query() {
        path.push('?');
        path.push_str(query);
    }
    let uri = Uri::builder()
        .scheme(base.scheme().cloned().unwrap_or(http::uri::Scheme::HTTPS))
        .authority(
            base.authority()
                .cloned()
                .ok_or("the upstream names no host")?,
        )
        .path_and_query(path)
        .build()
        .map_err(|e| format!("the upstream address: {e}"))?;
    let mut headers = parts.headers.clone();
    strip_hop_by_hop(&mut headers);
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    // The answer is read for its usage: uncompressed.
    headers.remove(header::ACCEPT_ENCODING);
    provider.set_key(&mut headers, &upstream.key)?;
    let mut request = Request::builder()
        .method(parts.method.clone())
        .uri(uri)
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    *request.headers_mut() = headers;
    Ok(request)
}

/// Headers of one hop only, never forwarded (RFC 9110, 7.6.1), and those a `Connection` header
/// names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|n| n.trim().to_ascii_lowercase()))
        .collect();
    for name in named {
        headers.remove(name.as_str());
    }
    for name in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ] {
        headers.remove(name);
    }
}

fn plain(status: StatusCode, text: String) -> Response<ProxyBody> {
    let mut response = Response::new(full(text));
    *response.status_mut() = status;
    response
}

fn refusal(provider: Provider, status: StatusCode, message: &str) -> Response<ProxyBody> {
    let mut response = Response::new(full(provider.error_body(status, message)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

fn full(text: String) -> ProxyBody {
    Full::new(Bytes::from(text))
        .map_err(|never| match never {})
        .boxed()
}

/// What is recorded once an answer ends.
struct Done {
    call: ModelCall,
    started: Instant,
    meter: Arc<dyn Meter>,
    profile: String,
}

/// An answer's body on its way to the agent: every chunk passed on as it comes, read for usage
/// as it passes; the call recorded once, when the body ends, fails, stalls past the limit or is
/// dropped (the agent went away: the provider charges for what it sent all the same).
struct Metered {
    inner: Incoming,
    reader: Option<usage::UsageReader>,
    gap: Duration,
    idle: Option<Pin<Box<tokio::time::Sleep>>>,
    done: Option<Done>,
}

impl Metered {
    fn finish(&mut self) {
        let Some(mut done) = self.done.take() else {
            return;
        };
        done.call.usage = self.reader.take().and_then(usage::UsageReader::finish);
        done.call.took = done.started.elapsed();
        count_call(
            &done.profile,
            done.call.provider,
            done.call.usage.as_ref().and_then(|u| u.model.as_deref()),
            done.call.status,
        );
        done.meter.record(done.call);
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        self.finish();
    }
}

impl Body for Metered {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.idle = None;
                if let (Some(data), Some(reader)) = (frame.data_ref(), this.reader.as_mut()) {
                    reader.feed(data);
                }
                // The last bytes: the call is recorded before the agent can have them (and
                // send its next call), so a budget check of that call counts this one.
                if this.inner.is_end_stream() {
                    this.finish();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.finish();
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => {
                this.finish();
                Poll::Ready(None)
            }
            Poll::Pending => {
                // An upstream that stops sending mid-answer is cut off after the limit.
                let gap = this.gap;
                let idle = this
                    .idle
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(gap)));
                if idle.as_mut().poll(cx).is_ready() {
                    this.finish();
                    // An error, not an end: the agent must not take a cut answer for a whole one.
                    return Poll::Ready(Some(Err(format!(
                        "the model API sent nothing for {}",
                        humantime::format_duration(gap)
                    )
                    .into())));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done.is_none() || self.inner.is_end_stream()
    }
}

#[cfg(test)]
mod tests;
