//! The PostgreSQL store: several replicas on one database.
//!
//! - **Connections**: a `deadpool-postgres` pool of `tokio-postgres` clients, each with its
//!   prepared statements cached. Chosen over `sqlx` by a measured append of 8-entry batches on
//!   the local server: equal or better (about 2,200–3,100 batches/s with 16 writers against
//!   2,100–2,900 for sqlx, the same within noise for one writer), with far fewer dependencies,
//!   and its request pipelining is what `postgres/commit.rs` builds on.
//! - **Commits**: the batches committed at one moment share one transaction (group commit, see
//!   `postgres/group.rs`), so one WAL flush serves many. It locks each session's row, so commits
//!   of one session are serialised even from two replicas and the head read inside stays the
//!   head; with a fence it also share-locks the lease row, so a claim by another replica waits
//!   for it or fences it off — never both. The batches' statements are pipelined (see
//!   `postgres/commit.rs`); a refused batch gets its own error and the others still commit.
//!   Durable on return (`COMMIT` waits for the WAL flush). Other replicas learn of it from a
//!   notification sent after the commit, coalesced with others (see `postgres/notify.rs`).
//! - **Schema**: embedded, versioned, applied at start under an advisory lock (see
//!   `postgres/schema.rs`). The tables live in the connection's `search_path`, so a URL or
//!   [`PostgresOptions::schema`] can place them in a schema of their own (tests use one each).
//! - **TLS**: rustls, set by the URL's `sslmode` and `sslrootcert` as libpq reads them (see
//!   `postgres/tls.rs`).
//! - **Errors**: a lost, refused or timed-out connection is [`StoreError::Unavailable`]
//!   (STORE_UNAVAILABLE, retryable); an error the server answered with is
//!   [`StoreError::Postgres`].

mod commit;
mod group;
mod notify;
mod rows;
mod schema;
mod tls;

#[cfg(test)]
pub(crate) mod tests;

use std::{str::FromStr, time::Duration};

use async_trait::async_trait;
use deadpool_postgres::{Client, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::{NoTls, config::Host, types::ToSql};
use uuid::Uuid;

use crate::store::CommitError;

use super::{
    ActionRecord, Batch, BridgeAd, CappedCreate, ChangeMark, Lease, LeaseClaim, LogEntry,
    SessionQuery, Store, StoreError, UsageQuery, UsageRow, to_micros,
};
use crate::domain::{
    ActionId, Error, ErrorCode, Result,
    queue::QueuedEntry,
    session::{SessionRecord, SessionStatus},
};

/// Connections kept open by one store, unless the options say otherwise.
pub const DEFAULT_POOL_SIZE: usize = 16;
/// How long opening one connection's socket may take (a URL's `connect_timeout` wins).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a new connection may take to be ready, its startup and authentication included: a
/// server that accepts but never answers must not hold a caller forever.
const CREATE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a caller waits for a connection at most — a free one, or a new one opened — the
/// statement timeout when shorter.
const POOL_WAIT: Duration = Duration::from_secs(10);
/// How long after the statement timeout a call still waits for its answer: the server cancels
/// a statement at its timeout and says so, so a call with no answer by then is on a connection
/// that is gone (a partition, a black-holed route) and is given up.
const ANSWER_GRACE: Duration = Duration::from_secs(2);
/// TCP keepalive on every connection (a URL's own `keepalives_*` win): an idle connection whose
/// peer is gone errors within about idle + interval × retries, instead of hours later.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
const KEEPALIVE_RETRIES: u32 = 3;
/// `TCP_USER_TIMEOUT` (Linux; a URL's `tcp_user_timeout` wins): a connection whose sent data
/// stays unacknowledged this long errors.
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(10);
/// What `tokio-postgres` uses when a URL sets no `keepalives_idle`.
const DEFAULT_KEEPALIVE_IDLE: Duration = Duration::from_secs(2 * 60 * 60);
pub use super::DEFAULT_STATEMENT_TIMEOUT;
/// SQLSTATE of a statement cancelled by the server: its statement timeout, or a cancel request.
const QUERY_CANCELED: &str = "57014";

/// How to reach the database.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// `postgres://user[:password]@host[:port]/database[?param=value…]`.
    pub url: String,
    /// A schema to keep the tables in (it must exist), instead of the URL's `search_path`.
    pub schema: Option<String>,
    pub pool_size: usize,
    /// The server cancels any statement running longer (`statement_timeout` on every
    /// connection), so no query outlives its purpose by much. A URL that sets
    /// `statement_timeout` itself keeps its own.
    pub statement_timeout: Duration,
}

impl PostgresOptions {
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            schema: None,
            pool_size: DEFAULT_POOL_SIZE,
            statement_timeout: DEFAULT_STATEMENT_TIMEOUT,
        }
    }
}

/// The PostgreSQL [`Store`].
pub struct PostgresStore {
    pool: Pool,
    /// The connection settings, for the listening connection (see `postgres/notify.rs`).
    config: tokio_postgres::Config,
    /// Started on the first subscriber that needs it.
    wakes: std::sync::OnceLock<std::sync::Arc<tokio::sync::broadcast::Sender<super::Wake>>>,
    /// `host:port/database as user`, for messages (never the password).
    target: String,
    /// TLS for the listening connection too; `None`: plain text.
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    /// Tells the other replicas what this one committed.
    notifier: notify::Notifier,
    /// Gathers concurrent commits into shared transactions.
    committer: group::Committer,
    /// Fair shares of the connections for list scans.
    lists: super::gate::ListGate,
    /// How long a call waits for its answers once it has a connection: the statement timeout
    /// and [`ANSWER_GRACE`].
    answer_within: Duration,
    /// How long a call waits for a connection.
    pool_wait: Duration,
}

/// Turns a database error into a store error saying what the store was doing.
pub(super) trait Context<T> {
    fn context(self, doing: &str) -> Result<T>;
}

impl<T> Context<T> for Result<T, tokio_postgres::Error> {
    fn context(self, doing: &str) -> Result<T> {
        self.map_err(|e| from_postgres(&format!("postgres store: {doing}"), e).into())
    }
}

