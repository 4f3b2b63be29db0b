//! Interoperability with third-party ACP agents: the TypeScript SDK's example agent
//! (`@agentclientprotocol/sdk@1.9.0`, `dist/examples/agent.js`) and the Python SDK's
//! `examples/agent.py` (`agent-client-protocol==0.12.1`). `scripts/test` installs them into
//! `.tools/agents` and runs these tests with `AGENT_HARNESS_TS_AGENT`, `AGENT_HARNESS_PY_AGENT`
//! and `AGENT_HARNESS_PY_PYTHON` set; a plain `cargo test` skips them (they are ignored) because
//! the agents are not part of the machine.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use agent_harness::{
    config::{PermissionPolicy, PermissionRule, Profile, RuleDecision, ServeConfig},
    pb::v1::{self as pb, control_request::Action},
};
use serde_json::Value;

use crate::{
    bridge::{BRIDGE_TIMEOUT, Bridge, remote_profile, url},
    harness::Harness,
    support::{Session, attachment, number_id, permission_answer, stop},
};

/// The example TS agent takes about 6 s a turn; give each test room.
const INTEROP_TIMEOUT: Duration = Duration::from_secs(60);

fn required(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run these through scripts/test, which installs the third-party agents")
    })
}

fn which(program: &str) -> String {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("{program} is not on PATH"))
        .to_string_lossy()
        .into_owned()
}

fn profile(config: &mut ServeConfig, name: &str, command: String, args: Vec<String>) {
    // Boxed like any configured profile: the box shows the installed agents (the `.tools` folder
    // they sit in) and the interpreter's own prefix read-only.
    let mut read_only: Vec<std::path::PathBuf> = Vec::new();
    for path in std::iter::once(&command).chain(&args) {
        let Ok(path) = std::fs::canonicalize(path) else {
            continue;
        };
        let shown = match path.ancestors().find(|a| a.ends_with(".tools")) {
            Some(tools) => tools.to_path_buf(),
            // An interpreter: its prefix (`<prefix>/bin/python3`), unless the system's.
            None => match path.parent().and_then(|bin| bin.parent()) {
                Some(prefix)
                    if !prefix.starts_with("/usr") && prefix != std::path::Path::new("/") =>
                {
                    prefix.to_path_buf()
                }
                _ => continue,
            },
        };
        if !read_only.contains(&shown) {
            read_only.push(shown);
        }
    }
    config.profiles.insert(
        name.to_owned(),
        Arc::new(Profile {
            name: name.to_owned(),
            command: command.into(),
            args,
            env: BTreeMap::new(),
            permission_policy: PermissionPolicy::Ask,
            allowed_cwd_roots: None,
            startup_timeout: Duration::from_secs(20),
            turn_timeout: None,
            cancel_grace: Duration::from_secs(10),
            idle_timeout: None,
            permission_rules: Vec::new(),
            permission_timeout: None,
            remote: None,
            warm_pool: 0,
            resilience: Default::default(),
            secrets: Default::default(),
            config_options: Default::default(),
            auth_method: None,
            sandbox: Some(agent_harness::acp::sandbox::BoxPolicy {
                read_only,
                ..Default::default()
            }),
        }),
    );
}

async fn ts_harness() -> Harness {
    let agent = required("AGENT_HARNESS_TS_AGENT");
    Harness::start_with(|config| profile(config, "ts-example", which("node"), vec![agent])).await
}

async fn within<F: std::future::Future>(body: F) -> F::Output {
    crate::harness::within(INTEROP_TIMEOUT, body).await
}

