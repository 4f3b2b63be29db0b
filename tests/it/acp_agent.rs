//! `agent-harness acp`: the harness as an ACP agent, run as a child process and driven over its
//! stdin/stdout as an ACP client drives an agent, against a real server. A small client here
//! (`Peer`) does what an editor would; the tests with third-party ACP clients (acpx and the
//! Python SDK) are at the end, ignored in a plain `cargo test` and run by `scripts/test
//! acp-agent`, which installs those clients.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use agent_harness::pb::v1::{self as pb, message_part::Kind, subscribe_response::Event};
use agent_harness_testkit::service_bin;
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines},
    process::{Child, ChildStdin, ChildStdout, Command},
};

use crate::{
    harness::{Harness, bounded, within},
    support::Session,
};

/// An ACP client of one `agent-harness acp` process.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    next_id: i64,
    /// Every message the agent sent, in order.
    seen: Vec<Value>,
    /// Messages read while waiting for something else, not yet handed out by `next`.
    unread: std::collections::VecDeque<Value>,
}

fn acp_command(server: &str, args: &[&str]) -> Command {
    let mut command = Command::new(service_bin());
    command
        .arg("acp")
        .args(args)
        .env("AGENT_HARNESS_SERVER", server)
        .env_remove("AGENT_HARNESS_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    command
}

impl Peer {
    fn spawn_on(server: &str, args: &[&str]) -> Self {
        let mut child = acp_command(server, args)
            .spawn()
            .expect("agent-harness acp starts");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        Self {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            next_id: 1,
            seen: Vec::new(),
            unread: Default::default(),
        }
    }

    fn spawn(h: &Harness) -> Self {
        Self::spawn_on(&format!("http://{}", h.addr()), &["--profile", "mock"])
    }

    async fn write(&mut self, line: &str) {
        self.stdin.write_all(line.as_bytes()).await.expect("write");
        self.stdin.write_all(b"\n").await.expect("write");
        self.stdin.flush().await.expect("flush");
    }

    async fn send(&mut self, method: &str, params: Value) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.write(&line.to_string()).await;
        id
    }

    async fn notify(&mut self, method: &str, params: Value) {
        let line = json!({"jsonrpc": "2.0", "method": method, "params": params});
        self.write(&line.to_string()).await;
    }

    async fn read(&mut self) -> Value {
        let line = self
            .lines
            .next_line()
            .await
            .expect("stdout reads")
            .expect("the agent keeps stdout open");
        let message: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("stdout carries only JSON-RPC: {line:?}: {e}"));
        self.seen.push(message.clone());
        message
    }

    /// The next message: one read earlier and kept, else a new one.
    async fn next(&mut self) -> Value {
        match self.unread.pop_front() {
            Some(message) => message,
            None => self.read().await,
        }
    }

    /// Waits for a message that matches; the others stay for `next`.
    async fn until(&mut self, matches: impl Fn(&Value) -> bool) -> Value {
        if let Some(at) = self.unread.iter().position(&matches) {
            return self.unread.remove(at).expect("there");
        }
        loop {
            let message = self.read().await;
            if matches(&message) {
                return message;
            }
            self.unread.push_back(message);
        }
    }

    async fn response(&mut self, id: i64) -> Value {
        self.until(|m| m["id"] == id && m.get("method").is_none())
            .await
    }

    async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params).await;
        self.response(id).await
    }

    async fn initialize(&mut self) -> Value {
        let answer = self
            .call(
                "initialize",
                json!({"protocolVersion": 1, "clientCapabilities": {}, "clientInfo": {"name": "test", "version": "1"}}),
            )
            .await;
        assert!(answer.get("result").is_some(), "initialize: {answer}");
        answer["result"].clone()
    }

    async fn new_session(&mut self, cwd: &Path) -> String {
        let answer = self
            .call("session/new", json!({"cwd": cwd, "mcpServers": []}))
            .await;
        answer["result"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("session/new: {answer}"))
            .to_owned()
    }

    /// A new session in `cwd` answers a prompt to its end: the process serves on.
    async fn still_serves(&mut self, cwd: &Path) {
        let session = self.new_session(cwd).await;
        let answer = self
            .call(
                "session/prompt",
                json!({"sessionId": session, "prompt": [{"type": "text", "text": "still here"}]}),
            )
            .await;
        assert_eq!(answer["result"]["stopReason"], "end_turn");
    }

    /// The agent's request (to this client) with this method.
    async fn agent_request(&mut self, method: &str) -> Value {
        let method = method.to_owned();
        self.until(move |m| m["method"] == method.as_str() && m.get("id").is_some())
            .await
    }

    async fn reply(&mut self, id: &Value, result: Value) {
        let line = json!({"jsonrpc": "2.0", "id": id, "result": result});
        self.write(&line.to_string()).await;
    }

    /// The texts of every agent message chunk seen so far, in order.
    fn agent_texts(&self) -> Vec<String> {
        self.chunks("agent_message_chunk")
    }

    fn chunks(&self, kind: &str) -> Vec<String> {
        self.seen
            .iter()
            .filter(|m| {
                m["method"] == "session/update" && m["params"]["update"]["sessionUpdate"] == kind
            })
            .filter_map(|m| {
                m["params"]["update"]["content"]["text"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect()
    }
}

fn cwd(h: &Harness) -> PathBuf {
    h.workspace()
}

#[tokio::test]
async fn an_acp_client_runs_a_prompt_and_reads_the_mock_agents_reply_as_updates() {
    bounded(async {
        let h = Harness::start().await;
        let mut peer = Peer::spawn(&h);
        let init = peer.initialize().await;
        assert_eq!(init["agentInfo"]["name"], "agent-harness");
        assert_eq!(init["agentCapabilities"]["loadSession"], true);
        assert!(init["agentCapabilities"]["sessionCapabilities"]["resume"].is_object());
        let session = peer.new_session(&cwd(&h)).await;
        let answer = peer
            .call(
                "session/prompt",
                json!({"sessionId": session, "prompt": [{"type": "text", "text": "hello"}]}),
            )
            .await;
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
        assert_eq!(peer.agent_texts(), ["echo: hello"]);
        // Every update names the harness session, not the agent's own id.
        assert!(
            peer.seen
                .iter()
                .filter(|m| m["method"] == "session/update")
                .all(|m| m["params"]["sessionId"] == session.as_str())
        );
        // The harness's log holds the turn.
        let mut harness_session = Session::attach(h.sessions(), &session);
        let frames = harness_session.sent_frames().await;
        assert!(
            frames
                .iter()
                .any(|f| f["method"] == "session/prompt"
                    && f["params"]["prompt"][0]["text"] == "hello"),
            "{frames:?}"
        );
    })
    .await
}

#[tokio::test]
async fn two_acp_clients_see_every_update_of_both_turns_in_order_and_the_second_prompt_waits_its_turn()
 {
    bounded(async {
        let h = Harness::start().await;
        let mut first = Peer::spawn(&h);
        first.initialize().await;
        let session = first.new_session(&cwd(&h)).await;
        let mut second = Peer::spawn(&h);
        second.initialize().await;
        let resumed = second
            .call(
                "session/resume",
                json!({"sessionId": session, "cwd": cwd(&h), "mcpServers": []}),
            )
            .await;
        assert!(resumed.get("result").is_some(), "{resumed}");
        let mut watch = Session::attach(h.sessions(), &session).watch().await;

        // The first client's turn waits on a permission; the second prompts meanwhile.
        let first_prompt = first
            .send(
                "session/prompt",
                json!({"sessionId": session, "prompt": [{"type": "text", "text": "@permission"}]}),
            )
            .await;
        let asked = first.agent_request("session/request_permission").await;
        let second_prompt = second
            .send(
                "session/prompt",
                json!({"sessionId": session, "prompt": [{"type": "text", "text": "second"}]}),
            )
            .await;
        // It is queued behind the running turn.
        loop {
            match watch.next().await.expect("open").expect("ok").event {
                Some(Event::Queue(queue)) if queue.entries.len() == 1 => {
                    assert_eq!(queue.entries[0].prompt.as_deref(), Some("second"));
                    break;
                }
                _ => {}
            }
        }
        // The second client was asked too; the first answers, so the second's is withdrawn.
        let asked_second = second.agent_request("session/request_permission").await;
        first
            .reply(
                &asked["id"],
                json!({"outcome": {"outcome": "selected", "optionId": "allow-once"}}),
            )
            .await;
        let withdrawn = second.until(|m| m["method"] == "$/cancel_request").await;
        assert_eq!(withdrawn["params"]["requestId"], asked_second["id"]);

        assert_eq!(
            first.response(first_prompt).await["result"]["stopReason"],
            "end_turn"
        );
        assert_eq!(
            second.response(second_prompt).await["result"]["stopReason"],
            "end_turn"
        );
        // The first client reads the second's turn to its end too.
        first
            .until(|m| m["params"]["update"]["content"]["text"] == "echo: second")
            .await;
        let expected = [
            "echo: @permission",
            "permission: selected allow-once",
            "echo: second",
        ];
        assert_eq!(first.agent_texts(), expected);
        assert_eq!(second.agent_texts(), expected);
        // Each sees the other's prompt as user text, never its own again.
        assert_eq!(first.chunks("user_message_chunk"), ["second"]);
        assert_eq!(second.chunks("user_message_chunk"), ["@permission"]);
    })
    .await
}

#[tokio::test]
async fn a_permission_answered_from_the_cli_is_withdrawn_from_the_waiting_acp_client() {
    bounded(async {
        let h = Harness::start().await;
        let mut peer = Peer::spawn(&h);
        peer.initialize().await;
        let session = peer.new_session(&cwd(&h)).await;
        let prompt = peer
            .send(
                "session/prompt",
                json!({"sessionId": session, "prompt": [{"type": "text", "text": "@permission"}]}),
            )
            .await;
        let asked = peer.agent_request("session/request_permission").await;
        assert_eq!(asked["params"]["sessionId"], session.as_str());
        let request_id = pending_permission(&h, &session).await;
        let answered = Command::new(service_bin())
            .args(["answer", &session, &request_id, "--option", "reject-once"])
            .env("AGENT_HARNESS_SERVER", format!("http://{}", h.addr()))
            .env_remove("AGENT_HARNESS_TOKEN")
            .output()
            .await
            .expect("the CLI runs");
        assert!(answered.status.success(), "{answered:?}");
        let withdrawn = peer.until(|m| m["method"] == "$/cancel_request").await;
        assert_eq!(withdrawn["params"]["requestId"], asked["id"]);
        assert_eq!(
            peer.response(prompt).await["result"]["stopReason"],
            "end_turn"
        );
        assert_eq!(
            peer.agent_texts(),
            ["echo: @permission", "permission: selected reject-once"]
        );
    })
    .await
}

/// The agent's id of the one permission the session holds, as `agent-harness answer` takes it.
async fn pending_permission(h: &Harness, session: &str) -> String {
    let transcript = Session::attach(h.sessions(), session).transcript().await;
    transcript
        .messages
        .iter()
        .flat_map(|m| &m.parts)
        .find_map(|part| match &part.kind {
            Some(Kind::Permission(p)) if p.outcome() == pb::InteractionOutcome::Pending => {
                match p.request_id.as_ref()?.id.as_ref()? {
                    pb::json_rpc_id::Id::Number(n) => Some(n.to_string()),
                    pb::json_rpc_id::Id::Text(t) => Some(t.clone()),
                }
            }
            _ => None,
        })
        .expect("a pending permission")
}

#[tokio::test]
async fn a_client_killed_mid_turn_leaves_the_turn_running_and_a_new_process_replays_it_on_load() {
    bounded(async {
        let h = Harness::start().await;
        let mut peer = Peer::spawn(&h);
        peer.initialize().await;
        let session = peer.new_session(&cwd(&h)).await;
        peer.send(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": "@permission"}]}),
        )
        .await;
        peer.agent_request("session/request_permission").await;
        peer.child.kill().await.expect("killed");

        // The turn goes on: answered from elsewhere, it ends.
        let mut harness_session = Session::attach(h.sessions(), &session);
        let mut watch = harness_session.watch().await;
        let request_id = pending_permission(&h, &session).await;
        harness_session
            .act(crate::support::permission_answer(
                crate::support::number_id(
                    request_id.parse().expect("the mock numbers its requests"),
                ),
                Some("allow-once"),
            ))
            .await
            .expect("answered");
        loop {
            if let Some(Event::TurnEnded(ended)) =
                watch.next().await.expect("open").expect("ok").event
            {
                assert_eq!(ended.stop_reason(), pb::StopReason::EndTurn);
                break;
            }
        }

        let mut again = Peer::spawn(&h);
        again.initialize().await;
        let loaded = again
            .call(
                "session/load",
                json!({"sessionId": session, "cwd": cwd(&h), "mcpServers": []}),
            )
            .await;
        assert!(loaded.get("result").is_some(), "{loaded}");
        assert_eq!(again.chunks("user_message_chunk"), ["@permission"]);
        assert_eq!(
            again.agent_texts(),
            ["echo: @permission", "permission: selected allow-once"]
        );
        // Nothing held any more, so nothing is asked.
        assert!(
            !again
                .seen
                .iter()
                .any(|m| m["method"] == "session/request_permission")
        );
        // And the session goes on from the new process.
        let answer = again
            .call(
                "session/prompt",
                json!({"sessionId": session, "prompt": [{"type": "text", "text": "after"}]}),
            )
            .await;
        assert_eq!(answer["result"]["stopReason"], "end_turn");
        assert_eq!(
            again.agent_texts().last().map(String::as_str),
            Some("echo: after")
        );
    })
    .await
}

#[tokio::test]
async fn bad_lines_unknown_methods_and_unknown_sessions_get_json_rpc_errors_and_the_process_keeps_serving()
 {
    bounded(async {
        let h = Harness::start().await;
        let mut peer = Peer::spawn(&h);
        peer.write("this is not json").await;
        let parse = peer.next().await;
        assert_eq!(parse["error"]["code"], -32700, "{parse}");
        assert_eq!(parse["id"], Value::Null);
        peer.write(r#"{"jsonrpc":"2.0","id":"x","method":7}"#).await;
        assert_eq!(peer.next().await["error"]["code"], -32600);
        let unknown = peer.call("session/teleport", json!({})).await;
        assert_eq!(unknown["error"]["code"], -32601, "{unknown}");
        peer.initialize().await;
        let bad_params = peer.call("session/prompt", json!({"prompt": "nope"})).await;
        assert_eq!(bad_params["error"]["code"], -32602, "{bad_params}");
        let missing = peer
            .call(
                "session/prompt",
                json!({"sessionId": uuid_v7(), "prompt": [{"type": "text", "text": "hi"}]}),
            )
            .await;
        assert_eq!(
            missing["error"]["data"]["reason"], "SESSION_NOT_FOUND",
            "{missing}"
        );
        // Still serving.
        peer.still_serves(&cwd(&h)).await;
    })
    .await
}

/// The most memory the process ever held (`VmHWM`), in bytes.
fn peak_memory(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .expect("VmHWM");
    kib * 1024
}

#[tokio::test]
async fn a_line_that_is_not_utf8_or_over_the_limit_is_answered_and_skipped_without_being_held() {
    bounded(async {
        let h = Harness::start().await;
        let mut peer = Peer::spawn(&h);
        let pid = peer.child.id().expect("running");
        peer.stdin.write_all(b"\xff\xfe{}\n").await.unwrap();
        let parse = peer.next().await;
        assert_eq!(parse["error"]["code"], -32700, "{parse}");
        assert_eq!(parse["id"], Value::Null);

        // 256 MiB in one line, over the 16 MiB default: refused, and read as it comes.
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..256 {
            peer.stdin.write_all(&chunk).await.unwrap();
        }
        peer.stdin.write_all(b"\n").await.unwrap();
        peer.stdin.flush().await.unwrap();
        let refused = peer.next().await;
        assert_eq!(refused["error"]["code"], -32600, "{refused}");
        assert_eq!(
            refused["error"]["data"]["reason"], "LIMIT_EXCEEDED",
            "{refused}"
        );
        assert_eq!(refused["id"], Value::Null);
        let peak = peak_memory(pid);
        assert!(
            peak < 128 << 20,
            "the process held {} MiB at most; the line was 256 MiB",
            peak >> 20
        );

        // Still serving.
        peer.initialize().await;
        peer.still_serves(&cwd(&h)).await;
    })
    .await
}

fn uuid_v7() -> String {
    // A well-formed id no session has.
    "01890a5d-ac96-774b-bcce-b302099a8057".to_owned()
}

#[tokio::test]
async fn an_unreachable_server_fails_initialize_with_a_clear_message() {
    bounded(async {
        // A port that was just free: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        let server = format!("http://127.0.0.1:{port}");
        let mut peer = Peer::spawn_on(&server, &["--profile", "mock"]);
        let answer = peer
            .call(
                "initialize",
                json!({"protocolVersion": 1, "clientCapabilities": {}}),
            )
            .await;
        let message = answer["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{answer}"));
        assert!(
            message.contains("cannot reach") && message.contains(&server),
            "{message}"
        );
        assert_eq!(answer["error"]["data"]["reason"], "UNAVAILABLE");
    })
    .await
}

/// A session with this client's turn running (held until cancelled) and a second prompt of its
/// queued behind it: the session, the two JSON-RPC ids, and the queued action's id.
async fn a_running_turn_and_a_queued_prompt(
    h: &Harness,
    peer: &mut Peer,
    queued_text: &str,
) -> (String, i64, i64, String) {
    peer.initialize().await;
    let session = peer.new_session(&cwd(h)).await;
    let mut watch = Session::attach(h.sessions(), &session).watch().await;
    let running = peer
        .send(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": "@wait-cancel"}]}),
        )
        .await;
    let queued = peer
        .send(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": queued_text}]}),
        )
        .await;
    let action_id = loop {
        match watch.next().await.expect("open").expect("ok").event {
            Some(Event::Queue(queue)) if queue.entries.len() == 1 => {
                break queue.entries[0].action_id.clone();
            }
            _ => {}
        }
    };
    (session, running, queued, action_id)
}

#[tokio::test]
async fn a_cancel_stops_the_clients_running_turn_and_takes_its_queued_prompt_out_of_the_queue() {
    bounded(async {
        let h = Harness::start().await;
        let mut peer = Peer::spawn(&h);
        let (session, running, queued, _) =
            a_running_turn_and_a_queued_prompt(&h, &mut peer, "never run").await;
        peer.notify("session/cancel", json!({"sessionId": session}))
            .await;
        assert_eq!(
            peer.response(queued).await["result"]["stopReason"],
            "cancelled"
        );
        assert_eq!(
            peer.response(running).await["result"]["stopReason"],
            "cancelled"
        );
        let frames = Session::attach(h.sessions(), &session).sent_frames().await;
        assert!(
            !frames
                .iter()
                .any(|f| f["params"]["prompt"][0]["text"] == "never run"),
            "the queued prompt never reached the agent"
        );
    })
    .await
}

#[tokio::test]
async fn a_queued_prompt_removed_by_someone_else_is_answered_cancelled_and_the_running_turn_goes_on()
 {
    bounded(async {
        let h = Harness::start().await;
        let mut peer = Peer::spawn(&h);
        let (session, running, queued, action_id) =
            a_running_turn_and_a_queued_prompt(&h, &mut peer, "removed elsewhere").await;
        // Another caller (a person with `agent-harness queue rm`, the console) removes it.
        h.sessions()
            .remove_queued_action(pb::RemoveQueuedActionRequest {
                session_id: session.clone(),
                action_id,
            })
            .await
            .expect("removed");
        assert_eq!(
            peer.response(queued).await["result"]["stopReason"],
            "cancelled"
        );
        // The running turn is untouched until this client cancels it.
        peer.notify("session/cancel", json!({"sessionId": session}))
            .await;
        assert_eq!(
            peer.response(running).await["result"]["stopReason"],
            "cancelled"
        );
        let frames = Session::attach(h.sessions(), &session).sent_frames().await;
        assert!(
            !frames
                .iter()
                .any(|f| f["params"]["prompt"][0]["text"] == "removed elsewhere"),
            "the removed prompt never reached the agent"
        );
    })
    .await
}

#[tokio::test]
async fn an_elicitation_goes_to_a_client_that_handles_them_and_its_answer_reaches_the_agent() {
    bounded(async {
        let h = Harness::start().await;
        let mut peer = Peer::spawn(&h);
        let init = peer
            .call(
                "initialize",
                json!({"protocolVersion": 1, "clientCapabilities": {"elicitation": {"form": {}}}}),
            )
            .await;
        assert!(init.get("result").is_some(), "{init}");
        let session = peer.new_session(&cwd(&h)).await;
        let prompt = peer
            .send(
                "session/prompt",
                json!({"sessionId": session, "prompt": [{"type": "text", "text": "@elicit form"}]}),
            )
            .await;
        let asked = peer.agent_request("elicitation/create").await;
        assert_eq!(asked["params"]["sessionId"], session.as_str());
        assert_eq!(asked["params"]["mode"], "form");
        peer.reply(
            &asked["id"],
            json!({"action": "accept", "content": {"name": "Ada"}}),
        )
        .await;
        assert_eq!(
            peer.response(prompt).await["result"]["stopReason"],
            "end_turn"
        );
        assert_eq!(
            peer.agent_texts().last().map(String::as_str),
            Some(r#"elicitation: accept {"name":"Ada"}"#)
        );
    })
    .await
}

#[tokio::test]
async fn a_process_pinned_to_a_session_attaches_to_it_on_session_new_and_replays_its_history() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("before the editor").await;
        watch.response_to(&turn.action_id).await;
        let mut peer = Peer::spawn_on(&format!("http://{}", h.addr()), &["--session", &session.id]);
        peer.initialize().await;
        let attached = peer.new_session(&cwd(&h)).await;
        assert_eq!(attached, session.id);
        peer.until(|m| m["params"]["update"]["content"]["text"] == "echo: before the editor")
            .await;
        assert_eq!(peer.chunks("user_message_chunk"), ["before the editor"]);
    })
    .await
}

