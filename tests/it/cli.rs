//! The people's subcommands run as processes against a real server: `prompt
//! --follow` streams the agent's text and ends with the stop reason, `--json` lines parse, a
//! permission is answered interactively under a pseudo-terminal, and a wrong token exits non-zero
//! with the reason.

use std::{
    io::Read,
    os::fd::{FromRawFd, OwnedFd},
    process::{Output, Stdio},
    sync::{Arc, Mutex},
};

use agent_harness::{
    app,
    pb::v1::{self as pb, message_part::Kind},
};
use agent_harness_testkit::service_bin;
use serde_json::Value;
use tokio::{process::Command, sync::Notify};

use crate::{
    auth,
    harness::{Harness, bounded},
    support::Session,
    tls::{self, Ca, Files},
};

/// `agent-harness ARGS…` pointed at the harness, with no token unless `token` is given.
pub(crate) fn cli(h: &Harness, token: Option<&str>, args: &[&str]) -> Command {
    let mut command = Command::new(service_bin());
    command
        .args(args)
        .env("AGENT_HARNESS_SERVER", format!("http://{}", h.addr()))
        .env_remove("AGENT_HARNESS_TOKEN")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if let Some(token) = token {
        command.env("AGENT_HARNESS_TOKEN", token);
    }
    command
}

pub(crate) async fn run(h: &Harness, args: &[&str]) -> Output {
    cli(h, None, args).output().await.expect("the CLI runs")
}

pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

pub(crate) async fn create_session(h: &Harness) -> String {
    let cwd = h.workspace().to_string_lossy().into_owned();
    let output = run(
        h,
        &["sessions", "create", "--profile", "mock", "--cwd", &cwd],
    )
    .await;
    assert!(
        output.status.success(),
        "create failed: {}",
        stderr(&output)
    );
    let id = stdout(&output).trim().to_owned();
    assert!(
        !id.is_empty() && !id.contains(' '),
        "create prints only the id: {id:?}"
    );
    id
}

#[tokio::test]
async fn prompt_follow_prints_the_streamed_text_and_ends_with_the_stop_reason() {
    bounded(async {
        let h = Harness::start().await;
        let id = create_session(&h).await;
        let output = run(
            &h,
            &["prompt", &id, "hello\n@chunks 2 8\n@tool t1", "--follow"],
        )
        .await;
        let text = stdout(&output);
        assert_eq!(
            output.status.code(),
            Some(0),
            "stdout: {text}\nstderr: {}",
            stderr(&output)
        );
        assert!(text.contains("echo: hello"), "{text}");
        // `@chunks 2 8`: two 8-byte chunks, streamed into one text.
        assert!(text.contains("#0:abcde#1:abcde"), "{text}");
        assert!(text.contains("Run t1 [completed]"), "{text}");
        assert!(
            text.trim_end().ends_with("turn 1 ended: end_turn"),
            "the last line is the stop reason: {text}"
        );
        // Piped output is plain: no escape sequences, no spinner.
        assert!(!text.contains('\x1b') && !stderr(&output).contains('\x1b'));

        let listed = run(&h, &["sessions", "list"]).await;
        assert!(stdout(&listed).contains(&id), "{}", stdout(&listed));
    })
    .await;
}

#[tokio::test]
async fn a_turn_that_does_not_end_well_exits_with_its_own_code() {
    bounded(async {
        let h = Harness::start().await;
        let id = create_session(&h).await;
        let output = run(&h, &["prompt", &id, "@stop refusal", "--follow"]).await;
        assert_eq!(output.status.code(), Some(7), "{}", stdout(&output));
        assert!(stdout(&output).contains("ended: refusal"));
    })
    .await;
}

