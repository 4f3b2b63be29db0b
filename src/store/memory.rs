//! An in-memory [`Store`]: no durability, for unit tests of the layers above and as a second
//! backend the conformance suite runs against.

use std::{collections::HashMap, sync::Mutex};

use async_trait::async_trait;
use uuid::Uuid;

use super::{ActionRecord, Batch, CommitError, LogEntry, QueueOp, SessionQuery, Store};
use crate::domain::{
    ActionId, Error, ErrorCode, Result, queue::QueuedEntry, session::SessionRecord,
    session::SessionStatus,
};

#[derive(Default)]
struct SessionData {
    record: Option<SessionRecord>,
    log: Vec<LogEntry>,
    queue: Vec<QueuedEntry>,
    actions: HashMap<ActionId, ActionRecord>,
}

#[derive(Default)]
pub struct MemoryStore {
    sessions: Mutex<HashMap<Uuid, SessionData>>,
    usage: Mutex<Vec<super::UsageRecord>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }
}

fn apply(data: &mut SessionData, batch: Batch) -> Result<()> {
    let head = data.log.last().map_or(0, |e| e.offset);
    for (i, entry) in batch.entries.iter().enumerate() {
        if entry.offset != head + 1 + i as u64 {
            return Err(super::StoreError::refused(format!(
                "log offsets must continue densely from {head}: got {}",
                entry.offset
            ))
            .into());
        }
    }
    for action in &batch.new_actions {
        if data.actions.contains_key(&action.action_id) {
            return Err(Error::new(
                ErrorCode::ActionIdConflict,
                format!("action id {} is already recorded", action.action_id),
            ));
        }
    }
    let mut queue = data.queue.clone();
    for op in batch.queue {
        match op {
            QueueOp::PushBack(entry) => queue.push(entry),
            QueueOp::PushFront(entry) => queue.insert(0, entry),
            QueueOp::Update(entry) => {
                if let Some(slot) = queue.iter_mut().find(|e| e.action_id == entry.action_id) {
                    *slot = entry;
                }
            }
            QueueOp::Remove(id) => queue.retain(|e| e.action_id != id),
            QueueOp::Clear => queue.clear(),
        }
    }
    data.queue = queue;
    data.log.extend(batch.entries);
    for action in batch.new_actions {
        data.actions.insert(action.action_id, action);
    }
    for (id, state) in batch.action_states {
        if let Some(record) = data.actions.get_mut(&id) {
            record.state = state;
        }
    }
    if let Some(record) = batch.session {
        data.record = Some(record);
    }
    Ok(())
}

#[async_trait]
impl Store for MemoryStore {
    async fn create_session(&self, record: &SessionRecord) -> Result<()> {
        let mut sessions = self.sessions.lock().expect("not poisoned");
        if sessions.contains_key(&record.id) {
            return Err(Error::new(
                ErrorCode::SessionExists,
                format!("session {} already exists", record.id),
            ));
        }
        sessions.insert(
            record.id,
            SessionData {
                record: Some(record.clone()),
                ..Default::default()
            },
        );
        Ok(())
    }

    async fn commit(&self, session_id: Uuid, batch: Batch) -> Result<(), CommitError> {
        let mut sessions = self.sessions.lock().expect("not poisoned");
        let data = sessions
            .get_mut(&session_id)
            .ok_or_else(|| Error::session_not_found(&session_id.to_string()))?;
        let usage = batch.usage.clone();
        apply(data, batch)?;
        self.usage.lock().expect("not poisoned").extend(usage);
        Ok(())
    }

    async fn usage(&self, query: &super::UsageQuery) -> Result<Vec<super::UsageRow>> {
        const MAX_SUM: u64 = i64::MAX as u64;
        let records = self.usage.lock().expect("not poisoned");
        let mut rows: Vec<super::UsageRow> = Vec::new();
        for r in records.iter().filter(|r| {
            query.principal.as_ref().is_none_or(|p| &r.principal == p)
                && query.session_id.is_none_or(|s| r.session_id == s)
                && query.since.is_none_or(|since| r.at >= since)
        }) {
            let key = (
                r.session_id,
                &r.principal,
                &r.profile,
                r.source,
                &r.currency,
            );
            match rows.iter_mut().find(|row| {
                (
                    row.session_id,
                    &row.principal,
                    &row.profile,
                    row.source,
                    &row.currency,
                ) == key
            }) {
                // Saturating at the bounds the database stores keep (`bigint`): absurd
                // figures read as a huge sum, never as an error.
                Some(row) => {
                    row.input_tokens = row.input_tokens.saturating_add(r.input_tokens).min(MAX_SUM);
                    row.output_tokens = row
                        .output_tokens
                        .saturating_add(r.output_tokens)
                        .min(MAX_SUM);
                    row.cost_micros = row.cost_micros.saturating_add(r.cost_micros);
                }
                None => rows.push(super::UsageRow {
                    session_id: r.session_id,
                    principal: r.principal.clone(),
                    profile: r.profile.clone(),
                    source: r.source,
                    currency: r.currency.clone(),
                    input_tokens: r.input_tokens.min(MAX_SUM),
                    output_tokens: r.output_tokens.min(MAX_SUM),
                    cost_micros: r.cost_micros,
                }),
            }
        }
        Ok(rows)
    }

