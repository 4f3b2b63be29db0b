//! Conversions between stored rows and domain values. A value that does not decode is reported
//! as an internal error naming the table, the row and the column — never a panic. Error text is
//! only built on failure, so decoding a healthy row allocates nothing beyond its own values.

use std::{collections::BTreeMap, fmt::Display};

use rusqlite::{Connection, Row, types::ValueRef};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::{
    domain::{
        ActionId, Error, Result,
        queue::QueuedEntry,
        session::{SessionRecord, SessionStatus},
    },
    store::{
        ActionRecord, ActionState, Direction, LogEntry, StoreError, from_micros, work_from_json,
    },
};

/// Turns a database error into an internal error saying what the store was doing.
pub(super) trait Context<T> {
    fn context(self, doing: &str) -> Result<T>;
}

impl<T> Context<T> for rusqlite::Result<T> {
    fn context(self, doing: &str) -> Result<T> {
        self.map_err(|e| {
            if e.sqlite_error_code() == Some(rusqlite::ErrorCode::OperationInterrupted) {
                // Not the caller's fault, nothing stored: the read ran past the statement
                // timeout (or its caller went away).
                return StoreError::unavailable(
                    format!("sqlite store: {doing}: the read did not finish in time (interrupted)"),
                    e,
                )
                .into();
            }
            StoreError::Sqlite {
                message: format!("sqlite store: {doing}: {}", describe(&e)),
                source: e,
            }
            .into()
        })
    }
}

/// A SQLite error for a message a caller may read: what SQLite said, never the statement
/// (rusqlite's own text of an error at a place in a statement quotes all of it).
pub(super) fn describe(e: &rusqlite::Error) -> String {
    match e {
        rusqlite::Error::SqlInputError { msg, offset, .. } => {
            format!("{msg} (at byte {offset} of the statement)")
        }
        other => other.to_string(),
    }
}

/// A stored value that does not decode.
pub(super) fn corrupt(what: impl Display) -> Error {
    StoreError::corrupt(format!("sqlite store: corrupt row: {what}")).into()
}

/// The stored form of an action id: its 16 UUID bytes.
pub(super) fn action_id_bytes(id: &ActionId) -> [u8; 16] {
    id.as_uuid().into_bytes()
}

fn action_id_of(uuid: Uuid) -> ActionId {
    let mut buffer = [0u8; uuid::fmt::Hyphenated::LENGTH];
    let text = uuid.hyphenated().encode_lower(&mut buffer);
    ActionId::from_stored(text).expect("a hyphenated UUID parses back")
}

/// One row being decoded, with a description of where it is for error messages (built lazily).
struct At<'a, 'stmt> {
    row: &'a Row<'stmt>,
    place: &'a dyn Fn() -> String,
}

impl At<'_, '_> {
    fn bad(&self, column: &str, problem: impl Display) -> Error {
        corrupt(format!("{}: {column} {problem}", (self.place)()))
    }

    fn value(&self, idx: usize, column: &str) -> Result<ValueRef<'_>> {
        self.row
            .get_ref(idx)
            .map_err(|e| self.bad(column, format_args!("cannot be read: {e}")))
    }

    fn int(&self, idx: usize, column: &str) -> Result<i64> {
        match self.value(idx, column)? {
            ValueRef::Integer(value) => Ok(value),
            other => Err(self.bad(
                column,
                format_args!("is {}, not an integer", other.data_type()),
            )),
        }
    }

    fn str(&self, idx: usize, column: &str) -> Result<&str> {
        match self.value(idx, column)? {
            ValueRef::Text(bytes) => std::str::from_utf8(bytes)
                .map_err(|e| self.bad(column, format_args!("is not valid UTF-8: {e}"))),
            other => Err(self.bad(column, format_args!("is {}, not text", other.data_type()))),
        }
    }

    fn text(&self, idx: usize, column: &str) -> Result<String> {
        self.str(idx, column).map(str::to_owned)
    }

    fn optional_text(&self, idx: usize, column: &str) -> Result<Option<String>> {
        match self.value(idx, column)? {
            ValueRef::Null => Ok(None),
            _ => self.text(idx, column).map(Some),
        }
    }

    fn uuid(&self, idx: usize, column: &str) -> Result<Uuid> {
        match self.value(idx, column)? {
            ValueRef::Blob(bytes) => Uuid::from_slice(bytes).map_err(|_| {
                self.bad(column, format_args!("is {} bytes, not a UUID", bytes.len()))
            }),
            other => Err(self.bad(column, format_args!("is {}, not a UUID", other.data_type()))),
        }
    }

    fn action_id(&self, idx: usize, column: &str) -> Result<ActionId> {
        self.uuid(idx, column).map(action_id_of)
    }

    fn optional_action_id(&self, idx: usize, column: &str) -> Result<Option<ActionId>> {
        match self.value(idx, column)? {
            ValueRef::Null => Ok(None),
            _ => self.action_id(idx, column).map(Some),
        }
    }

    fn flag(&self, idx: usize, column: &str) -> Result<bool> {
        match self.int(idx, column)? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(self.bad(column, format_args!("is {other}, not 0 or 1"))),
        }
    }
}

