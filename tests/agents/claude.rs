//! Claude Code through its ACP adapter (`@zed-industries/claude-agent-acp`, which bundles the
//! Claude Code CLI as JavaScript and runs on Node), against the fake Anthropic Messages API.
//!
//! The agent's environment: `ANTHROPIC_BASE_URL` (the fake), any `ANTHROPIC_API_KEY`, the
//! switches that keep it from calling home, and a private `HOME` (where it keeps its session
//! files). The harness gives a runtime only `PATH`, `HOME`, `LANG` and the profile's env, so
//! `IS_SANDBOX` (with which the CLI refuses to run as root) never reaches it.

use std::path::Path;

use agent_harness::pb::v1 as pb;
use agent_harness_model_fakes::{Api, FakeServer, script::WRITTEN_CONTENT};
use agent_harness_testkit::{
    process::ServeProcess,
    support::{Session, answer_request, set_model, stop},
};

use crate::kit::{
    Agent, Outcome, ProfileSpec, Rig, agent_message, agents_dir, eventually, installed, note,
    scenario, text_of, tools_of, turn_end, which,
};

fn claude_0_23_1(test: &str) -> Option<Agent> {
    let dir = agents_dir(test)?;
    let entry = installed(
        &dir,
        "claude-agent-acp-0.23.1/node_modules/@zed-industries/claude-agent-acp/dist/index.js",
    );
    Some(Agent {
        name: "claude-agent-acp",
        package: "@zed-industries/claude-agent-acp",
        version: "0.23.1",
        api: Api::Anthropic,
        command: which("node"),
        args: vec![entry.to_string_lossy().into_owned()],
    })
}