async fn ts_turn_answered(option: &str, expect_text: &str) {
    within(async {
        let h = ts_harness().await;
        let mut session = Session::create(&h, "ts-example").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("please update the configuration").await;
        let request = watch.agent_request("session/request_permission").await;
        let offered: Vec<&str> = request["params"]["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["optionId"].as_str().unwrap())
            .collect();
        assert_eq!(offered, ["allow", "reject"]);
        let id = request["id"]
            .as_i64()
            .expect("the TS SDK numbers its requests");
        session
            .act(permission_answer(number_id(id), Some(option)))
            .await
            .unwrap();
        assert_eq!(
            watch.response_to(&turn.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        watch.chunk(expect_text).await;
    })
    .await
}

#[tokio::test]
#[ignore = "needs the third-party TS example agent: run by scripts/test"]
async fn interop_ts_a_permission_turn_completes_when_answered_allow() {
    ts_turn_answered("allow", "successfully updated the configuration").await
}

#[tokio::test]
#[ignore = "needs the third-party TS example agent: run by scripts/test"]
async fn interop_ts_a_permission_turn_completes_when_answered_reject() {
    ts_turn_answered("reject", "skip the configuration update").await
}

/// A profile rule on the tool call's kind (`edit` for the example agent) decides the request:
/// nobody is asked, and the log names the rule.
async fn ts_turn_decided_by_rule(decision: RuleDecision, option: &str, expect_text: &str) {
    within(async {
        let agent = required("AGENT_HARNESS_TS_AGENT");
        let h = Harness::start_with(|config| {
            profile(config, "ts-ruled", which("node"), vec![agent]);
            let ruled = config.profiles.get_mut("ts-ruled").unwrap();
            Arc::make_mut(ruled).permission_rules = vec![PermissionRule {
                kind: Some("edit".to_owned()),
                title_regex: Some(regex::Regex::new("(?i)configuration").unwrap()),
                decision,
            }];
        })
        .await;
        let mut session = Session::create(&h, "ts-ruled").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("please update the configuration").await;
        let request = watch.agent_request("session/request_permission").await;
        let event = watch.event("permission_decided").await;
        assert_eq!(event["by"], "rule");
        assert_eq!(event["rule"], 0);
        assert_eq!(event["request_id"], request["id"]);
        assert_eq!(event["answer"]["selected"], option);
        assert_eq!(
            watch.response_to(&turn.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        watch.chunk(expect_text).await;
        assert!(
            !watch
                .statuses
                .contains(&(pb::SessionStatus::AwaitingInput as i32)),
            "nobody was asked"
        );
    })
    .await
}

#[tokio::test]
#[ignore = "needs the third-party TS example agent: run by scripts/test"]
async fn interop_ts_a_permission_rule_allowing_edits_answers_the_request_allow() {
    ts_turn_decided_by_rule(
        RuleDecision::AllowOnce,
        "allow",
        "successfully updated the configuration",
    )
    .await
}

#[tokio::test]
#[ignore = "needs the third-party TS example agent: run by scripts/test"]
async fn interop_ts_a_permission_rule_rejecting_edits_answers_the_request_reject() {
    ts_turn_decided_by_rule(
        RuleDecision::RejectAlways,
        "reject",
        "skip the configuration update",
    )
    .await
}

#[tokio::test]
#[ignore = "needs the third-party TS example agent: run by scripts/test"]
async fn interop_ts_a_stop_before_the_permission_request_ends_the_turn_cancelled() {
    within(async {
        let h = ts_harness().await;
        let mut session = Session::create(&h, "ts-example").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("start working").await;
        watch.chunk("I'll help you with that").await;
        session.act(stop(false)).await.unwrap();
        assert_eq!(
            watch.response_to(&turn.action_id).await["result"]["stopReason"],
            "cancelled"
        );
        let log = session.log().await;
        assert!(
            !log.iter()
                .any(|e| e.json.contains("session/request_permission")),
            "no permission was asked"
        );
    })
    .await
}

#[tokio::test]
#[ignore = "needs the third-party TS example agent: run by scripts/test"]
async fn interop_ts_a_stop_while_the_permission_is_held_answers_it_cancelled_and_the_turn_ends() {
    within(async {
        let h = ts_harness().await;
        let mut session = Session::create(&h, "ts-example").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("please update the configuration").await;
        let request = watch.agent_request("session/request_permission").await;
        watch.status(pb::SessionStatus::AwaitingInput).await;
        session.act(stop(false)).await.unwrap();
        let response = watch.response_to(&turn.action_id).await;
        assert!(
            response.get("result").is_some(),
            "the turn ends: {response}"
        );
        let log = session.log().await;
        let answered = log
            .iter()
            .position(|e| {
                let frame: Value = serde_json::from_str(&e.json).unwrap();
                frame["id"] == request["id"] && frame["result"]["outcome"]["outcome"] == "cancelled"
            })
            .expect("the held permission was answered cancelled");
        let cancel = log
            .iter()
            .position(|e| e.json.contains("session/cancel"))
            .unwrap();
        assert!(answered < cancel, "answered before session/cancel");
        watch.status(pb::SessionStatus::Idle).await;
    })
    .await
}

#[tokio::test]
#[ignore = "needs the third-party Python example agent: run by scripts/test"]
async fn interop_python_a_prompt_with_text_and_two_attachments_comes_back_with_both_links_in_order()
{
    within(async {
        let agent = required("AGENT_HARNESS_PY_AGENT");
        let python = required("AGENT_HARNESS_PY_PYTHON");
        let h =
            Harness::start_with(|config| profile(config, "py-example", python, vec![agent])).await;
        let mut session = Session::create(&h, "py-example").await;
        let mut watch = session.watch().await;
        let links = vec![
            attachment("https://static.example/file/one", "one.png"),
            attachment("https://static.example/file/two", "two.pdf"),
        ];
        let turn = session
            .act(Action::Prompt(pb::PromptAction {
                prompt: "compare these".into(),
                attachments: links,
            }))
            .await
            .unwrap();
        assert_eq!(
            watch.response_to(&turn.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        let echoed: Vec<Value> = watch
            .entries
            .iter()
            .map(|e| serde_json::from_str::<Value>(&e.json).unwrap())
            .filter(|f| f["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
            .map(|f| f["params"]["update"]["content"].clone())
            .collect();
        let returned: Vec<&str> = echoed
            .iter()
            .filter(|c| c["type"] == "resource_link")
            .map(|c| c["uri"].as_str().unwrap())
            .collect();
        assert_eq!(
            returned,
            [
                "https://static.example/file/one",
                "https://static.example/file/two"
            ]
        );
        let texts: Vec<&str> = echoed.iter().filter_map(|c| c["text"].as_str()).collect();
        assert!(texts.contains(&"compare these"), "{texts:?}");
    })
    .await
}

/// The TS agent on a bridge: the same turn as above, through `agent-harness bridge`.
#[tokio::test]
#[ignore = "needs the third-party TS example agent: run by scripts/test"]
async fn interop_ts_a_permission_turn_through_a_bridge_completes_when_answered_allow() {
    crate::harness::within(BRIDGE_TIMEOUT, async {
        let agent = required("AGENT_HARNESS_TS_AGENT");
        let node = which("node");
        let h = Harness::start_with(|config| {
            remote_profile(
                config,
                "ts",
                &[],
                "ts-example",
                Duration::from_secs(30),
                Duration::from_secs(30),
            )
        })
        .await;
        // The bridge boxes its agents too: the box shows the installed agent read-only.
        let tools = std::path::Path::new(&agent)
            .ancestors()
            .find(|a| a.ends_with(".tools"))
            .expect("the TS agent is installed under .tools");
        let profiles = format!(
            "[profiles.ts-example]\ncommand = {node:?}\nargs = [{agent:?}]\n\
             sandbox = {{ read_only = [{tools:?}] }}\n"
        );
        let _bridge = Bridge::start(&url(h.addr()), "b1", &[], &profiles, None);
        let mut session = Session::create(&h, "ts").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("please update the configuration").await;
        let request = watch.agent_request("session/request_permission").await;
        let id = request["id"]
            .as_i64()
            .expect("the TS SDK numbers its requests");
        session
            .act(permission_answer(number_id(id), Some("allow")))
            .await
            .unwrap();
        assert_eq!(
            watch.response_to(&turn.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        watch.chunk("successfully updated the configuration").await;
    })
    .await
}
