//! Smoke: the real binary, started as an operator would (embedded defaults plus flags), serves
//! what it says it serves and stops with exit code 0 on SIGTERM; and clients that know nothing
//! but its address (`buf curl` and Python's grpcio, both through server reflection) drive it.
//!
//! The binary is `$AGENT_HARNESS_SMOKE_BIN` when set (`scripts/test smoke` points it at the
//! release build), else this build's. The tests that need `buf` or the Python reflection client
//! are ignored: `scripts/test smoke` installs both into `.tools/` and runs them with
//! `AGENT_HARNESS_BUF` and `AGENT_HARNESS_SMOKE_PYTHON` set.

use std::{collections::BTreeSet, process::Output, time::Duration};

use agent_harness::pb::v1::{
    ChannelAttachment, ChannelMessage, PromptAttachment, SkipReason,
    TranslateChannelMessageRequest,
    channel_translator_service_client::ChannelTranslatorServiceClient,
};
use serde_json::{Value, json};
use tonic::Code;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use crate::{
    harness::{
        GATEWAY_SERVICE, HEALTH_SERVICE, SESSIONS_SERVICE, TRANSLATOR_SERVICE, expect_err, within,
    },
    process::{Serve, ServeProcess},
    reflection::{ALL_SERVICES, list_services_v1, list_services_v1alpha},
};

/// Each smoke test's bound; the Python client reads a 6 MB transcript.
const SMOKE_TIMEOUT: Duration = Duration::from_secs(120);

/// A server on the embedded defaults, with a base URL whose trailing slashes the binary trims.
fn full(dir: &tempfile::TempDir) -> ServeProcess {
    serve(
        dir,
        &["--static-files-base-url", "https://static.example///"],
    )
}

/// A process serving only the translator.
fn translator_only(dir: &tempfile::TempDir) -> ServeProcess {
    serve(
        dir,
        &[
            "--services",
            "translator",
            "--static-files-base-url",
            "https://static.example",
        ],
    )
}

fn serve(dir: &tempfile::TempDir, flags: &[&str]) -> ServeProcess {
    let serve = Serve::new()
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(flags);
    match std::env::var_os("AGENT_HARNESS_SMOKE_BIN") {
        Some(program) => serve.program(program),
        None => serve,
    }
    .start()
}

/// SIGTERM, and the exit code must be 0.
async fn stops_with_0(mut server: ServeProcess) {
    server.signal(libc::SIGTERM);
    let status = server.wait().await;
    assert!(status.success(), "exit after SIGTERM: {status:?}");
}

/// Two images and a document: two image links and one unsupported skip.
fn translate_request() -> TranslateChannelMessageRequest {
    let attachment = |entity_type: &str, entity_id: &str| ChannelAttachment {
        entity_type: entity_type.into(),
        entity_id: entity_id.into(),
    };
    TranslateChannelMessageRequest {
        message: Some(ChannelMessage {
            message_id: "m-1".into(),
            channel_id: "c-1".into(),
            content: "what is wrong here?".into(),
            attachments: vec![
                attachment("static/image", "img-1"),
                attachment("document", "doc-1"),
                attachment("static/image", "img-2"),
            ],
            ..Default::default()
        }),
    }
}

async fn translates(server: &ServeProcess) {
    let reply = ChannelTranslatorServiceClient::new(server.channel().await)
        .translate_channel_message(translate_request())
        .await
        .expect("the translation")
        .into_inner();
    let prompt = reply.prompt.expect("a prompt");
    assert_eq!(prompt.prompt, "what is wrong here?");
    let image = |id: &str| PromptAttachment {
        uri: format!("https://static.example/file/{id}"),
        name: "image".into(),
        mime_type: Some("image/*".into()),
        size: None,
    };
    assert_eq!(prompt.attachments, vec![image("img-1"), image("img-2")]);
    let skipped: Vec<_> = reply
        .skipped
        .iter()
        .map(|s| (s.index, s.entity_type.as_str(), s.reason()))
        .collect();
    assert_eq!(skipped, [(1, "document", SkipReason::UnsupportedType)]);
}

async fn health(server: &ServeProcess, service: &str) -> Result<ServingStatus, tonic::Status> {
    let request = HealthCheckRequest {
        service: service.into(),
    };
    let reply = HealthClient::new(server.channel().await)
        .check(request)
        .await?;
    Ok(reply.into_inner().status())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_on_its_defaults_serves_and_lists_every_service_translates_and_exits_0_on_sigterm()
 {
    within(SMOKE_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let server = full(&dir);
        for listed in [
            list_services_v1(server.channel().await).await,
            list_services_v1alpha(server.channel().await).await,
        ] {
            for service in ALL_SERVICES {
                assert!(listed.contains(service), "{service} not in {listed:?}");
            }
        }
        for service in ["", SESSIONS_SERVICE, TRANSLATOR_SERVICE, GATEWAY_SERVICE] {
            assert_eq!(
                health(&server, service).await.expect("known to health"),
                ServingStatus::Serving,
                "{service:?}"
            );
        }
        translates(&server).await;
        stops_with_0(server).await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_translator_only_binary_translates_and_neither_lists_nor_knows_the_session_service() {
    within(SMOKE_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let server = translator_only(&dir);
        let listed = list_services_v1(server.channel().await).await;
        assert!(listed.contains(TRANSLATOR_SERVICE), "{listed:?}");
        assert!(listed.contains(HEALTH_SERVICE), "{listed:?}");
        assert!(!listed.contains(SESSIONS_SERVICE), "{listed:?}");
        assert!(!listed.contains(GATEWAY_SERVICE), "{listed:?}");
        assert_eq!(
            health(&server, TRANSLATOR_SERVICE).await.expect("known"),
            ServingStatus::Serving
        );
        let unknown = expect_err(health(&server, SESSIONS_SERVICE).await);
        assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
        translates(&server).await;
        stops_with_0(server).await;
    })
    .await
}

// ---- clients that know only reflection ---------------------------------------------------------

fn required(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run these through `scripts/test smoke`, which installs the tools")
    })
}

