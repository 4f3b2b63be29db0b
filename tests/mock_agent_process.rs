//! `agent-harness mock-agent` as a real child process over pipes, as the harness runs it: exit
//! codes, stderr, lines that are not JSON, and a stdout that closes while the process lives.

use std::{future::Future, process::Stdio, time::Duration};

use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines},
    process::{Child, ChildStdin, ChildStdout, Command},
};

const LIMIT: Duration = Duration::from_secs(20);

async fn within<F: Future>(body: F) -> F::Output {
    agent_harness_testkit::within(LIMIT, body).await
}

struct Agent {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
}

fn spawn(flags: &[&str]) -> Agent {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agent-harness"))
        .arg("mock-agent")
        .args(flags)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary starts");
    let stdin = child.stdin.take();
    let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    Agent {
        child,
        stdin,
        stdout,
    }
}

impl Agent {
    async fn send(&mut self, frame: Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin
            .write_all(format!("{frame}\n").as_bytes())
            .await
            .unwrap();
        stdin.flush().await.unwrap();
    }

    async fn line(&mut self) -> Option<String> {
        self.stdout.next_line().await.unwrap()
    }

    async fn frame(&mut self) -> Value {
        let line = self.line().await.expect("a line");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    /// Frames up to and including the response with `id`.
    async fn until_response(&mut self, id: &Value) -> Vec<Value> {
        let mut frames = Vec::new();
        loop {
            let frame = self.frame().await;
            let done = frame.get("method").is_none() && frame["id"] == *id;
            frames.push(frame);
            if done {
                return frames;
            }
        }
    }

    async fn handshake(&mut self) {
        self.send(json!({"jsonrpc": "2.0", "id": "h1", "method": "initialize",
                         "params": {"protocolVersion": 1, "clientCapabilities": {}}}))
            .await;
        let init = self.until_response(&json!("h1")).await;
        assert_eq!(init[0]["result"]["protocolVersion"], 1);
        self.send(
            json!({"jsonrpc": "2.0", "id": "h2", "method": "session/new",
                         "params": {"cwd": "/tmp", "mcpServers": []}}),
        )
        .await;
        let new = self.until_response(&json!("h2")).await;
        assert_eq!(new[0]["result"]["sessionId"], "mock-session-1");
    }

    async fn prompt(&mut self, id: &str, text: &str) {
        self.send(
            json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt", "params": {
            "sessionId": "mock-session-1",
            "prompt": [{"type": "text", "text": text},
                       {"type": "text", "text": "<m-agent-context>{}</m-agent-context>",
                        "_meta": {"macro/invocation-context": true}}]}}),
        )
        .await;
    }

    /// Waits for the exit; returns the code and everything written to stderr.
    async fn exit(mut self) -> (i32, String) {
        let mut stderr = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .await
            .unwrap();
        let status = self.child.wait().await.unwrap();
        (status.code().expect("exited, not killed"), stderr)
    }
}

#[tokio::test]
async fn the_binary_speaks_acp_on_its_stdio_and_exits_0_when_stdin_closes() {
    within(async {
        let mut agent = spawn(&[]);
        agent.handshake().await;
        agent.prompt("p1", "hello\n@chunks 3 10").await;
        let frames = agent.until_response(&json!("p1")).await;
        assert_eq!(frames.len(), 5, "echo, three chunks, the answer");
        assert_eq!(
            frames[0]["params"]["update"]["content"]["text"],
            "echo: hello\n@chunks 3 10"
        );
        assert_eq!(frames[4]["result"]["stopReason"], "end_turn");
        agent.stdin = None;
        assert_eq!(agent.line().await, None);
        let (code, stderr) = agent.exit().await;
        assert_eq!(code, 0);
        assert_eq!(stderr, "");
    })
    .await;
}

#[tokio::test]
async fn crash_exits_mid_turn_with_its_code_after_a_stderr_line() {
    within(async {
        for (directive, expected) in [("@crash", 3), ("@crash 17", 17)] {
            let mut agent = spawn(&[]);
            agent.handshake().await;
            agent.prompt("p1", directive).await;
            let echo = agent.frame().await;
            assert_eq!(
                echo["params"]["update"]["sessionUpdate"],
                "agent_message_chunk"
            );
            assert_eq!(agent.line().await, None, "stdout closes with the process");
            let (code, stderr) = agent.exit().await;
            assert_eq!(code, expected);
            assert!(stderr.contains(&expected.to_string()), "{stderr}");
        }
    })
    .await;
}

#[tokio::test]
async fn exit_at_start_exits_with_its_code_after_stderr_at_start() {
    within(async {
        let agent = spawn(&[
            "--stderr-at-start",
            "no credentials found",
            "--exit-at-start",
            "5",
        ]);
        let (code, stderr) = agent.exit().await;
        assert_eq!(code, 5);
        assert_eq!(stderr, "no credentials found\n");
    })
    .await;
}

#[tokio::test]
async fn invalid_flags_exit_with_code_2() {
    within(async {
        let (code, stderr) = spawn(&["--no-such-flag"]).exit().await;
        assert_eq!(code, 2);
        assert!(stderr.contains("--no-such-flag"), "{stderr}");
        let (code, stderr) = spawn(&["--bool-option", "model"]).exit().await;
        assert_eq!(code, 2);
        assert!(stderr.contains("model"), "{stderr}");
    })
    .await;
}

#[tokio::test]
async fn garbage_reaches_the_pipe_as_a_line_that_is_not_json() {
    within(async {
        let mut agent = spawn(&[]);
        agent.handshake().await;
        agent.prompt("p1", "@garbage\n@stderr noted").await;
        agent.frame().await;
        assert_eq!(agent.line().await.as_deref(), Some("this is not json"));
        let rest = agent.until_response(&json!("p1")).await;
        assert_eq!(rest.len(), 1);
        agent.stdin = None;
        let (code, stderr) = agent.exit().await;
        assert_eq!(code, 0);
        assert_eq!(stderr, "noted\n");
    })
    .await;
}

#[tokio::test]
async fn close_stdout_gives_the_reader_end_of_file_while_the_process_lives_on() {
    within(async {
        let mut agent = spawn(&[]);
        agent.handshake().await;
        agent.prompt("p1", "@close-stdout").await;
        agent.frame().await;
        assert_eq!(agent.line().await, None, "end of file on stdout");
        // Still alive and still reading: far more than a pipe holds goes in.
        let ping = format!(
            "{}\n",
            json!({"jsonrpc": "2.0", "id": 1, "method": "mock/ping"})
        );
        let stdin = agent.stdin.as_mut().unwrap();
        for _ in 0..2000 {
            stdin.write_all(ping.as_bytes()).await.unwrap();
        }
        stdin.flush().await.unwrap();
        assert!(agent.child.try_wait().unwrap().is_none(), "still running");
        agent.stdin = None;
        let (code, _) = agent.exit().await;
        assert_eq!(code, 0);
    })
    .await;
}

#[tokio::test]
async fn wait_cancel_then_cancel_over_real_pipes_ends_the_turn_cancelled() {
    within(async {
        let mut agent = spawn(&[]);
        agent.handshake().await;
        agent.prompt("p1", "@wait-cancel").await;
        agent.frame().await;
        agent
            .send(json!({"jsonrpc": "2.0", "method": "session/cancel",
                         "params": {"sessionId": "mock-session-1"}}))
            .await;
        let frames = agent.until_response(&json!("p1")).await;
        assert_eq!(
            frames,
            [json!({"jsonrpc": "2.0", "id": "p1",
                                   "result": {"stopReason": "cancelled"}})]
        );
    })
    .await;
}
