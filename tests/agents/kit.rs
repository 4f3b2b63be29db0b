//! What every agent's scenarios share: which agent is under test and where it is installed, a
//! rig (fake model server + real harness process + a profile running the agent), turn helpers,
//! and the outcome of each scenario for the compatibility matrix.

use std::{
    future::Future,
    io::Write,
    path::{Path, PathBuf},
    time::Duration,
};

use agent_harness::pb::v1 as pb;
use agent_harness_model_fakes::{Api, FakeServer};
use agent_harness_testkit::{
    process::{Serve, ServeProcess},
    support::{Session, Watch},
};
use serde_json::{Value, json};

/// The folder the agents are installed in (`scripts/test agents` sets it to `.tools/agents`).
pub const AGENTS_DIR_VAR: &str = "AGENT_HARNESS_AGENTS_DIR";
/// Where each scenario's outcome is written, one JSON file per agent and scenario.
pub const RESULTS_VAR: &str = "AGENT_HARNESS_AGENTS_RESULTS";

/// How long one scenario may take: a real agent starts in a few seconds and a turn takes one or
/// two more; some scenarios start it two or three times, and on a loaded machine opencode takes
/// half a minute to start.
pub const SCENARIO_TIMEOUT: Duration = Duration::from_secs(180);

/// An installed agent under test.
#[derive(Debug, Clone)]
pub struct Agent {
    /// The matrix's row name, e.g. `claude-agent-acp`.
    pub name: &'static str,
    /// The npm package it is installed from.
    pub package: &'static str,
    pub version: &'static str,
    /// The harness preset for it (`agent-harness profiles`): every profile the scenarios run
    /// names it, and writes only what the offline rig needs besides.
    pub preset: &'static str,
    /// The model API it calls.
    pub api: Api,
    /// The installed copy's program and arguments, written over the preset's `npx` command
    /// line (the `preset_command` scenario runs the preset's own command instead).
    pub command: PathBuf,
    pub args: Vec<String>,
    /// Its profile against a fake model server, given the seed of its HOME (it may write files
    /// there, e.g. a config file, which the harness copies into the owner's HOME in the box).
    pub profile: fn(&FakeServer, &Path) -> ProfileSpec,
    /// What a profile writes to have the agent edit without asking (undoing the preset's
    /// asking choice), for the `modes` scenario: as the matrix says it, and the change.
    pub unasked: (&'static str, fn(&mut ProfileSpec)),
    /// Takes its API key away, for the `without_a_key` scenario; `None`: it asks for no
    /// sign-in of its own (the key is the provider's business).
    pub without_key: Option<fn(&mut ProfileSpec)>,
    /// The model the model-switch scenario chooses, and a part of the name the model API then
    /// sees.
    pub switch_model: (&'static str, &'static str),
    /// Where under HOME the agent keeps its session files (JSON lines): the kill -9 scenario
    /// waits until the first turn is in them.
    pub session_files: &'static str,
    /// Gives back the agent's own retry settings where its rig turns retries off (for the
    /// scenario of a model API 500 with the agent's defaults); `None`: the rig leaves them.
    pub default_retries: Option<fn(&mut ProfileSpec)>,
}

impl Agent {
    /// Its preset, as the harness defines it.
    pub fn preset(&self) -> &'static agent_harness::config::Preset {
        agent_harness::config::preset::find(self.preset)
            .unwrap_or_else(|| panic!("no preset {}", self.preset))
    }
}

/// An agent's known defect: the scenario it fails, and how.
pub struct KnownDefect {
    pub agent: &'static str,
    pub version: &'static str,
    pub scenario: &'static str,
    pub defect: &'static str,
}

/// Scenarios the agents are known to get wrong. A listed scenario passes only while the agent
/// still deviates as described, and fails once the agent gets it right.
/// (opencode 1.18.33 retries a model API 429 or 5xx without end; its preset's `turn_timeout`
/// defends against that, so its cells pass through the defence and the note says so.)
pub const KNOWN_DEFECTS: &[KnownDefect] = &[
    KnownDefect {
        agent: "qwen-code",
        version: "0.24.4",
        scenario: "model_error_429",
        defect: QWEN_RETRIES,
    },
    KnownDefect {
        agent: "qwen-code",
        version: "0.24.4",
        scenario: "model_error_500",
        defect: QWEN_RETRIES,
    },
];

const QWEN_RETRIES: &str = "a model API 429 or 5xx is retried with backoff even when the answer \
     says not to (`x-should-retry: false`), for about 100 s, before the turn ends FAILED (the \
     own-retries column); no defence is needed, as the turn does end (a profile's `turn_timeout` \
     shortens it)";