fn claude_env(fake: &FakeServer, home: &Path) -> Vec<(String, String)> {
    [
        ("ANTHROPIC_BASE_URL", fake.base_url()),
        ("ANTHROPIC_API_KEY", "dummy".to_owned()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".to_owned()),
        ("DISABLE_TELEMETRY", "1".to_owned()),
        ("DISABLE_AUTOUPDATER", "1".to_owned()),
        ("DISABLE_ERROR_REPORTING", "1".to_owned()),
        ("HOME", home.to_string_lossy().into_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

fn claude_profile(fake: &FakeServer, home: &Path) -> ProfileSpec {
    ProfileSpec {
        env: claude_env(fake, home),
        extra_toml: String::new(),
    }
}

/// The option of a permission request with this ACP kind (`allow_once`, …).
fn option_of_kind(request: &serde_json::Value, kind: &str) -> String {
    request["params"]["options"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|o| o["kind"] == kind)
        .and_then(|o| o["optionId"].as_str())
        .unwrap_or_else(|| panic!("no {kind} option in {request}"))
        .to_owned()
}

/// Runs a plain prompt to its end; its reply's text.
async fn plain_turn(session: &mut Session, text: &str) -> (String, String) {
    let mut watch = session.watch().await;
    let turn = session.prompt(text).await;
    let reason = turn_end(&mut watch, &turn.action_id).await;
    let reply = text_of(&agent_message(session, &turn.action_id).await);
    (reason, reply)
}

/// The fake's quote of a prompt's marker.
fn reply_to(marker: &str) -> String {
    agent_harness_model_fakes::script::reply_text(marker)
}

// ---------------------------------------------------------------------------------------------
// Scenarios, written once for any Claude adapter.

/// A tool call that asks permission: held until answered through Control, then the file is
/// written, the turn ends END_TURN and the transcript shows the tool call completed.
async fn permission_turn(agent: Agent) -> Outcome {
    let rig = Rig::start(&agent, claude_profile).await;
    let mut session = rig.session().await;
    let mut watch = session.watch().await;
    let turn = session.prompt("please [write hello.txt]").await;
    let request = watch.agent_request("session/request_permission").await;
    watch.status(pb::SessionStatus::AwaitingInput).await;
    assert!(
        !rig.work().join("hello.txt").exists(),
        "nothing is written before the answer"
    );
    let allow = option_of_kind(&request, "allow_once");
    session
        .act(answer_request(&request, Some(&allow)))
        .await
        .expect("the answer is accepted");
    assert_eq!(turn_end(&mut watch, &turn.action_id).await, "end_turn");
    assert_eq!(
        std::fs::read_to_string(rig.work().join("hello.txt")).expect("hello.txt is written"),
        WRITTEN_CONTENT
    );
    let message = agent_message(&mut session, &turn.action_id).await;
    let tools = tools_of(&message);
    assert!(
        tools.iter().any(|t| t.status == "completed"),
        "a completed tool call in {tools:?}"
    );
    assert!(
        text_of(&message).contains("Wrote hello.txt."),
        "{}",
        text_of(&message)
    );
    assert!(
        rig.fake.requests().iter().any(|r| r.tool_result),
        "the agent sent the tool's result back to the model"
    );
    Outcome::Pass(String::new())
}

/// A profile rule on the tool kind answers the permission request: nobody is asked.
async fn permission_rule(agent: Agent) -> Outcome {
    let rig = Rig::start(&agent, |fake, home| ProfileSpec {
        env: claude_env(fake, home),
        extra_toml: "[[profiles.agent.permission_rules]]\nkind = \"edit\"\n\
                     decision = \"allow_once\"\n"
            .to_owned(),
    })
    .await;
    let mut session = rig.session().await;
    let mut watch = session.watch().await;
    let turn = session.prompt("ruled [write ruled.txt]").await;
    let request = watch.agent_request("session/request_permission").await;
    let decided = watch.event("permission_decided").await;
    assert_eq!(decided["by"], "rule", "{decided}");
    assert_eq!(decided["request_id"], request["id"]);
    assert_eq!(turn_end(&mut watch, &turn.action_id).await, "end_turn");
    assert!(
        !watch
            .statuses
            .contains(&(pb::SessionStatus::AwaitingInput as i32)),
        "nobody was asked"
    );
    assert_eq!(
        std::fs::read_to_string(rig.work().join("ruled.txt")).expect("ruled.txt is written"),
        WRITTEN_CONTENT
    );
    Outcome::Pass(String::new())
}

/// A stop mid-turn ends it CANCELLED; the next prompt then gets its own reply.
async fn stop_then_next_prompt(agent: Agent) -> Outcome {
    let rig = Rig::start(&agent, claude_profile).await;
    let mut session = rig.session().await;
    let mut watch = session.watch().await;
    let stalled = session.prompt("stalled-one [stall 60]").await;
    watch.chunk("Stalling").await;
    session
        .act(stop(false))
        .await
        .expect("the stop is accepted");
    assert_eq!(turn_end(&mut watch, &stalled.action_id).await, "cancelled");
    drop(watch);

    let (reason, second) = plain_turn(&mut session, "marker-two").await;
    if reason == "end_turn" && second.contains(&reply_to("marker-two")) {
        return Outcome::Pass(String::new());
    }
    // Where did the reply go? One more prompt shows whether it arrives a turn late.
    let (third_reason, third) = plain_turn(&mut session, "marker-three").await;
    Outcome::Deviates(format!(
        "the prompt after the stop ended {reason} with text {second:?}; the next one ended \
         {third_reason} with text {third:?}"
    ))
}

/// The model API answers an error: the turn ends with the agent's error, the session stays
/// usable, and the next prompt gets its own reply.
async fn model_error_then_next_prompt(agent: Agent) -> Outcome {
    let rig = Rig::start(&agent, claude_profile).await;
    let mut session = rig.session().await;
    let mut watch = session.watch().await;
    let failing = session.prompt("failing [error 500]").await;
    let answer = watch.response_to(&failing.action_id).await;
    let error = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        error.contains("500"),
        "the agent's error names the status: {answer}"
    );
    let message = agent_message(&mut session, &failing.action_id).await;
    assert_eq!(message.stop_reason, Some(pb::StopReason::Failed as i32));
    assert!(
        message.error.as_deref().is_some_and(|e| e.contains("500")),
        "the transcript shows the agent's error: {:?}",
        message.error
    );
    // The session stays usable: idle, not disconnected.
    watch.status(pb::SessionStatus::Idle).await;
    drop(watch);

    let (reason, next) = plain_turn(&mut session, "after-error").await;
    if reason == "end_turn" && next.contains(&reply_to("after-error")) {
        return Outcome::Pass(String::new());
    }
    let (third_reason, third) = plain_turn(&mut session, "after-error-again").await;
    Outcome::Deviates(format!(
        "the prompt after the failed turn ended {reason} with text {next:?}; the next one \
         ended {third_reason} with text {third:?}"
    ))
}

/// A model chosen through Control is the model of the next request to the model API.
async fn model_switch(agent: Agent) -> Outcome {
    let rig = Rig::start(&agent, claude_profile).await;
    let mut session = rig.session().await;
    let (reason, _) = plain_turn(&mut session, "before-switch").await;
    assert_eq!(reason, "end_turn");
    let before = rig
        .fake
        .recorder()
        .wait_for(|r| r.is_turn_step() && r.carries("before-switch"))
        .await;

    let mut watch = session.watch().await;
    let chosen = session
        .act(set_model("haiku"))
        .await
        .expect("the model change is accepted");
    let answer = watch.response_to(&chosen.action_id).await;
    assert!(answer.get("error").is_none(), "the agent took it: {answer}");
    drop(watch);
    let mark = rig.fake.recorder().len();
    let (reason, _) = plain_turn(&mut session, "after-switch").await;
    assert_eq!(reason, "end_turn");
    let after = rig
        .fake
        .recorder()
        .wait_after(mark, |r| r.is_turn_step() && r.carries("after-switch"))
        .await;
    let (before, after) = (before.model.unwrap(), after.model.unwrap());
    assert!(
        after.contains("haiku") && after != before,
        "the request after the switch names {after}, before it {before}"
    );
    Outcome::Pass(format!("{before} → {after}"))
}

/// `kill -9` of the harness; restarted on the same data dir, the next prompt reopens the
/// session (resume or load) and the model request carries the earlier conversation.
async fn kill_9_then_reopen(agent: Agent) -> Outcome {
    let mut rig = Rig::start(&agent, claude_profile).await;
    let mut session = rig.session().await;
    let (reason, _) = plain_turn(&mut session, "before-kill").await;
    assert_eq!(reason, "end_turn");
    // Claude Code writes its session file lazily: wait until the turn is in it, so the kill
    // tests reopening, not that lazy write (a scenario of its own).
    let home = rig.home();
    // (The file holds JSON lines: the reply is in it JSON-escaped.)
    let written = serde_json::to_string(&reply_to("before-kill")).expect("JSON");
    let written = written.trim_matches('"').to_owned();
    eventually("the agent's session file holds the first reply", || {
        session_files_contain(&home, &written)
    })
    .await;
    let runtimes = runtime_pids(&rig.server);
    assert!(!runtimes.is_empty(), "the agent runs under the harness");
    note(&format!(
        "killing the harness; its runtime's processes: {runtimes:?}"
    ));
    rig.server.kill_9();
    // No process of the runtime outlives the harness.
    agent_harness_testkit::support::exited(&runtimes).await;

    rig.server.restart();
    let mut session = Session::attach(rig.server.client().await, &session.id);
    let mark = rig.fake.recorder().len();
    let (reason, reply) = plain_turn(&mut session, "after-restart").await;
    assert_eq!(reason, "end_turn");
    assert!(reply.contains(&reply_to("after-restart")), "{reply:?}");
    let frames = session.sent_frames().await;
    let reopened = frames
        .iter()
        .filter_map(|f| f["method"].as_str())
        .find(|m| *m == "session/resume" || *m == "session/load")
        .expect("the session was reopened by session/resume or session/load")
        .to_owned();
    let users = session
        .transcript()
        .await
        .messages
        .iter()
        .filter(|m| m.role == pb::MessageRole::User as i32)
        .count();
    assert_eq!(
        users, 2,
        "the transcript holds each prompt once (no replayed duplicates)"
    );
    let request = rig
        .fake
        .recorder()
        .wait_after(mark, |r| r.is_turn_step() && r.carries("after-restart"))
        .await;
    assert!(
        request.carries("before-kill"),
        "the request after the restart carries the earlier conversation: {:?}",
        request.user_texts
    );
    Outcome::Pass(format!("reopened by {reopened}"))
}

/// ForkSession: the fork's next model request carries the parent's conversation, and the parent
/// goes on on its own.
async fn fork(agent: Agent) -> Outcome {
    let rig = Rig::start(&agent, claude_profile).await;
    let mut parent = rig.session().await;
    let (reason, _) = plain_turn(&mut parent, "parent-marker").await;
    assert_eq!(reason, "end_turn");
    let forked = parent
        .client
        .fork_session(pb::ForkSessionRequest {
            session_id: parent.id.clone(),
            name: None,
        })
        .await
        .expect("the session forks")
        .into_inner()
        .session
        .expect("the fork");
    let mut child = Session::attach(rig.server.client().await, &forked.id);
    let mark = rig.fake.recorder().len();
    let (reason, reply) = plain_turn(&mut child, "child-marker").await;
    assert_eq!(reason, "end_turn");
    assert!(reply.contains(&reply_to("child-marker")), "{reply:?}");
    let request = rig
        .fake
        .recorder()
        .wait_after(mark, |r| r.is_turn_step() && r.carries("child-marker"))
        .await;
    assert!(
        request.carries("parent-marker"),
        "the fork's request carries the parent's conversation: {:?}",
        request.user_texts
    );
    let mark = rig.fake.recorder().len();
    let (reason, reply) = plain_turn(&mut parent, "parent-again").await;
    assert_eq!(reason, "end_turn");
    assert!(reply.contains(&reply_to("parent-again")), "{reply:?}");
    let request = rig
        .fake
        .recorder()
        .wait_after(mark, |r| r.is_turn_step() && r.carries("parent-again"))
        .await;
    assert!(
        !request.carries("child-marker"),
        "the parent does not see the fork's turn: {:?}",
        request.user_texts
    );
    Outcome::Pass(String::new())
}

/// Pids of the harness's runtimes and everything they started: the processes below it (the
/// adapter runs the Claude Code CLI as a child process of its own).
fn runtime_pids(server: &ServeProcess) -> Vec<u32> {
    let mut parents = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The fields after the command's closing parenthesis: state, then the parent's pid.
        let mut fields = stat.rsplit(')').next().unwrap_or("").split_whitespace();
        if let Some(parent) = fields.nth(1).and_then(|p| p.parse::<u32>().ok()) {
            parents.push((pid, parent));
        }
    }
    let mut below = vec![server.pid()];
    let mut i = 0;
    while i < below.len() {
        let parent = below[i];
        below.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(pid, _)| *pid),
        );
        i += 1;
    }
    below.remove(0);
    below
}

