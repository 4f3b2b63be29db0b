//! `agent-harness-bench`: the performance figures of docs/benchmarks.md, each printed beside the limit or
//! baseline it is held against, measured in the same run.
//!
//! Every phase starts a real `agent-harness serve` child process (by default the `agent-harness`
//! built next to this binary, so build both with `--release`; `--server-bin` names another) on a
//! loopback port with a scratch data dir and SQLite at
//! `synchronous=NORMAL`, drives it over several HTTP/2 connections with bounded loops for fixed
//! durations, and stops it with SIGTERM. The mock agent runtimes are the server's children.
//!
//! | key | figure | held against |
//! |---|---|---|
//! | `rtt-p50`, `rtt-p99` | turn round trip through the harness | the mock agent over stdio ([`direct`]) |
//! | `rtt-messages-p50` | the same, seen by a MESSAGES-view subscriber (TurnEnded) | the LOG view, same run |
//! | `turns` | sustained turns/s, many sessions | the target |
//! | `fanout-rate`, `fanout-lag` | one session to many LOG subscribers | the targets |
//! | `fanout-behind` | the same when every subscriber fell behind at once ([`fanout`]) | delivery while keeping up, same run |
//! | `replay` | catch-up replay of a long log | the target |
//! | `translate` | TranslateChannelMessage req/s | a bare tonic echo ([`echo`]) |
//! | `rss`, `rss-48` | harness RSS per idle session | the first and third waves' targets |
//! | `messages-memory` | server memory of MESSAGES subscribers of a long transcript ([`memory`]) | 1 subscriber, same run |
//! | `sessions-latency` | turn latency of active sessions among many ([`crowd`]) | the fewest sessions, same run |
//! | `turns-pg` | sustained turns/s on PostgreSQL ([`replicas`]) | SQLite, same phase |
//! | `replica-lag` | cross-replica Subscribe lag | same-replica delivery, same turns |
//! | `bridge-rtt-p50` | turn round trip through a bridge ([`bridge`]) | a local runtime, same run |
//! | `peers-log`, `peers-messages` | the same agent through sandbox-agent and acpx ([`peers`]), Node client | direct stdio and the peers, same run |
//! | `peers-log-python`, `peers-messages-python` | the same with the Python client (no acpx: Node-only) | direct stdio and sandbox-agent, same run |
//! | `real-agent` | a Claude Code turn against the fake model server ([`real_agent`]) | the same adapter over stdio, same run |
//! | `warm-create` | CreateSession to first turn ended, warm pool ([`warm`]) | a cold profile, same run |
//! | `idle-db` | PostgreSQL transactions/s, many idle sessions on 3 replicas ([`idle`]) | fewer idle sessions, same run |
//! | `idle-subscribers` | transactions/s added by idle subscribers on a non-owner replica | the same replicas without them |
//! | `sandbox-cold`, `sandbox-rtt` | a cold start and a turn of a boxed runtime ([`sandbox`]) | the same agent unboxed, same run |
//! | `tenant-memory`, `tenant-latency`, `tenant-memory-returned` | one tenant's slow MESSAGES streams: the server's memory, another tenant's GetSession p99, the memory after ([`tenants`]) | a documented bound, the idle p99 and the start, same run |
//!
//! `--wave3` runs the third wave's figures ([`WAVE3_KEYS`]) and prints them as one table;
//! `--plots DIR` draws the plots of the run ([`plot`]).
//!
//! `docs/benchmarks.md` has the command, the machine, the figures and what bounds each one.

mod bridge;
mod client;
mod crowd;
mod direct;
mod echo;
mod fanout;
mod idle;
mod machine;
mod memory;
mod model_proxy;
mod peers;
mod plot;
mod real_agent;
mod replay;
mod replicas;
mod report;
mod rss;
mod rtt;
mod sandbox;
mod server;
mod stats;
mod tenants;
mod translate;
mod turns;
mod warm;

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Context;
use tokio::time::Instant;

use report::{PhaseReport, Row};

