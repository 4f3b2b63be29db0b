//! Memory one tenant can take (`tenant-memory`, `tenant-latency`, `tenant-memory-returned`): a
//! hostile user opens Subscribe streams (MESSAGES view) on every one of their sessions, reads them
//! with one slow loop, and prompts each session for a long answer. The server must stay within a
//! bound however slowly the streams are read, another tenant's calls must keep their usual
//! latency, and the memory must be given back once the streams close.
//!
//! One server, no tokens: tenants are told apart by `x-acting-user` (the server counts streams,
//! sessions and list scans per acting user, as it would per user token). Tenant `mallory` creates
//! [`Sizes::sessions`] sessions and opens [`Sizes::streams_per_session`] MESSAGES streams on each
//! (20 × 256 = 5,120 in the full run; the per-session cap is 256), over HTTP/2 connections of at
//! most [`PER_CONNECTION`] streams. Streams the server refuses are counted by their status.
//! One task then reads the open streams round-robin: every [`SLOW_PASS`] it takes at most one
//! message from each stream that has one ready, a slow reader. Each session is prompted for
//! [`Sizes::turns`] turns of `@chunks N SIZE` (a long answer each). Tenant `bob` calls GetSession
//! on a session of his own, one call after another, before (idle) and throughout (loaded).
//!
//! The same turns run [`WARM_UP_ROUNDS`] times before, without the hostile streams, and every log
//! is read once, so that the store's page caches are as full at the start as at the end. The server's `VmRSS` is sampled every [`SAMPLE`]: at
//! the start (every session created and warmed up, idle, no stream open), its peak while the
//! streams are open, and [`Sizes::after`] (30 s) after the last stream closed. The streams stay
//! open [`Sizes::hold`] after every turn has ended (each session idle with an empty queue, read
//! with GetSession and GetQueue: the bench holds no stream of its own).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::Context;
use futures::{StreamExt, stream};
use tokio::time::Instant;
use tonic::{Code, Request, Streaming, transport::Channel};

use super::{
    Ctx,
    client::{self, WAIT_TIMEOUT},
    report::{PhaseReport, Row, Verdict, grouped, ms},
    server::{ServerProcess, connect_pool},
    stats::Histogram,
};
use agent_harness::pb::v1 as pb;

pub const MEMORY_FIGURE: &str =
    "server RSS growth, one tenant's slow MESSAGES streams (20 sessions x 256), long answers";
/// The bound docs/benchmarks.md documents ("Memory one tenant can take"), computed from the
/// run's sizes by [`bound_mib`].
pub const MEMORY_TARGET: &str = "<= the documented bound";
pub const LATENCY_FIGURE: &str = "another tenant's GetSession p99 during it";
pub const LATENCY_TARGET: &str = "<= 2.00x idle";
const LATENCY_RATIO: f64 = 2.0;
pub const RETURNED_FIGURE: &str = "server RSS 30 s after the streams closed";
pub const RETURNED_TARGET: &str = "<= 1.20x of the start";
const RETURNED_RATIO: f64 = 1.2;

/// Streams per HTTP/2 connection at most (under the server's concurrent-stream limit).
const PER_CONNECTION: usize = 128;
/// The slow loop looks at every stream once per pass, a pass this often.
const SLOW_PASS: Duration = Duration::from_millis(250);
/// Rounds of the same turns before the start is read: enough for the store's page caches to be
/// full (they stop growing at 32 MiB for the writer).
const WARM_UP_ROUNDS: usize = 5;
/// The embedded store's read connections (each with a page cache of its own).
const READERS: usize = 4;
/// How often the bench looks whether the turns have ended.
const TURNS_POLL: Duration = Duration::from_millis(100);
/// How often the server's memory is read.
const SAMPLE: Duration = Duration::from_millis(100);
/// Streams opened at once.
const OPEN_CONCURRENCY: usize = 64;
/// How long the idle latency is measured before the streams open.
const IDLE_WINDOW: Duration = Duration::from_secs(5);
const IDLE_WINDOW_SMOKE: Duration = Duration::from_millis(300);
const HOSTILE: &str = "mallory";
const OTHER: &str = "bob";

