//! opencode (`opencode-ai`, a native binary per platform) in ACP mode (`opencode acp`; preset
//! `opencode`), against the fake OpenAI Chat Completions API.
//!
//! The preset asks before edits (`OPENCODE_PERMISSION={"edit":"ask"}`: without it opencode
//! edits inside the working directory without asking). The rig adds a private `HOME` (its
//! SQLite database lives in `~/.local/share/opencode`), the `OPENCODE_DISABLE_*` switches that
//! keep it from fetching anything, and `XDG_CONFIG_HOME` holding `opencode/opencode.json`,
//! which names a provider on the model proxy in its box through `@ai-sdk/openai-compatible`
//! (bundled in the binary, nothing is installed) with the token the harness puts in
//! `OPENAI_API_KEY` (`{env:…}`) and its two models; the profile's `model_proxy` sends that
//! provider's calls to the fake with the key the harness holds. No `authenticate` call is
//! needed.

use std::path::Path;

use agent_harness_model_fakes::{Api, FakeServer};
use serde_json::json;

use crate::kit::{Agent, ProfileSpec, agents_dir, installed};

fn opencode_profile(fake: &FakeServer, seed: &Path) -> ProfileSpec {
    // Its config file is seeded into the owner's HOME before every start (the box's HOME).
    let xdg_config = seed.join(".config");
    let dir = xdg_config.join("opencode");
    std::fs::create_dir_all(&dir).expect("the config folder");
    let config = json!({
        "$schema": "https://opencode.ai/config.json",
        "provider": { "fake": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "Fake",
            // The model proxy in its box, with the token the harness puts in OPENAI_API_KEY.
            "options": { "baseURL": "http://127.0.0.1:3129/openai/v1", "apiKey": "{env:OPENAI_API_KEY}" },
            "models": {
                "fake-model": { "name": "Fake model" },
                "fake-small": { "name": "Fake small" },
            },
        }},
        "model": "fake/fake-model",
        "autoupdate": false,
        "share": "disabled",
    });
    std::fs::write(
        dir.join("opencode.json"),
        serde_json::to_string_pretty(&config).expect("JSON"),
    )
    .expect("opencode.json");
    // Its switches against calling home: offline each failed fetch of the models catalogue
    // costs about a second at start and again at the first prompt.
    ProfileSpec {
        // Its preset leaves the proxy off (its providers read their base URLs their own way):
        // the profile names it, for the provider its config points there.
        keys: format!(
            "model_proxy = {{ openai = {{ key = \"OPENAI_API_KEY\", upstream = \"{}\" }} }}\n",
            fake.base_url()
        ),
        harness_env: ProfileSpec::pairs(&[("OPENAI_API_KEY", PASSED_KEY.to_owned())]),
        key: PASSED_KEY.to_owned(),
        env: ProfileSpec::pairs(&[
            ("XDG_CONFIG_HOME", "{home}/.config".to_owned()),
            ("OPENCODE_DISABLE_MODELS_FETCH", "1".to_owned()),
            ("OPENCODE_DISABLE_LSP_DOWNLOAD", "1".to_owned()),
            ("OPENCODE_DISABLE_DEFAULT_PLUGINS", "1".to_owned()),
            ("OPENCODE_DISABLE_SHARE", "1".to_owned()),
        ]),
        ..Default::default()
    }
}

/// The key the rig passes through (to the model proxy; the agent gets a token).
const PASSED_KEY: &str = "dummy-key-passed-through";

/// `opencode-ai` 1.18.33 (its Linux x64 binary package). Its modes (`build`, `plan`) say which
/// tools it may use; asking is its `permission` config (the preset's `OPENCODE_PERMISSION`).
pub fn opencode_1_18_33(test: &str) -> Option<Agent> {
    let dir = agents_dir(test)?;
    let binary = installed(
        &dir,
        "opencode-1.18.33/node_modules/opencode-linux-x64/bin/opencode",
    );
    Some(Agent {
        name: "opencode",
        package: "opencode-ai",
        version: "1.18.33",
        preset: "opencode",
        api: Api::OpenAiChat,
        command: binary,
        args: vec!["acp".to_owned()],
        profile: opencode_profile,
        unasked: (r#"env.OPENCODE_PERMISSION = {"edit":"allow"}"#, |spec| {
            spec.env
                .push(("OPENCODE_PERMISSION".into(), r#"{"edit":"allow"}"#.into()))
        }),
        // Its key is in its own config, for the provider; it asks for no sign-in of its own.
        without_key: None,
        switch_model: ("fake/fake-small", "fake-small"),
        session_files: ".local/share/opencode",
        default_retries: None,
    })
}

agent_scenarios!(opencode_1_18_33, super::opencode_1_18_33);