/// Which figures to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Figure {
    Rtt,
    Turns,
    Fanout,
    FanoutBehind,
    Replay,
    Translate,
    Rss,
    MessagesMemory,
    SessionsLatency,
    Replicas,
    Bridge,
    Warm,
    IdleCost,
    Peers,
    RealAgent,
    Sandbox,
    Tenants,
    ModelProxy,
}

impl Figure {
    pub const ALL: [Figure; 18] = [
        Figure::Rtt,
        Figure::Turns,
        Figure::Fanout,
        Figure::FanoutBehind,
        Figure::Replay,
        Figure::Translate,
        Figure::Rss,
        Figure::MessagesMemory,
        Figure::SessionsLatency,
        Figure::Replicas,
        Figure::Bridge,
        Figure::Warm,
        Figure::IdleCost,
        Figure::Peers,
        Figure::RealAgent,
        Figure::Sandbox,
        Figure::Tenants,
        Figure::ModelProxy,
    ];

    /// The rows a figure prints (as failed rows when its phase fails).
    fn rows(self) -> &'static [(&'static str, &'static str, &'static str)] {
        match self {
            Figure::Rtt => &[
                ("rtt-p50", rtt::FIGURE, "overhead <= 0.500 ms"),
                ("rtt-p99", rtt::FIGURE, "overhead <= 2.000 ms"),
                ("rtt-stretch", rtt::FIGURE, "overhead <= 0.250 ms (stretch)"),
                (
                    "rtt-messages-p50",
                    rtt::MESSAGES_FIGURE,
                    "<= LOG + 0.500 ms",
                ),
            ],
            Figure::Turns => &[("turns", turns::FIGURE, ">= 2,000 turns/s (stretch)")],
            Figure::Fanout => &[
                ("fanout-rate", fanout::FIGURE, ">= 1 M events/s (stretch)"),
                ("fanout-lag", fanout::FIGURE, "p99 <= 20.000 ms"),
            ],
            Figure::FanoutBehind => &[(
                "fanout-behind",
                fanout::BEHIND_FIGURE,
                fanout::BEHIND_TARGET,
            )],
            Figure::Replay => &[("replay", replay::FIGURE, ">= 200,000 frames/s")],
            Figure::Translate => &[("translate", translate::FIGURE, ">= 0.80 of echo")],
            Figure::Rss => &[
                ("rss", rss::FIGURE, "<= 64 KiB"),
                ("rss-48", rss::FIGURE, rss::THIRD_WAVE_TARGET),
            ],
            Figure::MessagesMemory => &[("messages-memory", memory::FIGURE, memory::TARGET)],
            Figure::SessionsLatency => &[("sessions-latency", crowd::FIGURE, crowd::TARGET)],
            Figure::Replicas => &[
                ("turns-pg", replicas::TURNS_FIGURE, replicas::TURNS_TARGET),
                ("replica-lag", replicas::LAG_FIGURE, replicas::LAG_TARGET),
            ],
            Figure::Bridge => &[(
                "bridge-rtt-p50",
                bridge::FIGURE,
                "overhead <= 1.000 ms (ours)",
            )],
            Figure::Warm => &[("warm-create", warm::FIGURE, warm::TARGET)],
            Figure::IdleCost => &[
                ("idle-db", idle::DB_FIGURE, idle::DB_TARGET),
                (
                    "idle-subscribers",
                    idle::SUBSCRIBERS_FIGURE,
                    idle::SUBSCRIBERS_TARGET,
                ),
            ],
            Figure::Peers => &[
                ("peers-log", peers::LOG_FIGURE, peers::LOG_TARGET),
                (
                    "peers-messages",
                    peers::MESSAGES_FIGURE,
                    peers::MESSAGES_TARGET,
                ),
                (
                    "peers-log-python",
                    peers::PYTHON_LOG_FIGURE,
                    peers::PYTHON_LOG_TARGET,
                ),
                (
                    "peers-messages-python",
                    peers::PYTHON_MESSAGES_FIGURE,
                    peers::MESSAGES_TARGET,
                ),
            ],
            Figure::RealAgent => &[("real-agent", real_agent::FIGURE, real_agent::TARGET)],
            Figure::Sandbox => &[
                ("sandbox-cold", sandbox::COLD_FIGURE, "adds <= 50.000 ms"),
                ("sandbox-rtt", sandbox::RTT_FIGURE, "adds <= 0.100 ms"),
            ],
            Figure::ModelProxy => &[(
                "model-proxy-first-byte",
                model_proxy::FIGURE,
                model_proxy::TARGET,
            )],
            Figure::Tenants => &[
                (
                    "tenant-memory",
                    tenants::MEMORY_FIGURE,
                    tenants::MEMORY_TARGET,
                ),
                (
                    "tenant-latency",
                    tenants::LATENCY_FIGURE,
                    tenants::LATENCY_TARGET,
                ),
                (
                    "tenant-memory-returned",
                    tenants::RETURNED_FIGURE,
                    tenants::RETURNED_TARGET,
                ),
            ],
        }
    }
}