fn session_files_contain(home: &Path, needle: &str) -> bool {
    fn walk(dir: &Path, needle: &str) -> bool {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return false;
        };
        entries.flatten().any(|entry| {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, needle)
            } else {
                path.extension().is_some_and(|e| e == "jsonl")
                    && std::fs::read_to_string(&path).is_ok_and(|t| t.contains(needle))
            }
        })
    }
    walk(&home.join(".claude").join("projects"), needle)
}

// ---------------------------------------------------------------------------------------------
// @zed-industries/claude-agent-acp 0.23.1

macro_rules! claude_0_23_1 {
    ($($test:ident => $scenario:ident,)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            let Some(agent) = claude_0_23_1(stringify!($test)) else { return };
            scenario(&agent, stringify!($scenario), $scenario(agent.clone())).await;
        }
    )*};
}

claude_0_23_1! {
    claude_0_23_1_a_permission_turn_is_held_answered_and_writes_the_file => permission_turn,
    claude_0_23_1_a_permission_rule_answers_without_a_person => permission_rule,
    claude_0_23_1_after_a_stop_the_next_prompt_gets_its_own_reply => stop_then_next_prompt,
    claude_0_23_1_after_a_model_api_error_the_next_prompt_gets_its_own_reply => model_error_then_next_prompt,
    claude_0_23_1_a_model_switch_reaches_the_next_model_request => model_switch,
    claude_0_23_1_after_kill_9_the_next_prompt_reopens_with_the_conversation => kill_9_then_reopen,
    claude_0_23_1_a_fork_carries_the_parents_conversation => fork,
}
