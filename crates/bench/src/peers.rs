//! The peer comparison (docs/benchmarks.md, second wave): the same agent — the Python ACP SDK's example
//! agent, from the sdist the interop stage installs — driven by the same client (Node: see
//! `crates/bench/peers/peers.mjs` for why) directly over stdio, through agent-harness (LOG and
//! MESSAGES views), through Rivet `sandbox-agent` 0.4.2 and through `acpx` 0.19.1, in one run.
//!
//! The peers and the client's packages are installed at pinned versions into `.tools/peers` by
//! `scripts/test bench-peers`; this phase starts one `serve` with a profile `echo` running the
//! agent, runs the client script with Node, and reads its samples. Smoke runs skip it.

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
const OVERHEAD_LIMIT: Duration = Duration::from_micros(500);
const MESSAGES_LIMIT: Duration = Duration::from_micros(500);
/// The client script, written into the tools folder so Node resolves the packages there.
const SCRIPT: &str = include_str!("../peers/peers.mjs");
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

pub fn skipped(why: &str) -> PhaseReport {
    PhaseReport {
        rows: vec![
            Row {
                key: "peers-log",
                figure: LOG_FIGURE.to_owned(),
                measured: "-".to_owned(),
                against: "-".to_owned(),
                ratio: None,
                target: LOG_TARGET.to_owned(),
                verdict: Verdict::Skipped,
            },
            Row {
                key: "peers-messages",
                figure: MESSAGES_FIGURE.to_owned(),
                measured: "-".to_owned(),
                against: "-".to_owned(),
                ratio: None,
                target: MESSAGES_TARGET.to_owned(),
                verdict: Verdict::Skipped,
            },
        ],
        notes: vec![format!("peers: skipped ({why})")],
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
    // Not canonicalized: the venv's python is a symlink that must be run by its own path.
    let agent: Vec<String> = vec![
        python.to_string_lossy().into_owned(),
        agent_py.to_string_lossy().into_owned(),
    ];
    let config = format!(
        "[profiles.echo]\ncommand = {:?}\nargs = [{:?}]\n\n{}",
        agent[0],
        agent[1],
        ctx.config(&[])
    );
    let server = ServerProcess::serve(&ctx.bin, "peers", &config).await?;
    let script = peers.join("peers.mjs");
    std::fs::write(&script, SCRIPT).context("writing the client script")?;
    let scratch = server.scratch().join("peers");
    std::fs::create_dir_all(&scratch)?;
    let plan = &ctx.plan;
    let child = Command::new("node")
        .arg(&script)
        .current_dir(&peers)
        .env("PEERS_AGENT", serde_json::to_string(&agent)?)
        .env("PEERS_HARNESS", server.addr().to_string())
        .env("PEERS_CWD", &scratch)
        .env("PEERS_SCRATCH", &scratch)
        .env("PEERS_SANDBOX_AGENT", &sandbox)
        .env("PEERS_SANDBOX_PORT", free_port()?.to_string())
        .env("PEERS_SANDBOX_VERSION", SANDBOX_AGENT_VERSION)
        .env("PEERS_TURNS", plan.rtt_turns.to_string())
        .env("PEERS_WARMUP", plan.rtt_warmup.to_string())
        .env("PEERS_SLOW_TURNS", plan.peers_slow_turns.to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(RUN_TIMEOUT, child)
        .await
        .context("the peers client ran too long")?
        .context("running node (is Node.js installed?)")?;
    server.stop().await?;
    if !output.status.success() {
        bail!("the peers client failed: {}", output.status);
    }
    let report: Value =
        serde_json::from_slice(&output.stdout).context("reading the peers client's output")?;
    summarize(&report)
}

fn summarize(report: &Value) -> anyhow::Result<PhaseReport> {
    let mut notes = Vec::new();
    if let Some(errors) = report["errors"].as_object() {
        for (system, error) in errors {
            notes.push(format!(
                "peers: {system} failed: {}",
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
    let direct = summary("direct").context("no direct samples")?;
    let log = summary("harness-log").context("no harness LOG samples")?;
    let messages = summary("harness-msgs").context("no harness MESSAGES samples")?;
    let overhead = |s: &Summary| s.p50.as_secs_f64() * 1e3 - direct.p50.as_secs_f64() * 1e3;

    notes.push(format!(
        "peers: Node {} client, @agent-harness/client {}, sandbox-agent {}, acpx {}; one \
         session each, prompt \"ping\", interleaved blocks",
        report["node"].as_str().unwrap_or("?"),
        report["versions"]["@agent-harness/client"]
            .as_str()
            .unwrap_or("?"),
        report["versions"]["@sandbox-agent/cli-linux-x64"]
            .as_str()
            .unwrap_or("?"),
        report["versions"]["acpx"].as_str().unwrap_or("?"),
    ));
    notes.push("peers | system | turns | p50 ms | p99 ms | overhead over direct p50 |".into());
    notes.push("peers |---|---|---|---|---|".into());
    let mut peer_overheads = Vec::new();
    for (key, label) in SYSTEMS {
        let Some(s) = summary(key) else {
            notes.push(format!("peers | {label} | 0 | - | - | - |"));
            continue;
        };
        let over = match key {
            "direct" => "—".to_owned(),
            _ => format!("{:.3} ms", overhead(&s)),
        };
        if matches!(key, "sandbox-agent" | "acpx") {
            peer_overheads.push((label, overhead(&s)));
        }
        notes.push(format!(
            "peers | {label} | {} | {:.3} | {:.3} | {over} |",
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
    let all_peers = peer_overheads.len() == 2;
    let log_met =
        all_peers && log_overhead < best_peer && log_overhead <= OVERHEAD_LIMIT.as_secs_f64() * 1e3;
    let messages_late = messages.p50.saturating_sub(log.p50);
    let messages_delta = messages.p50.as_secs_f64() * 1e3 - log.p50.as_secs_f64() * 1e3;
    Ok(PhaseReport {
        rows: vec![
            Row {
                key: "peers-log",
                figure: format!("{LOG_FIGURE}, p50"),
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
                target: LOG_TARGET.to_owned(),
                verdict: Verdict::of(log_met),
            },
            Row {
                key: "peers-messages",
                figure: format!("{MESSAGES_FIGURE}, p50"),
                measured: format!("{} ({messages_delta:+.3} ms)", ms(messages.p50)),
                against: format!("LOG {}", ms(log.p50)),
                ratio: Some(messages.p50.as_secs_f64() / log.p50.as_secs_f64().max(1e-9)),
                target: MESSAGES_TARGET.to_owned(),
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
        let phase = summarize(&report).unwrap();
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
        let phase = summarize(&slower).unwrap();
        assert_eq!(phase.rows[0].verdict, Verdict::Missed);
    }
}
