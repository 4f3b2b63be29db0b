//! What idle costs the database (docs/benchmarks.md, "Idle cost"), on the PostgreSQL server named
//! by `--database-url`, in a database of its own created for the run and dropped after — the
//! figures are the database's own transaction counters (`pg_stat_database`), which count every
//! client of one database, so nothing else may work in it meanwhile:
//!
//! - `idle-db`: three replicas restarted over N idle sessions (nobody owns them, no runtime
//!   runs), their database's transactions/s with the larger N held against the smaller, in the
//!   same run. Idle should cost the same however many sessions sit there (ratio ≤ 1.2).
//! - `idle-subscribers`: then 50 sessions owned by replica A and one LOG subscriber each on
//!   replica B, which reads them from the database: the transactions/s they add, in all (< 10).
//!
//! Every statement the harness sends outside a transaction block is a transaction of its own, so
//! transactions/s is statements/s or fewer (`pg_stat_statements` need not be installed).
//! The sessions beyond the first are copies of one created through the API (rows as the store
//! writes them, log included, leases left as a stopped replica leaves them): creating thousands
//! through the API would start a runtime for each.
//!
//! Without a database URL both rows are SKIPPED with a note.

use std::time::Duration;

use anyhow::Context;
use tokio_postgres::{Client, NoTls};

use super::{
    Ctx,
    client::{self, LogStream},
    report::{PhaseReport, Row, Verdict, grouped},
    rtt::TURN_TEXT,
    server::{ServerProcess, connect},
};

pub const DB_FIGURE: &str = "PostgreSQL transactions/s, idle sessions on 3 replicas";
pub const DB_TARGET: &str = "<= 1.20 of the smaller count";
pub const SUBSCRIBERS_FIGURE: &str =
    "PostgreSQL transactions/s added by idle LOG subscribers on a non-owner replica";
pub const SUBSCRIBERS_TARGET: &str = "< 10 /s in all";
const RATIO_LIMIT: f64 = 1.2;
const ADDED_LIMIT: f64 = 10.0;

/// The sizes of one run.
struct Sizes {
    fewer: usize,
    more: usize,
    subscribers: usize,
    /// From the replicas serving (or the subscribers opening) to the first sample: past their
    /// start-up work and a first safety poll, and past the 10 s for which an idle PostgreSQL
    /// backend may hold back counts it has not reported yet.
    settle: Duration,
    window: Duration,
}

impl Sizes {
    fn of(ctx: &Ctx, smoke: bool) -> Self {
        if smoke {
            Self {
                fewer: 10,
                more: 100,
                subscribers: 3,
                settle: Duration::from_millis(500),
                window: ctx.plan.duration,
            }
        } else {
            Self {
                fewer: 200,
                more: 2000,
                subscribers: 50,
                settle: Duration::from_secs(12),
                window: ctx.plan.duration,
            }
        }
    }
}

pub async fn run(ctx: &Ctx, smoke: bool) -> anyhow::Result<PhaseReport> {
    let Some(url) = ctx.database_url.as_deref() else {
        return Ok(skipped());
    };
    let database = format!(
        "idle_bench_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis()
    );
    let admin = Admin::connect(url).await?;
    admin
        .execute(&format!("CREATE DATABASE {database}"))
        .await?;
    let separator = if url.contains('?') { '&' } else { '?' };
    let own_url = format!("{url}{separator}dbname={database}");
    let measured = measure(ctx, &Sizes::of(ctx, smoke), &admin, &database, &own_url).await;
    // The database goes even when a measurement failed.
    let dropped = admin
        .execute(&format!("DROP DATABASE {database} WITH (FORCE)"))
        .await;
    let report = measured?;
    dropped?;
    Ok(report)
}

/// A connection: to the database the URL names, for the statistics of the measured one (so
/// sampling them counts nowhere measured), or to the measured one, to copy sessions in.
struct Admin {
    client: Client,
    connection: tokio::task::JoinHandle<()>,
}

