//! Figure 5: TranslateChannelMessage unary requests per second, held against the bare tonic echo
//! service of this same binary (see `echo.rs`), both as separate server processes on the same
//! kind of runtime, driven by the same client loops over the same number of HTTP/2 connections.
//! Rounds alternate (translate, echo, echo, translate, …) so drifting background load hits both.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, bail};
use tokio::time::Instant;
use tonic::transport::Channel;

use super::{
    Ctx, echo,
    report::{PhaseReport, Row, Usage, Verdict, grouped},
    server::{ServerProcess, connect_pool},
    stats::{median, spread},
};
use agent_harness::pb::v1::{
    self as pb, channel_translator_service_client::ChannelTranslatorServiceClient,
};

pub const FIGURE: &str = "TranslateChannelMessage unary req/s vs bare tonic echo";
const TARGET_RATIO: f64 = 0.80;
pub const BASE_URL: &str = "https://static.example";

/// The request of every call: text, two images and a document (the smoke test's message).
pub fn request() -> pb::TranslateChannelMessageRequest {
    let attachment = |entity_type: &str, entity_id: &str| pb::ChannelAttachment {
        entity_type: entity_type.to_owned(),
        entity_id: entity_id.to_owned(),
    };
    pb::TranslateChannelMessageRequest {
        message: Some(pb::ChannelMessage {
            message_id: "m-1".to_owned(),
            channel_id: "c-1".to_owned(),
            thread_id: "t-1".to_owned(),
            sender_id: "u-1".to_owned(),
            content: "what is wrong here?".to_owned(),
            attachments: vec![
                attachment("static/image", "img-1"),
                attachment("document", "doc-1"),
                attachment("static/image", "img-2"),
            ],
        }),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    Translate,
    Echo,
}

/// `concurrency` loops over `pool` for `duration`; requests completed per second.
async fn load(
    target: Target,
    pool: &[Channel],
    concurrency: usize,
    duration: Duration,
) -> anyhow::Result<f64> {
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + duration;
    let tasks: Vec<_> = (0..concurrency)
        .map(|i| {
            let channel = pool[i % pool.len()].clone();
            let done = done.clone();
            tokio::spawn(async move {
                let mut translator = ChannelTranslatorServiceClient::new(channel.clone());
                while Instant::now() < deadline {
                    match target {
                        Target::Translate => {
                            let reply = translator.translate_channel_message(request()).await?;
                            if reply.get_ref().skipped.len() != 1 {
                                bail!("unexpected translation {:?}", reply.get_ref());
                            }
                        }
                        Target::Echo => {
                            echo::call(channel.clone(), request()).await?;
                        }
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await.context("a load loop panicked")??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<PhaseReport> {
    let plan = &ctx.plan;
    let harness = ServerProcess::serve(
        &ctx.bin,
        "translate",
        &ctx.config_with_base_url(BASE_URL, &[]),
    )
    .await?;
    let echo_server = ServerProcess::echo().await?;
    let harness_pool = connect_pool(harness.addr(), plan.connections).await?;
    let echo_pool = connect_pool(echo_server.addr(), plan.connections).await?;
    let c = plan.translate_concurrency;

    // Warm both (connections, allocator, branch predictors) before anything counts.
    load(Target::Translate, &harness_pool, c, plan.warmup / 2).await?;
    load(Target::Echo, &echo_pool, c, plan.warmup / 2).await?;

    let mut translate_rates = Vec::new();
    let mut echo_rates = Vec::new();
    let mut harness_usage = Usage::default();
    let mut echo_usage = Usage::default();
    let add = |total: &mut Usage, more: Usage| {
        total.wall += more.wall;
        total.server_cpu += more.server_cpu;
        total.bench_cpu += more.bench_cpu;
    };
    for round in 0..plan.translate_rounds.max(1) {
        let order = if round % 2 == 0 {
            [Target::Translate, Target::Echo]
        } else {
            [Target::Echo, Target::Translate]
        };
        for target in order {
            match target {
                Target::Translate => {
                    let before = harness.counters();
                    translate_rates.push(load(target, &harness_pool, c, plan.duration).await?);
                    add(&mut harness_usage, before.until(&harness.counters()));
                }
                Target::Echo => {
                    let before = echo_server.counters();
                    echo_rates.push(load(target, &echo_pool, c, plan.duration).await?);
                    add(&mut echo_usage, before.until(&echo_server.counters()));
                }
            }
        }
    }
    drop(harness_pool);
    drop(echo_pool);
    harness.stop().await?;
    echo_server.stop().await?;

    let translate = median(&translate_rates).expect("at least one round");
    let echo = median(&echo_rates).expect("at least one round");
    let ratio = translate / echo;
    let (t_low, t_high) = spread(&translate_rates).expect("rounds");
    let (e_low, e_high) = spread(&echo_rates).expect("rounds");
    Ok(PhaseReport {
        rows: vec![Row {
            key: "translate",
            figure: FIGURE.to_owned(),
            measured: format!("{} req/s", grouped(translate, 0)),
            against: format!("echo {} req/s", grouped(echo, 0)),
            ratio: Some(ratio),
            target: format!(">= {:.2} of echo", TARGET_RATIO),
            verdict: Verdict::of(ratio >= TARGET_RATIO),
        }],
        notes: vec![
            format!(
                "translate: median of {} rounds of {:.1} s each, {c} concurrent calls over {} \
                 connections; translate {} .. {} req/s, echo {} .. {} req/s",
                translate_rates.len(),
                plan.duration.as_secs_f64(),
                plan.connections,
                grouped(t_low, 0),
                grouped(t_high, 0),
                grouped(e_low, 0),
                grouped(e_high, 0),
            ),
            format!(
                "translate: harness {} per 1,000 calls; echo {} per 1,000 calls",
                cpu_per_thousand(&harness_usage, translate),
                cpu_per_thousand(&echo_usage, echo),
            ),
            format!("translate (harness rounds): {}", harness_usage.describe()),
            format!("translate (echo rounds): {}", echo_usage.describe()),
        ],
    })
}

/// Server CPU per 1,000 calls, from a usage total and the call rate.
fn cpu_per_thousand(usage: &Usage, rate: f64) -> String {
    let calls = rate * usage.wall.as_secs_f64();
    if calls <= 0.0 {
        return "-".to_owned();
    }
    format!(
        "{:.1} ms server CPU",
        usage.server_cpu.as_secs_f64() * 1e3 * 1000.0 / calls
    )
}