/// The flags of `agent-harness-bench`. Sizes left unset take the full run's values, or the
/// smoke run's with `--smoke`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct BenchArgs {
    /// Tiny sizes and durations: every figure is produced in seconds (numbers meaningless)
    #[arg(long)]
    pub smoke: bool,
    /// Only these figures, comma-separated [default: all]
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Figure>,
    /// Only the third wave's figures, printed as one table in the order of docs/benchmarks.md
    #[arg(long, conflicts_with = "only")]
    pub wave3: bool,
    /// Draw the plots of the figures measured (latency against sessions, memory against
    /// subscribers and transcript size) as PNG files into DIR
    #[arg(long, value_name = "DIR")]
    pub plots: Option<PathBuf>,
    /// Print the table as Markdown too
    #[arg(long)]
    pub markdown: bool,
    /// Timed turns of the round trip, each way [full: 2000]
    #[arg(long)]
    pub rtt_turns: Option<usize>,
    /// Sessions driven at once for sustained turns/s [full: 100]
    #[arg(long)]
    pub sessions: Option<usize>,
    /// Measured window of each throughput phase, e.g. "10s" [full: 10s]
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Warm-up before each measured window [full: 2s]
    #[arg(long, value_parser = humantime::parse_duration)]
    pub warmup: Option<Duration>,
    /// Subscribers of the fan-out session [full: 1000]
    #[arg(long)]
    pub subscribers: Option<usize>,
    /// 100-byte chunks per turn of the saturated fan-out part [full: 100]
    #[arg(long)]
    pub fanout_chunks: Option<usize>,
    /// Deliveries per second offered in the paced fan-out part (entries/s into the session times
    /// subscribers) [full: 1000000]
    #[arg(long)]
    pub fanout_rate: Option<u64>,
    /// Frames in the replayed log [full: 100000]
    #[arg(long)]
    pub replay_frames: Option<usize>,
    /// Replays of that log [full: 5]
    #[arg(long)]
    pub replay_runs: Option<usize>,
    /// Idle sessions whose memory is measured [full: 200]
    #[arg(long)]
    pub idle_sessions: Option<usize>,
    /// Concurrent TranslateChannelMessage (and echo) calls [full: 32]
    #[arg(long)]
    pub translate_concurrency: Option<usize>,
    /// Rounds of translate and echo, alternating [full: 4]
    #[arg(long)]
    pub translate_rounds: Option<usize>,
    /// Sessions created on each profile for the warm-pool figure [full: 30]
    #[arg(long)]
    pub warm_samples: Option<usize>,
    /// Timed turns of acpx in the peer comparison (about 1 s each) [full: 40]
    #[arg(long)]
    pub peers_slow_turns: Option<usize>,
    /// Where `scripts/test bench-peers` installed the peers, the Python echo agent, the Python
    /// client's venv and the Claude adapter [default: .tools of the source tree]
    #[arg(long, value_name = "DIR")]
    pub tools: Option<PathBuf>,
    /// HTTP/2 connections per client pool (more for fan-out: 128 streams each at most) [full: 4]
    #[arg(long)]
    pub connections: Option<usize>,
    /// PostgreSQL database for the scale-out figures (turns-pg and replica-lag in a scratch
    /// schema; idle-db and idle-subscribers in a scratch database); without one they are skipped
    #[arg(
        long,
        env = "AGENT_HARNESS_BENCH_DATABASE_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    pub database_url: Option<String>,
    /// `tenants` without the hostile tenant's streams: what the same turns alone leave in the
    /// server's memory (the control of `tenant-memory-returned`)
    #[arg(long)]
    pub tenants_control: bool,
    /// The `agent-harness` executable to serve [default: the one next to this binary]
    #[arg(long, value_name = "PATH")]
    pub server_bin: Option<PathBuf>,
    /// Internal: serve the bare echo baseline on ADDR until SIGTERM
    #[arg(long, value_name = "ADDR", hide = true)]
    pub serve_echo: Option<SocketAddr>,
}

