//! The mock agent driven in-process over `tokio::io::duplex`, with the harness's own frame
//! builders where the harness has one. Every frame the agent writes is also parsed into the
//! `agent-client-protocol-schema` type for its method, so a wrong wire shape fails loudly.

use std::{
    collections::HashMap,
    future::Future,
    io,
    sync::{Arc, Mutex},
    time::Duration,
};

use agent_client_protocol_schema::v1 as acp;
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines},
    task::JoinHandle,
};

use super::{MockAgentArgs, run_with_stderr};
use agent_harness::acp::frames::{self as acp_frames, ConfigValue, ReopenMethod};
use agent_harness::domain::{
    action::{
        ElicitationAnswer, ElicitationValue, JsonRpcId, PermissionAnswer, PromptAction,
        PromptAttachment,
    },
    action_id::ActionId,
};

/// Every test body runs under this bound: a hang fails instead of blocking the suite.
async fn within<F: Future>(body: F) -> F::Output {
    agent_harness_testkit::within(Duration::from_secs(10), body).await
}

/// stderr captured in memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// The client side: what the harness would be.
struct Client {
    input: Option<DuplexStream>,
    output: Lines<BufReader<DuplexStream>>,
    agent: JoinHandle<io::Result<i32>>,
    stderr: Captured,
    next_id: i64,
    /// The method of each request the client sent, by id, to check the answer's shape.
    sent: HashMap<String, String>,
    session: String,
}

fn start(flags: &[&str]) -> Client {
    start_with_buffer(flags, 64 * 1024)
}

fn start_with_buffer(flags: &[&str], buffer: usize) -> Client {
    let args = MockAgentArgs::from_flags(flags).expect("valid flags");
    let (input, agent_input) = tokio::io::duplex(buffer);
    let (agent_output, output) = tokio::io::duplex(buffer);
    let stderr = Captured::default();
    let agent_stderr = stderr.clone();
    let agent = tokio::spawn(async move {
        run_with_stderr(&args, agent_input, agent_output, agent_stderr).await
    });
    Client {
        input: Some(input),
        output: BufReader::new(output).lines(),
        agent,
        stderr,
        next_id: 0,
        sent: HashMap::new(),
        session: String::new(),
    }
}

/// Parses `value` as `T`, naming what failed.
fn conforms<T: serde::de::DeserializeOwned>(what: &str, value: &Value) {
    if let Err(error) = serde_json::from_value::<T>(value.clone()) {
        panic!("{what} is not ACP v1: {error}\n{value:#}");
    }
}

#[test]
fn the_conformance_check_rejects_wrong_shapes() {
    for bad in [
        json!({"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunks",
               "content": {"type": "text", "text": "x"}}}),
        json!({"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk"}}),
        json!({"update": {"sessionUpdate": "agent_message_chunk",
               "content": {"type": "text", "text": "x"}}}),
        json!({"sessionId": "s", "update": {"sessionUpdate": "tool_call", "title": "no id"}}),
    ] {
        assert!(
            serde_json::from_value::<acp::SessionNotification>(bad.clone()).is_err(),
            "{bad}"
        );
    }
}

fn is_response(frame: &Value) -> bool {
    frame.get("method").is_none()
}

/// The text of an `agent_message_chunk` with a text block, if `frame` is one.
fn agent_text(frame: &Value) -> Option<&str> {
    let update = frame.pointer("/params/update")?;
    (update["sessionUpdate"] == "agent_message_chunk" && update["content"]["type"] == "text")
        .then(|| update["content"]["text"].as_str())
        .flatten()
}

fn agent_texts(frames: &[Value]) -> Vec<&str> {
    frames.iter().filter_map(agent_text).collect()
}

fn stop_reason(response: &Value) -> &str {
    response["result"]["stopReason"]
        .as_str()
        .unwrap_or_else(|| panic!("not a prompt result: {response}"))
}

impl Client {
    async fn send(&mut self, frame: &Value) {
        if let Some(method) = frame.get("method").and_then(Value::as_str)
            && let Some(id) = frame.get("id")
        {
            self.sent.insert(id.to_string(), method.to_owned());
        }
        let input = self.input.as_mut().expect("input still open");
        let mut line = serde_json::to_vec(frame).unwrap();
        line.push(b'\n');
        input.write_all(&line).await.unwrap();
        input.flush().await.unwrap();
    }

    async fn send_raw(&mut self, line: &str) {
        let input = self.input.as_mut().expect("input still open");
        input.write_all(line.as_bytes()).await.unwrap();
        input.write_all(b"\n").await.unwrap();
    }

    fn close_input(&mut self) {
        self.input = None;
    }

    /// The next line the agent wrote, raw; `None` at end of output.
    async fn next_line(&mut self) -> Option<String> {
        self.output.next_line().await.expect("readable output")
    }

    /// The next frame, checked against the ACP schema for its method.
    async fn next(&mut self) -> Value {
        let line = self.next_line().await.expect("a frame, not end of output");
        let frame: Value = serde_json::from_str(&line)
            .unwrap_or_else(|error| panic!("not JSON ({error}): {line}"));
        self.check(&frame);
        frame
    }

    fn check(&self, frame: &Value) {
        assert_eq!(frame["jsonrpc"], "2.0", "{frame}");
        let params = &frame["params"];
        match frame.get("method").and_then(Value::as_str) {
            Some("session/update") => {
                conforms::<acp::SessionNotification>("session/update", params)
            }
            Some("session/request_permission") => {
                conforms::<acp::RequestPermissionRequest>("session/request_permission", params);
            }
            Some("elicitation/create") => {
                conforms::<acp::CreateElicitationRequest>("elicitation/create", params);
            }
            Some("elicitation/complete") => {
                conforms::<acp::CompleteElicitationNotification>("elicitation/complete", params);
            }
            Some("$/cancel_request") => {
                conforms::<acp::CancelRequestNotification>("$/cancel_request", params);
            }
            Some("fs/read_text_file") => {
                conforms::<acp::ReadTextFileRequest>("fs/read_text_file", params);
            }
            Some(other) => panic!("unexpected method from the agent: {other}"),
            None => {
                if let Some(error) = frame.get("error") {
                    conforms::<acp::Error>("an error", error);
                    return;
                }
                let result = &frame["result"];
                let method = self.sent.get(&frame["id"].to_string()).map(String::as_str);
                match method {
                    Some("initialize") => conforms::<acp::InitializeResponse>("initialize", result),
                    Some("session/new") => {
                        conforms::<acp::NewSessionResponse>("session/new", result)
                    }
                    Some("session/load") => {
                        conforms::<acp::LoadSessionResponse>("session/load", result);
                    }
                    Some("session/resume") => {
                        conforms::<acp::ResumeSessionResponse>("session/resume", result);
                    }
                    Some("session/prompt") => {
                        conforms::<acp::PromptResponse>("session/prompt", result)
                    }
                    Some("session/set_config_option") => {
                        conforms::<acp::SetSessionConfigOptionResponse>(
                            "set_config_option",
                            result,
                        );
                    }
                    _ => panic!("a result for a request the client never sent: {frame}"),
                }
            }
        }
    }

