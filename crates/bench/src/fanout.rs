//! Figure 3: fan-out of one session to many LOG-view subscribers — log entries delivered per
//! second (summed over subscribers) and the lag of each delivery. Two parts, one server, the
//! same subscribers:
//!
//! - **Paced (the lag figure).** One long turn streams 100-byte chunks at a steady rate — a
//!   prompt of `@chunks K 100` / `@sleep 10` lines — chosen so the deliveries offered reach the
//!   target rate (1 M/s with 1,000 subscribers: about 1,000 entries/s into the session). The lag
//!   of every delivery is measured there: latency at the target load, with no backlog that the
//!   benchmark itself builds up.
//! - **Saturated (the rate figure).** Turns of `@chunks N 100` back to back, two in the
//!   pipeline: turn k+2 is sent once every subscriber has received the response of turn k. So the
//!   harness is never idle and no subscriber is ever more than about two turns behind; entries
//!   delivered per second is the most the harness sustains. (Its lag, reported in the notes, is
//!   mostly the time to push a two-turn burst to every subscriber.)
//!
//! - **Fallen behind (`fanout-behind`, its own figure).** After a saturated window (delivery
//!   while keeping up, the figure it is held against), every subscriber stops reading at once
//!   while one turn streams far more entries than the session's live feed holds (512) plus what
//!   HTTP/2 flow control lets the server buffer; then all resume at once. Entries delivered per
//!   second from the resumption until every subscriber has the turn's response: the catch-up of
//!   a thousand subscribers that all fell behind together.
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
        atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering},
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
use agent_harness::pb::v1::{self as pb, subscribe_response::Event};

pub const FIGURE: &str = "fan-out, 1 session to many subscribers, LOG view";
const RATE_TARGET: f64 = 1_000_000.0;
const LAG_LIMIT: Duration = Duration::from_millis(20);
/// Subscribers per HTTP/2 connection at most.
const PER_CONNECTION: usize = 128;
/// Turns tracked at once (turn k's slot is reused by turn k + RING).
const RING: usize = 64;

/// The pacing tick of the paced part, in milliseconds (`@sleep 10`).
const TICK_MS: u64 = 10;
/// Chunks per tick at most (the pacing of a tiny smoke run would ask for more).
const MAX_CHUNKS_PER_TICK: usize = 100;
/// The largest paced prompt (the prompt limit is 256 KiB).
const MAX_PACED_PROMPT: usize = 200 * 1024;

const WARMING: u8 = 0;
const MEASURING_PACED: u8 = 1;
const BETWEEN: u8 = 2;
const MEASURING_SATURATED: u8 = 3;
const STOPPING: u8 = 4;
const MEASURING_BEHIND: u8 = 5;

pub const BEHIND_FIGURE: &str =
    "fan-out, 1 session to many LOG subscribers that all fell behind at once";
pub const BEHIND_TARGET: &str = ">= 0.80 of keeping up";
const BEHIND_RATIO: f64 = 0.8;
/// 100-byte chunks of the turn streamed while every subscriber is paused: several times the live
/// feed's 512 entries (the smoke run's too, so even it exercises the catch-up path).
const BEHIND_CHUNKS: usize = 3000;
const BEHIND_CHUNKS_SMOKE: usize = 1000;
/// How long the fallen-behind subscribers may take to catch up.
const BEHIND_TIMEOUT: Duration = Duration::from_secs(300);

struct Shared {
    subscribers: usize,
    phase: AtomicU8,
    caught_up: AtomicUsize,
    all_caught_up: Notify,
    /// Per turn (mod RING): how many subscribers have received its response.
    arrived: Vec<AtomicUsize>,
    turn_seen_by_all: Notify,
    /// Ends the subscribers.
    stop: tokio::sync::watch::Sender<bool>,
    /// Ends the saturated part's driver (the subscribers go on).
    stop_driver: tokio::sync::watch::Sender<bool>,
    /// While set, no subscriber reads its stream (each may finish the read it is in).
    paused: AtomicBool,
    resumed: Notify,
}

