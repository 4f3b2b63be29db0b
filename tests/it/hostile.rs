//! Hostile input: property tests that throw random and malformed
//! ControlRequests and CreateSessionRequests at a real server — oversized strings, huge
//! attachment lists, bad UUIDs, wrong id shapes, cwd escapes through `..` and symlinks — and
//! check that every one gets a clear status with an `ErrorInfo` reason, nothing is stored, and
//! the server serves normally afterwards. Also: every limit with its default and its knob, the
//! gRPC message limit, the property tests of the runtime line reader and the fold (the same
//! invariants the `cargo fuzz` targets check), and a runtime's environment.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::mpsc,
    time::Duration,
};

use agent_harness::{
    domain::limits::Limits,
    pb::v1::{self as pb, control_request::Action},
};
use agent_harness_testkit::fuzzing;
use proptest::{
    prelude::*,
    test_runner::{Config, TestRunner},
};
use serde_json::{Value, json};
use tempfile::TempDir;
use tonic::{Code, Status};

use crate::{
    harness::{Harness, assert_error, bounded, error_info, expect_err, within},
    process::Serve,
    support::session_count,
    support::{Session, attachment, mock_profile_with, prompt},
};

// ---- running property tests against a server ------------------------------------------------

/// A version-4 UUID: a well-formed id of the wrong version.
const V4_ID: &str = "6f1c1c1e-8d3b-4d51-9a47-2f7bb8c1a0d2";

/// How long one property test may run before it fails as hung.
const PROPERTY_TIMEOUT: Duration = Duration::from_secs(120);

/// Cases per property over gRPC (`PROPTEST_CASES` overrides).
fn grpc_cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(64)
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

/// Runs a synchronous test body on its own thread, failing it if it takes longer than
/// [`PROPERTY_TIMEOUT`] (a proptest runner cannot live inside an async test).
fn bounded_sync(body: impl FnOnce() + Send + 'static) {
    let (done_tx, done_rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        body();
        let _ = done_tx.send(());
    });
    match done_rx.recv_timeout(PROPERTY_TIMEOUT) {
        Ok(()) => worker.join().expect("the test body finished"),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // The body panicked: report its panic.
            if let Err(panic) = worker.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("property test did not finish within {PROPERTY_TIMEOUT:?}")
        }
    }
}

fn tokio_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A directory tree for cwd escapes: `root/` is the profile's only allowed root.
struct Fence {
    _dir: TempDir,
    base: PathBuf,
    root: PathBuf,
    inside: PathBuf,
}

impl Fence {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("a temporary dir");
        let base = dir.path().canonicalize().expect("canonical");
        let root = base.join("root");
        let inside = root.join("inside");
        std::fs::create_dir_all(&inside).unwrap();
        std::fs::create_dir_all(base.join("outside")).unwrap();
        std::fs::create_dir_all(base.join("root-sibling")).unwrap();
        std::fs::write(root.join("file.txt"), "not a directory").unwrap();
        std::os::unix::fs::symlink(base.join("outside"), root.join("escape")).unwrap();
        std::os::unix::fs::symlink("/", root.join("to-slash")).unwrap();
        std::os::unix::fs::symlink(&inside, root.join("alias")).unwrap();
        Self {
            _dir: dir,
            base,
            root,
            inside,
        }
    }

    /// Paths that must never be accepted as a cwd.
    fn escapes(&self) -> Vec<String> {
        let s = |p: &Path| p.to_string_lossy().into_owned();
        vec![
            s(&self.base.join("outside")),
            s(&self.base.join("root-sibling")),
            s(&self.base),
            format!("{}/../outside", s(&self.root)),
            format!("{}/../../outside", s(&self.inside)),
            format!("{}/../root-sibling", s(&self.root)),
            s(&self.root.join("escape")),
            format!("{}/.", s(&self.root.join("escape"))),
            s(&self.root.join("to-slash")),
            s(&self.root.join("to-slash/etc")),
            s(&self.root.join("file.txt")),
            s(&self.root.join("does-not-exist")),
            "/".into(),
            "/proc/self/cwd".into(),
            "/etc".into(),
            String::new(),
            "relative/dir".into(),
            "./inside".into(),
            format!("{}\0/x", s(&self.inside)),
        ]
    }
}

/// A server whose `mock` profile may run only under `fence.root`.
async fn fenced(fence: &Fence) -> Harness {
    let root = fence.root.clone();
    Harness::start_with(move |config| {
        mock_profile_with(config, "mock", &[], |profile| {
            profile.allowed_cwd_roots = Some(vec![root]);
        });
    })
    .await
}

/// The gRPC code the table gives a reason.
fn code_of(reason: &str) -> Code {
    match reason {
        "INVALID_ARGUMENT"
        | "LIMIT_EXCEEDED"
        | "MODEL_NOT_ADVERTISED"
        | "CONFIG_OPTION_UNKNOWN"
        | "PERMISSION_OPTION_UNKNOWN"
        | "EMPTY_PROMPT" => Code::InvalidArgument,
        "SESSION_NOT_FOUND" | "QUEUED_ACTION_NOT_FOUND" | "PROFILE_NOT_FOUND" => Code::NotFound,
        "PERMISSION_NOT_PENDING" | "ELICITATION_NOT_PENDING" => Code::FailedPrecondition,
        other => panic!("unexpected reason {other}"),
    }
}

/// A refusal must be a status of the table with an `ErrorInfo` whose reason is one expected.
fn assert_clear_refusal(result: Result<impl std::fmt::Debug, Status>, expected: &[&str]) {
    let status = match result {
        Ok(value) => panic!("a hostile request was accepted: {value:?}"),
        Err(status) => status,
    };
    let info = error_info(&status);
    assert!(
        expected.contains(&info.reason.as_str()),
        "reason {} not in {expected:?}: {status:?}",
        info.reason
    );
    assert_eq!(status.code(), code_of(&info.reason), "{status:?}");
    assert!(
        !status.message().is_empty(),
        "a message for people: {status:?}"
    );
}

// ---- strategies ----------------------------------------------------------------------------

/// Any text, including control characters and non-ASCII.
fn junk(max: usize) -> BoxedStrategy<String> {
    proptest::collection::vec(any::<char>(), 0..max)
        .prop_map(String::from_iter)
        .boxed()
}

/// A string of more than `limit` bytes, made of one repeated character.
fn over(limit: usize) -> BoxedStrategy<String> {
    (
        any::<char>().prop_filter("visible", |c| !c.is_whitespace() && !c.is_control()),
        1..64usize,
    )
        .prop_map(move |(c, extra)| c.to_string().repeat(limit / c.len_utf8() + extra))
        .boxed()
}

