//! No DNS rebinding (docs/security.md): with no tokens configured, a page whose name the
//! attacker points at 127.0.0.1 (it sends that name as `Host`) or a page elsewhere (it sends its
//! own `Origin`) gets 403 from the console and gRPC-Web and creates nothing; pages on this
//! machine work as before; native gRPC clients are not browsers and pass whatever name they dialled;
//! with tokens nothing changes.

use agent_harness::pb::v1::{self as pb, agent_session_service_client::AgentSessionServiceClient};
use http::{Method, Request, StatusCode, header};
use http_body_util::{Empty, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tonic::{codegen::Bytes, transport::Endpoint};

use crate::{
    auth::{ADA, EVERYONE, TokensFile, with_tokens},
    browser::http1,
    harness::{Harness, bounded},
    support::create_request,
};

const REBOUND: &str = "rebind.attacker.example";

/// A gRPC-Web CreateSession as a page sends it: origin-form request line, `Host`, maybe `Origin`.
fn create_over_grpc_web(
    h: &Harness,
    host: &str,
    origin: Option<&str>,
    token: Option<&str>,
) -> Request<Full<Bytes>> {
    let message = create_request(h, "mock").encode_to_vec();
    let mut body = vec![0u8];
    body.extend((message.len() as u32).to_be_bytes());
    body.extend(message);
    let mut request = Request::post("/agent_harness.v1.AgentSessionService/CreateSession")
        .header(header::HOST, host)
        .header(header::CONTENT_TYPE, "application/grpc-web+proto")
        .header("x-grpc-web", "1");
    if let Some(origin) = origin {
        request = request.header(header::ORIGIN, origin);
    }
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    request
        .body(Full::new(Bytes::from(body)))
        .expect("a request")
}

fn get_root(host: &str) -> Request<Full<Bytes>> {
    Request::get("/")
        .header(header::HOST, host)
        .body(Full::default())
        .expect("a request")
}

async fn session_count(h: &Harness, token: Option<&str>) -> usize {
    let mut request = tonic::Request::new(pb::ListSessionsRequest::default());
    if let Some(token) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("ascii"),
        );
    }
    h.sessions()
        .list_sessions(request)
        .await
        .expect("native ListSessions")
        .into_inner()
        .sessions
        .len()
}

/// A gRPC-Web answer that carried a session: HTTP 200 and `grpc-status:0` in its trailers frame.
fn assert_created(status: StatusCode, body: &Bytes) {
    assert_eq!(status, StatusCode::OK, "{body:?}");
    assert!(
        String::from_utf8_lossy(body).contains("grpc-status:0"),
        "{body:?}"
    );
}

#[tokio::test]
async fn with_no_tokens_a_page_on_a_rebound_name_gets_403_and_creates_nothing() {
    bounded(async {
        let h = Harness::start_with(|c| c.browser.console = true).await;
        let rebound = format!("{REBOUND}:{}", h.addr().port());
        let origin = format!("http://{rebound}");

        let (status, _, body) = http1(&h, get_root(&rebound)).await.expect("answered");
        assert_eq!(status, StatusCode::FORBIDDEN, "the console page: {body:?}");
        assert!(
            !String::from_utf8_lossy(&body).contains("<html"),
            "{body:?}"
        );

        for origin in [Some(origin.as_str()), None] {
            let (status, _, body) = http1(&h, create_over_grpc_web(&h, &rebound, origin, None))
                .await
                .expect("answered");
            assert_eq!(status, StatusCode::FORBIDDEN, "{origin:?}: {body:?}");
            assert!(
                String::from_utf8_lossy(&body).contains("loopback"),
                "says why: {body:?}"
            );
        }
        assert_eq!(session_count(&h, None).await, 0, "nothing was created");
    })
    .await;
}

#[tokio::test]
async fn with_no_tokens_a_foreign_origin_gets_403_even_on_a_loopback_host() {
    bounded(async {
        let h = Harness::start_with(|c| c.browser.grpc_web = true).await;
        let host = h.addr().to_string();
        for origin in [
            "http://rebind.attacker.example",
            "https://evil.example:8443",
            "null",
        ] {
            let (status, _, body) = http1(&h, create_over_grpc_web(&h, &host, Some(origin), None))
                .await
                .expect("answered");
            assert_eq!(status, StatusCode::FORBIDDEN, "{origin}: {body:?}");
        }
        // Its preflight too, so a browser never sends the call.
        let preflight = Request::builder()
            .method(Method::OPTIONS)
            .uri("/agent_harness.v1.AgentSessionService/CreateSession")
            .header(header::HOST, &host)
            .header(header::ORIGIN, "http://rebind.attacker.example")
            .header(header::ACCESS_CONTROL_REQUEST_METHOD, "POST")
            .body(Full::default())
            .expect("a request");
        let (status, _, _) = http1(&h, preflight).await.expect("answered");
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert_eq!(session_count(&h, None).await, 0, "nothing was created");
    })
    .await;
}

