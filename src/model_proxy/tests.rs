//! The proxy against the scripted fake model servers, over real loopback connections.

use std::sync::Mutex;

use agent_harness_model_fakes::{Api as FakeApi, FakeServer};
use serde_json::{Value, json};

use super::*;

const REAL_KEY: &str = "sk-real-upstream-key-5d1e";

/// A meter that admits while `open`, and keeps every call it is told of.
#[derive(Default)]
struct Book {
    closed: std::sync::atomic::AtomicBool,
    calls: Mutex<Vec<ModelCall>>,
    recorded: tokio::sync::Notify,
}

impl Meter for Arc<Book> {
    fn admit(&self, _session: Uuid) -> BoxFuture<'static, Result<(), String>> {
        let closed = self.closed.load(std::sync::atomic::Ordering::SeqCst);
        Box::pin(async move {
            if closed {
                Err("BUDGET_EXHAUSTED: the budget of \"ada\" for this day is spent".to_owned())
            } else {
                Ok(())
            }
        })
    }

    fn record(&self, call: ModelCall) {
        self.calls.lock().unwrap().push(call);
        self.recorded.notify_waiters();
    }
}

impl Book {
    /// Waits (bounded) until `n` calls are recorded.
    async fn calls(&self, n: usize) -> Vec<ModelCall> {
        tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                let waiting = self.recorded.notified();
                if self.calls.lock().unwrap().len() >= n {
                    return self.calls.lock().unwrap().clone();
                }
                waiting.await;
            }
        })
        .await
        .expect("the calls are recorded within 20 s")
    }
}

struct Rig {
    origin: String,
    session: Uuid,
    token: String,
    book: Arc<Book>,
    _task: JoinHandle<()>,
}

async fn rig(upstreams: BTreeMap<Provider, Upstream>, limits: Limits) -> Rig {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    let tokens = Arc::new(TokenKey::random());
    let session = Uuid::now_v7();
    let book = Arc::new(Book::default());
    let proxy = Arc::new(BoxProxy {
        session,
        profile: "claude".into(),
        upstreams,
        tokens: tokens.clone(),
        meter: Arc::new(book.clone()),
        client: UpstreamClient::new().unwrap(),
        limits,
    });
    Rig {
        origin,
        session,
        token: tokens.token(session),
        book,
        _task: serve(listener, proxy),
    }
}

fn upstream(fake: &FakeServer) -> Upstream {
    Upstream {
        base: fake.base_url().parse().unwrap(),
        key: REAL_KEY.into(),
    }
}

/// A plain HTTP/1.1 client, as an agent's SDK would be.
async fn call(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Value,
) -> (u16, HeaderMap, String) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let mut request = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(20), async {
        let response = client.request(request).await.expect("an answer");
        let (parts, body) = response.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        (parts, body)
    })
    .await
    .expect("answered within 20 s");
    (
        response.0.status.as_u16(),
        response.0.headers,
        String::from_utf8_lossy(&response.1).into_owned(),
    )
}

