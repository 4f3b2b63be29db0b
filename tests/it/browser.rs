//! The browser's way in: gRPC-Web over HTTP/1.1 beside native gRPC, the CORS
//! allowlist, the built-in console at `/`, and none of it unless configured.

use agent_harness::pb::v1::{
    self as pb, agent_session_service_client::AgentSessionServiceClient, subscribe_response::Event,
};
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::{
    client::legacy::Client,
    rt::{TokioExecutor, TokioIo},
};
use tonic::{Code, codegen::Bytes, metadata::MetadataValue};
use tonic_web::GrpcWebClientLayer;

use crate::{
    auth::{ADA, TokensFile, with_tokens},
    harness::{Harness, bounded},
    process::Serve,
    support::{Session, create_request},
};

const ALLOWED: &str = "http://ui.allowed.example:8080";
const OTHER: &str = "http://ui.other.example";

/// A generated client speaking gRPC-Web over HTTP/1.1, as a browser does.
fn grpc_web_client(
    h: &Harness,
) -> AgentSessionServiceClient<
    tonic_web::GrpcWebClientService<
        Client<
            hyper_util::client::legacy::connect::HttpConnector,
            tonic_web::GrpcWebCall<tonic::body::Body>,
        >,
    >,
> {
    let client = Client::builder(TokioExecutor::new()).build_http();
    let service = tower::ServiceBuilder::new()
        .layer(GrpcWebClientLayer::new())
        .service(client);
    let origin = format!("http://{}", h.addr()).parse().expect("a URI");
    AgentSessionServiceClient::with_origin(service, origin)
}

/// One HTTP/1.1 request on a fresh connection: the status, headers and body, or the error.
pub(crate) async fn http1(
    h: &Harness,
    request: Request<Full<Bytes>>,
) -> Result<(StatusCode, http::HeaderMap, Bytes), String> {
    let tcp = tokio::net::TcpStream::connect(h.addr())
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((parts.status, parts.headers, body))
}

fn get(h: &Harness, path: &str) -> Request<Full<Bytes>> {
    Request::get(format!("http://{}{path}", h.addr()))
        .header(header::HOST, h.addr().to_string())
        .body(Full::default())
        .expect("a request")
}

fn preflight(h: &Harness, origin: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(Method::OPTIONS)
        .uri(format!(
            "http://{}/agent_harness.v1.AgentSessionService/Subscribe",
            h.addr()
        ))
        .header(header::HOST, h.addr().to_string())
        .header(header::ORIGIN, origin)
        .header(header::ACCESS_CONTROL_REQUEST_METHOD, "POST")
        .header(
            header::ACCESS_CONTROL_REQUEST_HEADERS,
            "authorization,content-type,x-grpc-web,x-user-agent",
        )
        .body(Full::default())
        .expect("a request")
}

/// Every event of a stream up to and including the first `TurnEnded`.
async fn events_through_turn_end(
    stream: &mut tonic::Streaming<pb::SubscribeResponse>,
) -> Vec<pb::SubscribeResponse> {
    let mut seen = Vec::new();
    loop {
        let event = stream
            .message()
            .await
            .expect("the stream does not fail")
            .expect("the stream stays open");
        let ended = matches!(event.event, Some(Event::TurnEnded(_)));
        seen.push(event);
        if ended {
            return seen;
        }
    }
}

#[tokio::test]
async fn a_grpc_web_subscriber_receives_every_event_a_native_one_does() {
    bounded(async {
        let h = Harness::start_with(|c| c.browser.grpc_web = true).await;
        let mut web = grpc_web_client(&h);
        let created = web
            .create_session(create_request(&h, "mock"))
            .await
            .expect("CreateSession over gRPC-Web")
            .into_inner();
        let id = created.session.expect("a session").id;
        let mut native = Session::attach(h.sessions(), &id);

        let subscribe = pb::SubscribeRequest {
            session_id: id.clone(),
            after_offset: 0,
            view: pb::SubscribeView::All as i32,
        };
        let mut over_web = web
            .subscribe(subscribe.clone())
            .await
            .expect("Subscribe over gRPC-Web")
            .into_inner();
        web.control(native.control_request(crate::support::prompt(
            "hello\n@chunks 3 20\n@tool t1\n@plan a|b",
        )))
        .await
        .expect("Control over gRPC-Web");

        let from_web = events_through_turn_end(&mut over_web).await;
        let mut over_native = native
            .client
            .subscribe(subscribe)
            .await
            .expect("native Subscribe")
            .into_inner();
        let from_native = events_through_turn_end(&mut over_native).await;

        // The web stream was open from the start, the native one caught up afterwards: the
        // events after `caught_up` may split differently, but the log entries and the turn's
        // end are the same, offset for offset.
        let entries = |events: &[pb::SubscribeResponse]| -> Vec<(u64, String)> {
            events
                .iter()
                .filter_map(|e| match &e.event {
                    Some(Event::Entry(entry)) => Some((entry.offset, entry.json.clone())),
                    _ => None,
                })
                .collect()
        };
        let web_entries = entries(&from_web);
        assert_eq!(web_entries, entries(&from_native));
        let chunks = web_entries
            .iter()
            .filter(|(_, json)| json.contains("agent_message_chunk"))
            .count();
        assert!(chunks >= 4, "the echo and three chunks: {web_entries:#?}");
        assert!(
            web_entries.iter().any(|(_, json)| json.contains("\"t1\"")),
            "the tool call: {web_entries:#?}"
        );
        assert_eq!(from_web.last(), from_native.last());

        let transcript = native.transcript().await;
        let last_offset = transcript.head_offset;
        assert_eq!(web_entries.last().map(|(o, _)| *o), Some(last_offset));
    })
    .await;
}

