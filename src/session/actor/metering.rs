//! What the agent reports it used, recorded in the same batch as the frames that report it (so
//! a reader that saw the frame sees its usage): a `usage_update`'s cumulative cost, recorded as
//! what it adds to the previous report, and a prompt reply's token counts. Records are charged
//! to the session's owner and profile.

use serde_json::Value;

use super::{Actor, Out};
use crate::{
    acp::views::{Envelope, Params, PromptResult, Reply, UpdateCost, UpdateParams, view},
    domain::{
        ActionId,
        usage::{
            MAX_REPORTED_COST_MICROS, MAX_REPORTED_TOKENS, UsageQuery, UsageRecord,
            amount_to_micros,
        },
    },
    session::metering::usage_reported,
    store::UsageRecord as Record,
};

/// Longest currency code recorded.
const MAX_CURRENCY_CHARS: usize = 16;

impl Actor {
    fn usage_record(&self, input: u64, output: u64, cost: i64, currency: &str) -> UsageRecord {
        UsageRecord {
            session_id: self.record.id,
            principal: self.record.owner.clone(),
            profile: self.record.profile.clone(),
            at: crate::domain::now(),
            input_tokens: input,
            output_tokens: output,
            cost_micros: cost,
            currency: currency.to_owned(),
            source: crate::domain::usage::UsageSource::Agent,
            action_id: self.work.turn.as_ref().map(|turn| turn.action_id),
        }
    }

    /// Adds to `out` the usage these inbound frames report; returns it, to be counted once
    /// stored.
    pub(super) async fn meter(&mut self, out: &mut Out, frames: &[Value]) -> Vec<Record> {
        let mut records = Vec::new();
        // Its model calls go through the model proxy, which records what the provider said
        // each took: the agent's own word is left in its frames, never added to that.
        if self.proxied.load(std::sync::atomic::Ordering::SeqCst) {
            return records;
        }
        for frame in frames {
            let envelope: Envelope = view(frame);
            match envelope.method.ok() {
                Some("session/update") => {
                    let params: Params<UpdateParams> = view(frame);
                    if let Some(update) = params.params.and_then(|p| p.update)
                        && update.session_update == Some("usage_update")
                        && let Some(cost) = &update.cost
                        && let Some(record) = self.cost_record(cost).await
                    {
                        records.push(record);
                    }
                }
                None => {
                    let turn = self.work.turn.as_ref().map(|t| t.action_id);
                    let answers_turn = envelope
                        .id
                        .as_ref()
                        .and_then(ActionId::from_jsonrpc_id)
                        .is_some_and(|id| Some(id) == turn);
                    let reply: Reply<PromptResult> = view(frame);
                    if answers_turn
                        && let Some(usage) = reply.result.as_ref().and_then(|r| r.usage.as_ref())
                    {
                        let input = self.sane_tokens("input", usage.input_tokens.unwrap_or(0));
                        let output = self.sane_tokens("output", usage.output_tokens.unwrap_or(0));
                        if input > 0 || output > 0 {
                            records.push(self.usage_record(input, output, 0, ""));
                        }
                    }
                }
                Some(_) => {}
            }
        }
        out.batch.usage.extend(records.iter().cloned());
        records
    }

    /// Counts recorded usage in the metrics (per profile).
    pub(super) fn metered(&self, records: &[Record]) {
        for r in records {
            let cost = (!r.currency.is_empty()).then_some((r.currency.as_str(), r.cost_micros));
            usage_reported(&self.record.profile, r.input_tokens, r.output_tokens, cost);
        }
    }

    /// Forgets the cost last seen (its record may not have been stored).
    pub(super) fn unmetered(&mut self) {
        self.cost_seen = None;
    }

    /// A `usage_update` cost: a record of what it adds to the cost reported before, if anything.
    async fn cost_record(&mut self, cost: &UpdateCost<'_>) -> Option<UsageRecord> {
        let (Some(amount), Some(currency)) = (cost.amount, cost.currency) else {
            return None;
        };
        let total = amount_to_micros(amount)?;
        // The agent writes the code; a longer text is no currency code anyone branches on.
        let currency: String = currency.chars().take(MAX_CURRENCY_CHARS).collect();
        let previous = match &self.cost_seen {
            Some((seen, micros)) if *seen == currency => *micros,
            Some(_) => 0,
            None => self.recorded_cost(&currency).await,
        };
        // A total below the previous one: the agent started counting again (a new ACP session).
        let added = if total >= previous {
            total - previous
        } else {
            total
        };
        self.cost_seen = Some((currency.clone(), total));
        let added = if added > MAX_REPORTED_COST_MICROS {
            tracing::warn!(session = %self.record.id, added_micros = added,
                kept_micros = MAX_REPORTED_COST_MICROS,
                "the agent reported a cost past any sane figure; clamped");
            MAX_REPORTED_COST_MICROS
        } else {
            added
        };
        (added > 0).then(|| self.usage_record(0, 0, added, &currency))
    }

    /// Tokens an agent reported, clamped to [`MAX_REPORTED_TOKENS`] (and logged when they were).
    fn sane_tokens(&self, direction: &str, tokens: u64) -> u64 {
        if tokens <= MAX_REPORTED_TOKENS {
            return tokens;
        }
        tracing::warn!(session = %self.record.id, direction, reported = tokens,
            kept = MAX_REPORTED_TOKENS, "the agent reported more tokens than any turn uses; clamped");
        MAX_REPORTED_TOKENS
    }

    /// The cost of this session recorded so far in `currency` (what the reports added sums to
    /// the last total reported).
    async fn recorded_cost(&self, currency: &str) -> i64 {
        let query = UsageQuery {
            session_id: Some(self.record.id),
            ..UsageQuery::default()
        };
        match self.ctx.store.usage(&query).await {
            Ok(rows) => rows
                .iter()
                .filter(|r| r.currency == currency)
                .fold(0i64, |sum, r| sum.saturating_add(r.cost_micros)),
            Err(error) => {
                tracing::warn!(session = %self.record.id, %error, "could not read the recorded cost; counting the reported total as new");
                0
            }
        }
    }
}
