//! `agent-harness profiles`: the built-in presets and the profiles a config file defines, with
//! what each resolves to (command line, pinned version, the names of the variables it gets).
//! It reads the file here and asks no server; it never prints an environment value of a
//! profile (only the presets' own, which are switches written in the source, never secrets).

use std::path::PathBuf;

use clap::Args;
use serde_json::{Value, json};

use super::{FileConfig, MOCK_PROFILE, Preset, Profile, ProfileFile, preset};

pub const PROFILES_HELP: &str = "Examples:
  agent-harness profiles                        # the presets, and the profiles of $AGENT_HARNESS_CONFIG
  agent-harness profiles --config harness.toml  # check a config file's profiles before serving it
  agent-harness profiles --json | jq -c 'select(.kind == \"preset\")'

A profile names a preset with `preset = \"claude\"` and writes only what differs
(docs/configuration.md, \"Agents and presets\"; docs/agents.md says what each was tested with).

  agent-harness profiles --config harness.toml --check   # and start each profile's box once

Exit codes:
  0  every profile resolves (and with --check, every box starts)
  1  the config file cannot be read, a profile does not resolve (the error names it), or with
     --check a box does not start (each failure says why)";

#[derive(Args)]
pub struct ProfilesArgs {
    /// The config file whose profiles to show (the presets are always listed)
    #[arg(long, env = "AGENT_HARNESS_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// One JSON object per preset and per profile, for scripts
    #[arg(long)]
    json: bool,
    /// Start each local profile's box once (the agent replaced by a probe) and say what fails
    /// and why: user namespaces, mounts, limits, whether its command is in the box, HOME and
    /// cwd taking writes. Reads the same flags' environment as `serve` (AGENT_HARNESS_DATA_DIR,
    /// …)
    #[arg(long)]
    check: bool,
}

/// Lists the presets, then the built-in `mock` profile and the file's profiles; the exit code.
pub fn run(args: ProfilesArgs) -> u8 {
    let file = match &args.config {
        Some(path) => match FileConfig::load(path) {
            Ok(file) => file,
            Err(error) => {
                eprintln!("error: {error:#}");
                return 1;
            }
        },
        None => FileConfig::default(),
    };
    let mut entries: Vec<Value> = preset::PRESETS.iter().map(preset_json).collect();
    let program = std::env::current_exe().unwrap_or_else(|_| "agent-harness".into());
    let mock = Profile::builtin_mock(program);
    if !file.profiles.contains_key(MOCK_PROFILE) {
        entries.push(profile_json(&mock, None, "built in"));
    }
    let mut failed = Vec::new();
    for (name, table) in file.profiles {
        match resolve(&name, table) {
            Ok(entry) => entries.push(entry),
            Err(error) => failed.push(format!("{error:#}")),
        }
    }
    let text: String = entries
        .iter()
        .map(|entry| match args.json {
            true => format!("{entry}\n"),
            false => format!("{}\n", render(entry)),
        })
        .collect();
    // A reader that goes away early (`| head`) is no failure.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    for error in &failed {
        eprintln!("error: {error}");
    }
    if args.check && failed.is_empty() {
        return check(args.config);
    }
    u8::from(!failed.is_empty())
}

/// `serve`'s flags, as far as their environment sets them.
#[derive(clap::Parser)]
struct ServeEnvironment {
    #[command(flatten)]
    args: super::ServeArgs,
}

/// `--check`: every local profile's box started once; its exit code.
fn check(config: Option<PathBuf>) -> u8 {
    use clap::Parser;
    let mut serve = ServeEnvironment::parse_from(["serve"]).args;
    serve.config = config;
    let program = std::env::current_exe().unwrap_or_else(|_| "agent-harness".into());
    let config = match super::ServeConfig::resolve(serve, program) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("error: {error:#}");
            return 1;
        }
    };
    let settings = match config.sandbox_settings() {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("error: {error:#}");
            return 1;
        }
    };
    let sandbox = crate::acp::sandbox::Sandbox::new(settings);
    println!("sandbox: {}", sandbox.describe());
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: {error}");
            return 1;
        }
    };
    let mut failures = 0;
    for profile in config.profiles.values().filter(|p| p.remote.is_none()) {
        let Some(policy) = &profile.sandbox else {
            println!("profile {}: unboxed (sandbox = \"off\")", profile.name);
            continue;
        };
        let problems = match sandbox.check_limits(policy) {
            Err(why) => vec![format!("its limits cannot be applied: {why}")],
            Ok(()) => match runtime.block_on(
                sandbox.check(
                    &profile.name,
                    profile.launch(),
                    policy,
                    profile
                        .startup_timeout
                        .min(std::time::Duration::from_secs(30)),
                ),
            ) {
                Ok(report) => report.problems(&profile.command.to_string_lossy()),
                Err(why) => vec![why],
            },
        };
        if problems.is_empty() {
            println!("profile {}: its box starts", profile.name);
        } else {
            failures += 1;
            for problem in problems {
                println!("profile {}: FAILS: {problem}", profile.name);
            }
        }
    }
    u8::from(failures > 0)
}

fn resolve(name: &str, table: ProfileFile) -> anyhow::Result<Value> {
    let named = table.preset.clone();
    let profile = table.resolve(name)?;
    let preset = named.as_deref().and_then(preset::find);
    let source = match &named {
        Some(named) => format!("config file, preset {named}"),
        None => "config file".to_owned(),
    };
    Ok(profile_json(&profile, preset, &source))
}