/// Strings that are not a hyphenated UUID, and UUIDs of other shapes.
fn bad_ids() -> BoxedStrategy<String> {
    prop_oneof![
        junk(40),
        "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{11}",
        "[0-9a-f]{32}",
        "\\{[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\\}",
        " [0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
        Just("00000000-0000-0000-0000-000000000000x".to_owned()),
        over(4096),
    ]
    .boxed()
}

fn ok_attachment() -> BoxedStrategy<pb::PromptAttachment> {
    ("[a-z]{1,12}", "[a-z0-9]{1,16}")
        .prop_map(|(host, name)| attachment(&format!("https://{host}.example/f/{name}"), &name))
        .boxed()
}

fn prompt_action(text: String, attachments: Vec<pb::PromptAttachment>) -> Action {
    Action::Prompt(pb::PromptAction {
        prompt: text,
        attachments,
    })
}

/// One hostile ControlRequest for `session_id`, with the reasons it may be refused with.
fn hostile_control(
    session_id: String,
    limits: Limits,
) -> BoxedStrategy<(pb::ControlRequest, Vec<&'static str>)> {
    let id = move || session_id.clone();
    let req = |session_id: String, action: Option<Action>| pb::ControlRequest {
        session_id,
        action,
        ..Default::default()
    };
    let text = "[a-zA-Z ]{1,40}";
    let l = limits;
    prop_oneof![
        // A session id that is not one, or names no session.
        (bad_ids(), text).prop_map(move |(sid, t)| (
            req(sid, Some(prompt(&t))),
            vec!["INVALID_ARGUMENT", "SESSION_NOT_FOUND"]
        )),
        Just(()).prop_map(move |_| (
            req(uuid::Uuid::now_v7().to_string(), Some(prompt("x"))),
            vec!["SESSION_NOT_FOUND"]
        )),
        Just(()).prop_map(move |_| (
            req(V4_ID.to_string(), Some(prompt("x"))),
            vec!["SESSION_NOT_FOUND"]
        )),
        // Oversized prompt text.
        over(l.prompt_bytes).prop_map({
            let id = id.clone();
            move |t| (req(id(), Some(prompt(&t))), vec!["LIMIT_EXCEEDED"])
        }),
        // Too many attachments, and a list too big for one gRPC message.
        (33..300usize, ok_attachment()).prop_map({
            let id = id.clone();
            move |(n, a)| {
                (
                    req(id(), Some(prompt_action("x".into(), vec![a; n]))),
                    vec!["LIMIT_EXCEEDED"],
                )
            }
        }),
        (0..2usize).prop_map({
            let id = id.clone();
            move |extra| {
                let a = attachment("https://h.example/f/a-file-name", "a-file-name");
                let n = 4 * 1024 * 1024 / 40 + extra * 1000;
                (
                    req(id(), Some(prompt_action("x".into(), vec![a; n]))),
                    vec!["LIMIT_EXCEEDED"],
                )
            }
        }),
        // URIs: forbidden schemes, junk, oversized.
        (
            prop_oneof![
                Just("file:///etc/passwd".to_owned()),
                Just("javascript:alert(1)".to_owned()),
                Just("data:text/html,<b>x</b>".to_owned()),
                Just("ftp://h.example/x".to_owned()),
                Just("/relative".to_owned()),
                Just("https://".to_owned()),
                "[a-z]{1,8}:[^ ]{0,30}".prop_filter("not http(s)", |u| !u.starts_with("http")),
                junk(60).prop_filter("not a URL", |u| url::Url::parse(u).is_err()),
            ],
            text
        )
            .prop_map({
                let id = id.clone();
                move |(uri, t)| {
                    (
                        req(id(), Some(prompt_action(t, vec![attachment(&uri, "f")]))),
                        vec!["INVALID_ARGUMENT"],
                    )
                }
            }),
        over(l.uri_bytes).prop_map({
            let id = id.clone();
            move |tail| {
                (
                    req(
                        id(),
                        Some(prompt_action(
                            "x".into(),
                            vec![attachment(&format!("https://h.example/{tail}"), "f")],
                        )),
                    ),
                    vec!["LIMIT_EXCEEDED", "INVALID_ARGUMENT"],
                )
            }
        }),
        // Attachment names: oversized, blank.
        over(l.attachment_name_bytes).prop_map({
            let id = id.clone();
            move |name| {
                (
                    req(
                        id(),
                        Some(prompt_action(
                            "x".into(),
                            vec![attachment("https://h.example/f", &name)],
                        )),
                    ),
                    vec!["LIMIT_EXCEEDED"],
                )
            }
        }),
        "[ \t]{0,5}".prop_map({
            let id = id.clone();
            move |name| {
                (
                    req(
                        id(),
                        Some(prompt_action(
                            "x".into(),
                            vec![attachment("https://h.example/f", &name)],
                        )),
                    ),
                    vec!["INVALID_ARGUMENT"],
                )
            }
        }),
        // Action ids that are not UUID v7.
        prop_oneof![
            bad_ids(),
            Just(V4_ID.to_string()),
            Just(uuid::Uuid::nil().to_string()),
            Just(uuid::Uuid::now_v7().to_string().to_uppercase() + " ")
        ]
        .prop_map({
            let id = id.clone();
            move |action_id| {
                let mut r = req(id(), Some(prompt("x")));
                r.action_id = Some(action_id);
                (r, vec!["INVALID_ARGUMENT"])
            }
        }),
        // Blank prompts, a missing action, a delivery that is not one.
        "[ \t\n]{0,8}".prop_map({
            let id = id.clone();
            move |t| (req(id(), Some(prompt(&t))), vec!["EMPTY_PROMPT"])
        }),
        Just(()).prop_map({
            let id = id.clone();
            move |_| (req(id(), None), vec!["INVALID_ARGUMENT"])
        }),
        prop_oneof![3..i32::MAX, i32::MIN..0].prop_map({
            let id = id.clone();
            move |delivery| {
                let mut r = req(id(), Some(prompt("x")));
                r.delivery = delivery;
                (r, vec!["INVALID_ARGUMENT"])
            }
        }),
        // Interrupt delivery of something that is not a prompt.
        prop_oneof![
            Just(Action::Compact(pb::CompactAction {})),
            Just(crate::support::stop(false)),
            Just(crate::support::set_model("mock-smart")),
        ]
        .prop_map({
            let id = id.clone();
            move |action| {
                let mut r = req(id(), Some(action));
                r.delivery = pb::Delivery::Interrupt as i32;
                (r, vec!["INVALID_ARGUMENT"])
            }
        }),
        // Models and config options: oversized, empty, not advertised.
        prop_oneof![
            over(l.identifier_bytes).prop_map(|m| (m, vec!["LIMIT_EXCEEDED"])),
            Just((String::new(), vec!["INVALID_ARGUMENT"])),
            "[a-z]{1,12}-nope".prop_map(|m| (m, vec!["MODEL_NOT_ADVERTISED"])),
        ]
        .prop_map({
            let id = id.clone();
            move |(model, reasons)| (req(id(), Some(crate::support::set_model(&model))), reasons)
        }),
        ("[a-z]{1,12}-nope", junk(20)).prop_map({
            let id = id.clone();
            move |(config_id, value)| {
                (
                    req(
                        id(),
                        Some(Action::SetConfigOption(pb::SetConfigOptionAction {
                            config_id,
                            value,
                        })),
                    ),
                    vec!["CONFIG_OPTION_UNKNOWN", "INVALID_ARGUMENT"],
                )
            }
        }),
        // Answers to nothing, and answers of the wrong shape.
        (any::<i64>(), prop::option::of("[a-z-]{1,12}")).prop_map({
            let id = id.clone();
            move |(n, option)| {
                (
                    req(
                        id(),
                        Some(crate::support::permission_answer(
                            crate::support::number_id(n),
                            option.as_deref(),
                        )),
                    ),
                    vec!["PERMISSION_NOT_PENDING"],
                )
            }
        }),
        junk(20).prop_map({
            let id = id.clone();
            move |text| {
                let answer = Action::RespondToPermission(pb::RespondToPermissionAction {
                    request_id: Some(pb::JsonRpcId {
                        id: Some(pb::json_rpc_id::Id::Text(text)),
                    }),
                    outcome: None,
                });
                (req(id(), Some(answer)), vec!["INVALID_ARGUMENT"])
            }
        }),
        Just(()).prop_map({
            let id = id.clone();
            move |_| {
                let answer = Action::RespondToPermission(pb::RespondToPermissionAction {
                    request_id: None,
                    outcome: Some(pb::respond_to_permission_action::Outcome::Cancelled(
                        pb::PermissionCancelled {},
                    )),
                });
                (req(id(), Some(answer)), vec!["INVALID_ARGUMENT"])
            }
        }),
        (
            any::<i64>(),
            prop_oneof![Just(f64::NAN), Just(f64::INFINITY), any::<f64>()]
        )
            .prop_map({
                let id = id.clone();
                move |(n, number)| {
                    use pb::respond_elicitation_action::Answer;
                    let content = [(
                        "x".to_owned(),
                        pb::ElicitationValue {
                            kind: Some(pb::elicitation_value::Kind::Number(number)),
                        },
                    )]
                    .into();
                    let answer = Action::RespondElicitation(pb::RespondElicitationAction {
                        request_id: Some(crate::support::number_id(n)),
                        answer: Some(Answer::Accept(pb::ElicitationAccept { content })),
                    });
                    (
                        req(id(), Some(answer)),
                        vec!["INVALID_ARGUMENT", "ELICITATION_NOT_PENDING"],
                    )
                }
            }),
        // A context on something that is not a prompt, and an oversized one.
        Just(()).prop_map({
            let id = id.clone();
            move |_| {
                let mut r = req(id(), Some(Action::Compact(pb::CompactAction {})));
                r.context = Some(context_of(json!({"trigger": "x"})));
                (r, vec!["INVALID_ARGUMENT"])
            }
        }),
        over(l.context_bytes).prop_map({
            let id = id.clone();
            move |big| {
                let mut r = req(id(), Some(prompt("x")));
                r.context = Some(context_of(json!({"big": big})));
                (r, vec!["LIMIT_EXCEEDED"])
            }
        }),
    ]
    .boxed()
}

