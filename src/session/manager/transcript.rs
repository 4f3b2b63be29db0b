//! The folded transcript, paged by turns.

use base64::Engine;
use uuid::Uuid;

use super::{DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, Sessions};
use crate::{
    acp::{
        fold::{Fold, page_turns},
        transcript::{Message, Metadata, Part},
    },
    domain::{Error, Principal, Result, session::SessionStatus},
};

impl Sessions {
    /// The folded transcript, paged by turns, oldest first.
    pub(crate) async fn transcript(
        &self,
        principal: &Principal,
        session_id: &str,
        page_size: u32,
        page_token: &str,
    ) -> Result<Transcript> {
        // Read like any other read: no actor is started for it (see `reads`).
        let found = self.find(principal, session_id).await?;
        let page_size = match page_size as usize {
            0 => DEFAULT_PAGE_SIZE,
            n => n.min(MAX_PAGE_SIZE),
        } as u32;
        let after_turn: u32 = if page_token.is_empty() {
            0
        } else {
            decode_turn_token(page_token)?
        };
        // A session with an actor here keeps its fold between calls and folds only what was
        // committed since; one read from the store is folded for this call alone.
        let mut cached;
        let mut fresh;
        let fold: &Fold = match &found {
            super::reads::Found::Local(handle) => {
                cached = handle.shared.transcript.lock().await;
                let fold = cached.get_or_insert_with(|| Fold::new(self.ctx.meta_key.clone()));
                self.fold_since(handle.shared.id, fold).await?;
                fold
            }
            super::reads::Found::Stored(record) => {
                fresh = Fold::new(self.ctx.meta_key.clone());
                self.fold_since(record.id, &mut fresh).await?;
                &fresh
            }
        };
        let (messages, next_page_token) = match page_turns(fold.turns(), after_turn, page_size) {
            Some((from, to)) => {
                let (messages, last) = page_by_bytes(fold, from, to, PAGE_BYTES);
                let token = if last < fold.turns() {
                    encode_turn_token(last)
                } else {
                    String::new()
                };
                (messages, token)
            }
            None => (Vec::new(), String::new()),
        };
        let record = found.record();
        Ok(Transcript {
            messages,
            metadata: fold.metadata().clone(),
            status: record.status,
            head: fold.head(),
            next_page_token,
        })
    }

    /// A session with what its agent reported about itself, from the kept fold when
    /// the session's actor is here, else from the log.
    pub(crate) async fn get_reported(
        &self,
        principal: &Principal,
        session_id: &str,
    ) -> Result<(crate::domain::session::SessionRecord, u64, Metadata)> {
        let (record, head) = self.get(principal, session_id).await?;
        let local = self
            .handles
            .read()
            .expect("not poisoned")
            .get(&record.id)
            .cloned();
        let metadata = match local {
            Some(handle) => {
                let mut cached = handle.shared.transcript.lock().await;
                let fold = cached.get_or_insert_with(|| Fold::new(self.ctx.meta_key.clone()));
                self.fold_since(handle.shared.id, fold).await?;
                fold.metadata().clone()
            }
            None => {
                let mut fold = Fold::new(self.ctx.meta_key.clone());
                self.fold_since(record.id, &mut fold).await?;
                fold.metadata().clone()
            }
        };
        Ok((record, head, metadata))
    }

    /// Folds what the log holds past what `fold` has seen.
    pub(crate) async fn fold_since(&self, session_id: Uuid, fold: &mut Fold) -> Result<()> {
        crate::session::fold_stored_log(self.ctx.store.as_ref(), session_id, fold, u64::MAX).await
    }
}

/// The most a page's messages may take (their content, roughly as encoded): under the default
/// 4 MiB gRPC message limit, with headroom for the metadata and the encoding's own bytes.
const PAGE_BYTES: usize = 3 * 1024 * 1024;
/// What a part may keep of its content when its turn alone is larger than a page.
const ELIDE_ABOVE: usize = 16 * 1024;

/// The messages of turns `from..=to` that fit in `budget` bytes, whole turns at a time, and the
/// last turn taken. The first turn is always taken: if it alone is larger than the budget, its
/// largest parts are elided (see [`elide`]) so that any turn can be read.
fn page_by_bytes(fold: &Fold, from: u32, to: u32, budget: usize) -> (Vec<Message>, u32) {
    // Each turn's size (turn 0, output before the first prompt, travels with turn 1). A turn's
    // messages need not be adjacent (a control's turn may start while a prompt's runs).
    let mut sizes: std::collections::BTreeMap<u32, usize> = Default::default();
    for message in fold.turn_range(from, to) {
        *sizes.entry(message.turn.max(from)).or_default() += message_bytes(message);
    }
    let mut used = 0;
    let mut last = to;
    for (i, (&turn, &size)) in sizes.iter().enumerate() {
        if i > 0 && used + size > budget {
            last = turn - 1;
            break;
        }
        used += size;
    }
    let mut messages: Vec<Message> = fold.turn_range(from, last).cloned().collect();
    if used > budget {
        // One turn alone, larger than any page.
        elide(&mut messages, budget);
    }
    (messages, last)
}