impl Shared {
    fn new(subscribers: usize) -> Self {
        Self {
            subscribers,
            phase: AtomicU8::new(WARMING),
            caught_up: AtomicUsize::new(0),
            all_caught_up: Notify::new(),
            arrived: (0..RING).map(|_| AtomicUsize::new(0)).collect(),
            turn_seen_by_all: Notify::new(),
            stop: tokio::sync::watch::channel(false).0,
            stop_driver: tokio::sync::watch::channel(false).0,
            paused: AtomicBool::new(false),
            resumed: Notify::new(),
        }
    }

    /// Waits while the subscribers are paused; false once stopped.
    async fn unpaused(&self, stop: &mut tokio::sync::watch::Receiver<bool>) -> bool {
        loop {
            let resumed = self.resumed.notified();
            tokio::pin!(resumed);
            resumed.as_mut().enable();
            if !self.paused.load(Ordering::Acquire) {
                return true;
            }
            tokio::select! {
                _ = resumed => {}
                _ = stop.changed() => return false,
            }
        }
    }
}

/// What one subscriber saw in a measured window.
#[derive(Default)]
struct Seen {
    entries: u64,
    lag: Histogram,
    negative: u64,
}

impl Seen {
    fn record(&mut self, entry: &pb::LogEntry, now: SystemTime) -> anyhow::Result<()> {
        self.entries += 1;
        match lag_of(entry, now) {
            Some(Ok(lag)) => self.lag.record(lag),
            Some(Err(_)) => self.negative += 1,
            None => bail!("a log entry without created_at"),
        }
        Ok(())
    }

