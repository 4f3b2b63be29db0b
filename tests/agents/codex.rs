//! Codex through its ACP adapter (`@zed-industries/codex-acp`, a native binary; preset
//! `codex`), against the fake OpenAI Responses API.
//!
//! The preset signs the agent in (`authenticate` with `openai-api-key`, which reads
//! `OPENAI_API_KEY`) and asks for `mode = read-only`. The rig's key comes from a file
//! (`env_files`, as from a mounted Secret) and stays with the model proxy: the agent's
//! `OPENAI_API_KEY` holds its session's token. The rig adds `CODEX_HOME` (its config and
//! session files, under the private HOME) whose `config.toml` names a custom model provider on
//! the proxy (`wire_api = "responses"`, no OpenAI login, no websockets, no retries) and a model
//! slug Codex knows, and `OPENAI_BASE_URL` (the fake), the proxy's upstream.

use std::path::Path;

use agent_harness_model_fakes::{Api, FakeServer};

use crate::kit::{Agent, ProfileSpec, agents_dir, installed};

/// The model the profile starts with: a slug Codex knows (it sizes the context and picks the
/// tools by it), so it offers `apply_patch` as a freeform tool.
pub const CODEX_MODEL: &str = "gpt-5.3-codex";

fn codex_profile(fake: &FakeServer, seed: &Path) -> ProfileSpec {
    // Its config file is seeded into the owner's HOME before every start (the box's HOME). Its
    // provider is the model proxy inside the box, whose token it reads from OPENAI_API_KEY.
    let codex_home = seed.join(".codex");
    std::fs::create_dir_all(&codex_home).expect("CODEX_HOME");
    let config = format!(
        "model = \"{CODEX_MODEL}\"\nmodel_provider = \"proxied\"\n\n[model_providers.proxied]\n\
         name = \"proxied\"\nbase_url = \"{PROXY}\"\nenv_key = \"OPENAI_API_KEY\"\n\
         wire_api = \"responses\"\nrequires_openai_auth = false\nsupports_websockets = false\n\
         request_max_retries = 0\nstream_max_retries = 0\n"
    );
    std::fs::write(codex_home.join("config.toml"), &config).expect("config.toml");
    // The same without the rig's retries off: Codex's own defaults (`default_retries`).
    let defaults = seed.join(".codex-defaults");
    std::fs::create_dir_all(&defaults).expect("a second CODEX_HOME");
    let own_retries = config.replace("request_max_retries = 0\nstream_max_retries = 0\n", "");
    std::fs::write(defaults.join("config.toml"), own_retries).expect("config.toml");
    // Beside the seed, never in it: a key file is the server's, and no box shows it.
    let key_file = seed.with_file_name("provider-key");
    std::fs::write(&key_file, format!("{FILE_KEY}\n")).expect("the key file");
    ProfileSpec {
        // The preset's proxy takes its upstream from the base URL the agent would have had.
        env: ProfileSpec::pairs(&[
            ("CODEX_HOME", "{home}/.codex".to_owned()),
            ("OPENAI_BASE_URL", format!("{}/v1", fake.base_url())),
        ]),
        env_files: vec![("OPENAI_API_KEY".to_owned(), key_file)],
        key: FILE_KEY.to_owned(),
        ..Default::default()
    }
}

/// The model proxy's OpenAI address in every box.
const PROXY: &str = "http://127.0.0.1:3129/openai/v1";
/// The provider's key, read from a file (as from a mounted Secret).
const FILE_KEY: &str = "dummy-key-from-a-file";

/// `@zed-industries/codex-acp` 0.16.0 (its Linux x64 binary package). Its approval presets are
/// the `mode` option: `read-only` asks before any edit (the preset's), `auto` edits the
/// workspace without asking, `full-access` never asks.
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
        preset: "codex",
        api: Api::OpenAiResponses,
        command: binary,
        args: Vec::new(),
        profile: codex_profile,
        // (`auto` still asks in a folder Codex does not trust, as the scenarios' is.)
        unasked: ("config_options = { mode = \"full-access\" }", |spec| {
            spec.keys
                .push_str("config_options = { mode = \"full-access\" }\n")
        }),
        // Without the key, the preset's sign-in fails.
        without_key: Some(|spec| spec.env_files.retain(|(k, _)| k != "OPENAI_API_KEY")),
        switch_model: ("gpt-5.4-mini", "gpt-5.4-mini"),
        session_files: ".codex/sessions",
        default_retries: Some(|spec| {
            for (key, value) in &mut spec.env {
                if key == "CODEX_HOME" {
                    *value = "{home}/.codex-defaults".to_owned();
                }
            }
        }),
    })
}

agent_scenarios!(codex_0_16_0, super::codex_0_16_0);
