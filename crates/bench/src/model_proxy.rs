//! What the model proxy adds to a model call: the time to the first byte of a streamed answer
//! (Anthropic Messages, `stream: true`) from the scripted fake model server, through the proxy
//! against straight to the fake, over loopback, interleaved in blocks so a change of background
//! load hits both. The proxy is the harness's own code (`agent_harness::model_proxy`), served in
//! this process as the server serves it for a box: the token checked, the key swapped, the
//! answer streamed back and read for its usage, the call handed to a meter.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use agent_harness::model_proxy::{
    self, BoxProxy, Limits, Meter, ModelCall, Provider, TokenKey, Upstream, UpstreamClient,
};
use agent_harness_model_fakes::{Api as FakeApi, FakeServer};
use anyhow::Context;
use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;

use super::{
    report::{PhaseReport, Row, Verdict, ms},
    stats::Summary,
};

pub const FIGURE: &str =
    "first byte of a streamed model answer, through the model proxy vs straight to the model";
pub const TARGET: &str = "adds <= 1.000 ms";
const LIMIT: Duration = Duration::from_millis(1);
const BLOCKS: usize = 4;

/// A meter as cheap as the server's is not: it admits at once and keeps the calls, so the
/// figure holds the proxy's own work (the budget check's store read is the server's to add).
#[derive(Clone, Default)]
struct Kept(Arc<Mutex<Vec<ModelCall>>>);

impl Meter for Kept {
    fn admit(&self, _session: uuid::Uuid) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }

    fn record(&self, call: ModelCall) {
        self.0.lock().expect("not poisoned").push(call);
    }
}

type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

/// One streamed call: the time until the first byte of the answer's body.
async fn first_byte(client: &Client, url: &str, key: &str) -> anyhow::Result<Duration> {
    let body = serde_json::json!({
        "model": "claude-bench",
        "max_tokens": 64,
        "stream": true,
        "messages": [{"role": "user", "content": "bench"}],
    });
    let request = http::Request::post(url)
        .header("x-api-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))?;
    let start = Instant::now();
    let response = client.request(request).await.context("the call")?;
    anyhow::ensure!(response.status() == 200, "status {}", response.status());
    let mut body = response.into_body();
    let took = loop {
        match body.frame().await {
            Some(frame) => {
                if frame?.data_ref().is_some_and(|d| !d.is_empty()) {
                    break start.elapsed();
                }
            }
            None => anyhow::bail!("the answer ended before its first byte"),
        }
    };
    // The rest is read, so the connection goes back to the pool.
    while let Some(frame) = body.frame().await {
        frame?;
    }
    Ok(took)
}

pub async fn run(smoke: bool, samples: usize) -> anyhow::Result<PhaseReport> {
    let fake = FakeServer::start(FakeApi::Anthropic).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let origin = format!("http://{}", listener.local_addr()?);
    let tokens = Arc::new(TokenKey::random());
    let session = uuid::Uuid::now_v7();
    let kept = Kept::default();
    let proxy = Arc::new(BoxProxy {
        session,
        profile: "bench".into(),
        upstreams: BTreeMap::from([(
            Provider::Anthropic,
            Upstream {
                base: fake.base_url().parse()?,
                key: "bench-real-key".into(),
            },
        )]),
        tokens: tokens.clone(),
        meter: Arc::new(kept.clone()),
        client: UpstreamClient::new()?,
        limits: Limits::default(),
    });
    let task = model_proxy::serve(listener, proxy);
    let token = tokens.token(session);
    // As agents' HTTP clients do, with TCP_NODELAY.
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(connector);
    let direct = format!("{}/v1/messages", fake.base_url());
    let proxied = format!("{}/v1/messages", Provider::Anthropic.base_url(&origin));

    let samples = if smoke { 20 } else { samples.max(400) };
    let per_block = samples.div_ceil(BLOCKS).max(1);
    let (mut through, mut straight) = (Vec::new(), Vec::new());
    // The first round warms both up (connections, the proxy's pool) and is not counted.
    for round in 0..=BLOCKS {
        for _ in 0..per_block {
            let took = first_byte(&client, &proxied, &token).await?;
            if round > 0 {
                through.push(took);
            }
        }
        for _ in 0..per_block {
            let took = first_byte(&client, &direct, "bench-real-key").await?;
            if round > 0 {
                straight.push(took);
            }
        }
    }
    task.abort();
    let calls = kept.0.lock().expect("not poisoned").len();
    let metered = kept
        .0
        .lock()
        .expect("not poisoned")
        .iter()
        .filter(|c| c.usage.as_ref().is_some_and(|u| u.input_tokens > 0))
        .count();
    let through = Summary::of(&mut through).context("calls were timed")?;
    let straight = Summary::of(&mut straight).context("calls were timed")?;
    let added = through.p50.saturating_sub(straight.p50);
    Ok(PhaseReport {
        rows: vec![Row {
            key: "model-proxy-first-byte",
            figure: format!("{FIGURE}, p50"),
            measured: format!("{} (the proxy adds {})", ms(through.p50), ms(added)),
            against: format!("straight {}", ms(straight.p50)),
            ratio: Some(through.p50.as_secs_f64() / straight.p50.as_secs_f64().max(1e-9)),
            target: TARGET.into(),
            verdict: Verdict::of(added <= LIMIT),
        }],
        notes: vec![format!(
            "model-proxy: {} streamed Anthropic Messages calls each way to the scripted fake, in \
             {BLOCKS} interleaved blocks after a warm-up, one keep-alive client; p99 through {}, \
             straight {}; {calls} calls reached the proxy's meter, {metered} with usage read \
             from the answer",
            through.count,
            ms(through.p99),
            ms(straight.p99),
        )],
    })
}