#[tokio::test]
async fn with_no_tokens_a_loopback_page_is_served_as_before() {
    bounded(async {
        let h = Harness::start_with(|c| c.browser.console = true).await;
        let port = h.addr().port();
        for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
            let (status, _, body) = http1(&h, get_root(&host)).await.expect("answered");
            assert_eq!(status, StatusCode::OK, "{host}");
            assert!(String::from_utf8_lossy(&body).contains("/app.js"));

            // The console's own calls: same origin, with or without the Origin header.
            let origin = format!("http://{host}");
            for origin in [Some(origin.as_str()), None] {
                let (status, _, body) = http1(&h, create_over_grpc_web(&h, &host, origin, None))
                    .await
                    .expect("answered");
                assert_created(status, &body);
            }
        }
        assert_eq!(session_count(&h, None).await, 4);
    })
    .await;
}

#[tokio::test]
async fn with_no_tokens_an_allowed_origin_is_served_on_a_loopback_host() {
    bounded(async {
        let allowed = "https://ui.allowed.example:8443";
        let h =
            Harness::start_with(|c| c.browser.cors_allow_origins = vec![allowed.to_owned()]).await;
        let host = h.addr().to_string();
        let (status, headers, body) =
            http1(&h, create_over_grpc_web(&h, &host, Some(allowed), None))
                .await
                .expect("answered");
        assert_created(status, &body);
        assert_eq!(
            headers
                .get(header::ACCESS_CONTROL_ALLOW_ORIGIN)
                .map(|v| v.as_bytes()),
            Some(allowed.as_bytes())
        );
        // An allowed page is still served only through a loopback name.
        let rebound = format!("{REBOUND}:{}", h.addr().port());
        let (status, _, _) = http1(&h, create_over_grpc_web(&h, &rebound, Some(allowed), None))
            .await
            .expect("answered");
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert_eq!(session_count(&h, None).await, 1);
    })
    .await;
}

#[tokio::test]
async fn native_grpc_clients_are_served_whatever_name_they_dialled() {
    bounded(async {
        // As a client on another host of a server with --insecure-allow-non-loopback would be:
        // its :authority is the server's non-loopback name. Browsers cannot speak native gRPC.
        let h = Harness::start_with(|c| c.browser.console = true).await;
        let channel = Endpoint::from_shared(format!("http://{}", h.addr()))
            .expect("an endpoint")
            .origin(
                format!("http://harness.internal.example:{}", h.addr().port())
                    .parse()
                    .expect("a URI"),
            )
            .connect()
            .await
            .expect("connects");
        AgentSessionServiceClient::new(channel)
            .create_session(create_request(&h, "mock"))
            .await
            .expect("native CreateSession with a non-loopback authority");

        // gRPC-Web over HTTP/2 to that name is a browser's, and refused.
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
                Request::post(format!(
                    "http://{REBOUND}:{}/agent_harness.v1.AgentSessionService/ListSessions",
                    h.addr().port()
                ))
                .header(header::CONTENT_TYPE, "application/grpc-web+proto")
                .body(Empty::<Bytes>::new())
                .expect("a request"),
            )
            .await
            .expect("answered");
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        assert_eq!(session_count(&h, None).await, 1);
    })
    .await;
}

#[tokio::test]
async fn with_tokens_a_rebound_name_is_answered_as_before() {
    bounded(async {
        let tokens = TokensFile::new(EVERYONE);
        let h = Harness::start_with(|c| {
            with_tokens(c, &tokens.path, None);
            c.browser.console = true;
        })
        .await;
        let rebound = format!("{REBOUND}:{}", h.addr().port());
        let (status, _, _) = http1(&h, get_root(&rebound)).await.expect("answered");
        assert_eq!(status, StatusCode::OK, "the console page is public");

        // Without a token the call is refused by authentication, not by its name…
        let (status, headers, body) = http1(
            &h,
            create_over_grpc_web(&h, &rebound, Some(&format!("http://{rebound}")), None),
        )
        .await
        .expect("answered");
        assert_eq!(status, StatusCode::OK, "{body:?}");
        let grpc_status = headers
            .get("grpc-status")
            .map(|v| v.as_bytes().to_vec())
            .unwrap_or_else(|| body.to_vec());
        assert!(
            String::from_utf8_lossy(&grpc_status)
                .contains(&(tonic::Code::Unauthenticated as i32).to_string()),
            "{headers:?} {body:?}"
        );
        // …and with one it is served.
        let (status, _, body) = http1(
            &h,
            create_over_grpc_web(&h, &rebound, Some(&format!("http://{rebound}")), Some(ADA)),
        )
        .await
        .expect("answered");
        assert_created(status, &body);
        assert_eq!(session_count(&h, Some(ADA)).await, 1);
    })
    .await;
}