fn context_of(value: Value) -> prost_types::Struct {
    fn to_pb(value: &Value) -> prost_types::Value {
        use prost_types::value::Kind;
        prost_types::Value {
            kind: Some(match value {
                Value::String(s) => Kind::StringValue(s.clone()),
                Value::Object(map) => Kind::StructValue(prost_types::Struct {
                    fields: map.iter().map(|(k, v)| (k.clone(), to_pb(v))).collect(),
                }),
                other => Kind::StringValue(other.to_string()),
            }),
        }
    }
    match to_pb(&value).kind {
        Some(prost_types::value::Kind::StructValue(s)) => s,
        _ => unreachable!("an object"),
    }
}

/// One hostile CreateSessionRequest, with the reasons it may be refused with.
fn hostile_create(
    fence: &Fence,
    limits: Limits,
) -> BoxedStrategy<(pb::CreateSessionRequest, Vec<&'static str>)> {
    let inside = fence.inside.to_string_lossy().into_owned();
    let base = move || pb::CreateSessionRequest {
        profile: "mock".into(),
        cwd: inside.clone(),
        ..Default::default()
    };
    let l = limits;
    let escapes = fence.escapes();
    let root = fence.root.to_string_lossy().into_owned();
    prop_oneof![
        bad_ids().prop_map({
            let base = base.clone();
            move |id| {
                (
                    pb::CreateSessionRequest {
                        session_id: Some(id),
                        ..base()
                    },
                    vec!["INVALID_ARGUMENT"],
                )
            }
        }),
        "[a-z]{1,12}-nope".prop_map({
            let base = base.clone();
            move |profile| {
                (
                    pb::CreateSessionRequest { profile, ..base() },
                    vec!["PROFILE_NOT_FOUND"],
                )
            }
        }),
        // cwd escapes: `..`, symlinks out of the root, prefixes of the root's name, files,
        // relative paths, NUL bytes, and random paths.
        proptest::sample::select(escapes).prop_map({
            let base = base.clone();
            move |cwd| {
                (
                    pb::CreateSessionRequest { cwd, ..base() },
                    vec!["INVALID_ARGUMENT"],
                )
            }
        }),
        (1..6usize, "[a-z]{1,6}").prop_map({
            let base = base.clone();
            let root = root.clone();
            move |(up, name)| {
                let cwd = format!("{root}/inside{}/{name}-outside", "/..".repeat(up + 1));
                (
                    pb::CreateSessionRequest { cwd, ..base() },
                    vec!["INVALID_ARGUMENT"],
                )
            }
        }),
        junk(80).prop_map({
            let base = base.clone();
            move |cwd| {
                (
                    pb::CreateSessionRequest { cwd, ..base() },
                    vec!["INVALID_ARGUMENT"],
                )
            }
        }),
        over(4096).prop_map({
            let base = base.clone();
            move |tail| {
                (
                    pb::CreateSessionRequest {
                        cwd: format!("/{tail}"),
                        ..base()
                    },
                    vec!["LIMIT_EXCEEDED", "INVALID_ARGUMENT"],
                )
            }
        }),
        // Names: blank, multi-line, too long.
        prop_oneof![
            "[ \t]{0,4}".prop_map(|n| (n, vec!["INVALID_ARGUMENT"])),
            "[a-z]{1,5}\n[a-z]{1,5}".prop_map(|n| (n, vec!["INVALID_ARGUMENT"])),
            (
                l.session_name_chars + 1..l.session_name_chars + 200,
                any::<char>()
            )
                .prop_filter("not blank", |(_, c)| !c.is_whitespace())
                .prop_map(|(n, c)| (
                    c.to_string().repeat(n),
                    vec!["LIMIT_EXCEEDED", "INVALID_ARGUMENT"]
                )),
        ]
        .prop_map({
            let base = base.clone();
            move |(name, reasons)| {
                (
                    pb::CreateSessionRequest {
                        name: Some(name),
                        ..base()
                    },
                    reasons,
                )
            }
        }),
        // Labels and editors beyond their limits, or malformed.
        (l.labels + 1..l.labels + 100).prop_map({
            let base = base.clone();
            move |n| {
                let labels = (0..n).map(|i| (format!("k{i}"), "v".to_owned())).collect();
                (
                    pb::CreateSessionRequest { labels, ..base() },
                    vec!["LIMIT_EXCEEDED"],
                )
            }
        }),
        prop_oneof![
            Just((String::new(), "v".to_owned(), vec!["INVALID_ARGUMENT"])),
            over(l.label_bytes).prop_map(|k| (k, "v".to_owned(), vec!["LIMIT_EXCEEDED"])),
            over(l.label_bytes).prop_map(|v| ("k".to_owned(), v, vec!["LIMIT_EXCEEDED"])),
        ]
        .prop_map({
            let base = base.clone();
            move |(k, v, reasons)| {
                (
                    pb::CreateSessionRequest {
                        labels: [(k, v)].into(),
                        ..base()
                    },
                    reasons,
                )
            }
        }),
        prop_oneof![
            (l.editors + 1..l.editors + 100).prop_map(|n| (
                (0..n).map(|i| format!("e{i}")).collect(),
                vec!["LIMIT_EXCEEDED"]
            )),
            Just((vec![String::new()], vec!["INVALID_ARGUMENT"])),
            over(l.identifier_bytes).prop_map(|e| (vec![e], vec!["LIMIT_EXCEEDED"])),
        ]
        .prop_map({
            let base = base.clone();
            move |(editors, reasons)| (pb::CreateSessionRequest { editors, ..base() }, reasons)
        }),
        prop_oneof![
            Just((String::new(), vec!["INVALID_ARGUMENT"])),
            over(l.identifier_bytes).prop_map(|m| (m, vec!["LIMIT_EXCEEDED"])),
        ]
        .prop_map({
            let base = base.clone();
            move |(model, reasons)| {
                (
                    pb::CreateSessionRequest {
                        model: Some(model),
                        ..base()
                    },
                    reasons,
                )
            }
        }),
        // Origins whose first prompt is over the limit.
        over(l.prompt_bytes).prop_map({
            let base = base.clone();
            move |text| {
                let origin =
                    pb::create_session_request::Origin::TaskAssignment(pb::TaskAssignment {
                        prompt: text,
                        assigned_by: "x".into(),
                    });
                (
                    pb::CreateSessionRequest {
                        origin: Some(origin),
                        ..base()
                    },
                    vec!["LIMIT_EXCEEDED"],
                )
            }
        }),
        over(l.prompt_bytes).prop_map({
            let base = base.clone();
            move |text| {
                let origin = pb::create_session_request::Origin::Mention(pb::ChannelMessage {
                    content: text,
                    ..Default::default()
                });
                (
                    pb::CreateSessionRequest {
                        origin: Some(origin),
                        ..base()
                    },
                    vec!["LIMIT_EXCEEDED"],
                )
            }
        }),
    ]
    .boxed()
}

