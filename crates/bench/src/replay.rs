//! Figure 4: catch-up replay of a long log to one subscriber — entries per second from the
//! Subscribe call (`after_offset` 0, LOG view) to `caught_up`.
//!
//! The log is made by the mock agent through the harness (prompts of `@chunks 10000 100`, queued
//! back to back), so it holds real frames; it is replayed several times on fresh streams.

use std::time::Duration;

use anyhow::{Context, bail};
use tokio::time::Instant;

use super::{
    Ctx,
    client::{self, LogStream},
    report::{PhaseReport, Row, Verdict, grouped},
    server::{ServerProcess, connect_pool},
    stats::{median, spread},
};
use agent_harness::pb::v1::{self as pb, subscribe_response::Event};

pub const FIGURE: &str = "catch-up replay to one subscriber";
const TARGET: f64 = 200_000.0;
/// Chunks per generating turn.
const CHUNKS_PER_TURN: usize = 10_000;
/// Log entries of a generating turn besides its chunks: prompt, echo chunk, response.
const ENTRIES_AROUND_CHUNKS: usize = 3;
/// How long building the log may take.
const BUILD_TIMEOUT: Duration = Duration::from_secs(300);

pub async fn run(ctx: &Ctx) -> anyhow::Result<PhaseReport> {
    let plan = &ctx.plan;
    let server = ServerProcess::serve(&ctx.bin, "replay", &ctx.config(&[])).await?;
    let pool = connect_pool(server.addr(), 2).await?;
    let (session_id, head) = client::create_session(&pool[0], &server.workspace()).await?;

    // Build the log: whole turns, queued, until at least the asked number of frames.
    let build_start = Instant::now();
    let wanted = plan.replay_frames as u64;
    let per_turn = CHUNKS_PER_TURN.min(plan.replay_frames.max(1));
    let mut control = client::sessions(&pool[0]);
    let mut stream = LogStream::open(&pool[1], &session_id, head).await?;
    let mut expected = head;
    while expected < wanted {
        // Waves under the queue cap (50): queue up to 40 turns, wait for the last one.
        let mut last = None;
        for _ in 0..40 {
            if expected >= wanted {
                break;
            }
            let text = format!("@chunks {per_turn} 100");
            last = Some(client::prompt(&mut control, &session_id, &text).await?);
            expected += (per_turn + ENTRIES_AROUND_CHUNKS) as u64;
        }
        let last = last.expect("at least one turn was queued");
        tokio::time::timeout(BUILD_TIMEOUT, stream.response_to(&last))
            .await
            .context("building the log timed out")??;
    }
    stream.status(pb::SessionStatus::Idle).await?;
    drop(stream);
    let build = build_start.elapsed();

    let mut rates = Vec::with_capacity(plan.replay_runs);
    let mut counts = Vec::with_capacity(plan.replay_runs);
    let before = server.counters();
    for _ in 0..plan.replay_runs.max(1) {
        let start = Instant::now();
        let mut stream = client::sessions(&pool[1])
            .subscribe(pb::SubscribeRequest {
                session_id: session_id.clone(),
                after_offset: 0,
                view: pb::SubscribeView::Log as i32,
            })
            .await
            .context("Subscribe")?
            .into_inner();
        let mut entries = 0u64;
        let head = loop {
            let message = tokio::time::timeout(client::WAIT_TIMEOUT, stream.message())
                .await
                .context("the replay stalled")?
                .context("the replay stream failed")?
                .context("the replay stream ended before caught_up")?;
            match message.event {
                Some(Event::Entry(_)) => entries += 1,
                Some(Event::CaughtUp(caught_up)) => break caught_up.head_offset,
                _ => {}
            }
        };
        let took = start.elapsed();
        if entries != head {
            bail!("the replay delivered {entries} entries for a head of {head}");
        }
        rates.push(entries as f64 / took.as_secs_f64());
        counts.push(entries);
    }
    let usage = before.until(&server.counters());

    // GetTranscript on the same long log: the first call folds the whole log (what every call
    // cost before the fold was kept), later calls fold only what was appended since.
    let mut sessions = client::sessions(&pool[1]);
    let mut transcript_ms = Vec::new();
    for _ in 0..6 {
        let start = Instant::now();
        sessions
            .get_transcript(pb::GetTranscriptRequest {
                session_id: session_id.clone(),
                ..Default::default()
            })
            .await
            .context("GetTranscript")?;
        transcript_ms.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    let cold = transcript_ms[0];
    let warm = median(&transcript_ms[1..]).expect("five warm calls");
    drop(pool);
    server.stop().await?;

    let rate = median(&rates).expect("at least one run");
    let (low, high) = spread(&rates).expect("at least one run");
    let frames = counts[0];
    Ok(PhaseReport {
        rows: vec![Row {
            key: "replay",
            figure: format!("{FIGURE}, {} frames", grouped(frames as f64, 0)),
            measured: format!("{} frames/s", grouped(rate, 0)),
            against: format!("limit {} frames/s", grouped(TARGET, 0)),
            ratio: Some(rate / TARGET),
            target: format!(">= {} frames/s", grouped(TARGET, 0)),
            verdict: Verdict::of(rate >= TARGET),
        }],
        notes: vec![
            format!(
                "replay: median of {} runs, spread {} .. {} frames/s; the {frames}-entry log \
                 (100-byte chunks) was built through the harness in {:.1} s",
                rates.len(),
                grouped(low, 0),
                grouped(high, 0),
                build.as_secs_f64()
            ),
            format!("replay: {}", usage.describe()),
            format!(
                "transcript: GetTranscript (first page) on the {frames}-entry log: {cold:.1} ms \
                 folding the whole log (every call before the kept fold), {warm:.2} ms median of \
                 5 later calls (incremental)"
            ),
        ],
    })
}
