//! Remote runtimes with real processes: the harness in this process, one or two
//! `agent-harness bridge` processes dialling it on loopback (some through the test kit's fault
//! proxy, which can cut the connection), and agents the bridges start. Also a hostile bridge
//! speaking the wire protocol directly.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    process::Stdio,
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use agent_harness::{
    config::{RemoteTarget, ServeConfig},
    pb::v1::{
        self as pb, BridgeHello, ConnectRequest, ConnectResponse, LineAck, RuntimeSpawned,
        RuntimeStdout, connect_request::Frame as Up, connect_response::Frame as Down,
        runtime_gateway_service_client::RuntimeGatewayServiceClient,
    },
};
use agent_harness_testkit::service_bin;
use serde_json::Value;
use tempfile::TempDir;
use tokio::{
    process::{Child, Command},
    sync::mpsc,
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, transport::Channel};

use crate::{
    auth::{Bearer, TokensFile, with_tokens},
    harness::{Harness, assert_error, error_reason, expect_err, within},
    proxy::FaultProxy,
    support::{Session, create_request, mock_profile_with, number_id, permission_answer},
};

pub(crate) const BRIDGE_TIMEOUT: Duration = Duration::from_secs(60);

/// A harness profile of `kind = "remote"` selecting bridges by `labels`.
pub(crate) fn remote_profile(
    config: &mut ServeConfig,
    name: &str,
    labels: &[(&str, &str)],
    bridge_profile: &str,
    startup_timeout: Duration,
    reconnect_grace: Duration,
) {
    remote_profile_of(
        config,
        name,
        labels,
        None,
        bridge_profile,
        startup_timeout,
        reconnect_grace,
    );
}

/// [`remote_profile`] run only by bridges of the given principals (`bridge_principals`).
pub(crate) fn remote_profile_of(
    config: &mut ServeConfig,
    name: &str,
    labels: &[(&str, &str)],
    principals: Option<&[&str]>,
    bridge_profile: &str,
    startup_timeout: Duration,
    reconnect_grace: Duration,
) {
    let root = agent_harness_testkit::harness::workspace_for(config);
    let fenced = config.tokens_file.is_some();
    mock_profile_with(config, name, &[], |profile| {
        profile.startup_timeout = startup_timeout;
        // The bridge boxes what it runs, by its own profile.
        profile.sandbox = None;
        if fenced {
            profile.allowed_cwd_roots = Some(vec![root]);
        }
        profile.remote = Some(RemoteTarget {
            bridge_labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            bridge_profile: bridge_profile.to_owned(),
            reconnect_grace,
            bridge_principals: principals.map(|p| p.iter().map(|s| s.to_string()).collect()),
        });
    });
}

/// A running `agent-harness bridge`, killed when dropped.
pub(crate) struct Bridge {
    child: Child,
    _dir: TempDir,
}

/// A bridge profile table running the mock agent (with resume, so sessions can reopen).
pub(crate) fn mock_bridge_profile(name: &str) -> String {
    format!(
        "[profiles.{name}]\ncommand = {:?}\nargs = [\"mock-agent\", \"--resume\"]\n",
        service_bin().to_string_lossy()
    )
}

impl Bridge {
    pub(crate) fn start(
        url: &str,
        id: &str,
        labels: &[(&str, &str)],
        profiles: &str,
        token: Option<&str>,
    ) -> Self {
        Self::start_with_args(url, id, labels, profiles, token, &[])
    }

    /// [`Bridge::start`] with extra flags.
    fn start_with_args(
        url: &str,
        id: &str,
        labels: &[(&str, &str)],
        profiles: &str,
        token: Option<&str>,
        args: &[&std::ffi::OsStr],
    ) -> Self {
        let dir = tempfile::tempdir().expect("a temporary dir");
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k} = {v:?}")).collect();
        let config = format!(
            "bridge_id = {id:?}\nreconnect_grace = \"30s\"\ndata_dir = {:?}\n[labels]\n{}\n{profiles}",
            dir.path().join("data").to_string_lossy(),
            labels.join("\n"),
        );
        let config_path = dir.path().join("bridge.toml");
        std::fs::write(&config_path, config).expect("the bridge config is written");
        let mut command = Command::new(service_bin());
        command
            .arg("bridge")
            .arg("--connect")
            .arg(url)
            .arg("--config")
            .arg(&config_path)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        if let Some(token) = token {
            let token_path = dir.path().join("token");
            std::fs::write(&token_path, token).expect("the token file is written");
            command.arg("--token-file").arg(token_path);
        }
        let child = command.spawn().expect("the bridge starts");
        Self { child, _dir: dir }
    }

    /// The file the bridge reads its token from (when started with one).
    pub(crate) fn token_file(&self) -> std::path::PathBuf {
        self._dir.path().join("token")
    }

    pub(crate) async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }
}

pub(crate) fn url(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

fn frames(log: &[pb::LogEntry]) -> Vec<Value> {
    log.iter()
        .map(|e| serde_json::from_str(&e.json).expect("logged JSON"))
        .collect()
}

fn events<'a>(frames: &'a [Value], name: &str) -> Vec<&'a Value> {
    frames.iter().filter(|f| f["event"] == name).collect()
}