// ---- the properties ------------------------------------------------------------------------

#[test]
fn random_hostile_control_requests_always_get_a_clear_status_store_nothing_and_the_server_serves_on()
 {
    bounded_sync(|| {
        let rt = tokio_runtime();
        let fence = Fence::new();
        let h = rt.block_on(fenced(&fence));
        let mut request = crate::support::create_request(&h, "mock");
        request.cwd = fence.inside.to_string_lossy().into_owned();
        let mut session = rt.block_on(Session::create_with(&h, request));
        let log_before = rt.block_on(session.log()).len();
        let client = session.client.clone();

        let strategy = hostile_control(session.id.clone(), h.config().limits.clone());
        runner(grpc_cases())
            .run(&strategy, |(request, expected)| {
                let mut client = client.clone();
                let result = rt.block_on(async {
                    within(Duration::from_secs(10), client.control(request)).await
                });
                assert_clear_refusal(result, &expected);
                Ok(())
            })
            .unwrap_or_else(|failure| panic!("{failure}"));

        rt.block_on(bounded(async {
            assert_eq!(session.log().await.len(), log_before, "nothing was logged");
            assert!(session.queue().await.is_empty(), "nothing was queued");
            let now = session.get().await;
            assert_eq!(now.status, pb::SessionStatus::Idle as i32);
            let mut watch = session.watch().await;
            let reply = session.prompt("after the storm").await;
            assert_eq!(reply.status, pb::ControlStatus::Sent as i32);
            watch.chunk("echo: after the storm").await;
            drop(watch); // an open stream would hold a graceful shutdown
            h.shutdown().await;
        }));
    });
}

