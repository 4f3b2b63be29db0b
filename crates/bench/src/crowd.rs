//! Turn latency among many sessions of which few are active (`sessions-latency`): does a
//! session that sits idle slow down the ones that work?
//!
//! One server. `active` sessions of the built-in `mock` profile each run paced turns (prompt
//! `ping`, one every [`PERIOD`], staggered), timed from Control to the runtime's response on the
//! session's own LOG stream. Around them the server holds more and more *parked* sessions: each
//! created through the API on a profile running the same mock agent with a short idle timeout,
//! given one turn, then left alone — so the idle timeout stops its runtime and it sits SUSPENDED,
//! its record, log and actor kept by the server, as an idle session is after a while. Ten
//! thousand live runtimes would be ten thousand processes on 2 cores; a suspended session is what
//! an idle one becomes. The latency of the active sessions is measured with `active` sessions in
//! all, then 10× and 100× as many (100, 1,000, 10,000 in the full run); the row holds the largest
//! against the smallest, in the same run.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, bail};
use futures::{StreamExt, stream};
use tokio::time::Instant;
use tonic::transport::Channel;

use super::{
    Ctx,
    client::{self, LogStream, WAIT_TIMEOUT},
    plot::LatencyPoint,
    report::{PhaseReport, Row, Verdict, grouped, ms},
    rtt::TURN_TEXT,
    server::{ServerProcess, connect_pool},
    stats::Summary,
};

pub const FIGURE: &str = "turn latency p50 of active sessions among many";
pub const TARGET: &str = "<= 1.50x of the fewest";
const RATIO_LIMIT: f64 = 1.5;
/// The profile of the parked sessions.
const PARKED: &str = "parked";
/// The parked profile's idle timeout: its runtime stops this long after its one turn.
const IDLE_TIMEOUT: &str = "1s";
/// Each active session starts a turn this often (the turn's latency is what is measured).
const PERIOD: Duration = Duration::from_millis(200);
/// Parked sessions created at once.
const PARK_CONCURRENCY: usize = 16;
/// How long the parked sessions' runtimes may take to stop after they were all created.
const SUSPEND_TIMEOUT: Duration = Duration::from_secs(120);

/// Not measuring; otherwise `stage + 1`.
const IDLE: usize = 0;
const STOPPING: usize = usize::MAX;

/// The sizes of one run.
struct Sizes {
    active: usize,
    /// Sessions in all at each measured stage, ascending; the first is `active`.
    totals: Vec<usize>,
}

impl Sizes {
    fn of(ctx: &Ctx, smoke: bool) -> Self {
        let active = ctx.plan.sessions;
        let steps: &[usize] = if smoke { &[1, 2, 4] } else { &[1, 10, 100] };
        Self {
            active,
            totals: steps.iter().map(|k| k * active).collect(),
        }
    }
}

/// What one stage measured.
struct Stage {
    total: usize,
    latency: Summary,
    parked_in: Duration,
    rss_kib: u64,
    runtimes: usize,
}

pub async fn run(ctx: &Ctx, smoke: bool) -> anyhow::Result<(PhaseReport, Vec<LatencyPoint>)> {
    let plan = &ctx.plan;
    let sizes = Sizes::of(ctx, smoke);
    let most = *sizes.totals.last().expect("at least one stage");
    let config = format!(
        "{}\n[profiles.{PARKED}]\ncommand = {:?}\nargs = [\"mock-agent\", \"--resume\"]\n\
         idle_timeout = {IDLE_TIMEOUT:?}\n",
        ctx.config(&[
            ("sessions_per_principal", most + 16),
            ("live_runtimes", sizes.active + 4 * PARK_CONCURRENCY + 1000),
        ]),
        ctx.bin.display().to_string(),
    );
    let server = ServerProcess::serve(&ctx.bin, "crowd", &config).await?;
    // Children of the server that are no session's runtime.
    let (_, others) = super::machine::children_cpu_time(server.pid());
    let pool = Arc::new(connect_pool(server.addr(), plan.connections).await?);
    let cwd = server.workspace();

    let measuring = Arc::new(AtomicUsize::new(IDLE));
    let stages = sizes.totals.len();
    let mut loops = Vec::with_capacity(sizes.active);
    for i in 0..sizes.active {
        let (session_id, head) = client::create_session(&pool[i % pool.len()], &cwd).await?;
        let control = pool[i % pool.len()].clone();
        let watch = pool[(i + 1) % pool.len()].clone();
        let offset = PERIOD.mul_f64(i as f64 / sizes.active as f64);
        loops.push(tokio::spawn(paced_turns(
            control,
            watch,
            session_id,
            head,
            offset,
            stages,
            measuring.clone(),
        )));
    }

    let mut measured = Vec::with_capacity(stages);
    let mut parked = 0;
    for (stage, &total) in sizes.totals.iter().enumerate() {
        let start = Instant::now();
        let wanted = total - sizes.active;
        park(&pool, &cwd, wanted - parked).await?;
        parked = wanted;
        let runtimes = suspended(&server, sizes.active + others).await? - others;
        let parked_in = start.elapsed();
        tokio::time::sleep(plan.warmup).await;
        measuring.store(stage + 1, Ordering::Relaxed);
        tokio::time::sleep(plan.duration).await;
        measuring.store(IDLE, Ordering::Relaxed);
        let rss_kib = server.resident().map_or(0, |r| r.rss_kib);
        measured.push((total, parked_in, rss_kib, runtimes));
    }
    measuring.store(STOPPING, Ordering::Relaxed);
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); stages];
    for task in loops {
        let finished = tokio::time::timeout(WAIT_TIMEOUT, task)
            .await
            .context("an active session's loop did not stop")?
            .context("an active session's loop panicked")??;
        for (all, mine) in samples.iter_mut().zip(finished) {
            all.extend(mine);
        }
    }
    drop(pool);
    server.stop().await?;

    let mut results = Vec::with_capacity(stages);
    for ((total, parked_in, rss_kib, runtimes), mut samples) in measured.into_iter().zip(samples) {
        let Some(latency) = Summary::of(&mut samples) else {
            bail!("no turn finished in the window with {total} sessions");
        };
        results.push(Stage {
            total,
            latency,
            parked_in,
            rss_kib,
            runtimes,
        });
    }
    Ok(report(&sizes, &results))
}