#[tokio::test]
async fn json_lines_of_prompt_follow_and_log_each_parse() {
    bounded(async {
        let h = Harness::start().await;
        let id = create_session(&h).await;
        let output = run(&h, &["prompt", &id, "hello", "--follow", "--json"]).await;
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let lines: Vec<Value> = stdout(&output)
            .lines()
            .map(|line| serde_json::from_str(line).expect("each line is one JSON object"))
            .collect();
        let first = lines.first().expect("a first line");
        assert_eq!(first["type"], "control");
        assert_eq!(first["status"], "sent");
        let action_id = first["action_id"].as_str().expect("an action id");
        let last = lines.last().expect("a last line");
        assert_eq!(last["type"], "turn_ended");
        assert_eq!(last["request_id"], action_id);
        assert_eq!(last["stop_reason"], "end_turn");
        let agent_text = lines
            .iter()
            .filter(|l| l["type"] == "message" && l["message"]["role"] == "agent")
            .filter_map(|l| l["message"]["parts"][0]["text"].as_str())
            .next_back();
        assert_eq!(agent_text, Some("echo: hello"));

        let log = run(&h, &["log", &id, "--json"]).await;
        assert!(log.status.success(), "{}", stderr(&log));
        let offsets: Vec<u64> = stdout(&log)
            .lines()
            .map(|line| {
                let entry: Value = serde_json::from_str(line).expect("each log line parses");
                assert!(
                    entry["frame"].is_object(),
                    "the frame is embedded JSON: {line}"
                );
                entry["offset"].as_u64().expect("an offset")
            })
            .collect();
        assert_eq!(offsets, (1..=offsets.len() as u64).collect::<Vec<_>>());

        let after = run(&h, &["log", &id, "--json", "--after", "2"]).await;
        assert_eq!(stdout(&after).lines().count(), offsets.len() - 2);
    })
    .await;
}

#[tokio::test]
async fn a_wrong_token_exits_non_zero_with_the_reason() {
    bounded(async {
        let (h, _tokens) = auth::start().await;
        let output = cli(&h, Some("not-a-token"), &["sessions", "list"])
            .output()
            .await
            .expect("the CLI runs");
        assert_eq!(output.status.code(), Some(4));
        assert!(
            stderr(&output).contains("UNAUTHENTICATED"),
            "{}",
            stderr(&output)
        );

        let output = cli(&h, Some(auth::ADA), &["sessions", "list", "--json"])
            .output()
            .await
            .expect("the CLI runs");
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    })
    .await;
}

#[tokio::test]
async fn an_unknown_session_exits_with_not_found_and_its_reason() {
    bounded(async {
        let h = Harness::start().await;
        let output = run(
            &h,
            &["sessions", "show", "0190e0e0-0000-7000-8000-000000000000"],
        )
        .await;
        assert_eq!(output.status.code(), Some(5));
        assert!(
            stderr(&output).contains("SESSION_NOT_FOUND"),
            "{}",
            stderr(&output)
        );
    })
    .await;
}

/// A pseudo-terminal: the child gets the slave side as stdin, stdout and stderr; the test reads
/// everything it prints from the master side.
pub(crate) struct Pty {
    pub(crate) master: OwnedFd,
    pub(crate) slave: OwnedFd,
}

impl Pty {
    pub(crate) fn open() -> Self {
        let (mut master, mut slave) = (-1, -1);
        // SAFETY: openpty writes two new descriptors into the out-pointers; the others may be null.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: both are fresh descriptors owned by nothing else.
        unsafe {
            Self {
                master: OwnedFd::from_raw_fd(master),
                slave: OwnedFd::from_raw_fd(slave),
            }
        }
    }
}

/// What the terminal showed, without escape sequences, and a signal for each new read.
#[derive(Default)]
struct Screen {
    text: Mutex<String>,
    changed: Notify,
}

impl Screen {
    async fn wait_for(&self, needle: &str) {
        loop {
            let changed = self.changed.notified();
            if self.text.lock().unwrap().contains(needle) {
                return;
            }
            changed.await;
        }
    }
}

fn strip_escapes(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            chars.next();
        }
    }
    out
}