/// A database error as a store error: unavailable when the database could not be reached.
fn from_postgres(doing: &str, e: tokio_postgres::Error) -> StoreError {
    if is_cancelled(&e) {
        // Not the caller's fault and nothing was stored: the statement ran past the statement
        // timeout (a slow or locked database) or was cancelled.
        return StoreError::unavailable(
            format!("{doing}: the database did not answer in time (statement cancelled)"),
            e,
        );
    }
    if is_unreachable(&e) {
        StoreError::unavailable(
            format!("{doing}: the database is unreachable: {}", describe(&e)),
            e,
        )
    } else {
        StoreError::Postgres {
            message: format!("{doing}: {}", describe(&e)),
            source: e,
        }
    }
}

/// Whether the server cancelled the statement: the statement timeout, or a cancel request.
pub(super) fn is_cancelled(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|code| code.code() == QUERY_CANCELED)
}

/// Whether an error means the database could not be reached (the connection was refused, lost
/// or timed out, or the server is shutting down or full) rather than that it refused a
/// statement. Only the former is worth a retry.
pub(super) fn is_unreachable(e: &tokio_postgres::Error) -> bool {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        // Class 08: connection exception; 57P01-3: shutting down, crashed, starting;
        // 53300: too many connections.
        return code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "53300");
    }
    if e.is_closed() {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            // A TLS failure (a certificate that does not verify) travels as an I/O error, but
            // waiting will not fix it.
            return !io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>());
        }
        source = cause.source();
    }
    false
}

/// Whether an error the server answered with is the database's own state rather than a fault of
/// the caller or of the harness, so the same request may succeed later: class 53 (disk full, out
/// of memory, too many connections), 25006 (a read-only transaction: a standby, or
/// `default_transaction_read_only`), 40 (serialization failure, deadlock), 55 (a lock not
/// available), 57 (shutting down, cancelled), 58 (I/O), 42501 (a privilege revoked), and P0 (a
/// trigger or function of the operator's that raised).
pub(super) fn is_operational(e: &tokio_postgres::Error) -> bool {
    let Some(db) = e.as_db_error() else {
        return false;
    };
    let code = db.code().code();
    ["53", "40", "55", "57", "58", "P0"]
        .iter()
        .any(|class| code.starts_with(class))
        || matches!(code, "25006" | "42501")
}

/// A connection from the pool within `within`, whether it waits for a free one or opens one.
pub(super) async fn pooled(
    pool: &Pool,
    within: Duration,
) -> Result<Client, deadpool_postgres::PoolError> {
    match tokio::time::timeout(within, pool.get()).await {
        Ok(got) => got,
        Err(_) => Err(deadpool_postgres::PoolError::Timeout(
            deadpool_postgres::TimeoutType::Wait,
        )),
    }
}

/// A pool error as a store error: no connection in time, or none could be opened.
fn from_pool(doing: &str, e: deadpool_postgres::PoolError) -> StoreError {
    use deadpool_postgres::PoolError;
    match e {
        PoolError::Backend(e) => from_postgres(doing, e),
        PoolError::Closed => StoreError::closed(format!("{doing}: the store is closed")),
        other => StoreError::unavailable(format!("{doing}: {other}"), other),
    }
}

/// A `tokio-postgres` error with the server's message and SQLSTATE when there is one (its own
/// `Display` says only "db error").
pub(super) fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} ({})", db.message(), db.code().code());
    }
    match std::error::Error::source(e) {
        Some(source) => format!("{e}: {source}"),
        None => e.to_string(),
    }
}

/// Where a parsed URL points, for messages: hosts, ports, database and user, no password.
fn target_of(config: &tokio_postgres::Config) -> String {
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match host {
                Host::Tcp(name) => format!("{name}:{port}"),
                #[cfg(unix)]
                Host::Unix(path) => format!("{}:{port}", path.display()),
            }
        })
        .collect();
    let hosts = if hosts.is_empty() {
        "localhost:5432".to_owned()
    } else {
        hosts.join(",")
    };
    let user = config.get_user().unwrap_or("(default user)");
    let database = config.get_dbname().unwrap_or(user);
    format!("{hosts}/{database} as {user}")
}

/// Gives every connection deadlines of its own, unless the URL set them: opening one, and
/// noticing that its peer vanished (a partition drops packets and closes nothing) — an idle
/// connection by TCP keepalive, a busy one by `TCP_USER_TIMEOUT` — so it errors instead of
/// waiting forever.
fn bound_connections(config: &mut tokio_postgres::Config) {
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_keepalives() && config.get_keepalives_idle() == DEFAULT_KEEPALIVE_IDLE {
        config.keepalives_idle(KEEPALIVE_IDLE);
    }
    if config.get_keepalives_interval().is_none() {
        config.keepalives_interval(KEEPALIVE_INTERVAL);
    }
    if config.get_keepalives_retries().is_none() {
        config.keepalives_retries(KEEPALIVE_RETRIES);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
}

/// A schema name we put into a connection option unquoted: plain identifiers only.
fn valid_schema_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && name.len() <= 63
}