#[tokio::test]
async fn grpc_web_calls_authenticate_like_grpc_ones() {
    bounded(async {
        let tokens = TokensFile::new(crate::auth::EVERYONE);
        let h = Harness::start_with(|c| {
            with_tokens(c, &tokens.path, None);
            c.browser.grpc_web = true;
        })
        .await;
        let mut web = grpc_web_client(&h);
        let refused = web
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .expect_err("no token");
        assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");

        let mut request = tonic::Request::new(pb::ListSessionsRequest::default());
        request.metadata_mut().insert(
            "authorization",
            MetadataValue::try_from(format!("Bearer {ADA}")).expect("ascii"),
        );
        web.list_sessions(request).await.expect("with ada's token");
    })
    .await;
}

#[tokio::test]
async fn a_cors_preflight_is_answered_for_an_allowed_origin_and_refused_for_another() {
    bounded(async {
        let h =
            Harness::start_with(|c| c.browser.cors_allow_origins = vec![ALLOWED.to_owned()]).await;

        let (status, headers, _) = http1(&h, preflight(&h, ALLOWED)).await.expect("answered");
        assert!(status.is_success(), "{status}");
        assert_eq!(
            headers
                .get(header::ACCESS_CONTROL_ALLOW_ORIGIN)
                .map(|v| v.as_bytes()),
            Some(ALLOWED.as_bytes())
        );
        let allowed_headers = headers
            .get(header::ACCESS_CONTROL_ALLOW_HEADERS)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        for needed in ["authorization", "x-grpc-web", "content-type"] {
            assert!(allowed_headers.contains(needed), "{allowed_headers}");
        }

        let (_, headers, _) = http1(&h, preflight(&h, OTHER)).await.expect("answered");
        assert_eq!(
            headers.get(header::ACCESS_CONTROL_ALLOW_ORIGIN),
            None,
            "a browser refuses the call without it: {headers:?}"
        );

        // The origin is only a browser's rule: a call from an allowed page works and exposes
        // the status headers to the page.
        let health = Request::post(format!("http://{}/grpc.health.v1.Health/Check", h.addr()))
            .header(header::HOST, h.addr().to_string())
            .header(header::ORIGIN, ALLOWED)
            .header(header::CONTENT_TYPE, "application/grpc-web+proto")
            .header("x-grpc-web", "1")
            .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
            .expect("a request");
        let (status, headers, body) = http1(&h, health).await.expect("answered");
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            headers
                .get(header::ACCESS_CONTROL_ALLOW_ORIGIN)
                .map(|v| v.as_bytes()),
            Some(ALLOWED.as_bytes())
        );
        let exposed = headers
            .get(header::ACCESS_CONTROL_EXPOSE_HEADERS)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        assert!(exposed.contains("grpc-status"), "{exposed}");
        assert!(
            String::from_utf8_lossy(&body).contains("grpc-status:0"),
            "a SERVING answer and its trailers frame: {body:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn the_console_is_served_at_the_root_with_its_assets_compiled_in() {
    bounded(async {
        let h = Harness::start_with(|c| c.browser.console = true).await;
        let (status, headers, body) = http1(&h, get(&h, "/")).await.expect("answered");
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            headers.get(header::CONTENT_TYPE).map(|v| v.as_bytes()),
            Some(&b"text/html; charset=utf-8"[..])
        );
        let csp = headers
            .get(header::CONTENT_SECURITY_POLICY)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        assert!(csp.contains("connect-src 'self'"), "{csp}");
        let page = String::from_utf8_lossy(&body);
        assert!(
            page.contains("/app.js") && page.contains("<label"),
            "{page}"
        );

        let (status, headers, body) = http1(&h, get(&h, "/app.js")).await.expect("answered");
        assert_eq!(status, StatusCode::OK);
        assert!(
            headers
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"text/javascript"))
        );
        let built = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/console/dist/app.js"))
            .expect("the committed bundle");
        assert_eq!(body.as_ref(), built.as_slice());

        // The console's own calls are same-origin gRPC-Web.
        let mut web = grpc_web_client(&h);
        web.list_sessions(pb::ListSessionsRequest::default())
            .await
            .expect("gRPC-Web is on with the console");
    })
    .await;
}

