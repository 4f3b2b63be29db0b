//! The versioned schema of the PostgreSQL store, embedded in the binary and applied at start.
//!
//! `schema_migrations` records every applied version. [`MIGRATIONS`] holds one script per version:
//! entry `i` takes a schema from version `i` to `i + 1`. All pending scripts run in one
//! transaction that first takes a transaction-scoped advisory lock, so replicas starting together
//! apply them once: the others wait on the lock, then find nothing left to do. DDL is
//! transactional in PostgreSQL, so a failed migration leaves the schema as it was.

use deadpool_postgres::Client;

use super::Context;
use crate::{domain::Result, store::StoreError};

/// Scripts taking the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5, V6, V7];

/// The schema version this build writes.
pub(super) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The first half of the advisory lock key ("AgHa"); the second is the schema's name hashed, so
/// stores on different schemas of one database never wait on each other.
const LOCK_CLASS: i32 = 0x4167_4861;

/// Version 1: the logical schema of the SQLite store (see `sqlite/schema.rs`), plus leases.
///
/// - Times are microseconds since the epoch (`bigint`), exactly as SQLite keeps them, so both
///   stores round-trip the same values; lease expiry is `timestamptz` because it is compared
///   with the database's own clock.
/// - `log` is keyed by `(session_pk, offset)`, which serves reads, the head lookup and refuses a
///   duplicate offset even if a check were bypassed.
/// - `leases.fence` only ever grows: a release expires the lease instead of deleting it, so a
///   fence number is never handed out twice for one session.
const V1: &str = r#"
CREATE TABLE sessions (
    pk                  bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id                  uuid    NOT NULL UNIQUE,
    name                text    NOT NULL,
    owner               text    NOT NULL,
    profile             text    NOT NULL,
    cwd                 text    NOT NULL,
    model               text    NOT NULL,
    acp_session_id      text    NOT NULL,
    status              text    NOT NULL,
    status_reason       text    NOT NULL,
    created_at          bigint  NOT NULL,
    updated_at          bigint  NOT NULL,
    profile_fingerprint text    NOT NULL,
    request_fingerprint text    NOT NULL,
    can_resume          boolean NOT NULL,
    can_load            boolean NOT NULL
);
CREATE INDEX sessions_newest_first ON sessions (created_at DESC, id DESC);
CREATE INDEX sessions_by_owner ON sessions (owner, status);
CREATE INDEX sessions_by_status ON sessions (status);

CREATE TABLE session_labels (
    session_pk bigint NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
    key        text   NOT NULL,
    value      text   NOT NULL,
    PRIMARY KEY (session_pk, key)
);
CREATE INDEX session_labels_by_pair ON session_labels (key, value);

CREATE TABLE session_editors (
    session_pk bigint NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
    position   bigint NOT NULL,
    principal  text   NOT NULL,
    PRIMARY KEY (session_pk, position)
);
CREATE INDEX session_editors_by_principal ON session_editors (principal, session_pk);

CREATE TABLE log (
    session_pk bigint   NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
    "offset"   bigint   NOT NULL,
    direction  smallint NOT NULL,
    actor      text     NOT NULL,
    action_id  uuid,
    epoch      bigint   NOT NULL,
    created_at bigint   NOT NULL,
    json       text     NOT NULL,
    PRIMARY KEY (session_pk, "offset")
);

CREATE TABLE queue (
    session_pk  bigint NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
    action_id   uuid   NOT NULL,
    position    bigint NOT NULL,
    actor       text   NOT NULL,
    created_at  bigint NOT NULL,
    traceparent text,
    context     text,
    work        text   NOT NULL,
    PRIMARY KEY (session_pk, action_id),
    UNIQUE (session_pk, position)
);

CREATE TABLE actions (
    session_pk  bigint NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
    action_id   uuid   NOT NULL,
    state       text   NOT NULL,
    created_at  bigint NOT NULL,
    fingerprint text   NOT NULL,
    PRIMARY KEY (session_pk, action_id)
);

CREATE TABLE leases (
    session_id    uuid        PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
    owner_replica text        NOT NULL,
    fence         bigint      NOT NULL,
    expires_at    timestamptz NOT NULL
);
CREATE INDEX leases_by_owner ON leases (owner_replica);
CREATE INDEX leases_by_expiry ON leases (expires_at);
"#;

/// Version 2: the action id of a session's first prompt (set at creation, never changed), so an
/// idempotent CreateSession retry finds it however long the log. Older sessions read NULL.
const V2: &str = "ALTER TABLE sessions ADD COLUMN first_action_id uuid;";