    /// Frames up to and including the response to `id`.
    async fn until_response(&mut self, id: &Value) -> (Vec<Value>, Value) {
        let mut before = Vec::new();
        loop {
            let frame = self.next().await;
            if is_response(&frame) && frame["id"] == *id {
                return (before, frame);
            }
            before.push(frame);
        }
    }

    /// Frames up to and including the next one that is a request from the agent.
    async fn until_agent_request(&mut self) -> (Vec<Value>, Value) {
        let mut before = Vec::new();
        loop {
            let frame = self.next().await;
            if frame.get("method").is_some() && frame.get("id").is_some() {
                return (before, frame);
            }
            before.push(frame);
        }
    }

    fn mint_id(&mut self) -> Value {
        self.next_id += 1;
        json!(self.next_id)
    }

    /// Sends a request and returns its response, with nothing else in between.
    async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.mint_id();
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        let (before, response) = self.until_response(&id).await;
        assert!(
            before.is_empty(),
            "unexpected frames before the response: {before:?}"
        );
        response
    }

    async fn initialize(&mut self) -> Value {
        let id = self.mint_id();
        self.send(&acp_frames::initialize_request(id.clone())).await;
        self.until_response(&id).await.1
    }

    async fn new_session(&mut self) -> Value {
        let id = self.mint_id();
        self.send(&acp_frames::new_session_request(id.clone(), "/tmp"))
            .await;
        self.until_response(&id).await.1
    }

    /// `initialize` then `session/new`; remembers the session id.
    async fn handshake(&mut self) -> Value {
        let init = self.initialize().await;
        assert!(init.get("result").is_some(), "{init}");
        let new = self.new_session().await;
        self.session = new["result"]["sessionId"].as_str().unwrap().to_owned();
        new
    }

    /// Sends a prompt exactly as the harness does (text, links, hidden block); returns its id.
    async fn prompt_with(&mut self, text: &str, attachments: Vec<PromptAttachment>) -> Value {
        let action_id = ActionId::mint();
        let action = PromptAction::with_attachments(text, attachments);
        let frame =
            acp_frames::prompt_request(&action_id, &self.session, &action, Default::default());
        self.send(&frame).await;
        frame["id"].clone()
    }

    async fn prompt(&mut self, text: &str) -> Value {
        self.prompt_with(text, Vec::new()).await
    }

    /// A prompt's updates and its response.
    async fn turn(&mut self, text: &str) -> (Vec<Value>, Value) {
        let id = self.prompt(text).await;
        self.until_response(&id).await
    }

    async fn cancel(&mut self) {
        let frame = acp_frames::cancel_notification(&self.session);
        self.send(&frame).await;
    }

    async fn answer(&mut self, request: &Value, result: Value) {
        self.send(&json!({"jsonrpc": "2.0", "id": request["id"], "result": result}))
            .await;
    }

    async fn answer_error(&mut self, request: &Value, code: i64, message: &str) {
        self.send(&acp_frames::error_response(&request["id"], code, message))
            .await;
    }

    async fn answer_permission(&mut self, request: &Value, answer: PermissionAnswer) {
        let id = JsonRpcId::from_json(&request["id"]).unwrap();
        self.send(&acp_frames::permission_response(&id, &answer))
            .await;
    }

    async fn answer_elicitation(&mut self, request: &Value, answer: ElicitationAnswer) {
        let id = JsonRpcId::from_json(&request["id"]).unwrap();
        self.send(&acp_frames::elicitation_response(&id, &answer))
            .await;
    }

    /// Closes stdin, reads the rest of the output, and returns it with the exit code.
    async fn finish(mut self) -> (Vec<String>, i32) {
        self.close_input();
        let mut rest = Vec::new();
        while let Some(line) = self.next_line().await {
            rest.push(line);
        }
        let code = self.agent.await.unwrap().unwrap();
        (rest, code)
    }
}

fn selected(option_id: &str) -> PermissionAnswer {
    PermissionAnswer::Selected {
        option_id: option_id.to_owned(),
    }
}

// ---------------------------------------------------------------- handshake and sessions

#[tokio::test]
async fn the_handshake_answers_protocol_1_without_resume_or_load_and_with_the_model_option() {
    within(async {
        let mut client = start(&[]);
        let init = client.initialize().await;
        assert_eq!(
            init["result"],
            json!({
                "protocolVersion": 1,
                "agentCapabilities": {
                    "loadSession": false,
                    "promptCapabilities": {"image": false, "audio": false, "embeddedContext": false},
                    "mcpCapabilities": {"http": false, "sse": false},
                    "sessionCapabilities": {},
                },
                "authMethods": [],
                "agentInfo": {"name": "agent-harness-mock", "title": "agent-harness mock agent",
                              "version": env!("CARGO_PKG_VERSION")},
            })
        );
        let new = client.new_session().await;
        assert_eq!(
            new["result"],
            json!({"sessionId": "mock-session-1", "configOptions": [
                {"id": "model", "name": "Model", "category": "model", "type": "select",
                 "currentValue": "mock-fast",
                 "options": [{"value": "mock-fast", "name": "mock-fast"},
                             {"value": "mock-smart", "name": "mock-smart"}]}]})
        );
        let (rest, code) = client.finish().await;
        assert!(rest.is_empty());
        assert_eq!(code, 0);
    })
    .await;
}

#[tokio::test]
async fn session_ids_count_up_from_one_and_models_options_follow_the_flags() {
    within(async {
        let mut client = start(&[
            "--models",
            "m1,m2,m3",
            "--config-option",
            "effort=low|high",
            "--bool-option",
            "web",
        ]);
        client.initialize().await;
        let first = client.new_session().await;
        let second = client.new_session().await;
        assert_eq!(first["result"]["sessionId"], "mock-session-1");
        assert_eq!(second["result"]["sessionId"], "mock-session-2");
        let options = &first["result"]["configOptions"];
        assert_eq!(options[0]["currentValue"], "m1");
        assert_eq!(options[0]["options"].as_array().unwrap().len(), 3);
        assert_eq!(
            options[1],
            json!({"id": "effort", "name": "effort", "type": "select", "currentValue": "low",
                   "options": [{"value": "low", "name": "low"}, {"value": "high", "name": "high"}]})
        );
        assert_eq!(
            options[2],
            json!({"id": "web", "name": "web", "type": "boolean", "currentValue": false})
        );

        let mut bare = start(&["--no-models"]);
        bare.initialize().await;
        let new = bare.new_session().await;
        assert_eq!(new["result"], json!({"sessionId": "mock-session-1"}));
    })
    .await;
}

