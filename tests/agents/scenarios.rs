//! The scenarios, written once and run for every agent (docs/agents.md lists them): each takes
//! the agent under test, starts a rig (fake model server, real harness process, a profile
//! running the agent), drives one scenario through gRPC and says what it found.
//!
//! `agent_scenarios!(module, agent_fn)` makes a module with one test per scenario for the agent
//! that `agent_fn(test_name) -> Option<Agent>` describes (None: not installed here, skipped).

use std::path::Path;

use agent_harness::pb::v1 as pb;
use agent_harness_model_fakes::script::WRITTEN_CONTENT;
use agent_harness_testkit::{
    process::ServeProcess,
    support::{Session, answer_request, set_model, stop},
};
use serde_json::Value;

use crate::kit::{
    Agent, Outcome, Rig, agent_message, eventually, note, text_of, tools_of, turn_end,
};

/// One test per scenario, in a module of their own, for one agent.
macro_rules! agent_scenarios {
    ($module:ident, $agent:path) => {
        agent_scenarios!(@tests $module, $agent,
            the_mode_it_starts_in_is_reported => default_mode,
            a_permission_turn_is_held_answered_and_writes_the_file => permission_turn,
            a_permission_rule_answers_without_a_person => permission_rule,
            after_a_stop_the_next_prompt_gets_its_own_reply => stop_then_next_prompt,
            after_a_model_api_error_the_next_prompt_gets_its_own_reply => model_error_then_next_prompt,
            a_model_switch_reaches_the_next_model_request => model_switch,
            after_kill_9_the_next_prompt_reopens_with_the_conversation => kill_9_then_reopen,
            a_fork_carries_the_parents_conversation => fork,
        );
    };
    (@tests $module:ident, $agent:path, $($test:ident => $scenario:ident,)*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let Some(agent) = $agent(concat!(stringify!($module), "::", stringify!($test)))
                    else {
                        return;
                    };
                    crate::kit::scenario(
                        &agent,
                        stringify!($scenario),
                        crate::scenarios::$scenario(agent.clone()),
                    )
                    .await;
                }
            )*
        }
    };
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
pub async fn plain_turn(session: &mut Session, text: &str) -> (String, String) {
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

/// A tool call that asks permission: held until answered through Control, then the file is
/// written, the turn ends END_TURN and the transcript shows the tool call completed.
pub async fn permission_turn(agent: Agent) -> Outcome {
    let rig = Rig::start(&agent).await;
    let mut session = rig.session(&agent).await;
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
pub async fn permission_rule(agent: Agent) -> Outcome {
    let rig = Rig::start_with(&agent, |spec| {
        spec.extra_toml.push_str(
            "[[profiles.agent.permission_rules]]\nkind = \"edit\"\ndecision = \"allow_once\"\n",
        )
    })
    .await;
    let mut session = rig.session(&agent).await;
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
pub async fn stop_then_next_prompt(agent: Agent) -> Outcome {
    let rig = Rig::start(&agent).await;
    let mut session = rig.session(&agent).await;
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
pub async fn model_error_then_next_prompt(agent: Agent) -> Outcome {
    let rig = Rig::start(&agent).await;
    let mut session = rig.session(&agent).await;
    let mut watch = session.watch().await;
    let failing = session.prompt("failing [error 500]").await;
    let Ok(answer) =
        tokio::time::timeout(ERROR_TURN_LIMIT, watch.response_to(&failing.action_id)).await
    else {
        // The agent keeps retrying: how often the model API was asked shows it; a stop ends
        // the turn, and the session must still answer the next prompt.
        let asked = rig
            .fake
            .requests()
            .iter()
            .filter(|r| {
                r.is_turn_step() && r.last_user_text.as_deref() == Some("failing [error 500]")
            })
            .count();
        session
            .act(stop(false))
            .await
            .expect("the stop is accepted");
        let ended = turn_end(&mut watch, &failing.action_id).await;
        drop(watch);
        let (reason, next) = plain_turn(&mut session, "after-error").await;
        return Outcome::Deviates(format!(
            "after {} s the turn had not ended: the agent asked the model API {asked} times \
             (each answered 500); a stop ended it {ended}; the next prompt ended {reason} with \
             text {next:?}",
            ERROR_TURN_LIMIT.as_secs()
        ));
    };
    let error = answer["error"].to_string().to_lowercase();
    assert!(
        error.contains("500") || error.contains("server_error"),
        "the agent's error names the status or its kind: {answer}"
    );
    let message = agent_message(&mut session, &failing.action_id).await;
    assert_eq!(message.stop_reason, Some(pb::StopReason::Failed as i32));
    let shown = message.error.clone().unwrap_or_default();
    assert!(
        !shown.is_empty(),
        "the transcript shows the agent's error: {:?}",
        message.error
    );
    // The session stays usable: idle, not disconnected.
    watch.status(pb::SessionStatus::Idle).await;
    drop(watch);

    let (reason, next) = plain_turn(&mut session, "after-error").await;
    if reason == "end_turn" && next.contains(&reply_to("after-error")) {
        return Outcome::Pass(format!(
            "the agent's error: {}",
            clipped(&answer["error"].to_string(), 140)
        ));
    }
    let (third_reason, third) = plain_turn(&mut session, "after-error-again").await;
    Outcome::Deviates(format!(
        "the prompt after the failed turn ended {reason} with text {next:?}; the next one \
         ended {third_reason} with text {third:?}"
    ))
}

/// How long a turn whose model API answers an error may take to end with that error (an agent
/// that retries with backoff takes seconds, one that retries without end never ends it).
const ERROR_TURN_LIMIT: std::time::Duration = std::time::Duration::from_secs(20);

/// A model chosen through Control is the model of the next request to the model API.
pub async fn model_switch(agent: Agent) -> Outcome {
    let rig = Rig::start(&agent).await;
    let mut session = rig.session(&agent).await;
    let (reason, _) = plain_turn(&mut session, "before-switch").await;
    assert_eq!(reason, "end_turn");
    let before = rig
        .fake
        .recorder()
        .wait_for(|r| r.is_turn_step() && r.carries("before-switch"))
        .await;

    let (model, marker) = agent.switch_model;
    let mut watch = session.watch().await;
    let chosen = session
        .act(set_model(model))
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
        after.contains(marker) && after != before,
        "the request after the switch names {after}, before it {before}"
    );
    Outcome::Pass(format!("{before} → {after}"))
}

/// `kill -9` of the harness; restarted on the same data dir, the next prompt reopens the
/// session (resume or load) and the model request carries the earlier conversation.
pub async fn kill_9_then_reopen(agent: Agent) -> Outcome {
    let mut rig = Rig::start(&agent).await;
    let mut session = rig.session(&agent).await;
    let (reason, _) = plain_turn(&mut session, "before-kill").await;
    assert_eq!(reason, "end_turn");
    // Agents write their session files lazily: wait until the turn is in them, so the kill
    // tests reopening, not that lazy write (a scenario of its own).
    let files = rig.home().join(agent.session_files);
    // (The file holds JSON lines: the reply is in it JSON-escaped.)
    let written = serde_json::to_string(&reply_to("before-kill")).expect("JSON");
    let written = written.trim_matches('"').to_owned();
    eventually("the agent's session file holds the first reply", || {
        session_files_contain(&files, &written)
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
    let users: Vec<String> = session
        .transcript()
        .await
        .messages
        .iter()
        .filter(|m| m.role == pb::MessageRole::User as i32)
        .map(text_of)
        .collect();
    let methods: Vec<&str> = frames.iter().filter_map(|f| f["method"].as_str()).collect();
    // (A control action, e.g. choosing the asking mode, is a user message without text.)
    let prompts: Vec<&String> = users.iter().filter(|t| !t.is_empty()).collect();
    assert_eq!(
        prompts,
        ["before-kill", "after-restart"],
        "the transcript holds each prompt once (no replayed duplicates); the harness sent \
         {methods:?}"
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
pub async fn fork(agent: Agent) -> Outcome {
    let rig = Rig::start(&agent).await;
    let mut parent = rig.session(&agent).await;
    let (reason, _) = plain_turn(&mut parent, "parent-marker").await;
    assert_eq!(reason, "end_turn");
    let capabilities = agent_capabilities(&mut parent).await;
    if capabilities["sessionCapabilities"].get("fork").is_none() {
        // The harness refuses, saying why, and the session goes on.
        let refused = parent
            .client
            .fork_session(pb::ForkSessionRequest {
                session_id: parent.id.clone(),
                name: None,
            })
            .await
            .expect_err("no fork without the agent's fork capability");
        note(&format!("fork refused: {refused:?}"));
        let (reason, _) = plain_turn(&mut parent, "parent-again").await;
        assert_eq!(reason, "end_turn");
        return Outcome::NotSupported(format!(
            "no `fork` in its session capabilities; ForkSession answers {:?}",
            refused.code()
        ));
    }
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

/// Pids of the harness's runtimes and everything they started: the processes below it (an
/// adapter may run the agent's CLI as a child process of its own).
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

/// Whether a file under `dir` contains `needle` (JSON lines, or a SQLite database and its
/// write-ahead log).
fn session_files_contain(dir: &Path, needle: &str) -> bool {
    fn walk(dir: &Path, needle: &str) -> bool {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return false;
        };
        entries.flatten().any(|entry| {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, needle)
            } else {
                std::fs::read(&path)
                    .is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
            }
        })
    }
    walk(dir, needle)
}

/// The agent's advertised capabilities (ACP `agentCapabilities`), from the transcript's metadata.
async fn agent_capabilities(session: &mut Session) -> Value {
    let metadata = session.transcript().await.metadata.unwrap_or_default();
    serde_json::from_str(&metadata.agent_capabilities_json).unwrap_or(Value::Null)
}

/// The current value of one of the agent's config options, from the transcript's metadata.
async fn config_value(session: &mut Session, config_id: &str) -> Option<String> {
    let metadata = session.transcript().await.metadata.unwrap_or_default();
    let options: Value = serde_json::from_str(&metadata.config_options_json).ok()?;
    options
        .as_array()?
        .iter()
        .find(|o| o["id"] == config_id)
        .and_then(|o| o["currentValue"].as_str())
        .map(str::to_owned)
}

/// At most `max` characters of `text`, with an ellipsis when cut.
fn clipped(text: &str, max: usize) -> String {
    let mut cut: String = text.chars().take(max).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    cut
}

/// The mode the agent starts a session in, and whether it asks before writing a file there
/// (the other scenarios run in the agent's asking mode, which the rig sets when it differs).
pub async fn default_mode(agent: Agent) -> Outcome {
    let rig = Rig::start(&agent).await;
    let mut session = rig.session_as_started().await;
    let mode = config_value(&mut session, "mode")
        .await
        .unwrap_or_else(|| "(no mode option)".to_owned());
    let mut watch = session.watch().await;
    let turn = session.prompt("as started [write started.txt]").await;
    let turn_id = turn.action_id.clone();
    let (_, first) = watch
        .entry(move |e, f| {
            e.direction == pb::LogDirection::FromRuntime as i32
                && (f["method"] == "session/request_permission" || f["id"] == turn_id.as_str())
        })
        .await;
    let asked = first["method"] == "session/request_permission";
    if asked {
        let allow = option_of_kind(&first, "allow_once");
        session
            .act(answer_request(&first, Some(&allow)))
            .await
            .expect("the answer is accepted");
    }
    assert_eq!(turn_end(&mut watch, &turn.action_id).await, "end_turn");
    assert_eq!(
        std::fs::read_to_string(rig.work().join("started.txt")).expect("started.txt is written"),
        WRITTEN_CONTENT
    );
    let chosen = match agent.asking_mode {
        Some((id, value)) => format!("; the other scenarios set `{id}` = `{value}`"),
        None => String::new(),
    };
    Outcome::Pass(format!(
        "`{mode}`: {}{chosen}",
        if asked {
            "asks before writing a file"
        } else {
            "writes a file without asking"
        }
    ))
}