#[test]
fn random_hostile_create_requests_always_get_a_clear_status_store_nothing_and_the_server_serves_on()
{
    bounded_sync(|| {
        let rt = tokio_runtime();
        let fence = Fence::new();
        let h = rt.block_on(fenced(&fence));
        let client = h.sessions();

        let strategy = hostile_create(&fence, h.config().limits.clone());
        runner(grpc_cases())
            .run(&strategy, |(request, expected)| {
                let mut client = client.clone();
                let result = rt.block_on(async {
                    within(Duration::from_secs(10), client.create_session(request)).await
                });
                assert_clear_refusal(result, &expected);
                Ok(())
            })
            .unwrap_or_else(|failure| panic!("{failure}"));

        rt.block_on(bounded(async {
            let listed = h
                .sessions()
                .list_sessions(pb::ListSessionsRequest::default())
                .await
                .unwrap()
                .into_inner();
            assert!(listed.sessions.is_empty(), "nothing was stored: {listed:?}");
            // A symlink that stays inside the root is fine, and resolves to where it points.
            let mut request = crate::support::create_request(&h, "mock");
            request.cwd = fence.root.join("alias").to_string_lossy().into_owned();
            let mut session = Session::create_with(&h, request).await;
            assert_eq!(session.get().await.cwd, fence.inside.to_string_lossy());
            let mut watch = session.watch().await;
            session.prompt("@cwd").await;
            watch
                .chunk(&format!("cwd: {}", fence.inside.display()))
                .await;
            drop(watch); // an open stream would hold a graceful shutdown
            h.shutdown().await;
        }));
    });
}

// ---- limits --------------------------------------------------------------------------------

#[test]
fn every_limit_of_section_11_has_the_specified_default() {
    let l = Limits::default();
    assert_eq!(l.prompt_bytes, 256 * 1024);
    assert_eq!(l.attachments, 32);
    assert_eq!(l.uri_bytes, 2 * 1024);
    assert_eq!(l.attachment_name_bytes, 256);
    assert_eq!(l.session_name_chars, 100);
    assert_eq!(l.queued_actions, 50);
    assert_eq!(l.sessions_per_principal, 100);
    assert_eq!(l.subscribers_per_session, 256);
    assert_eq!(l.subscribers_per_principal, 128);
    assert_eq!(l.grpc_message_bytes, 4 * 1024 * 1024);
    assert_eq!(l.runtime_line_bytes, 8 * 1024 * 1024);
    // And the ListSessions filters of docs/security.md's bounded queries.
    assert_eq!(l.list_label_filters, 64);
    assert_eq!(l.list_status_filters, 16);
    // Each is a knob of the config file's [limits] table.
    let file: agent_harness::config::FileConfig = toml::from_str(
        "[limits]\nprompt_bytes = 1\nattachments = 2\nuri_bytes = 3\nattachment_name_bytes = 4\n\
         session_name_chars = 5\nqueued_actions = 6\nsessions_per_principal = 7\n\
         subscribers_per_session = 8\ngrpc_message_bytes = 9\nruntime_line_bytes = 10\n\
         subscribers_per_principal = 11\n",
    )
    .expect("every limit is a knob");
    assert_eq!(
        [
            file.limits.prompt_bytes,
            file.limits.attachments,
            file.limits.uri_bytes,
            file.limits.attachment_name_bytes,
            file.limits.session_name_chars,
            file.limits.queued_actions,
            file.limits.sessions_per_principal,
            file.limits.subscribers_per_session,
            file.limits.grpc_message_bytes,
            file.limits.runtime_line_bytes,
            file.limits.subscribers_per_principal,
        ],
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    );
}

/// A server with small limits, so each can be reached cheaply.
async fn small_limits() -> Harness {
    Harness::start_with(|config| {
        let l = &mut config.limits;
        l.prompt_bytes = 100;
        l.attachments = 2;
        l.uri_bytes = 40;
        l.attachment_name_bytes = 8;
        l.session_name_chars = 5;
        l.queued_actions = 2;
        l.sessions_per_principal = 2;
        l.subscribers_per_session = 2;
        l.grpc_message_bytes = 64 * 1024;
    })
    .await
}

#[tokio::test]
async fn configured_limits_are_enforced_with_their_reasons_and_store_nothing() {
    bounded(async {
        let h = small_limits().await;
        let mut session = Session::create(&h, "mock").await;
        let before = session.log().await.len();
        let limit = |status: &Status, name: &str| {
            assert_error(status, Code::InvalidArgument, "LIMIT_EXCEEDED");
            assert_eq!(error_info(status).metadata["limit"], name, "{status:?}");
        };
        let a = |uri: &str, name: &str| attachment(uri, name);
        limit(
            &expect_err(session.act(prompt(&"p".repeat(101))).await),
            "prompt_bytes",
        );
        limit(
            &expect_err(
                session
                    .act(prompt_action("x".into(), vec![a("https://h/1", "a"); 3]))
                    .await,
            ),
            "attachments",
        );
        limit(
            &expect_err(
                session
                    .act(prompt_action(
                        "x".into(),
                        vec![a(&format!("https://h/{}", "u".repeat(40)), "a")],
                    ))
                    .await,
            ),
            "uri_bytes",
        );
        limit(
            &expect_err(
                session
                    .act(prompt_action(
                        "x".into(),
                        vec![a("https://h/1", "nine-byte")],
                    ))
                    .await,
            ),
            "attachment_name_bytes",
        );
        let mut request = crate::support::create_request(&h, "mock");
        request.name = Some("six ch".into());
        limit(
            &expect_err(h.sessions().create_session(request).await),
            "session_name_chars",
        );
        // The gRPC message limit is the table's LIMIT_EXCEEDED too, not tonic's bare OUT_OF_RANGE.
        let mut big = session.control_request(prompt("x"));
        big.context = Some(context_of(json!({"pad": "z".repeat(70 * 1024)})));
        limit(
            &expect_err(session.control(big).await),
            "grpc_message_bytes",
        );
        assert_eq!(session.log().await.len(), before, "nothing was logged");

        // Queue: two wait, the third is QUEUE_FULL.
        let mut watch = session.watch().await;
        session.prompt("@wait-cancel").await;
        watch.chunk("echo: @wait-cancel").await;
        session.prompt("one").await;
        session.prompt("two").await;
        assert_error(
            &expect_err(session.act(prompt("three")).await),
            Code::ResourceExhausted,
            "QUEUE_FULL",
        );
        assert_eq!(session.queue().await.len(), 2);

        // Subscribers: the watch above and one more; the third is refused.
        let _second = session.watch().await;
        let status = expect_err(
            session
                .client
                .subscribe(pb::SubscribeRequest {
                    session_id: session.id.clone(),
                    after_offset: 0,
                    view: 0,
                })
                .await,
        );
        assert_error(&status, Code::ResourceExhausted, "TOO_MANY_SUBSCRIBERS");

        // Sessions per principal: this one and one more; the third is refused and not stored.
        Session::create(&h, "mock").await;
        let status = expect_err(
            h.sessions()
                .create_session(crate::support::create_request(&h, "mock"))
                .await,
        );
        assert_error(&status, Code::ResourceExhausted, "TOO_MANY_SESSIONS");
        assert_eq!(session_count(&h).await, 2);
        // The connection serves on after every refusal.
        assert_eq!(session.get().await.id, session.id);
    })
    .await
}

