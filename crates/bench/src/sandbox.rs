//! What the box costs: a session's cold start (CreateSession until its first turn ended, the
//! runtime started fresh) and a turn's round trip, on a profile boxed as every local profile is
//! by default, held against the same mock agent with `sandbox = "off"`, in one server and one
//! run, interleaved in blocks so a change of background load hits both.

use std::time::Duration;

use tokio::time::Instant;

use super::{
    Ctx,
    client::{self, LogStream},
    report::{PhaseReport, Row, Verdict, ms},
    rtt::TURN_TEXT,
    server::{ServerProcess, connect_pool},
    stats::Summary,
    warm,
};

pub const COLD_FIGURE: &str = "cold start (CreateSession to first turn ended), boxed vs unboxed";
pub const RTT_FIGURE: &str = "turn round trip, boxed vs unboxed runtime";
/// What the box may add to a cold start: building it is a few system calls and mounts.
const COLD_LIMIT: Duration = Duration::from_millis(50);
/// A turn's bytes take the same pipes either way: the box should add nothing measurable.
const RTT_LIMIT: Duration = Duration::from_micros(100);
/// Blocks the samples are interleaved in.
const BLOCKS: usize = 4;

pub async fn run(ctx: &Ctx, smoke: bool) -> anyhow::Result<PhaseReport> {
    let plan = &ctx.plan;
    let agent = format!(
        "command = {:?}\nargs = [\"mock-agent\", \"--resume\"]\n",
        ctx.bin.to_string_lossy()
    );
    let config = format!(
        "[profiles.boxed]\n{agent}\n[profiles.unboxed]\n{agent}sandbox = \"off\"\n{}",
        ctx.config(&[])
    );
    let server = ServerProcess::serve(&ctx.bin, "sandbox", &config).await?;
    let pool = connect_pool(server.addr(), 2).await?;
    let cwd = server.workspace();

    // Cold starts.
    let starts = if smoke { 2 } else { plan.warm_samples.max(8) };
    let per_block = starts.div_ceil(BLOCKS).max(1);
    let (mut boxed_starts, mut unboxed_starts) = (Vec::new(), Vec::new());
    for _ in 0..BLOCKS {
        for _ in 0..per_block {
            boxed_starts.push(warm::sample(&pool[0], "boxed", &cwd).await?.0);
        }
        for _ in 0..per_block {
            unboxed_starts.push(warm::sample(&pool[0], "unboxed", &cwd).await?.0);
        }
    }

    // Turns.
    let mut sides = Vec::new();
    for profile in ["boxed", "unboxed"] {
        let (session_id, head) = client::create_session_of(&pool[0], &cwd, profile).await?;
        let stream = LogStream::open(&pool[1], &session_id, head).await?;
        sides.push((session_id, stream, client::sessions(&pool[0])));
    }
    let turns = if smoke { 20 } else { plan.rtt_turns };
    let per_block = turns.div_ceil(BLOCKS).max(1);
    let (mut boxed_turns, mut unboxed_turns) = (Vec::new(), Vec::new());
    for round in 0..=BLOCKS {
        for (side, (session_id, stream, control)) in sides.iter_mut().enumerate() {
            for _ in 0..per_block {
                let start = Instant::now();
                let action_id = client::prompt(control, session_id, TURN_TEXT).await?;
                stream.response_to(&action_id).await?;
                let took = start.elapsed();
                // The first round warms both sides up and is not counted.
                if round > 0 {
                    match side {
                        0 => boxed_turns.push(took),
                        _ => unboxed_turns.push(took),
                    }
                }
            }
        }
    }
    drop(sides);
    drop(pool);
    server.stop().await?;

    let boxed_start = Summary::of(&mut boxed_starts).expect("starts were timed");
    let unboxed_start = Summary::of(&mut unboxed_starts).expect("starts were timed");
    let boxed_turn = Summary::of(&mut boxed_turns).expect("turns were timed");
    let unboxed_turn = Summary::of(&mut unboxed_turns).expect("turns were timed");
    let row = |key, figure: &str, b: Duration, u: Duration, limit: Duration| {
        let added = b.saturating_sub(u);
        Row {
            key,
            figure: format!("{figure}, p50"),
            measured: format!("{} (the box adds {})", ms(b), ms(added)),
            against: format!("unboxed {}", ms(u)),
            ratio: Some(b.as_secs_f64() / u.as_secs_f64().max(1e-9)),
            target: format!("adds <= {}", ms(limit)),
            verdict: Verdict::of(added <= limit),
        }
    };
    Ok(PhaseReport {
        rows: vec![
            row(
                "sandbox-cold",
                COLD_FIGURE,
                boxed_start.p50,
                unboxed_start.p50,
                COLD_LIMIT,
            ),
            row(
                "sandbox-rtt",
                RTT_FIGURE,
                boxed_turn.p50,
                unboxed_turn.p50,
                RTT_LIMIT,
            ),
        ],
        notes: vec![format!(
            "sandbox: the mock agent in one server, profile `boxed` (the default box: namespaces, \
             seccomp, a cgroup with the default limits, its own network) and `unboxed` \
             (sandbox = \"off\"); {} cold starts and {} turns each, in {BLOCKS} interleaved \
             blocks; cold start p99 boxed {}, unboxed {}; turn p99 boxed {}, unboxed {}",
            boxed_start.count,
            boxed_turn.count,
            ms(boxed_start.p99),
            ms(unboxed_start.p99),
            ms(boxed_turn.p99),
            ms(unboxed_turn.p99),
        )],
    })
}