impl PostgresStore {
    /// Connects, checks the database answers and brings the schema up to date. Fails with a
    /// message naming the host, database and user (never the password).
    pub async fn connect(options: PostgresOptions) -> Result<Self> {
        let (url, tls) = tls::split_url(&options.url)?;
        // The URL's own parse errors never quote it, so a password cannot leak through them.
        let mut config =
            tokio_postgres::Config::from_str(&url).map_err(|e| StoreError::Config {
                message: format!("postgres store: the database URL is invalid: {e}"),
                source: Some(e.into()),
            })?;
        let target = target_of(&config);
        let tls = tls::connector(&tls).map_err(|e| match e {
            StoreError::Config { message, source } => StoreError::Config {
                message: format!("{message} (database {target})"),
                source,
            },
            other => other,
        })?;
        if let Some(schema) = &options.schema {
            if !valid_schema_name(schema) {
                return Err(StoreError::config(format!(
                    "postgres store: the schema name {schema:?} is not a plain lower-case identifier"
                ))
                .into());
            }
            let mut connection_options = config.get_options().unwrap_or_default().to_owned();
            connection_options.push_str(&format!(" -c search_path={schema}"));
            config.options(connection_options.trim_start());
        }
        // A replica paused mid-transaction (SIGSTOP, a stalled VM) would hold its lease row's
        // lock and block the takeover of its sessions for as long as it stays paused: the server
        // ends such a transaction instead (it was never acknowledged), so failover proceeds.
        let connection_options = config.get_options().unwrap_or_default().to_owned();
        if !connection_options.contains("idle_in_transaction_session_timeout") {
            config.options(
                format!("{connection_options} -c idle_in_transaction_session_timeout=5000")
                    .trim_start(),
            );
        }
        // Every statement has a deadline on the server itself, whatever the
        // client does: a query that runs too long is cancelled there, and its connection is
        // free again.
        let connection_options = config.get_options().unwrap_or_default().to_owned();
        if !connection_options.contains("statement_timeout") {
            let millis = options
                .statement_timeout
                .as_millis()
                .clamp(1, i32::MAX as u128);
            config.options(
                format!("{connection_options} -c statement_timeout={millis}").trim_start(),
            );
        }
        bound_connections(&mut config);
        if config.get_application_name().is_none() {
            config.application_name("agent-harness");
        }
        let listen_config = config.clone();
        let pool_wait = POOL_WAIT.min(options.statement_timeout);
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match &tls {
            Some(tls) => Manager::from_config(config, tls.clone(), manager_config),
            None => Manager::from_config(config, NoTls, manager_config),
        };
        let pool = Pool::builder(manager)
            .max_size(options.pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(pool_wait))
            .create_timeout(Some(CREATE_TIMEOUT))
            .build()
            .map_err(|e| StoreError::Config {
                message: format!("postgres store: building the pool: {e}"),
                source: Some(e.into()),
            })?;
        let store = Self {
            lists: super::gate::ListGate::new(options.pool_size.max(2) / 2, pool_wait),
            answer_within: options.statement_timeout.saturating_add(ANSWER_GRACE),
            pool_wait,
            notifier: notify::Notifier::start(
                pool.clone(),
                options.statement_timeout.saturating_add(ANSWER_GRACE),
            ),
            committer: group::Committer::start(
                pool.clone(),
                target.clone(),
                group::Bounds {
                    pool_wait,
                    answer_within: options.statement_timeout.saturating_add(ANSWER_GRACE),
                },
            ),
            pool,
            target,
            config: listen_config,
            wakes: std::sync::OnceLock::new(),
            tls,
        };
        let mut client = store.pool.get().await.map_err(|e| {
            from_pool(
                &format!("postgres store: cannot connect to {}", store.target),
                e,
            )
        })?;
        schema::migrate(&mut client).await.map_err(|e| Error {
            message: format!("{} (database {})", e.message, store.target),
            ..e
        })?;
        Ok(store)
    }

    /// Stores a new session in one transaction; with `max_live`, only while its owner has fewer
    /// live sessions, counted under a lock on the owner that every replica takes for it, so two
    /// replicas creating at once cannot both pass the count.
    async fn create(&self, record: &SessionRecord, max_live: Option<u64>) -> Result<CappedCreate> {
        self.reader()
            .await?
            .read_mut(async |client: &mut Client| {
                let tx = client
                    .transaction()
                    .await
                    .context("starting a transaction")?;
                if let Some(max_live) = max_live
                    && live_sessions_locked(&tx, &record.owner).await? >= max_live
                {
                    return Ok(CappedCreate::AtCap);
                }
                insert_session(&tx, record).await?;
                tx.commit().await.context("committing a new session")?;
                Ok(CappedCreate::Created)
            })
            .await
    }

    /// Where the store points: `host:port/database as user`.
    pub fn target(&self) -> &str {
        &self.target
    }

    async fn client(&self) -> Result<Client> {
        pooled(&self.pool, self.pool_wait).await.map_err(|e| {
            from_pool(
                &format!("postgres store: no connection to {}", self.target),
                e,
            )
            .into()
        })
    }

    /// A connection for one call, which is given up — cancelled on the server, and closed unless
    /// it settles — if the caller goes away or no answer comes in time.
    async fn reader(&self) -> Result<Reader> {
        Ok(Reader {
            client: Some(self.client().await?),
            tls: self.tls.clone(),
            answer_within: self.answer_within,
        })
    }
}

/// A pooled connection running one call. Dropped before the call's answers came — the caller's
/// deadline passed or the caller went away, and its future was dropped mid-query, or the
/// database did not answer within `answer_within` — the statement is cancelled on the server (a
/// dropped future alone would leave it running, holding the connection and whatever it locks).
/// The connection rejoins the pool only once the cancelled statement has ended, so the cancel
/// can never hit the next user's statement; one that does not settle is closed.
struct Reader {
    client: Option<Client>,
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    answer_within: Duration,
}

/// How long a cancelled connection may take to become idle before it is closed instead.
const CANCEL_SETTLE: Duration = Duration::from_secs(5);

impl Reader {
    /// Runs the call; once it has its answers, the connection goes back to the pool as it is.
    async fn read<T>(self, read: impl AsyncFnOnce(&Client) -> Result<T>) -> Result<T> {
        self.read_mut(async |client: &mut Client| read(client).await)
            .await
    }

