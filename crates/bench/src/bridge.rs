//! The turn round trip through a bridge: the mock agent run by an `agent-harness
//! bridge` process that dialled the harness over loopback, held against the same agent run as a
//! local child of the same harness, in the same run (interleaved in blocks, as for `rtt`).
//! No target was set for it; the one printed is ours: the extra hop (harness → bridge →
//! agent and back, over one gRPC stream) should cost at most 1 ms at the median.

use std::{process::Stdio, time::Duration};

use agent_harness::pb::v1 as pb;
use anyhow::Context;
use tokio::{process::Command, time::Instant};

use super::{
    Ctx,
    client::{self, LogStream},
    report::{PhaseReport, Row, Verdict, ms},
    rtt::TURN_TEXT,
    server::{ServerProcess, connect_pool},
    stats::Summary,
};

const P50_LIMIT: Duration = Duration::from_millis(1);
const BLOCKS: usize = 4;

pub const FIGURE: &str = "turn round trip, through a bridge vs local runtime";

async fn create(
    channel: &tonic::transport::Channel,
    profile: &str,
    cwd: &std::path::Path,
) -> anyhow::Result<(String, u64)> {
    let created = tokio::time::timeout(
        Duration::from_secs(30),
        client::sessions(channel).create_session(pb::CreateSessionRequest {
            profile: profile.to_owned(),
            cwd: cwd.to_string_lossy().into_owned(),
            ..Default::default()
        }),
    )
    .await
    .context("CreateSession timed out")?
    .with_context(|| format!("CreateSession on profile {profile}"))?
    .into_inner();
    let session = created
        .session
        .context("CreateSession answered no session")?;
    Ok((session.id, session.head_offset))
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<PhaseReport> {
    let plan = &ctx.plan;
    let config = format!(
        "[profiles.far]\nkind = \"remote\"\nbridge_profile = \"mock\"\n\n{}",
        ctx.config(&[])
    );
    let server = ServerProcess::serve(&ctx.bin, "bridge", &config).await?;
    let bridge_config = server.scratch().join("bridge.toml");
    std::fs::write(
        &bridge_config,
        format!(
            "bridge_id = \"bench\"\ndata_dir = {:?}\n[profiles.mock]\ncommand = {:?}\nargs = [\"mock-agent\", \"--resume\"]\n",
            server.scratch().join("bridge-data").to_string_lossy(),
            ctx.bin.to_string_lossy()
        ),
    )?;
    let mut bridge = Command::new(&ctx.bin)
        .arg("bridge")
        .arg("--connect")
        .arg(format!("http://{}", server.addr()))
        .arg("--config")
        .arg(&bridge_config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting the bridge")?;
    let pool = connect_pool(server.addr(), 2).await?;
    let (remote_id, remote_head) = create(&pool[0], "far", &server.workspace()).await?;
    let (local_id, local_head) = create(&pool[0], "mock", &server.workspace()).await?;
    let mut remote_stream = LogStream::open(&pool[1], &remote_id, remote_head).await?;
    let mut local_stream = LogStream::open(&pool[1], &local_id, local_head).await?;
    let mut control = client::sessions(&pool[0]);

    let mut turn = async |remote: bool| -> anyhow::Result<Duration> {
        let (id, stream) = match remote {
            true => (&remote_id, &mut remote_stream),
            false => (&local_id, &mut local_stream),
        };
        let start = Instant::now();
        let action_id = client::prompt(&mut control, id, TURN_TEXT).await?;
        stream.response_to(&action_id).await?;
        Ok(start.elapsed())
    };
    for _ in 0..plan.rtt_warmup {
        turn(false).await?;
        turn(true).await?;
    }
    let per_block = plan.rtt_turns.div_ceil(BLOCKS).max(1);
    let mut local = Vec::with_capacity(per_block * BLOCKS);
    let mut remote = Vec::with_capacity(per_block * BLOCKS);
    for _ in 0..BLOCKS {
        for _ in 0..per_block {
            local.push(turn(false).await?);
        }
        for _ in 0..per_block {
            remote.push(turn(true).await?);
        }
    }
    drop(remote_stream);
    drop(local_stream);
    drop(pool);
    let _ = bridge.kill().await;
    server.stop().await?;

    let local = Summary::of(&mut local).expect("turns were timed");
    let remote = Summary::of(&mut remote).expect("turns were timed");
    let overhead = remote.p50.saturating_sub(local.p50);
    Ok(PhaseReport {
        rows: vec![Row {
            key: "bridge-rtt-p50",
            figure: format!("{FIGURE}, p50"),
            measured: format!("{} (overhead {})", ms(remote.p50), ms(overhead)),
            against: format!("local {}", ms(local.p50)),
            ratio: Some(remote.p50.as_secs_f64() / local.p50.as_secs_f64().max(1e-9)),
            target: format!("overhead <= {} (ours)", ms(P50_LIMIT)),
            verdict: Verdict::of(overhead <= P50_LIMIT),
        }],
        notes: vec![format!(
            "bridge: {} turns each way after {} warm-up turns, prompt {TURN_TEXT:?}; through the \
             bridge p99 {}, max {}; local p99 {}, max {}",
            remote.count,
            plan.rtt_warmup,
            ms(remote.p99),
            ms(remote.max),
            ms(local.p99),
            ms(local.max)
        )],
    })
}