#[tokio::test]
async fn a_message_over_the_grpc_limit_is_limit_exceeded_and_the_connection_serves_on() {
    bounded(async {
        let h = small_limits().await;
        let mut session = Session::create(&h, "mock").await;
        for size in [70 * 1024, 1024 * 1024] {
            let mut big = session.control_request(prompt("x"));
            big.context = Some(context_of(json!({"pad": "z".repeat(size)})));
            let status = expect_err(session.control(big).await);
            assert_error(&status, Code::InvalidArgument, "LIMIT_EXCEEDED");
            assert_eq!(error_info(&status).metadata["limit"], "grpc_message_bytes");
            // The same connection goes on serving.
            let got = within(
                Duration::from_secs(5),
                session.client.get_session(pb::GetSessionRequest {
                    session_id: session.id.clone(),
                }),
            )
            .await;
            assert!(got.is_ok(), "after {size} bytes: {got:?}");
        }
        h.shutdown().await;
    })
    .await
}

/// A GetSessionRequest whose string field is raw bytes: what a well-behaved client cannot send.
#[derive(Clone, PartialEq, prost::Message)]
struct RawGetSession {
    #[prost(bytes = "vec", tag = "1")]
    session_id: Vec<u8>,
}

/// A GetSessionRequest whose session id is a number: not what the schema says.
#[derive(Clone, PartialEq, prost::Message)]
struct WrongWireType {
    #[prost(uint64, tag = "1")]
    session_id: u64,
}

/// A ControlRequest whose `context` (a google.protobuf.Struct) is raw bytes.
#[derive(Clone, PartialEq, prost::Message)]
struct RawControl {
    #[prost(string, tag = "1")]
    session_id: String,
    #[prost(bytes = "vec", tag = "3")]
    context: Vec<u8>,
}

/// Sends `message` as the request of the unary method at `path`.
async fn raw_unary<M, R>(h: &Harness, path: &'static str, message: M) -> Result<R, Status>
where
    M: prost::Message + Send + Sync + 'static,
    R: prost::Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(h.channel());
    grpc.ready().await.expect("the channel is ready");
    grpc.unary(
        tonic::Request::new(message),
        tonic::codegen::http::uri::PathAndQuery::from_static(path),
        tonic_prost::ProstCodec::<M, R>::default(),
    )
    .await
    .map(tonic::Response::into_inner)
}

/// The protobuf bytes of a Struct nested `depth` deep (`{"a": {"a": …}}`), written from the
/// inside out so no encoder has to recurse that deep.
fn nested_struct(depth: usize) -> Vec<u8> {
    fn len_field(tag: u32, body: &[u8], out: &mut Vec<u8>) {
        prost::encoding::encode_key(tag, prost::encoding::WireType::LengthDelimited, out);
        prost::encoding::encode_varint(body.len() as u64, out);
        out.extend_from_slice(body);
    }
    let mut inner = Vec::new();
    for _ in 0..depth {
        let mut value = Vec::new(); // Value { struct_value = 5 }
        len_field(5, &inner, &mut value);
        let mut entry = Vec::new(); // map entry { key = 1, value = 2 }
        len_field(1, b"a", &mut entry);
        len_field(2, &value, &mut entry);
        let mut outer = Vec::new(); // Struct { fields = 1 }
        len_field(1, &entry, &mut outer);
        inner = outer;
    }
    inner
}

#[tokio::test]
async fn a_request_that_does_not_decode_is_malformed_request_changes_nothing_and_the_server_serves_on()
 {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let log_before = session.log().await;
        const GET: &str = "/agent_harness.v1.AgentSessionService/GetSession";
        const CONTROL: &str = "/agent_harness.v1.AgentSessionService/Control";

        // A session id that is not UTF-8.
        let status = expect_err(
            raw_unary::<_, pb::GetSessionResponse>(
                &h,
                GET,
                RawGetSession {
                    session_id: b"\xff\xfe not utf-8".to_vec(),
                },
            )
            .await,
        );
        assert_error(&status, Code::InvalidArgument, "MALFORMED_REQUEST");
        assert!(status.message().contains("UTF-8"), "{status:?}");

        // A context nested 5,000 deep, for a real session.
        let status = expect_err(
            raw_unary::<_, pb::ControlResponse>(
                &h,
                CONTROL,
                RawControl {
                    session_id: session.id.clone(),
                    context: nested_struct(5_000),
                },
            )
            .await,
        );
        assert_error(&status, Code::InvalidArgument, "MALFORMED_REQUEST");

        // A field of the wrong wire type (a number where the id's string should be).
        let status = expect_err(
            raw_unary::<_, pb::GetSessionResponse>(&h, GET, WrongWireType { session_id: 7 }).await,
        );
        assert_error(&status, Code::InvalidArgument, "MALFORMED_REQUEST");

        // Nothing changed, and the server serves on.
        assert_eq!(session.log().await, log_before);
        assert_eq!(session.get().await.id, session.id);
        h.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_never_exceed_the_sessions_per_principal_limit() {
    bounded(async {
        let h = small_limits().await;
        let attempts = (0..16).map(|_| {
            let mut client = h.sessions();
            let request = crate::support::create_request(&h, "mock");
            tokio::spawn(async move { client.create_session(request).await })
        });
        let mut created = 0;
        for attempt in attempts {
            match attempt.await.expect("the task ran") {
                Ok(_) => created += 1,
                Err(status) => assert_error(&status, Code::ResourceExhausted, "TOO_MANY_SESSIONS"),
            }
        }
        assert_eq!(
            created, 2,
            "exactly the limit is created, however the calls race"
        );
        assert_eq!(session_count(&h).await, 2);
        h.shutdown().await;
    })
    .await
}

// ---- the runtime line reader and the fold (what `cargo fuzz` also runs) ------------------

/// Pieces runtimes might write: valid frames, near-misses, blank lines, long runs, raw bytes.
fn line_piece() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        Just(b"{\"jsonrpc\":\"2.0\",\"method\":\"session/update\",\"params\":{}}".to_vec()),
        Just(b"{}".to_vec()),
        Just(b"[1,2]".to_vec()),
        Just(b"\"text\"".to_vec()),
        Just(b"{\"a\":".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"  \t".to_vec()),
        Just(vec![0xff, 0xfe, b'{', b'}']),
        Just("{\"é\":\"\u{2028}\"}".as_bytes().to_vec()),
        (1..300usize)
            .prop_map(|n| [b"{\"x\":\"".to_vec(), vec![b'y'; n], b"\"}".to_vec()].concat()),
        proptest::collection::vec(any::<u8>(), 0..40),
    ]
    .boxed()
}