    /// [`Reader::read`] with the connection to itself (a transaction).
    async fn read_mut<T>(mut self, read: impl AsyncFnOnce(&mut Client) -> Result<T>) -> Result<T> {
        let within = self.answer_within;
        let client = self
            .client
            .as_mut()
            .expect("a reader keeps its client until done");
        match tokio::time::timeout(within, read(client)).await {
            Ok(result) => {
                self.client.take();
                result
            }
            Err(elapsed) => Err(StoreError::unavailable(
                format!("postgres store: the database did not answer within {within:?}"),
                elapsed,
            )
            .into()),
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let token = client.cancel_token();
        let tls = self.tls.clone();
        runtime.spawn(async move {
            // The cancel opens a connection of its own, which a partition may hold too.
            let cancelled = match tls {
                Some(tls) => tokio::time::timeout(CANCEL_SETTLE, token.cancel_query(tls)).await,
                None => tokio::time::timeout(CANCEL_SETTLE, token.cancel_query(NoTls)).await,
            };
            // A query sent after the cancelled one answers only once that one has ended.
            let settled = matches!(cancelled, Ok(Ok(())))
                && tokio::time::timeout(CANCEL_SETTLE, client.simple_query(""))
                    .await
                    .is_ok_and(|answered| answered.is_ok());
            if !settled {
                tracing::debug!(
                    "postgres store: a cancelled call did not settle; closing its connection"
                );
                drop(deadpool_postgres::Object::take(client));
            }
        });
    }
}

fn limit_of(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn ttl_micros(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX)
}

/// The record's columns after the key, in the order of [`rows::SESSION_COLUMNS`] from `name`.
macro_rules! record_params {
    ($record:expr, $status:expr, $created:expr, $updated:expr) => {
        [
            &$record.name as &(dyn ToSql + Sync),
            &$record.owner,
            &$record.profile,
            &$record.cwd,
            &$record.model,
            &$record.acp_session_id,
            &$status,
            &$record.status_reason,
            &$created,
            &$updated,
            &$record.profile_fingerprint,
            &$record.request_fingerprint,
            &$record.can_resume,
            &$record.can_load,
        ]
    };
}

/// The first half of the advisory lock key taken per owner while counting against the cap
/// ("AgHo"); the second is the schema and owner hashed. A hash collision only makes two owners
/// wait for each other.
const OWNER_LOCK_CLASS: i32 = 0x4167_486f;

/// Live (not closed) sessions of `owner`, counted once this transaction holds the owner's
/// lock: a create of the same owner elsewhere waits for it, and a later count sees this one's
/// session.
async fn live_sessions_locked(tx: &deadpool_postgres::Transaction<'_>, owner: &str) -> Result<u64> {
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext(coalesce(current_schema(), '') || '/' || $2))",
        &[&OWNER_LOCK_CLASS, &owner],
    )
    .await
    .context("locking the owner's sessions")?;
    let stmt = tx
        .prepare_cached(LIVE_SESSIONS_SQL)
        .await
        .context("counting live sessions")?;
    let count: i64 = tx
        .query_one(&stmt, &[&owner])
        .await
        .context("counting live sessions")?
        .get(0);
    Ok(u64::try_from(count).unwrap_or_default())
}

/// A principal's live sessions, counted through the index on `(owner, status)`.
/// The sums are `numeric` and saturate at the bounds of `bigint` before the cast: an agent's
/// absurd figures must read as a huge sum, never fail the read ("bigint out of range").
const USAGE_SQL: &str = "SELECT session_id, principal, profile, currency, \
     LEAST(sum(input_tokens), 9223372036854775807)::bigint, \
     LEAST(sum(output_tokens), 9223372036854775807)::bigint, \
     GREATEST(LEAST(sum(cost_micros), 9223372036854775807), -9223372036854775808)::bigint, \
     source \
     FROM usage_records WHERE ($1::text IS NULL OR principal = $1) \
     AND ($2::uuid IS NULL OR session_id = $2) AND ($3::bigint IS NULL OR at >= $3) \
     GROUP BY session_id, principal, profile, source, currency";
const LIVE_SESSIONS_SQL: &str =
    "SELECT count(*) FROM sessions WHERE owner = $1 AND status <> 'closed'";

/// Inserts a new session's rows; SESSION_EXISTS if its id is taken.
async fn insert_session(
    tx: &deadpool_postgres::Transaction<'_>,
    record: &SessionRecord,
) -> Result<()> {
    let status = record.status.as_str();
    let (created, updated) = (to_micros(record.created_at), to_micros(record.updated_at));
    let stmt = tx
        .prepare_cached(
            "INSERT INTO sessions (id, name, owner, profile, cwd, model, \
             acp_session_id, status, status_reason, created_at, updated_at, \
             profile_fingerprint, request_fingerprint, can_resume, can_load) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, \
             $15) ON CONFLICT (id) DO NOTHING RETURNING pk",
        )
        .await
        .context("storing a new session")?;
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![&record.id];
    params.extend(record_params!(record, status, created, updated));
    let Some(row) = tx
        .query_opt(&stmt, &params)
        .await
        .context("storing a new session")?
    else {
        return Err(Error::new(
            ErrorCode::SessionExists,
            format!("session {} already exists", record.id),
        ));
    };
    let pk: i64 = row.get(0);
    if let Some(first) = record.first_action_id {
        tx.execute(
            "UPDATE sessions SET first_action_id = $2 WHERE pk = $1",
            &[&pk, &first.as_uuid()],
        )
        .await
        .context("storing a new session")?;
    }
    if let Some(home) = &record.home {
        tx.execute("UPDATE sessions SET home = $2 WHERE pk = $1", &[&pk, home])
            .await
            .context("storing a new session")?;
    }
    write_side_rows(tx, pk, record).await
}

async fn write_side_rows(
    tx: &deadpool_postgres::Transaction<'_>,
    pk: i64,
    record: &SessionRecord,
) -> Result<()> {
    if !record.labels.is_empty() {
        let keys: Vec<&str> = record.labels.keys().map(String::as_str).collect();
        let values: Vec<&str> = record.labels.values().map(String::as_str).collect();
        let stmt = tx
            .prepare_cached(
                "INSERT INTO session_labels (session_pk, key, value) \
                 SELECT $1, k, v FROM unnest($2::text[], $3::text[]) AS t(k, v)",
            )
            .await
            .context("storing session labels")?;
        tx.execute(&stmt, &[&pk, &keys, &values])
            .await
            .context("storing session labels")?;
    }
    if !record.editors.is_empty() {
        let positions: Vec<i64> = (0..record.editors.len() as i64).collect();
        let stmt = tx
            .prepare_cached(
                "INSERT INTO session_editors (session_pk, position, principal) \
                 SELECT $1, p, e FROM unnest($2::bigint[], $3::text[]) AS t(p, e)",
            )
            .await
            .context("storing session editors")?;
        tx.execute(&stmt, &[&pk, &positions, &record.editors])
            .await
            .context("storing session editors")?;
    }
    Ok(())
}

