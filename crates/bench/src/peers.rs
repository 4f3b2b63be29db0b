//! The peer comparison (docs/benchmarks.md, "Against the peers"): the same agent — the Python ACP
//! SDK's example agent, from the sdist the interop stage installs — driven directly over stdio,
//! through agent-harness (LOG and MESSAGES views), through Rivet `sandbox-agent` 0.4.2 and (Node
//! only) through `acpx` 0.19.1, in one run, by two clients one after the other: one Node process
//! (`crates/bench/peers/peers.mjs`) and one Python process (`crates/bench/peers/peers.py`), each
//! driving every system the same way.
//!
//! The peers and the Node client's packages are installed at pinned versions into `.tools/peers`,
//! the Python client's (grpcio and `clients/python`) into `.tools/clients/venv`, by `scripts/test
//! bench-peers`; this phase starts one `serve` with a profile `echo` running the agent, runs the
//! Node client and then the Python client, and reads their samples. Smoke runs skip it.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context, bail};
use serde_json::Value;
use tokio::process::Command;

use super::{
    Ctx,
    report::{PhaseReport, Row, Verdict, ms},
    server::{ServerProcess, free_port},
    stats::Summary,
};

pub const LOG_FIGURE: &str = "turn round trip vs peers, Node client, Python echo agent, LOG view";
pub const LOG_TARGET: &str = "overhead below every peer's; <= 0.500 ms";
pub const MESSAGES_FIGURE: &str = "the same through the MESSAGES view (TurnEnded)";
pub const MESSAGES_TARGET: &str = "<= LOG + 0.500 ms";
pub const PYTHON_LOG_FIGURE: &str =
    "turn round trip vs sandbox-agent, Python client, Python echo agent, LOG view";
pub const PYTHON_LOG_TARGET: &str = "overhead below sandbox-agent's (Python client)";
pub const PYTHON_MESSAGES_FIGURE: &str =
    "the same through the MESSAGES view (TurnEnded), Python client";
const OVERHEAD_LIMIT: Duration = Duration::from_micros(500);
const MESSAGES_LIMIT: Duration = Duration::from_micros(500);
/// The client script, written into the tools folder so Node resolves the packages there.
const SCRIPT: &str = include_str!("../peers/peers.mjs");
/// The Python client script; its venv's interpreter finds the packages wherever it lies.
const PYTHON_SCRIPT: &str = include_str!("../peers/peers.py");
/// The venv `scripts/test bench-peers` installs grpcio and `clients/python` into.
const PYTHON_CLIENT_VENV: &str = "clients/venv/bin/python";
pub const SANDBOX_AGENT_VERSION: &str = "0.4.2";
const PY_ACP_VERSION: &str = "0.12.1";
/// The whole client run may take this long (acpx alone needs about 1 s per turn).
const RUN_TIMEOUT: Duration = Duration::from_secs(1800);

/// The systems in print order, with their labels.
const SYSTEMS: [(&str, &str); 5] = [
    ("direct", "direct stdio"),
    ("harness-log", "agent-harness, Subscribe LOG"),
    (
        "harness-msgs",
        "agent-harness, Subscribe MESSAGES (TurnEnded)",
    ),
    (
        "sandbox-agent",
        "Rivet sandbox-agent 0.4.2 (POST, SSE open)",
    ),
    ("acpx", "acpx 0.19.1 (library, createAcpRuntime)"),
];

/// The Python echo agent's command line, when `scripts/test` installed it under `tools`.
pub fn python_agent(tools: &Path) -> Option<Vec<String>> {
    let tools = tools.canonicalize().ok()?;
    let python = tools.join("agents/py/venv/bin/python");
    let agent = tools.join(format!(
        "agents/py/agent_client_protocol-{PY_ACP_VERSION}/examples/agent.py"
    ));
    (python.exists() && agent.exists()).then(|| {
        vec![
            python.to_string_lossy().into_owned(),
            agent.to_string_lossy().into_owned(),
        ]
    })
}

