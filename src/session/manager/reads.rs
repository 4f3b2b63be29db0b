//! Reading sessions and their logs: ListSessions pages, ReadLog pages held under the message
//! limit, and Subscribe streams.
//!
//! Reads never need the session's actor (reads from any replica). A session whose actor
//! runs here is read from it; any other — owned by another replica, by nobody, or closed — is
//! read from the store ([`Found::Stored`]), with the same access rule, and no actor is started
//! for it.

use std::{collections::BTreeMap, time::SystemTime};

use base64::Engine;
use uuid::Uuid;

use super::{DEFAULT_LOG_LIMIT, DEFAULT_PAGE_SIZE, MAX_LOG_LIMIT, MAX_PAGE_SIZE, Sessions};
use crate::{
    domain::{
        Error, Principal, PrincipalKind, Result,
        action_id::parse_session_id,
        queue::QueuedEntry,
        session::{SessionRecord, SessionStatus},
    },
    session::{
        Command, SessionHandle,
        subscribe::{self, View, offset_out_of_range},
    },
    store::{LogEntry, SessionQuery, Store},
};

/// A ListSessions page request.
#[derive(Debug, Clone, Default)]
pub(crate) struct ListInput {
    pub page_size: i32,
    pub page_token: String,
    pub statuses: Vec<SessionStatus>,
    pub labels: BTreeMap<String, String>,
}

/// Room kept in a ReadLog page for the response's own fields.
pub(crate) const PAGE_OVERHEAD_BYTES: usize = 64 * 1024;
/// What one entry costs in a page besides its JSON (offset, actor, ids, time, framing).
const ENTRY_OVERHEAD_BYTES: usize = 128;

/// A session as a read finds it.
pub(crate) enum Found {
    /// Its actor runs on this replica.
    Local(SessionHandle),
    /// It has no actor here: the record as stored.
    Stored(Box<SessionRecord>),
}

impl Found {
    pub(crate) fn id(&self) -> Uuid {
        match self {
            Self::Local(handle) => handle.shared.id,
            Self::Stored(record) => record.id,
        }
    }

    /// The record as it stands now (the actor's, or the stored one).
    pub(crate) fn record(&self) -> SessionRecord {
        match self {
            Self::Local(handle) => handle.shared.snapshot().0,
            Self::Stored(record) => (**record).clone(),
        }
    }
}

/// A stored session the caller may see, or SESSION_NOT_FOUND (another caller's session reads as
/// one that does not exist).
pub(crate) async fn stored_session(
    store: &dyn Store,
    principal: &Principal,
    session_id: &str,
) -> Result<SessionRecord> {
    let id = parse_session_id(session_id)?;
    let record = store
        .get_session(id)
        .await?
        .ok_or_else(|| Error::session_not_found(session_id))?;
    if !principal.may_access(&record.owner, &record.editors) {
        return Err(Error::session_not_found(session_id));
    }
    Ok(record)
}

impl Sessions {
    /// The session for a read: its local actor if it has one here, else its stored record.
    pub(crate) async fn find(&self, principal: &Principal, session_id: &str) -> Result<Found> {
        let id = parse_session_id(session_id)?;
        let local = self.handles.read().expect("not poisoned").get(&id).cloned();
        match local {
            Some(handle) => {
                if !principal.may_access(&handle.shared.owner, &handle.shared.editors) {
                    return Err(Error::session_not_found(session_id));
                }
                Ok(Found::Local(handle))
            }
            None => Ok(Found::Stored(Box::new(
                stored_session(self.ctx.store.as_ref(), principal, session_id).await?,
            ))),
        }
    }

    pub(crate) async fn get(
        &self,
        principal: &Principal,
        session_id: &str,
    ) -> Result<(SessionRecord, u64)> {
        match self.find(principal, session_id).await? {
            Found::Local(handle) => Ok(handle.shared.snapshot()),
            Found::Stored(record) => {
                let head = self.ctx.store.head_offset(record.id).await?;
                Ok((*record, head))
            }
        }
    }

    /// The queue: the actor's, or the stored one.
    pub(crate) async fn read_queue(
        &self,
        principal: &Principal,
        session_id: &str,
    ) -> Result<Vec<QueuedEntry>> {
        match self.find(principal, session_id).await? {
            Found::Local(handle) => handle.ask(|reply| Command::GetQueue { reply }).await,
            Found::Stored(record) => self.ctx.store.load_queue(record.id).await,
        }
    }

    pub(crate) async fn list(
        &self,
        principal: &Principal,
        input: ListInput,
    ) -> Result<(Vec<(SessionRecord, u64)>, String)> {
        // Every filter is work for the store: bounded before any query runs.
        self.ctx
            .limits
            .check_list_filters(input.statuses.len(), &input.labels)?;
        let page_size = match input.page_size {
            n if n < 0 => return Err(Error::invalid("page_size must not be negative")),
            0 => DEFAULT_PAGE_SIZE,
            n => (n as usize).min(MAX_PAGE_SIZE),
        };
        let after = if input.page_token.is_empty() {
            None
        } else {
            Some(decode_page_token(&input.page_token)?)
        };
        let query = SessionQuery {
            owner_or_editor: (principal.kind != PrincipalKind::Local)
                .then(|| principal.actor().to_owned()),
            statuses: input.statuses,
            labels: input.labels,
            page_size: page_size + 1,
            after,
        };
        let mut records = self.ctx.store.list_sessions(&query).await?;
        let more = records.len() > page_size;
        records.truncate(page_size);
        let next = match (more, records.last()) {
            (true, Some(last)) => encode_page_token(last.created_at, last.id),
            _ => String::new(),
        };
        let mut page = Vec::with_capacity(records.len());
        for record in records {
            match self.live_snapshot(record.id) {
                Some(snapshot) => page.push(snapshot),
                None => {
                    let head = self.ctx.store.head_offset(record.id).await?;
                    page.push((record, head));
                }
            }
        }
        Ok((page, next))
    }