/// Failover's candidates: sessions with a turn in flight (found through the index on status,
/// `sessions_by_status`) or with queued entries (the queue's key: only sessions with queued work
/// have rows there), then only those without a live lease. An idle session is reached through
/// neither, so idle sessions cost this nothing however many there are. The statuses are literals
/// so the planner sees which ones even in a generic plan.
const ORPHANS_WITH_WORK_SQL: &str = "SELECT s.id FROM sessions s \
     WHERE s.pk IN ( \
         SELECT pk FROM sessions WHERE status IN ('running', 'awaiting_input') \
         UNION SELECT session_pk FROM queue) \
     AND s.status <> 'closed' \
     AND NOT EXISTS (SELECT 1 FROM leases l \
         WHERE l.session_id = s.id AND l.expires_at > now()) \
     ORDER BY s.created_at, s.id";

/// Each listed session's head and a digest of its record row and its queue rows, in queue order
/// (whole rows as text, so any change to either changes it).
const CHANGE_MARKS_SQL: &str = "SELECT s.id, \
     (SELECT coalesce(max(l.\"offset\"), 0) FROM log l WHERE l.session_pk = s.pk), \
     md5(s::text || coalesce((SELECT string_agg(q::text, ',' ORDER BY q.position) \
         FROM queue q WHERE q.session_pk = s.pk), '')) \
     FROM sessions s WHERE s.id = ANY($1)";

/// The SQL and parameters of a [`SessionQuery`]: every filter ANDed, newest first, keyset paged.
fn list_sql(query: &SessionQuery) -> (String, Vec<Box<dyn ToSql + Sync + Send>>) {
    let mut sql = format!(
        "SELECT {} FROM sessions s WHERE true",
        rows::SESSION_COLUMNS
    );
    let mut params: Vec<Box<dyn ToSql + Sync + Send>> = Vec::new();
    if let Some(principal) = &query.owner_or_editor {
        params.push(Box::new(principal.clone()));
        let p = params.len();
        sql.push_str(&format!(
            " AND (s.owner = ${p} OR EXISTS (SELECT 1 FROM session_editors e \
             WHERE e.session_pk = s.pk AND e.principal = ${p}))"
        ));
    }
    if !query.statuses.is_empty() {
        let statuses: Vec<String> = query
            .statuses
            .iter()
            .map(|s| s.as_str().to_owned())
            .collect();
        params.push(Box::new(statuses));
        sql.push_str(&format!(" AND s.status = ANY(${}::text[])", params.len()));
    }
    if !query.labels.is_empty() {
        // One join of the label rows with the wanted pairs: a session matches when it has all
        // of them (a key appears once per session and once in the filter). One subquery per
        // pair instead made planning time grow steeply with their number: about 1 s for 64.
        let keys: Vec<String> = query.labels.keys().cloned().collect();
        let values: Vec<String> = query.labels.values().cloned().collect();
        params.push(Box::new(keys));
        params.push(Box::new(values));
        params.push(Box::new(limit_of(query.labels.len())));
        let (k, v, n) = (params.len() - 2, params.len() - 1, params.len());
        sql.push_str(&format!(
            " AND s.pk IN (SELECT l.session_pk FROM session_labels l \
             JOIN unnest(${k}::text[], ${v}::text[]) AS f(key, value) \
             ON l.key = f.key AND l.value = f.value \
             GROUP BY l.session_pk HAVING count(*) = ${n})"
        ));
    }
    if let Some((created_at, id)) = &query.after {
        // Times are stored in whole microseconds. A position between two of them is the same
        // as "before the next microsecond, below every id".
        let whole = created_at
            .duration_since(std::time::UNIX_EPOCH)
            .is_ok_and(|since| since.subsec_nanos() % 1_000 == 0);
        let (micros, id) = if whole {
            (to_micros(*created_at), *id)
        } else {
            (to_micros(*created_at) + 1, Uuid::nil())
        };
        params.push(Box::new(micros));
        params.push(Box::new(id));
        let (t, i) = (params.len() - 1, params.len());
        sql.push_str(&format!(" AND (s.created_at, s.id) < (${t}, ${i})"));
    }
    params.push(Box::new(limit_of(query.page_size)));
    sql.push_str(&format!(
        " ORDER BY s.created_at DESC, s.id DESC LIMIT ${}",
        params.len()
    ));
    (sql, params)
}

#[async_trait]
impl Store for PostgresStore {
    async fn create_session(&self, record: &SessionRecord) -> Result<()> {
        self.create(record, None).await.map(drop)
    }

    async fn create_session_capped(
        &self,
        record: &SessionRecord,
        max_live: u64,
    ) -> Result<CappedCreate> {
        self.create(record, Some(max_live)).await
    }

    async fn commit(&self, session_id: Uuid, batch: Batch) -> Result<(), CommitError> {
        let head = batch.entries.last().map_or(0, |e| e.offset);
        self.committer.commit(session_id, batch).await?;
        self.notifier.committed(session_id, head);
        Ok(())
    }

    /// Takes the session row's share lock and lets go at once: every commit of the session holds
    /// that row locked until it ends, so once the lock is granted no transaction that may still
    /// write the session is open. One left open by a lost connection ends by itself: the server
    /// rolls back a transaction idle past `idle_in_transaction_session_timeout`, or one whose
    /// connection it finds closed.
    async fn settle(&self, session_id: Uuid) -> Result<()> {
        self.reader()
            .await?
            .read_mut(async |client| {
                let tx = client
                    .transaction()
                    .await
                    .context("waiting for a session's writes to end")?;
                tx.query(
                    "SELECT 1 FROM sessions WHERE id = $1 FOR SHARE",
                    &[&session_id],
                )
                .await
                .context("waiting for a session's writes to end")?;
                tx.commit()
                    .await
                    .context("waiting for a session's writes to end")
            })
            .await
    }

    async fn get_session(&self, session_id: Uuid) -> Result<Option<SessionRecord>> {
        let row = self
            .reader()
            .await?
            .read(async |client| {
                let stmt = client
                    .prepare_cached(&format!(
                        "SELECT {} FROM sessions s WHERE s.id = $1",
                        rows::SESSION_COLUMNS
                    ))
                    .await
                    .context("reading a session")?;
                client
                    .query_opt(&stmt, &[&session_id])
                    .await
                    .context("reading a session")
            })
            .await?;
        row.map(|row| rows::session(&row)).transpose()
    }

