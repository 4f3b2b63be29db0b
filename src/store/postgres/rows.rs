//! Conversions from PostgreSQL rows to domain values. A value that does not decode is an internal
//! error naming the table, the row and the column — never a panic.

use std::{collections::BTreeMap, fmt::Display};

use serde_json::{Map, Value};
use tokio_postgres::{Row, types::FromSql};
use uuid::Uuid;

use crate::{
    domain::{
        ActionId, Error, Result,
        queue::QueuedEntry,
        session::{SessionRecord, SessionStatus},
    },
    store::{
        ActionRecord, ActionState, Direction, Lease, LogEntry, StoreError, from_micros,
        work_from_json,
    },
};

pub(super) fn corrupt(what: impl Display) -> Error {
    StoreError::corrupt(format!("postgres store: corrupt row: {what}")).into()
}

fn action_id_of(uuid: Uuid) -> ActionId {
    ActionId::from_stored(&uuid.hyphenated().to_string()).expect("a hyphenated UUID parses back")
}

/// One row being decoded, with where it is for error messages (built only on failure).
struct At<'a> {
    row: &'a Row,
    place: &'a dyn Fn() -> String,
}

impl At<'_> {
    fn bad(&self, column: &str, problem: impl Display) -> Error {
        corrupt(format!("{}: {column} {problem}", (self.place)()))
    }

    fn get<'r, T: FromSql<'r>>(&'r self, idx: usize, column: &str) -> Result<T> {
        self.row
            .try_get(idx)
            .map_err(|e| self.bad(column, format_args!("cannot be read: {e}")))
    }

    fn micros(&self, idx: usize, column: &str) -> Result<std::time::SystemTime> {
        self.get::<i64>(idx, column).map(from_micros)
    }
}

/// The columns [`session`] decodes, for a `sessions` table aliased `s`: the record, then its
/// labels (keys and values in one order) and editors (in their order) as arrays, so a session
/// reads in one query.
pub(super) const SESSION_COLUMNS: &str = "s.id, s.name, s.owner, s.profile, s.cwd, s.model, \
     s.acp_session_id, s.status, s.status_reason, s.created_at, s.updated_at, \
     s.profile_fingerprint, s.request_fingerprint, s.can_resume, s.can_load, \
     s.first_action_id, \
     ARRAY(SELECT l.key FROM session_labels l WHERE l.session_pk = s.pk ORDER BY l.key), \
     ARRAY(SELECT l.value FROM session_labels l WHERE l.session_pk = s.pk ORDER BY l.key), \
     ARRAY(SELECT e.principal FROM session_editors e WHERE e.session_pk = s.pk \
           ORDER BY e.position), \
     s.home";

pub(super) fn session(row: &Row) -> Result<SessionRecord> {
    let at = At {
        row,
        place: &|| "sessions".to_owned(),
    };
    let id: Uuid = at.get(0, "id")?;
    let place = || format!("session {id}");
    let at = At { row, place: &place };
    let status_text: &str = at.get(7, "status")?;
    let status = SessionStatus::parse(status_text)
        .ok_or_else(|| at.bad("status", format_args!("{status_text:?} is unknown")))?;
    let keys: Vec<String> = at.get(16, "label keys")?;
    let values: Vec<String> = at.get(17, "label values")?;
    if keys.len() != values.len() {
        return Err(at.bad("labels", "have keys and values of different counts"));
    }
    Ok(SessionRecord {
        id,
        name: at.get(1, "name")?,
        owner: at.get(2, "owner")?,
        profile: at.get(3, "profile")?,
        cwd: at.get(4, "cwd")?,
        model: at.get(5, "model")?,
        acp_session_id: at.get(6, "acp_session_id")?,
        status,
        status_reason: at.get(8, "status_reason")?,
        created_at: at.micros(9, "created_at")?,
        updated_at: at.micros(10, "updated_at")?,
        labels: keys.into_iter().zip(values).collect::<BTreeMap<_, _>>(),
        profile_fingerprint: at.get(11, "profile_fingerprint")?,
        editors: at.get(18, "editors")?,
        request_fingerprint: at.get(12, "request_fingerprint")?,
        can_resume: at.get(13, "can_resume")?,
        can_load: at.get(14, "can_load")?,
        first_action_id: at
            .get::<Option<Uuid>>(15, "first_action_id")?
            .map(action_id_of),
        home: at.get(19, "home")?,
    })
}