/// The agents folder, or `None` (after saying so loudly) when the agents are not installed here.
pub fn agents_dir(test: &str) -> Option<PathBuf> {
    match std::env::var_os(AGENTS_DIR_VAR) {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => {
            let banner = "!".repeat(78);
            eprintln!(
                "{banner}\n!! SKIPPED {test}: {AGENTS_DIR_VAR} is not set, so no real agent ran.\n\
                 !! Run `scripts/test agents` (it installs the pinned agents and sets it).\n{banner}"
            );
            None
        }
    }
}

/// `program` on PATH.
pub fn which(program: &str) -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("{program} is not on PATH"))
}

/// A file an installed agent must have; fails loudly when the folder lacks it.
pub fn installed(dir: &Path, relative: &str) -> PathBuf {
    let path = dir.join(relative);
    assert!(
        path.is_file(),
        "{} is missing: {AGENTS_DIR_VAR}={} is set, so the agents must be installed there \
         (scripts/test agents does it)",
        path.display(),
        dir.display()
    );
    path
}

/// What a scenario found.
#[derive(Debug)]
pub enum Outcome {
    /// The agent did what a user expects (a note for the matrix, e.g. how a session reopened).
    Pass(String),
    /// The agent did something else (evidence attached): a failure, unless it is a known defect.
    Deviates(String),
    /// The agent does not advertise what the scenario needs (what it advertises instead).
    NotSupported(String),
}

