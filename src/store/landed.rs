//! Reading back a commit whose answer was lost ([`super::CommitError::Ambiguous`]): was the batch
//! stored? The writer keeps a [`Probe`] — one thing only that batch writes — before it commits,
//! and asks [`landed`] afterwards, on a fresh connection, instead of assuming either answer.
//! A batch is applied whole or not at all, so one of its rows tells.

use uuid::Uuid;

use super::{ActionRecord, ActionState, Batch, LogEntry, QueueOp, Store, to_micros, work_to_json};
use crate::domain::{ActionId, Result, queue::QueuedEntry};

/// What tells whether a batch was stored: the first of these the batch writes.
#[derive(Debug, Clone, PartialEq)]
pub enum Probe {
    /// Its first log entry, at its offset.
    Entry(LogEntry),
    /// Its first new action id.
    Action(ActionRecord),
    /// An action id's new state (a removal from the queue).
    ActionState(ActionId, ActionState),
    /// A queued entry as the batch leaves it (an edit).
    Queued(QueuedEntry),
    /// The session record's `updated_at` as the batch leaves it (every record change sets it).
    Record(std::time::SystemTime),
    /// The batch writes nothing that can be told apart; read as stored.
    Nothing,
}

impl Probe {
    /// The probe of `batch`, taken before it is committed.
    pub fn of(batch: &Batch) -> Self {
        if let Some(entry) = batch.entries.first() {
            return Self::Entry(entry.clone());
        }
        if let Some(action) = batch.new_actions.first() {
            return Self::Action(action.clone());
        }
        if let Some(&(action_id, state)) = batch.action_states.last() {
            return Self::ActionState(action_id, state);
        }
        let edited = batch.queue.iter().rev().find_map(|op| match op {
            QueueOp::Update(entry) => Some(entry.clone()),
            _ => None,
        });
        if let Some(entry) = edited {
            return Self::Queued(entry);
        }
        match &batch.session {
            Some(record) => Self::Record(record.updated_at),
            None => Self::Nothing,
        }
    }

    /// The action the batch was about, when it names one (for the caller's error).
    pub fn action_id(&self) -> Option<ActionId> {
        match self {
            Self::Entry(entry) => entry.action_id,
            Self::Action(action) => Some(action.action_id),
            Self::ActionState(action_id, _) => Some(*action_id),
            Self::Queued(entry) => Some(entry.action_id),
            Self::Record(_) | Self::Nothing => None,
        }
    }
}

/// Whether the batch `probe` was taken from is stored. First waits until no transaction that may
/// still write the session is open ([`Store::settle`]), so the answer stays true: a `COMMIT`
/// still on its way cannot land after it.
pub async fn landed(store: &dyn Store, session_id: Uuid, probe: &Probe) -> Result<bool> {
    store.settle(session_id).await?;
    Ok(match probe {
        Probe::Entry(ours) => {
            let stored = store
                .read_log(session_id, ours.offset.saturating_sub(1), 1)
                .await?;
            stored.first().is_some_and(|entry| same_entry(entry, ours))
        }
        Probe::Action(ours) => store
            .find_action(session_id, ours.action_id)
            .await?
            .is_some_and(|stored| {
                stored.fingerprint == ours.fingerprint
                    && to_micros(stored.created_at) == to_micros(ours.created_at)
            }),
        Probe::ActionState(action_id, state) => store
            .find_action(session_id, *action_id)
            .await?
            .is_some_and(|stored| stored.state == *state),
        Probe::Queued(ours) => store
            .load_queue(session_id)
            .await?
            .iter()
            .any(|stored| same_queued(stored, ours)),
        Probe::Record(updated_at) => store
            .get_session(session_id)
            .await?
            .is_some_and(|stored| to_micros(stored.updated_at) == to_micros(*updated_at)),
        Probe::Nothing => true,
    })
}

fn same_entry(stored: &LogEntry, ours: &LogEntry) -> bool {
    stored.offset == ours.offset
        && stored.direction == ours.direction
        && stored.json == ours.json
        && stored.actor == ours.actor
        && stored.action_id == ours.action_id
        && stored.epoch == ours.epoch
        && to_micros(stored.created_at) == to_micros(ours.created_at)
}

fn same_queued(stored: &QueuedEntry, ours: &QueuedEntry) -> bool {
    stored.action_id == ours.action_id
        && stored.actor == ours.actor
        && stored.context == ours.context
        && work_to_json(stored) == work_to_json(ours)
}