#[tokio::test]
async fn resume_and_load_are_neither_advertised_nor_served_without_their_flags() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        for method in [ReopenMethod::Resume, ReopenMethod::Load] {
            let id = client.mint_id();
            client
                .send(&acp_frames::reopen_session_request(
                    id.clone(),
                    method,
                    "mock-session-1",
                    "/tmp",
                ))
                .await;
            let (before, response) = client.until_response(&id).await;
            assert!(before.is_empty());
            assert_eq!(response["error"]["code"], -32601, "{method:?}");
        }
    })
    .await;
}

#[tokio::test]
async fn resume_is_advertised_and_accepts_any_session_with_the_resume_flag() {
    within(async {
        let mut client = start(&["--resume"]);
        let init = client.initialize().await;
        assert_eq!(
            init["result"]["agentCapabilities"]["sessionCapabilities"],
            json!({"resume": {}})
        );
        assert_eq!(init["result"]["agentCapabilities"]["loadSession"], false);
        let id = client.mint_id();
        client
            .send(&acp_frames::reopen_session_request(
                id.clone(),
                ReopenMethod::Resume,
                "some-old-session",
                "/tmp",
            ))
            .await;
        let (before, response) = client.until_response(&id).await;
        assert!(before.is_empty(), "resume replays nothing");
        assert_eq!(response["result"]["configOptions"][0]["id"], "model");
        // The resumed session takes prompts.
        client.session = "some-old-session".into();
        let (updates, done) = client.turn("hi").await;
        assert_eq!(agent_texts(&updates), ["echo: hi"]);
        assert_eq!(stop_reason(&done), "end_turn");
    })
    .await;
}

/// Asks `client` to resume (or load) `session`; its answer.
async fn reopen(client: &mut Client, method: ReopenMethod, session: &str) -> Value {
    let id = client.mint_id();
    let frame = acp_frames::reopen_session_request(id.clone(), method, session, "/tmp");
    client.send(&frame).await;
    client.until_response(&id).await.1
}

#[tokio::test]
async fn with_a_session_dir_a_session_reopens_in_another_process_only_once_its_file_is_written() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let dir_flag = dir.path().to_str().unwrap();
        let lazy = [
            "--resume",
            "--load",
            "--session-dir",
            dir_flag,
            "--save-delay",
            "60000",
        ];
        let mut first = start(&lazy);
        first.handshake().await;
        let session = first.session.clone();
        assert!(session.starts_with("mock-session-"), "{session}");
        let (_, done) = first.turn("hi").await;
        assert_eq!(stop_reason(&done), "end_turn");
        // Still in memory only: another process does not find it.
        let mut other = start(&lazy);
        other.initialize().await;
        for method in [ReopenMethod::Resume, ReopenMethod::Load] {
            let refused = reopen(&mut other, method, &session).await;
            assert_eq!(refused["error"]["code"], -32002, "{refused}");
            assert!(
                refused["error"]["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("Resource not found"),
                "{refused}"
            );
        }
        // The end of its input is a stop: the file is written before it exits.
        let (_, code) = first.finish().await;
        assert_eq!(code, 0);
        let resumed = reopen(&mut other, ReopenMethod::Resume, &session).await;
        assert!(resumed.get("result").is_some(), "{resumed}");
        other.session = session;
        let (updates, done) = other.turn("again").await;
        assert_eq!(agent_texts(&updates), ["echo: again"]);
        assert_eq!(stop_reason(&done), "end_turn");
    })
    .await;
}

#[tokio::test]
async fn a_crash_loses_a_lazily_written_session_and_an_unknown_one_is_not_found() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let dir_flag = dir.path().to_str().unwrap();
        let lazy = [
            "--resume",
            "--session-dir",
            dir_flag,
            "--save-delay",
            "60000",
        ];
        let mut first = start(&lazy);
        first.handshake().await;
        let session = first.session.clone();
        first.prompt("@crash 9").await;
        // Its input stays open (its end would be a stop): the crash ends the output.
        while first.next_line().await.is_some() {}
        assert_eq!(first.agent.await.unwrap().unwrap(), 9);
        let mut other = start(&lazy);
        other.initialize().await;
        let refused = reopen(&mut other, ReopenMethod::Resume, &session).await;
        assert_eq!(refused["error"]["code"], -32002, "{refused}");
        let never = reopen(&mut other, ReopenMethod::Resume, "never-created").await;
        assert_eq!(never["error"]["code"], -32002, "{never}");
        // Without a delay the file is written at once.
        let mut eager = start(&["--resume", "--session-dir", dir_flag]);
        eager.handshake().await;
        let session = eager.session.clone();
        let resumed = reopen(&mut other, ReopenMethod::Resume, &session).await;
        assert!(resumed.get("result").is_some(), "{resumed}");
    })
    .await;
}

#[tokio::test]
async fn loading_a_session_replays_a_user_and_an_agent_chunk_before_answering() {
    within(async {
        let mut client = start(&["--load"]);
        let init = client.initialize().await;
        assert_eq!(init["result"]["agentCapabilities"]["loadSession"], true);
        assert_eq!(
            init["result"]["agentCapabilities"]["sessionCapabilities"],
            json!({})
        );
        let id = client.mint_id();
        client
            .send(&acp_frames::reopen_session_request(
                id.clone(),
                ReopenMethod::Load,
                "old-7",
                "/tmp",
            ))
            .await;
        let (replay, response) = client.until_response(&id).await;
        let updates: Vec<Value> = replay.iter().map(|f| f["params"].clone()).collect();
        assert_eq!(
            updates,
            [
                json!({"sessionId": "old-7", "update": {"sessionUpdate": "user_message_chunk",
                       "content": {"type": "text", "text": "(replayed) earlier prompt"}}}),
                json!({"sessionId": "old-7", "update": {"sessionUpdate": "agent_message_chunk",
                       "content": {"type": "text", "text": "(replayed) earlier answer"}}}),
            ]
        );
        assert!(response["result"]["configOptions"].is_array());
    })
    .await;
}

// ---------------------------------------------------------------- prompts