#[tokio::test]
async fn a_permission_is_answered_interactively_under_a_pseudo_terminal() {
    bounded(async {
        let h = Harness::start().await;
        let id = create_session(&h).await;
        let pty = Pty::open();
        let mut command = cli(&h, None, &["prompt", &id, "@permission Deploy", "--follow"]);
        command
            .env_remove("NO_COLOR")
            .stdin(Stdio::from(pty.slave.try_clone().unwrap()))
            .stdout(Stdio::from(pty.slave.try_clone().unwrap()))
            .stderr(Stdio::from(pty.slave.try_clone().unwrap()));
        let mut child = command.spawn().expect("the CLI starts");
        drop(pty.slave);

        let screen = Arc::new(Screen::default());
        let mut reader = std::fs::File::from(pty.master.try_clone().unwrap());
        let feed = screen.clone();
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            // Ends with EIO once the child has exited and the slave side is closed.
            while let Ok(n @ 1..) = reader.read(&mut buffer) {
                let chunk = String::from_utf8_lossy(&buffer[..n]);
                feed.text.lock().unwrap().push_str(&strip_escapes(&chunk));
                feed.changed.notify_waiters();
            }
        });

        screen.wait_for("choose for permission").await;
        {
            let text = screen.text.lock().unwrap();
            assert!(text.contains("Deploy"), "{text}");
            assert!(text.contains("1) Allow once [allow-once]"), "{text}");
        }
        let mut writer = std::fs::File::from(pty.master);
        std::io::Write::write_all(&mut writer, b"1\n").expect("typing the choice");

        screen.wait_for("ended: end_turn").await;
        let status = child.wait().await.expect("the CLI exits");
        assert_eq!(status.code(), Some(0), "{}", screen.text.lock().unwrap());

        let mut session = Session::attach(h.sessions(), &id);
        let transcript = session.transcript().await;
        let permission = transcript.messages[1]
            .parts
            .iter()
            .find_map(|p| match &p.kind {
                Some(Kind::Permission(p)) => Some(p.clone()),
                _ => None,
            })
            .expect("a permission part");
        assert_eq!(permission.outcome(), pb::InteractionOutcome::Selected);
        assert_eq!(permission.selected_option_id.as_deref(), Some("allow-once"));
    })
    .await;
}

#[tokio::test]
async fn help_teaches_by_example_and_lists_the_exit_codes() {
    let output = Command::new(service_bin())
        .args(["prompt", "--help"])
        .output()
        .await
        .expect("the CLI runs");
    let text = stdout(&output);
    assert!(
        text.contains("Examples:") && text.contains("--follow"),
        "{text}"
    );
    assert!(
        text.contains("Exit codes:") && text.contains("AGENT_HARNESS_TOKEN"),
        "{text}"
    );
}

#[tokio::test]
async fn answer_settles_a_held_permission_and_an_elicitation_by_request_id() {
    bounded(async {
        let h = Harness::start().await;
        let id = create_session(&h).await;
        let mut session = Session::attach(h.sessions(), &id);
        let mut watch = session.watch().await;

        let sent = run(&h, &["prompt", &id, "@permission Deploy\n@elicit form"]).await;
        assert!(sent.status.success(), "{}", stderr(&sent));
        assert!(stdout(&sent).starts_with("sent "), "{}", stdout(&sent));
        let (_, request) = watch
            .entry(|_, f| f["method"] == "session/request_permission")
            .await;
        let permission_id = request["id"].to_string();

        let nothing_pending = run(&h, &["answer", &id, "999", "--option", "allow-once"]).await;
        assert_eq!(nothing_pending.status.code(), Some(6));
        let answered = run(
            &h,
            &["answer", &id, &permission_id, "--option", "allow-once"],
        )
        .await;
        assert_eq!(answered.status.code(), Some(0), "{}", stderr(&answered));

        let (_, request) = watch
            .entry(|_, f| f["method"] == "elicitation/create")
            .await;
        let elicitation_id = request["id"].clone();
        let accepted = run(
            &h,
            &[
                "answer",
                &id,
                &elicitation_id.to_string(),
                "--accept",
                "name=Ada",
            ],
        )
        .await;
        assert_eq!(accepted.status.code(), Some(0), "{}", stderr(&accepted));
        let (_, response) = watch
            .entry(move |_, f| f["id"] == elicitation_id && f["method"].is_null())
            .await;
        assert_eq!(response["result"]["action"], "accept", "{response}");
        assert_eq!(response["result"]["content"]["name"], "Ada", "{response}");
    })
    .await;
}