/// The `.tools` folder of the source tree this bench was built from.
pub fn default_tools() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools")
}

/// The client language that drove the systems, and what its rows hold the harness against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Client {
    Node,
    Python,
}

impl Client {
    fn log_row(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Client::Node => ("peers-log", LOG_FIGURE, LOG_TARGET),
            Client::Python => ("peers-log-python", PYTHON_LOG_FIGURE, PYTHON_LOG_TARGET),
        }
    }

    fn messages_row(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Client::Node => ("peers-messages", MESSAGES_FIGURE, MESSAGES_TARGET),
            Client::Python => (
                "peers-messages-python",
                PYTHON_MESSAGES_FIGURE,
                MESSAGES_TARGET,
            ),
        }
    }

    /// The peers it drives: acpx is a Node library, so the Python client drives sandbox-agent only.
    fn peers(self) -> &'static [&'static str] {
        match self {
            Client::Node => &["sandbox-agent", "acpx"],
            Client::Python => &["sandbox-agent"],
        }
    }

    fn name(self) -> &'static str {
        match self {
            Client::Node => "Node",
            Client::Python => "Python",
        }
    }
}

fn skipped_rows(client: Client) -> Vec<Row> {
    [client.log_row(), client.messages_row()]
        .into_iter()
        .map(|(key, figure, target)| Row {
            key,
            figure: figure.to_owned(),
            measured: "-".to_owned(),
            against: "-".to_owned(),
            ratio: None,
            target: target.to_owned(),
            verdict: Verdict::Skipped,
        })
        .collect()
}

pub fn skipped(why: &str) -> PhaseReport {
    let mut rows = skipped_rows(Client::Node);
    rows.extend(skipped_rows(Client::Python));
    PhaseReport {
        rows,
        notes: vec![format!("peers: skipped ({why})")],
    }
}

/// What both clients are given.
struct Inputs<'a> {
    agent: &'a [String],
    harness: std::net::SocketAddr,
    sandbox: &'a Path,
    scratch: &'a Path,
}

impl Inputs<'_> {
    /// The client's command with the inputs both scripts read, in `scratch/label`.
    fn command(&self, ctx: &Ctx, program: &Path, label: &str) -> anyhow::Result<Command> {
        let scratch = self.scratch.join(label);
        std::fs::create_dir_all(&scratch)?;
        let plan = &ctx.plan;
        let mut command = Command::new(program);
        command
            .env("PEERS_AGENT", serde_json::to_string(self.agent)?)
            .env("PEERS_HARNESS", self.harness.to_string())
            .env("PEERS_CWD", &scratch)
            .env("PEERS_SCRATCH", &scratch)
            .env("PEERS_SANDBOX_AGENT", self.sandbox)
            .env("PEERS_SANDBOX_PORT", free_port()?.to_string())
            .env("PEERS_SANDBOX_VERSION", SANDBOX_AGENT_VERSION)
            .env("PEERS_TURNS", plan.rtt_turns.to_string())
            .env("PEERS_WARMUP", plan.rtt_warmup.to_string())
            .env("PEERS_SLOW_TURNS", plan.peers_slow_turns.to_string())
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        Ok(command)
    }
}

/// Runs a client to its end and reads the JSON object it prints.
async fn run_client(mut command: Command, what: &str) -> anyhow::Result<Value> {
    let output = tokio::time::timeout(RUN_TIMEOUT, command.output())
        .await
        .with_context(|| format!("the {what} client ran too long"))?
        .with_context(|| format!("running the {what} client"))?;
    if !output.status.success() {
        bail!("the {what} client failed: {}", output.status);
    }
    serde_json::from_slice(&output.stdout)
        .with_context(|| format!("reading the {what} client's output"))
}