/// One active session: a turn every [`PERIOD`] (from `offset`), each timed; the latencies of
/// turns started while stage `k` is measured go to `k`'s list.
async fn paced_turns(
    control: Channel,
    watch: Channel,
    session_id: String,
    head: u64,
    offset: Duration,
    stages: usize,
    measuring: Arc<AtomicUsize>,
) -> anyhow::Result<Vec<Vec<Duration>>> {
    let mut stream = LogStream::open(&watch, &session_id, head).await?;
    let mut control = client::sessions(&control);
    let mut latencies = vec![Vec::new(); stages];
    let mut next = Instant::now() + offset;
    loop {
        tokio::time::sleep_until(next).await;
        let stage = measuring.load(Ordering::Relaxed);
        if stage == STOPPING {
            return Ok(latencies);
        }
        let start = Instant::now();
        let action_id = client::prompt(&mut control, &session_id, TURN_TEXT).await?;
        stream.response_to(&action_id).await?;
        if stage != IDLE {
            latencies[stage - 1].push(start.elapsed());
        }
        // A turn that overran its period starts the next one at once, not a burst of them.
        next = (next + PERIOD).max(Instant::now());
    }
}

/// Creates `n` parked sessions, each given one turn and then left alone.
async fn park(pool: &Arc<Vec<Channel>>, cwd: &std::path::Path, n: usize) -> anyhow::Result<()> {
    stream::iter(0..n)
        .map(|i| {
            let control = pool[i % pool.len()].clone();
            let watch = pool[(i + 1) % pool.len()].clone();
            async move {
                let (session_id, head) = client::create_session_of(&control, cwd, PARKED).await?;
                let mut stream = LogStream::open(&watch, &session_id, head).await?;
                let action_id =
                    client::prompt(&mut client::sessions(&control), &session_id, TURN_TEXT).await?;
                stream.response_to(&action_id).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(PARK_CONCURRENCY)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// Waits until the server has no more children than the active sessions' runtimes and the
/// others it had before any session (the parked ones have all been suspended by their idle
/// timeout); how many it has.
async fn suspended(server: &ServerProcess, active: usize) -> anyhow::Result<usize> {
    let deadline = Instant::now() + SUSPEND_TIMEOUT;
    loop {
        let (_, runtimes) = super::machine::children_cpu_time(server.pid());
        if runtimes <= active {
            return Ok(runtimes);
        }
        if Instant::now() > deadline {
            bail!(
                "{runtimes} child processes still run {SUSPEND_TIMEOUT:?} after the parked \
                 sessions' last turn (expected {active}: the parked ones stop after \
                 {IDLE_TIMEOUT})"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn report(sizes: &Sizes, stages: &[Stage]) -> (PhaseReport, Vec<LatencyPoint>) {
    let (fewest, most) = (&stages[0], &stages[stages.len() - 1]);
    let ratio = most.latency.p50.as_secs_f64() / fewest.latency.p50.as_secs_f64().max(1e-9);
    let row = Row {
        key: "sessions-latency",
        figure: format!(
            "{FIGURE}: {} sessions ({} active, the rest suspended by idle timeout)",
            grouped(most.total as f64, 0),
            sizes.active
        ),
        measured: format!(
            "p50 {} (p99 {})",
            ms(most.latency.p50),
            ms(most.latency.p99)
        ),
        against: format!(
            "{} sessions: p50 {} (p99 {})",
            grouped(fewest.total as f64, 0),
            ms(fewest.latency.p50),
            ms(fewest.latency.p99)
        ),
        ratio: Some(ratio),
        target: TARGET.to_owned(),
        verdict: Verdict::of(ratio <= RATIO_LIMIT),
    };
    let mut notes = vec![format!(
        "sessions-latency: {} active mock sessions, each a turn ({TURN_TEXT:?}) every {} ms \
         ({} turns/s offered), timed Control -> response on its LOG stream; the other sessions \
         created through the API on a mock profile with idle_timeout {IDLE_TIMEOUT}, one turn \
         each, then suspended (runtime stopped; record, log and actor kept by the server)",
        sizes.active,
        PERIOD.as_millis(),
        grouped(sizes.active as f64 / PERIOD.as_secs_f64(), 0),
    )];
    for stage in stages {
        notes.push(format!(
            "sessions-latency: {} sessions: {} turns, p50 {}, p99 {}, max {}; parking took \
             {:.1} s; {} runtimes alive; server VmRSS {} MiB",
            grouped(stage.total as f64, 0),
            stage.latency.count,
            ms(stage.latency.p50),
            ms(stage.latency.p99),
            ms(stage.latency.max),
            stage.parked_in.as_secs_f64(),
            stage.runtimes,
            grouped(stage.rss_kib as f64 / 1024.0, 1),
        ));
    }
    let points = stages
        .iter()
        .map(|s| LatencyPoint {
            sessions: s.total,
            p50: s.latency.p50,
            p99: s.latency.p99,
        })
        .collect();
    (
        PhaseReport {
            rows: vec![row],
            notes,
        },
        points,
    )
}
