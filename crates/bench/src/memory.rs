//! Memory of MESSAGES-view subscribers against the transcript's size (`messages-memory`): the
//! server's resident memory should not grow with subscribers × transcript — one fold of a
//! session serves all its MESSAGES subscribers on a replica.
//!
//! One server builds sessions whose transcripts hold 0.5, 1 and 5 MiB of agent text (in the full
//! run) through the API: the mock agent streams it (`@chunks N 4096`, 256 KiB a turn). Then, for
//! each session, the server is restarted on the same data dir — a fresh process that has touched
//! no transcript yet, so memory freed by the build cannot hide what the subscribers take — its
//! `VmRSS` is read, and MESSAGES subscribers are opened on the session (each read to `caught_up`,
//! then left open): 1, then 10, then 100 in all, `VmRSS` read after each step. The figures are
//! the growth over the fresh process: 100 subscribers of the 5 MiB transcript held against 1.

use std::{path::Path, sync::Arc, time::Duration};

use anyhow::Context;
use futures::{StreamExt, stream};
use tonic::transport::Channel;

use super::{
    Ctx,
    client::{self, LogStream},
    plot::MemoryPoint,
    report::{PhaseReport, Row, Verdict, grouped},
    server::{ServerProcess, connect_pool},
};
use agent_harness::pb::v1 as pb;

pub const FIGURE: &str = "server memory of MESSAGES subscribers of one session";
pub const TARGET: &str = "<= 1.50x of 1 subscriber";
const RATIO_LIMIT: f64 = 1.5;
/// Bytes of one streamed chunk.
const CHUNK: usize = 4096;
/// Agent text per building turn at most (a message snapshot stays far below the gRPC limit).
const PER_TURN: usize = 256 * 1024;
/// Time the server gets to settle before its memory is read (the smoke run's: shorter).
const SETTLE: Duration = Duration::from_millis(1000);
const SETTLE_SMOKE: Duration = Duration::from_millis(200);
/// Subscribers opened at once.
const OPEN_CONCURRENCY: usize = 8;
/// How long building one transcript may take.
const BUILD_TIMEOUT: Duration = Duration::from_secs(300);

struct Sizes {
    settle: Duration,
    /// Bytes of agent text in each session's transcript, ascending.
    transcripts: Vec<usize>,
    /// Subscribers in all at each step, ascending; the first is 1.
    subscribers: Vec<usize>,
}

impl Sizes {
    fn of(smoke: bool) -> Self {
        const KIB: usize = 1024;
        if smoke {
            Self {
                settle: SETTLE_SMOKE,
                transcripts: vec![16 * KIB, 32 * KIB, 64 * KIB],
                subscribers: vec![1, 2, 4],
            }
        } else {
            Self {
                settle: SETTLE,
                transcripts: vec![512 * KIB, 1024 * KIB, 5 * 1024 * KIB],
                subscribers: vec![1, 10, 100],
            }
        }
    }
}