#[tokio::test]
async fn session_list_and_close_map_onto_the_harness_sessions() {
    bounded(async {
        let h = Harness::start().await;
        let mut peer = Peer::spawn(&h);
        peer.initialize().await;
        let session = peer.new_session(&cwd(&h)).await;
        let listed = peer.call("session/list", json!({})).await;
        let sessions = listed["result"]["sessions"].as_array().expect("sessions");
        assert!(
            sessions.iter().any(|s| s["sessionId"] == session.as_str()),
            "{listed}"
        );
        let closed = peer
            .call("session/close", json!({"sessionId": session}))
            .await;
        assert!(closed.get("result").is_some(), "{closed}");
        let state = Session::attach(h.sessions(), &session).get().await;
        assert_eq!(state.status(), pb::SessionStatus::Closed);
        let refused = peer
            .call(
                "session/prompt",
                json!({"sessionId": session, "prompt": [{"type": "text", "text": "hi"}]}),
            )
            .await;
        assert_eq!(
            refused["error"]["data"]["reason"], "SESSION_CLOSED",
            "{refused}"
        );
    })
    .await
}

#[tokio::test]
async fn a_config_option_set_through_acp_answers_with_the_agents_new_options() {
    bounded(async {
        let h = Harness::start().await;
        let mut peer = Peer::spawn(&h);
        peer.initialize().await;
        let session = peer.new_session(&cwd(&h)).await;
        let set = peer
            .call(
                "session/set_config_option",
                json!({"sessionId": session, "configId": "model", "value": "mock-smart"}),
            )
            .await;
        let options = set["result"]["configOptions"]
            .as_array()
            .unwrap_or_else(|| panic!("{set}"));
        let model = options
            .iter()
            .find(|o| o["id"] == "model")
            .expect("model option");
        assert_eq!(model["currentValue"], "mock-smart");
        let refused = peer
            .call(
                "session/set_config_option",
                json!({"sessionId": session, "configId": "model", "value": "no-such-model"}),
            )
            .await;
        assert!(refused.get("error").is_some(), "{refused}");
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// Third-party ACP clients: acpx and the Python SDK (installed by `scripts/test acp-agent`).

fn required(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run these through `scripts/test acp-agent`, which installs the ACP clients")
    })
}

/// A limit for the tests that start Node or Python clients.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(90);

#[tokio::test]
#[ignore = "needs acpx: run by scripts/test acp-agent"]
async fn acpx_runs_a_prompt_through_agent_harness_acp_and_a_second_invocation_continues_the_session()
 {
    within(CLIENT_TIMEOUT, async {
        let acpx = required("AGENT_HARNESS_ACPX");
        let h = Harness::start().await;
        let home = tempfile::tempdir().expect("a home for acpx");
        let work = tempfile::tempdir().expect("a work dir");
        let agent = format!("{} acp --profile mock", service_bin().display());
        let run = |args: &[&str]| {
            let mut command = Command::new(&acpx);
            command
                .args(["--agent", &agent, "--cwd"])
                .arg(work.path())
                // acpx keeps the agent for a second after each invocation, no longer.
                .args(["--approve-all", "--format", "quiet", "--ttl", "1"])
                .args(args)
                .env("HOME", home.path())
                .env("AGENT_HARNESS_SERVER", format!("http://{}", h.addr()))
                .env_remove("AGENT_HARNESS_TOKEN")
                .kill_on_drop(true);
            command
        };
        let created = run(&["sessions", "new"]).output().await.expect("acpx runs");
        assert!(created.status.success(), "acpx sessions new: {created:?}");
        let first = run(&["prompt", "hello from acpx"])
            .output()
            .await
            .expect("acpx runs");
        let stdout = String::from_utf8_lossy(&first.stdout);
        assert!(first.status.success(), "acpx prompt: {first:?}");
        assert!(stdout.contains("echo: hello from acpx"), "{stdout}");

        // The harness holds the turn, in one session.
        let listed = h
            .sessions()
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .expect("listed")
            .into_inner()
            .sessions;
        assert_eq!(listed.len(), 1, "{listed:?}");
        let session = listed[0].id.clone();
        let frames = Session::attach(h.sessions(), &session).sent_frames().await;
        assert!(
            frames
                .iter()
                .any(|f| f["params"]["prompt"][0]["text"] == "hello from acpx")
        );

        // A second invocation attaches to the same session and goes on, from a new agent
        // process: acpx's owner of the first (and its `agent-harness acp`) is gone by then.
        let queues = home.path().join(".acpx/queues");
        while std::fs::read_dir(&queues).is_ok_and(|mut entries| entries.next().is_some()) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let second = run(&["prompt", "and again"])
            .output()
            .await
            .expect("acpx runs");
        let stdout = String::from_utf8_lossy(&second.stdout);
        assert!(second.status.success(), "acpx prompt: {second:?}");
        assert!(stdout.contains("echo: and again"), "{stdout}");
        let listed = h
            .sessions()
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .expect("listed")
            .into_inner()
            .sessions;
        assert_eq!(listed.len(), 1, "still one session: {listed:?}");
        let frames = Session::attach(h.sessions(), &session).sent_frames().await;
        let prompts: Vec<_> = frames
            .iter()
            .filter(|f| f["method"] == "session/prompt")
            .map(|f| f["params"]["prompt"][0]["text"].clone())
            .collect();
        assert_eq!(prompts, [json!("hello from acpx"), json!("and again")]);
    })
    .await
}

#[tokio::test]
#[ignore = "needs the ACP Python SDK: run by scripts/test acp-agent"]
async fn the_python_sdk_client_prompts_answers_a_permission_sees_one_withdrawn_and_loads_the_session()
 {
    within(CLIENT_TIMEOUT, async {
        let python = required("AGENT_HARNESS_ACP_PYTHON");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/acp/sdk_client.py");
        let h = Harness::start().await;
        let mut client = Command::new(python)
            .arg(script)
            .arg(service_bin())
            .arg(cwd(&h))
            .env("AGENT_HARNESS_SERVER", format!("http://{}", h.addr()))
            .env_remove("AGENT_HARNESS_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("python runs");
        let mut lines = BufReader::new(client.stdout.take().expect("stdout")).lines();
        let mut session = String::new();
        let mut said = Vec::new();
        while let Some(line) = lines.next_line().await.expect("reads") {
            eprintln!("sdk client: {line}");
            if let Some(id) = line.strip_prefix("SESSION ") {
                session = id.to_owned();
            }
            if line == "WAITING" {
                // The client waits on a permission: answer it from the CLI.
                let request_id = pending_permission(&h, &session).await;
                let answered = Command::new(service_bin())
                    .args(["answer", &session, &request_id, "--option", "reject-once"])
                    .env("AGENT_HARNESS_SERVER", format!("http://{}", h.addr()))
                    .env_remove("AGENT_HARNESS_TOKEN")
                    .output()
                    .await
                    .expect("the CLI runs");
                assert!(answered.status.success(), "{answered:?}");
            }
            said.push(line);
        }
        let status = client.wait().await.expect("exits");
        assert!(status.success(), "the SDK client failed: {said:?}");
        for expected in [
            "AGENT echo: hello",
            "ANSWERED allow-once",
            "AGENT permission: selected allow-once",
            "WITHDRAWN",
            "AGENT permission: selected reject-once",
            "REPLAYED echo: hello",
            "AGENT echo: after load",
            "OK",
        ] {
            assert!(
                said.iter().any(|l| l == expected),
                "{expected:?} not in {said:?}"
            );
        }
    })
    .await
}
