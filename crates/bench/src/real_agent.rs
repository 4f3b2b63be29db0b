//! The real-agent figure (docs/benchmarks.md, "A real agent"): a turn of Claude Code through its
//! ACP adapter (`@agentclientprotocol/claude-agent-acp`, the version the `claude` preset runs,
//! installed into `.tools/agents` by `scripts/test`) against the scripted fake Anthropic server
//! of `crates/model-fakes` on loopback, through the harness (Control, then the response entry on
//! a LOG-view Subscribe), held against the same adapter driven directly over its stdio
//! (initialize, session/new, session/prompt as JSON-RPC lines), same fake, same prompt, same run.
//!
//! Both sides get the same environment: the preset's switches that keep Claude Code from calling
//! home, `ANTHROPIC_BASE_URL` naming the fake's 127.0.0.1 address, a dummy key and a private
//! HOME each; nothing else of the bench's environment (a real key or base URL in it never
//! reaches either adapter). Both send the same prompt frame (the harness's, hidden block
//! included) and set the preset's config options after session/new. Turns are interleaved in
//! blocks, so both conversations grow alike. Smoke runs skip it (starting Claude Code takes
//! seconds); so does a machine without the adapter installed.

use std::{
    collections::BTreeMap,
    ffi::OsString,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use agent_harness::{
    acp::frames::{self as acp_frames, PromptOptions},
    config::preset,
    domain::{ActionId, PromptAction},
    pb::v1 as pb,
};
use agent_harness_model_fakes::{Api, FakeServer, Recorder};
use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, BufWriter},
    process::{Child, ChildStdin, ChildStdout, Command},
    time::Instant,
};

use super::{
    Ctx,
    client::{self, LogStream},
    report::{PhaseReport, Row, Verdict, ms},
    server::{ScratchDir, ServerProcess, connect_pool},
    stats::Summary,
};

pub const FIGURE: &str = "real-agent turn through the harness (Claude adapter, fake model)";
pub const TARGET: &str = "overhead <= 2.000 ms p50";
const LIMIT: Duration = Duration::from_millis(2);
/// The preset whose adapter and environment both sides run.
const PRESET: &str = "claude";
/// The profile the harness runs it as.
const PROFILE: &str = "claude";
/// The prompt of every turn: the fake answers plain text with one short streamed reply.
const TEXT: &str = "ping";
/// Blocks the timed turns are interleaved in (direct, harness, direct, harness, …): many short
/// ones, as a turn of Claude Code takes long enough for the machine's load to drift within a
/// block, and a conversation's turns slow down as it grows.
const BLOCKS: usize = 20;
/// One exchange with Claude Code (its first answer includes its start) may take this long.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(120);

/// The adapter's entry point under the tools folder, as `scripts/test` installs it.
fn adapter(tools: &Path) -> Option<PathBuf> {
    let preset = preset::find(PRESET)?;
    let entry = tools.join(format!(
        "agents/claude-agent-acp-{}/node_modules/{}/dist/index.js",
        preset.version, preset.package
    ));
    entry.is_file().then_some(entry)
}

pub fn skipped(why: &str) -> PhaseReport {
    PhaseReport {
        rows: vec![Row {
            key: "real-agent",
            figure: FIGURE.to_owned(),
            measured: "-".to_owned(),
            against: "-".to_owned(),
            ratio: None,
            target: TARGET.to_owned(),
            verdict: Verdict::Skipped,
        }],
        notes: vec![format!("real-agent: SKIPPED ({why})")],
    }
}

/// `program` on PATH, as an absolute path (the harness's profile names it so).
fn on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// The timed turns: the plan's round-trip turns scaled to a turn of Claude Code (tens of ms).
fn turns(ctx: &Ctx) -> (usize, usize) {
    (
        (ctx.plan.rtt_turns / 10).max(BLOCKS),
        (ctx.plan.rtt_warmup / 10).max(2),
    )
}