#[tokio::test]
async fn a_prompt_with_two_links_is_echoed_back_with_both_links_in_order() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let links = vec![
            PromptAttachment::new("https://static.example/file/1", "screenshot.png")
                .mime_type("image/png")
                .size(2048),
            PromptAttachment::new("https://static.example/file/2", "notes.txt"),
        ];
        let id = client
            .prompt_with("what is wrong here?\nsecond line", links)
            .await;
        let (updates, done) = client.until_response(&id).await;
        let contents: Vec<&Value> = updates
            .iter()
            .map(|f| {
                assert_eq!(f["params"]["sessionId"], "mock-session-1");
                assert_eq!(f["params"]["update"]["sessionUpdate"], "agent_message_chunk");
                &f["params"]["update"]["content"]
            })
            .collect();
        assert_eq!(
            contents,
            [
                &json!({"type": "text", "text": "echo: what is wrong here?\nsecond line"}),
                &json!({"type": "resource_link", "name": "screenshot.png",
                        "uri": "https://static.example/file/1", "mimeType": "image/png", "size": 2048}),
                &json!({"type": "resource_link", "name": "notes.txt",
                        "uri": "https://static.example/file/2"}),
            ],
            "the hidden invocation block is not echoed"
        );
        assert_eq!(done["result"], json!({"stopReason": "end_turn"}));
        assert_eq!(done["id"], id);
    })
    .await;
}

#[tokio::test]
async fn a_prompt_of_links_only_has_no_echo_chunk() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let id = client
            .prompt_with("", vec![PromptAttachment::new("https://a.example/x", "x")])
            .await;
        let (updates, done) = client.until_response(&id).await;
        assert_eq!(updates.len(), 1);
        assert_eq!(
            updates[0]["params"]["update"]["content"]["type"],
            "resource_link"
        );
        assert_eq!(stop_reason(&done), "end_turn");
    })
    .await;
}

#[tokio::test]
async fn user_text_blocks_are_joined_by_newlines_and_blocks_with_meta_are_hidden() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let id = json!("raw-1");
        let session = client.session.clone();
        client
            .send(
                &json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt", "params": {
                "sessionId": session, "prompt": [
                    {"type": "text", "text": "one"},
                    {"type": "text", "text": "hidden", "_meta": {"anything": 1}},
                    {"type": "text", "text": "two"},
                ]}}),
            )
            .await;
        let (updates, done) = client.until_response(&id).await;
        assert_eq!(agent_texts(&updates), ["echo: one\ntwo"]);
        assert_eq!(done["id"], "raw-1");
    })
    .await;
}

#[tokio::test]
async fn a_lone_compact_block_answers_compacted_and_ends_the_turn() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let action_id = ActionId::mint();
        let frame = acp_frames::compact_request(&action_id, &client.session);
        client.send(&frame).await;
        let (updates, done) = client.until_response(&frame["id"]).await;
        assert_eq!(agent_texts(&updates), ["compacted"]);
        assert_eq!(updates.len(), 1);
        assert_eq!(stop_reason(&done), "end_turn");

        // With the harness's hidden block it is an ordinary prompt.
        let (updates, _) = client.turn("/compact").await;
        assert_eq!(agent_texts(&updates), ["echo: /compact"]);
    })
    .await;
}

#[tokio::test]
async fn chunks_sends_exactly_n_text_chunks_of_exactly_size_bytes() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let (updates, done) = client.turn("@chunks 25 37\n@chunks 3").await;
        let texts = agent_texts(&updates);
        assert_eq!(texts.len(), 1 + 25 + 3);
        assert!(texts[1..26].iter().all(|t| t.len() == 37));
        assert!(texts[26..].iter().all(|t| t.len() == 100));
        assert_eq!(
            texts[1],
            "#0:abcdefghijklmnopqrstuvwxyz01234567"[..37].to_owned()
        );
        assert_ne!(texts[1], texts[2], "chunks are numbered");
        assert_eq!(stop_reason(&done), "end_turn");

        // Deterministic: the same script gives the same chunks.
        let (again, _) = client.turn("@chunks 25 37\n@chunks 3").await;
        assert_eq!(agent_texts(&again), texts);
    })
    .await;
}

#[tokio::test]
async fn a_large_burst_of_chunks_streams_through_a_small_pipe_without_deadlock() {
    within(async {
        let mut client = start_with_buffer(&[], 1024);
        client.handshake().await;
        let (updates, done) = client.turn("@chunks 5000 100").await;
        assert_eq!(updates.len(), 5001);
        assert_eq!(stop_reason(&done), "end_turn");
    })
    .await;
}

#[tokio::test]
async fn tool_plan_commands_config_update_thought_and_image_have_their_acp_shapes() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let (updates, _) = client
            .turn("@tool t1\n@plan A|B|C\n@commands\n@config-update\n@thought mulling\n@image")
            .await;
        let updates: Vec<&Value> = updates.iter().map(|f| &f["params"]["update"]).collect();
        assert_eq!(
            updates[1..4],
            [
                &json!({"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Run t1",
                        "kind": "execute", "status": "pending"}),
                &json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1",
                        "status": "in_progress"}),
                &json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1",
                        "status": "completed",
                        "content": [{"type": "content", "content": {"type": "text", "text": "done"}}]}),
            ]
        );
        assert_eq!(
            updates[4],
            &json!({"sessionUpdate": "plan", "entries": [
                {"content": "A", "priority": "medium", "status": "in_progress"},
                {"content": "B", "priority": "medium", "status": "pending"},
                {"content": "C", "priority": "medium", "status": "pending"},
            ]})
        );
        assert_eq!(updates[5]["sessionUpdate"], "available_commands_update");
        let names: Vec<&str> = updates[5]["availableCommands"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["test", "lint"]);
        assert_eq!(updates[6]["sessionUpdate"], "config_option_update");
        assert_eq!(updates[6]["configOptions"][0]["currentValue"], "mock-fast");
        assert_eq!(
            updates[7],
            &json!({"sessionUpdate": "agent_thought_chunk",
                    "content": {"type": "text", "text": "mulling"}})
        );
        assert_eq!(updates[8]["sessionUpdate"], "agent_message_chunk");
        assert_eq!(updates[8]["content"]["type"], "image");
        assert_eq!(updates[8]["content"]["mimeType"], "image/png");
        assert_eq!(updates[8]["content"]["data"], super::wire::PIXEL_PNG_BASE64);
        assert_eq!(updates.len(), 9);
    })
    .await;
}

