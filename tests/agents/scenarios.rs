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
    support::{Session, Watch, answer_request, set_model, stop},
};
use serde_json::Value;

use crate::kit::{
    Agent, Outcome, ProfileSpec, Rig, agent_message, eventually, note, text_of, tools_of, turn_end,
};

/// One test per scenario, in a module of their own, for one agent.
macro_rules! agent_scenarios {
    ($module:ident, $agent:path) => {
        agent_scenarios!(@tests $module, $agent,
            the_presets_own_command_starts_the_pinned_version_offline => preset_command,
            the_preset_asks_before_editing_and_a_profile_can_say_otherwise => modes,
            a_permission_turn_is_held_answered_and_writes_the_file => permission_turn,
            a_permission_rule_answers_without_a_person => permission_rule,
            after_a_stop_the_next_prompt_gets_its_own_reply => stop_then_next_prompt,
            after_a_model_api_401_the_turn_fails_and_the_next_prompt_gets_its_own_reply => model_error_401,
            after_a_model_api_429_the_turn_fails_and_the_next_prompt_gets_its_own_reply => model_error_429,
            after_a_model_api_500_the_turn_fails_and_the_next_prompt_gets_its_own_reply => model_error_500,
            a_model_api_500_with_the_agents_own_retries_takes_this_long => model_500_default_retries,
            without_its_key_the_agent_says_it_needs_one => without_a_key,
            a_model_switch_reaches_the_next_model_request => model_switch,
            after_kill_9_the_next_prompt_reopens_with_the_conversation => kill_9_then_reopen,
            a_fork_carries_the_parents_conversation => fork,
            through_the_model_proxy_the_key_is_swapped_and_usage_is_read_from_the_wire => model_proxy,
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
                    crate::kit::scenario_within(
                        &agent,
                        stringify!($scenario),
                        crate::scenarios::time_for(stringify!($scenario)),
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

/// The agent calls its model API through the harness's model proxy: it holds a token (never the
/// key the harness holds), every model call reaches the fake with the real key, and what
/// GetUsage shows for the profile and the owner is what the fake's answers said they took —
/// not what the agent reports (shown beside it for comparison).
pub async fn model_proxy(agent: Agent) -> Outcome {
    let rig = Rig::start(&agent).await;
    let mut session = rig.session(&agent).await;
    let (reason, _) = plain_turn(&mut session, "count this [hello]").await;
    assert_eq!(reason, "end_turn");
    let mut reported_tokens = 0u64;
    for entry in session.log().await {
        if entry.direction != pb::LogDirection::FromRuntime as i32 {
            continue;
        }
        let frame: Value = serde_json::from_str(&entry.json).expect("logged JSON");
        let usage = &frame["result"]["usage"];
        reported_tokens += usage["inputTokens"].as_u64().unwrap_or(0)
            + usage["outputTokens"].as_u64().unwrap_or(0);
    }
    let calls: Vec<_> = rig
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.is_model_call())
        .collect();
    assert!(!calls.is_empty(), "the agent called its model");
    let keys: std::collections::BTreeSet<String> =
        calls.iter().filter_map(|r| r.key.clone()).collect();
    let expected_key = rig.key();
    if keys.iter().any(|k| k.starts_with("ahm-")) || !keys.contains(expected_key) {
        return Outcome::Deviates(format!(
            "the model API saw the keys {keys:?}, not (only) the one the harness holds \
             ({expected_key:?}): the call did not go through the model proxy"
        ));
    }
    let (input, output) = rig.fake.served_tokens();
    let mut client = rig.server.client().await;
    // Each call's usage is stored as its answer ends: the last may land just after the turn.
    let mut waited = std::time::Duration::ZERO;
    let (profile, principal) = loop {
        let usage = client
            .get_usage(pb::GetUsageRequest::default())
            .await
            .expect("GetUsage answers")
            .into_inner();
        let profile = usage
            .profiles
            .iter()
            .find(|p| p.profile == crate::kit::PROFILE)
            .and_then(|p| p.totals.clone())
            .unwrap_or_default();
        let principal: (u64, u64) = usage
            .principals
            .iter()
            .filter_map(|p| p.totals.as_ref())
            .fold((0, 0), |(i, o), t| {
                (i + t.input_tokens, o + t.output_tokens)
            });
        let profile = (profile.input_tokens, profile.output_tokens);
        if (profile == (input, output) && principal == (input, output))
            || waited >= std::time::Duration::from_secs(10)
        {
            break (profile, principal);
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        waited += std::time::Duration::from_millis(50);
    };
    if profile != (input, output) || principal != (input, output) {
        return Outcome::Deviates(format!(
            "the fake's answers said {input} in + {output} out tokens; GetUsage shows \
             {profile:?} for the profile and {principal:?} for the owner"
        ));
    }
    Outcome::Pass(format!(
        "{} model call(s) with the real key; {input} in + {output} out tokens from the wire = \
         the fake's, in GetUsage (the agent itself reported {reported_tokens})",
        calls.len()
    ))
}

/// The fake's quote of a prompt's marker.
pub fn reply_to(marker: &str) -> String {
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

/// A stop mid-turn ends it CANCELLED; the next prompt then gets its own reply. Where the
/// preset defends against the agent's own defect here (`restart_after_cancel`), the note says
/// what the agent does without the defence.
pub async fn stop_then_next_prompt(agent: Agent) -> Outcome {
    let how = match stopped_then_prompted(&agent, |_| {}).await {
        Ok(how) => how,
        Err(evidence) => return Outcome::Deviates(evidence),
    };
    if !agent.preset().restart_after_cancel {
        return Outcome::Pass(how);
    }
    let undefended = |spec: &mut ProfileSpec| spec.keys.push_str("restart_after_cancel = false\n");
    let without = match stopped_then_prompted(&agent, undefended).await {
        Ok(_) => "without it the agent gets it right too".to_owned(),
        Err(evidence) => format!("without it: {evidence}"),
    };
    Outcome::Pass(format!("{how}; {without}"))
}

/// `[stall 60]`, a stop, then a prompt that must get its own reply: how the session came
/// through (a note), or what went wrong.
async fn stopped_then_prompted(
    agent: &Agent,
    edit: impl FnOnce(&mut ProfileSpec),
) -> Result<String, String> {
    let rig = Rig::start_with(agent, edit).await;
    let mut session = rig.session(agent).await;
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
        return Ok(restarted(&mut session).await.unwrap_or_default());
    }
    // Where did the reply go? One more prompt shows whether it arrives a turn late.
    let (third_reason, third) = plain_turn(&mut session, "marker-three").await;
    Err(format!(
        "the prompt after the stop ended {reason} with text {second:?}; the next one ended \
         {third_reason} with text {third:?}"
    ))
}

/// When the harness restarted the session's runtime after a turn (a defence of the profile):
/// why, and how the session was reopened.
async fn restarted(session: &mut Session) -> Option<String> {
    let log = session.log().await;
    let frames: Vec<Value> = log
        .iter()
        .filter_map(|e| serde_json::from_str(&e.json).ok())
        .collect();
    let stopped = frames
        .iter()
        .position(|f| f["event"] == "runtime_stopped")?;
    let reason = frames[stopped]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let reopened = frames[stopped..]
        .iter()
        .filter_map(|f| f["method"].as_str())
        .find(|m| *m == "session/resume" || *m == "session/load")
        .unwrap_or("nothing");
    Some(format!(
        "the runtime was {reason}, the session reopened by {reopened}"
    ))
}

/// How long a turn whose model API answers an error may take to end with that error (an agent
/// that retries with backoff takes seconds, one that retries without end never ends it).
const ERROR_TURN_LIMIT: std::time::Duration = std::time::Duration::from_secs(20);

/// The `turn_timeout` an agent whose preset bounds its turns (it retries a failing model API
/// without end) runs the model-error scenarios with: the preset's own limit is for real work
/// (minutes), this one ends the turn well within [`ERROR_TURN_LIMIT`].
const SCENARIO_TURN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The error a turn ended by its `turn_timeout` carries.
const TIMED_OUT: &str = "turn timed out after";

/// Waits until the session is usable again after a failed turn: idle, or suspended by a
/// defence that stopped its runtime (the next prompt reopens it); never disconnected.
async fn settles_usable(watch: &mut Watch) {
    let settled = [
        pb::SessionStatus::Idle as i32,
        pb::SessionStatus::Suspended as i32,
    ];
    let mut status = watch.statuses.last().copied().unwrap_or_default();
    while !settled.contains(&status) {
        assert_ne!(
            status,
            pb::SessionStatus::Disconnected as i32,
            "the session stays usable after the failed turn"
        );
        status = watch.next_status().await;
    }
}

/// How long a scenario may take: the default-retries one waits out an agent's own backoff.
pub fn time_for(scenario: &str) -> std::time::Duration {
    match scenario {
        "model_500_default_retries" => DEFAULT_RETRIES_LIMIT + crate::kit::SCENARIO_TIMEOUT,
        _ => crate::kit::SCENARIO_TIMEOUT,
    }
}

/// How long the default-retries scenario waits for an agent to give a model API 500 up.
const DEFAULT_RETRIES_LIMIT: std::time::Duration = std::time::Duration::from_secs(240);

/// `[flaky 500]`: the model API answers 500 to every request, without saying not to retry, and
/// the agent runs with its own retry settings. The cell says how long the turn took to end and
/// how many requests the agent made; an agent still retrying after
/// [`DEFAULT_RETRIES_LIMIT`] passes only where its preset bounds the turn (`turn_timeout`).
pub async fn model_500_default_retries(agent: Agent) -> Outcome {
    let own = agent.default_retries;
    let rig = Rig::start_with(&agent, |spec| {
        if let Some(own) = own {
            own(spec);
        }
    })
    .await;
    let mut session = rig.session(&agent).await;
    let mut watch = session.watch().await;
    let prompt = "failing [flaky 500]";
    let started = std::time::Instant::now();
    let failing = session.prompt(prompt).await;
    let ended =
        tokio::time::timeout(DEFAULT_RETRIES_LIMIT, watch.response_to(&failing.action_id)).await;
    let took = started.elapsed().as_secs_f64();
    if ended.is_ok() {
        let message = agent_message(&mut session, &failing.action_id).await;
        let stop = pb::StopReason::try_from(message.stop_reason.unwrap_or_default())
            .map(|r| {
                r.as_str_name()
                    .trim_start_matches("STOP_REASON_")
                    .to_owned()
            })
            .unwrap_or_default();
        let error = message
            .error
            .map(|e| format!(": {}", clipped(&e, 100)))
            .unwrap_or_default();
        return Outcome::Pass(format!(
            "the turn ended {stop} after {took:.0} s and {} requests to the model API{error}",
            rig.asked(prompt)
        ));
    }
    let asked = rig.asked(prompt);
    session
        .act(stop(false))
        .await
        .expect("the stop is accepted");
    turn_end(&mut watch, &failing.action_id).await;
    match agent.preset().turn_timeout {
        Some(limit) => Outcome::Pass(format!(
            "still retrying after {} s ({asked} requests to the model API, each answered 500; \
             stopped by the test): the preset's turn_timeout ({limit}) ends such a turn",
            DEFAULT_RETRIES_LIMIT.as_secs()
        )),
        None => Outcome::Deviates(format!(
            "still retrying after {} s ({asked} requests to the model API, each answered 500), \
             and its preset sets no turn_timeout",
            DEFAULT_RETRIES_LIMIT.as_secs()
        )),
    }
}

pub async fn model_error_401(agent: Agent) -> Outcome {
    model_error(agent, 401).await
}

pub async fn model_error_429(agent: Agent) -> Outcome {
    model_error(agent, 429).await
}

pub async fn model_error_500(agent: Agent) -> Outcome {
    model_error(agent, 500).await
}

/// The model API answers `status`: the turn ends with the agent's error, the session stays
/// usable, and the next prompt gets its own reply. Where the preset defends against the
/// agent's own defect here (`restart_after_error`), the note says what the agent does without
/// the defence (shown once, for 500).
async fn model_error(agent: Agent, status: u16) -> Outcome {
    let bounded = agent.preset().turn_timeout.is_some();
    let limit = |spec: &mut ProfileSpec| {
        if bounded {
            spec.keys.push_str(&format!(
                "turn_timeout = \"{}s\"\n",
                SCENARIO_TURN_TIMEOUT.as_secs()
            ));
        }
    };
    let how = match failed_then_prompted(&agent, status, limit).await {
        Ok(how) => how,
        Err(evidence) => return Outcome::Deviates(evidence),
    };
    if status != 500 || !agent.preset().restart_after_error {
        return Outcome::Pass(how);
    }
    let undefended = |spec: &mut ProfileSpec| spec.keys.push_str("restart_after_error = false\n");
    let without = match failed_then_prompted(&agent, status, undefended).await {
        Ok(_) => "without it the agent gets it right too".to_owned(),
        Err(evidence) => format!("without it: {evidence}"),
    };
    Outcome::Pass(format!("{how}; {without}"))
}

/// `[error STATUS]`, then a prompt that must get its own reply: the turn's error and how the
/// session came through (a note), or what went wrong.
async fn failed_then_prompted(
    agent: &Agent,
    status: u16,
    edit: impl FnOnce(&mut ProfileSpec),
) -> Result<String, String> {
    let rig = Rig::start_with(agent, edit).await;
    let mut session = rig.session(agent).await;
    let mut watch = session.watch().await;
    let prompt = format!("failing [error {status}]");
    let failing = session.prompt(&prompt).await;
    let Ok(answer) =
        tokio::time::timeout(ERROR_TURN_LIMIT, watch.response_to(&failing.action_id)).await
    else {
        // The agent keeps retrying: how often the model API was asked shows it; a stop ends
        // the turn, and the session must still answer the next prompt.
        let asked = rig.asked(&prompt);
        session
            .act(stop(false))
            .await
            .expect("the stop is accepted");
        let ended = turn_end(&mut watch, &failing.action_id).await;
        drop(watch);
        let (reason, next) = plain_turn(&mut session, "after-error").await;
        return Err(format!(
            "after {} s the turn had not ended: the agent asked the model API {asked} times \
             (each answered {status}); a stop ended it {ended}; the next prompt ended {reason} \
             with text {next:?}",
            ERROR_TURN_LIMIT.as_secs()
        ));
    };
    let message = agent_message(&mut session, &failing.action_id).await;
    assert_eq!(message.stop_reason, Some(pb::StopReason::Failed as i32));
    let shown = message.error.clone().unwrap_or_default();
    if shown.starts_with(TIMED_OUT) {
        // The harness ended it: the agent was still retrying when the profile's limit ran out,
        // and was asked to stop.
        let asked = rig.asked(&prompt);
        settles_usable(&mut watch).await;
        drop(watch);
        let (reason, next) = plain_turn(&mut session, "after-error").await;
        if reason == "end_turn" && next.contains(&reply_to("after-error")) {
            return Ok(format!(
                "the profile's turn_timeout ({}s; the preset's is longer) ended it FAILED: \
                 \"{}\" while the agent retried (it asked the model API {asked} times, each \
                 answered {status}); the agent stopped when asked, and the next prompt got its \
                 own reply",
                SCENARIO_TURN_TIMEOUT.as_secs(),
                clipped(&shown, 60)
            ));
        }
        return Err(format!(
            "the turn timed out ({shown:?}), but the next prompt ended {reason} with text \
             {next:?}"
        ));
    }
    assert!(
        answer.get("error").is_some(),
        "the prompt is answered with the agent's error: {answer}"
    );
    let said = shown.to_lowercase();
    assert!(
        [
            &status.to_string()[..],
            "auth",
            "rate",
            "limit",
            "overload",
            "server",
            "demand"
        ]
        .iter()
        .any(|word| said.contains(word)),
        "the turn's error says what the model API answered: {shown:?} ({answer})"
    );
    settles_usable(&mut watch).await;
    drop(watch);

    let (reason, next) = plain_turn(&mut session, "after-error").await;
    if reason == "end_turn" && next.contains(&reply_to("after-error")) {
        let restart = match restarted(&mut session).await {
            Some(how) => format!("; {how}"),
            None => String::new(),
        };
        return Ok(format!(
            "the turn's error: {}{restart}",
            clipped(&shown, 140)
        ));
    }
    let (third_reason, third) = plain_turn(&mut session, "after-error-again").await;
    Err(format!(
        "the prompt after the failed turn ended {reason} with text {next:?}; the next one \
         ended {third_reason} with text {third:?}"
    ))
}

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
    let reopened = reopened_by(&mut session)
        .await
        .expect("the session was reopened by session/resume or session/load");
    let frames = session.sent_frames().await;
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

/// The ACP method the harness reopened the session with (`session/resume` or `session/load`),
/// if it sent one.
pub async fn reopened_by(session: &mut Session) -> Option<String> {
    session
        .sent_frames()
        .await
        .iter()
        .filter_map(|f| f["method"].as_str())
        .find(|m| *m == "session/resume" || *m == "session/load")
        .map(str::to_owned)
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
pub fn runtime_pids(server: &ServeProcess) -> Vec<u32> {
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

/// The preset's own command line (`npx -y PACKAGE@VERSION`, offline from the npm cache the
/// stage filled) starts the agent at the pinned version, and it answers a prompt.
pub async fn preset_command(agent: Agent) -> Outcome {
    let cache = npm_cache();
    let rig = Rig::start_with(&agent, |spec| {
        spec.preset_command = true;
        // Shown read-only in the box: npx finds the pinned package there.
        spec.npm_cache = Some(cache.clone());
        spec.env.extend(ProfileSpec::pairs(&[
            ("npm_config_cache", cache.to_string_lossy().into_owned()),
            ("npm_config_offline", "true".to_owned()),
            ("npm_config_update_notifier", "false".to_owned()),
        ]));
    })
    .await;
    let mut session = rig.session(&agent).await;
    let (reason, reply) = plain_turn(&mut session, "through-the-preset").await;
    assert_eq!(reason, "end_turn");
    assert!(reply.contains(&reply_to("through-the-preset")), "{reply:?}");
    let info = session.get().await.agent_info.unwrap_or_default();
    assert_eq!(
        info.version, agent.version,
        "the preset runs the pinned version ({info:?})"
    );
    Outcome::Pass(format!(
        "`{}` ran {} {}",
        agent.preset().command_line(),
        info.name,
        info.version
    ))
}

/// The npm cache the stage filled (`.tools/npm-cache`, beside the agents' folder).
fn npm_cache() -> std::path::PathBuf {
    let agents = std::env::var_os(crate::kit::AGENTS_DIR_VAR).expect("the agents' folder");
    std::path::Path::new(&agents)
        .parent()
        .expect("the tools folder")
        .join("npm-cache")
}

/// As the preset starts a session, the agent asks before it writes a file; with the profile's
/// override of the preset's choice (a mode, or the agent's own setting), it does not.
pub async fn modes(agent: Agent) -> Outcome {
    let (mode, asked) = first_write(&agent, |_| {}).await;
    if !asked {
        return Outcome::Deviates(format!(
            "as the preset starts it (mode `{mode}`), it wrote a file without asking"
        ));
    }
    let (override_says, unasked) = agent.unasked;
    let (unasked_mode, asked_anyway) = first_write(&agent, unasked).await;
    if asked_anyway {
        return Outcome::Deviates(format!(
            "with the profile's `{override_says}` (mode `{unasked_mode}`), it still asked"
        ));
    }
    Outcome::Pass(format!(
        "as the preset starts it: mode `{mode}`, asks before writing a file; with the \
         profile's `{override_says}`: writes without asking"
    ))
}

/// A new session's mode, and whether `[write started.txt]` asked before writing (answered
/// `allow_once` if it did); the file is written either way.
async fn first_write(agent: &Agent, edit: impl FnOnce(&mut ProfileSpec)) -> (String, bool) {
    let rig = Rig::start_with(agent, edit).await;
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
    (mode, asked)
}

/// Without its API key the agent says it needs one: the harness refuses the session
/// RUNTIME_AUTH_REQUIRED naming the agent's sign-in methods, or the agent fails the prompt
/// with its authentication error and the session stays usable.
pub async fn without_a_key(agent: Agent) -> Outcome {
    let Some(take_key) = agent.without_key else {
        return Outcome::NotSupported(
            "it asks for no sign-in of its own: the key is its provider's (a provider that \
             refuses answers 401, the 401 column)"
                .to_owned(),
        );
    };
    let rig = Rig::start_with(&agent, take_key).await;
    let created = rig
        .server
        .client()
        .await
        .create_session(pb::CreateSessionRequest {
            profile: crate::kit::PROFILE.into(),
            cwd: rig.work().to_string_lossy().into_owned(),
            ..Default::default()
        })
        .await;
    let created = match created {
        Err(status) => {
            use tonic_types::StatusExt;
            let reason = status.get_details_error_info().map(|i| i.reason);
            assert_eq!(
                reason.as_deref(),
                Some("RUNTIME_AUTH_REQUIRED"),
                "{status:?}"
            );
            return Outcome::Pass(format!(
                "CreateSession: RUNTIME_AUTH_REQUIRED: {}",
                clipped(status.message(), 260)
            ));
        }
        Ok(created) => created.into_inner(),
    };
    let id = created.session.expect("the session").id;
    let mut session = Session::attach(rig.server.client().await, &id);
    let mut watch = session.watch().await;
    let turn = session.prompt("no key").await;
    let answer = watch.response_to(&turn.action_id).await;
    let error = answer["error"].to_string();
    assert!(
        error.to_lowercase().contains("auth"),
        "the prompt fails saying it needs authentication: {answer}"
    );
    settles_usable(&mut watch).await;
    Outcome::Pass(format!(
        "the session starts; its first prompt fails with {}; the session stays usable",
        clipped(&error, 140)
    ))
}