fn preset_json(preset: &Preset) -> Value {
    json!({
        "kind": "preset",
        "name": preset.name,
        "aliases": preset.aliases,
        "agent": preset.agent,
        "package": preset.package,
        "version": preset.version,
        "command": preset.command,
        "args": preset.args,
        "env": preset.env_map(),
        "env_passthrough": preset.env_passthrough,
        "config_options": preset.config_options_map(),
        "auth_method": preset.auth_method,
        "restart_after_cancel": preset.restart_after_cancel,
        "restart_after_error": preset.restart_after_error,
        "startup_timeout": preset.startup_timeout,
        "turn_timeout": preset.turn_timeout,
        "model_proxy": preset.model_proxy.iter().map(|p| format!("{} (when {} is set)", p.name(), p.key_var())).collect::<Vec<_>>(),
    })
}

/// A resolved profile: names of its variables, never their values.
fn profile_json(profile: &Profile, preset: Option<&Preset>, source: &str) -> Value {
    let passthrough: Vec<Value> = profile
        .secrets
        .passthrough
        .iter()
        .map(|name| json!({"name": name, "set_here": std::env::var_os(name).is_some()}))
        .collect();
    let mut entry = json!({
        "kind": "profile",
        "name": profile.name,
        "source": source,
        "preset": preset.map(|p| p.name),
        "package": preset.map(|p| p.package),
        "version": preset.map(|p| p.version),
        "env_names": profile.env.keys().collect::<Vec<_>>(),
        "env_passthrough": passthrough,
        "env_files": profile.secrets.files,
        "config_options": profile.config_options,
        "auth_method": profile.auth_method,
        "restart_after_cancel": profile.resilience.restart_after_cancel,
        "restart_after_error": profile.resilience.restart_after_error,
        "startup_timeout": humantime::format_duration(profile.startup_timeout).to_string(),
        "turn_timeout": profile.turn_timeout.map(|t| humantime::format_duration(t).to_string()),
        "model_proxy": profile.sandbox.iter().flat_map(|policy| &policy.model).map(|route| {
            let when = if route.when_key_set { format!("when {} is set", route.key_var) } else { format!("key {}", route.key_var) };
            format!("{} ({when})", route.provider.name())
        }).collect::<Vec<_>>(),
    });
    match &profile.remote {
        Some(remote) => {
            entry["runs_on"] = json!("bridge");
            entry["bridge_profile"] = json!(remote.bridge_profile);
            entry["bridge_labels"] = json!(remote.bridge_labels);
        }
        None => {
            entry["runs_on"] = json!("local");
            entry["command"] = json!(profile.command);
            entry["args"] = json!(profile.args);
        }
    }
    entry
}

/// A few lines for people.
fn render(entry: &Value) -> String {
    let text = |key: &str| entry[key].as_str().unwrap_or_default().to_owned();
    let list = |key: &str| -> String {
        match &entry[key] {
            Value::Array(items) if !items.is_empty() => items
                .iter()
                .map(|item| match item {
                    Value::String(s) => s.clone(),
                    Value::Object(o) => match o.get("set_here") {
                        Some(Value::Bool(true)) => {
                            format!("{} (set here)", o["name"].as_str().unwrap_or(""))
                        }
                        _ => format!("{} (not set here)", o["name"].as_str().unwrap_or("")),
                    },
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join(", "),
            Value::Object(map) if !map.is_empty() => map
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{k} = {}",
                        v.as_str()
                            .map(str::to_owned)
                            .unwrap_or_else(|| v.to_string())
                    )
                })
                .collect::<Vec<_>>()
                .join(", "),
            _ => "-".to_owned(),
        }
    };
    let command_line = || {
        let args = entry["args"].as_array().into_iter().flatten();
        std::iter::once(text("command"))
            .chain(args.filter_map(|a| a.as_str()).map(str::to_owned))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut lines = Vec::new();
    if entry["kind"] == "preset" {
        let aliases = match list("aliases").as_str() {
            "-" => String::new(),
            aliases => format!(" (also: {aliases})"),
        };
        lines.push(format!(
            "preset {}{aliases}: {}",
            text("name"),
            text("agent")
        ));
        lines.push(format!(
            "  package              {} {}",
            text("package"),
            text("version")
        ));
        lines.push(format!("  command              {}", command_line()));
        lines.push(format!("  env                  {}", list("env")));
        lines.push(format!(
            "  env_passthrough      {}",
            list("env_passthrough")
        ));
        lines.push(format!("  config_options       {}", list("config_options")));
        lines.push(format!(
            "  auth_method          {}",
            entry["auth_method"].as_str().unwrap_or("-")
        ));
    } else {
        lines.push(format!("profile {} ({})", text("name"), text("source")));
        if !entry["package"].is_null() {
            lines.push(format!(
                "  package              {} {}",
                text("package"),
                text("version")
            ));
        }
        if entry["runs_on"] == "bridge" {
            lines.push(format!(
                "  runs on              a bridge's profile {}",
                text("bridge_profile")
            ));
        } else {
            lines.push(format!("  command              {}", command_line()));
        }
        lines.push(format!("  env (names)          {}", list("env_names")));
        lines.push(format!(
            "  env_passthrough      {}",
            list("env_passthrough")
        ));
        lines.push(format!("  env_files            {}", list("env_files")));
        lines.push(format!("  config_options       {}", list("config_options")));
        lines.push(format!(
            "  auth_method          {}",
            entry["auth_method"].as_str().unwrap_or("-")
        ));
    }
    lines.push(format!("  model_proxy          {}", list("model_proxy")));
    lines.push(format!(
        "  restart_after_cancel {}",
        entry["restart_after_cancel"]
    ));
    lines.push(format!(
        "  restart_after_error  {}",
        entry["restart_after_error"]
    ));
    lines.push(format!(
        "  startup_timeout      {}",
        text("startup_timeout")
    ));
    if entry["turn_timeout"].is_string() {
        lines.push(format!("  turn_timeout         {}", text("turn_timeout")));
    }
    lines.join("\n") + "\n"
}