    async fn list_sessions(&self, query: &SessionQuery) -> Result<Vec<SessionRecord>> {
        if query.page_size == 0 {
            return Ok(Vec::new());
        }
        let (sql, params) = list_sql(query);
        let _turn = self.lists.enter(query.owner_or_editor.as_deref()).await?;
        let params: Vec<&(dyn ToSql + Sync)> = params
            .iter()
            .map(|p| p.as_ref() as &(dyn ToSql + Sync))
            .collect();
        let rows = self
            .reader()
            .await?
            .read(async |client| {
                let stmt = client
                    .prepare_cached(&sql)
                    .await
                    .context("listing sessions")?;
                client
                    .query(&stmt, &params)
                    .await
                    .context("listing sessions")
            })
            .await?;
        rows.iter().map(rows::session).collect()
    }

    async fn count_live_sessions(&self, owner: &str) -> Result<u64> {
        let count: i64 = self
            .reader()
            .await?
            .read(async |client| {
                let stmt = client
                    .prepare_cached(LIVE_SESSIONS_SQL)
                    .await
                    .context("counting live sessions")?;
                client
                    .query_one(&stmt, &[&owner])
                    .await
                    .context("counting live sessions")
            })
            .await?
            .get(0);
        Ok(count as u64)
    }

    async fn usage(&self, query: &UsageQuery) -> Result<Vec<UsageRow>> {
        let since = query.since.map(to_micros);
        let rows = self
            .reader()
            .await?
            .read(async |client| {
                let stmt = client
                    .prepare_cached(USAGE_SQL)
                    .await
                    .context("reading usage")?;
                client
                    .query(&stmt, &[&query.principal, &query.session_id, &since])
                    .await
                    .context("reading usage")
            })
            .await?;
        Ok(rows
            .iter()
            .map(|row| UsageRow {
                session_id: row.get(0),
                principal: row.get(1),
                profile: row.get(2),
                currency: row.get(3),
                source: crate::domain::usage::UsageSource::parse(row.get(7)),
                input_tokens: row.get::<_, i64>(4).max(0) as u64,
                output_tokens: row.get::<_, i64>(5).max(0) as u64,
                cost_micros: row.get(6),
            })
            .collect())
    }

    async fn open_sessions(&self) -> Result<Vec<SessionRecord>> {
        self.reader()
            .await?
            .read(async |client| {
                let stmt = client
                    .prepare_cached(&format!(
                        "SELECT {} FROM sessions s WHERE s.status <> $1 \
                         ORDER BY s.created_at, s.id",
                        rows::SESSION_COLUMNS
                    ))
                    .await
                    .context("listing open sessions")?;
                client
                    .query(&stmt, &[&SessionStatus::Closed.as_str()])
                    .await
                    .context("listing open sessions")
            })
            .await?
            .iter()
            .map(rows::session)
            .collect()
    }

    async fn delete_session(&self, session_id: Uuid) -> Result<bool> {
        self.reader()
            .await?
            .read_mut(async |client: &mut Client| {
                let tx = client
                    .transaction()
                    .await
                    .context("starting a transaction")?;
                let stmt = tx
                    .prepare_cached("DELETE FROM sessions WHERE id = $1")
                    .await
                    .context("deleting a session")?;
                let deleted = tx
                    .execute(&stmt, &[&session_id])
                    .await
                    .context("deleting a session")?;
                // Subscribers on other replicas learn of it at once, not at their next poll.
                tx.execute(
                    "SELECT pg_notify($1, $2)",
                    &[&notify::CHANNEL, &notify::payload(session_id, 0)],
                )
                .await
                .context("deleting a session")?;
                tx.commit().await.context("deleting a session")?;
                Ok(deleted > 0)
            })
            .await
    }

    async fn delete_closed_before(
        &self,
        closed_before: std::time::SystemTime,
        limit: usize,
    ) -> Result<Vec<Uuid>> {
        let before = super::to_micros(closed_before);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.reader()
            .await?
            .read_mut(async |client: &mut Client| {
                let tx = client
                    .transaction()
                    .await
                    .context("starting a retention batch")?;
                // SKIP LOCKED: passes on several replicas take disjoint batches instead of
                // waiting on each other's rows.
                let stmt = tx
                    .prepare_cached(
                        "WITH doomed AS ( \
                             SELECT pk FROM sessions WHERE status = $1 AND updated_at < $2 \
                             ORDER BY updated_at LIMIT $3 FOR UPDATE SKIP LOCKED) \
                         DELETE FROM sessions s USING doomed WHERE s.pk = doomed.pk \
                         RETURNING s.id",
                    )
                    .await
                    .context("deleting expired sessions")?;
                let rows = tx
                    .query(&stmt, &[&SessionStatus::Closed.as_str(), &before, &limit])
                    .await
                    .context("deleting expired sessions")?;
                let ids: Vec<Uuid> = rows.iter().map(|row| row.get(0)).collect();
                // Subscribers on every replica learn of it at once, not at their next poll.
                for &id in &ids {
                    tx.execute(
                        "SELECT pg_notify($1, $2)",
                        &[&notify::CHANNEL, &notify::payload(id, 0)],
                    )
                    .await
                    .context("deleting expired sessions")?;
                }
                tx.commit().await.context("deleting expired sessions")?;
                Ok(ids)
            })
            .await
    }

    fn wake_ups(&self) -> Option<tokio::sync::broadcast::Receiver<super::Wake>> {
        tokio::runtime::Handle::try_current().ok()?;
        let wakes = self.wakes.get_or_init(|| {
            notify::start(self.config.clone(), self.target.clone(), self.tls.clone())
        });
        Some(wakes.subscribe())
    }

