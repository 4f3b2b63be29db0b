//! Qwen Code (`@qwen-code/qwen-code`, JavaScript) in ACP mode (`qwen --acp --auth-type openai`;
//! preset `qwen`), against the fake OpenAI Chat Completions API.
//!
//! It starts sessions in its `auto` mode (a model classifier approves what it deems safe, edits
//! included); the preset asks for `default`, which asks before any edit. Through the model proxy
//! (the preset's OpenAI route) it reads the proxy's address and token from OPENAI_BASE_URL and
//! OPENAI_API_KEY; the rig sets OPENAI_BASE_URL to the fake, which becomes the proxy's upstream.
//! Its settings file, seeded into the owner's HOME, names two models of that provider (for the
//! model switch) and turns its usage statistics off.

use std::path::Path;

use agent_harness_model_fakes::{Api, FakeServer};
use serde_json::json;

use crate::kit::{Agent, ProfileSpec, agents_dir, installed, which};

/// The key the rig passes through (to the model proxy; the agent gets a token).
const PASSED_KEY: &str = "dummy-key-passed-through";

/// The model proxy's OpenAI address in every box.
const PROXY: &str = "http://127.0.0.1:3129/openai/v1";

fn qwen_profile(fake: &FakeServer, seed: &Path) -> ProfileSpec {
    let dir = seed.join(".qwen");
    std::fs::create_dir_all(&dir).expect("the settings folder");
    // Each model names its base URL, the model proxy in the box: a model without one is
    // called at OPENAI_BASE_URL until the session switches to it, and at Qwen's own default
    // endpoint after (the switch failed with "Connection error." without it).
    let settings = json!({
        "modelProviders": { "openai": [
            { "id": "fake-model", "name": "fake-model", "envKey": "OPENAI_API_KEY", "baseUrl": PROXY },
            { "id": "fake-small", "name": "fake-small", "envKey": "OPENAI_API_KEY", "baseUrl": PROXY },
        ]},
        "privacy": { "usageStatisticsEnabled": false },
    });
    std::fs::write(
        dir.join("settings.json"),
        serde_json::to_string_pretty(&settings).expect("JSON"),
    )
    .expect("settings.json");
    ProfileSpec {
        env: ProfileSpec::pairs(&[
            ("OPENAI_BASE_URL", format!("{}/v1", fake.base_url())),
            // Else it starts on its own default model (`qwen3.7-max`), not one of the settings'.
            ("OPENAI_MODEL", "fake-model".to_owned()),
        ]),
        harness_env: ProfileSpec::pairs(&[("OPENAI_API_KEY", PASSED_KEY.to_owned())]),
        key: PASSED_KEY.to_owned(),
        ..Default::default()
    }
}

/// `@qwen-code/qwen-code` 0.24.4. Its modes: `plan`, `default` (asks before edits and
/// commands), `auto-edit`, `auto`, `yolo`.
pub fn qwen_0_24_4(test: &str) -> Option<Agent> {
    let dir = agents_dir(test)?;
    let entry = installed(
        &dir,
        "qwen-code-0.24.4/node_modules/@qwen-code/qwen-code/cli-entry.js",
    );
    Some(Agent {
        name: "qwen-code",
        package: "@qwen-code/qwen-code",
        version: "0.24.4",
        preset: "qwen",
        api: Api::OpenAiChat,
        command: which("node"),
        args: vec![
            entry.to_string_lossy().into_owned(),
            "--acp".to_owned(),
            "--auth-type".to_owned(),
            "openai".to_owned(),
        ],
        profile: qwen_profile,
        unasked: ("config_options = { mode = \"auto-edit\" }", |spec| {
            spec.keys
                .push_str("config_options = { mode = \"auto-edit\" }\n")
        }),
        // Without the key its provider has none to send.
        without_key: Some(|spec| spec.harness_env.retain(|(k, _)| k != "OPENAI_API_KEY")),
        switch_model: ("fake-small(openai)", "fake-small"),
        session_files: ".qwen",
        default_retries: None,
    })
}

agent_scenarios!(qwen_0_24_4, super::qwen_0_24_4);