#[tokio::test]
async fn an_unknown_directive_is_reported_and_the_turn_goes_on() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let (updates, done) = client
            .turn("hi\n@frobnicate now\n@thought still here")
            .await;
        assert_eq!(
            agent_texts(&updates),
            [
                "echo: hi\n@frobnicate now\n@thought still here",
                "unknown directive: @frobnicate now"
            ]
        );
        assert_eq!(
            updates[2]["params"]["update"]["sessionUpdate"],
            "agent_thought_chunk"
        );
        assert_eq!(stop_reason(&done), "end_turn");
    })
    .await;
}

#[tokio::test]
async fn echo_all_echoes_every_block_including_the_hidden_one() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let action_id = ActionId::mint();
        let action = PromptAction::with_attachments(
            "@echo-all",
            vec![PromptAttachment::new("https://a.example/1", "one")],
        );
        let frame =
            acp_frames::prompt_request(&action_id, &client.session, &action, Default::default());
        client.send(&frame).await;
        let (updates, done) = client.until_response(&frame["id"]).await;
        let blocks = frame["params"]["prompt"].as_array().unwrap();
        let echoed: Vec<&Value> = updates[2..]
            .iter()
            .map(|f| &f["params"]["update"]["content"])
            .collect();
        assert_eq!(echoed, blocks.iter().collect::<Vec<_>>());
        assert!(
            echoed[2].get("_meta").is_some(),
            "the hidden block is echoed too"
        );
        assert_eq!(stop_reason(&done), "end_turn");
    })
    .await;
}

#[tokio::test]
async fn stop_ends_the_turn_at_once_with_each_acp_stop_reason() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        for reason in [
            "end_turn",
            "max_tokens",
            "max_turn_requests",
            "refusal",
            "cancelled",
        ] {
            let (updates, done) = client
                .turn(&format!("@stop {reason}\n@thought never"))
                .await;
            assert_eq!(stop_reason(&done), reason);
            assert_eq!(updates.len(), 1, "only the echo: {updates:?}");
        }
    })
    .await;
}

#[tokio::test]
async fn error_answers_the_prompt_with_that_json_rpc_error() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let (_, done) = client.turn("@error -32603 model overloaded").await;
        assert_eq!(
            done["error"],
            json!({"code": -32603, "message": "model overloaded"})
        );
        // The session takes the next prompt.
        let (_, next) = client.turn("again").await;
        assert_eq!(stop_reason(&next), "end_turn");
    })
    .await;
}

#[tokio::test]
async fn a_second_prompt_while_one_runs_is_refused_with_invalid_params() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let first = client.prompt("@wait-cancel").await;
        let second = client.prompt("too soon").await;
        let (_, refused) = client.until_response(&second).await;
        assert_eq!(refused["error"]["code"], -32602);
        client.cancel().await;
        let (_, done) = client.until_response(&first).await;
        assert_eq!(stop_reason(&done), "cancelled");
    })
    .await;
}

// ---------------------------------------------------------------- cancel

#[tokio::test]
async fn wait_cancel_ends_the_turn_cancelled_when_cancel_arrives() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let id = client.prompt("@wait-cancel\n@thought never").await;
        let echo = client.next().await;
        assert_eq!(
            agent_text(&echo),
            Some("echo: @wait-cancel\n@thought never")
        );
        client.cancel().await;
        let (after, done) = client.until_response(&id).await;
        assert!(after.is_empty(), "nothing runs after a cancel: {after:?}");
        assert_eq!(done["result"], json!({"stopReason": "cancelled"}));
    })
    .await;
}

#[tokio::test]
async fn a_long_sleep_is_cut_short_by_cancel() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let id = client.prompt("@sleep 600000").await;
        client.next().await;
        client.cancel().await;
        let (_, done) = client.until_response(&id).await;
        assert_eq!(stop_reason(&done), "cancelled");
    })
    .await;
}

#[tokio::test]
async fn a_short_sleep_then_goes_on_with_the_next_directive() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let (updates, done) = client.turn("@sleep 20\n@thought awake").await;
        assert_eq!(updates[1]["params"]["update"]["content"]["text"], "awake");
        assert_eq!(stop_reason(&done), "end_turn");
    })
    .await;
}

#[tokio::test]
async fn ignore_cancel_in_the_prompt_lets_the_turn_finish_normally() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let id = client
            .prompt("@sleep 200\n@thought survived\n@ignore-cancel")
            .await;
        client.next().await;
        client.cancel().await;
        // Other requests are still answered while the turn runs, after the cancel was read.
        let config = client
            .call(
                "session/set_config_option",
                json!({"sessionId": "mock-session-1", "configId": "model", "value": "mock-smart"}),
            )
            .await;
        assert!(config.get("result").is_some());
        let (updates, done) = client.until_response(&id).await;
        assert_eq!(
            updates[0]["params"]["update"]["content"]["text"],
            "survived"
        );
        assert_eq!(stop_reason(&done), "end_turn");
    })
    .await;
}

#[tokio::test]
async fn with_the_ignore_cancel_flag_a_wait_cancel_turn_never_ends() {
    within(async {
        let mut client = start(&["--ignore-cancel"]);
        client.handshake().await;
        let id = client.prompt("@wait-cancel").await;
        client.next().await;
        client.cancel().await;
        let ping = client.call("mock/ping", json!({})).await;
        assert_eq!(ping["error"]["code"], -32601);
        let (rest, code) = client.finish().await;
        assert!(
            rest.is_empty(),
            "the prompt {id} is never answered: {rest:?}"
        );
        assert_eq!(code, 0, "closing stdin still ends the agent cleanly");
    })
    .await;
}

#[tokio::test]
async fn a_cancel_for_another_session_or_while_idle_is_ignored() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        client.cancel().await;
        let id = client.prompt("@wait-cancel").await;
        client.next().await;
        client
            .send(&acp_frames::cancel_notification("some-other-session"))
            .await;
        let ping = client.call("mock/ping", json!({})).await;
        assert_eq!(ping["error"]["code"], -32601);
        client.cancel().await;
        let (_, done) = client.until_response(&id).await;
        assert_eq!(stop_reason(&done), "cancelled");
    })
    .await;
}

// ---------------------------------------------------------------- permissions

fn assert_permission_request(request: &Value, session: &str, title: &str) {
    assert_eq!(request["method"], "session/request_permission");
    assert!(request["id"].is_i64(), "the agent's own ids are numbers");
    let params = &request["params"];
    assert_eq!(params["sessionId"], session);
    assert_eq!(params["toolCall"]["title"], title);
    assert!(params["toolCall"]["toolCallId"].is_string());
    assert_eq!(
        params["options"],
        json!([
            {"optionId": "allow-once", "name": "Allow once", "kind": "allow_once"},
            {"optionId": "allow-always", "name": "Allow always", "kind": "allow_always"},
            {"optionId": "reject-once", "name": "Reject once", "kind": "reject_once"},
            {"optionId": "reject-always", "name": "Reject always", "kind": "reject_always"},
        ])
    );
}