impl Admin {
    async fn connect(url: &str) -> anyhow::Result<Self> {
        let (client, connection) = tokio_postgres::connect(url, NoTls)
            .await
            .context("connecting to the benchmark database server")?;
        let connection = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Self { client, connection })
    }

    /// Ends the session and waits for the connection to close.
    async fn close(self) {
        drop(self.client);
        let _ = self.connection.await;
    }

    async fn execute(&self, sql: &str) -> anyhow::Result<()> {
        self.client
            .batch_execute(sql)
            .await
            .with_context(|| sql.to_owned())
    }

    /// The transactions committed and rolled back in `database` so far.
    async fn transactions(&self, database: &str) -> anyhow::Result<i64> {
        let row = self
            .client
            .query_one(
                "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database \
                 WHERE datname = $1",
                &[&database],
            )
            .await
            .context("reading pg_stat_database")?;
        Ok(row.get(0))
    }

    /// `database`'s transactions per second over `window`.
    async fn rate(&self, database: &str, window: Duration) -> anyhow::Result<f64> {
        let before = self.transactions(database).await?;
        let start = tokio::time::Instant::now();
        tokio::time::sleep(window).await;
        let after = self.transactions(database).await?;
        Ok((after - before) as f64 / start.elapsed().as_secs_f64())
    }
}

async fn measure(
    ctx: &Ctx,
    sizes: &Sizes,
    admin: &Admin,
    database: &str,
    url: &str,
) -> anyhow::Result<PhaseReport> {
    let config = format!(
        "database_url = {url:?}\n{}",
        ctx.config(&[(
            "sessions_per_principal",
            sizes.more + sizes.subscribers + 16
        )])
    );
    let template = seed(ctx, &config).await?;

    copy_to(url, &template, sizes.fewer).await?;
    let replicas = Replicas::start(ctx, &config).await?;
    tokio::time::sleep(sizes.settle).await;
    let fewer = admin.rate(database, sizes.window).await;
    replicas.stop().await?;
    let fewer = fewer?;

    copy_to(url, &template, sizes.more).await?;
    let replicas = Replicas::start(ctx, &config).await?;
    tokio::time::sleep(sizes.settle).await;
    let measured = async {
        let more = admin.rate(database, sizes.window).await?;
        let (base, with) = subscribers(sizes, admin, database, &replicas).await?;
        anyhow::Ok((more, base, with))
    }
    .await;
    replicas.stop().await?;
    let (more, base, with) = measured?;
    Ok(report(sizes, fewer, more, base, with))
}

/// Creates one session through the API with a turn in its log, on a replica that then stops
/// (leaving what a stopped replica leaves); its id.
async fn seed(ctx: &Ctx, config: &str) -> anyhow::Result<String> {
    let server = ServerProcess::serve(&ctx.bin, "idle-seed", config).await?;
    let channel = connect(server.addr()).await?;
    let (session_id, head) = client::create_session(&channel, &server.workspace()).await?;
    let mut watch = LogStream::open(&channel, &session_id, head).await?;
    let action_id = client::prompt(&mut client::sessions(&channel), &session_id, TURN_TEXT).await?;
    watch.turn_ended(&action_id).await?;
    drop((watch, channel));
    server.stop().await?;
    Ok(session_id)
}

/// Copies the template session (its row, log and lease) until there are `n` sessions, then
/// vacuums and analyses the tables written, so autovacuum has nothing to do in the measured
/// windows. Through a connection of its own, closed after: a backend that exits reports its
/// counts at once (an idle one may hold them back for 10 s, into a window).
async fn copy_to(url: &str, template: &str, n: usize) -> anyhow::Result<()> {
    let direct = Admin::connect(url).await?;
    let count: i64 = direct
        .client
        .query_one("SELECT count(*) FROM sessions", &[])
        .await?
        .get(0);
    let missing = (n as i64 - count).max(0);
    direct
        .client
        .execute(COPY_SQL, &[&template, &missing])
        .await
        .context("copying sessions")?;
    direct
        .execute("VACUUM (ANALYZE) sessions, log, leases")
        .await?;
    direct.close().await;
    Ok(())
}

/// Copies of one session: new ids, the same record a moment apart, its log, and a released lease.
const COPY_SQL: &str = "WITH src AS (SELECT * FROM sessions WHERE id = $1::text::uuid), \
     copies AS ( \
         INSERT INTO sessions (id, name, owner, profile, cwd, model, acp_session_id, status, \
             status_reason, created_at, updated_at, profile_fingerprint, request_fingerprint, \
             can_resume, can_load) \
         SELECT gen_random_uuid(), name, owner, profile, cwd, model, acp_session_id, status, \
             status_reason, created_at + g, updated_at, profile_fingerprint, \
             request_fingerprint, can_resume, can_load \
         FROM src, generate_series(1, $2::bigint) g \
         RETURNING pk, id), \
     logs AS ( \
         INSERT INTO log (session_pk, \"offset\", direction, actor, action_id, epoch, \
             created_at, json) \
         SELECT c.pk, l.\"offset\", l.direction, l.actor, l.action_id, l.epoch, l.created_at, \
             l.json \
         FROM copies c, log l WHERE l.session_pk = (SELECT pk FROM src)) \
     INSERT INTO leases (session_id, owner_replica, fence, expires_at) \
     SELECT c.id, l.owner_replica, l.fence, l.expires_at \
     FROM copies c, leases l WHERE l.session_id = $1::text::uuid";