/// The sizes of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub rtt_turns: usize,
    pub rtt_warmup: usize,
    pub sessions: usize,
    pub duration: Duration,
    pub warmup: Duration,
    pub subscribers: usize,
    pub fanout_chunks: usize,
    pub fanout_rate: u64,
    pub replay_frames: usize,
    pub replay_runs: usize,
    pub idle_sessions: usize,
    pub translate_concurrency: usize,
    pub translate_rounds: usize,
    pub connections: usize,
    /// Sessions created per profile for the warm-pool figure.
    pub warm_samples: usize,
    /// Timed turns of acpx in the peer comparison (each takes about 1 s).
    pub peers_slow_turns: usize,
}

impl Plan {
    pub const FULL: Plan = Plan {
        rtt_turns: 2000,
        rtt_warmup: 100,
        sessions: 100,
        duration: Duration::from_secs(10),
        warmup: Duration::from_secs(2),
        subscribers: 1000,
        fanout_chunks: 100,
        fanout_rate: 1_000_000,
        replay_frames: 100_000,
        replay_runs: 5,
        idle_sessions: 200,
        translate_concurrency: 32,
        translate_rounds: 4,
        connections: 4,
        warm_samples: 30,
        peers_slow_turns: 40,
    };

    pub const SMOKE: Plan = Plan {
        rtt_turns: 20,
        rtt_warmup: 2,
        sessions: 4,
        duration: Duration::from_millis(300),
        warmup: Duration::from_millis(100),
        subscribers: 8,
        fanout_chunks: 10,
        fanout_rate: 8_000,
        replay_frames: 300,
        replay_runs: 1,
        idle_sessions: 4,
        translate_concurrency: 4,
        translate_rounds: 1,
        connections: 2,
        warm_samples: 3,
        peers_slow_turns: 2,
    };

    pub fn from_args(args: &BenchArgs) -> Self {
        let base = if args.smoke { Self::SMOKE } else { Self::FULL };
        Self {
            rtt_turns: args.rtt_turns.unwrap_or(base.rtt_turns).max(1),
            rtt_warmup: base.rtt_warmup,
            sessions: args.sessions.unwrap_or(base.sessions).max(1),
            duration: args.duration.unwrap_or(base.duration),
            warmup: args.warmup.unwrap_or(base.warmup),
            subscribers: args.subscribers.unwrap_or(base.subscribers).max(1),
            fanout_chunks: args.fanout_chunks.unwrap_or(base.fanout_chunks).max(1),
            fanout_rate: args.fanout_rate.unwrap_or(base.fanout_rate).max(1),
            replay_frames: args.replay_frames.unwrap_or(base.replay_frames).max(1),
            replay_runs: args.replay_runs.unwrap_or(base.replay_runs).max(1),
            idle_sessions: args.idle_sessions.unwrap_or(base.idle_sessions).max(1),
            translate_concurrency: args
                .translate_concurrency
                .unwrap_or(base.translate_concurrency)
                .max(1),
            translate_rounds: args
                .translate_rounds
                .unwrap_or(base.translate_rounds)
                .max(1),
            connections: args.connections.unwrap_or(base.connections).max(1),
            warm_samples: args.warm_samples.unwrap_or(base.warm_samples).max(1),
            peers_slow_turns: args
                .peers_slow_turns
                .unwrap_or(base.peers_slow_turns)
                .max(1),
        }
    }
}