/// Runs a client to completion, its output kept (and killed if the test gives up on it).
async fn run(command: &mut tokio::process::Command) -> Output {
    command
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .expect("the client runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `buf curl` over plain HTTP/2 to `server`, with `args` after the common flags.
fn buf_curl(server: &ServeProcess, args: &[&str], path: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(required("AGENT_HARNESS_BUF"));
    command
        .args(["curl", "--protocol", "grpc", "--http2-prior-knowledge"])
        .args(["--timeout", "10s"])
        .args(args)
        .arg(format!("http://{}{path}", server.addr()));
    command
}

/// The services `buf curl --list-services` finds over reflection `protocol`.
async fn buf_listed(server: &ServeProcess, protocol: &str) -> BTreeSet<String> {
    let output = run(&mut buf_curl(
        server,
        &["--reflect-protocol", protocol, "--list-services"],
        "",
    ))
    .await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    text(&output.stdout).lines().map(str::to_owned).collect()
}

/// One unary call with a JSON body; the JSON answer, or the error `buf curl` printed.
async fn buf_call(server: &ServeProcess, method: &str, body: Value) -> Result<Value, String> {
    let output = run(&mut buf_curl(
        server,
        &["-d", &body.to_string()],
        &format!("/{method}"),
    ))
    .await;
    if output.status.success() {
        Ok(serde_json::from_slice(&output.stdout).expect("a JSON answer"))
    } else {
        Err(text(&output.stdout) + &text(&output.stderr))
    }
}

/// The translation of [`translate_request`], as JSON both ways.
async fn buf_translates(server: &ServeProcess) {
    let answer = buf_call(
        server,
        "agent_harness.v1.ChannelTranslatorService/TranslateChannelMessage",
        json!({"message": {
            "messageId": "m-1",
            "channelId": "c-1",
            "content": "what is wrong here?",
            "attachments": [
                {"entityType": "static/image", "entityId": "img-1"},
                {"entityType": "document", "entityId": "doc-1"},
                {"entityType": "static/image", "entityId": "img-2"},
            ],
        }}),
    )
    .await
    .expect("TranslateChannelMessage");
    let image = |id: &str| json!({"uri": format!("https://static.example/file/{id}"), "name": "image", "mimeType": "image/*"});
    assert_eq!(
        answer,
        json!({
            "prompt": {
                "prompt": "what is wrong here?",
                "attachments": [image("img-1"), image("img-2")],
            },
            "skipped": [
                {"index": 1, "entityType": "document", "reason": "SKIP_REASON_UNSUPPORTED_TYPE"},
            ],
        })
    );
}

async fn buf_health(server: &ServeProcess, service: &str) -> Result<Value, String> {
    buf_call(
        server,
        "grpc.health.v1.Health/Check",
        json!({ "service": service }),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs buf: run through `scripts/test smoke`"]
async fn buf_curl_through_reflection_alone_lists_every_service_checks_health_and_translates() {
    within(SMOKE_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let server = full(&dir);
        for protocol in ["grpc-v1", "grpc-v1alpha"] {
            let listed = buf_listed(&server, protocol).await;
            for service in ALL_SERVICES {
                assert!(listed.contains(service), "{protocol}: {listed:?}");
            }
        }
        for service in ["", SESSIONS_SERVICE, TRANSLATOR_SERVICE, GATEWAY_SERVICE] {
            let answer = buf_health(&server, service).await.expect("Health/Check");
            assert_eq!(answer["status"], "SERVING", "{service:?}: {answer}");
        }
        buf_translates(&server).await;
        stops_with_0(server).await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs buf: run through `scripts/test smoke`"]
async fn buf_curl_on_a_translator_only_binary_finds_only_the_translator_and_health() {
    within(SMOKE_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let server = translator_only(&dir);
        let listed = buf_listed(&server, "grpc-v1").await;
        assert!(listed.contains(TRANSLATOR_SERVICE), "{listed:?}");
        assert!(listed.contains(HEALTH_SERVICE), "{listed:?}");
        assert!(!listed.contains(SESSIONS_SERVICE), "{listed:?}");
        assert!(!listed.contains(GATEWAY_SERVICE), "{listed:?}");
        let answer = buf_health(&server, TRANSLATOR_SERVICE)
            .await
            .expect("known");
        assert_eq!(answer["status"], "SERVING", "{answer}");
        let refusal = buf_health(&server, SESSIONS_SERVICE)
            .await
            .expect_err("the session service is unknown to health");
        assert!(refusal.contains("\"not_found\""), "{refusal}");
        buf_translates(&server).await;
        stops_with_0(server).await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Python gRPC packages: run through `scripts/test smoke`"]
async fn the_python_reflection_client_passes_its_checks_against_the_binary() {
    within(SMOKE_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let server = full(&dir);
        let client = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/reflection_client.py"
        );
        let output = run(
            tokio::process::Command::new(required("AGENT_HARNESS_SMOKE_PYTHON"))
                .arg(client)
                .arg(server.addr().to_string()),
        )
        .await;
        // Shown by `--no-capture`, and with the failure.
        println!("{}", text(&output.stdout));
        assert!(
            output.status.success(),
            "the Python reflection client failed ({}):\n{}{}",
            output.status,
            text(&output.stdout),
            text(&output.stderr)
        );
        stops_with_0(server).await;
    })
    .await
}