struct Sizes {
    sessions: usize,
    streams_per_session: usize,
    turns: usize,
    /// `@chunks` of each turn's answer: count and bytes.
    chunks: usize,
    chunk_bytes: usize,
    /// How long the streams stay open after every turn ended.
    hold: Duration,
    /// How long after the streams closed the memory is read again.
    after: Duration,
    idle: Duration,
}

impl Sizes {
    fn of(smoke: bool) -> Self {
        if smoke {
            Self {
                sessions: 2,
                streams_per_session: 4,
                turns: 1,
                chunks: 8,
                chunk_bytes: 1024,
                hold: Duration::from_millis(300),
                after: Duration::from_millis(500),
                idle: IDLE_WINDOW_SMOKE,
            }
        } else {
            Self {
                sessions: 20,
                streams_per_session: 256,
                turns: 3,
                chunks: 64,
                chunk_bytes: 4096,
                hold: Duration::from_secs(10),
                after: Duration::from_secs(30),
                idle: IDLE_WINDOW,
            }
        }
    }
}

/// A request made as `user` (no tokens: `local` acting for them).
fn as_user<T>(user: &str, message: T) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("x-acting-user", user.parse().expect("an ASCII name"));
    request
}

/// `without_streams`: the same run without the hostile streams (what the turns alone leave in
/// memory: the control of `tenant-memory-returned`).
pub async fn run(ctx: &Ctx, smoke: bool, without_streams: bool) -> anyhow::Result<PhaseReport> {
    let mut sizes = Sizes::of(smoke);
    if without_streams {
        sizes.streams_per_session = 0;
    }
    let server = ServerProcess::serve(&ctx.bin, "tenants", &ctx.config(&[])).await?;
    let cwd = server.workspace();
    let wanted = sizes.sessions * sizes.streams_per_session;
    let connections = wanted.div_ceil(PER_CONNECTION).max(1);
    let pool = connect_pool(server.addr(), connections + 2).await?;
    let control = pool[connections].clone();
    let bobs_channel = pool[connections + 1].clone();

    // Mallory's sessions.
    let mut sessions = Vec::with_capacity(sizes.sessions);
    for _ in 0..sizes.sessions {
        let created = client::sessions(&control)
            .create_session(as_user(
                HOSTILE,
                pb::CreateSessionRequest {
                    profile: "mock".into(),
                    cwd: cwd.to_string_lossy().into_owned(),
                    ..Default::default()
                },
            ))
            .await
            .context("CreateSession for the hostile tenant")?
            .into_inner()
            .session
            .context("no session")?;
        sessions.push(created.id);
    }
    let bobs_session = client::sessions(&bobs_channel)
        .create_session(as_user(
            OTHER,
            pb::CreateSessionRequest {
                profile: "mock".into(),
                cwd: cwd.to_string_lossy().into_owned(),
                ..Default::default()
            },
        ))
        .await
        .context("CreateSession for the other tenant")?
        .into_inner()
        .session
        .context("no session")?
        .id;

    // Bob's calls, from now to the end; the window they count in is switched below.
    let window = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let bob = tokio::spawn(bobs_calls(
        bobs_channel,
        bobs_session,
        window.clone(),
        stop.clone(),
    ));
    let memory = tokio::spawn(sample_memory(server.pid(), stop.clone()));

    // A warm-up round of the same long answers without the hostile streams: the store's page
    // caches and the allocator are as a busy server has them before the start is read.
    let mut control_client = client::sessions(&control);
    for _ in 0..WARM_UP_ROUNDS {
        prompt_all(&mut control_client, &sessions, &sizes, sizes.turns).await?;
        turns_ended(&control, &sessions)
            .await
            .context("waiting for the warm-up answers")?;
    }
    // And every log read once, as the streams will read them: the readers' caches too.
    read_logs(&control, &sessions).await?;

    // Idle: every session made, nothing streaming.
    tokio::time::sleep(sizes.idle).await;
    let start_kib = rss_kib(&server)?;
    window.store(1, Ordering::Release);
    tokio::time::sleep(sizes.idle).await;

    // The hostile tenant's streams.
    window.store(2, Ordering::Release);
    let opened_at = Instant::now();
    let outcomes: Vec<Result<Streaming<pb::SubscribeResponse>, tonic::Status>> =
        stream::iter(0..wanted)
            .map(|i| {
                let channel = pool[i % connections].clone();
                let session_id = sessions[i % sizes.sessions].clone();
                async move {
                    client::sessions(&channel)
                        .subscribe(as_user(
                            HOSTILE,
                            pb::SubscribeRequest {
                                session_id,
                                after_offset: 0,
                                view: pb::SubscribeView::Messages as i32,
                            },
                        ))
                        .await
                        .map(|r| r.into_inner())
                }
            })
            .buffer_unordered(OPEN_CONCURRENCY)
            .collect()
            .await;
    let mut streams = Vec::new();
    let mut refused = std::collections::BTreeMap::<String, usize>::new();
    for outcome in outcomes {
        match outcome {
            Ok(stream) => streams.push(stream),
            Err(status) => *refused.entry(describe(&status)).or_default() += 1,
        }
    }
    let admitted = streams.len();
    let open_took = opened_at.elapsed();
    let reading = Arc::new(AtomicBool::new(true));
    let reader = tokio::spawn(slow_loop(streams, reading.clone()));

    // The long answers, then the streams held open a while.
    prompt_all(&mut control_client, &sessions, &sizes, sizes.turns).await?;
    let turns_from = Instant::now();
    turns_ended(&control, &sessions)
        .await
        .context("waiting for the long answers")?;
    let turns_took = turns_from.elapsed();
    tokio::time::sleep(sizes.hold).await;

    // Close every stream; the memory must come back.
    reading.store(false, Ordering::Release);
    let (read_messages, ended) = reader.await.context("the slow loop")?;
    window.store(3, Ordering::Release);
    let closed_at = Instant::now();
    tokio::time::sleep(sizes.after).await;
    let after_kib = rss_kib(&server)?;
    stop.store(true, Ordering::Release);
    let (idle, loaded) = bob.await.context("the other tenant's calls")??;
    let samples = memory.await.context("the memory sampler")?;
    let by_mapping = super::machine::resident_by_mapping(server.pid()).unwrap_or_default();
    server.stop().await?;

    let peak_kib = samples
        .iter()
        .filter(|(at, _)| *at <= closed_at)
        .map(|(_, kib)| *kib)
        .max()
        .unwrap_or(start_kib)
        .max(start_kib);
    let mib = |kib: u64| kib as f64 / 1024.0;
    let growth = mib(peak_kib.saturating_sub(start_kib));
    let bound = bound_mib(&sizes, admitted);
    let idle_p99 = idle.quantile(0.99).context("no idle GetSession call")?;
    let loaded_p99 = loaded.quantile(0.99).context("no loaded GetSession call")?;
    let latency_ratio = loaded_p99.as_secs_f64() / idle_p99.as_secs_f64().max(1e-6);
    let returned_ratio = after_kib as f64 / start_kib.max(1) as f64;

    let refused_text = if refused.is_empty() {
        "none".to_owned()
    } else {
        refused
            .iter()
            .map(|(why, n)| format!("{n} {why}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut notes = vec![
        format!(
            "tenant-memory: {} sessions x {} MESSAGES streams asked for over {connections} \
             connections: {admitted} admitted (opened in {:.1} s), refused: {refused_text}; \
             {} turns of {} x {} B each per session (ended {:.1} s after the prompts), streams \
             held {:.0} s more; the slow loop read {read_messages} messages, {ended} streams \
             ended by the server",
            sizes.sessions,
            sizes.streams_per_session,
            open_took.as_secs_f64(),
            sizes.turns,
            sizes.chunks,
            sizes.chunk_bytes,
            turns_took.as_secs_f64(),
            sizes.hold.as_secs_f64(),
        ),
        format!(
            "tenant-memory: server VmRSS start {} MiB, peak {} MiB, {:.0} s after the streams \
             closed {} MiB (by mapping then: {})",
            grouped(mib(start_kib), 1),
            grouped(mib(peak_kib), 1),
            sizes.after.as_secs_f64(),
            grouped(mib(after_kib), 1),
            by_mapping
                .iter()
                .map(|(kind, kib)| format!("{kind} {} MiB", grouped(mib(*kib), 1)))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        format!(
            "tenant-latency: {OTHER}'s GetSession, one call after another: idle {} calls p50 {} \
             p99 {} max {}; loaded {} calls p50 {} p99 {} max {}",
            idle.count(),
            ms(idle.quantile(0.5).unwrap_or_default()),
            ms(idle_p99),
            ms(idle.max().unwrap_or_default()),
            loaded.count(),
            ms(loaded.quantile(0.5).unwrap_or_default()),
            ms(loaded_p99),
            ms(loaded.max().unwrap_or_default()),
        ),
    ];
    if without_streams {
        notes.insert(
            0,
            "tenants: CONTROL run (--tenants-control): the same turns without the hostile \
             streams"
                .to_owned(),
        );
    }
    let rows = vec![
        Row {
            key: "tenant-memory",
            figure: MEMORY_FIGURE.to_owned(),
            measured: format!("+{} MiB", grouped(growth, 1)),
            against: format!("start {} MiB", grouped(mib(start_kib), 1)),
            ratio: None,
            target: format!("<= {} MiB (the bound)", grouped(bound, 0)),
            verdict: Verdict::of(growth <= bound),
        },
        Row {
            key: "tenant-latency",
            figure: LATENCY_FIGURE.to_owned(),
            measured: ms(loaded_p99),
            against: format!("idle {}", ms(idle_p99)),
            ratio: Some(latency_ratio),
            target: LATENCY_TARGET.to_owned(),
            verdict: Verdict::of(latency_ratio <= LATENCY_RATIO),
        },
        Row {
            key: "tenant-memory-returned",
            figure: RETURNED_FIGURE.to_owned(),
            measured: format!("{} MiB", grouped(mib(after_kib), 1)),
            against: format!("start {} MiB", grouped(mib(start_kib), 1)),
            ratio: Some(returned_ratio),
            target: RETURNED_TARGET.to_owned(),
            verdict: Verdict::of(returned_ratio <= RETURNED_RATIO),
        },
    ];
    Ok(PhaseReport { rows, notes })
}

/// Prompts every session for `turns` long answers (queued); the action ids, turn by turn.
async fn prompt_all(
    control: &mut pb::agent_session_service_client::AgentSessionServiceClient<Channel>,
    sessions: &[String],
    sizes: &Sizes,
    turns: usize,
) -> anyhow::Result<Vec<String>> {
    let mut prompts = Vec::new();
    for _ in 0..turns {
        for session_id in sessions {
            let text = format!(
                "long answer\n@chunks {} {}",
                sizes.chunks, sizes.chunk_bytes
            );
            let request = pb::ControlRequest {
                session_id: session_id.clone(),
                action: Some(pb::control_request::Action::Prompt(pb::PromptAction {
                    prompt: text,
                    attachments: Vec::new(),
                })),
                ..Default::default()
            };
            let reply = control
                .control(as_user(HOSTILE, request))
                .await
                .context("Control for the hostile tenant")?
                .into_inner();
            prompts.push(reply.action_id);
        }
    }
    Ok(prompts)
}

/// Reads every session's whole log (ReadLog pages), [`READERS`] sessions at once and twice, so
/// that each of the store's read connections has its cache full (it keeps what it read last).
async fn read_logs(channel: &Channel, sessions: &[String]) -> anyhow::Result<()> {
    for _ in 0..2 {
        stream::iter(sessions)
            .map(|session_id| read_log(channel, session_id))
            .buffer_unordered(READERS)
            .collect::<Vec<anyhow::Result<()>>>()
            .await
            .into_iter()
            .collect::<anyhow::Result<()>>()?;
    }
    Ok(())
}

/// Reads one session's whole log.
async fn read_log(channel: &Channel, session_id: &str) -> anyhow::Result<()> {
    let mut client = client::sessions(channel);
    let mut after = 0;
    loop {
        let page = client
            .read_log(pb::ReadLogRequest {
                session_id: session_id.to_owned(),
                after_offset: after,
                limit: 1000,
            })
            .await
            .context("ReadLog")?
            .into_inner()
            .entries;
        match page.last() {
            Some(last) => after = last.offset,
            None => return Ok(()),
        }
    }
}

/// Waits until every session is idle with an empty queue: its turns have ended.
async fn turns_ended(channel: &Channel, sessions: &[String]) -> anyhow::Result<()> {
    let mut client = client::sessions(channel);
    let deadline = Instant::now() + WAIT_TIMEOUT;
    for session_id in sessions {
        loop {
            let session = client
                .get_session(pb::GetSessionRequest {
                    session_id: session_id.clone(),
                })
                .await
                .context("GetSession")?
                .into_inner()
                .session
                .context("no session")?;
            let queued = client
                .get_queue(pb::GetQueueRequest {
                    session_id: session_id.clone(),
                })
                .await
                .context("GetQueue")?
                .into_inner()
                .entries
                .len();
            if session.status == pb::SessionStatus::Idle as i32 && queued == 0 {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "the turns did not end in time");
            tokio::time::sleep(TURNS_POLL).await;
        }
    }
    Ok(())
}

/// The bound docs/benchmarks.md documents, in MiB, for this run's sizes and admitted streams:
/// per stream its queue (256 KiB), the HTTP/2 send buffer (400 KiB) and two of its largest
/// message in flight (hyper holds one chunk while h2 sends the one before); per session
/// streamed, its transcript in the live fold, its live feed (512 entries) and the catch-up pages
/// (8 of at most 2 MiB).
fn bound_mib(sizes: &Sizes, streams: usize) -> f64 {
    const KIB: f64 = 1024.0;
    const MIB: f64 = KIB * KIB;
    let answer = (sizes.chunks * sizes.chunk_bytes) as f64;
    let per_stream = 256.0 * KIB + 400.0 * KIB + 2.0 * answer;
    let turns = ((WARM_UP_ROUNDS + 1) * sizes.turns) as f64;
    // A log entry of a chunk carries its text and about 200 bytes of JSON around it.
    let entry = sizes.chunk_bytes as f64 + 200.0;
    let per_session = turns * answer + 512.0 * entry + 8.0 * 2.0 * MIB;
    (streams as f64 * per_stream + sizes.sessions as f64 * per_session) / MIB
}

fn describe(status: &tonic::Status) -> String {
    format!("{:?}", status.code())
}

fn rss_kib(server: &ServerProcess) -> anyhow::Result<u64> {
    server
        .resident()
        .map(|r| r.rss_kib)
        .context("cannot read the server's memory")
}

/// `VmRSS` every [`SAMPLE`] until stopped, with when it was read.
async fn sample_memory(pid: u32, stop: Arc<AtomicBool>) -> Vec<(Instant, u64)> {
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(SAMPLE);
    while !stop.load(Ordering::Acquire) {
        tick.tick().await;
        if let Some(resident) = super::machine::resident(pid) {
            samples.push((Instant::now(), resident.rss_kib));
        }
    }
    samples
}

/// Reads the streams round-robin, every [`SLOW_PASS`] at most one message of each that has one
/// ready, until told to stop; the messages read and the streams the server ended.
async fn slow_loop(
    mut streams: Vec<Streaming<pb::SubscribeResponse>>,
    reading: Arc<AtomicBool>,
) -> (u64, usize) {
    use futures::FutureExt;
    let mut read = 0;
    let mut ended = vec![false; streams.len()];
    let mut pass = tokio::time::interval(SLOW_PASS);
    while reading.load(Ordering::Acquire) {
        pass.tick().await;
        for (stream, ended) in streams.iter_mut().zip(ended.iter_mut()) {
            if *ended {
                continue;
            }
            match stream.message().now_or_never() {
                Some(Ok(Some(_))) => read += 1,
                Some(Ok(None) | Err(_)) => *ended = true,
                None => {}
            }
        }
    }
    (read, ended.iter().filter(|e| **e).count())
}

/// GetSession as the other tenant, one call after another until stopped: latencies while idle
/// (window 1) and while the hostile tenant's streams are open (window 2).
async fn bobs_calls(
    channel: Channel,
    session_id: String,
    window: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<(Histogram, Histogram)> {
    let mut client = client::sessions(&channel);
    let (mut idle, mut loaded) = (Histogram::default(), Histogram::default());
    while !stop.load(Ordering::Acquire) {
        let started = Instant::now();
        let answer = tokio::time::timeout(
            WAIT_TIMEOUT,
            client.get_session(as_user(
                OTHER,
                pb::GetSessionRequest {
                    session_id: session_id.clone(),
                },
            )),
        )
        .await
        .context("GetSession timed out")?;
        let took = started.elapsed();
        match answer {
            Ok(_) => {}
            Err(status) if status.code() == Code::Unavailable => {}
            Err(status) => return Err(status).context("GetSession of the other tenant"),
        }
        match window.load(Ordering::Acquire) {
            1 => idle.record(took),
            2 => loaded.record(took),
            _ => {}
        }
    }
    Ok((idle, loaded))
}
