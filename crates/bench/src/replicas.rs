//! The scale-out figures (docs/benchmarks.md, second wave), on the PostgreSQL database named by
//! `--database-url` (env `AGENT_HARNESS_BENCH_DATABASE_URL`), in a scratch schema dropped after:
//!
//! - sustained turns/s with the PostgreSQL store, held against the SQLite store measured in
//!   this same phase with the same sessions, connections and durations;
//! - cross-replica Subscribe lag: a session owned by replica A, one LOG subscriber on A and one
//!   on B; each turn is a prompt to A, and the figure is how much later B's subscriber sees the
//!   runtime's response than A's (the append on A, woken on B by NOTIFY and read from the table).
//!
//! Without a database URL both rows are SKIPPED with a note saying how to get them.

use std::time::Duration;

use anyhow::Context;
use tokio::time::Instant;

use super::{
    Ctx,
    client::{self, LogStream},
    report::{PhaseReport, Row, Verdict, ms},
    rtt::TURN_TEXT,
    server::{ServerProcess, connect},
    stats::Summary,
    turns,
};

pub const TURNS_FIGURE: &str = "sustained turns/s, PostgreSQL store";
pub const LAG_FIGURE: &str = "cross-replica Subscribe lag (subscriber on another replica)";
pub const TURNS_TARGET: &str = ">= 0.50 of SQLite";
pub const LAG_TARGET: &str = "p99 <= 50.000 ms";
const TURNS_RATIO: f64 = 0.5;
const LAG_LIMIT: Duration = Duration::from_millis(50);
/// Where the URL comes from when not given as a flag.
pub const DATABASE_ENV: &str = "AGENT_HARNESS_BENCH_DATABASE_URL";

pub async fn run(ctx: &Ctx) -> anyhow::Result<PhaseReport> {
    let Some(url) = ctx.database_url.as_deref() else {
        return Ok(skipped());
    };
    let schema = format!(
        "ah_bench_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis()
    );
    execute(url, &format!("CREATE SCHEMA {schema}")).await?;
    let separator = if url.contains('?') { '&' } else { '?' };
    let in_schema = format!("{url}{separator}options=-c%20search_path%3D{schema}");
    let measured = measure(ctx, &in_schema).await;
    // The schema goes even when a measurement failed.
    let dropped = execute(url, &format!("DROP SCHEMA {schema} CASCADE")).await;
    let report = measured?;
    dropped?;
    Ok(report)
}

async fn measure(ctx: &Ctx, database_url: &str) -> anyhow::Result<PhaseReport> {
    let database = format!("database_url = {database_url:?}\n");
    let sqlite = turns::sustained(ctx, "turns-sqlite", "").await?;
    let postgres = turns::sustained(ctx, "turns-pg", &database).await?;
    let ratio = postgres.rate / sqlite.rate;
    let n = ctx.plan.sessions;
    let mut notes = sqlite.notes("turns-pg (SQLite baseline)", ctx);
    notes.extend(postgres.notes("turns-pg", ctx));

    // The sessions of the turns run stay in the schema and count toward the caller's cap.
    let lag_config = format!(
        "{database}{}",
        ctx.config(&[("sessions_per_principal", n + 16)])
    );
    let (same, cross, behind) = lag(ctx, &lag_config).await?;
    notes.push(format!(
        "replica-lag: {} turns on a session owned by replica A; response seen by a subscriber \
         on A p50 {} p99 {}, on B p50 {} p99 {}; B behind A p50 {} p99 {} max {}",
        behind.count,
        ms(same.p50),
        ms(same.p99),
        ms(cross.p50),
        ms(cross.p99),
        ms(behind.p50),
        ms(behind.p99),
        ms(behind.max),
    ));
    Ok(PhaseReport {
        rows: vec![
            Row {
                key: "turns-pg",
                figure: format!("{TURNS_FIGURE}, {n} sessions"),
                measured: format!("{:.0} turns/s", postgres.rate),
                against: format!("SQLite {:.0} turns/s", sqlite.rate),
                ratio: Some(ratio),
                target: TURNS_TARGET.to_owned(),
                verdict: Verdict::of(ratio >= TURNS_RATIO),
            },
            Row {
                key: "replica-lag",
                figure: LAG_FIGURE.to_owned(),
                measured: format!("p99 {} behind", ms(behind.p99)),
                against: format!("same-replica p99 {}", ms(same.p99)),
                ratio: None,
                target: LAG_TARGET.to_owned(),
                verdict: Verdict::of(behind.p99 <= LAG_LIMIT),
            },
        ],
        notes,
    })
}

/// Turns one after another on a session owned by A, watched on A and on B: the latency from
/// the prompt to the response on each, and how far B is behind A.
async fn lag(ctx: &Ctx, config: &str) -> anyhow::Result<(Summary, Summary, Summary)> {
    let a = ServerProcess::serve(&ctx.bin, "replica-a", config).await?;
    let b = ServerProcess::serve(&ctx.bin, "replica-b", config).await?;
    let (on_a, on_b) = (connect(a.addr()).await?, connect(b.addr()).await?);
    let (session_id, head) = client::create_session(&on_a, &a.workspace()).await?;
    let mut watch_a = LogStream::open(&on_a, &session_id, head).await?;
    let mut watch_b = LogStream::open(&on_b, &session_id, head).await?;
    let mut control = client::sessions(&on_a);
    let turns = ctx.plan.rtt_turns.min(500);
    let (mut same, mut cross, mut behind) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..turns + ctx.plan.rtt_warmup {
        let start = Instant::now();
        let action_id = client::prompt(&mut control, &session_id, TURN_TEXT).await?;
        let (seen_a, seen_b) = tokio::join!(
            async {
                watch_a.response_to(&action_id).await?;
                anyhow::Ok(Instant::now())
            },
            async {
                watch_b.response_to(&action_id).await?;
                anyhow::Ok(Instant::now())
            },
        );
        let (seen_a, seen_b) = (seen_a?, seen_b?);
        if i >= ctx.plan.rtt_warmup {
            same.push(seen_a - start);
            cross.push(seen_b - start);
            behind.push(seen_b.saturating_duration_since(seen_a));
        }
    }
    drop((watch_a, watch_b, control, on_a, on_b));
    b.stop().await?;
    a.stop().await?;
    let summary = |samples: &mut Vec<Duration>| Summary::of(samples).context("no turns measured");
    Ok((
        summary(&mut same)?,
        summary(&mut cross)?,
        summary(&mut behind)?,
    ))
}

fn skipped() -> PhaseReport {
    let row = |key, figure: &str, target: &str| Row {
        key,
        figure: figure.to_owned(),
        measured: "not measured".to_owned(),
        against: "-".to_owned(),
        ratio: None,
        target: target.to_owned(),
        verdict: Verdict::Skipped,
    };
    PhaseReport {
        rows: vec![
            row("turns-pg", TURNS_FIGURE, TURNS_TARGET),
            row("replica-lag", LAG_FIGURE, LAG_TARGET),
        ],
        notes: vec![format!(
            "turns-pg, replica-lag: SKIPPED, no PostgreSQL database: pass --database-url \
             postgres://… (or set {DATABASE_ENV}) to measure them"
        )],
    }
}

async fn execute(url: &str, sql: &str) -> anyhow::Result<()> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .context("connecting to the benchmark database")?;
    let connection = tokio::spawn(connection);
    client.batch_execute(sql).await.context(sql.to_owned())?;
    drop(client);
    let _ = connection.await;
    Ok(())
}