#[tokio::test]
async fn a_permission_answered_with_an_option_reports_that_option() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let id = client
            .prompt("@permission Delete the branch\n@thought after")
            .await;
        let (_, request) = client.until_agent_request().await;
        assert_permission_request(&request, "mock-session-1", "Delete the branch");
        client
            .answer_permission(&request, selected("allow-always"))
            .await;
        let (updates, done) = client.until_response(&id).await;
        assert_eq!(agent_texts(&updates), ["permission: selected allow-always"]);
        assert_eq!(
            updates[1]["params"]["update"]["sessionUpdate"],
            "agent_thought_chunk"
        );
        assert_eq!(stop_reason(&done), "end_turn");
    })
    .await;
}

#[tokio::test]
async fn a_permission_answered_cancelled_reports_cancelled_and_the_default_title_is_used() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let id = client.prompt("@permission").await;
        let (_, request) = client.until_agent_request().await;
        assert_permission_request(&request, "mock-session-1", "Run mock command");
        client
            .answer_permission(&request, PermissionAnswer::Cancelled)
            .await;
        let (updates, done) = client.until_response(&id).await;
        assert_eq!(agent_texts(&updates), ["permission: cancelled"]);
        assert_eq!(stop_reason(&done), "end_turn");
    })
    .await;
}

#[tokio::test]
async fn a_permission_answered_with_an_error_reports_the_code() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let id = client.prompt("@permission").await;
        let (_, request) = client.until_agent_request().await;
        client.answer_error(&request, -32601, "no").await;
        let (updates, _) = client.until_response(&id).await;
        assert_eq!(agent_texts(&updates), ["permission: error -32601"]);
    })
    .await;
}

#[tokio::test]
async fn a_stop_while_a_permission_is_held_ends_the_turn_cancelled() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let id = client.prompt("@permission\n@thought never").await;
        let (_, request) = client.until_agent_request().await;
        // What the harness does on stop: answer held requests, then cancel.
        client
            .answer_permission(&request, PermissionAnswer::Cancelled)
            .await;
        client.cancel().await;
        let (updates, done) = client.until_response(&id).await;
        assert_eq!(agent_texts(&updates), ["permission: cancelled"]);
        assert_eq!(updates.len(), 1);
        assert_eq!(stop_reason(&done), "cancelled");

        // Cancel alone, with the request left unanswered, also ends the turn.
        let id = client.prompt("@permission").await;
        client.until_agent_request().await;
        client.cancel().await;
        let (_, done) = client.until_response(&id).await;
        assert_eq!(stop_reason(&done), "cancelled");
    })
    .await;
}

#[tokio::test]
async fn two_permissions_are_outstanding_at_once_and_each_answer_is_reported() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let id = client.prompt("@permission-twice").await;
        let (_, first) = client.until_agent_request().await;
        let (between, second) = client.until_agent_request().await;
        assert!(between.is_empty());
        assert_ne!(first["id"], second["id"]);
        assert_permission_request(&first, "mock-session-1", "Run mock command (1 of 2)");
        assert_permission_request(&second, "mock-session-1", "Run mock command (2 of 2)");
        client
            .answer_permission(&second, selected("reject-once"))
            .await;
        client
            .answer_permission(&first, PermissionAnswer::Cancelled)
            .await;
        let (updates, done) = client.until_response(&id).await;
        assert_eq!(
            agent_texts(&updates),
            ["permission: selected reject-once", "permission: cancelled"]
        );
        assert_eq!(stop_reason(&done), "end_turn");
    })
    .await;
}

#[tokio::test]
async fn cancel_permission_withdraws_its_own_request_and_reports_what_came_back() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let id = client.prompt("@cancel-permission").await;
        let (_, request) = client.until_agent_request().await;
        let withdrawal = client.next().await;
        assert_eq!(
            withdrawal,
            json!({"jsonrpc": "2.0", "method": "$/cancel_request",
                   "params": {"requestId": request["id"]}})
        );
        client
            .answer_error(&request, -32800, "request cancelled")
            .await;
        let (updates, done) = client.until_response(&id).await;
        assert_eq!(agent_texts(&updates), ["cancel-permission: error -32800"]);
        assert_eq!(stop_reason(&done), "end_turn");
    })
    .await;
}

#[tokio::test]
async fn cancel_permission_with_no_answer_reports_no_response_after_its_wait() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let (updates, done) = client.turn("@cancel-permission").await;
        assert_eq!(
            agent_texts(&updates),
            ["echo: @cancel-permission", "cancel-permission: no response"]
        );
        assert_eq!(stop_reason(&done), "end_turn");
    })
    .await;
}

// ---------------------------------------------------------------- elicitation

fn name_answer(name: &str) -> ElicitationAnswer {
    ElicitationAnswer::Accept {
        content: [("name".to_owned(), ElicitationValue::Text(name.to_owned()))].into(),
    }
}

#[tokio::test]
async fn a_form_elicitation_is_session_scoped_and_reports_the_accepted_content() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let id = client.prompt("@elicit form").await;
        let (_, request) = client.until_agent_request().await;
        assert_eq!(request["method"], "elicitation/create");
        assert_eq!(
            request["params"],
            json!({"mode": "form", "sessionId": "mock-session-1", "message": "Please fill in",
                   "requestedSchema": {"type": "object",
                       "properties": {"name": {"type": "string", "title": "Name"}},
                       "required": ["name"]}})
        );
        client
            .answer_elicitation(&request, name_answer("Ada"))
            .await;
        let (updates, done) = client.until_response(&id).await;
        assert_eq!(
            agent_texts(&updates),
            [r#"elicitation: accept {"name":"Ada"}"#]
        );
        assert_eq!(stop_reason(&done), "end_turn");
    })
    .await;
}