/// Version 3: the bridges each replica holds the stream of, so a replica without a
/// matching bridge hands a remote session to one that has it. Keyed by replica and bridge: while
/// a bridge moves it may briefly be listed by both. Labels and profiles are JSON text.
const V3: &str = r#"
CREATE TABLE bridges (
    replica    text        NOT NULL,
    bridge_id  text        NOT NULL,
    labels     text        NOT NULL,
    profiles   text        NOT NULL,
    runtimes   bigint      NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (replica, bridge_id)
);
CREATE INDEX bridges_by_expiry ON bridges (expires_at);
"#;

/// Version 4: the principal of each published bridge's token, so no replica admits another
/// principal's bridge under the same id (an older replica's rows read '': unknown), and
/// whether its stream is up there (bridges waiting for a redial are published too, as held).
const V4: &str = r#"
ALTER TABLE bridges ADD COLUMN principal text NOT NULL DEFAULT '';
ALTER TABLE bridges ADD COLUMN connected boolean NOT NULL DEFAULT true;
"#;

/// The HOME a sandboxed session's agent runs with (set at creation; older sessions read NULL and
/// find theirs from the configuration).
const V6: &str = "ALTER TABLE sessions ADD COLUMN home text;";

/// Version 7: whose word a usage record is (`agent`, or `model_proxy` for what the model proxy
/// read from a provider's answer; older rows are the agents'), and the turn it was spent in.
const V7: &str = "
ALTER TABLE usage_records ADD COLUMN source text NOT NULL DEFAULT 'agent';
ALTER TABLE usage_records ADD COLUMN action_id uuid;
";

/// Usage records: what agents reported, kept apart from sessions (no cascade) so that deleting a
/// session does not refund its owner's budget.
const V5: &str = r#"
CREATE TABLE usage_records (
    session_id    uuid   NOT NULL,
    principal     text   NOT NULL,
    profile       text   NOT NULL,
    at            bigint NOT NULL,
    input_tokens  bigint NOT NULL,
    output_tokens bigint NOT NULL,
    cost_micros   bigint NOT NULL,
    currency      text   NOT NULL
);
CREATE INDEX usage_records_by_principal ON usage_records (principal, at);
CREATE INDEX usage_records_by_session ON usage_records (session_id);
"#;

/// Brings the schema of the connection's `search_path` to [`SCHEMA_VERSION`].
pub(super) async fn migrate(client: &mut Client) -> Result<()> {
    let tx = client
        .transaction()
        .await
        .context("starting the schema migration")?;
    // Waiting for another replica's migration, or migrating a large table, may take longer
    // than an ordinary statement is allowed to.
    tx.batch_execute("SET LOCAL statement_timeout = 0")
        .await
        .context("starting the schema migration")?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext(coalesce(current_schema(), '')))",
        &[&LOCK_CLASS],
    )
    .await
    .context("taking the migration lock")?;
    let schema: Option<String> = tx
        .query_one("SELECT current_schema()", &[])
        .await
        .context("reading the current schema")?
        .get(0);
    if schema.is_none() {
        return Err(StoreError::config(
            "postgres store: no schema to create tables in: the search_path names no existing \
             schema",
        )
        .into());
    }
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version    bigint      PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await
    .context("creating schema_migrations")?;
    let current: i64 = tx
        .query_one(
            "SELECT coalesce(max(version), 0) FROM schema_migrations",
            &[],
        )
        .await
        .context("reading the schema version")?
        .get(0);
    if current > SCHEMA_VERSION {
        return Err(StoreError::schema(format!(
            "postgres store: the database has schema version {current}, newer than the \
             {SCHEMA_VERSION} this build understands; use a newer agent-harness"
        ))
        .into());
    }
    for (from, script) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let to = from as i64 + 1;
        tx.batch_execute(script)
            .await
            .map_err(|e| StoreError::Schema {
                message: format!(
                    "postgres store: migrating to version {to}: {}",
                    super::describe(&e)
                ),
                source: Some(e.into()),
            })?;
        tx.execute(
            "INSERT INTO schema_migrations (version) VALUES ($1)",
            &[&to],
        )
        .await
        .context("recording the schema version")?;
    }
    tx.commit()
        .await
        .context("committing the schema migration")?;
    if current < SCHEMA_VERSION {
        tracing::info!(
            from = current,
            to = SCHEMA_VERSION,
            "postgres store: schema migrated"
        );
    }
    Ok(())
}
