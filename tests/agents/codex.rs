//! Codex through its ACP adapter (`@zed-industries/codex-acp`, a native binary), against the
//! fake OpenAI Responses API.
//!
//! The agent's environment: `CODEX_HOME` (its config and session files, under the private
//! HOME) whose `config.toml` names a custom model provider on the fake (`wire_api =
//! "responses"`, the key from an env var, no OpenAI login, no websockets, no retries) and a
//! model slug Codex knows. No `authenticate` call is needed.

use std::path::Path;

use agent_harness_model_fakes::{Api, FakeServer};

use crate::kit::{Agent, ProfileSpec, agents_dir, installed};

/// The model the profile starts with: a slug Codex knows (it sizes the context and picks the
/// tools by it), so it offers `apply_patch` as a freeform tool.
pub const CODEX_MODEL: &str = "gpt-5.3-codex";

fn codex_profile(fake: &FakeServer, home: &Path) -> ProfileSpec {
    let codex_home = home.join(".codex");
    std::fs::create_dir_all(&codex_home).expect("CODEX_HOME");
    let config = format!(
        "model = \"{CODEX_MODEL}\"\nmodel_provider = \"fake\"\n\n[model_providers.fake]\n\
         name = \"fake\"\nbase_url = \"{}/v1\"\nenv_key = \"FAKE_OPENAI_API_KEY\"\n\
         wire_api = \"responses\"\nrequires_openai_auth = false\nsupports_websockets = false\n\
         request_max_retries = 0\nstream_max_retries = 0\n",
        fake.base_url()
    );
    std::fs::write(codex_home.join("config.toml"), config).expect("config.toml");
    let env = [
        ("CODEX_HOME", codex_home.to_string_lossy().into_owned()),
        ("FAKE_OPENAI_API_KEY", "dummy".to_owned()),
        ("HOME", home.to_string_lossy().into_owned()),
    ];
    ProfileSpec {
        env: env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        extra_toml: String::new(),
    }
}

/// `@zed-industries/codex-acp` 0.16.0 (its Linux x64 binary package). Its approval presets are
/// the `mode` option: `read-only` asks before any edit, `auto` edits the workspace without
/// asking, `full-access` never asks; the scenarios choose `read-only`.
pub fn codex_0_16_0(test: &str) -> Option<Agent> {
    let dir = agents_dir(test)?;
    let binary = installed(
        &dir,
        "codex-acp-0.16.0/node_modules/@zed-industries/codex-acp-linux-x64/bin/codex-acp",
    );
    Some(Agent {
        name: "codex-acp",
        package: "@zed-industries/codex-acp",
        version: "0.16.0",
        api: Api::OpenAiResponses,
        command: binary,
        args: Vec::new(),
        profile: codex_profile,
        asking_mode: Some(("mode", "read-only")),
        switch_model: ("gpt-5.4-mini", "gpt-5.4-mini"),
        session_files: ".codex/sessions",
    })
}

agent_scenarios!(codex_0_16_0, super::codex_0_16_0);