/// Roughly what a message takes encoded: its text and JSON, plus a little per part.
fn message_bytes(message: &Message) -> usize {
    const PART_OVERHEAD: usize = 64;
    let parts: usize = message
        .parts
        .iter()
        .map(|part| PART_OVERHEAD + part_bytes(part))
        .sum();
    256 + message.id.len()
        + message.actor.len()
        + message.error.as_ref().map_or(0, String::len)
        + parts
}

fn part_bytes(part: &Part) -> usize {
    match part {
        Part::Text(text) | Part::Thought(text) => text.len(),
        Part::Attachment(a) => 256 + a.uri.len() + a.name.len(),
        Part::Tool(t) => {
            t.tool_call_id.len()
                + t.title.len()
                + t.kind.len()
                + t.status.len()
                + t.content_json.len()
        }
        Part::Plan(entries) => entries
            .iter()
            .map(|e| 16 + e.content.len() + e.priority.len() + e.status.len())
            .sum(),
        Part::Permission(p) => {
            p.tool_call_json.len()
                + p.options
                    .iter()
                    .map(|o| 16 + o.option_id.len() + o.name.len() + o.kind.len())
                    .sum::<usize>()
        }
        Part::Elicitation(e) => e.message.len() + e.request_json.len() + e.answer_json.len(),
        Part::Control(c) => c.value.len(),
        Part::Content { kind, json } => kind.len() + json.len(),
        Part::ContextRebuilt(c) => 16 + c.reason.len(),
    }
}

/// Makes a turn larger than a page fit it: the content of each part over [`ELIDE_ABOVE`] bytes
/// (largest first, until the turn fits) is replaced by [`elision_marker`], which says how large
/// it was and which log offsets hold it, to read with ReadLog.
fn elide(messages: &mut [Message], budget: usize) {
    let mut used: usize = messages.iter().map(message_bytes).sum();
    let mut large: Vec<(usize, usize, usize)> = messages
        .iter()
        .enumerate()
        .flat_map(|(m, message)| {
            message
                .parts
                .iter()
                .enumerate()
                .map(move |(p, part)| (part_bytes(part), m, p))
        })
        .filter(|(bytes, _, _)| *bytes > ELIDE_ABOVE)
        .collect();
    large.sort_by_key(|&(bytes, _, _)| std::cmp::Reverse(bytes));
    for (bytes, m, p) in large {
        if used <= budget {
            break;
        }
        let (first, last) = (messages[m].first_offset, messages[m].last_offset);
        let marker = elision_marker(bytes, first, last);
        let part = &mut messages[m].parts[p];
        match part {
            Part::Text(text) | Part::Thought(text) => *text = marker,
            Part::Tool(t) => {
                t.content_json = serde_json::json!([{"type": "content", "content": {"type": "text", "text": marker}}]).to_string()
            }
            Part::Content { json, .. } => {
                *json = serde_json::json!({"type": "text", "text": marker}).to_string()
            }
            Part::Elicitation(e) => e.request_json = serde_json::json!({"elided": marker}).to_string(),
            Part::Permission(p) => p.tool_call_json = serde_json::json!({"elided": marker}).to_string(),
            Part::Attachment(_) | Part::Plan(_) | Part::Control(_) | Part::ContextRebuilt(_) => {
                continue;
            }
        }
        used = used - bytes + part_bytes(part);
    }
}

/// The documented form of elided content (docs/operations.md, "Large transcripts").
fn elision_marker(bytes: usize, first_offset: u64, last_offset: u64) -> String {
    format!(
        "[agent-harness: {bytes} bytes elided; too large for a transcript page. \
         Read them with ReadLog from offset {first_offset} to {last_offset}]"
    )
}

/// A page of a transcript.
#[derive(Debug, Clone)]
pub(crate) struct Transcript {
    pub messages: Vec<Message>,
    pub metadata: Metadata,
    pub status: SessionStatus,
    pub head: u64,
    pub next_page_token: String,
}

fn encode_turn_token(turn: u32) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("turn:{turn}"))
}

fn decode_turn_token(token: &str) -> Result<u32> {
    let bad = || Error::invalid("page_token is not a token this server issued");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    String::from_utf8(bytes)
        .ok()
        .and_then(|t| t.strip_prefix("turn:").and_then(|n| n.parse().ok()))
        .ok_or_else(bad)
}