/// A step of an agent's turn (it offers a tool: the fake's directives apply only to those).
fn messages_request(text: &str) -> Value {
    json!({
        "model": "claude-test",
        "max_tokens": 100,
        "stream": true,
        "messages": [{"role": "user", "content": text}],
        "tools": [{"name": "Write", "description": "writes a file",
                   "input_schema": {"type": "object", "properties": {}}}],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_with_its_sessions_token_reaches_the_upstream_with_the_real_key_and_its_usage_is_read()
 {
    let fake = FakeServer::start(FakeApi::Anthropic).await.unwrap();
    let rig = rig(
        BTreeMap::from([(Provider::Anthropic, upstream(&fake))]),
        Limits::default(),
    )
    .await;
    let (status, headers, body) = call(
        "POST",
        &format!(
            "{}/v1/messages?beta=true",
            Provider::Anthropic.base_url(&rig.origin)
        ),
        &[("x-api-key", &rig.token), ("accept-encoding", "gzip")],
        messages_request("hello there"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    assert!(body.contains("message_stop"), "{body}");
    let seen = fake.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].key.as_deref(), Some(REAL_KEY));
    assert_eq!(seen[0].last_user_text.as_deref(), Some("hello there"));
    let calls = rig.book.calls(1).await;
    let usage = calls[0].usage.clone().expect("usage read from the answer");
    assert_eq!(calls[0].session, rig.session);
    assert_eq!(calls[0].status, 200);
    assert_eq!(usage.input_tokens, 100, "the fake's input");
    assert!(usage.output_tokens >= 1);
    // The answer the agent got carries the same output count the proxy read.
    assert!(
        body.contains(&format!("\"output_tokens\":{}", usage.output_tokens)),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_calls_carry_the_real_key_as_a_bearer_token_and_both_apis_are_read() {
    let responses = FakeServer::start(FakeApi::OpenAiResponses).await.unwrap();
    let rig = rig(
        BTreeMap::from([(Provider::OpenAi, upstream(&responses))]),
        Limits::default(),
    )
    .await;
    let bearer = format!("Bearer {}", rig.token);
    let (status, _, body) = call(
        "POST",
        &format!("{}/responses", Provider::OpenAi.base_url(&rig.origin)),
        &[("authorization", &bearer)],
        json!({"model": "gpt-test", "stream": true, "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        ]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(responses.requests()[0].key.as_deref(), Some(REAL_KEY));
    let calls = rig.book.calls(1).await;
    let usage = calls[0].usage.clone().unwrap();
    assert_eq!(usage.input_tokens, 100);
    assert!(usage.output_tokens >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_sessions_token_or_none_is_refused_in_the_providers_shape_and_nothing_is_forwarded()
{
    let fake = FakeServer::start(FakeApi::Anthropic).await.unwrap();
    let rig = rig(
        BTreeMap::from([(Provider::Anthropic, upstream(&fake))]),
        Limits::default(),
    )
    .await;
    let others = TokenKey::random().token(rig.session);
    let url = format!("{}/v1/messages", Provider::Anthropic.base_url(&rig.origin));
    for headers in [
        vec![],
        vec![("x-api-key", others.as_str())],
        vec![("x-api-key", REAL_KEY)],
    ] {
        let (status, _, body) = call("POST", &url, &headers, messages_request("hi")).await;
        assert_eq!(status, 401, "{body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["error"]["type"], "authentication_error");
    }
    assert!(fake.requests().is_empty(), "nothing reached the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_budget_is_an_error_agents_do_not_retry_and_nothing_is_forwarded() {
    let fake = FakeServer::start(FakeApi::Anthropic).await.unwrap();
    let rig = rig(
        BTreeMap::from([(Provider::Anthropic, upstream(&fake))]),
        Limits::default(),
    )
    .await;
    rig.book
        .closed
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let (status, headers, body) = call(
        "POST",
        &format!("{}/v1/messages", Provider::Anthropic.base_url(&rig.origin)),
        &[("x-api-key", &rig.token)],
        messages_request("hi"),
    )
    .await;
    assert_eq!(status, 403);
    assert_eq!(headers["x-should-retry"], "false");
    assert!(body.contains("BUDGET_EXHAUSTED"), "{body}");
    // A model list costs nothing, and is still served.
    let (status, _, _) = call(
        "GET",
        &format!("{}/v1/models", Provider::Anthropic.base_url(&rig.origin)),
        &[("x-api-key", &rig.token)],
        json!({}),
    )
    .await;
    assert_eq!(
        status, 404,
        "the fake has no model list: forwarded, and answered by it"
    );
    let seen = fake.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/v1/models");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_it_does_not_serve_providers_it_has_no_upstream_for_and_oversized_bodies_are_refused()
{
    let fake = FakeServer::start(FakeApi::Anthropic).await.unwrap();
    let rig = rig(
        BTreeMap::from([(Provider::Anthropic, upstream(&fake))]),
        Limits {
            max_request_bytes: 4096,
            ..Limits::default()
        },
    )
    .await;
    let key = [("x-api-key", rig.token.as_str())];
    let anthropic = Provider::Anthropic.base_url(&rig.origin);
    let (status, _, body) = call("POST", &format!("{anthropic}/v1/files"), &key, json!({})).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["type"],
        "not_found_error"
    );
    let (status, _, _) = call(
        "POST",
        &format!("{}/responses", Provider::OpenAi.base_url(&rig.origin)),
        &[("authorization", &format!("Bearer {}", rig.token))],
        json!({}),
    )
    .await;
    assert_eq!(status, 404);
    let (status, _, _) = call(
        "POST",
        &format!("{}/somewhere", rig.origin),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(status, 404);
    let (status, _, body) = call(
        "POST",
        &format!("{anthropic}/v1/messages"),
        &key,
        messages_request(&"x".repeat(5000)),
    )
    .await;
    assert_eq!(status, 413, "{body}");
    // The probe agents send first.
    let (status, _, _) = call("HEAD", &format!("{}/", rig.origin), &[], json!({})).await;
    assert_eq!(status, 200);
    assert!(fake.requests().is_empty(), "nothing reached the upstream");
    assert!(rig.book.calls.lock().unwrap().is_empty(), "no usage");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_is_down_errs_or_stalls_gives_the_agent_its_providers_error() {
    // Down: a port nobody listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let fake = FakeServer::start(FakeApi::Anthropic).await.unwrap();
    let rig_down = rig(
        BTreeMap::from([(
            Provider::Anthropic,
            Upstream {
                base: down.parse().unwrap(),
                key: REAL_KEY.into(),
            },
        )]),
        Limits::default(),
    )
    .await;
    let (status, _, body) = call(
        "POST",
        &format!(
            "{}/v1/messages",
            Provider::Anthropic.base_url(&rig_down.origin)
        ),
        &[("x-api-key", &rig_down.token)],
        messages_request("hi"),
    )
    .await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["type"],
        "error"
    );

    let rig = rig(
        BTreeMap::from([(Provider::Anthropic, upstream(&fake))]),
        Limits {
            timeout: Duration::from_millis(300),
            ..Limits::default()
        },
    )
    .await;
    let url = format!("{}/v1/messages", Provider::Anthropic.base_url(&rig.origin));
    let key = [("x-api-key", rig.token.as_str())];
    // The upstream's own error passes through as it is.
    let (status, _, body) = call("POST", &url, &key, messages_request("hi [error 500]")).await;
    assert_eq!(status, 500, "{body}");
    // An answer that stalls mid-stream past the limit is cut off, and what it said is recorded.
    let (status, _, body) = call("POST", &url, &key, messages_request("hi [stall 5]")).await;
    assert_eq!(status, 200);
    assert!(!body.contains("message_stop"), "{body}");
    let calls = rig.book.calls(2).await;
    assert_eq!(calls[0].status, 500);
    assert_eq!(calls[1].usage.as_ref().map(|u| u.input_tokens), Some(100));
    // And the next call goes through.
    let (status, _, _) = call("POST", &url, &key, messages_request("again")).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_answer_that_is_not_the_apis_is_refused_in_the_providers_shape_unrecorded() {
    // An upstream that answers every request with a web page (a captive portal, a misrouted
    // base URL), as HTTP/1.1 on loopback.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buffer = vec![0u8; 64 * 1024];
                let _ = socket.read(&mut buffer).await;
                let page = "<html>sign in</html>";
                let _ = socket
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\n\
                             connection: close\r\n\r\n{page}",
                            page.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    let rig = rig(
        BTreeMap::from([(
            Provider::Anthropic,
            Upstream {
                base: base.parse().unwrap(),
                key: REAL_KEY.into(),
            },
        )]),
        Limits::default(),
    )
    .await;
    let (status, _, body) = call(
        "POST",
        &format!("{}/v1/messages", Provider::Anthropic.base_url(&rig.origin)),
        &[("x-api-key", &rig.token)],
        messages_request("hi"),
    )
    .await;
    assert_eq!(status, 502, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["type"], "error");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("text/html"),
        "{body}"
    );
    assert!(
        rig.book.calls.lock().unwrap().is_empty(),
        "no usage recorded"
    );
}
