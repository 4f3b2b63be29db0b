//! The HTTP/1.1 server every fake API shares: it binds, answers the shared routes, records, and
//! hands the rest to the API's module. Shared routes:
//!
//! - `HEAD /` → 200 (agents probe the base URL before their first call);
//! - `GET /_requests` → every recorded request so far, as a JSON array.

use std::{convert::Infallible, fmt, io, net::SocketAddr, str::FromStr, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Frame, Incoming},
    header,
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpListener, sync::mpsc, task::JoinSet};

use crate::record::{RecordedRequest, Recorder};

/// The body of every answer: whole, or streamed as it is produced.
pub type Body = BoxBody<Bytes, Infallible>;

/// Which API a server fakes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// Anthropic Messages (`POST /v1/messages`), as Claude Code calls it.
    Anthropic,
    /// OpenAI Responses (`POST /v1/responses`), as Codex calls it.
    OpenAiResponses,
    /// OpenAI Chat Completions (`POST /v1/chat/completions`), as opencode calls it.
    OpenAiChat,
}

impl Api {
    pub const ALL: [Api; 3] = [Api::Anthropic, Api::OpenAiResponses, Api::OpenAiChat];

    pub fn name(self) -> &'static str {
        match self {
            Api::Anthropic => "anthropic",
            Api::OpenAiResponses => "openai-responses",
            Api::OpenAiChat => "openai-chat",
        }
    }
}

impl fmt::Display for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Api {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Api::ALL
            .into_iter()
            .find(|api| api.name() == s)
            .ok_or_else(|| {
                let known: Vec<_> = Api::ALL.iter().map(|a| a.name()).collect();
                format!("unknown API '{s}' (known: {})", known.join(", "))
            })
    }
}

/// A running fake server; it stops (with its open connections) when dropped.
pub struct FakeServer {
    api: Api,
    addr: SocketAddr,
    recorder: Recorder,
    task: tokio::task::JoinHandle<()>,
}

impl FakeServer {
    /// A server for `api` on an ephemeral loopback port.
    pub async fn start(api: Api) -> io::Result<Self> {
        Self::bind(api, SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// A server for `api` on `addr` (port 0 for an ephemeral one).
    pub async fn bind(api: Api, addr: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let recorder = Recorder::default();
        let task = tokio::spawn(accept(listener, api, recorder.clone()));
        Ok(Self {
            api,
            addr,
            recorder,
            task,
        })
    }

    pub fn api(&self) -> Api {
        self.api
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`: what an agent's base-URL setting takes.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.recorder.all()
    }

    /// The tokens of every answer sent whole so far (input, output).
    pub fn served_tokens(&self) -> (u64, u64) {
        self.recorder.served_tokens()
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts connections until aborted; the connections' tasks end with it (the set is dropped).
async fn accept(listener: TcpListener, api: Api, recorder: Recorder) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                // Answers stream in small chunks: each goes out as it comes.
                let _ = stream.set_nodelay(true);
                let recorder = recorder.clone();
                connections.spawn(async move {
                    let service = service_fn(move |request| {
                        let recorder = recorder.clone();
                        async move { Ok::<_, Infallible>(dispatch(api, &recorder, request).await) }
                    });
                    // A client that goes away mid-stream is ordinary (a cancelled turn).
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// A request, read whole, as the API modules see it.
pub struct ApiRequest {
    pub method: Method,
    /// The path without the query.
    pub path: String,
    /// The key it carried (`x-api-key`, or a bearer token).
    pub key: Option<String>,
    pub body: Bytes,
}

impl ApiRequest {
    /// The record of this request, before its API module fills in what it read of the body.
    pub fn recorded(&self, api: &'static str) -> crate::RecordedRequest {
        crate::RecordedRequest {
            api,
            method: self.method.to_string(),
            path: self.path.clone(),
            key: self.key.clone(),
            ..Default::default()
        }
    }
}

async fn dispatch(api: Api, recorder: &Recorder, request: Request<Incoming>) -> Response<Body> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    if method == Method::HEAD && path == "/" {
        recorder.push(RecordedRequest {
            api: api.name(),
            method: method.to_string(),
            path,
            status: 200,
            ..Default::default()
        });
        return whole(StatusCode::OK, "text/plain", Bytes::new());
    }
    if method == Method::GET && path == "/_requests" {
        let listed = serde_json::to_vec(&recorder.all()).expect("requests serialize");
        return whole(StatusCode::OK, "application/json", listed.into());
    }
    let headers = request.headers();
    let key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .or_else(|| {
            headers
                .get(hyper::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
        })
        .map(str::to_owned);
    let body = match request.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let incoming = ApiRequest {
        method,
        path,
        key,
        body,
    };
    match api {
        Api::Anthropic => crate::anthropic::handle(incoming, recorder).await,
        Api::OpenAiResponses => crate::openai_responses::handle(incoming, recorder).await,
        Api::OpenAiChat => crate::openai_chat::handle(incoming, recorder).await,
    }
}

/// A whole answer.
pub fn whole(status: StatusCode, content_type: &str, body: Bytes) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(body).boxed())
        .expect("a valid response")
}

/// A JSON answer.
pub fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    whole(
        status,
        "application/json",
        serde_json::to_vec(value).expect("JSON").into(),
    )
}

/// A streamed answer (`text/event-stream`) and the [`Stream`] that writes it.
pub fn event_stream() -> (Response<Body>, Stream) {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let response = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(ChannelBody { rx }.boxed())
        .expect("a valid response");
    (response, Stream { tx })
}

/// A body whose frames are the chunks sent on a channel; it ends when the sender is dropped.
struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|bytes| Ok(Frame::data(bytes))))
    }
}

/// The writing end of a streamed answer. Every method says whether the client is still there,
/// so a producer stops as soon as the agent hangs up (a cancelled turn).
pub struct Stream {
    tx: mpsc::Sender<Bytes>,
}

impl Stream {
    /// Sends a chunk; false once the client went away.
    pub async fn send(&self, chunk: impl Into<Bytes>) -> bool {
        self.tx.send(chunk.into()).await.is_ok()
    }

    /// Sends nothing for `duration`; false (early) once the client went away.
    pub async fn stall(&self, duration: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(duration) => true,
            _ = self.tx.closed() => false,
        }
    }
}
