//! The hostile agent speaks enough ACP for the harness to drive it, and does what its prompt
//! says. Being an integration test of this package also makes `cargo test --workspace` (and
//! nextest) build `target/<profile>/hostile-agent`, which the sandbox tests in `tests/it` run:
//! a binary of a package without integration tests is never built by a test run.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use serde_json::{Value, json};

#[test]
fn the_hostile_agent_answers_a_prompt_with_what_its_command_printed() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hostile-agent"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("hostile-agent starts");
    let mut stdin = child.stdin.take().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut send = |frame: Value| writeln!(stdin, "{frame}").expect("written");
    // Every read waits on the agent's next line, never longer than this.
    let next = || -> Value {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the agent answers within 20 s");
        serde_json::from_str(&line).expect("a JSON-RPC frame")
    };

    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}),
    );
    assert_eq!(next()["result"]["agentInfo"]["name"], "hostile-agent");
    send(
        json!({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": "/", "mcpServers": []}}),
    );
    let session = next()["result"]["sessionId"].clone();
    assert!(session.is_string());
    send(
        json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": {
            "sessionId": session,
            "prompt": [{"type": "text", "text": "sh echo from-the-shell"}],
        }}),
    );
    // An agent message with the command's answer, then the end of the turn.
    let mut said = String::new();
    loop {
        let frame = next();
        if frame["id"] == 3 {
            assert_eq!(frame["result"]["stopReason"], "end_turn");
            break;
        }
        if let Some(text) = frame["params"]["update"]["content"]["text"].as_str() {
            said.push_str(text);
        }
    }
    assert!(said.starts_with("exit=0\n"), "{said}");
    assert!(said.contains("from-the-shell"), "{said}");
    let _ = child.kill();
    let _ = child.wait();
}