#[tokio::test]
async fn an_accepted_url_elicitation_is_followed_by_elicitation_complete() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let id = client.prompt("@elicit url\n@elicit url").await;
        let (_, request) = client.until_agent_request().await;
        assert_eq!(
            request["params"],
            json!({"mode": "url", "sessionId": "mock-session-1", "elicitationId": "el-1",
                   "url": "https://example.com/authorize",
                   "message": "Please authorize the mock agent"})
        );
        client
            .answer_elicitation(
                &request,
                ElicitationAnswer::Accept {
                    content: Default::default(),
                },
            )
            .await;
        let complete = client.next().await;
        assert_eq!(
            complete,
            json!({"jsonrpc": "2.0", "method": "elicitation/complete",
                   "params": {"elicitationId": "el-1"}})
        );
        assert_eq!(
            agent_text(&client.next().await),
            Some("elicitation: accept {}")
        );
        // A declined one gets no completion.
        let (_, second) = client.until_agent_request().await;
        assert_eq!(second["params"]["elicitationId"], "el-2");
        client
            .answer_elicitation(&second, ElicitationAnswer::Decline)
            .await;
        let (updates, done) = client.until_response(&id).await;
        assert_eq!(agent_texts(&updates), ["elicitation: decline"]);
        assert_eq!(updates.len(), 1);
        assert_eq!(stop_reason(&done), "end_turn");
    })
    .await;
}

#[tokio::test]
async fn a_request_scoped_elicitation_names_the_prompt_and_reports_a_refusal() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let id = client.prompt("@elicit request").await;
        let (_, request) = client.until_agent_request().await;
        assert_eq!(request["params"]["requestId"], id);
        assert!(request["params"].get("sessionId").is_none());
        client
            .answer_error(
                &request,
                -32602,
                "request-scoped elicitation is not supported",
            )
            .await;
        let (updates, _) = client.until_response(&id).await;
        assert_eq!(
            agent_texts(&updates),
            ["elicitation: error -32602 request-scoped elicitation is not supported"]
        );
    })
    .await;
}

#[tokio::test]
async fn two_elicitations_are_outstanding_at_once() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let id = client.prompt("@elicit twice").await;
        let (_, first) = client.until_agent_request().await;
        let (_, second) = client.until_agent_request().await;
        assert_eq!(first["params"]["mode"], "form");
        assert_eq!(second["params"]["mode"], "form");
        client
            .answer_error(&second, -32602, "one elicitation at a time")
            .await;
        client
            .answer_elicitation(&first, ElicitationAnswer::Cancel)
            .await;
        let (updates, _) = client.until_response(&id).await;
        assert_eq!(
            agent_texts(&updates),
            [
                "elicitation: error -32602 one elicitation at a time",
                "elicitation: cancel"
            ]
        );
    })
    .await;
}

#[tokio::test]
async fn an_unknown_request_reports_the_error_code_the_client_answered() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let id = client.prompt("@unknown-request").await;
        let (_, request) = client.until_agent_request().await;
        assert_eq!(request["method"], "fs/read_text_file");
        client
            .answer_error(&request, -32601, "Method not found")
            .await;
        let (updates, _) = client.until_response(&id).await;
        assert_eq!(agent_texts(&updates), ["unknown-request: error -32601"]);

        // A client that does serve it gets its result reported.
        let id = client.prompt("@unknown-request").await;
        let (_, request) = client.until_agent_request().await;
        client.answer(&request, json!({"content": "hi"})).await;
        let (updates, _) = client.until_response(&id).await;
        assert_eq!(
            agent_texts(&updates),
            [r#"unknown-request: result {"content":"hi"}"#]
        );
    })
    .await;
}

#[tokio::test]
async fn answers_to_requests_the_agent_is_not_waiting_for_are_ignored() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        client
            .send(&json!({"jsonrpc": "2.0", "id": 999, "result": {"outcome": {"outcome": "cancelled"}}}))
            .await;
        let (updates, done) = client.turn("hi").await;
        assert_eq!(agent_texts(&updates), ["echo: hi"]);
        assert_eq!(stop_reason(&done), "end_turn");
    })
    .await;
}

// ---------------------------------------------------------------- config options

#[tokio::test]
async fn set_config_option_accepts_advertised_values_and_answers_the_full_list() {
    within(async {
        let mut client = start(&["--config-option", "effort=low|high", "--bool-option", "web"]);
        client.handshake().await;
        let session = client.session.clone();
        for (config_id, value) in [
            ("model", ConfigValue::Id("mock-smart".into())),
            ("effort", ConfigValue::Id("high".into())),
            ("web", ConfigValue::Bool(true)),
        ] {
            let frame = acp_frames::set_config_option_request(
                &ActionId::mint(),
                &session,
                config_id,
                &value,
            );
            client.send(&frame).await;
            let (before, response) = client.until_response(&frame["id"]).await;
            assert!(before.is_empty());
            assert_eq!(
                response["result"]["configOptions"]
                    .as_array()
                    .unwrap()
                    .len(),
                3
            );
        }
        let (updates, _) = client.turn("@config-update").await;
        let options = &updates[1]["params"]["update"]["configOptions"];
        assert_eq!(options[0]["currentValue"], "mock-smart");
        assert_eq!(options[1]["currentValue"], "high");
        assert_eq!(options[2]["currentValue"], true);
    })
    .await;
}

#[tokio::test]
async fn set_config_option_refuses_what_is_not_advertised_with_invalid_params_naming_it() {
    within(async {
        let mut client = start(&["--bool-option", "web"]);
        client.handshake().await;
        for (params, needle) in [
            (
                json!({"sessionId": "mock-session-1", "configId": "speed", "value": "x"}),
                "speed",
            ),
            (
                json!({"sessionId": "mock-session-1", "configId": "model", "value": "gpt-9"}),
                "gpt-9",
            ),
            (
                json!({"sessionId": "mock-session-1", "configId": "web", "value": "on"}),
                "boolean",
            ),
        ] {
            let response = client.call("session/set_config_option", params).await;
            assert_eq!(response["error"]["code"], -32602);
            let message = response["error"]["message"].as_str().unwrap();
            assert!(message.contains(needle), "{message} names {needle}");
        }
        let (updates, _) = client.turn("@config-update").await;
        assert_eq!(
            updates[1]["params"]["update"]["configOptions"][0]["currentValue"], "mock-fast",
            "a refused change moves nothing"
        );
    })
    .await;
}

// ---------------------------------------------------------------- protocol edges

#[tokio::test]
async fn an_unknown_method_gets_method_not_found_and_unknown_notifications_are_ignored() {
    within(async {
        let mut client = start(&[]);
        client
            .send(&json!({"jsonrpc": "2.0", "method": "mock/whatever", "params": {}}))
            .await;
        let response = client.call("authenticate", json!({"methodId": "x"})).await;
        assert_eq!(response["error"]["code"], -32601);
        let string_id = json!("abc");
        client
            .send(&json!({"jsonrpc": "2.0", "id": string_id, "method": "session/close"}))
            .await;
        let (before, response) = client.until_response(&string_id).await;
        assert!(before.is_empty());
        assert_eq!(response["id"], "abc", "the id keeps its shape");
        assert_eq!(response["error"]["code"], -32601);
    })
    .await;
}