/// The columns [`log_entry`] decodes, in order.
pub(super) const LOG_COLUMNS: &str =
    "\"offset\", direction, actor, action_id, epoch, created_at, json";

pub(super) fn log_entry(row: &Row, session_id: Uuid) -> Result<LogEntry> {
    let head = || format!("session {session_id}: log");
    let raw_offset: i64 = At { row, place: &head }.get(0, "offset")?;
    let place = || format!("session {session_id}: log offset {raw_offset}");
    let at = At { row, place: &place };
    let offset = u64::try_from(raw_offset).map_err(|_| at.bad("offset", "is negative"))?;
    let direction_code: i16 = at.get(1, "direction")?;
    let direction = Direction::from_i64(i64::from(direction_code))
        .ok_or_else(|| at.bad("direction", format_args!("{direction_code} is unknown")))?;
    let epoch: i64 = at.get(4, "epoch")?;
    let epoch = u32::try_from(epoch)
        .map_err(|_| at.bad("epoch", format_args!("{epoch} is out of range")))?;
    Ok(LogEntry {
        offset,
        direction,
        actor: at.get(2, "actor")?,
        action_id: at.get::<Option<Uuid>>(3, "action_id")?.map(action_id_of),
        epoch,
        created_at: at.micros(5, "created_at")?,
        json: at.get(6, "json")?,
    })
}

/// The columns [`queued_entry`] decodes, in order.
pub(super) const QUEUE_COLUMNS: &str = "action_id, actor, created_at, traceparent, context, work";

pub(super) fn queued_entry(row: &Row, session_id: Uuid) -> Result<QueuedEntry> {
    let head = || format!("session {session_id}: queue");
    let action_id = action_id_of(At { row, place: &head }.get(0, "action_id")?);
    let place = || format!("session {session_id}: queued action {action_id}");
    let at = At { row, place: &place };
    let context = match at.get::<Option<&str>>(4, "context")? {
        None => None,
        Some(text) => Some(
            serde_json::from_str::<Map<String, Value>>(text)
                .map_err(|e| at.bad("context", format_args!("is not a JSON object: {e}")))?,
        ),
    };
    let work = work_from_json(at.get(5, "work")?).map_err(|e| at.bad("work", e.message))?;
    Ok(QueuedEntry {
        action_id,
        work,
        context,
        actor: at.get(1, "actor")?,
        created_at: at.micros(2, "created_at")?,
        traceparent: at.get(3, "traceparent")?,
    })
}

/// The columns [`action_record`] decodes, in order.
pub(super) const ACTION_COLUMNS: &str = "action_id, fingerprint, state, created_at";

pub(super) fn action_record(row: &Row, session_id: Uuid) -> Result<ActionRecord> {
    let head = || format!("session {session_id}: actions");
    let action_id = action_id_of(At { row, place: &head }.get(0, "action_id")?);
    let place = || format!("session {session_id}: action {action_id}");
    let at = At { row, place: &place };
    let state_text: &str = at.get(2, "state")?;
    let state = ActionState::parse(state_text)
        .ok_or_else(|| at.bad("state", format_args!("{state_text:?} is unknown")))?;
    Ok(ActionRecord {
        action_id,
        fingerprint: at.get(1, "fingerprint")?,
        state,
        created_at: at.micros(3, "created_at")?,
    })
}

/// The columns [`lease`] decodes, in order; the expiry in microseconds since the epoch.
pub(super) const LEASE_COLUMNS: &str = "session_id, owner_replica, fence, \
     (extract(epoch FROM expires_at) * 1000000)::bigint";

pub(super) fn lease(row: &Row) -> Result<Lease> {
    let at = At {
        row,
        place: &|| "leases".to_owned(),
    };
    let session_id: Uuid = at.get(0, "session_id")?;
    let fence: i64 = at.get(2, "fence")?;
    Ok(Lease {
        session_id,
        owner_replica: at.get(1, "owner_replica")?,
        fence: u64::try_from(fence).map_err(|_| at.bad("fence", "is negative"))?,
        expires_at: at.micros(3, "expires_at")?,
    })
}