pub async fn run(ctx: &Ctx, smoke: bool) -> anyhow::Result<PhaseReport> {
    if smoke {
        return Ok(skipped("smoke run; the full run measures the real agent"));
    }
    let tools = ctx
        .tools
        .canonicalize()
        .unwrap_or_else(|_| ctx.tools.clone());
    let Some(entry) = adapter(&tools) else {
        let preset = preset::find(PRESET).context("the claude preset")?;
        return Ok(skipped(&format!(
            "{} {} is not installed under {}/agents: `scripts/test bench-peers` installs it",
            preset.package,
            preset.version,
            tools.display()
        )));
    };
    let Some(node) = on_path("node") else {
        return Ok(skipped("node is not on PATH"));
    };
    let preset = preset::find(PRESET).context("the claude preset")?;
    let fake = FakeServer::start(Api::Anthropic)
        .await
        .context("starting the fake model server")?;
    let (count, warmup) = turns(ctx);

    // What both sides give the adapter besides PATH and LANG (HOME differs: one each).
    let mut env: BTreeMap<String, String> = preset.env_map();
    env.insert("ANTHROPIC_BASE_URL".into(), fake.base_url());
    env.insert("ANTHROPIC_API_KEY".into(), "dummy-key-for-the-fake".into());

    let homes = ScratchDir::new("real-agent-homes")?;
    let scratch = homes.path();
    let home_harness = scratch.join("home-harness");
    let home_direct = scratch.join("home-direct");
    let work = scratch.join("work");
    for dir in [&home_harness, &home_direct, &work] {
        std::fs::create_dir_all(dir)?;
    }
    let config = profile_toml(
        &node,
        &entry,
        &env,
        &home_harness,
        &tools,
        fake.addr().port(),
    );
    let server = ServerProcess::serve(&ctx.bin, "real-agent", &config).await?;
    let outcome = measure(
        &server,
        Side {
            node: &node,
            entry: &entry,
            env: &env,
            home: &home_direct,
            work: &work,
            options: preset.config_options_map(),
        },
        fake.recorder(),
        count,
        warmup,
    )
    .await;
    server.stop().await?;
    let mut timed = outcome?;

    let h = Summary::of(&mut timed.harness).context("no harness turns")?;
    let d = Summary::of(&mut timed.direct).context("no direct turns")?;
    let overhead = h.p50.as_secs_f64() * 1e3 - d.p50.as_secs_f64() * 1e3;
    Ok(PhaseReport {
        rows: vec![Row {
            key: "real-agent",
            figure: format!("{FIGURE}, p50"),
            measured: format!("{} (overhead {overhead:.3} ms)", ms(h.p50)),
            against: format!("direct stdio {}", ms(d.p50)),
            ratio: Some(h.p50.as_secs_f64() / d.p50.as_secs_f64().max(1e-9)),
            target: TARGET.to_owned(),
            verdict: Verdict::of(overhead <= LIMIT.as_secs_f64() * 1e3),
        }],
        notes: vec![
            format!(
                "real-agent: {} {} on Node ({}), fake Anthropic Messages server on {}; {} turns \
                 each way after {warmup} warm-up turns, prompt {TEXT:?}, {BLOCKS} interleaved \
                 blocks, each side first in every other one; model requests per timed turn: \
                 harness {:.2}, direct {:.2}",
                preset.package,
                preset.version,
                node.display(),
                fake.base_url(),
                h.count,
                timed.harness_model_calls as f64 / h.count as f64,
                timed.direct_model_calls as f64 / d.count as f64,
            ),
            format!(
                "real-agent: harness p99 {}, max {}; direct p99 {}, max {}; the direct adapter \
                 wrote {} bytes to stderr in {} turns",
                ms(h.p99),
                ms(h.max),
                ms(d.p99),
                ms(d.max),
                timed.direct_stderr_bytes,
                d.count + warmup,
            ),
        ],
    })
}

fn toml_string(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}

/// The harness's profile: the preset, with the installed adapter as its command and every
/// variable written (naming ANTHROPIC_* here drops the preset's passthrough of them, so the
/// bench's own environment cannot reach the adapter); in its box (the default), as a user runs
/// it: the installed adapter shown read-only, the fake model server the one place it may
/// reach, its HOME under `homes` (the direct side gets one of its own).
fn profile_toml(
    node: &Path,
    entry: &Path,
    env: &BTreeMap<String, String>,
    homes: &Path,
    tools: &Path,
    fake_port: u16,
) -> String {
    let mut toml = format!(
        "[sandbox]\nhomes_dir = {}\n\n[profiles.{PROFILE}]\npreset = {}\ncommand = {}\nargs = [{}]\n\
         sandbox = {{ read_only = [{}] }}\negress = {{ allow = [\"127.0.0.1:{fake_port}\"] }}\n\n\
         [profiles.{PROFILE}.env]\n",
        toml_string(&homes.to_string_lossy()),
        toml_string(PRESET),
        toml_string(&node.to_string_lossy()),
        toml_string(&entry.to_string_lossy()),
        toml_string(&tools.to_string_lossy()),
    );
    for (key, value) in env.iter().filter(|(key, _)| !preset_sets(key)) {
        toml.push_str(&format!("{key} = {}\n", toml_string(value)));
    }
    toml
}

/// Whether the preset itself writes `key` (the profile then leaves it to the preset).
fn preset_sets(key: &str) -> bool {
    preset::find(PRESET).is_some_and(|p| p.env.iter().any(|(k, _)| *k == key))
}