#[tokio::test]
async fn a_line_that_is_not_json_gets_a_parse_error_and_the_agent_goes_on() {
    within(async {
        let mut client = start(&[]);
        client.send_raw("{not json").await;
        let error = client.next().await;
        assert_eq!(error["id"], Value::Null);
        assert_eq!(error["error"]["code"], -32700);
        client.send_raw("").await;
        let init = client.initialize().await;
        assert!(init.get("result").is_some());
    })
    .await;
}

#[tokio::test]
async fn closing_stdin_mid_turn_ends_the_agent_with_code_0() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        client.prompt("@wait-cancel").await;
        client.next().await;
        let (rest, code) = client.finish().await;
        assert!(rest.is_empty());
        assert_eq!(code, 0);
    })
    .await;
}

// ---------------------------------------------------------------- start failures

#[tokio::test]
async fn fail_initialize_answers_initialize_with_an_error() {
    within(async {
        let mut client = start(&["--fail-initialize"]);
        let init = client.initialize().await;
        assert_eq!(init["error"]["code"], -32603);
    })
    .await;
}

#[tokio::test]
async fn hang_initialize_never_answers_initialize_but_answers_other_requests() {
    within(async {
        let mut client = start(&["--hang-initialize"]);
        let init_id = client.mint_id();
        client
            .send(&acp_frames::initialize_request(init_id.clone()))
            .await;
        let ping = client.call("mock/ping", json!({})).await;
        assert_eq!(ping["error"]["code"], -32601);
        let (rest, code) = client.finish().await;
        assert!(rest.is_empty(), "initialize {init_id} is never answered");
        assert_eq!(code, 0);
    })
    .await;
}

#[tokio::test]
async fn fail_new_session_and_auth_required_answer_session_new_with_their_errors() {
    within(async {
        let mut failing = start(&["--fail-new-session"]);
        failing.initialize().await;
        let new = failing.new_session().await;
        assert_eq!(new["error"]["code"], -32603);

        let mut locked = start(&["--auth-required"]);
        locked.initialize().await;
        let new = locked.new_session().await;
        assert_eq!(
            new["error"],
            json!({"code": -32000, "message": "authentication required"})
        );
    })
    .await;
}

#[tokio::test]
async fn stderr_at_start_is_written_first_and_exit_at_start_returns_its_code_at_once() {
    within(async {
        let client = start(&[
            "--stderr-at-start",
            "booting failed",
            "--exit-at-start",
            "9",
        ]);
        let stderr = client.stderr.clone();
        let (rest, code) = client.finish().await;
        assert!(rest.is_empty());
        assert_eq!(code, 9);
        assert_eq!(stderr.text(), "booting failed\n");

        let mut chatty = start(&["--stderr-at-start", "hello"]);
        chatty.handshake().await;
        assert_eq!(chatty.stderr.text(), "hello\n");
    })
    .await;
}

// ---------------------------------------------------------------- misbehaviour

#[tokio::test]
async fn stderr_writes_its_text_to_stderr() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let (_, done) = client.turn("@stderr something odd\n@stderr twice").await;
        assert_eq!(stop_reason(&done), "end_turn");
        assert_eq!(client.stderr.text(), "something odd\ntwice\n");
    })
    .await;
}

#[tokio::test]
async fn crash_writes_earlier_output_and_a_stderr_line_then_ends_with_its_code() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let id = client
            .prompt("@thought before\n@crash 42\n@thought never")
            .await;
        client.next().await;
        let thought = client.next().await;
        assert_eq!(thought["params"]["update"]["content"]["text"], "before");
        assert_eq!(
            client.next_line().await,
            None,
            "stdout ends, {id} unanswered"
        );
        let code = (&mut client.agent).await.unwrap().unwrap();
        assert_eq!(code, 42);
        assert!(
            client.stderr.text().contains("42"),
            "{}",
            client.stderr.text()
        );

        let mut default = start(&[]);
        default.handshake().await;
        default.prompt("@crash").await;
        let (_, code) = default.finish().await;
        assert_eq!(code, 3);
    })
    .await;
}

#[tokio::test]
async fn garbage_writes_a_line_that_is_not_json_then_the_turn_goes_on() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let id = client.prompt("@garbage\n@thought after").await;
        client.next().await;
        assert_eq!(
            client.next_line().await.as_deref(),
            Some("this is not json")
        );
        let (updates, done) = client.until_response(&id).await;
        assert_eq!(updates.len(), 1);
        assert_eq!(stop_reason(&done), "end_turn");
    })
    .await;
}

#[tokio::test]
async fn long_writes_one_valid_line_of_at_least_the_requested_bytes() {
    within(async {
        let mut client = start(&[]);
        client.handshake().await;
        let id = client.prompt("@long 300000").await;
        client.next().await;
        let line = client.next_line().await.unwrap();
        assert!(line.len() >= 300_000, "{}", line.len());
        let frame: Value = serde_json::from_str(&line).unwrap();
        client.check(&frame);
        assert_eq!(agent_text(&frame).unwrap().len(), 300_000);
        let (_, done) = client.until_response(&id).await;
        assert_eq!(stop_reason(&done), "end_turn");
    })
    .await;
}

#[tokio::test]
async fn silent_stops_all_output_but_keeps_draining_input_until_it_closes() {
    within(async {
        let mut client = start_with_buffer(&[], 1024);
        client.handshake().await;
        client
            .prompt("@thought last words\n@silent\n@thought never")
            .await;
        client.next().await;
        let last = client.next().await;
        assert_eq!(last["params"]["update"]["content"]["text"], "last words");
        // Far more than the pipe holds: the agent keeps reading.
        for _ in 0..200 {
            client
                .send(&json!({"jsonrpc": "2.0", "id": 1, "method": "mock/ping"}))
                .await;
        }
        let (rest, code) = client.finish().await;
        assert!(rest.is_empty(), "silent: {rest:?}");
        assert_eq!(code, 0);
    })
    .await;
}

#[tokio::test]
async fn close_stdout_ends_the_output_while_the_agent_keeps_reading() {
    within(async {
        let mut client = start_with_buffer(&[], 1024);
        client.handshake().await;
        client.prompt("@close-stdout").await;
        client.next().await;
        assert_eq!(client.next_line().await, None, "end of output");
        for _ in 0..200 {
            client
                .send(&json!({"jsonrpc": "2.0", "id": 1, "method": "mock/ping"}))
                .await;
        }
        assert!(!client.agent.is_finished());
        let (_, code) = client.finish().await;
        assert_eq!(code, 0);
    })
    .await;
}
