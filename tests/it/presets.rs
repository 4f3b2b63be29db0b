//! A profile's `config_options` (what presets use to choose an agent's asking mode): asked for
//! on every new session where the agent offers the option with another value, before the
//! session is ready; one it does not offer is skipped with an event; and like any setting the
//! harness chose, asked for again after a reopen when the agent reports another value.

use agent_harness::pb::v1 as pb;
use serde_json::Value;

use crate::{
    harness::{Harness, bounded},
    support::{Session, create_request, mock_profile_with},
};

/// A profile `moded`: the mock agent with a `mode` select (`auto` first, as Claude's newest
/// adapter starts) and a `fast` boolean; the profile asks for `mode = ask`, `fast = true` and
/// an `effort` the agent does not offer.
fn moded(config: &mut agent_harness::config::ServeConfig) {
    mock_profile_with(
        config,
        "moded",
        &[
            "--resume",
            "--config-option",
            "mode=auto|ask",
            "--bool-option",
            "fast",
        ],
        |profile| {
            profile.config_options = [("mode", "ask"), ("fast", "true"), ("effort", "high")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        },
    );
}

fn current(session: &pb::AgentSession, id: &str) -> Value {
    let options: Value = serde_json::from_str(&session.config_options_json).unwrap();
    options
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["id"] == id)
        .map(|o| o["currentValue"].clone())
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn a_profiles_config_options_are_set_on_a_new_session_and_again_after_a_reopen() {
    bounded(async {
        let data = tempfile::TempDir::new().unwrap();
        let on_data = |c: &mut agent_harness::config::ServeConfig| {
            c.data_dir = data.path().join("data");
            moded(c);
        };
        let first = Harness::start_with(on_data).await;
        let mut request = create_request(&first, "moded");
        request.cwd = agent_harness_testkit::workspace_in(data.path())
            .to_string_lossy()
            .into_owned();
        // The caller's model and the profile's options, all before the session is ready.
        request.model = Some("mock-smart".into());
        let mut session = Session::create_with(&first, request).await;
        let created = session.get().await;
        assert_eq!(
            current(&created, "mode"),
            "ask",
            "{}",
            created.config_options_json
        );
        assert_eq!(current(&created, "fast"), true);
        assert_eq!(created.model, "mock-smart");
        let log = session.log().await;
        let skipped = log
            .iter()
            .filter(|e| e.direction == pb::LogDirection::Event as i32)
            .map(|e| serde_json::from_str::<Value>(&e.json).unwrap())
            .find(|e| e["event"] == "config_options_skipped")
            .expect("the option the agent does not offer is said to be skipped");
        assert_eq!(skipped["skipped"][0]["config_id"], "effort", "{skipped}");
        let settings: Vec<(Value, Value)> = session
            .sent_frames()
            .await
            .iter()
            .filter(|f| f["method"] == "session/set_config_option")
            .map(|f| {
                (
                    f["params"]["configId"].clone(),
                    f["params"]["value"].clone(),
                )
            })
            .collect();
        assert_eq!(
            settings,
            [
                ("fast".into(), true.into()),
                ("mode".into(), "ask".into()),
                ("model".into(), "mock-smart".into())
            ]
        );
        first.shutdown().await;

        // The new mock agent process reports its defaults for the resumed session.
        let second = Harness::start_with(on_data).await;
        let mut session = Session::attach(second.sessions(), &session.id);
        let mut watch = session.watch().await;
        let turn = session.prompt("after the restart").await;
        let event = watch.event("settings_reapplied").await;
        let reapplied: Vec<&Value> = event["config_options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| &o["config_id"])
            .collect();
        assert_eq!(reapplied, ["fast", "mode"], "{event}");
        watch.response_to(&turn.action_id).await;
        watch.status(pb::SessionStatus::Idle).await;
        let got = session.get().await;
        assert_eq!(current(&got, "mode"), "ask");
        second.shutdown().await;
    })
    .await
}

/// Runs `agent-harness profiles` with these arguments: exit code, stdout, stderr.
fn profiles(args: &[&std::ffi::OsStr]) -> (i32, String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_agent-harness"))
        .arg("profiles")
        .args(args)
        .env_remove("AGENT_HARNESS_CONFIG")
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn agent_harness_profiles_lists_the_presets_and_what_each_profile_resolves_to_without_values() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        r#"
[profiles.claude]
preset = "claude"
env = { ANTHROPIC_BASE_URL = "https://gateway.example/value-never-shown" }
env_files = { ANTHROPIC_API_KEY = "/run/secrets/anthropic/key" }

[profiles.old-claude]
preset = "claude-0.23.1"
command = "node"
args = ["/opt/claude-agent-acp/dist/index.js"]
"#,
    )
    .unwrap();
    let (code, out, err) = profiles(&["--config".as_ref(), config.as_os_str()]);
    assert_eq!(code, 0, "{err}");
    for expected in [
        "preset claude-0.101.0 (also: claude)",
        "npx -y @agentclientprotocol/claude-agent-acp@0.101.0",
        "preset claude-0.23.1",
        "preset codex-0.16.0 (also: codex)",
        "preset opencode-1.18.33 (also: opencode)",
        "preset qwen-0.24.4 (also: qwen)",
        "npx -y @qwen-code/qwen-code@0.24.4 --acp --auth-type openai",
        "profile mock (built in)",
        "profile claude (config file, preset claude)",
        "@agentclientprotocol/claude-agent-acp 0.101.0",
        "ANTHROPIC_API_KEY = /run/secrets/anthropic/key",
        "mode = default",
        "node /opt/claude-agent-acp/dist/index.js",
        "restart_after_cancel true",
        // The claude preset's agent goes through the model proxy where its key is set.
        "model_proxy          anthropic (when ANTHROPIC_API_KEY is set)",
    ] {
        assert!(out.contains(expected), "{expected:?} in:\n{out}");
    }
    assert!(out.contains("ANTHROPIC_BASE_URL"), "the name is shown");
    assert!(!out.contains("value-never-shown"), "never a value:\n{out}");

    std::fs::write(&config, "[profiles.bad]\npreset = \"gemini\"\n").unwrap();
    let (code, _, err) = profiles(&["--config".as_ref(), config.as_os_str()]);
    assert_eq!(code, 1);
    assert!(
        err.contains("profiles.bad.preset = \"gemini\" is not a preset"),
        "{err}"
    );
}

/// A preset asked for as a profile that the config does not name says what to add.
#[tokio::test]
async fn a_preset_asked_for_as_an_unconfigured_profile_says_how_to_configure_it() {
    crate::harness::bounded(async {
        let h = crate::harness::Harness::start().await;
        let status = h
            .sessions()
            .create_session(crate::support::create_request(&h, "claude"))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::NotFound);
        assert!(
            status.message().contains("\"claude\" is a preset")
                && status.message().contains("[profiles.claude]"),
            "{}",
            status.message()
        );
    })
    .await;
}