/// Runs one scenario of `agent` under the scenario timeout and records its outcome: a panic or
/// an unlisted deviation fails the test; a listed deviation passes as its known defect; a listed
/// scenario that passes fails the test, so the list is corrected.
pub async fn scenario<F>(agent: &Agent, name: &'static str, body: F)
where
    F: Future<Output = Outcome> + Send + 'static,
{
    scenario_within(agent, name, SCENARIO_TIMEOUT, body).await;
}

/// [`scenario`] with a timeout of its own (for a scenario that repeats itself).
pub async fn scenario_within<F>(agent: &Agent, name: &'static str, timeout: Duration, body: F)
where
    F: Future<Output = Outcome> + Send + 'static,
{
    let known = KNOWN_DEFECTS
        .iter()
        .find(|d| d.agent == agent.name && d.version == agent.version && d.scenario == name);
    let outcome = tokio::spawn(async move {
        match tokio::time::timeout(timeout, body).await {
            Ok(outcome) => outcome,
            Err(_) => panic!("the scenario did not finish within {timeout:?}"),
        }
    })
    .await;
    match (outcome, known) {
        (Ok(Outcome::Pass(note)), None) => record(agent, name, "pass", &note),
        (Ok(Outcome::NotSupported(note)), None) => record(agent, name, "not-supported", &note),
        (Ok(Outcome::Deviates(evidence)), Some(defect)) => {
            record(
                agent,
                name,
                "known-defect",
                &format!("{}; seen: {evidence}", defect.defect),
            );
            eprintln!(
                "known defect of {} {}: {evidence}",
                agent.name, agent.version
            );
        }
        (Ok(Outcome::Deviates(evidence)), None) => {
            record(agent, name, "fail", &evidence);
            panic!("{} {} failed {name}: {evidence}", agent.name, agent.version);
        }
        (Ok(Outcome::Pass(_) | Outcome::NotSupported(_)), Some(defect)) => {
            record(
                agent,
                name,
                "fail",
                "the known defect no longer shows: remove it from KNOWN_DEFECTS",
            );
            panic!(
                "{} {} now passes {name}, listed as a known defect ({}): remove it from \
                 KNOWN_DEFECTS",
                agent.name, agent.version, defect.defect
            );
        }
        (Err(join), _) => {
            let message = join
                .into_panic()
                .downcast::<String>()
                .map(|s| *s)
                .unwrap_or_else(|p| {
                    p.downcast::<&str>()
                        .map(|s| s.to_string())
                        .unwrap_or_default()
                });
            record(agent, name, "fail", &message);
            panic!("{message}");
        }
    }
}

fn record(agent: &Agent, scenario: &str, result: &str, detail: &str) {
    let Some(dir) = std::env::var_os(RESULTS_VAR).filter(|d| !d.is_empty()) else {
        return;
    };
    let dir = PathBuf::from(dir);
    std::fs::create_dir_all(&dir).expect("the results folder");
    let line = json!({
        "agent": agent.name,
        "package": agent.package,
        "version": agent.version,
        "scenario": scenario,
        "result": result,
        "detail": detail,
        // Every rig runs the agent in its box (`profile_toml` leaves the default on).
        "sandboxed": true,
    });
    let path = dir.join(format!("{}@{}.{scenario}.json", agent.name, agent.version));
    let mut file = std::fs::File::create(&path).expect("a result file");
    writeln!(file, "{line}").expect("the result is written");
}

/// The profile the rig's harness runs the agent with, over the agent's preset: what the
/// offline rig needs besides (the fake's address, a private HOME, a key).
#[derive(Debug, Clone, Default)]
pub struct ProfileSpec {
    /// The profile's `env` (values written in the config file).
    pub env: Vec<(String, String)>,
    /// Variables of the harness's own environment (a key the preset passes through).
    pub harness_env: Vec<(String, String)>,
    /// The profile's `env_files` (a key read from a file, as from a mounted Secret).
    pub env_files: Vec<(String, PathBuf)>,
    /// Keys of the profile's table (TOML lines, e.g. `restart_after_cancel = false`).
    pub keys: String,
    /// TOML appended after the profile's tables (e.g. `[[profiles.agent.permission_rules]]`).
    pub extra_toml: String,
    /// Run the preset's own command line (`npx`, offline from the npm cache the stage filled)
    /// instead of the installed copy.
    pub preset_command: bool,
    /// The npm cache every box shows read-only (`[sandbox] npm_cache`).
    pub npm_cache: Option<PathBuf>,
    /// The provider's key the harness holds, as the model API should see it.
    pub key: String,
}

impl ProfileSpec {
    /// `(key, value)` pairs as owned strings.
    pub fn pairs(list: &[(&str, String)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }
}

/// Variables that may carry real keys: the harness a rig starts never inherits them from the
/// test's environment (only what a spec says reaches it).
const KEY_VARIABLES: &[&str] = &[
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "OPENAI_API_KEY",
    "CODEX_API_KEY",
];

/// `serve` with the harness environment `spec` asks for, and no key of the test's own.
pub fn serve_with(mut serve: Serve, spec: &ProfileSpec) -> Serve {
    for key in KEY_VARIABLES {
        serve = serve.env_remove(key);
    }
    for (key, value) in &spec.harness_env {
        serve = serve.env(key, value);
    }
    serve
}

/// The name of the rig's profile.
pub const PROFILE: &str = "agent";

/// Where the rig's boxes keep the agents' HOMEs, what seeds them, and the fake they may reach.
#[derive(Debug, Clone)]
pub struct Boxing {
    pub homes_dir: PathBuf,
    pub seed: PathBuf,
    pub fake: std::net::SocketAddr,
}

impl Boxing {
    /// The HOME of the rig's sessions (all owned by `local`).
    pub fn home(&self) -> PathBuf {
        self.homes_dir.join(PROFILE).join("local")
    }
}

/// A fake model server, a real harness process and a profile that runs the agent against it
/// in its box, all in one temporary folder: `seed/` (what the agent's HOME is seeded with),
/// `homes/` (the HOMEs), `work/` (the sessions' working directory), `data/` (the harness's
/// SQLite store).
pub struct Rig {
    pub dir: tempfile::TempDir,
    pub fake: FakeServer,
    pub server: ServeProcess,
    pub boxing: Boxing,
    key: String,
}

impl Rig {
    /// A rig running the agent with its own profile.
    pub async fn start(agent: &Agent) -> Rig {
        Self::start_with(agent, |_| {}).await
    }

    /// A rig running the agent with its own profile, changed by `edit`.
    pub async fn start_with(agent: &Agent, edit: impl FnOnce(&mut ProfileSpec)) -> Rig {
        let dir = tempfile::Builder::new()
            .prefix("agent-harness-agents-")
            .tempdir()
            .expect("a temporary folder");
        for sub in ["seed", "work"] {
            std::fs::create_dir_all(dir.path().join(sub)).expect("a folder");
        }
        let fake = FakeServer::start(agent.api)
            .await
            .expect("the fake model server starts");
        let boxing = Boxing {
            homes_dir: dir.path().join("homes"),
            seed: dir.path().join("seed"),
            fake: fake.addr(),
        };
        let mut spec = (agent.profile)(&fake, &boxing.seed);
        edit(&mut spec);
        let config = dir.path().join("config.toml");
        std::fs::write(&config, profile_toml(agent, &spec, &boxing))
            .expect("the config is written");
        let server = serve_with(Serve::on(dir.path().join("data"), &config), &spec).start();
        Rig {
            dir,
            fake,
            server,
            boxing,
            key: spec.key.clone(),
        }
    }

    /// The provider's key the harness holds (and the model proxy swaps in for the agent's
    /// token): the one the fake should see.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// How many turn steps the fake model API was asked with `prompt` as the latest user text
    /// (each retry of an agent counts).
    pub fn asked(&self, prompt: &str) -> usize {
        self.fake
            .requests()
            .iter()
            .filter(|r| r.is_turn_step() && r.last_user_text.as_deref() == Some(prompt))
            .count()
    }

    /// The agent's HOME in its box.
    pub fn home(&self) -> PathBuf {
        self.boxing.home()
    }

    pub fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// A new session on the agent's profile, in `work/` (in the mode its preset chooses).
    pub async fn session(&self, _agent: &Agent) -> Session {
        self.session_as_started().await
    }

    /// A new session on the agent's profile, in `work/`.
    pub async fn session_as_started(&self) -> Session {
        Session::create_with_client(
            self.server.client().await,
            pb::CreateSessionRequest {
                profile: PROFILE.into(),
                cwd: self.work().to_string_lossy().into_owned(),
                ..Default::default()
            },
        )
        .await
    }
}

fn toml_string(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}

/// The rig's config: the agent's profile over its preset, boxed (the default) with the installed
/// agents shown read-only, its HOME seeded, and the fake model server the only place it may
/// reach (forwarded at its own loopback address inside the box).
pub fn profile_toml(agent: &Agent, spec: &ProfileSpec, boxing: &Boxing) -> String {
    let mut toml = format!(
        "[sandbox]\nhomes_dir = {}\n",
        toml_string(&boxing.homes_dir.to_string_lossy())
    );
    if let Some(cache) = &spec.npm_cache {
        toml.push_str(&format!(
            "npm_cache = {}\n",
            toml_string(&cache.to_string_lossy())
        ));
    }
    let agents = std::env::var(AGENTS_DIR_VAR).expect("the agents' folder");
    toml.push_str(&format!(
        "\n[profiles.{PROFILE}]\npreset = {}\ncancel_grace = \"10s\"\n\
         sandbox = {{ read_only = [{}], home_seed = {} }}\n\
         egress = {{ allow = [\"127.0.0.1:{}\"] }}\n",
        toml_string(agent.preset),
        toml_string(&agents),
        toml_string(&boxing.seed.to_string_lossy()),
        boxing.fake.port(),
    ));
    if !spec.preset_command {
        let args: Vec<String> = agent.args.iter().map(|a| toml_string(a)).collect();
        toml.push_str(&format!(
            "command = {}\nargs = [{}]\n",
            toml_string(&agent.command.to_string_lossy()),
            args.join(", ")
        ));
    }
    if !spec.env_files.is_empty() {
        let files: Vec<String> = spec
            .env_files
            .iter()
            .map(|(k, path)| format!("{k} = {}", toml_string(&path.to_string_lossy())))
            .collect();
        toml.push_str(&format!("env_files = {{ {} }}\n", files.join(", ")));
    }
    toml.push_str(&spec.keys);
    toml.push_str(&format!("\n[profiles.{PROFILE}.env]\n"));
    for (key, value) in &spec.env {
        toml.push_str(&format!("{key} = {}\n", toml_string(value)));
    }
    toml.push('\n');
    toml.push_str(&spec.extra_toml);
    toml
}

/// Waits for the runtime's answer to the prompt `action_id`; its `stopReason`.
pub async fn turn_end(watch: &mut Watch, action_id: &str) -> String {
    let answer = watch.response_to(action_id).await;
    note(&format!("turn {action_id} answered"));
    answer["result"]["stopReason"]
        .as_str()
        .unwrap_or_else(|| panic!("the prompt was answered without a stop reason: {answer}"))
        .to_owned()
}

/// The transcript's agent message answering `action_id`.
pub async fn agent_message(session: &mut Session, action_id: &str) -> pb::TranscriptMessage {
    let transcript = session.transcript().await;
    transcript
        .messages
        .into_iter()
        .find(|m| {
            m.role == pb::MessageRole::Agent as i32 && m.request_id.as_deref() == Some(action_id)
        })
        .unwrap_or_else(|| panic!("no agent message answers {action_id}"))
}

/// The visible text of a transcript message.
pub fn text_of(message: &pb::TranscriptMessage) -> String {
    message
        .parts
        .iter()
        .filter_map(|p| match &p.kind {
            Some(pb::message_part::Kind::Text(t)) => Some(t.text.as_str()),
            _ => None,
        })
        .collect()
}

/// The tool calls of a transcript message.
pub fn tools_of(message: &pb::TranscriptMessage) -> Vec<pb::ToolPart> {
    message
        .parts
        .iter()
        .filter_map(|p| match &p.kind {
            Some(pb::message_part::Kind::Tool(t)) => Some(t.clone()),
            _ => None,
        })
        .collect()
}

/// A line in the test's output (shown when it fails), so a scenario that hangs shows how far it
/// came.
pub fn note(what: &str) {
    eprintln!("[agents] {what}");
}

/// Waits (polling, bounded by the scenario's timeout) until `check` holds.
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let mut waited = Duration::ZERO;
    while !check() {
        assert!(waited < SCENARIO_TIMEOUT, "{what}: still not true");
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += Duration::from_millis(50);
    }
}
