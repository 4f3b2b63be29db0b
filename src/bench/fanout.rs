//! Figure 3: fan-out of one session to many LOG-view subscribers — log entries delivered per
//! second (summed over subscribers) and the lag of each delivery.
//!
//! The session is kept streaming: a driver sends prompts of `@chunks N 100` (N 100-byte text
//! updates) and keeps two turns in the pipeline: turn k+2 is sent once every subscriber has
//! received the response of turn k. So the harness is never idle, and no subscriber is ever more
//! than about two turns behind (the figure is not a backlog growing for as long as it runs).
//!
//! Lag clock: each entry's `created_at` is stamped by the harness with the wall clock
//! (`CLOCK_REALTIME`, truncated to the microsecond) when the entry is built, just before its
//! commit; the benchmark reads the same host clock (`SystemTime::now()`) as soon as the stream
//! yields the entry. Both processes read one kernel clock, so the difference is meaningful; it
//! includes the commit, the broadcast, the subscriber task, gRPC encoding, loopback TCP, HTTP/2
//! and decoding. (A clock step during the run would show as a jump; negative lags are counted
//! and reported as such.)

use std::{
    sync::{
        Arc,
        atomic::{AtomicU8, AtomicUsize, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, bail};
use tokio::{sync::Notify, time::Instant};

use super::{
    Ctx,
    client::{self, LogStream, WAIT_TIMEOUT},
    report::{PhaseReport, Row, Verdict, grouped, ms},
    server::{ServerProcess, connect_pool},
    stats::Histogram,
};
use crate::pb::v1::{self as pb, subscribe_response::Event};

pub const FIGURE: &str = "fan-out, 1 session to many subscribers, LOG view";
const RATE_TARGET: f64 = 1_000_000.0;
const LAG_LIMIT: Duration = Duration::from_millis(20);
/// Subscribers per HTTP/2 connection at most.
const PER_CONNECTION: usize = 128;
/// Turns tracked at once (turn k's slot is reused by turn k + RING).
const RING: usize = 64;

const WARMING: u8 = 0;
const MEASURING: u8 = 1;
const STOPPING: u8 = 2;

struct Shared {
    subscribers: usize,
    phase: AtomicU8,
    caught_up: AtomicUsize,
    all_caught_up: Notify,
    /// Per turn (mod RING): how many subscribers have received its response.
    arrived: Vec<AtomicUsize>,
    turn_seen_by_all: Notify,
    stop: tokio::sync::watch::Sender<bool>,
}

/// What one subscriber saw in the measured window.
#[derive(Default)]
struct Seen {
    entries: u64,
    lag: Histogram,
    negative: u64,
}

fn lag_of(entry: &pb::LogEntry, now: SystemTime) -> Option<Result<Duration, Duration>> {
    let at = entry.created_at.as_ref()?;
    let created = UNIX_EPOCH + Duration::new(at.seconds.max(0) as u64, at.nanos.max(0) as u32);
    Some(now.duration_since(created).map_err(|e| e.duration()))
}

async fn subscriber(
    channel: tonic::transport::Channel,
    session_id: String,
    head: u64,
    shared: Arc<Shared>,
) -> anyhow::Result<Seen> {
    let mut stop = shared.stop.subscribe();
    let mut stream = LogStream::open(&channel, &session_id, head).await?;
    if shared.caught_up.fetch_add(1, Ordering::AcqRel) + 1 == shared.subscribers {
        shared.all_caught_up.notify_one();
    }
    let mut seen = Seen::default();
    let mut responses = 0usize;
    loop {
        let event = tokio::select! {
            event = stream.next() => event?,
            _ = stop.changed() => return Ok(seen),
        };
        let Event::Entry(entry) = event else { continue };
        let now = SystemTime::now();
        if shared.phase.load(Ordering::Relaxed) == MEASURING {
            seen.entries += 1;
            match lag_of(&entry, now) {
                Some(Ok(lag)) => seen.lag.record(lag),
                Some(Err(_)) => seen.negative += 1,
                None => bail!("a log entry without created_at"),
            }
        }
        // The response of a prompt (the only frames that carry a stop reason).
        if entry.direction == pb::LogDirection::FromRuntime as i32
            && entry.json.contains("\"stopReason\"")
        {
            let slot = &shared.arrived[responses % RING];
            responses += 1;
            if slot.fetch_add(1, Ordering::AcqRel) + 1 == shared.subscribers {
                shared.turn_seen_by_all.notify_one();
            }
        }
    }
}

/// Sends turn after turn, two in the pipeline; returns how many it sent.
async fn drive(
    channel: tonic::transport::Channel,
    session_id: String,
    text: String,
    shared: Arc<Shared>,
) -> anyhow::Result<usize> {
    let mut control = client::sessions(&channel);
    let mut stop = shared.stop.subscribe();
    let mut sent = 0usize;
    let mut send = async |sent: &mut usize| -> anyhow::Result<()> {
        shared.arrived[*sent % RING].store(0, Ordering::Release);
        client::prompt(&mut control, &session_id, &text).await?;
        *sent += 1;
        Ok(())
    };
    send(&mut sent).await?;
    send(&mut sent).await?;
    let mut waiting_for = 0usize;
    loop {
        // Wait until every subscriber has the response of turn `waiting_for`.
        let deadline = Instant::now() + WAIT_TIMEOUT;
        while shared.arrived[waiting_for % RING].load(Ordering::Acquire) < shared.subscribers {
            tokio::select! {
                _ = shared.turn_seen_by_all.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = stop.changed() => return Ok(sent),
            }
            if Instant::now() > deadline {
                bail!("turn {waiting_for} did not reach every subscriber within {WAIT_TIMEOUT:?}");
            }
        }
        if *stop.borrow() {
            return Ok(sent);
        }
        waiting_for += 1;
        send(&mut sent).await?;
    }
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<PhaseReport> {
    let plan = &ctx.plan;
    let m = plan.subscribers;
    let chunks = plan.fanout_chunks;
    let server = ServerProcess::serve(
        &ctx.bin,
        "fanout",
        &ctx.config(&[("subscribers_per_session", m + 8)]),
    )
    .await?;
    let connections = plan.connections.max(m.div_ceil(PER_CONNECTION));
    let pool = connect_pool(server.addr(), connections).await?;
    let (session_id, head) = client::create_session(&pool[0], server.scratch()).await?;

    let shared = Arc::new(Shared {
        subscribers: m,
        phase: AtomicU8::new(WARMING),
        caught_up: AtomicUsize::new(0),
        all_caught_up: Notify::new(),
        arrived: (0..RING).map(|_| AtomicUsize::new(0)).collect(),
        turn_seen_by_all: Notify::new(),
        stop: tokio::sync::watch::channel(false).0,
    });
    let subscribers: Vec<_> = (0..m)
        .map(|i| {
            tokio::spawn(subscriber(
                pool[i % pool.len()].clone(),
                session_id.clone(),
                head,
                shared.clone(),
            ))
        })
        .collect();
    tokio::time::timeout(WAIT_TIMEOUT, async {
        while shared.caught_up.load(Ordering::Acquire) < m {
            shared.all_caught_up.notified().await;
        }
    })
    .await
    .context("the subscribers did not all catch up")?;

    let text = format!("@chunks {chunks} 100");
    let driver = tokio::spawn(drive(
        pool[0].clone(),
        session_id.clone(),
        text.clone(),
        shared.clone(),
    ));
    tokio::time::sleep(plan.warmup).await;
    let before = server.counters();
    let start = Instant::now();
    shared.phase.store(MEASURING, Ordering::Relaxed);
    tokio::time::sleep(plan.duration).await;
    shared.phase.store(STOPPING, Ordering::Relaxed);
    let window = start.elapsed();
    let usage = before.until(&server.counters());
    shared.stop.send_replace(true);

    let turns = tokio::time::timeout(WAIT_TIMEOUT, driver)
        .await
        .context("the driver did not stop")?
        .context("the driver panicked")??;
    let mut entries = 0u64;
    let mut negative = 0u64;
    let mut lag = Histogram::default();
    for task in subscribers {
        let seen = tokio::time::timeout(WAIT_TIMEOUT, task)
            .await
            .context("a subscriber did not stop")?
            .context("a subscriber panicked")??;
        entries += seen.entries;
        negative += seen.negative;
        lag.merge(&seen.lag);
    }
    drop(pool);
    server.stop().await?;

    let rate = entries as f64 / window.as_secs_f64();
    let p50 = lag.quantile(0.50).unwrap_or_default();
    let p99 = lag.quantile(0.99).unwrap_or_default();
    let max = lag.max().unwrap_or_default();
    Ok(PhaseReport {
        rows: vec![
            Row {
                key: "fanout-rate",
                figure: format!("{FIGURE}, {m} subscribers, events delivered"),
                measured: format!("{} events/s", grouped(rate, 0)),
                against: format!("limit {} events/s", grouped(RATE_TARGET, 0)),
                ratio: Some(rate / RATE_TARGET),
                target: ">= 1 M events/s (stretch)".to_owned(),
                verdict: Verdict::of(rate >= RATE_TARGET),
            },
            Row {
                key: "fanout-lag",
                figure: format!("{FIGURE}, {m} subscribers, p99 lag"),
                measured: format!("p99 {} (p50 {})", ms(p99), ms(p50)),
                against: format!("limit {}", ms(LAG_LIMIT)),
                ratio: Some(p99.as_secs_f64() / LAG_LIMIT.as_secs_f64()),
                target: format!("p99 <= {}", ms(LAG_LIMIT)),
                verdict: Verdict::of(p99 <= LAG_LIMIT && lag.count() > 0),
            },
        ],
        notes: vec![
            format!(
                "fanout: {entries} entries delivered in {:.2} s after {:.1} s warm-up, {m} \
                 subscribers over {connections} connections, {turns} turns of {text:?} ({} \
                 entries each), two turns in the pipeline; lag max {}, {negative} negative lags",
                window.as_secs_f64(),
                plan.warmup.as_secs_f64(),
                chunks + 3,
                ms(max),
            ),
            format!("fanout: {}", usage.describe()),
        ],
    })
}