/// What every phase shares.
pub struct Ctx {
    pub bin: PathBuf,
    pub plan: Plan,
    /// The database of the scale-out figures (`None`: they are skipped).
    pub database_url: Option<String>,
    /// The tools folder holding the peers (`scripts/test bench-peers`).
    pub tools: PathBuf,
}

impl Ctx {
    /// A `serve` config file raising only the given `[limits]`.
    pub fn config(&self, limits: &[(&str, usize)]) -> String {
        let mut text = String::from("[limits]\n");
        for (key, value) in limits {
            text.push_str(&format!("{key} = {value}\n"));
        }
        text
    }

    /// [`Ctx::config`] with a static files base URL (for the translator).
    pub fn config_with_base_url(&self, base_url: &str, limits: &[(&str, usize)]) -> String {
        format!(
            "static_files_base_url = {base_url:?}\n{}",
            self.config(limits)
        )
    }
}

#[derive(clap::Parser)]
#[command(
    name = "agent-harness-bench",
    version,
    about = "Measure the performance figures of docs/benchmarks.md against a child `agent-harness serve` \
             (build both with --release; see docs/benchmarks.md)"
)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

/// Runs the figures and prints the table. Fails (after printing) when a figure could not be
/// measured; a missed target is a finding, not a failure.
fn main() -> anyhow::Result<()> {
    let args = <Cli as clap::Parser>::parse().args;
    if let Some(addr) = args.serve_echo {
        return echo::serve(addr);
    }
    let bin = match &args.server_bin {
        Some(path) => path.clone(),
        None => sibling_server()?,
    };
    let figures: Vec<Figure> = if args.wave3 {
        wave3_figures()
    } else if args.only.is_empty() {
        Figure::ALL.to_vec()
    } else {
        Figure::ALL
            .into_iter()
            .filter(|f| args.only.contains(f))
            .collect()
    };
    let ctx = Ctx {
        bin,
        plan: Plan::from_args(&args),
        database_url: args.database_url.clone().filter(|url| !url.is_empty()),
        tools: args.tools.clone().unwrap_or_else(peers::default_tools),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let failed = runtime.block_on(run(&ctx, &figures, &args));
    if failed > 0 {
        anyhow::bail!("{failed} figure(s) could not be measured");
    }
    Ok(())
}

/// The third wave's rows, in the order of docs/benchmarks.md's third-wave table. `--wave3` runs
/// every figure that prints one of them and prints exactly these. Rows of figures that another
/// branch adds are listed here by key (MERGE: `peers-log-python` and `real-agent` come with the
/// Python-client peers row and the real-agent row); a key no figure prints reads SKIPPED.
pub const WAVE3_KEYS: [&str; 8] = [
    "peers-log-python",
    "peers-log",
    "fanout-behind",
    "rss-48",
    "idle-db",
    "messages-memory",
    "sessions-latency",
    "real-agent",
];

/// The figures that print a third-wave row.
fn wave3_figures() -> Vec<Figure> {
    Figure::ALL
        .into_iter()
        .filter(|f| f.rows().iter().any(|(key, _, _)| WAVE3_KEYS.contains(key)))
        .collect()
}

/// The third wave's rows of a run, in [`WAVE3_KEYS`] order; a key no figure printed reads
/// SKIPPED.
fn wave3_rows(rows: Vec<Row>) -> Vec<Row> {
    WAVE3_KEYS
        .iter()
        .map(|key| {
            rows.iter()
                .find(|row| row.key == *key)
                .cloned()
                .unwrap_or_else(|| Row {
                    key,
                    figure: "-".to_owned(),
                    measured: "no figure of this build prints it".to_owned(),
                    against: "-".to_owned(),
                    ratio: None,
                    target: "-".to_owned(),
                    verdict: report::Verdict::Skipped,
                })
        })
        .collect()
}

/// The `agent-harness` beside this executable: cargo puts every binary of the workspace in the
/// same target directory (`target/release/agent-harness` and `target/release/agent-harness-bench`).
fn sibling_server() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe().context("finding this executable")?;
    let bin = me.with_file_name("agent-harness");
    anyhow::ensure!(
        bin.is_file(),
        "no agent-harness next to {} (build it: `cargo build --release --bin agent-harness`, or \
         pass --server-bin PATH)",
        me.display()
    );
    Ok(bin)
}