#[tokio::test]
async fn with_no_browser_option_a_browser_gets_a_plain_text_hint_and_grpc_web_is_refused() {
    bounded(async {
        let h = Harness::start().await;
        // A browser opened on the gRPC port reads what the port is and how to get the console.
        let (status, headers, body) = http1(&h, get(&h, "/")).await.expect("answered");
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(
            headers.get(header::CONTENT_TYPE).map(|v| v.as_bytes()),
            Some(&b"text/plain; charset=utf-8"[..])
        );
        let hint = String::from_utf8_lossy(&body);
        assert!(
            hint.contains("gRPC") && hint.contains("--console") && hint.contains("docs/cli.md"),
            "{hint}"
        );
        let (status, _, _) = http1(&h, get(&h, "/favicon.ico")).await.expect("answered");
        assert_eq!(status, StatusCode::NOT_FOUND);
        let web = grpc_web_client(&h)
            .list_sessions(pb::ListSessionsRequest::default())
            .await;
        assert!(web.is_err(), "{web:?}");

        // gRPC-Web over HTTP/2 does not slip through either.
        let tcp = tokio::net::TcpStream::connect(h.addr())
            .await
            .expect("connects");
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                .await
                .expect("h2");
        tokio::spawn(connection);
        let response = sender
            .send_request(
                Request::post(format!("http://{}/grpc.health.v1.Health/Check", h.addr()))
                    .header(header::CONTENT_TYPE, "application/grpc-web+proto")
                    .body(Empty::<Bytes>::new())
                    .expect("a request"),
            )
            .await
            .expect("answered");
        assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);

        // …and native gRPC is untouched.
        h.sessions()
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .expect("native gRPC");
    })
    .await;
}

#[tokio::test]
async fn with_grpc_web_but_no_console_nothing_is_served_at_the_root() {
    bounded(async {
        let h = Harness::start_with(|c| c.browser.grpc_web = true).await;
        let (status, headers, _) = http1(&h, get(&h, "/")).await.expect("answered");
        assert_ne!(status, StatusCode::OK);
        assert_ne!(
            headers.get(header::CONTENT_TYPE).map(|v| v.as_bytes()),
            Some(&b"text/html; charset=utf-8"[..])
        );
    })
    .await;
}

#[tokio::test]
async fn the_console_has_a_favicon() {
    bounded(async {
        let h = Harness::start_with(|c| c.browser.console = true).await;
        for path in ["/favicon.ico", "/favicon.svg"] {
            let (status, headers, body) = http1(&h, get(&h, path)).await.expect("answered");
            assert_eq!(status, StatusCode::OK, "{path}");
            assert_eq!(
                headers.get(header::CONTENT_TYPE).map(|v| v.as_bytes()),
                Some(&b"image/svg+xml"[..]),
                "{path}"
            );
            assert!(body.starts_with(b"<svg"), "{path}");
        }
        let (_, _, page) = http1(&h, get(&h, "/")).await.expect("answered");
        assert!(
            String::from_utf8_lossy(&page).contains(r#"rel="icon" href="/favicon.svg""#),
            "the page names its icon"
        );
        // Any other path is a plain not-found, never the page.
        let (status, _, _) = http1(&h, get(&h, "/nothing-here")).await.expect("answered");
        assert_eq!(status, StatusCode::NOT_FOUND);
    })
    .await;
}

#[tokio::test]
async fn the_server_logs_the_console_url_when_it_starts() {
    bounded(async {
        let data = tempfile::tempdir().expect("a temp dir");
        let mut server = Serve::new()
            .arg("--console")
            .arg("--data-dir")
            .arg(data.path())
            .start();
        let logged = server
            .next_logged("the web console is at this URL")
            .await
            .expect("logged before anything else happens");
        assert_eq!(
            logged["url"].as_str(),
            Some(format!("http://{}/", server.addr()).as_str()),
            "{logged}"
        );
    })
    .await;
}

#[tokio::test]
async fn the_console_suggests_the_servers_directory_only_to_loopback_pages() {
    bounded(async {
        let json =
            |body: &Bytes| -> serde_json::Value { serde_json::from_slice(body).expect("JSON") };
        let h = Harness::start_with(|c| c.browser.console = true).await;
        let (status, _, body) = http1(&h, get(&h, "/defaults.json"))
            .await
            .expect("answered");
        assert_eq!(status, StatusCode::OK);
        let here = std::env::current_dir().unwrap();
        assert_eq!(json(&body)["cwd"], here.to_string_lossy().as_ref());

        // With tokens, whoever reaches the port is nobody yet: no directory is given away.
        let tokens = TokensFile::new(crate::auth::EVERYONE);
        let h = Harness::start_with(|c| {
            c.browser.console = true;
            with_tokens(c, &tokens.path, None);
        })
        .await;
        let (status, _, body) = http1(&h, get(&h, "/defaults.json"))
            .await
            .expect("answered");
        assert_eq!(status, StatusCode::OK);
        assert!(json(&body)["cwd"].is_null(), "{}", json(&body));
    })
    .await;
}