/// The direct side's launch.
struct Side<'a> {
    node: &'a Path,
    entry: &'a Path,
    env: &'a BTreeMap<String, String>,
    home: &'a Path,
    work: &'a Path,
    options: BTreeMap<String, String>,
}

/// Times the turns of both sides, interleaved, and counts the model requests of each.
async fn measure(
    server: &ServerProcess,
    side: Side<'_>,
    recorder: &Recorder,
    count: usize,
    warmup: usize,
) -> anyhow::Result<Timed> {
    let pool = connect_pool(server.addr(), 2).await?;
    let created = tokio::time::timeout(
        EXCHANGE_TIMEOUT,
        client::sessions(&pool[0]).create_session(pb::CreateSessionRequest {
            profile: PROFILE.to_owned(),
            cwd: side.work.to_string_lossy().into_owned(),
            ..Default::default()
        }),
    )
    .await
    .context("CreateSession timed out")?
    .context("CreateSession")?
    .into_inner()
    .session
    .context("CreateSession answered no session")?;
    let mut stream = LogStream::open(&pool[1], &created.id, created.head_offset).await?;
    let mut control = client::sessions(&pool[0]);
    let mut direct = DirectAdapter::start(&side).await?;

    let mut harness_turn = async || -> anyhow::Result<Duration> {
        let start = Instant::now();
        let action_id = client::prompt(&mut control, &created.id, TEXT).await?;
        let entry = tokio::time::timeout(EXCHANGE_TIMEOUT, stream.response_to(&action_id))
            .await
            .context("the harness did not answer in time")??;
        let took = start.elapsed();
        let frame: Value = serde_json::from_str(&entry.json)?;
        if frame["result"]["stopReason"] != "end_turn" {
            bail!("a turn through the harness ended with {frame}");
        }
        Ok(took)
    };
    for _ in 0..warmup {
        direct.turn().await?;
        harness_turn().await?;
    }
    let per_block = count.div_ceil(BLOCKS).max(1);
    let mut timed = Timed::default();
    // Each side goes first in every other block, so neither always follows the other.
    for block in 0..BLOCKS {
        for harness_now in [block % 2 == 1, block % 2 == 0] {
            let before = recorder.len();
            for _ in 0..per_block {
                if harness_now {
                    timed.harness.push(harness_turn().await?);
                } else {
                    timed.direct.push(direct.turn().await?);
                }
            }
            let calls = recorder.len() - before;
            *if harness_now {
                &mut timed.harness_model_calls
            } else {
                &mut timed.direct_model_calls
            } += calls;
        }
    }
    timed.direct_stderr_bytes = direct
        .stderr_bytes
        .load(std::sync::atomic::Ordering::Relaxed);
    direct.stop().await;
    Ok(timed)
}

/// The timed turns of both sides, and the model requests each side's turns made.
#[derive(Default)]
struct Timed {
    harness: Vec<Duration>,
    direct: Vec<Duration>,
    harness_model_calls: usize,
    direct_model_calls: usize,
    /// What the direct adapter wrote to its stderr over the whole run.
    direct_stderr_bytes: u64,
}