    async fn read_log(&self, session_id: Uuid, after: u64, limit: usize) -> Result<Vec<LogEntry>> {
        let Ok(after) = i64::try_from(after) else {
            return Ok(Vec::new());
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        let rows = self
            .reader()
            .await?
            .read(async |client| {
                let stmt = client
                    .prepare_cached(&format!(
                        "SELECT {} FROM log \
                         WHERE session_pk = (SELECT pk FROM sessions WHERE id = $1) \
                         AND \"offset\" > $2 ORDER BY \"offset\" LIMIT $3",
                        rows::LOG_COLUMNS
                    ))
                    .await
                    .context("reading the log")?;
                client
                    .query(&stmt, &[&session_id, &after, &limit_of(limit)])
                    .await
                    .context("reading the log")
            })
            .await?;
        rows.iter()
            .map(|row| rows::log_entry(row, session_id))
            .collect()
    }

    async fn head_offset(&self, session_id: Uuid) -> Result<u64> {
        let head: i64 = self
            .reader()
            .await?
            .read(async |client| {
                let stmt = client
                    .prepare_cached(
                        "SELECT coalesce(max(\"offset\"), 0) FROM log \
                         WHERE session_pk = (SELECT pk FROM sessions WHERE id = $1)",
                    )
                    .await
                    .context("reading the log head")?;
                client
                    .query_one(&stmt, &[&session_id])
                    .await
                    .context("reading the log head")
            })
            .await?
            .get(0);
        u64::try_from(head).map_err(|_| {
            rows::corrupt(format!("session {session_id}: log head {head} is negative"))
        })
    }

    async fn load_queue(&self, session_id: Uuid) -> Result<Vec<QueuedEntry>> {
        let rows = self
            .reader()
            .await?
            .read(async |client| {
                let stmt = client
                    .prepare_cached(&format!(
                        "SELECT {} FROM queue \
                         WHERE session_pk = (SELECT pk FROM sessions WHERE id = $1) \
                         ORDER BY position",
                        rows::QUEUE_COLUMNS
                    ))
                    .await
                    .context("reading the queue")?;
                client
                    .query(&stmt, &[&session_id])
                    .await
                    .context("reading the queue")
            })
            .await?;
        rows.iter()
            .map(|row| rows::queued_entry(row, session_id))
            .collect()
    }

    async fn find_action(
        &self,
        session_id: Uuid,
        action_id: ActionId,
    ) -> Result<Option<ActionRecord>> {
        self.reader()
            .await?
            .read(async |client| {
                let stmt = client
                    .prepare_cached(&format!(
                        "SELECT {} FROM actions \
                         WHERE session_pk = (SELECT pk FROM sessions WHERE id = $1) \
                         AND action_id = $2",
                        rows::ACTION_COLUMNS
                    ))
                    .await
                    .context("reading an action id")?;
                client
                    .query_opt(&stmt, &[&session_id, &action_id.as_uuid()])
                    .await
                    .context("reading an action id")
            })
            .await?
            .map(|row| rows::action_record(&row, session_id))
            .transpose()
    }

    async fn claim_lease(
        &self,
        session_id: Uuid,
        replica: &str,
        ttl: Duration,
    ) -> Result<LeaseClaim> {
        // One statement: insert a first lease, or take over an expired or own one (a takeover
        // bumps the fence; a renewal by the holder keeps it). A live lease of another replica
        // is left alone and read back instead.
        let granted = self
            .reader()
            .await?
            .read(async |client| {
                let stmt = client
                    .prepare_cached(&format!(
                        "INSERT INTO leases AS l (session_id, owner_replica, fence, expires_at) \
                         SELECT $1, $2, 1, now() + $3::bigint * interval '1 microsecond' \
                         FROM sessions WHERE id = $1 \
                         ON CONFLICT (session_id) DO UPDATE SET \
                             fence = CASE WHEN l.owner_replica = excluded.owner_replica \
                                          AND l.expires_at > now() THEN l.fence \
                                          ELSE l.fence + 1 END, \
                             owner_replica = excluded.owner_replica, \
                             expires_at = excluded.expires_at \
                         WHERE l.owner_replica = excluded.owner_replica OR l.expires_at <= now() \
                         RETURNING {}",
                        rows::LEASE_COLUMNS
                    ))
                    .await
                    .context("claiming a lease")?;
                client
                    .query_opt(&stmt, &[&session_id, &replica, &ttl_micros(ttl)])
                    .await
                    .context("claiming a lease")
            })
            .await?;
        if let Some(row) = granted {
            return Ok(LeaseClaim::Granted(rows::lease(&row)?));
        }
        match self.get_lease(session_id).await? {
            Some(lease) => Ok(LeaseClaim::HeldBy(lease)),
            None => Err(Error::session_not_found(&session_id.to_string())),
        }
    }

    async fn renew_leases(
        &self,
        replica: &str,
        held: &[(Uuid, u64)],
        ttl: Duration,
    ) -> Result<Vec<Lease>> {
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let sessions: Vec<Uuid> = held.iter().map(|(id, _)| *id).collect();
        let fences: Vec<i64> = held
            .iter()
            .map(|(_, fence)| i64::try_from(*fence).unwrap_or(i64::MAX))
            .collect();
        // Only the leases listed, with their fences: one the replica stopped (its time ran out
        // while the database was out of reach) must lapse even once renewals get through again.
        // A released lease (expired to 'epoch') stays released: its session is another
        // replica's to claim, even if this replica's renewal races the claim.
        // The rows are locked in session order, as commit groups take them (see
        // `postgres/group.rs`): in any other order a renewal and a group could each hold a lease
        // the other waits for.
        self.reader()
            .await?
            .read(async |client| {
                let stmt = client
                    .prepare_cached(&format!(
                        "UPDATE leases \
                         SET expires_at = now() + $2::bigint * interval '1 microsecond' \
                         WHERE owner_replica = $1 AND expires_at <> 'epoch' \
                         AND (session_id, fence) IN \
                             (SELECT * FROM unnest($3::uuid[], $4::bigint[])) \
                         AND session_id IN \
                             (SELECT l.session_id FROM leases l \
                              JOIN unnest($3::uuid[], $4::bigint[]) AS h(session_id, fence) \
                              ON h.session_id = l.session_id AND h.fence = l.fence \
                              WHERE l.owner_replica = $1 AND l.expires_at <> 'epoch' \
                              ORDER BY l.session_id FOR UPDATE OF l) \
                         RETURNING {}",
                        rows::LEASE_COLUMNS
                    ))
                    .await
                    .context("renewing leases")?;
                client
                    .query(&stmt, &[&replica, &ttl_micros(ttl), &sessions, &fences])
                    .await
                    .context("renewing leases")
            })
            .await?
            .iter()
            .map(rows::lease)
            .collect()
    }

    async fn release_lease(&self, session_id: Uuid, replica: &str, fence: u64) -> Result<bool> {
        let Ok(fence) = i64::try_from(fence) else {
            return Ok(false);
        };
        // Expired, not deleted: the fence must keep growing for the session's whole life.
        let released = self
            .reader()
            .await?
            .read(async |client| {
                let stmt = client
                    .prepare_cached(
                        "UPDATE leases SET expires_at = 'epoch' \
                         WHERE session_id = $1 AND owner_replica = $2 AND fence = $3",
                    )
                    .await
                    .context("releasing a lease")?;
                client
                    .execute(&stmt, &[&session_id, &replica, &fence])
                    .await
                    .context("releasing a lease")
            })
            .await?;
        Ok(released > 0)
    }

    async fn get_lease(&self, session_id: Uuid) -> Result<Option<Lease>> {
        self.reader()
            .await?
            .read(async |client| {
                let stmt = client
                    .prepare_cached(&format!(
                        "SELECT {} FROM leases WHERE session_id = $1",
                        rows::LEASE_COLUMNS
                    ))
                    .await
                    .context("reading a lease")?;
                client
                    .query_opt(&stmt, &[&session_id])
                    .await
                    .context("reading a lease")
            })
            .await?
            .map(|row| rows::lease(&row))
            .transpose()
    }

    async fn orphans_with_work(&self) -> Result<Vec<Uuid>> {
        Ok(self
            .reader()
            .await?
            .read(async |client| {
                let stmt = client
                    .prepare_cached(ORPHANS_WITH_WORK_SQL)
                    .await
                    .context("listing orphaned sessions")?;
                client
                    .query(&stmt, &[])
                    .await
                    .context("listing orphaned sessions")
            })
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect())
    }

    async fn change_marks(&self, sessions: &[Uuid]) -> Result<Vec<(Uuid, ChangeMark)>> {
        if sessions.is_empty() {
            return Ok(Vec::new());
        }
        self.reader()
            .await?
            .read(async |client| {
                let stmt = client
                    .prepare_cached(CHANGE_MARKS_SQL)
                    .await
                    .context("reading change marks")?;
                client
                    .query(&stmt, &[&sessions])
                    .await
                    .context("reading change marks")
            })
            .await?
            .iter()
            .map(|row| {
                let head: i64 = row.get(1);
                let head = u64::try_from(head)
                    .map_err(|_| rows::corrupt(format!("log head {head} is negative")))?;
                Ok((
                    row.get(0),
                    ChangeMark {
                        head,
                        digest: row.get(2),
                    },
                ))
            })
            .collect()
    }

    async fn publish_bridges(
        &self,
        replica: &str,
        bridges: &[BridgeAd],
        ttl: Duration,
    ) -> Result<()> {
        self.reader()
            .await?
            .read_mut(async |client: &mut Client| {
                let tx = client
                    .transaction()
                    .await
                    .context("starting a transaction")?;
                // Expired rows of any replica go too: a replica that died leaves none behind for
                // long.
                tx.execute(
                    "DELETE FROM bridges WHERE replica = $1 OR expires_at <= now()",
                    &[&replica],
                )
                .await
                .context("publishing bridges")?;
                let insert = tx
                    .prepare_cached(
                        "INSERT INTO bridges (replica, bridge_id, labels, profiles, runtimes, \
                         expires_at, principal, connected) \
                         VALUES ($1, $2, $3, $4, $5, \
                         now() + $6::bigint * interval '1 microsecond', $7, $8)",
                    )
                    .await
                    .context("publishing bridges")?;
                for bridge in bridges {
                    let labels = serde_json::to_string(&bridge.labels).unwrap_or_default();
                    let profiles = serde_json::to_string(&bridge.profiles).unwrap_or_default();
                    let runtimes = i64::try_from(bridge.runtimes).unwrap_or(i64::MAX);
                    tx.execute(
                        &insert,
                        &[
                            &replica,
                            &bridge.bridge_id,
                            &labels,
                            &profiles,
                            &runtimes,
                            &ttl_micros(ttl),
                            &bridge.principal,
                            &bridge.connected,
                        ],
                    )
                    .await
                    .context("publishing bridges")?;
                }
                tx.commit().await.context("publishing bridges")
            })
            .await
    }

    async fn bridge_ads(&self) -> Result<Vec<BridgeAd>> {
        let rows = self
            .reader()
            .await?
            .read(async |client| {
                let stmt = client
                    .prepare_cached(
                        "SELECT replica, bridge_id, labels, profiles, runtimes, principal, \
                         connected FROM bridges \
                         WHERE expires_at > now() ORDER BY replica, bridge_id",
                    )
                    .await
                    .context("reading bridges")?;
                client.query(&stmt, &[]).await.context("reading bridges")
            })
            .await?;
        Ok(rows
            .iter()
            .map(|row| {
                let labels: String = row.get(2);
                let profiles: String = row.get(3);
                let runtimes: i64 = row.get(4);
                BridgeAd {
                    replica: row.get(0),
                    bridge_id: row.get(1),
                    principal: row.get(5),
                    connected: row.get(6),
                    labels: serde_json::from_str(&labels).unwrap_or_default(),
                    profiles: serde_json::from_str(&profiles).unwrap_or_default(),
                    runtimes: u64::try_from(runtimes).unwrap_or_default(),
                }
            })
            .collect())
    }

    async fn check(&self) -> Result<()> {
        self.reader()
            .await?
            .read(async |client| {
                client
                    .simple_query("SELECT 1")
                    .await
                    .context("checking the database")
            })
            .await?;
        Ok(())
    }

    async fn close(&self) -> Result<()> {
        self.pool.close();
        Ok(())
    }
}