#[test]
fn the_runtime_line_reader_keeps_its_contract_on_random_input() {
    bounded_sync(|| {
        let strategy = (
            proptest::collection::vec(line_piece(), 0..24).prop_map(|pieces| pieces.concat()),
            1..200usize,
            1..64usize,
        );
        runner(512)
            .run(&strategy, |(input, max_line, chunk)| {
                fuzzing::runtime_lines(&input, max_line, chunk);
                Ok(())
            })
            .unwrap_or_else(|failure| panic!("{failure}"));
    });
}

/// ACP-shaped frames, both ways, with ids that meet and miss each other.
fn frame() -> BoxedStrategy<(u8, Value, Option<usize>)> {
    let id = prop_oneof![
        Just(Value::Null),
        (0..4i64).prop_map(Value::from),
        Just(json!("01890a5d-ac96-774b-bcce-b302099a8057")),
        Just(json!("01890a5d-ac96-774b-bcce-b302099a8058")),
        Just(json!("harness:1:1")),
        Just(json!("7")),
    ];
    let text = "[a-z <>/@]{0,12}";
    let content = prop_oneof![
        text.prop_map(|t| json!({"type": "text", "text": t})),
        text.prop_map(
            |t| json!({"type": "text", "text": t, "_meta": {"macro/invocation-context": true}})
        ),
        Just(
            json!({"type": "resource_link", "uri": "https://h/f", "name": "f", "mimeType": "image/png"})
        ),
        Just(json!({"type": "image", "mimeType": "image/png", "data": "AA=="})),
        Just(json!({"type": 5})),
        Just(json!(null)),
    ];
    let update = prop_oneof![
        content.clone().prop_map(|c| json!({"sessionUpdate": "agent_message_chunk", "content": c})),
        content.clone().prop_map(|c| json!({"sessionUpdate": "agent_thought_chunk", "content": c})),
        content.clone().prop_map(|c| json!({"sessionUpdate": "user_message_chunk", "content": c})),
        "[ab]".prop_map(|t| json!({"sessionUpdate": "tool_call", "toolCallId": t, "title": "T", "status": "pending"})),
        ("[ab]", "[a-z_]{0,12}").prop_map(|(t, s)| json!({"sessionUpdate": "tool_call_update", "toolCallId": t, "status": s})),
        Just(json!({"sessionUpdate": "plan", "entries": [{"content": "x", "priority": "high", "status": "pending"}]})),
        Just(json!({"sessionUpdate": "plan", "entries": "nope"})),
        Just(json!({"sessionUpdate": "available_commands_update", "availableCommands": []})),
        Just(json!({"sessionUpdate": "config_option_update", "configOptions": [{"id": "model", "category": "model", "type": "select", "currentValue": "m", "options": [{"value": "m", "name": "m"}]}]})),
        Just(json!({"sessionUpdate": "bogus"})),
        Just(json!("not an object")),
    ];
    let method = prop_oneof![
        Just("session/prompt"),
        Just("session/update"),
        Just("session/request_permission"),
        Just("elicitation/create"),
        Just("elicitation/complete"),
        Just("session/cancel"),
        Just("session/set_config_option"),
        Just("session/new"),
        Just("session/load"),
        Just("$/cancel_request"),
        Just("fs/read_text_file"),
    ];
    let result = prop_oneof![
        prop_oneof![
            Just("end_turn"),
            Just("cancelled"),
            Just("refusal"),
            Just("max_tokens"),
            Just("weird")
        ]
        .prop_map(|r| json!({"stopReason": r})),
        Just(json!({"outcome": {"outcome": "selected", "optionId": "allow-once"}})),
        Just(json!({"outcome": {"outcome": "cancelled"}})),
        Just(json!({"action": "accept", "content": {"name": "x"}})),
        Just(json!({"sessionId": "s", "configOptions": []})),
        Just(json!(null)),
    ];
    let params = prop_oneof![
        update.prop_map(|u| json!({"sessionId": "s", "update": u})),
        content.prop_map(|c| json!({"sessionId": "s", "prompt": [c]})),
        Just(
            json!({"sessionId": "s", "toolCall": {"toolCallId": "p"}, "options": [{"optionId": "allow-once", "name": "A", "kind": "allow_once"}]})
        ),
        Just(json!({"mode": "form", "sessionId": "s", "message": "m", "requestedSchema": {}})),
        Just(json!({"requestId": 1})),
        Just(json!({"sessionId": "s", "configId": "model", "value": "m"})),
        Just(json!([])),
    ];
    let message = prop_oneof![
        (method.clone(), id.clone(), params.clone())
            .prop_map(|(m, id, p)| json!({"jsonrpc": "2.0", "id": id, "method": m, "params": p})),
        (method, params).prop_map(|(m, p)| json!({"jsonrpc": "2.0", "method": m, "params": p})),
        (id.clone(), result).prop_map(|(id, r)| json!({"jsonrpc": "2.0", "id": id, "result": r})),
        id.prop_map(
            |id| json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": "boom"}})
        ),
        prop_oneof![
            Just("runtime_started"),
            Just("runtime_exited"),
            Just("fault"),
            Just("restart"),
            Just("drain"),
            Just("x")
        ]
        .prop_map(|e| json!({"event": e, "epoch": 1})),
        Just(json!(42)),
    ];
    (0..3u8, message, prop::option::of(0..4usize)).boxed()
}

#[test]
fn the_fold_keeps_its_invariants_on_random_frames() {
    bounded_sync(|| {
        let strategy = proptest::collection::vec(frame(), 0..40);
        runner(512)
            .run(&strategy, |frames| {
                let entries: Vec<_> = frames
                    .into_iter()
                    .enumerate()
                    .map(|(i, (direction, frame, action))| {
                        use agent_harness::domain::log::Direction;
                        let direction = [
                            Direction::ToRuntime,
                            Direction::FromRuntime,
                            Direction::Event,
                        ][usize::from(direction)];
                        fuzzing::entry(i as u64 + 1, direction, frame.to_string(), action, 1)
                    })
                    .collect();
                fuzzing::fold_entries(&entries);
                Ok(())
            })
            .unwrap_or_else(|failure| panic!("{failure}"));
        // And raw bytes, decoded as the fuzz target decodes them.
        runner(256)
            .run(&proptest::collection::vec(any::<u8>(), 0..400), |bytes| {
                fuzzing::fold_bytes(&bytes);
                fuzzing::runtime_lines_bytes(&bytes);
                Ok(())
            })
            .unwrap_or_else(|failure| panic!("{failure}"));
    });
}