/// The adapter spoken to directly over its stdio.
struct DirectAdapter {
    child: Child,
    stdin: BufWriter<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    line: String,
    session_id: String,
    /// Bytes the adapter wrote to its stderr so far.
    stderr_bytes: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl DirectAdapter {
    async fn start(side: &Side<'_>) -> anyhow::Result<Self> {
        let mut command = Command::new(side.node);
        command
            .arg(side.entry)
            .current_dir(side.work)
            .env_clear()
            .envs(
                ["PATH", "LANG"]
                    .into_iter()
                    .filter_map(|key| std::env::var_os(key).map(|v| (OsString::from(key), v))),
            )
            .envs(side.env)
            .env("HOME", side.home)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // A pipe read and dropped, as the harness reads a runtime's stderr.
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // A session of its own, as the harness gives every runtime: with the kernel's autogroup
        // scheduling, a session is a CPU group of its own, so on a busy machine the adapter gets
        // the same share of the CPU on both sides.
        // SAFETY: setsid(2) is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn().context("spawning the Claude adapter")?;
        let mut stderr = child.stderr.take().context("the adapter's stderr")?;
        let stderr_bytes = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = stderr_bytes.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n @ 1..) = tokio::io::AsyncReadExt::read(&mut stderr, &mut buf).await {
                counted.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            }
        });
        let stdin = BufWriter::new(child.stdin.take().context("the adapter's stdin")?);
        let stdout = BufReader::new(child.stdout.take().context("the adapter's stdout")?);
        let mut adapter = Self {
            child,
            stdin,
            stdout,
            line: String::new(),
            session_id: String::new(),
            stderr_bytes,
        };
        let id = json!("direct:init");
        adapter
            .exchange(&acp_frames::initialize_request(id.clone()), &id)
            .await?;
        let id = json!("direct:new");
        let cwd = side.work.to_string_lossy();
        let created = adapter
            .exchange(&acp_frames::new_session_request(id.clone(), &cwd), &id)
            .await?;
        adapter.session_id = created["result"]["sessionId"]
            .as_str()
            .with_context(|| format!("session/new answered {created}"))?
            .to_owned();
        // The preset's config options, as the harness sets them on its session.
        for (n, (config_id, value)) in side.options.iter().enumerate() {
            let id = json!(format!("direct:option:{n}"));
            let frame = json!({
                "jsonrpc": "2.0",
                "id": id,
                "method": "session/set_config_option",
                "params": {"sessionId": adapter.session_id, "configId": config_id, "value": value},
            });
            adapter.exchange(&frame, &id).await?;
        }
        Ok(adapter)
    }

    /// Sends a frame and reads lines until the response to `id`; a request from the adapter is
    /// refused (a plain turn makes none).
    async fn exchange(&mut self, frame: &Value, id: &Value) -> anyhow::Result<Value> {
        self.send(frame).await?;
        tokio::time::timeout(EXCHANGE_TIMEOUT, async {
            loop {
                self.line.clear();
                if self.stdout.read_line(&mut self.line).await? == 0 {
                    bail!("the Claude adapter closed its output");
                }
                let value: Value = serde_json::from_str(self.line.trim())
                    .context("the Claude adapter wrote a line that is not JSON")?;
                match (value.get("method"), value.get("id")) {
                    (None, Some(got)) if got == id => return Ok(value),
                    (Some(_), Some(request)) => {
                        let refusal = json!({
                            "jsonrpc": "2.0",
                            "id": request,
                            "error": {"code": -32601, "message": "not offered by the bench"},
                        });
                        self.send(&refusal).await?;
                    }
                    _ => {}
                }
            }
        })
        .await
        .context("the Claude adapter did not answer in time")?
    }

    async fn send(&mut self, frame: &Value) -> anyhow::Result<()> {
        self.stdin.write_all(frame.to_string().as_bytes()).await?;
        self.stdin.write_all(b"\n").await?;
        self.stdin.flush().await?;
        Ok(())
    }

    /// One timed turn: from building the prompt frame to reading its response.
    async fn turn(&mut self) -> anyhow::Result<Duration> {
        let start = Instant::now();
        let action_id = ActionId::mint();
        let frame = acp_frames::prompt_request(
            &action_id,
            &self.session_id,
            &PromptAction::text(TEXT),
            PromptOptions::default(),
        );
        let response = self.exchange(&frame, &frame["id"].clone()).await?;
        let took = start.elapsed();
        if response["result"]["stopReason"] != "end_turn" {
            bail!("a direct turn of the Claude adapter ended with {response}");
        }
        Ok(took)
    }

    /// Closes its input and waits briefly for it to exit (killed otherwise).
    async fn stop(mut self) {
        let _ = self.stdin.shutdown().await;
        drop(self.stdin);
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_names_the_fake_and_a_key_itself_so_no_variable_of_the_bench_reaches_claude() {
        let mut env = preset::find(PRESET).unwrap().env_map();
        env.insert("ANTHROPIC_BASE_URL".into(), "http://127.0.0.1:9".into());
        env.insert("ANTHROPIC_API_KEY".into(), "dummy".into());
        let text = profile_toml(
            Path::new("/usr/bin/node"),
            Path::new("/t/index.js"),
            &env,
            Path::new("/h"),
            Path::new("/t"),
            9,
        );
        let file: agent_harness::config::FileConfig = toml::from_str(&text).unwrap();
        let profile = file.profiles.get(PROFILE).expect("the profile");
        assert_eq!(profile.preset.as_deref(), Some(PRESET));
        let launch = agent_harness::config::LaunchKeys {
            command: profile.command.clone(),
            args: profile.args.clone(),
            env: profile.env.clone(),
            env_passthrough: profile.env_passthrough.clone(),
            env_files: profile.env_files.clone(),
        }
        .resolve("profiles.claude", preset::find(PRESET))
        .unwrap();
        assert_eq!(launch.command, "/usr/bin/node");
        assert_eq!(launch.env["ANTHROPIC_BASE_URL"], "http://127.0.0.1:9");
        assert!(
            !launch.env.contains_key("HOME"),
            "the box gives it its owner's"
        );
        assert!(
            launch.secrets.passthrough.is_empty(),
            "{:?}",
            launch.secrets.passthrough
        );
    }
}