    fn merge(&mut self, other: &Seen) {
        self.entries += other.entries;
        self.negative += other.negative;
        self.lag.merge(&other.lag);
    }
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
) -> anyhow::Result<[Seen; 3]> {
    let mut stop = shared.stop.subscribe();
    let mut stream = LogStream::open(&channel, &session_id, head).await?;
    if shared.caught_up.fetch_add(1, Ordering::AcqRel) + 1 == shared.subscribers {
        shared.all_caught_up.notify_one();
    }
    let [mut paced, mut saturated, mut behind] =
        [Seen::default(), Seen::default(), Seen::default()];
    let mut responses = 0usize;
    loop {
        if shared.paused.load(Ordering::Relaxed) && !shared.unpaused(&mut stop).await {
            return Ok([paced, saturated, behind]);
        }
        let event = tokio::select! {
            event = stream.next() => event?,
            _ = stop.changed() => return Ok([paced, saturated, behind]),
        };
        let Event::Entry(entry) = event else { continue };
        let now = SystemTime::now();
        match shared.phase.load(Ordering::Relaxed) {
            MEASURING_PACED => paced.record(&entry, now)?,
            MEASURING_SATURATED => saturated.record(&entry, now)?,
            MEASURING_BEHIND => behind.record(&entry, now)?,
            _ => {}
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

/// Waits until every subscriber has the response of turn `turn` (counted from 0 per stream).
async fn seen_by_all(
    shared: &Shared,
    turn: usize,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<bool> {
    seen_by_all_within(shared, turn, stop, WAIT_TIMEOUT).await
}

async fn seen_by_all_within(
    shared: &Shared,
    turn: usize,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    timeout: Duration,
) -> anyhow::Result<bool> {
    let deadline = Instant::now() + timeout;
    while shared.arrived[turn % RING].load(Ordering::Acquire) < shared.subscribers {
        tokio::select! {
            _ = shared.turn_seen_by_all.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = stop.changed() => return Ok(false),
        }
        if Instant::now() > deadline {
            bail!("turn {turn} did not reach every subscriber within {timeout:?}");
        }
    }
    Ok(!*stop.borrow())
}

/// The saturated part: turns from `first` on, two in the pipeline, until stopped; returns how
/// many it sent.
async fn drive(
    channel: tonic::transport::Channel,
    session_id: String,
    text: String,
    first: usize,
    shared: Arc<Shared>,
) -> anyhow::Result<usize> {
    let mut control = client::sessions(&channel);
    let mut stop = shared.stop_driver.subscribe();
    let mut next = first;
    let mut send = async |next: &mut usize| -> anyhow::Result<()> {
        shared.arrived[*next % RING].store(0, Ordering::Release);
        client::prompt(&mut control, &session_id, &text).await?;
        *next += 1;
        Ok(())
    };
    send(&mut next).await?;
    send(&mut next).await?;
    let mut waiting_for = first;
    while seen_by_all(&shared, waiting_for, &mut stop).await? {
        waiting_for += 1;
        send(&mut next).await?;
    }
    Ok(next - first)
}

/// The paced prompt: `ticks` lines of `@chunks K 100` then `@sleep 10`.
fn paced_prompt(chunks_per_tick: usize, ticks: u64) -> anyhow::Result<String> {
    let step = format!("@chunks {chunks_per_tick} 100\n@sleep {TICK_MS}\n");
    let text = step.repeat(ticks as usize);
    if text.len() > MAX_PACED_PROMPT {
        bail!(
            "a paced run of {ticks} ticks needs a {} byte prompt; use a shorter --duration",
            text.len()
        );
    }
    Ok(text)
}

async fn stop_turn(channel: &tonic::transport::Channel, session_id: &str) -> anyhow::Result<()> {
    client::sessions(channel)
        .control(pb::ControlRequest {
            session_id: session_id.to_owned(),
            action: Some(pb::control_request::Action::Stop(pb::StopAction {
                clear_queue: true,
            })),
            ..Default::default()
        })
        .await
        .context("Control stop")?;
    Ok(())
}

async fn head_offset(channel: &tonic::transport::Channel, session_id: &str) -> anyhow::Result<u64> {
    let session = client::sessions(channel)
        .get_session(pb::GetSessionRequest {
            session_id: session_id.to_owned(),
        })
        .await
        .context("GetSession")?
        .into_inner()
        .session
        .context("GetSession answered no session")?;
    Ok(session.head_offset)
}

/// One session with its subscribers, all caught up.
struct Setup {
    server: ServerProcess,
    pool: Vec<tonic::transport::Channel>,
    connections: usize,
    session_id: String,
    shared: Arc<Shared>,
    subscribers: Vec<tokio::task::JoinHandle<anyhow::Result<[Seen; 3]>>>,
}

impl Setup {
    async fn start(ctx: &Ctx, label: &str) -> anyhow::Result<Self> {
        let m = ctx.plan.subscribers;
        let server = ServerProcess::serve(
            &ctx.bin,
            label,
            &ctx.config(&[
                ("subscribers_per_session", m + 8),
                ("subscribers_per_principal", m + 16),
            ]),
        )
        .await?;
        let connections = ctx.plan.connections.max(m.div_ceil(PER_CONNECTION));
        let pool = connect_pool(server.addr(), connections).await?;
        let (session_id, head) = client::create_session(&pool[0], &server.workspace()).await?;
        let shared = Arc::new(Shared::new(m));
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
        Ok(Self {
            server,
            pool,
            connections,
            session_id,
            shared,
            subscribers,
        })
    }

    /// Stops the subscribers and the server; what each part saw, summed over the subscribers.
    async fn finish(self) -> anyhow::Result<[Seen; 3]> {
        self.shared.stop_driver.send_replace(true);
        self.shared.stop.send_replace(true);
        let mut all = [Seen::default(), Seen::default(), Seen::default()];
        for task in self.subscribers {
            let seen = tokio::time::timeout(WAIT_TIMEOUT, task)
                .await
                .context("a subscriber did not stop")?
                .context("a subscriber panicked")??;
            for (sum, part) in all.iter_mut().zip(&seen) {
                sum.merge(part);
            }
        }
        drop(self.pool);
        self.server.stop().await?;
        Ok(all)
    }
}

/// What the saturated part measured (its entries are counted by the subscribers).
struct Saturated {
    text: String,
    window: Duration,
    usage: super::report::Usage,
    /// Turns sent, from the first.
    turns: usize,
}

/// The saturated part: turns from `first` on, two in the pipeline, measured for the plan's
/// duration after its warm-up; the driver is stopped after it (the subscribers go on).
async fn saturated(ctx: &Ctx, setup: &Setup, first: usize) -> anyhow::Result<Saturated> {
    let plan = &ctx.plan;
    let shared = &setup.shared;
    let text = format!("@chunks {} 100", plan.fanout_chunks);
    shared.stop_driver.send_replace(false);
    let driver = tokio::spawn(drive(
        setup.pool[0].clone(),
        setup.session_id.clone(),
        text.clone(),
        first,
        shared.clone(),
    ));
    tokio::time::sleep(plan.warmup).await;
    let before = setup.server.counters();
    let start = Instant::now();
    shared.phase.store(MEASURING_SATURATED, Ordering::Relaxed);
    tokio::time::sleep(plan.duration).await;
    shared.phase.store(STOPPING, Ordering::Relaxed);
    let window = start.elapsed();
    let usage = before.until(&setup.server.counters());
    shared.stop_driver.send_replace(true);
    let turns = tokio::time::timeout(WAIT_TIMEOUT, driver)
        .await
        .context("the driver did not stop")?
        .context("the driver panicked")??;
    Ok(Saturated {
        text,
        window,
        usage,
        turns,
    })
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<PhaseReport> {
    let plan = &ctx.plan;
    let m = plan.subscribers;
    let chunks = plan.fanout_chunks;
    let setup = Setup::start(ctx, "fanout").await?;
    let (shared, pool, session_id) = (&setup.shared, &setup.pool, &setup.session_id);

    // Paced: one long turn offering the target rate, measured after the warm-up.
    let per_session = plan.fanout_rate as f64 / m as f64;
    let chunks_per_tick = ((per_session * 1.25 * TICK_MS as f64 / 1000.0).ceil() as usize)
        .clamp(1, MAX_CHUNKS_PER_TICK);
    let offered_ticks = (plan.warmup + plan.duration).as_millis() as u64 / TICK_MS + 200;
    let paced = paced_prompt(chunks_per_tick, offered_ticks)?;
    let mut control = client::sessions(&pool[0]);
    client::prompt(&mut control, session_id, &paced).await?;
    tokio::time::sleep(plan.warmup).await;
    let head_before = head_offset(&pool[0], session_id).await?;
    let before = setup.server.counters();
    let start = Instant::now();
    shared.phase.store(MEASURING_PACED, Ordering::Relaxed);
    tokio::time::sleep(plan.duration).await;
    shared.phase.store(BETWEEN, Ordering::Relaxed);
    let paced_window = start.elapsed();
    let paced_usage = before.until(&setup.server.counters());
    let offered = (head_offset(&pool[0], session_id).await? - head_before) as f64
        / paced_window.as_secs_f64();
    stop_turn(&pool[0], session_id).await?;
    let mut stop = shared.stop.subscribe();
    if !seen_by_all(shared, 0, &mut stop).await? {
        bail!("stopped before the paced turn ended");
    }

    // Saturated: turns back to back, two in the pipeline, from turn 1 on.
    let Saturated {
        text,
        window,
        usage,
        turns,
    } = saturated(ctx, &setup, 1).await?;
    let connections = setup.connections;
    let [at_pace, saturated, _] = setup.finish().await?;

    let rate = saturated.entries as f64 / window.as_secs_f64();
    let paced_rate = at_pace.entries as f64 / paced_window.as_secs_f64();
    let q = |h: &Histogram, q: f64| h.quantile(q).unwrap_or_default();
    let p99 = q(&at_pace.lag, 0.99);
    // The lag figure counts only if the paced part delivered what it offered.
    let kept_up = paced_rate >= 0.95 * offered * m as f64;
    Ok(PhaseReport {
        rows: vec![
            Row {
                key: "fanout-rate",
                figure: format!("{FIGURE}, {m} subscribers, events delivered (saturated)"),
                measured: format!("{} events/s", grouped(rate, 0)),
                against: format!("limit {} events/s", grouped(RATE_TARGET, 0)),
                ratio: Some(rate / RATE_TARGET),
                target: ">= 1 M events/s (stretch)".to_owned(),
                verdict: Verdict::of(rate >= RATE_TARGET),
            },
            Row {
                key: "fanout-lag",
                figure: format!(
                    "{FIGURE}, {m} subscribers, p99 lag at {} events/s delivered (paced)",
                    grouped(paced_rate, 0)
                ),
                measured: format!("p99 {} (p50 {})", ms(p99), ms(q(&at_pace.lag, 0.5))),
                against: format!("limit {}", ms(LAG_LIMIT)),
                ratio: Some(p99.as_secs_f64() / LAG_LIMIT.as_secs_f64()),
                target: format!("p99 <= {}", ms(LAG_LIMIT)),
                verdict: Verdict::of(p99 <= LAG_LIMIT && at_pace.lag.count() > 0 && kept_up),
            },
        ],
        notes: vec![
            format!(
                "fanout paced: {} entries/s offered into the session ({chunks_per_tick} chunks \
                 every {TICK_MS} ms), x {m} subscribers = {} events/s offered, {} delivered{}; \
                 lag p50 {}, p99 {}, p99.9 {}, max {}, {} negative",
                grouped(offered, 0),
                grouped(offered * m as f64, 0),
                grouped(paced_rate, 0),
                if kept_up { "" } else { " (did NOT keep up)" },
                ms(q(&at_pace.lag, 0.5)),
                ms(p99),
                ms(q(&at_pace.lag, 0.999)),
                ms(at_pace.lag.max().unwrap_or_default()),
                at_pace.negative,
            ),
            format!(
                "fanout paced: {}; {}",
                paced_usage.describe(),
                per_delivery(&paced_usage, at_pace.entries)
            ),
            format!(
                "fanout saturated: {} entries delivered in {:.2} s after {:.1} s warm-up, {m} \
                 subscribers over {connections} connections, {turns} turns of {text:?} ({} \
                 entries each), two in the pipeline; lag p50 {}, p99 {}, max {}, {} negative",
                saturated.entries,
                window.as_secs_f64(),
                plan.warmup.as_secs_f64(),
                chunks + 3,
                ms(q(&saturated.lag, 0.5)),
                ms(q(&saturated.lag, 0.99)),
                ms(saturated.lag.max().unwrap_or_default()),
                saturated.negative,
            ),
            format!(
                "fanout saturated: {}; {}",
                usage.describe(),
                per_delivery(&usage, saturated.entries)
            ),
        ],
    })
}

/// `fanout-behind`: delivery while every subscriber catches up at once, held against delivery
/// while they keep up (the saturated part, same server, same subscribers, just before).
pub async fn run_behind(ctx: &Ctx, smoke: bool) -> anyhow::Result<PhaseReport> {
    let m = ctx.plan.subscribers;
    let behind_chunks = if smoke {
        BEHIND_CHUNKS_SMOKE
    } else {
        BEHIND_CHUNKS
    };
    let setup = Setup::start(ctx, "fanout-behind").await?;
    let (shared, session_id) = (&setup.shared, &setup.session_id);

    let keeping_up = saturated(ctx, &setup, 0).await?;
    // Every subscriber has every turn the driver sent before anyone pauses.
    let mut stop = shared.stop.subscribe();
    if !seen_by_all(shared, keeping_up.turns - 1, &mut stop).await? {
        bail!("stopped before the saturated turns reached every subscriber");
    }

    // All stop reading; one turn streams far past the live feed and the flow-control windows;
    // its response is committed (seen by a fresh stream that keeps up) before anyone resumes.
    // The prompt and that stream go over a connection of their own: the paused streams fill
    // their connections' HTTP/2 windows, which would hold anything else on them.
    let own = super::server::connect(setup.server.addr()).await?;
    shared.phase.store(BETWEEN, Ordering::Relaxed);
    shared.paused.store(true, Ordering::Release);
    let turn = keeping_up.turns;
    shared.arrived[turn % RING].store(0, Ordering::Release);
    let head = head_offset(&own, session_id).await?;
    let mut watcher = LogStream::open(&own, session_id, head).await?;
    let text = format!("@chunks {behind_chunks} 100");
    let action_id = client::prompt(&mut client::sessions(&own), session_id, &text).await?;
    watcher
        .response_to(&action_id)
        .await
        .context("the fallen-behind turn did not end")?;
    drop(watcher);
    let written = head_offset(&own, session_id).await? - head;
    drop(own);

    let before = setup.server.counters();
    let start = Instant::now();
    shared.phase.store(MEASURING_BEHIND, Ordering::Relaxed);
    shared.paused.store(false, Ordering::Release);
    shared.resumed.notify_waiters();
    if !seen_by_all_within(shared, turn, &mut stop, BEHIND_TIMEOUT).await? {
        bail!("stopped before the fallen-behind subscribers caught up");
    }
    let caught_up_in = start.elapsed();
    shared.phase.store(STOPPING, Ordering::Relaxed);
    let usage = before.until(&setup.server.counters());
    let connections = setup.connections;
    let [_, kept, behind] = setup.finish().await?;

    let keeping_rate = kept.entries as f64 / keeping_up.window.as_secs_f64();
    let behind_rate = behind.entries as f64 / caught_up_in.as_secs_f64();
    let ratio = behind_rate / keeping_rate.max(1.0);
    let q = |h: &Histogram, q: f64| ms(h.quantile(q).unwrap_or_default());
    Ok(PhaseReport {
        rows: vec![Row {
            key: "fanout-behind",
            figure: format!("{BEHIND_FIGURE}, {m} subscribers, events delivered"),
            measured: format!("{} events/s", grouped(behind_rate, 0)),
            against: format!("keeping up {} events/s", grouped(keeping_rate, 0)),
            ratio: Some(ratio),
            target: BEHIND_TARGET.to_owned(),
            verdict: Verdict::of(ratio >= BEHIND_RATIO),
        }],
        notes: vec![
            format!(
                "fanout-behind: keeping up, {} entries delivered in {:.2} s ({} turns of {:?}, \
                 two in the pipeline, {m} subscribers over {connections} connections); then \
                 every subscriber paused while one turn of {text:?} wrote {written} entries \
                 (the live feed holds 512), all resumed at once: {} entries delivered in {:.2} \
                 s until every subscriber had the turn's response (expected {})",
                kept.entries,
                keeping_up.window.as_secs_f64(),
                keeping_up.turns,
                keeping_up.text,
                behind.entries,
                caught_up_in.as_secs_f64(),
                written * m as u64,
            ),
            format!(
                "fanout-behind: catching up, lag p50 {}, p99 {}, max {}; keeping up: {}; \
                 catching up: {}; {}",
                q(&behind.lag, 0.5),
                q(&behind.lag, 0.99),
                ms(behind.lag.max().unwrap_or_default()),
                per_delivery(&keeping_up.usage, kept.entries),
                usage.describe(),
                per_delivery(&usage, behind.entries),
            ),
        ],
    })
}

/// CPU per delivered entry, harness and bench client: steadier than rates on a shared machine.
fn per_delivery(usage: &super::report::Usage, entries: u64) -> String {
    let us = |cpu: Duration| cpu.as_secs_f64() * 1e6 / entries.max(1) as f64;
    format!(
        "CPU per delivered entry: harness {:.3} us, bench client {:.3} us",
        us(usage.server_cpu),
        us(usage.bench_cpu)
    )
}