/// The Python client's interpreter, when `scripts/test bench-peers` installed grpcio and the
/// harness's Python package into its venv; otherwise why not.
async fn python_client(tools: &Path) -> Result<PathBuf, String> {
    // Not canonicalized: a venv's python is a symlink that must be run by its own path.
    let python = tools.join(PYTHON_CLIENT_VENV);
    let probe = Command::new(&python)
        .args(["-c", "import grpc, agent_harness_client"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
    match probe {
        Ok(status) if status.success() => Ok(python),
        _ => Err(format!(
            "{} cannot import grpc and agent_harness_client: install them with `scripts/test \
             bench-peers`",
            python.display()
        )),
    }
}

pub async fn run(ctx: &Ctx, smoke: bool) -> anyhow::Result<PhaseReport> {
    if smoke {
        return Ok(skipped("smoke run; the full run measures the peers"));
    }
    let tools = ctx
        .tools
        .canonicalize()
        .with_context(|| format!("the tools folder {}", ctx.tools.display()))?;
    let peers = tools.join("peers");
    let python = tools.join("agents/py/venv/bin/python");
    let agent_py = tools.join(format!(
        "agents/py/agent_client_protocol-{PY_ACP_VERSION}/examples/agent.py"
    ));
    let sandbox = peers.join("node_modules/@sandbox-agent/cli-linux-x64/bin/sandbox-agent");
    for needed in [
        &python,
        &agent_py,
        &sandbox,
        &peers.join("node_modules/acpx"),
    ] {
        if !needed.exists() {
            bail!(
                "{} is missing: install the peers with `scripts/test bench-peers` (or pass \
                 --tools DIR)",
                needed.display()
            );
        }
    }
    let python_client = python_client(&tools).await;
    // Not canonicalized: the venv's python is a symlink that must be run by its own path.
    let agent: Vec<String> = vec![
        python.to_string_lossy().into_owned(),
        agent_py.to_string_lossy().into_owned(),
    ];
    // Boxed, as users run it: the box shows the tools folder (the agent) and the Python the
    // venv was made from, read-only.
    let interpreter = std::fs::canonicalize(&python)
        .ok()
        .and_then(|p| p.parent()?.parent().map(Path::to_path_buf));
    let shown: Vec<String> = std::iter::once(tools.clone())
        .chain(interpreter.filter(|p| !p.starts_with("/usr")))
        .map(|p| format!("{:?}", p.to_string_lossy()))
        .collect();
    let config = format!(
        "[profiles.echo]\ncommand = {:?}\nargs = [{:?}]\nsandbox = {{ read_only = [{}] }}\n\n{}",
        agent[0],
        agent[1],
        shown.join(", "),
        ctx.config(&[])
    );
    let server = ServerProcess::serve(&ctx.bin, "peers", &config).await?;
    let inputs = Inputs {
        agent: &agent,
        harness: server.addr(),
        sandbox: &sandbox,
        scratch: server.scratch(),
    };
    let script = peers.join("peers.mjs");
    std::fs::write(&script, SCRIPT).context("writing the client script")?;
    let mut node = inputs.command(ctx, Path::new("node"), "peers")?;
    node.arg(&script).current_dir(&peers);
    // One client after the other: each has the machine (and the server) to itself.
    let node = run_client(node, "Node").await;
    let python = match python_client {
        Ok(interpreter) => {
            let script = server.scratch().join("peers.py");
            std::fs::write(&script, PYTHON_SCRIPT).context("writing the Python client script")?;
            let mut command = inputs.command(ctx, &interpreter, "peers-python")?;
            command.arg(&script);
            Ok(run_client(command, "Python").await)
        }
        Err(why) => Err(why),
    };
    server.stop().await?;
    let mut phase = summarize(&node?, Client::Node)?;
    match python {
        Ok(report) => {
            let more = summarize(&report?, Client::Python)?;
            phase.rows.extend(more.rows);
            phase.notes.extend(more.notes);
        }
        Err(why) => {
            phase.rows.extend(skipped_rows(Client::Python));
            phase
                .notes
                .push(format!("peers: the Python client was skipped ({why})"));
        }
    }
    Ok(phase)
}

fn summarize(report: &Value, client: Client) -> anyhow::Result<PhaseReport> {
    let lang = client.name();
    let tag = format!("peers ({lang})");
    let mut notes = Vec::new();
    if let Some(errors) = report["errors"].as_object() {
        for (system, error) in errors {
            notes.push(format!(
                "{tag}: {system} failed: {}",
                error.as_str().unwrap_or("?")
            ));
        }
    }
    let summary = |system: &str| -> Option<Summary> {
        let mut samples: Vec<Duration> = report["samples"][system]
            .as_array()?
            .iter()
            .filter_map(Value::as_u64)
            .map(Duration::from_micros)
            .collect();
        Summary::of(&mut samples)
    };
    let direct = summary("direct").with_context(|| format!("{lang}: no direct samples"))?;
    let log = summary("harness-log").with_context(|| format!("{lang}: no harness LOG samples"))?;
    let messages =
        summary("harness-msgs").with_context(|| format!("{lang}: no harness MESSAGES samples"))?;
    let overhead = |s: &Summary| s.p50.as_secs_f64() * 1e3 - direct.p50.as_secs_f64() * 1e3;

    let versions = &report["versions"];
    let version = |name: &str| versions[name].as_str().unwrap_or("?").to_owned();
    notes.push(match client {
        Client::Node => format!(
            "{tag}: Node {} client, @agent-harness/client {}, sandbox-agent {}, acpx {}; one \
             session each, prompt \"ping\", interleaved blocks",
            report["node"].as_str().unwrap_or("?"),
            version("@agent-harness/client"),
            version("@sandbox-agent/cli-linux-x64"),
            version("acpx"),
        ),
        Client::Python => format!(
            "{tag}: Python {} client, agent-harness-client {} (grpcio {}, sync API, one \
             channel), http.client keep-alive for sandbox-agent {}; one session each, prompt \
             \"ping\", interleaved blocks; acpx is Node-only, so these rows hold the harness \
             against sandbox-agent alone",
            report["python"].as_str().unwrap_or("?"),
            version("agent-harness-client"),
            version("grpcio"),
            version("@sandbox-agent/cli-linux-x64"),
        ),
    });
    notes.push(format!(
        "{tag} | system | turns | p50 ms | p99 ms | overhead over direct p50 |"
    ));
    notes.push(format!("{tag} |---|---|---|---|---|"));
    let mut peer_overheads = Vec::new();
    for (key, label) in SYSTEMS {
        if key == "acpx" && !client.peers().contains(&key) {
            continue;
        }
        let Some(s) = summary(key) else {
            notes.push(format!("{tag} | {label} | 0 | - | - | - |"));
            continue;
        };
        let over = match key {
            "direct" => "—".to_owned(),
            _ => format!("{:.3} ms", overhead(&s)),
        };
        if client.peers().contains(&key) {
            peer_overheads.push((label, overhead(&s)));
        }
        notes.push(format!(
            "{tag} | {label} | {} | {:.3} | {:.3} | {over} |",
            s.count,
            s.p50.as_secs_f64() * 1e3,
            s.p99.as_secs_f64() * 1e3
        ));
    }
    let log_overhead = overhead(&log);
    let best_peer = peer_overheads
        .iter()
        .map(|(_, o)| *o)
        .fold(f64::INFINITY, f64::min);
    let all_peers = peer_overheads.len() == client.peers().len();
    let log_met = all_peers
        && log_overhead < best_peer
        && (client == Client::Python || log_overhead <= OVERHEAD_LIMIT.as_secs_f64() * 1e3);
    let messages_late = messages.p50.saturating_sub(log.p50);
    let messages_delta = messages.p50.as_secs_f64() * 1e3 - log.p50.as_secs_f64() * 1e3;
    let (log_key, log_figure, log_target) = client.log_row();
    let (messages_key, messages_figure, messages_target) = client.messages_row();
    Ok(PhaseReport {
        rows: vec![
            Row {
                key: log_key,
                figure: format!("{log_figure}, p50"),
                measured: format!("{} (overhead {log_overhead:.3} ms)", ms(log.p50)),
                against: format!(
                    "direct {}; {}",
                    ms(direct.p50),
                    peer_overheads
                        .iter()
                        .map(|(label, o)| format!(
                            "{} overhead {o:.3} ms",
                            label.split(' ').next().unwrap_or(label)
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                ratio: Some(log_overhead / best_peer.max(1e-9)),
                target: log_target.to_owned(),
                verdict: Verdict::of(log_met),
            },
            Row {
                key: messages_key,
                figure: format!("{messages_figure}, p50"),
                measured: format!("{} ({messages_delta:+.3} ms)", ms(messages.p50)),
                against: format!("LOG {}", ms(log.p50)),
                ratio: Some(messages.p50.as_secs_f64() / log.p50.as_secs_f64().max(1e-9)),
                target: messages_target.to_owned(),
                verdict: Verdict::of(messages_late <= MESSAGES_LIMIT),
            },
        ],
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_side_by_side_table_holds_every_system_and_the_verdict_compares_overheads() {
        let micros = |p50: u64| serde_json::json!([p50, p50, p50, p50 + 10]);
        let report = serde_json::json!({
            "node": "v20",
            "versions": {"acpx": "0.19.1"},
            "samples": {
                "direct": micros(200),
                "harness-log": micros(600),
                "harness-msgs": micros(700),
                "sandbox-agent": micros(900),
                "acpx": micros(1_000_000),
            },
            "errors": {},
        });
        let phase = summarize(&report, Client::Node).unwrap();
        assert_eq!(phase.rows[0].verdict, Verdict::Met, "{:?}", phase.rows[0]);
        assert_eq!(phase.rows[1].verdict, Verdict::Met);
        for (_, label) in SYSTEMS {
            assert!(
                phase.notes.iter().any(|n| n.contains(label)),
                "{label}: {:?}",
                phase.notes
            );
        }
        let mut slower = report.clone();
        slower["samples"]["sandbox-agent"] = micros(500);
        let phase = summarize(&slower, Client::Node).unwrap();
        assert_eq!(phase.rows[0].verdict, Verdict::Missed);
    }

    #[test]
    fn the_python_rows_hold_the_harness_against_sandbox_agent_alone() {
        let micros = |p50: u64| serde_json::json!([p50, p50, p50, p50 + 10]);
        let report = serde_json::json!({
            "python": "3.11.7",
            "versions": {"agent-harness-client": "0.2.0", "grpcio": "1.85.1"},
            "samples": {
                "direct": micros(200),
                "harness-log": micros(1_000),
                "harness-msgs": micros(1_100),
                "sandbox-agent": micros(1_500),
            },
            "errors": {},
        });
        let phase = summarize(&report, Client::Python).unwrap();
        let keys: Vec<&str> = phase.rows.iter().map(|r| r.key).collect();
        assert_eq!(keys, ["peers-log-python", "peers-messages-python"]);
        // 0.8 ms of overhead is above the Node rows' 0.5 ms limit, but these hold it against
        // sandbox-agent's (1.3 ms) alone; no acpx line is printed.
        assert_eq!(phase.rows[0].verdict, Verdict::Met, "{:?}", phase.rows[0]);
        assert!(
            phase.notes.iter().all(|n| !n.contains("acpx 0.19.1")),
            "{:?}",
            phase.notes
        );
        assert!(
            phase.rows[0].against.contains("Rivet overhead 1.300 ms"),
            "{:?}",
            phase.rows[0]
        );
        let mut slower = report.clone();
        slower["samples"]["sandbox-agent"] = micros(900);
        let phase = summarize(&slower, Client::Python).unwrap();
        assert_eq!(phase.rows[0].verdict, Verdict::Missed);
    }
}