/// Three replicas of one database.
struct Replicas([ServerProcess; 3]);

impl Replicas {
    async fn start(ctx: &Ctx, config: &str) -> anyhow::Result<Self> {
        let (a, b, c) = tokio::try_join!(
            ServerProcess::serve(&ctx.bin, "idle-a", config),
            ServerProcess::serve(&ctx.bin, "idle-b", config),
            ServerProcess::serve(&ctx.bin, "idle-c", config),
        )?;
        Ok(Self([a, b, c]))
    }

    async fn stop(self) -> anyhow::Result<()> {
        let [a, b, c] = self.0;
        let (a, b, c) = tokio::join!(a.stop(), b.stop(), c.stop());
        a.and(b).and(c)
    }
}

/// Sessions owned by replica A, idle with their runtimes up, then one LOG subscriber each on
/// replica B: the transactions/s before and with the subscribers.
async fn subscribers(
    sizes: &Sizes,
    admin: &Admin,
    database: &str,
    replicas: &Replicas,
) -> anyhow::Result<(f64, f64)> {
    let [a, b, _] = &replicas.0;
    let on_a = connect(a.addr()).await?;
    let mut sessions = Vec::with_capacity(sizes.subscribers);
    for _ in 0..sizes.subscribers {
        sessions.push(client::create_session(&on_a, &a.workspace()).await?);
    }
    tokio::time::sleep(sizes.settle).await;
    let base = admin.rate(database, sizes.window).await?;
    let on_b = connect(b.addr()).await?;
    let mut streams = Vec::with_capacity(sessions.len());
    for (session_id, head) in &sessions {
        streams.push(LogStream::open(&on_b, session_id, *head).await?);
    }
    tokio::time::sleep(sizes.settle).await;
    let with = admin.rate(database, sizes.window).await?;
    drop(streams);
    Ok((base, with))
}

fn report(sizes: &Sizes, fewer: f64, more: f64, base: f64, with: f64) -> PhaseReport {
    // No ratio of nothing (a smoke run's windows are too short to see a transaction).
    let ratio = (fewer > 0.0).then(|| more / fewer);
    let added = with - base;
    PhaseReport {
        rows: vec![
            Row {
                key: "idle-db",
                figure: DB_FIGURE.to_owned(),
                measured: format!(
                    "{} idle: {} /s",
                    grouped(sizes.more as f64, 0),
                    grouped(more, 1)
                ),
                against: format!(
                    "{} idle: {} /s",
                    grouped(sizes.fewer as f64, 0),
                    grouped(fewer, 1)
                ),
                ratio,
                target: DB_TARGET.to_owned(),
                verdict: Verdict::of(more <= fewer * RATIO_LIMIT),
            },
            Row {
                key: "idle-subscribers",
                figure: SUBSCRIBERS_FIGURE.to_owned(),
                measured: format!(
                    "{} subscribers: +{} /s ({} /s each)",
                    sizes.subscribers,
                    grouped(added, 2),
                    grouped(added / sizes.subscribers as f64, 3)
                ),
                against: format!("without them {} /s", grouped(base, 1)),
                ratio: None,
                target: SUBSCRIBERS_TARGET.to_owned(),
                verdict: Verdict::of(added < ADDED_LIMIT),
            },
        ],
        notes: vec![format!(
            "idle-db, idle-subscribers: transactions/s of a database of their own \
             (pg_stat_database xact_commit + xact_rollback) over {:.1} s windows, {:.1} s after \
             the replicas served; with the subscribers, {} sessions owned by replica A (runtimes \
             up) and one LOG stream each on replica B; {} /s with them, {} /s before",
            sizes.window.as_secs_f64(),
            sizes.settle.as_secs_f64(),
            sizes.subscribers,
            grouped(with, 1),
            grouped(base, 1),
        )],
    }
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
            row("idle-db", DB_FIGURE, DB_TARGET),
            row("idle-subscribers", SUBSCRIBERS_FIGURE, SUBSCRIBERS_TARGET),
        ],
        notes: vec![format!(
            "idle-db, idle-subscribers: SKIPPED, no PostgreSQL database: pass --database-url \
             postgres://… (or set {}) to measure them",
            super::replicas::DATABASE_ENV
        )],
    }
}
