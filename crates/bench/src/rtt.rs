//! Figure 1: the turn round trip through the harness (Control → mock agent → the runtime's reply
//! seen by a subscriber), held against the same mock agent driven directly over stdio; and the
//! same round trip seen by a MESSAGES-view subscriber (the turn's end as its TurnEnded event,
//! which follows the final snapshot), held against the LOG view of the same run.
//!
//! Both sides run in the same run, interleaved in blocks so a change of background load hits
//! both; both build the same prompt frame and parse every line (entry) until the response. The
//! overhead is p50(harness) − p50(direct), and the same for p99 (a difference of percentiles,
//! not a percentile of differences).

use std::time::Duration;

use agent_harness::pb::v1 as pb;
use tokio::time::Instant;

use super::{
    Ctx,
    client::{self, LogStream},
    direct::DirectAgent,
    report::{PhaseReport, Row, Verdict, ms},
    server::{ServerProcess, connect_pool},
    stats::Summary,
};

/// The prompt of every timed turn: the mock agent echoes it in one chunk and ends the turn.
pub const TURN_TEXT: &str = "ping";
const P50_LIMIT: Duration = Duration::from_micros(500);
/// The second wave's stretch target for the same p50 overhead (docs/benchmarks.md, second wave).
const STRETCH_P50_LIMIT: Duration = Duration::from_micros(250);
const P99_LIMIT: Duration = Duration::from_millis(2);
/// How much later than the LOG view a MESSAGES subscriber may see a turn end.
const MESSAGES_P50_LIMIT: Duration = Duration::from_micros(500);
/// Blocks the timed turns are interleaved in (direct, harness, direct, harness, …).
const BLOCKS: usize = 4;

pub const FIGURE: &str = "turn round trip, harness vs mock agent over stdio";
pub const MESSAGES_FIGURE: &str = "turn round trip, MESSAGES view vs LOG view";

pub async fn run(ctx: &Ctx) -> anyhow::Result<PhaseReport> {
    let plan = &ctx.plan;
    let server = ServerProcess::serve(&ctx.bin, "rtt", &ctx.config(&[])).await?;
    let pool = connect_pool(server.addr(), 2).await?;
    let (session_id, head) = client::create_session(&pool[0], &server.workspace()).await?;
    // The subscriber has a connection of its own, as a separate client would.
    let mut stream = LogStream::open(&pool[1], &session_id, head).await?;
    let mut control = client::sessions(&pool[0]);
    // A second session for the MESSAGES view, so neither stream carries the other's turns.
    let (messages_session, messages_head) =
        client::create_session(&pool[0], &server.workspace()).await?;
    let mut messages = LogStream::open_view(
        &pool[1],
        &messages_session,
        messages_head,
        pb::SubscribeView::Messages,
    )
    .await?;
    let mut messages_control = client::sessions(&pool[0]);
    let mut direct = DirectAgent::start(&ctx.bin, &server.workspace()).await?;

    let mut harness_turn = async || -> anyhow::Result<Duration> {
        let start = Instant::now();
        let action_id = client::prompt(&mut control, &session_id, TURN_TEXT).await?;
        stream.response_to(&action_id).await?;
        Ok(start.elapsed())
    };
    let mut messages_turn = async || -> anyhow::Result<Duration> {
        let start = Instant::now();
        let action_id = client::prompt(&mut messages_control, &messages_session, TURN_TEXT).await?;
        messages.turn_ended(&action_id).await?;
        Ok(start.elapsed())
    };

    for _ in 0..plan.rtt_warmup {
        direct.turn(TURN_TEXT).await?;
        harness_turn().await?;
        messages_turn().await?;
    }
    let per_block = plan.rtt_turns.div_ceil(BLOCKS).max(1);
    let mut through_harness = Vec::with_capacity(per_block * BLOCKS);
    let mut through_messages = Vec::with_capacity(per_block * BLOCKS);
    let mut direct_times = Vec::with_capacity(per_block * BLOCKS);
    let before = server.counters();
    for _ in 0..BLOCKS {
        for _ in 0..per_block {
            direct_times.push(direct.turn(TURN_TEXT).await?);
        }
        for _ in 0..per_block {
            through_harness.push(harness_turn().await?);
        }
        for _ in 0..per_block {
            through_messages.push(messages_turn().await?);
        }
    }
    let usage = before.until(&server.counters());
    direct.stop().await?;
    drop(stream);
    drop(messages);
    drop(pool);
    server.stop().await?;

    let harness = Summary::of(&mut through_harness).expect("turns were timed");
    let messages = Summary::of(&mut through_messages).expect("turns were timed");
    let direct = Summary::of(&mut direct_times).expect("turns were timed");
    let row = |key, label: &str, h: Duration, d: Duration, limit: Duration| {
        let overhead = h.saturating_sub(d);
        Row {
            key,
            figure: format!("{FIGURE}, {label}"),
            measured: format!("{} (overhead {})", ms(h), ms(overhead)),
            against: format!("direct {}", ms(d)),
            ratio: Some(h.as_secs_f64() / d.as_secs_f64().max(1e-9)),
            target: format!("overhead <= {}", ms(limit)),
            verdict: Verdict::of(overhead <= limit),
        }
    };
    Ok(PhaseReport {
        rows: vec![
            row("rtt-p50", "p50", harness.p50, direct.p50, P50_LIMIT),
            row("rtt-p99", "p99", harness.p99, direct.p99, P99_LIMIT),
            Row {
                target: format!("overhead <= {} (stretch)", ms(STRETCH_P50_LIMIT)),
                ..row(
                    "rtt-stretch",
                    "p50, second-wave stretch",
                    harness.p50,
                    direct.p50,
                    STRETCH_P50_LIMIT,
                )
            },
            Row {
                key: "rtt-messages-p50",
                figure: format!("{MESSAGES_FIGURE}, p50"),
                measured: format!(
                    "{} (later by {})",
                    ms(messages.p50),
                    ms(messages.p50.saturating_sub(harness.p50))
                ),
                against: format!("LOG view {}", ms(harness.p50)),
                ratio: Some(messages.p50.as_secs_f64() / harness.p50.as_secs_f64().max(1e-9)),
                target: format!("<= LOG + {}", ms(MESSAGES_P50_LIMIT)),
                verdict: Verdict::of(messages.p50 <= harness.p50 + MESSAGES_P50_LIMIT),
            },
        ],
        notes: vec![
            format!(
                "rtt: {} turns each way after {} warm-up turns, prompt {TURN_TEXT:?} (1 chunk + \
                 response); ratio = harness / direct; harness p99.9 {}, max {}; direct p99.9 {}, \
                 max {}",
                harness.count,
                plan.rtt_warmup,
                ms(harness.p999),
                ms(harness.max),
                ms(direct.p999),
                ms(direct.max)
            ),
            format!(
                "rtt: MESSAGES view (the turn's TurnEnded) p99 {}, max {}; LOG view p99 {}",
                ms(messages.p99),
                ms(messages.max),
                ms(harness.p99)
            ),
            format!("rtt: {}", usage.describe()),
        ],
    })
}