fn header(ctx: &Ctx, smoke: bool) {
    let machine = machine::Machine::read();
    println!("agent-harness-bench");
    println!(
        "  machine: {} x {} cores, kernel {}",
        machine.cpu_model, machine.cores, machine.kernel
    );
    if let Some((one, five, fifteen)) = machine::load_average() {
        println!("  load average at start: {one:.2} {five:.2} {fifteen:.2}");
    }
    println!(
        "  server: {} ({} build){}",
        ctx.bin.display(),
        if cfg!(debug_assertions) {
            "DEBUG — figures are not meaningful"
        } else {
            "release"
        },
        if smoke {
            "; SMOKE sizes — figures are not meaningful"
        } else {
            ""
        }
    );
    println!("  plan: {:?}", ctx.plan);
}

async fn run(ctx: &Ctx, figures: &[Figure], args: &BenchArgs) -> usize {
    let (smoke, markdown) = (args.smoke, args.markdown);
    header(ctx, smoke);
    let mut plots = plot::Plots::default();
    let started = Instant::now();
    let mut rows: Vec<Row> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    let mut failed = 0;
    for &figure in figures {
        let phase_start = Instant::now();
        println!("  running {figure:?} ...");
        let outcome = match figure {
            Figure::Rtt => rtt::run(ctx).await,
            Figure::Turns => turns::run(ctx).await,
            Figure::Fanout => fanout::run(ctx).await,
            Figure::FanoutBehind => fanout::run_behind(ctx, smoke).await,
            Figure::Replay => replay::run(ctx).await,
            Figure::Translate => translate::run(ctx).await,
            Figure::Rss => rss::run(ctx).await,
            Figure::MessagesMemory => memory::run(ctx, smoke).await.map(|(report, points)| {
                plots.memory = points;
                report
            }),
            Figure::SessionsLatency => crowd::run(ctx, smoke).await.map(|(report, points)| {
                plots.latency = points;
                plots.active = ctx.plan.sessions;
                report
            }),
            Figure::Replicas => replicas::run(ctx).await,
            Figure::Bridge => bridge::run(ctx).await,
            Figure::Warm => warm::run(ctx, smoke).await,
            Figure::IdleCost => idle::run(ctx, smoke).await,
            Figure::Peers => peers::run(ctx, smoke).await,
            Figure::RealAgent => real_agent::run(ctx, smoke).await,
            Figure::Sandbox => sandbox::run(ctx, smoke).await,
            Figure::Tenants => tenants::run(ctx, smoke, args.tenants_control).await,
            Figure::ModelProxy => model_proxy::run(smoke, ctx.plan.rtt_turns).await,
        };
        match outcome {
            Ok(PhaseReport {
                rows: more,
                notes: more_notes,
            }) => {
                rows.extend(more);
                notes.extend(more_notes);
            }
            Err(error) => {
                failed += figure.rows().len();
                let error = format!("{error:#}");
                eprintln!("  {figure:?} failed: {error}");
                rows.extend(
                    figure
                        .rows()
                        .iter()
                        .map(|(key, name, target)| Row::failed(key, name, target, &error)),
                );
            }
        }
        println!(
            "  ... {figure:?} took {:.1} s",
            phase_start.elapsed().as_secs_f64()
        );
    }
    if args.wave3 {
        rows = wave3_rows(rows);
    }
    if let Some(dir) = &args.plots {
        match plot::write(&plots, dir) {
            Ok((written, missing)) => {
                for path in written {
                    notes.push(format!("plot: wrote {}", path.display()));
                }
                notes.extend(missing.into_iter().map(|m| format!("plot: {m}")));
            }
            Err(error) => {
                failed += 1;
                eprintln!("  the plots could not be drawn: {error:#}");
            }
        }
    }
    println!();
    print!("{}", report::text_table(&rows));
    println!();
    for note in &notes {
        println!("  {note}");
    }
    if let Some((one, five, fifteen)) = machine::load_average() {
        println!("  load average at end: {one:.2} {five:.2} {fifteen:.2}");
    }
    println!("  wall time: {:.1} s", started.elapsed().as_secs_f64());
    if markdown {
        println!();
        print!("{}", report::markdown_table(&rows));
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_smoke_run_takes_the_smoke_sizes_unless_a_flag_says_otherwise() {
        let args = BenchArgs {
            smoke: true,
            sessions: Some(7),
            ..Default::default()
        };
        let plan = Plan::from_args(&args);
        assert_eq!(plan.sessions, 7);
        assert_eq!(plan.subscribers, Plan::SMOKE.subscribers);
        assert_eq!(Plan::from_args(&BenchArgs::default()), Plan::FULL);
    }

    #[test]
    fn every_printed_row_key_belongs_to_exactly_one_figure() {
        let mut keys: Vec<&str> = Figure::ALL
            .iter()
            .flat_map(|f| f.rows().iter().map(|(key, _, _)| *key))
            .collect();
        assert_eq!(keys, report::ROW_KEYS);
        keys.dedup();
        assert_eq!(keys.len(), report::ROW_KEYS.len());
    }

    #[test]
    fn the_bench_smoke_stage_of_the_test_script_checks_every_row_key() {
        let script = include_str!("../../../scripts/test");
        let line = script
            .lines()
            .find(|line| line.starts_with("BENCH_KEYS=("))
            .expect("scripts/test lists BENCH_KEYS");
        let keys: Vec<&str> = line
            .trim_start_matches("BENCH_KEYS=(")
            .trim_end_matches(')')
            .split_whitespace()
            .collect();
        assert_eq!(keys, report::ROW_KEYS);
    }

    #[test]
    fn the_third_wave_runs_only_the_figures_that_print_its_rows() {
        let figures = wave3_figures();
        for figure in [
            Figure::FanoutBehind,
            Figure::Rss,
            Figure::IdleCost,
            Figure::MessagesMemory,
            Figure::SessionsLatency,
            Figure::Peers,
        ] {
            assert!(figures.contains(&figure), "{figure:?}");
        }
        for figure in [Figure::Rtt, Figure::Turns, Figure::Fanout, Figure::Replay] {
            assert!(!figures.contains(&figure), "{figure:?}");
        }
    }

    #[test]
    fn the_third_wave_table_has_its_rows_in_order_and_says_which_no_figure_printed() {
        let printed = [
            "turns",
            "rss",
            "sessions-latency",
            "rss-48",
            "fanout-behind",
        ]
        .map(|key| Row::failed(key, "a figure", "a target", "an error"));
        let rows = wave3_rows(printed.to_vec());
        let keys: Vec<&str> = rows.iter().map(|row| row.key).collect();
        assert_eq!(keys, WAVE3_KEYS);
        let verdict = |key: &str| rows.iter().find(|row| row.key == key).unwrap().verdict;
        assert_eq!(verdict("rss-48"), report::Verdict::Failed);
        assert_eq!(verdict("sessions-latency"), report::Verdict::Failed);
        assert_eq!(verdict("real-agent"), report::Verdict::Skipped);
    }

    #[test]
    fn every_third_wave_key_is_a_row_key_or_awaits_a_merge() {
        let awaiting_merge = ["peers-log-python", "real-agent"];
        for key in WAVE3_KEYS {
            assert!(
                report::ROW_KEYS.contains(&key) || awaiting_merge.contains(&key),
                "{key}"
            );
        }
    }

    #[test]
    fn the_server_config_raises_only_the_limits_asked_for() {
        let ctx = Ctx {
            bin: PathBuf::from("/bin/true"),
            plan: Plan::SMOKE,
            database_url: None,
            tools: PathBuf::from("/nonexistent"),
        };
        let text = ctx.config_with_base_url("https://static.example", &[("live_runtimes", 300)]);
        let file: agent_harness::config::FileConfig = toml::from_str(&text).unwrap();
        assert_eq!(file.limits.live_runtimes, 300);
        assert_eq!(file.limits.queued_actions, 50);
        assert_eq!(
            file.static_files_base_url.as_deref(),
            Some("https://static.example")
        );
    }
}
