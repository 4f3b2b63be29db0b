//! The real Claude adapter behind the harness, driven by an ACP client through `agent-harness
//! acp`: acpx (pinned by `scripts/test`, named by `AGENT_HARNESS_ACPX`) runs `agent-harness acp
//! --profile agent` as its agent command and one turn in which Claude asks permission to write a
//! file; acpx approves it through ACP, the harness sends the answer to Claude, the file is
//! written, and the harness's log holds the whole turn.

use agent_harness::pb::v1 as pb;
use agent_harness_model_fakes::script::WRITTEN_CONTENT;
use agent_harness_testkit::{service_bin, support::Session};
use serde_json::Value;
use tokio::process::Command;

use crate::kit::{Agent, Outcome, PROFILE, Rig, note};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_driven_by_acpx_through_agent_harness_acp_asks_and_writes_the_file() {
    let test =
        "acp_client::claude_driven_by_acpx_through_agent_harness_acp_asks_and_writes_the_file";
    let Some(agent) = crate::claude::claude_newest(test) else {
        return;
    };
    crate::kit::scenario(
        &agent,
        "acp_client_permission",
        permission_turn_through_acpx(agent.clone()),
    )
    .await;
}

async fn permission_turn_through_acpx(agent: Agent) -> Outcome {
    let acpx = std::env::var("AGENT_HARNESS_ACPX")
        .expect("AGENT_HARNESS_ACPX names acpx (scripts/test agents installs it)");
    let rig = Rig::start(&agent).await;
    let acpx_home = rig.dir.path().join("acpx-home");
    std::fs::create_dir_all(&acpx_home).expect("a home for acpx");
    let agent_command = format!("{} acp --profile {PROFILE}", service_bin().display());
    note("acpx exec: a prompt that asks to write hello.txt");
    let output = Command::new(&acpx)
        .args(["--agent", &agent_command, "--cwd"])
        .arg(rig.work())
        .args([
            "--approve-all",
            "--format",
            "json",
            "exec",
            "please [write hello.txt]",
        ])
        .env("HOME", &acpx_home)
        .env(
            "AGENT_HARNESS_SERVER",
            format!("http://{}", rig.server.addr()),
        )
        .env_remove("AGENT_HARNESS_TOKEN")
        .kill_on_drop(true)
        .output()
        .await
        .expect("acpx runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Outcome::Deviates(format!(
            "acpx failed: {}; stdout: {stdout}; stderr: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    // acpx saw the permission request through ACP and answered it.
    let events: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let asked = events
        .iter()
        .any(|e| e.to_string().contains("session/request_permission"));
    assert!(asked, "acpx was asked permission: {stdout}");
    assert_eq!(
        std::fs::read_to_string(rig.work().join("hello.txt")).expect("hello.txt is written"),
        WRITTEN_CONTENT
    );
    // The harness's log holds the turn: the request, the answer sent as Control, the end.
    let sessions = rig
        .server
        .client()
        .await
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect("listed")
        .into_inner()
        .sessions;
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    let mut session = Session::attach(rig.server.client().await, &sessions[0].id);
    let log = session.log().await;
    let frames: Vec<Value> = log
        .iter()
        .map(|e| serde_json::from_str(&e.json).expect("logged JSON"))
        .collect();
    let request = frames
        .iter()
        .find(|f| f["method"] == "session/request_permission")
        .expect("the permission request is in the log");
    let answered = log.iter().zip(&frames).any(|(entry, frame)| {
        entry.direction == pb::LogDirection::ToRuntime as i32
            && frame["id"] == request["id"]
            && frame["result"]["outcome"]["outcome"] == "selected"
    });
    assert!(answered, "the answer went to Claude: {frames:?}");
    let ended = frames
        .iter()
        .any(|f| f["result"]["stopReason"] == "end_turn");
    assert!(ended, "the turn ended end_turn: {frames:?}");
    Outcome::Pass("acpx answered through ACP".to_owned())
}