/// `agent-harness ARGS…` pointed at a TLS server on `port` by its certificate's name, with
/// `--ca-file`, `--cert` and `--key` taken only from `args` (none inherited from the environment).
fn cli_over_https(port: u16, args: &[&str]) -> Command {
    let mut command = Command::new(service_bin());
    command
        .args(args)
        .env("AGENT_HARNESS_SERVER", format!("https://localhost:{port}"))
        .env_remove("AGENT_HARNESS_TOKEN")
        .env_remove("AGENT_HARNESS_CA_FILE")
        .env_remove("AGENT_HARNESS_CERT")
        .env_remove("AGENT_HARNESS_KEY")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

#[tokio::test]
async fn a_cli_call_over_https_trusting_the_given_ca_succeeds() {
    bounded(async {
        let (data, files, ca) = (
            tempfile::tempdir().unwrap(),
            Files::new(),
            Ca::new("server CA"),
        );
        let server = app::start(tls::config(&data, files.server(&ca, None)))
            .await
            .expect("the TLS server starts");
        let port = server.local_addr().port();
        let ca_file = files.write("ca.pem", &ca.pem());
        let work = tempfile::tempdir().unwrap();
        let cwd = work.path().to_string_lossy().into_owned();

        let output = cli_over_https(port, &["sessions", "create", "--cwd", &cwd])
            .env("AGENT_HARNESS_CA_FILE", &ca_file)
            .output()
            .await
            .expect("the CLI runs");
        assert!(output.status.success(), "create: {}", stderr(&output));
        let id = stdout(&output).trim().to_owned();

        let ca_file = ca_file.to_string_lossy().into_owned();
        let output = cli_over_https(port, &["sessions", "list", "--ca-file", &ca_file])
            .output()
            .await
            .expect("the CLI runs");
        assert!(output.status.success(), "list: {}", stderr(&output));
        assert!(stdout(&output).contains(&id), "{}", stdout(&output));
        server.shutdown().await.unwrap();
    })
    .await
}

#[tokio::test]
async fn a_cli_call_to_an_https_server_it_does_not_trust_exits_with_the_tls_code() {
    bounded(async {
        let (data, files, ca) = (
            tempfile::tempdir().unwrap(),
            Files::new(),
            Ca::new("server CA"),
        );
        let server = app::start(tls::config(&data, files.server(&ca, None)))
            .await
            .expect("the TLS server starts");
        let port = server.local_addr().port();
        let other = files.write("other.pem", &Ca::new("another CA").pem());
        let other = other.to_string_lossy().into_owned();

        for args in [
            &["sessions", "list"][..],
            &["sessions", "list", "--ca-file", &other][..],
        ] {
            let output = cli_over_https(port, args)
                .output()
                .await
                .expect("the CLI runs");
            assert_eq!(
                output.status.code(),
                Some(8),
                "{args:?}: {}",
                stderr(&output)
            );
            assert!(
                stderr(&output).contains("invalid peer certificate"),
                "{args:?}: {}",
                stderr(&output)
            );
        }
        server.shutdown().await.unwrap();
    })
    .await
}

#[tokio::test]
async fn with_mutual_tls_the_cli_presents_the_certificate_given_by_cert_and_key() {
    bounded(async {
        let (data, files) = (tempfile::tempdir().unwrap(), Files::new());
        let (server_ca, client_ca) = (Ca::new("server CA"), Ca::new("client CA"));
        let server = app::start(tls::config(
            &data,
            files.server(&server_ca, Some(&client_ca)),
        ))
        .await
        .expect("the mTLS server starts");
        let port = server.local_addr().port();
        let ca_file = files.write("ca.pem", &server_ca.pem());
        let laptop = client_ca.issue(&["ada-laptop"]);
        let cert = files.write("laptop.pem", &laptop.cert);
        let key = files.write("laptop.key", &laptop.key);

        let output = cli_over_https(port, &["sessions", "list"])
            .env("AGENT_HARNESS_CA_FILE", &ca_file)
            .env("AGENT_HARNESS_CERT", &cert)
            .env("AGENT_HARNESS_KEY", &key)
            .output()
            .await
            .expect("the CLI runs");
        assert!(output.status.success(), "{}", stderr(&output));

        let output = cli_over_https(port, &["sessions", "list"])
            .env("AGENT_HARNESS_CA_FILE", &ca_file)
            .output()
            .await
            .expect("the CLI runs");
        assert!(
            !output.status.success(),
            "served without a client certificate"
        );
        server.shutdown().await.unwrap();
    })
    .await
}

#[tokio::test]
async fn tls_options_with_a_plaintext_server_are_a_usage_error() {
    bounded(async {
        let output = Command::new(service_bin())
            .args(["sessions", "list", "--server", "http://127.0.0.1:9"])
            .args(["--ca-file", "/nonexistent/ca.pem"])
            .env_remove("AGENT_HARNESS_TOKEN")
            .stdin(Stdio::null())
            .output()
            .await
            .expect("the CLI runs");
        assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
        assert!(
            stderr(&output).contains("need an https://"),
            "{}",
            stderr(&output)
        );
    })
    .await
}

/// Something on `127.0.0.1` that is no gRPC server: it reads what the client sends first, answers
/// `answer`, and then closes the connection or (`hold`) keeps it open until the client leaves.
async fn not_grpc(answer: &'static [u8], hold: bool) -> (u16, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let port = listener.local_addr().expect("bound").port();
    let task = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut first = [0u8; 1024];
                let _ = socket.read(&mut first).await;
                let _ = socket.write_all(answer).await;
                if hold {
                    let mut rest = [0u8; 1024];
                    while matches!(socket.read(&mut rest).await, Ok(n) if n > 0) {}
                }
            });
        }
    });
    (port, task)
}

