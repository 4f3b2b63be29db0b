//! The folded transcript (SPEC §9.3), paged by turns.

use base64::Engine;
use uuid::Uuid;

use super::{DEFAULT_PAGE_SIZE, MAX_LOG_LIMIT, MAX_PAGE_SIZE, Sessions};
use crate::{
    acp::fold::{Fold, Message, Metadata, page_turns},
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
        let fold = self.fold(found.id()).await?;
        let (messages, next_page_token) = match page_turns(fold.turns(), after_turn, page_size) {
            Some((from, to)) => (
                fold.turn_range(from, to).cloned().collect(),
                if to < fold.turns() {
                    encode_turn_token(to)
                } else {
                    String::new()
                },
            ),
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

    /// Folds a session's whole log, page by page.
    async fn fold(&self, session_id: Uuid) -> Result<Fold> {
        let mut fold = Fold::new(self.ctx.meta_key.clone());
        let mut after = 0;
        loop {
            let page = self
                .ctx
                .store
                .read_log(session_id, after, MAX_LOG_LIMIT)
                .await?;
            for entry in &page {
                fold.apply(entry);
            }
            match page.last() {
                Some(last) if page.len() == MAX_LOG_LIMIT => after = last.offset,
                _ => return Ok(fold),
            }
        }
    }
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
