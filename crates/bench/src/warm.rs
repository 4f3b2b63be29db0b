//! CreateSession to the end of the first turn on a profile with a warm pool, held
//! against the same agent on a profile without one, in the same server and the same run (second
//! wave of docs/benchmarks.md: the warm profile should take at most 0.2 of the cold one's time).
//!
//! One server, two profiles running the same agent (`warm` with `warm_pool = 2`, `cold` without):
//! the Python SDK's example agent when `scripts/test` installed it (a real agent's start-up: an
//! interpreter and its imports), else — and always in smoke runs — the mock agent (a small native
//! binary, whose start-up is a few milliseconds).
//! Each sample: CreateSession, open a LOG stream from the head it answered, send a prompt, wait
//! for the runtime's response. Cold and warm samples alternate; before every sample the bench
//! waits (on the server's metrics) until the pool is full again, so a warm sample never finds it
//! empty and no refill runs beside a cold sample.

use std::{net::SocketAddr, time::Duration};

use agent_harness::pb::v1 as pb;
use anyhow::{Context, bail};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    time::Instant,
};

use super::{
    Ctx,
    client::{self, LogStream},
    report::{PhaseReport, Row, Verdict, ms},
    rtt::TURN_TEXT,
    server::{ServerProcess, connect, free_port},
    stats::Summary,
};

pub const FIGURE: &str = "CreateSession -> first turn ended, warm pool vs none";
pub const TARGET: &str = "<= 0.20 of cold";
const RATIO_LIMIT: f64 = 0.2;
const POOL: usize = 2;

/// The value of `agent_harness_warm_pool_ready{profile="warm"}` now.
async fn ready(metrics: SocketAddr) -> anyhow::Result<f64> {
    let mut stream = tokio::net::TcpStream::connect(metrics).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: metrics\r\nConnection: close\r\n\r\n")
        .await?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await?;
    Ok(text
        .lines()
        .find(|l| l.starts_with("agent_harness_warm_pool_ready{profile=\"warm\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0))
}

async fn pool_full(metrics: SocketAddr) -> anyhow::Result<()> {
    let deadline = Instant::now() + client::WAIT_TIMEOUT;
    while ready(metrics).await? < POOL as f64 {
        if Instant::now() > deadline {
            bail!(
                "the warm pool did not fill within {:?}",
                client::WAIT_TIMEOUT
            );
        }
        // The pool fills in the server's background; its metrics are all there is to watch.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// One sample: create, subscribe, prompt, response seen. Returns the time and whether the
/// session's runtime came from the pool.
pub(crate) async fn sample(
    channel: &tonic::transport::Channel,
    profile: &str,
    cwd: &std::path::Path,
) -> anyhow::Result<(Duration, bool)> {
    let start = Instant::now();
    let created = tokio::time::timeout(
        client::WAIT_TIMEOUT,
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
    let mut stream = LogStream::open(channel, &session.id, session.head_offset).await?;
    let mut control = client::sessions(channel);
    let action_id = client::prompt(&mut control, &session.id, TURN_TEXT).await?;
    stream.response_to(&action_id).await?;
    let took = start.elapsed();
    drop(stream);
    let log = control
        .read_log(pb::ReadLogRequest {
            session_id: session.id.clone(),
            after_offset: 0,
            limit: 10,
        })
        .await?
        .into_inner();
    let warm = log
        .entries
        .iter()
        .any(|e| e.json.contains("\"runtime_started\"") && e.json.contains("\"warm\":true"));
    control
        .delete_session(pb::DeleteSessionRequest {
            session_id: session.id,
        })
        .await
        .context("DeleteSession")?;
    Ok((took, warm))
}

pub async fn run(ctx: &Ctx, smoke: bool) -> anyhow::Result<PhaseReport> {
    let plan = &ctx.plan;
    let metrics: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
    let python = match smoke {
        true => None,
        false => super::peers::python_agent(&ctx.tools),
    };
    let (agent, agent_name) = match &python {
        Some(argv) => (
            format!("command = {:?}\nargs = [{:?}]\n", argv[0], argv[1]),
            "the Python SDK's example agent",
        ),
        None => (
            format!(
                "command = {:?}\nargs = [\"mock-agent\", \"--resume\"]\n",
                ctx.bin.to_string_lossy()
            ),
            "the mock agent",
        ),
    };
    let config = format!(
        // Both unboxed: a warm pool runs only unboxed (its runtimes start before a session's
        // owner and cwd are known), and the cold one is held to it like for like.
        "metrics_listen = \"{metrics}\"\n[profiles.warm]\n{agent}warm_pool = {POOL}\n\
         sandbox = \"off\"\n[profiles.cold]\n{agent}sandbox = \"off\"\n{}",
        ctx.config(&[])
    );
    let server = ServerProcess::serve(&ctx.bin, "warm", &config).await?;
    let channel = connect(server.addr()).await?;
    let samples = plan.warm_samples;
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    let mut not_warm = 0;
    // One pair of warm-up samples, then the timed ones, alternating.
    for i in 0..=samples {
        pool_full(metrics).await?;
        let (cold_took, cold_was_warm) = sample(&channel, "cold", &server.workspace()).await?;
        anyhow::ensure!(!cold_was_warm, "a cold session got a warm runtime");
        pool_full(metrics).await?;
        let (warm_took, was_warm) = sample(&channel, "warm", &server.workspace()).await?;
        not_warm += usize::from(!was_warm);
        if i > 0 {
            cold.push(cold_took);
            warm.push(warm_took);
        }
    }
    drop(channel);
    server.stop().await?;

    let cold = Summary::of(&mut cold).expect("samples were timed");
    let warm = Summary::of(&mut warm).expect("samples were timed");
    let ratio = warm.p50.as_secs_f64() / cold.p50.as_secs_f64().max(1e-9);
    Ok(PhaseReport {
        rows: vec![Row {
            key: "warm-create",
            figure: format!("{FIGURE}, p50"),
            measured: format!("warm {}", ms(warm.p50)),
            against: format!("cold {}", ms(cold.p50)),
            ratio: Some(ratio),
            target: TARGET.to_owned(),
            verdict: Verdict::of(ratio <= RATIO_LIMIT && not_warm == 0),
        }],
        notes: vec![format!(
            "warm-create: {} samples each ({agent_name}, warm_pool = {POOL}, pool refilled before \
             each sample), prompt {TURN_TEXT:?}; warm p99 {}, max {}; cold p99 {}, max {}; warm \
             sessions that found no warm runtime: {not_warm}",
            warm.count,
            ms(warm.p99),
            ms(warm.max),
            ms(cold.p99),
            ms(cold.max)
        )],
    })
}