    pub(crate) async fn read_log(
        &self,
        principal: &Principal,
        session_id: &str,
        after: u64,
        limit: u32,
    ) -> Result<(Vec<LogEntry>, u64)> {
        let found = self.find(principal, session_id).await?;
        let limit = match limit as usize {
            0 => DEFAULT_LOG_LIMIT,
            n => n.min(MAX_LOG_LIMIT),
        };
        let head = self.head_covering(&found, after).await?;
        if after > head {
            return Err(offset_out_of_range(after, head));
        }
        let mut entries = self.ctx.store.read_log(found.id(), after, limit).await?;
        // A page also stays under the gRPC message limit: it ends before the entry that would
        // overflow it (an entry larger than the limit on its own still comes, alone).
        let budget = self
            .ctx
            .limits
            .grpc_message_bytes
            .saturating_sub(PAGE_OVERHEAD_BYTES);
        let mut used = 0;
        let fits = entries
            .iter()
            .position(|e| {
                used += e.json.len() + ENTRY_OVERHEAD_BYTES;
                used > budget
            })
            .unwrap_or(entries.len())
            .max(1);
        entries.truncate(fits);
        Ok((entries, head))
    }

    /// The session's head, read from the store when `after` is past the head the actor has
    /// published: a stream may already have delivered an entry the store holds before the actor
    /// moved its head, and resuming from that entry's offset must not be refused.
    /// Without a local actor the store's head is the head.
    async fn head_covering(&self, found: &Found, after: u64) -> Result<u64> {
        let handle = match found {
            Found::Local(handle) => handle,
            Found::Stored(record) => return self.ctx.store.head_offset(record.id).await,
        };
        let head = handle.shared.head();
        if after <= head {
            return Ok(head);
        }
        Ok(head.max(self.ctx.store.head_offset(handle.shared.id).await?))
    }

    /// Opens a stream of a session from `after` (see [`subscribe`]).
    pub(crate) async fn subscribe(
        &self,
        principal: &Principal,
        session_id: &str,
        after: u64,
        view: View,
    ) -> Result<subscribe::StreamReceiver> {
        // Per replica, as the per-session cap: one principal's streams in all, whatever their
        // sessions, so one tenant cannot take the memory of the streams it may open. First, so
        // that a refusal costs no read of the store (and says nothing of the session).
        let slot = self
            .ctx
            .remote_streams
            .admit_principal(principal.actor(), self.ctx.limits.subscribers_per_principal)?;
        let found = self.find(principal, session_id).await?;
        let head = self.head_covering(&found, after).await?;
        let handle = match found {
            Found::Local(handle) => handle,
            Found::Stored(record) => {
                return subscribe::start_remote(
                    self.ctx.store.clone(),
                    &record,
                    subscribe::StreamStart { after, head, view },
                    self.ctx.meta_key.clone(),
                    self.ctx.streams.subscribe(),
                    &self.ctx.remote_streams,
                    subscribe::Admission {
                        max_subscribers: self.ctx.limits.subscribers_per_session,
                        principal: slot,
                    },
                );
            }
        };
        subscribe::start(
            handle,
            subscribe::StreamStart { after, head, view },
            self.ctx.store.clone(),
            self.ctx.meta_key.clone(),
            self.ctx.streams.subscribe(),
            &self.ctx.remote_streams,
            subscribe::Admission {
                max_subscribers: self.ctx.limits.subscribers_per_session,
                principal: slot,
            },
        )
    }
}

fn encode_page_token(created_at: SystemTime, id: Uuid) -> String {
    let micros = crate::store::to_micros(created_at);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{micros}:{id}"))
}

fn decode_page_token(token: &str) -> Result<(SystemTime, Uuid)> {
    let bad = || Error::invalid("page_token is not a token this server issued");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let (micros, id) = text.split_once(':').ok_or_else(bad)?;
    let micros: i64 = micros.parse().map_err(|_| bad())?;
    let id = Uuid::try_parse(id).map_err(|_| bad())?;
    Ok((crate::store::from_micros(micros), id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ErrorCode;

    #[test]
    fn a_page_token_round_trips_and_garbage_is_invalid() {
        let at = crate::store::from_micros(1_700_000_000_123_456);
        let id = Uuid::now_v7();
        let token = encode_page_token(at, id);
        assert_eq!(decode_page_token(&token).unwrap(), (at, id));
        assert_eq!(
            decode_page_token("%%%").unwrap_err().code,
            ErrorCode::InvalidArgument
        );
    }
}