const MOVED: &[u8] = b"HTTP/1.1 301 Moved Permanently\r\nLocation: https://harness.example/\r\n\
    Content-Length: 0\r\nConnection: close\r\n\r\n";
const PLAIN_HTTP: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 13\r\n\r\n\
    <html></html>";

/// `agent-harness ARGS…` with no server or token from the environment.
fn bare_cli(args: &[&str]) -> Command {
    let mut command = Command::new(service_bin());
    command
        .args(args)
        .env_remove("AGENT_HARNESS_SERVER")
        .env_remove("AGENT_HARNESS_TOKEN")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

#[tokio::test]
async fn a_server_that_answers_http_1_is_reported_and_never_kills_the_cli() {
    bounded(async {
        for (answer, hold) in [
            (MOVED, false),
            (MOVED, true),
            (PLAIN_HTTP, false),
            (PLAIN_HTTP, true),
        ] {
            let (port, listener) = not_grpc(answer, hold).await;
            let server = format!("http://ada:s3cret@127.0.0.1:{port}");
            let output = bare_cli(&["sessions", "list", "--server", &server])
                .output()
                .await
                .expect("the CLI runs");
            let said = stderr(&output);
            let case = String::from_utf8_lossy(&answer[..12]);
            assert_eq!(
                output.status.code(),
                Some(3),
                "{case} hold={hold}: not killed by a signal ({:?}), a clear error: {said}",
                output.status
            );
            assert!(
                said.contains("error: ") && said.contains(&format!("127.0.0.1:{port}")),
                "{case} hold={hold}: {said}"
            );
            assert!(!said.contains("s3cret"), "{said}");
            listener.abort();
        }
    })
    .await
}

#[tokio::test]
async fn output_to_a_reader_that_has_gone_ends_quietly() {
    bounded(async {
        let h = Harness::start().await;
        create_session(&h).await;
        // `agent-harness sessions list | head -0`: the reading end is closed before the first
        // line is written.
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        // Not `output()`, which would replace stdout with a pipe of its own.
        let output = cli(&h, None, &["sessions", "list"])
            .stdout(writer)
            .stderr(Stdio::piped())
            .spawn()
            .expect("the CLI starts")
            .wait_with_output()
            .await
            .expect("the CLI runs");
        assert_eq!(output.status.code(), Some(0), "{output:?}");
        assert_eq!(stderr(&output), "", "quietly");
    })
    .await
}

#[tokio::test]
async fn a_password_in_the_server_url_is_never_printed() {
    bounded(async {
        // Nothing listens on port 1; the second URL does not parse.
        for (server, code) in [
            ("http://ada:s3cret@127.0.0.1:1", 3),
            ("http://ada:s3cret@bad host:1", 2),
        ] {
            let output = bare_cli(&["sessions", "list", "--server", server])
                .output()
                .await
                .expect("the CLI runs");
            let said = stderr(&output);
            assert_eq!(output.status.code(), Some(code), "{said}");
            assert!(said.contains("ada:***@"), "names the server: {said}");
            assert!(!said.contains("s3cret"), "{said}");
        }
    })
    .await
}

/// An address of no host on this network (TEST-NET-1): the call fails, after the warning.
const FAR_AWAY: &str = "http://192.0.2.1:9";
const CLEARTEXT_WARNING: &str = "plain http://";

#[tokio::test]
async fn a_token_bound_for_another_host_over_plain_http_is_warned_about_first() {
    bounded(async {
        let h = Harness::start().await;
        let with_token = async {
            bare_cli(&["sessions", "list", "--server", FAR_AWAY])
                .env("AGENT_HARNESS_TOKEN", "t0ken")
                .output()
                .await
                .expect("the CLI runs")
        };
        let without_token = async {
            bare_cli(&["sessions", "list", "--server", FAR_AWAY])
                .output()
                .await
                .expect("the CLI runs")
        };
        let (with_token, without_token) = tokio::join!(with_token, without_token);
        let said = stderr(&with_token);
        assert!(said.starts_with("warning: "), "{said}");
        assert!(
            said.contains(CLEARTEXT_WARNING) && said.contains("192.0.2.1"),
            "{said}"
        );
        assert!(!said.contains("t0ken"), "{said}");
        assert!(
            !stderr(&without_token).contains(CLEARTEXT_WARNING),
            "no token, nothing to warn about: {}",
            stderr(&without_token)
        );

        // To this machine there is nothing to warn about.
        let output = cli(&h, Some("t0ken"), &["sessions", "list"])
            .output()
            .await
            .expect("the CLI runs");
        assert!(
            !stderr(&output).contains(CLEARTEXT_WARNING),
            "{}",
            stderr(&output)
        );
    })
    .await
}

/// The bridge's stderr up to the line containing `until` (or its end).
async fn bridge_stderr_until(connect: &str, until: &str) -> String {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let dir = tempfile::tempdir().expect("a temporary dir");
    let config = dir.path().join("bridge.toml");
    std::fs::write(
        &config,
        format!(
            "bridge_id = \"warned\"\ndata_dir = {:?}\n",
            dir.path().join("data").to_string_lossy()
        ),
    )
    .expect("the config is written");
    let token = dir.path().join("token");
    std::fs::write(&token, "t0ken").expect("the token is written");
    let mut child = Command::new(service_bin())
        .arg("bridge")
        .arg("--connect")
        .arg(connect)
        .arg("--config")
        .arg(&config)
        .arg("--token-file")
        .arg(&token)
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the bridge starts");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut seen = String::new();
    while let Ok(Some(line)) = lines.next_line().await {
        seen.push_str(&line);
        seen.push('\n');
        if line.contains(until) {
            break;
        }
    }
    let _ = child.kill().await;
    seen
}

#[tokio::test]
async fn the_bridge_warns_before_sending_its_token_over_plain_http_to_another_host() {
    bounded(async {
        let far = bridge_stderr_until("http://ada:s3cret@192.0.2.1:9", "bridge starting").await;
        let warning = far
            .lines()
            .find(|line| line.contains(CLEARTEXT_WARNING))
            .unwrap_or_else(|| panic!("a warning: {far}"));
        assert!(
            warning.contains("WARN") && warning.contains("192.0.2.1"),
            "{warning}"
        );
        assert!(!far.contains("s3cret") && !far.contains("t0ken"), "{far}");

        let near = bridge_stderr_until("http://127.0.0.1:9", "bridge starting").await;
        assert!(near.contains("bridge starting"), "{near}");
        assert!(!near.contains(CLEARTEXT_WARNING), "{near}");
    })
    .await
}

/// Mends of the first hour: `queue ID --json`, `prompt ID -`, `answer ID` off a terminal, the
/// token hint and `usage` each do what their help says.
#[tokio::test]
async fn queue_takes_json_without_list_and_a_prompt_of_dash_is_read_from_stdin() {
    bounded(async {
        let h = Harness::start().await;
        let id = create_session(&h).await;
        let mut session = Session::attach(h.sessions(), &id);
        let mut watch = session.watch().await;
        // A held permission keeps the first turn running; the second prompt queues.
        let held = run(&h, &["prompt", &id, "@permission Deploy"]).await;
        assert!(held.status.success(), "{}", stderr(&held));
        watch
            .entry(|_, f| f["method"] == "session/request_permission")
            .await;
        let mut piped = cli(&h, None, &["prompt", &id, "-"]);
        piped
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = piped.spawn().unwrap();
        {
            use tokio::io::AsyncWriteExt;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(b"from stdin\nsecond line\n").await.unwrap();
        }
        let sent = child.wait_with_output().await.unwrap();
        assert!(sent.status.success(), "{}", stderr(&sent));
        let listed = run(&h, &["queue", &id, "--json"]).await;
        assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
        let lines: Vec<Value> = stdout(&listed)
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON lines"))
            .collect();
        assert_eq!(lines.len(), 1, "{}", stdout(&listed));
        assert_eq!(lines[0]["prompt"], "from stdin\nsecond line\n");
        // Off a terminal, `answer` without a request id says what waits and how to answer it.
        let answer = run(&h, &["answer", &id]).await;
        assert_eq!(answer.status.code(), Some(2));
        assert!(
            stderr(&answer).contains(&format!("agent-harness answer {id} ")),
            "{}",
            stderr(&answer)
        );
        assert!(
            stderr(&answer).contains("--option allow"),
            "{}",
            stderr(&answer)
        );
        // An empty stdin is refused before anything is sent.
        let empty = run(&h, &["prompt", &id, "-"]).await;
        assert_eq!(empty.status.code(), Some(2));
        assert!(stderr(&empty).contains("empty"), "{}", stderr(&empty));
    })
    .await;
}

#[tokio::test]
async fn a_refused_token_names_agent_harness_token_and_usage_sums_what_was_used() {
    bounded(async {
        let (h, _tokens) = auth::start().await;
        let output = cli(&h, None, &["sessions", "list"]).output().await.unwrap();
        assert_eq!(output.status.code(), Some(4));
        assert!(
            stderr(&output).contains("set AGENT_HARNESS_TOKEN"),
            "{}",
            stderr(&output)
        );
        let output = cli(&h, Some("wrong"), &["sessions", "list"])
            .output()
            .await
            .unwrap();
        assert!(
            stderr(&output).contains("the token in AGENT_HARNESS_TOKEN was refused"),
            "{}",
            stderr(&output)
        );
        assert_eq!(stderr(&output).lines().count(), 1, "{}", stderr(&output));
    })
    .await;
    bounded(async {
        let h = Harness::start().await;
        let id = create_session(&h).await;
        let turn = run(
            &h,
            &[
                "prompt",
                &id,
                "count\n@usage 100 200000 0.25 USD",
                "--follow",
            ],
        )
        .await;
        assert_eq!(turn.status.code(), Some(0), "{}", stderr(&turn));
        let usage = run(&h, &["usage", "--json"]).await;
        assert_eq!(usage.status.code(), Some(0), "{}", stderr(&usage));
        let answer: Value = serde_json::from_str(stdout(&usage).trim()).unwrap();
        assert_eq!(answer["profiles"][0]["profile"], "mock", "{answer}");
        assert_eq!(answer["sources"][0]["source"], "agent", "{answer}");
        let text = stdout(&run(&h, &["usage", "--sessions"]).await);
        assert!(text.contains("by profile:") && text.contains(&id), "{text}");
    })
    .await;
}

#[tokio::test]
async fn off_a_terminal_a_followed_turn_says_how_to_answer_its_held_permission() {
    bounded(async {
        let h = Harness::start().await;
        let id = create_session(&h).await;
        let mut follow = cli(&h, None, &["prompt", &id, "@permission Deploy", "--follow"]);
        follow.stderr(Stdio::piped()).stdout(Stdio::piped());
        let mut child = follow.spawn().unwrap();
        let mut stderr_pipe = child.stderr.take().unwrap();
        let mut seen = String::new();
        while !seen.contains("--option") {
            use tokio::io::AsyncReadExt;
            let mut buffer = [0u8; 1024];
            let n = stderr_pipe.read(&mut buffer).await.unwrap();
            assert!(n > 0, "stderr ended without the hint: {seen}");
            seen.push_str(&String::from_utf8_lossy(&buffer[..n]));
        }
        assert!(
            seen.contains(&format!("agent-harness answer {id} ")),
            "{seen}"
        );
        child.kill().await.unwrap();
    })
    .await;
}