pub async fn run(ctx: &Ctx, smoke: bool) -> anyhow::Result<(PhaseReport, Vec<MemoryPoint>)> {
    let sizes = Sizes::of(smoke);
    let most = *sizes.subscribers.last().expect("at least one step");
    let config = ctx.config(&[
        ("subscribers_per_session", most + 8),
        ("subscribers_per_principal", most + 16),
    ]);
    let mut server = ServerProcess::serve(&ctx.bin, "memory", &config).await?;

    let mut sessions = Vec::with_capacity(sizes.transcripts.len());
    {
        let pool = connect_pool(server.addr(), 2).await?;
        for &bytes in &sizes.transcripts {
            sessions.push(build(&pool, &server.workspace(), bytes).await?);
        }
    }

    let mut points = Vec::new();
    let mut notes = Vec::new();
    for (&bytes, session_id) in sizes.transcripts.iter().zip(&sessions) {
        server = server.restart(&ctx.bin, &config).await?;
        let pool = Arc::new(connect_pool(server.addr(), ctx.plan.connections).await?);
        tokio::time::sleep(sizes.settle).await;
        let fresh = rss_kib(&server)?;
        let mut streams = Vec::new();
        let mut steps = Vec::new();
        for &count in &sizes.subscribers {
            let more = open(&pool, session_id, streams.len(), count - streams.len()).await?;
            streams.extend(more);
            tokio::time::sleep(sizes.settle).await;
            let grown = rss_kib(&server)?.saturating_sub(fresh);
            points.push(MemoryPoint {
                transcript_bytes: bytes,
                subscribers: count,
                grown_kib: grown,
            });
            steps.push(format!(
                "{count}: +{} MiB",
                grouped(grown as f64 / 1024.0, 2)
            ));
        }
        notes.push(format!(
            "messages-memory: {} KiB transcript, fresh server VmRSS {} MiB, growth with \
             subscribers {}",
            grouped(bytes as f64 / 1024.0, 0),
            grouped(fresh as f64 / 1024.0, 1),
            steps.join(", ")
        ));
        drop(streams);
    }
    server.stop().await?;

    let largest = *sizes.transcripts.last().expect("at least one transcript");
    let at = |subscribers: usize| {
        points
            .iter()
            .find(|p| p.transcript_bytes == largest && p.subscribers == subscribers)
            .map_or(0, |p| p.grown_kib)
    };
    let (one, all) = (at(1), at(most));
    let ratio = all as f64 / (one as f64).max(1.0);
    notes.insert(
        0,
        format!(
            "messages-memory: transcripts of agent text built through the API ({CHUNK}-byte \
             chunks, {} KiB a turn); per transcript a fresh server process (restarted on the same \
             data dir), then MESSAGES subscribers opened to caught_up and kept open; growth of \
             VmRSS over the fresh process, read {} ms after each step",
            PER_TURN / 1024,
            sizes.settle.as_millis()
        ),
    );
    let mib = |kib: u64| grouped(kib as f64 / 1024.0, 2);
    let row = Row {
        key: "messages-memory",
        figure: format!(
            "{FIGURE}, {} MiB transcript",
            grouped(largest as f64 / (1024.0 * 1024.0), 2)
        ),
        measured: format!("{most} subscribers: +{} MiB", mib(all)),
        against: format!("1 subscriber: +{} MiB", mib(one)),
        ratio: Some(ratio),
        target: TARGET.to_owned(),
        verdict: Verdict::of(ratio <= RATIO_LIMIT),
    };
    Ok((
        PhaseReport {
            rows: vec![row],
            notes,
        },
        points,
    ))
}

fn rss_kib(server: &ServerProcess) -> anyhow::Result<u64> {
    server
        .resident()
        .map(|r| r.rss_kib)
        .context("cannot read the server's memory")
}

/// A session whose transcript holds `bytes` of agent text, streamed by the mock agent in turns
/// queued back to back; its id.
async fn build(pool: &[Channel], cwd: &Path, bytes: usize) -> anyhow::Result<String> {
    let (session_id, head) = client::create_session(&pool[0], cwd).await?;
    let mut watch = LogStream::open(&pool[1], &session_id, head).await?;
    let mut control = client::sessions(&pool[0]);
    let mut left = bytes;
    while left > 0 {
        // Waves under the queue cap (50).
        let mut last = None;
        for _ in 0..40 {
            if left == 0 {
                break;
            }
            let this_turn = left.min(PER_TURN);
            let chunks = this_turn.div_ceil(CHUNK);
            left -= this_turn;
            let text = format!("@chunks {chunks} {CHUNK}");
            last = Some(client::prompt(&mut control, &session_id, &text).await?);
        }
        let last = last.expect("at least one turn was queued");
        tokio::time::timeout(BUILD_TIMEOUT, watch.response_to(&last))
            .await
            .context("building the transcript timed out")??;
    }
    watch.status(pb::SessionStatus::Idle).await?;
    Ok(session_id)
}

/// Opens `n` MESSAGES subscribers of the session, each read to `caught_up`.
async fn open(
    pool: &Arc<Vec<Channel>>,
    session_id: &str,
    first: usize,
    n: usize,
) -> anyhow::Result<Vec<LogStream>> {
    stream::iter(first..first + n)
        .map(|i| {
            let channel = pool[i % pool.len()].clone();
            async move {
                LogStream::open_view(&channel, session_id, 0, pb::SubscribeView::Messages).await
            }
        })
        .buffer_unordered(OPEN_CONCURRENCY)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}