/// The texts of the agent's message chunks, in log order.
fn chunk_texts(frames: &[Value]) -> Vec<String> {
    frames
        .iter()
        .filter(|f| f["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|f| f["params"]["update"]["content"]["text"].as_str())
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn a_session_on_a_remote_profile_runs_a_turn_with_the_mock_agent_through_a_bridge() {
    within(BRIDGE_TIMEOUT, async {
        let h = Harness::start_with(|config| {
            remote_profile(
                config,
                "far",
                &[("pool", "sandbox")],
                "mock",
                Duration::from_secs(20),
                Duration::from_secs(30),
            )
        })
        .await;
        let _bridge = Bridge::start(
            &url(h.addr()),
            "b1",
            &[("pool", "sandbox")],
            &mock_bridge_profile("mock"),
            None,
        );
        let mut session = Session::create(&h, "far").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("hello over there\n@chunks 3 20").await;
        assert_eq!(
            watch.response_to(&turn.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        let log = frames(&session.log().await);
        let started = events(&log, "runtime_started");
        assert_eq!(started.len(), 1);
        assert_eq!(started[0]["bridge"], "b1", "{}", started[0]);
        assert!(
            started[0].get("pid").is_none(),
            "no local process: {}",
            started[0]
        );
        assert_eq!(
            chunk_texts(&log)
                .iter()
                .filter(|t| t.starts_with('#'))
                .count(),
            3
        );
    })
    .await
}

#[tokio::test]
async fn with_no_matching_bridge_creation_fails_runtime_start_failed_naming_the_labels() {
    within(BRIDGE_TIMEOUT, async {
        let h = Harness::start_with(|config| {
            remote_profile(
                config,
                "gpu",
                &[("pool", "gpu")],
                "mock",
                Duration::from_millis(1500),
                Duration::from_secs(30),
            )
        })
        .await;
        let _bridge = Bridge::start(
            &url(h.addr()),
            "cpu-1",
            &[("pool", "cpu")],
            &mock_bridge_profile("mock"),
            None,
        );
        let status = expect_err(h.sessions().create_session(create_request(&h, "gpu")).await);
        assert_error(&status, Code::Unavailable, "RUNTIME_START_FAILED");
        assert!(
            status.message().contains("pool=gpu"),
            "{}",
            status.message()
        );
        assert!(
            status.message().contains("no connected bridge"),
            "{}",
            status.message()
        );
    })
    .await
}

#[tokio::test]
async fn a_bridge_asked_for_a_profile_it_does_not_have_fails_the_start_with_its_reason() {
    within(BRIDGE_TIMEOUT, async {
        let h = Harness::start_with(|config| {
            remote_profile(
                config,
                "claude",
                &[],
                "claude",
                Duration::from_secs(20),
                Duration::from_secs(30),
            )
        })
        .await;
        let _bridge = Bridge::start(
            &url(h.addr()),
            "b1",
            &[],
            &mock_bridge_profile("mock"),
            None,
        );
        let status = expect_err(
            h.sessions()
                .create_session(create_request(&h, "claude"))
                .await,
        );
        assert_eq!(error_reason(&status), "RUNTIME_START_FAILED");
        assert!(
            status.message().contains("has no profile \"claude\""),
            "{}",
            status.message()
        );
    })
    .await
}

const BRIDGE_TOKEN: &str = "bridge-secret-token";
const ADA_TOKEN: &str = "ada-secret-token";

#[tokio::test]
async fn a_runtime_token_runs_a_bridge_but_calls_no_session_rpc_and_a_user_token_cannot_connect() {
    within(BRIDGE_TIMEOUT, async {
        let file = TokensFile::new(&[
            (ADA_TOKEN, "ada", "user"),
            (BRIDGE_TOKEN, "sandbox-7", "runtime"),
        ]);
        let h = Harness::start_with(|config| {
            with_tokens(config, &file.path, None);
            remote_profile(
                config,
                "far",
                &[],
                "mock",
                Duration::from_secs(20),
                Duration::from_secs(30),
            );
        })
        .await;
        // A runtime token calling a session RPC.
        let mut as_bridge =
            pb::agent_session_service_client::AgentSessionServiceClient::with_interceptor(
                h.channel(),
                Bearer::new(Some(BRIDGE_TOKEN), None),
            );
        let status = expect_err(
            as_bridge
                .list_sessions(pb::ListSessionsRequest::default())
                .await,
        );
        assert_error(&status, Code::PermissionDenied, "FORBIDDEN");
        // A user token calling Connect.
        let mut as_ada = RuntimeGatewayServiceClient::with_interceptor(
            h.channel(),
            Bearer::new(Some(ADA_TOKEN), None),
        );
        let hello = ConnectRequest {
            frame: Some(Up::Hello(BridgeHello {
                bridge_id: "ada-bridge".into(),
                ..Default::default()
            })),
        };
        let status = expect_err(as_ada.connect(futures::stream::iter([hello])).await);
        assert_error(&status, Code::PermissionDenied, "FORBIDDEN");
        // The bridge with its runtime token serves ada's session.
        let _bridge = Bridge::start(
            &url(h.addr()),
            "b1",
            &[],
            &mock_bridge_profile("mock"),
            Some(BRIDGE_TOKEN),
        );
        let client = pb::agent_session_service_client::AgentSessionServiceClient::with_interceptor(
            h.channel(),
            Bearer::new(Some(ADA_TOKEN), None),
        );
        let mut request = create_request(&h, "far");
        request.cwd = h.workspace().to_string_lossy().into_owned();
        let created = client
            .clone()
            .create_session(request)
            .await
            .expect("created through the bridge");
        let id = created.into_inner().session.unwrap().id;
        let mut client = client;
        let log = client
            .read_log(pb::ReadLogRequest {
                session_id: id,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(
            log.entries
                .iter()
                .any(|e| e.json.contains("\"bridge\":\"b1\""))
        );
    })
    .await
}

#[tokio::test]
async fn a_connection_cut_mid_turn_is_redialled_and_the_turn_completes_with_every_frame_logged_once_in_order()
 {
    within(BRIDGE_TIMEOUT, async {
        let h = Harness::start_with(|config| {
            remote_profile(
                config,
                "far",
                &[],
                "mock",
                Duration::from_secs(20),
                Duration::from_secs(30),
            )
        })
        .await;
        let proxy = FaultProxy::start(h.addr()).await;
        let _bridge = Bridge::start(
            &url(proxy.addr()),
            "b1",
            &[],
            &mock_bridge_profile("mock"),
            None,
        );
        let mut session = Session::create(&h, "far").await;
        let mut watch = session.watch().await;
        let turn = session
            .prompt("before and after\n@chunks 20 30\n@permission\n@chunks 2000 31")
            .await;
        let request = watch.agent_request("session/request_permission").await;
        proxy.close_connections();
        // The answer goes out while the stream is down; it is held and resent after the redial.
        let id = request["id"]
            .as_i64()
            .expect("the mock numbers its requests");
        session
            .act(permission_answer(number_id(id), Some("allow-once")))
            .await
            .unwrap();
        // Cut again while the agent streams its second batch (31-byte chunks): lines in flight
        // both ways are resent, and duplicates dropped.
        watch
            .entry(|_, f| {
                f["params"]["update"]["content"]["text"]
                    .as_str()
                    .is_some_and(|t| t.len() == 31 && t.starts_with("#10:"))
            })
            .await;
        proxy.close_connections();
        assert_eq!(
            watch.response_to(&turn.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        assert!(proxy.accepted() >= 3, "the bridge redialled twice");

        let log = session.log().await;
        let offsets: Vec<u64> = log.iter().map(|e| e.offset).collect();
        let expected: Vec<u64> = (offsets[0]..offsets[0] + offsets.len() as u64).collect();
        assert_eq!(offsets, expected, "no gap in the log");
        let frames = frames(&log);
        assert_eq!(
            events(&frames, "runtime_started").len(),
            1,
            "same epoch: never restarted"
        );
        assert!(events(&frames, "fault").is_empty(), "no fault");
        let chunks: Vec<String> = chunk_texts(&frames)
            .into_iter()
            .filter(|t| t.starts_with('#'))
            .collect();
        let numbers: Vec<usize> = chunks
            .iter()
            .map(|t| t[1..t.find(':').unwrap()].parse().unwrap())
            .collect();
        let want: Vec<usize> = (0..20).chain(0..2000).collect();
        assert_eq!(numbers, want, "every chunk exactly once, in order");
        let answers = frames
            .iter()
            .filter(|f| f["id"] == request["id"] && f.get("result").is_some())
            .count();
        assert_eq!(answers, 1, "the permission answer was logged once");
    })
    .await
}

#[tokio::test]
async fn a_killed_bridge_leaves_the_session_disconnected_and_it_reopens_through_resume_on_a_second_bridge()
 {
    within(BRIDGE_TIMEOUT, async {
        let h = Harness::start_with(|config| {
            remote_profile(
                config,
                "far",
                &[("pool", "a")],
                "mock",
                Duration::from_secs(20),
                Duration::from_secs(1),
            )
        })
        .await;
        let mut first = Bridge::start(
            &url(h.addr()),
            "b1",
            &[("pool", "a")],
            &mock_bridge_profile("mock"),
            None,
        );
        let mut session = Session::create(&h, "far").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("one").await;
        watch.response_to(&turn.action_id).await;
        let _second = Bridge::start(
            &url(h.addr()),
            "b2",
            &[("pool", "a")],
            &mock_bridge_profile("mock"),
            None,
        );
        first.kill().await;
        watch.status(pb::SessionStatus::Disconnected).await;
        let now = session.get().await;
        assert!(now.status_reason.contains("b1"), "{}", now.status_reason);
        let turn = session.prompt("two").await;
        assert_eq!(
            watch.response_to(&turn.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        let frames = frames(&session.log().await);
        let started: Vec<&Value> = events(&frames, "runtime_started");
        assert_eq!(started.len(), 2);
        assert_eq!(started[1]["bridge"], "b2");
        assert!(
            frames.iter().any(|f| f["method"] == "session/resume"),
            "reopened through resume"
        );
    })
    .await
}

#[tokio::test]
async fn a_bridge_dials_an_https_harness_trusting_the_ca_it_was_given_and_runs_a_turn() {
    within(BRIDGE_TIMEOUT, async {
        let ca = crate::tls::Ca::new("bridge test CA");
        let issued = ca.issue(&["localhost", "127.0.0.1"]);
        let files = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = files.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let ca_path = write("ca.pem", &ca.pem());
        let tls = agent_harness::config::TlsFiles {
            cert: write("server.pem", &issued.cert),
            key: write("server.key", &issued.key),
            client_ca: None,
        };
        let data = tempfile::tempdir().unwrap();
        let mut config = crate::harness::test_config(data.path().to_owned(), service_bin());
        config.tls = Some(tls);
        remote_profile(
            &mut config,
            "far",
            &[],
            "mock",
            Duration::from_secs(20),
            Duration::from_secs(30),
        );
        let server = agent_harness::app::start(config).await.expect("serves");
        let url = format!("https://localhost:{}", server.local_addr().port());
        let _bridge = Bridge::start_with_args(
            &url,
            "tls-bridge",
            &[],
            &mock_bridge_profile("mock"),
            None,
            &["--tls-ca-file".as_ref(), ca_path.as_os_str()],
        );
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(ca.pem()))
            .domain_name("localhost");
        let channel = tonic::transport::Endpoint::from_shared(url)
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .expect("a TLS connection");
        let client = pb::agent_session_service_client::AgentSessionServiceClient::new(channel);
        let work = tempfile::tempdir().unwrap();
        let request = pb::CreateSessionRequest {
            profile: "far".into(),
            cwd: work.path().to_string_lossy().into_owned(),
            ..Default::default()
        };
        let mut session = Session::create_with_client(client, request).await;
        let mut watch = session.watch().await;
        let turn = session.prompt("over TLS").await;
        assert_eq!(
            watch.response_to(&turn.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        drop(watch);
        server.shutdown().await.unwrap();
    })
    .await
}

// ---- a hostile bridge ----------------------------------------------------------------------

/// A bridge speaking the protocol directly: what it sends, and what the harness answers.
struct RawBridge {
    up: mpsc::Sender<ConnectRequest>,
    down: tonic::Streaming<ConnectResponse>,
}

impl RawBridge {
    async fn connect(channel: Channel, id: &str, labels: &[(&str, &str)]) -> Self {
        let (up, rx) = mpsc::channel(64);
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        up.send(ConnectRequest {
            frame: Some(Up::Hello(BridgeHello {
                bridge_id: id.into(),
                labels: labels.into_iter().collect(),
                profiles: vec!["mock".into()],
                ..Default::default()
            })),
        })
        .await
        .unwrap();
        let down = RuntimeGatewayServiceClient::new(channel)
            .connect(Request::new(ReceiverStream::new(rx)))
            .await
            .expect("Connect accepted")
            .into_inner();
        Self { up, down }
    }

    async fn send(&self, frame: Option<Up>) -> bool {
        self.up.send(ConnectRequest { frame }).await.is_ok()
    }

    /// The next message from the harness (`None` when the stream ended).
    async fn next(&mut self) -> Option<Down> {
        self.down
            .message()
            .await
            .ok()
            .flatten()
            .and_then(|m| m.frame)
    }
}

fn stdout(key: &str, seq: u64, line: &[u8]) -> Option<Up> {
    Some(Up::Stdout(RuntimeStdout {
        runtime_key: key.into(),
        seq,
        line: line.to_vec(),
    }))
}

#[derive(Debug, Clone)]
enum Hostile {
    NoFrame,
    UnknownKey,
    Duplicate,
    Skip(u64),
    NotJson,
    LineBreak,
    Flood(u16),
    BogusAck(u64),
    SecondHello,
}

fn hostile() -> impl proptest::strategy::Strategy<Value = Hostile> {
    use proptest::prelude::*;
    prop_oneof![
        Just(Hostile::NoFrame),
        Just(Hostile::UnknownKey),
        Just(Hostile::Duplicate),
        (2u64..1000).prop_map(Hostile::Skip),
        Just(Hostile::NotJson),
        Just(Hostile::LineBreak),
        (100u16..3000).prop_map(Hostile::Flood),
        (1u64..u64::MAX).prop_map(Hostile::BogusAck),
        Just(Hostile::SecondHello),
    ]
}

/// Plays the agent's handshake as a hostile bridge would, then misbehaves.
async fn hostile_session(h: &Harness, id: usize, moves: Vec<Hostile>) {
    let label = format!("hostile-{id}");
    let mut bridge = RawBridge::connect(h.channel(), &label, &[("pool", "hostile")]).await;
    let mut sessions = h.sessions();
    let mut request = create_request(h, "hostile");
    request.cwd = h.workspace().to_string_lossy().into_owned();
    let create = tokio::spawn(async move { sessions.create_session(request).await });
    let Some(Down::Spawn(spawn)) = bridge.next().await else {
        panic!("the harness asks for a spawn first")
    };
    let key = spawn.runtime_key;
    bridge
        .send(Some(Up::Spawned(RuntimeSpawned {
            runtime_key: key.clone(),
        })))
        .await;
    // Answer initialize and session/new like an agent, so the session exists.
    let mut seq = 0u64;
    let mut answered = 0;
    while answered < 2 {
        let Some(Down::Stdin(line)) = bridge.next().await else {
            continue;
        };
        let frame: Value = serde_json::from_slice(&line.line).unwrap();
        bridge
            .send(Some(Up::Ack(LineAck {
                runtime_key: key.clone(),
                seq: line.seq,
            })))
            .await;
        let result = match frame["method"].as_str() {
            Some("initialize") => {
                serde_json::json!({"protocolVersion": 1, "agentCapabilities": {}})
            }
            Some("session/new") => serde_json::json!({"sessionId": "hostile"}),
            _ => continue,
        };
        seq += 1;
        let reply = serde_json::json!({"jsonrpc": "2.0", "id": frame["id"], "result": result});
        bridge
            .send(stdout(&key, seq, reply.to_string().as_bytes()))
            .await;
        answered += 1;
    }
    let created = create.await.unwrap();
    assert!(created.is_ok(), "{created:?}");
    for hostile in moves {
        let sent = match hostile {
            Hostile::NoFrame => bridge.send(None).await,
            Hostile::UnknownKey => bridge.send(stdout("no-such-runtime", 1, b"{}")).await,
            Hostile::Duplicate => bridge.send(stdout(&key, seq, b"{\"dup\":1}")).await,
            Hostile::Skip(by) => {
                bridge
                    .send(stdout(&key, seq.saturating_add(by), b"{}"))
                    .await
            }
            Hostile::NotJson => {
                seq += 1;
                bridge.send(stdout(&key, seq, b"this is not json")).await
            }
            Hostile::LineBreak => {
                seq += 1;
                bridge.send(stdout(&key, seq, b"{}\n{}")).await
            }
            Hostile::Flood(n) => {
                let mut ok = true;
                for _ in 0..n {
                    seq += 1;
                    let line = br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"hostile","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"flood"}}}}"#;
                    ok &= bridge.send(stdout(&key, seq, line)).await;
                }
                ok
            }
            Hostile::BogusAck(at) => {
                bridge
                    .send(Some(Up::Ack(LineAck {
                        runtime_key: key.clone(),
                        seq: at,
                    })))
                    .await
            }
            Hostile::SecondHello => bridge.send(Some(Up::Hello(BridgeHello::default()))).await,
        };
        if !sent {
            break;
        }
    }
}

#[test]
fn a_hostile_bridge_is_refused_or_its_runtime_faulted_and_the_harness_serves_others() {
    use proptest::{
        strategy::Strategy,
        test_runner::{Config, TestRunner},
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let h = rt.block_on(Harness::start_with(|config| {
        remote_profile(
            config,
            "hostile",
            &[("pool", "hostile")],
            "mock",
            Duration::from_secs(10),
            Duration::from_secs(1),
        );
    }));
    let mut runner = TestRunner::new(Config {
        cases: 12,
        failure_persistence: None,
        ..Config::default()
    });
    let case = AtomicUsize::new(0);
    runner
        .run(
            &proptest::collection::vec(hostile(), 1..6).boxed(),
            |moves| {
                let id = case.fetch_add(1, Ordering::SeqCst);
                rt.block_on(within(Duration::from_secs(60), async {
                    hostile_session(&h, id, moves).await;
                    // Another session, on a local runtime, is served as ever.
                    let mut session = Session::create(&h, "mock").await;
                    let mut watch = session.watch().await;
                    let turn = session.prompt("still here").await;
                    watch.response_to(&turn.action_id).await;
                }));
                Ok(())
            },
        )
        .unwrap_or_else(|failure| panic!("{failure}"));
    rt.block_on(within(Duration::from_secs(30), async {
        // Every hostile session ends in a known state: idle, or disconnected with a reason.
        let listed = h
            .sessions()
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .unwrap()
            .into_inner();
        let hostile = listed
            .sessions
            .iter()
            .filter(|s| s.profile == "hostile")
            .count();
        assert_eq!(
            hostile,
            case.load(Ordering::SeqCst),
            "every hostile bridge got its session"
        );
        for s in listed.sessions {
            let fine = [
                pb::SessionStatus::Idle as i32,
                pb::SessionStatus::Disconnected as i32,
                pb::SessionStatus::Running as i32,
            ];
            assert!(fine.contains(&s.status), "{s:?}");
        }
        h.shutdown().await;
    }));
}

// ---- a bridge is its token ------------------------------------------------------------------

const VICTIM_TOKEN: &str = "victim-bridge-token";
const MALLORY_TOKEN: &str = "mallory-bridge-token";

type Client = pb::agent_session_service_client::AgentSessionServiceClient<
    tonic::service::interceptor::InterceptedService<Channel, Bearer>,
>;

/// Ada's session client.
fn ada(h: &Harness) -> Client {
    pb::agent_session_service_client::AgentSessionServiceClient::with_interceptor(
        h.channel(),
        Bearer::new(Some(ADA_TOKEN), None),
    )
}

/// A harness with tokens for Ada (a user), the victim's bridge (`sandbox-7`) and Mallory's
/// bridge (`mallory`), both runtime tokens; `extra` is appended to the tokens file.
async fn harness_with_bridge_tokens(
    extra: &str,
    edit: impl FnOnce(&mut ServeConfig),
) -> (Harness, TokensFile) {
    let file = TokensFile::new(&[
        (ADA_TOKEN, "ada", "user"),
        (MALLORY_TOKEN, "mallory", "runtime"),
        (VICTIM_TOKEN, "sandbox-7", "runtime"),
    ]);
    if !extra.is_empty() {
        let text = std::fs::read_to_string(&file.path).unwrap() + extra;
        file.replace(&text);
    }
    let h = Harness::start_with(|config| {
        with_tokens(config, &file.path, None);
        edit(config);
    })
    .await;
    (h, file)
}

/// Ada creates a session of `profile` in the data dir; its id.
async fn create(client: &mut Client, h: &Harness, profile: &str) -> Result<String, tonic::Status> {
    let mut request = create_request(h, profile);
    request.cwd = h.workspace().to_string_lossy().into_owned();
    let created = client.create_session(request).await?.into_inner();
    Ok(created.session.unwrap().id)
}

async fn watch(client: &mut Client, id: &str) -> crate::support::Watch {
    crate::support::Watch {
        stream: client
            .subscribe(pb::SubscribeRequest {
                session_id: id.to_owned(),
                after_offset: 0,
                view: pb::SubscribeView::Log as i32,
            })
            .await
            .expect("Ada subscribes")
            .into_inner(),
        entries: Vec::new(),
        statuses: Vec::new(),
    }
}

fn control(id: &str, action: pb::control_request::Action) -> pb::ControlRequest {
    pb::ControlRequest {
        session_id: id.to_owned(),
        action: Some(action),
        ..Default::default()
    }
}

async fn log_of(client: &mut Client, id: &str) -> Vec<Value> {
    let log = client
        .read_log(pb::ReadLogRequest {
            session_id: id.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    frames(&log.entries)
}

/// A raw hello with `token`: the harness's answer to the call.
pub(crate) async fn hello_with(
    channel: Channel,
    token: Option<&str>,
    hello: BridgeHello,
) -> Result<
    (
        mpsc::Sender<ConnectRequest>,
        tonic::Streaming<ConnectResponse>,
    ),
    tonic::Status,
> {
    let (up, rx) = mpsc::channel(64);
    up.send(ConnectRequest {
        frame: Some(Up::Hello(hello)),
    })
    .await
    .unwrap();
    let mut client =
        RuntimeGatewayServiceClient::with_interceptor(channel, Bearer::new(token, None))
            .max_encoding_message_size(16 << 20);
    let down = client
        .connect(Request::new(ReceiverStream::new(rx)))
        .await?
        .into_inner();
    Ok((up, down))
}

#[tokio::test]
async fn an_impostors_hello_naming_anothers_bridge_id_is_refused_and_the_victims_session_and_runtime_are_untouched()
 {
    within(BRIDGE_TIMEOUT, async {
        let (h, _file) = harness_with_bridge_tokens("", |config| {
            remote_profile(
                config,
                "far",
                &[],
                "mock",
                Duration::from_secs(20),
                Duration::from_secs(30),
            )
        })
        .await;
        let _victim = Bridge::start(
            &url(h.addr()),
            "b1",
            &[],
            &mock_bridge_profile("mock"),
            Some(VICTIM_TOKEN),
        );
        let mut client = ada(&h);
        let id = create(&mut client, &h, "far").await.expect("created on b1");
        let mut watch = watch(&mut client, &id).await;
        let turn = client
            .control(control(
                &id,
                crate::support::prompt("mine\n@permission\n@chunks 3 20"),
            ))
            .await
            .unwrap()
            .into_inner();
        let request = watch.agent_request("session/request_permission").await;
        let started = log_of(&mut client, &id).await;
        let started = events(&started, "runtime_started");
        let key = started[0]["runtime_key"]
            .as_str()
            .expect("a runtime key")
            .to_owned();

        // Mallory names b1 and lists Ada's runtime, with her own runtime token.
        let hello = BridgeHello {
            bridge_id: "b1".into(),
            profiles: vec!["mock".into()],
            running: vec![pb::BridgeRuntime {
                runtime_key: key.clone(),
                last_stdin_seq: 0,
                last_stdout_seq: 0,
                session_id: id.clone(),
            }],
            ..Default::default()
        };
        let status = expect_err(hello_with(h.channel(), Some(MALLORY_TOKEN), hello).await);
        assert_error(&status, Code::PermissionDenied, "FORBIDDEN");

        // Ada's turn goes on on her bridge: no fault, no DISCONNECTED, same runtime.
        let id_number = request["id"]
            .as_i64()
            .expect("the mock numbers its requests");
        client
            .control(control(
                &id,
                permission_answer(number_id(id_number), Some("allow-once")),
            ))
            .await
            .expect("the answer is accepted");
        assert_eq!(
            watch.response_to(&turn.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        assert!(
            !watch
                .statuses
                .contains(&(pb::SessionStatus::Disconnected as i32)),
            "{:?}",
            watch.statuses
        );
        let frames = log_of(&mut client, &id).await;
        assert!(events(&frames, "fault").is_empty(), "no fault");
        assert_eq!(
            events(&frames, "runtime_started").len(),
            1,
            "never restarted"
        );
        // Her next session is placed on her bridge.
        let next = create(&mut client, &h, "far").await.expect("created");
        let frames = log_of(&mut client, &next).await;
        assert_eq!(events(&frames, "runtime_started")[0]["bridge"], "b1");
    })
    .await
}

#[tokio::test]
async fn a_hello_claiming_labels_its_runtime_token_does_not_allow_is_refused() {
    within(BRIDGE_TIMEOUT, async {
        // The victim's token may claim pool=sandbox and any zone, nothing else.
        let (h, _file) = harness_with_bridge_tokens(
            "labels = { pool = \"sandbox\", zone = \"*\" }\n",
            |config| {
                remote_profile(
                    config,
                    "gpu",
                    &[("pool", "gpu")],
                    "mock",
                    Duration::from_millis(1500),
                    Duration::from_secs(30),
                )
            },
        )
        .await;
        let hello = |labels: &[(&str, &str)]| BridgeHello {
            bridge_id: "b1".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            profiles: vec!["mock".into()],
            ..Default::default()
        };
        for refused in [
            &[("pool", "gpu")][..],
            &[("pool", "sandbox"), ("tier", "gold")][..],
        ] {
            let status =
                expect_err(hello_with(h.channel(), Some(VICTIM_TOKEN), hello(refused)).await);
            assert_error(&status, Code::PermissionDenied, "FORBIDDEN");
        }
        // Nothing was admitted: a gpu session finds no bridge.
        let status = expect_err(create(&mut ada(&h), &h, "gpu").await);
        assert_error(&status, Code::Unavailable, "RUNTIME_START_FAILED");
        let allowed = hello(&[("pool", "sandbox"), ("zone", "eu-1")]);
        hello_with(h.channel(), Some(VICTIM_TOKEN), allowed)
            .await
            .expect("labels within the token's are accepted");
        // Another runtime token without labels may claim any.
        hello_with(h.channel(), Some(MALLORY_TOKEN), {
            let mut other = hello(&[("pool", "gpu")]);
            other.bridge_id = "m1".into();
            other
        })
        .await
        .expect("a token without labels claims any");
    })
    .await
}

#[tokio::test]
async fn a_remote_profile_with_bridge_principals_is_never_placed_on_another_principals_bridge() {
    within(BRIDGE_TIMEOUT, async {
        let (h, _file) = harness_with_bridge_tokens("", |config| {
            remote_profile_of(
                config,
                "far",
                &[],
                Some(&["sandbox-7"]),
                "mock",
                Duration::from_millis(1500),
                Duration::from_secs(30),
            )
        })
        .await;
        let hello = BridgeHello {
            bridge_id: "a-mallory".into(),
            profiles: vec!["mock".into()],
            ..Default::default()
        };
        let (up, mut mallory) = hello_with(h.channel(), Some(MALLORY_TOKEN), hello)
            .await
            .expect("Mallory's bridge connects");
        let mut client = ada(&h);
        let status = expect_err(create(&mut client, &h, "far").await);
        assert_error(&status, Code::Unavailable, "RUNTIME_START_FAILED");
        let _victim = Bridge::start(
            &url(h.addr()),
            "b1",
            &[],
            &mock_bridge_profile("mock"),
            Some(VICTIM_TOKEN),
        );
        let id = loop {
            // The real bridge may still be dialling.
            match create(&mut client, &h, "far").await {
                Ok(id) => break id,
                Err(status) => assert_error(&status, Code::Unavailable, "RUNTIME_START_FAILED"),
            }
        };
        let frames = log_of(&mut client, &id).await;
        assert_eq!(events(&frames, "runtime_started")[0]["bridge"], "b1");
        // Mallory's bridge was never asked for anything: she hangs up and her stream holds
        // nothing.
        drop(up);
        while let Ok(Some(message)) = mallory.message().await {
            assert!(message.frame.is_none(), "Mallory got {message:?}");
        }
    })
    .await
}

#[tokio::test]
async fn a_hello_of_two_megabytes_with_sixty_thousand_labels_is_refused_limit_exceeded() {
    within(BRIDGE_TIMEOUT, async {
        let h = Harness::start_with(|config| {
            remote_profile(
                config,
                "far",
                &[],
                "mock",
                Duration::from_millis(1500),
                Duration::from_secs(30),
            )
        })
        .await;
        let labels: std::collections::HashMap<String, String> = (0..60_000)
            .map(|i| (format!("label-{i:08}"), "v".repeat(16)))
            .collect();
        let hello = BridgeHello {
            bridge_id: "big".into(),
            labels,
            profiles: vec!["mock".into()],
            ..Default::default()
        };
        assert!(prost::Message::encoded_len(&hello) > 2_000_000);
        let status = expect_err(hello_with(h.channel(), None, hello).await);
        assert_error(&status, Code::InvalidArgument, "LIMIT_EXCEEDED");
        assert!(status.message().len() < 256, "{}", status.message());
        // Nothing was admitted.
        let status = expect_err(h.sessions().create_session(create_request(&h, "far")).await);
        assert_error(&status, Code::Unavailable, "RUNTIME_START_FAILED");
        // Each bound alone refuses too: a label value of 257 bytes, 257 profiles.
        let long_value = BridgeHello {
            bridge_id: "long".into(),
            labels: [("k".to_owned(), "v".repeat(257))].into(),
            ..Default::default()
        };
        let status = expect_err(hello_with(h.channel(), None, long_value).await);
        assert_error(&status, Code::InvalidArgument, "LIMIT_EXCEEDED");
        let many_profiles = BridgeHello {
            bridge_id: "many".into(),
            profiles: (0..257).map(|i| format!("p{i}")).collect(),
            ..Default::default()
        };
        let status = expect_err(hello_with(h.channel(), None, many_profiles).await);
        assert_error(&status, Code::InvalidArgument, "LIMIT_EXCEEDED");
    })
    .await
}

/// Answers a spawn and the agent's handshake (initialize advertising `load`, session/new) as
/// an agent behind `bridge` would.
async fn serve_handshake(bridge: &mut RawBridge) -> String {
    let spawn = loop {
        match bridge.next().await {
            Some(Down::Spawn(spawn)) => break spawn,
            Some(_) => continue,
            None => panic!("the stream ended before a spawn"),
        }
    };
    let key = spawn.runtime_key;
    bridge
        .send(Some(Up::Spawned(RuntimeSpawned {
            runtime_key: key.clone(),
        })))
        .await;
    let mut seq = 0u64;
    while seq < 2 {
        let Some(Down::Stdin(line)) = bridge.next().await else {
            continue;
        };
        let frame: Value = serde_json::from_slice(&line.line).unwrap();
        bridge
            .send(Some(Up::Ack(LineAck {
                runtime_key: key.clone(),
                seq: line.seq,
            })))
            .await;
        let result = match frame["method"].as_str() {
            Some("initialize") => serde_json::json!({
                "protocolVersion": 1, "agentCapabilities": {"loadSession": true}
            }),
            Some("session/new") => serde_json::json!({"sessionId": "loud"}),
            _ => continue,
        };
        seq += 1;
        let reply = serde_json::json!({"jsonrpc": "2.0", "id": frame["id"], "result": result});
        bridge
            .send(stdout(&key, seq, reply.to_string().as_bytes()))
            .await;
    }
    key
}

#[tokio::test]
async fn a_bridges_four_megabyte_texts_are_stored_capped_and_list_sessions_keeps_working() {
    use agent_harness::domain::text::{CUT_MARK, MAX_FOREIGN_TEXT_BYTES};
    within(BRIDGE_TIMEOUT, async {
        let h = Harness::start_with(|config| {
            remote_profile(
                config,
                "far",
                &[],
                "mock",
                Duration::from_secs(10),
                Duration::from_secs(30),
            )
        })
        .await;
        let mut bridge = RawBridge::connect(h.channel(), "loud", &[]).await;
        let capped = |reason: &str| {
            assert!(reason.len() <= MAX_FOREIGN_TEXT_BYTES, "{}", reason.len());
            assert!(reason.ends_with(CUT_MARK), "{}", &reason[..200]);
        };
        for _ in 0..3 {
            let mut sessions = h.sessions();
            let request = create_request(&h, "far");
            let create = tokio::spawn(async move { sessions.create_session(request).await });
            let key = serve_handshake(&mut bridge).await;
            let id = create
                .await
                .unwrap()
                .expect("created")
                .into_inner()
                .session
                .unwrap()
                .id;
            let mut session = Session::attach(h.sessions(), &id);
            let mut watch = session.watch().await;
            // The agent dies with 4 MB of stderr.
            bridge
                .send(Some(Up::Exited(pb::RuntimeExited {
                    runtime_key: key,
                    code: Some(1),
                    signal: None,
                    stderr_tail: "s".repeat(4_000_000),
                })))
                .await;
            watch.status(pb::SessionStatus::Disconnected).await;
            let reason = session.get().await.status_reason;
            assert!(reason.len() <= MAX_FOREIGN_TEXT_BYTES, "{}", reason.len());
            // The next prompt reopens it on the bridge, which fails with a 4 MB error.
            // (The call waits for the reopen, which waits for the bridge: in the background.)
            let turn = tokio::spawn({
                let mut again = Session::attach(h.sessions(), &id);
                async move { again.act(crate::support::prompt("again")).await }
            });
            let spawn = loop {
                match bridge.next().await {
                    Some(Down::Spawn(spawn)) => break spawn,
                    Some(_) => continue,
                    None => panic!("the stream ended before a spawn to reopen"),
                }
            };
            bridge
                .send(Some(Up::SpawnFailed(pb::RuntimeSpawnFailed {
                    runtime_key: spawn.runtime_key,
                    error: "e".repeat(4_000_000),
                    stderr_tail: "t".repeat(100_000),
                })))
                .await;
            if let Err(status) = turn.await.unwrap() {
                assert!(status.message().len() <= MAX_FOREIGN_TEXT_BYTES);
            }
            loop {
                let reason = session.get().await.status_reason;
                if reason.contains("eeee") {
                    capped(&reason);
                    break;
                }
                watch
                    .next()
                    .await
                    .expect("the session goes on")
                    .expect("no error");
            }
        }
        let listed = h
            .sessions()
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .expect("ListSessions answers")
            .into_inner();
        assert_eq!(listed.sessions.len(), 3);
        for session in &listed.sessions {
            capped(&session.status_reason);
        }
    })
    .await
}

#[tokio::test]
async fn a_bridges_metric_series_vanish_once_it_has_left() {
    within(BRIDGE_TIMEOUT, async {
        let h = Harness::start_with(|config| {
            config.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
            remote_profile(
                config,
                "far",
                &[],
                "mock",
                Duration::from_secs(20),
                Duration::from_secs(1),
            )
        })
        .await;
        let metrics = h.metrics_addr().expect("a metrics endpoint");
        let series = "agent_harness_bridge_runtimes{bridge=\"leaving-1\"}";
        let mut bridge = Bridge::start(
            &url(h.addr()),
            "leaving-1",
            &[],
            &mock_bridge_profile("mock"),
            None,
        );
        let mut session = Session::create(&h, "far").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("hello").await;
        watch.response_to(&turn.action_id).await;
        let text = crate::operations::scrape(metrics).await;
        assert!(text.contains(&format!("{series} 1")), "{text}");
        bridge.kill().await;
        watch.status(pb::SessionStatus::Disconnected).await;
        loop {
            let text = crate::operations::scrape(metrics).await;
            if !text.contains(series) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}
