//! Figure 2: sustained turns per second with many sessions on the durable embedded log
//! (SQLite WAL, `synchronous=NORMAL`). Each session is a closed loop — Control, then wait on its
//! own LOG stream for the runtime's response, then the next prompt — so every counted turn went
//! through the queue, the log, the runtime and a subscriber. Turns finished inside the measured
//! window are counted.

use std::sync::{
    Arc,
    atomic::{AtomicU8, AtomicU64, Ordering},
};

use anyhow::Context;
use futures::{StreamExt, stream};
use tokio::time::Instant;

use super::{
    Ctx,
    client::{self, LogStream, WAIT_TIMEOUT},
    report::{PhaseReport, Row, Usage, Verdict, grouped, ms},
    rtt::TURN_TEXT,
    server::{ServerProcess, connect_pool},
    stats::Summary,
};

pub const FIGURE: &str = "sustained turns/s, durable embedded log (NORMAL)";
const TARGET: f64 = 2_000.0;
/// Sessions created at once while setting up.
pub const CREATE_CONCURRENCY: usize = 8;

const WARMING: u8 = 0;
const MEASURING: u8 = 1;
const STOPPING: u8 = 2;

pub async fn run(ctx: &Ctx) -> anyhow::Result<PhaseReport> {
    let n = ctx.plan.sessions;
    let measured = sustained(ctx, "turns", "").await?;
    let rate = measured.rate;
    Ok(PhaseReport {
        rows: vec![Row {
            key: "turns",
            figure: format!("{FIGURE}, {n} sessions"),
            measured: format!("{} turns/s", grouped(rate, 0)),
            against: format!("limit {} turns/s", grouped(TARGET, 0)),
            ratio: Some(rate / TARGET),
            target: format!(">= {} turns/s (stretch)", grouped(TARGET, 0)),
            verdict: Verdict::of(rate >= TARGET),
        }],
        notes: measured.notes("turns", ctx),
    })
}

/// What one sustained-turns measurement found.
pub struct Sustained {
    pub rate: f64,
    done: u64,
    window: std::time::Duration,
    latency: Option<Summary>,
    usage: Usage,
}

impl Sustained {
    /// The notes under the table, led by `key`.
    pub fn notes(&self, key: &str, ctx: &Ctx) -> Vec<String> {
        let plan = &ctx.plan;
        vec![
            format!(
                "{key}: {} turns in {:.2} s after {:.1} s warm-up, {} sessions over {} \
                 connections, prompt {TURN_TEXT:?} (3 log entries and 2 session-record updates a \
                 turn); turn latency under load p50 {}, p99 {}",
                self.done,
                self.window.as_secs_f64(),
                plan.warmup.as_secs_f64(),
                plan.sessions,
                plan.connections,
                self.latency.map_or_else(|| "-".to_owned(), |s| ms(s.p50)),
                self.latency.map_or_else(|| "-".to_owned(), |s| ms(s.p99)),
            ),
            format!("{key}: {}", self.usage.describe()),
        ]
    }
}

/// Sustained turns/s of `plan.sessions` closed-loop sessions on a server whose config file
/// starts with `config_head` (e.g. a `database_url`).
pub async fn sustained(ctx: &Ctx, label: &str, config_head: &str) -> anyhow::Result<Sustained> {
    let plan = &ctx.plan;
    let n = plan.sessions;
    let config = format!(
        "{config_head}{}",
        ctx.config(&[
            ("sessions_per_principal", n + 16),
            ("live_runtimes", n + 16),
        ])
    );
    let server = ServerProcess::serve(&ctx.bin, label, &config).await?;
    let pool = Arc::new(connect_pool(server.addr(), plan.connections).await?);
    let cwd = server.workspace();
    let sessions: Vec<(String, u64)> = stream::iter(0..n)
        .map(|i| {
            let pool = pool.clone();
            let cwd = cwd.clone();
            async move { client::create_session(&pool[i % pool.len()], &cwd).await }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()?;

    let phase = Arc::new(AtomicU8::new(WARMING));
    let counted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(n);
    for (i, (session_id, head)) in sessions.into_iter().enumerate() {
        let control_channel = pool[i % pool.len()].clone();
        let stream_channel = pool[(i + 1) % pool.len()].clone();
        let (phase, counted) = (phase.clone(), counted.clone());
        tasks.push(tokio::spawn(async move {
            let mut stream = LogStream::open(&stream_channel, &session_id, head).await?;
            let mut control = client::sessions(&control_channel);
            let mut latencies = Vec::new();
            while phase.load(Ordering::Relaxed) != STOPPING {
                let start = Instant::now();
                let action_id = client::prompt(&mut control, &session_id, TURN_TEXT).await?;
                stream.response_to(&action_id).await?;
                if phase.load(Ordering::Relaxed) == MEASURING {
                    counted.fetch_add(1, Ordering::Relaxed);
                    latencies.push(start.elapsed());
                }
            }
            anyhow::Ok(latencies)
        }));
    }

    tokio::time::sleep(plan.warmup).await;
    let before = server.counters();
    let start = Instant::now();
    phase.store(MEASURING, Ordering::Relaxed);
    tokio::time::sleep(plan.duration).await;
    let done = counted.load(Ordering::Relaxed);
    let window = start.elapsed();
    phase.store(STOPPING, Ordering::Relaxed);
    let usage = before.until(&server.counters());

    let mut latencies = Vec::new();
    for task in tasks {
        let finished = tokio::time::timeout(WAIT_TIMEOUT, task)
            .await
            .context("a session loop did not stop")?
            .context("a session loop panicked")??;
        latencies.extend(finished);
    }
    drop(pool);
    server.stop().await?;

    Ok(Sustained {
        rate: done as f64 / window.as_secs_f64(),
        done,
        window,
        latency: Summary::of(&mut latencies),
        usage,
    })
}