/// The columns [`session`] decodes, in order, for a `sessions` table aliased `s`.
macro_rules! session_columns {
    () => {
        "s.pk, s.id, s.name, s.owner, s.profile, s.cwd, s.model, s.acp_session_id, s.status, \
         s.status_reason, s.created_at, s.updated_at, s.profile_fingerprint, \
         s.request_fingerprint, s.can_resume, s.can_load, s.first_action_id, s.home"
    };
}
pub(super) use session_columns;

/// A session row (see [`session_columns`]) without its labels and editors, with its `pk`.
pub(super) fn session(row: &Row<'_>) -> Result<(i64, SessionRecord)> {
    let at = At {
        row,
        place: &|| "sessions".to_owned(),
    };
    let pk = at.int(0, "pk")?;
    let id = at.uuid(1, "id")?;
    let place = || format!("session {id}");
    let at = At { row, place: &place };
    let status_text = at.str(8, "status")?;
    let status = SessionStatus::parse(status_text)
        .ok_or_else(|| at.bad("status", format_args!("{status_text:?} is unknown")))?;
    let record = SessionRecord {
        id,
        name: at.text(2, "name")?,
        owner: at.text(3, "owner")?,
        profile: at.text(4, "profile")?,
        cwd: at.text(5, "cwd")?,
        model: at.text(6, "model")?,
        acp_session_id: at.text(7, "acp_session_id")?,
        status,
        status_reason: at.text(9, "status_reason")?,
        created_at: from_micros(at.int(10, "created_at")?),
        updated_at: from_micros(at.int(11, "updated_at")?),
        labels: BTreeMap::new(),
        profile_fingerprint: at.text(12, "profile_fingerprint")?,
        editors: Vec::new(),
        request_fingerprint: at.text(13, "request_fingerprint")?,
        can_resume: at.flag(14, "can_resume")?,
        can_load: at.flag(15, "can_load")?,
        first_action_id: match at.optional_text(16, "first_action_id")? {
            Some(text) => Some(
                ActionId::from_stored(&text)
                    .ok_or_else(|| at.bad("first_action_id", "is not an action id"))?,
            ),
            None => None,
        },
        home: at.optional_text(17, "home")?,
    };
    Ok((pk, record))
}

/// Fills in a session's labels and editors from their side tables.
pub(super) fn session_side_rows(
    conn: &Connection,
    pk: i64,
    record: &mut SessionRecord,
) -> Result<()> {
    (record.labels, record.editors) = side_rows(conn, pk, record.id)?;
    Ok(())
}

/// The labels and editors stored for the session `pk` (whose id is `id`).
pub(super) fn side_rows(
    conn: &Connection,
    pk: i64,
    id: Uuid,
) -> Result<(BTreeMap<String, String>, Vec<String>)> {
    let place = || format!("session {id}");
    let mut labels = BTreeMap::new();
    let mut stmt = conn
        .prepare_cached("SELECT key, value FROM session_labels WHERE session_pk = ?1")
        .context("reading session labels")?;
    let mut rows = stmt.query([pk]).context("reading session labels")?;
    while let Some(row) = rows.next().context("reading session labels")? {
        let at = At { row, place: &place };
        labels.insert(at.text(0, "label key")?, at.text(1, "label value")?);
    }
    let mut editors = Vec::new();
    let mut stmt = conn
        .prepare_cached(
            "SELECT principal FROM session_editors WHERE session_pk = ?1 ORDER BY position",
        )
        .context("reading session editors")?;
    let mut rows = stmt.query([pk]).context("reading session editors")?;
    while let Some(row) = rows.next().context("reading session editors")? {
        let at = At { row, place: &place };
        editors.push(at.text(0, "editor")?);
    }
    Ok((labels, editors))
}