    async fn get_session(&self, session_id: Uuid) -> Result<Option<SessionRecord>> {
        let sessions = self.sessions.lock().expect("not poisoned");
        Ok(sessions.get(&session_id).and_then(|d| d.record.clone()))
    }

    async fn list_sessions(&self, query: &SessionQuery) -> Result<Vec<SessionRecord>> {
        let sessions = self.sessions.lock().expect("not poisoned");
        let mut records: Vec<SessionRecord> = sessions
            .values()
            .filter_map(|d| d.record.clone())
            .filter(|r| {
                query
                    .owner_or_editor
                    .as_ref()
                    .is_none_or(|p| &r.owner == p || r.editors.contains(p))
                    && (query.statuses.is_empty() || query.statuses.contains(&r.status))
                    && query.labels.iter().all(|(k, v)| r.labels.get(k) == Some(v))
                    && query
                        .after
                        .is_none_or(|(at, id)| (r.created_at, r.id) < (at, id))
            })
            .collect();
        records.sort_by_key(|r| std::cmp::Reverse((r.created_at, r.id)));
        records.truncate(query.page_size);
        Ok(records)
    }

    async fn count_live_sessions(&self, owner: &str) -> Result<u64> {
        let sessions = self.sessions.lock().expect("not poisoned");
        Ok(sessions
            .values()
            .filter_map(|d| d.record.as_ref())
            .filter(|r| r.owner == owner && r.status != SessionStatus::Closed)
            .count() as u64)
    }

    async fn open_sessions(&self) -> Result<Vec<SessionRecord>> {
        let sessions = self.sessions.lock().expect("not poisoned");
        Ok(sessions
            .values()
            .filter_map(|d| d.record.clone())
            .filter(|r| r.status != SessionStatus::Closed)
            .collect())
    }

    async fn delete_session(&self, session_id: Uuid) -> Result<bool> {
        Ok(self
            .sessions
            .lock()
            .expect("not poisoned")
            .remove(&session_id)
            .is_some())
    }

    async fn delete_closed_before(
        &self,
        closed_before: std::time::SystemTime,
        limit: usize,
    ) -> Result<Vec<Uuid>> {
        let mut sessions = self.sessions.lock().expect("not poisoned");
        let mut expired: Vec<(std::time::SystemTime, Uuid)> = sessions
            .iter()
            .filter_map(|(id, data)| data.record.as_ref().map(|r| (id, r)))
            .filter(|(_, r)| r.status == SessionStatus::Closed && r.updated_at < closed_before)
            .map(|(id, r)| (r.updated_at, *id))
            .collect();
        expired.sort();
        expired.truncate(limit);
        for (_, id) in &expired {
            sessions.remove(id);
        }
        Ok(expired.into_iter().map(|(_, id)| id).collect())
    }

    async fn read_log(&self, session_id: Uuid, after: u64, limit: usize) -> Result<Vec<LogEntry>> {
        let sessions = self.sessions.lock().expect("not poisoned");
        Ok(sessions
            .get(&session_id)
            .map(|d| {
                d.log
                    .iter()
                    .filter(|e| e.offset > after)
                    .take(limit)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn head_offset(&self, session_id: Uuid) -> Result<u64> {
        let sessions = self.sessions.lock().expect("not poisoned");
        Ok(sessions
            .get(&session_id)
            .and_then(|d| d.log.last())
            .map_or(0, |e| e.offset))
    }

    async fn load_queue(&self, session_id: Uuid) -> Result<Vec<QueuedEntry>> {
        let sessions = self.sessions.lock().expect("not poisoned");
        Ok(sessions
            .get(&session_id)
            .map(|d| d.queue.clone())
            .unwrap_or_default())
    }

    async fn find_action(
        &self,
        session_id: Uuid,
        action_id: ActionId,
    ) -> Result<Option<ActionRecord>> {
        let sessions = self.sessions.lock().expect("not poisoned");
        Ok(sessions
            .get(&session_id)
            .and_then(|d| d.actions.get(&action_id).cloned()))
    }
}
