//! Figure 6: the harness's resident memory per idle session after one turn. The runtimes are
//! separate processes, so they are excluded by construction; nothing is cached: every
//! subscriber has gone away before the reading.
//!
//! A fresh server first serves a few warm-up sessions the same way (so one-time costs — thread
//! pools, the store's first pages, allocator arenas — land in the baseline), then its RSS is read,
//! then N sessions are each created, given one turn, left idle and unsubscribed, and RSS is read
//! again: (after − before) / N.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use futures::{StreamExt, stream};
use tonic::transport::Channel;

use super::{
    Ctx,
    client::{self, LogStream},
    machine::Resident,
    report::{PhaseReport, Row, Verdict},
    rtt::TURN_TEXT,
    server::{ServerProcess, connect_pool},
    turns::CREATE_CONCURRENCY,
};
use agent_harness::pb::v1 as pb;

pub const FIGURE: &str = "harness RSS per idle session after one turn";
const LIMIT_KIB: f64 = 64.0;
/// The third wave's limit, on the same measurement (row `rss-48`).
pub const THIRD_WAVE_LIMIT_KIB: f64 = 48.0;
pub const THIRD_WAVE_TARGET: &str = "<= 48 KiB (third wave)";
/// Time the server gets to finish closing streams before its memory is read.
const SETTLE: Duration = Duration::from_millis(1000);

/// Creates a session, gives it one turn, waits until it is idle, and unsubscribes.
async fn one_turn(control: Channel, watch: Channel, cwd: PathBuf) -> anyhow::Result<()> {
    let (session_id, head) = client::create_session(&control, &cwd).await?;
    let mut stream = LogStream::open(&watch, &session_id, head).await?;
    let action_id = client::prompt(&mut client::sessions(&control), &session_id, TURN_TEXT).await?;
    stream.response_to(&action_id).await?;
    stream.status(pb::SessionStatus::Idle).await?;
    Ok(())
}

async fn sessions(pool: &Arc<Vec<Channel>>, cwd: &Path, n: usize) -> anyhow::Result<()> {
    stream::iter(0..n)
        .map(|i| {
            let control = pool[i % pool.len()].clone();
            let watch = pool[(i + 1) % pool.len()].clone();
            one_turn(control, watch, cwd.to_path_buf())
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

type Mappings = std::collections::BTreeMap<&'static str, u64>;

async fn settled(server: &ServerProcess) -> anyhow::Result<(Resident, Mappings)> {
    tokio::time::sleep(SETTLE).await;
    let resident = server
        .resident()
        .ok_or_else(|| anyhow::anyhow!("cannot read the server's memory"))?;
    Ok((
        resident,
        super::machine::resident_by_mapping(server.pid()).unwrap_or_default(),
    ))
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<PhaseReport> {
    let plan = &ctx.plan;
    let n = plan.idle_sessions;
    let warm = CREATE_CONCURRENCY.min(n.max(1));
    let server = ServerProcess::serve(
        &ctx.bin,
        "rss",
        &ctx.config(&[
            ("sessions_per_principal", n + warm + 16),
            ("live_runtimes", n + warm + 16),
        ]),
    )
    .await?;
    let pool = Arc::new(connect_pool(server.addr(), plan.connections).await?);
    let cwd = server.workspace();

    sessions(&pool, &cwd, warm).await?;
    let (before, mappings_before) = settled(&server).await?;
    sessions(&pool, &cwd, n).await?;
    let (after, mappings_after) = settled(&server).await?;
    let (_, runtimes) = super::machine::children_cpu_time(server.pid());
    drop(pool);
    server.stop().await?;

    let per = |a: u64, b: u64| (b as f64 - a as f64) / n.max(1) as f64;
    let rss = per(before.rss_kib, after.rss_kib);
    // The one reading, held to a limit.
    let held_to = |key, figure, limit: f64, target| Row {
        key,
        figure,
        measured: format!("{rss:.1} KiB/session"),
        against: format!("limit {limit:.0} KiB"),
        ratio: Some(rss / limit),
        target,
        verdict: Verdict::of(rss <= limit),
    };
    let anon = per(before.anon_kib, after.anon_kib);
    let by_mapping: Vec<String> = mappings_after
        .iter()
        .map(|(kind, kib)| {
            let was = mappings_before.get(kind).copied().unwrap_or(0);
            format!("{kind} {:.1}", per(was, *kib))
        })
        .collect();
    Ok(PhaseReport {
        rows: vec![
            held_to(
                "rss",
                format!("{FIGURE}, {n} sessions"),
                LIMIT_KIB,
                format!("<= {LIMIT_KIB:.0} KiB"),
            ),
            held_to(
                "rss-48",
                format!("{FIGURE}, {n} sessions (the same reading)"),
                THIRD_WAVE_LIMIT_KIB,
                THIRD_WAVE_TARGET.to_owned(),
            ),
        ],
        notes: vec![
            format!(
                "rss: server VmRSS {} -> {} KiB (RssAnon {} -> {} KiB, {anon:.1} KiB/session) \
                 for {n} idle sessions after {warm} warm-up sessions; {runtimes} runtime \
                 processes alive, not counted",
                before.rss_kib, after.rss_kib, before.anon_kib, after.anon_kib
            ),
            format!(
                "rss: KiB/session by mapping: {} (heap = main malloc arena; anonymous = other \
                 arenas, thread stacks, large allocations)",
                by_mapping.join(", ")
            ),
        ],
    })
}