// ---- a runtime's environment -----------------------------------------------------------------

/// Secrets the server is given through its environment.
const SERVER_SECRETS: &[(&str, &str)] = &[
    ("ANTHROPIC_API_KEY", "server-secret-anthropic-0001"),
    ("AWS_SECRET_ACCESS_KEY", "server-secret-aws-0002"),
    (
        "DATABASE_URL",
        "postgres://harness:server-secret-db-0003@db/harness",
    ),
    ("GITHUB_TOKEN", "server-secret-github-0004"),
];

// Multi-threaded: waiting for the server process's exit blocks a worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtimes_environment_and_descriptors_hold_none_of_the_servers_secrets() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        let data = base.join("data");
        std::fs::create_dir_all(&data).unwrap();
        let work = agent_harness_testkit::workspace_in(&base);
        let tokens = crate::auth::TokensFile::new(crate::auth::EVERYONE);
        let binary = env!("CARGO_BIN_EXE_agent-harness");
        let config = base.join("config.toml");
        std::fs::write(
            &config,
            format!(
                "[profiles.envcheck]\ncommand = {binary:?}\nargs = [\"mock-agent\"]\n\
                 env = {{ PROFILE_VISIBLE = \"yes\" }}\nallowed_cwd_roots = [{work:?}]\n\n\
                 [profiles.other]\ncommand = \"/bin/false\"\n\
                 env = {{ OTHER_PROFILE_SECRET = \"server-secret-other-profile-0005\" }}\n\
                 allowed_cwd_roots = [{work:?}]\n"
            ),
        )
        .unwrap();
        let ca = crate::tls::Ca::new("env CA");
        let server_cert = ca.issue(&["localhost"]);
        let (cert, key) = (base.join("server.pem"), base.join("server.key"));
        std::fs::write(&cert, &server_cert.cert).unwrap();
        std::fs::write(&key, &server_cert.key).unwrap();

        // The real binary, with secrets in its environment, config, tokens file and TLS key.
        let mut server = SERVER_SECRETS
            .iter()
            .fold(Serve::new(), |serve, (key, value)| serve.env(key, value))
            .arg("--data-dir")
            .arg(&data)
            .env("AGENT_HARNESS_CONFIG", &config)
            .env("AGENT_HARNESS_TOKENS_FILE", &tokens.path)
            .env("AGENT_HARNESS_TLS_CERT", &cert)
            .env("AGENT_HARNESS_TLS_KEY", &key)
            .env("RUST_LOG", "info")
            .start();
        let addr = server.addr();

        let channel =
            tonic::transport::Endpoint::from_shared(format!("https://localhost:{}", addr.port()))
                .unwrap()
                .tls_config(
                    tonic::transport::ClientTlsConfig::new()
                        .ca_certificate(tonic::transport::Certificate::from_pem(ca.pem()))
                        .domain_name("localhost"),
                )
                .unwrap()
                .connect()
                .await
                .expect("a TLS connection");
        let mut ada = pb::agent_session_service_client::AgentSessionServiceClient::with_interceptor(
            channel,
            crate::auth::Bearer::new(Some(crate::auth::ADA), None),
        );
        let session = ada
            .create_session(pb::CreateSessionRequest {
                profile: "envcheck".into(),
                cwd: work.to_string_lossy().into_owned(),
                ..Default::default()
            })
            .await
            .expect("a session")
            .into_inner()
            .session
            .unwrap();
        let mut watch = crate::auth::watch(&mut ada, &session.id).await;
        ada.control(crate::auth::control(&session.id, prompt("@env\n@fds")))
            .await
            .unwrap();
        let env = chunk_json(&watch.chunk("env: ").await, "env: ");
        let fds = chunk_json(&watch.chunk("fds: ").await, "fds: ");

        let env = env.as_object().expect("an object");
        let names: BTreeSet<&str> = env.keys().map(String::as_str).collect();
        // Besides the documented list: the marker that finds the runtime's descendants (a hash of
        // the data directory and ids, nothing of the server's), its stop grace (the profile's),
        // and what its box adds (who the agent is, where its proxy is).
        let allowed: BTreeSet<&str> = [
            "PATH",
            "HOME",
            "LANG",
            "PROFILE_VISIBLE",
            agent_harness::acp::process::MARKER_VAR,
            agent_harness::acp::process::STOP_GRACE_VAR,
        ]
        .into_iter()
        .chain(agent_harness::acp::sandbox::BOX_VARIABLES.iter().copied())
        .collect();
        assert!(
            names.is_subset(&allowed),
            "the runtime got more than a profile allows: {names:?}"
        );
        assert_eq!(
            env["PROFILE_VISIBLE"], "yes",
            "the profile's own env arrives"
        );
        let everything = serde_json::to_string(env).unwrap();
        assert!(
            !everything.contains("server-secret"),
            "a secret leaked: {everything}"
        );
        assert!(
            !everything.contains("AGENT_HARNESS"),
            "server settings leaked: {everything}"
        );

        // No descriptor of the server's: its store, tokens, config, TLS key, or sockets (the
        // agent has sockets of its own; a leaked one would be the same socket as the server's).
        let pid = server.pid();
        let server_sockets: BTreeSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .expect("the server's descriptors")
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .map(|target| target.to_string_lossy().into_owned())
            .filter(|target| target.starts_with("socket:"))
            .collect();
        assert!(
            !server_sockets.is_empty(),
            "the server has its listener and a connection"
        );
        for (fd, target) in fds.as_object().expect("an object") {
            let target = target.as_str().unwrap_or_default();
            assert!(
                !server_sockets.contains(target),
                "fd {fd} is the server's {target}"
            );
            for secret in [
                data.as_path(),
                tokens.path.as_path(),
                config.as_path(),
                key.as_path(),
            ] {
                assert!(
                    !target.starts_with(&*secret.to_string_lossy()),
                    "fd {fd} points at {target}"
                );
            }
        }

        // Open streams would hold the graceful stop.
        drop(watch);
        drop(ada);
        server.signal(libc::SIGTERM);
        let status = within(Duration::from_secs(20), server.wait()).await;
        assert!(status.success(), "{status:?}");
    })
    .await
}

fn chunk_json(frame: &Value, prefix: &str) -> Value {
    let text = frame["params"]["update"]["content"]["text"]
        .as_str()
        .expect("text");
    serde_json::from_str(text.strip_prefix(prefix).expect("the prefix")).expect("JSON")
}