/// The columns [`log_entry`] decodes, in order.
macro_rules! log_columns {
    () => {
        "offset, direction, actor, action_id, epoch, created_at, json"
    };
}
pub(super) use log_columns;

pub(super) fn log_entry(row: &Row<'_>, session_id: Uuid) -> Result<LogEntry> {
    let head = || format!("session {session_id}: log");
    let raw_offset = At { row, place: &head }.int(0, "offset")?;
    let place = || format!("session {session_id}: log offset {raw_offset}");
    let at = At { row, place: &place };
    let offset = u64::try_from(raw_offset).map_err(|_| at.bad("offset", "is negative"))?;
    let direction_code = at.int(1, "direction")?;
    let direction = Direction::from_i64(direction_code)
        .ok_or_else(|| at.bad("direction", format_args!("{direction_code} is unknown")))?;
    let epoch = at.int(4, "epoch")?;
    let epoch = u32::try_from(epoch)
        .map_err(|_| at.bad("epoch", format_args!("{epoch} is out of range")))?;
    Ok(LogEntry {
        offset,
        direction,
        actor: at.text(2, "actor")?,
        action_id: at.optional_action_id(3, "action_id")?,
        epoch,
        created_at: from_micros(at.int(5, "created_at")?),
        json: at.text(6, "json")?,
    })
}

/// The columns [`queued_entry`] decodes, in order.
macro_rules! queue_columns {
    () => {
        "action_id, actor, created_at, traceparent, context, work"
    };
}
pub(super) use queue_columns;

pub(super) fn queued_entry(row: &Row<'_>, session_id: Uuid) -> Result<QueuedEntry> {
    let head = || format!("session {session_id}: queue");
    let action_id = At { row, place: &head }.action_id(0, "action_id")?;
    let place = || format!("session {session_id}: queued action {action_id}");
    let at = At { row, place: &place };
    let context = match at.optional_text(4, "context")? {
        None => None,
        Some(text) => Some(
            serde_json::from_str::<Map<String, Value>>(&text)
                .map_err(|e| at.bad("context", format_args!("is not a JSON object: {e}")))?,
        ),
    };
    let work = work_from_json(at.str(5, "work")?).map_err(|e| at.bad("work", e.message))?;
    Ok(QueuedEntry {
        action_id,
        work,
        context,
        actor: at.text(1, "actor")?,
        created_at: from_micros(at.int(2, "created_at")?),
        traceparent: at.optional_text(3, "traceparent")?,
    })
}

/// The columns [`action_record`] decodes, in order.
macro_rules! action_columns {
    () => {
        "action_id, fingerprint, state, created_at"
    };
}
pub(super) use action_columns;

pub(super) fn action_record(row: &Row<'_>, session_id: Uuid) -> Result<ActionRecord> {
    let head = || format!("session {session_id}: actions");
    let action_id = At { row, place: &head }.action_id(0, "action_id")?;
    let place = || format!("session {session_id}: action {action_id}");
    let at = At { row, place: &place };
    let state_text = at.str(2, "state")?;
    let state = ActionState::parse(state_text)
        .ok_or_else(|| at.bad("state", format_args!("{state_text:?} is unknown")))?;
    Ok(ActionRecord {
        action_id,
        fingerprint: at.text(1, "fingerprint")?,
        state,
        created_at: from_micros(at.int(3, "created_at")?),
    })
}

/// The offset in column 0 of a log row.
pub(super) fn log_entry_offset(row: &Row<'_>, session_id: Uuid) -> Result<u64> {
    let place = || format!("session {session_id}: log");
    let at = At { row, place: &place };
    let offset = at.int(0, "offset")?;
    u64::try_from(offset).map_err(|_| at.bad("offset", format_args!("{offset} is negative")))
}
