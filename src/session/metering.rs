//! Metering on the engine's side: the budget check before a prompt is taken, and the per-profile
//! counters of what agents reported. What a session reports is recorded by its actor
//! (`actor::metering`), in the batch that logs the report.

use std::{fmt, sync::Arc, time::SystemTime};

use super::EngineContext;
use crate::domain::{
    Error, ErrorCode, Principal, PrincipalKind, Result,
    usage::{Budget, UsageQuery, UsageReport, micros_to_decimal},
};

pub(crate) const USAGE_TOKENS: &str = "agent_harness_usage_tokens_total";
pub(crate) const USAGE_COST: &str = "agent_harness_usage_cost_micros_total";
/// What a refusal at admission says was not done.
pub(crate) const NOT_TAKEN: &str = "the action was not taken";

/// Where budgets come from: the tokens file as it stands now (reloads apply at once).
#[derive(Clone, Default)]
pub(crate) struct BudgetSource(Option<Arc<BudgetLookup>>);

/// A principal's budget, looked up now.
type BudgetLookup = dyn Fn(&str) -> Option<Budget> + Send + Sync;

impl BudgetSource {
    pub(crate) fn new(lookup: impl Fn(&str) -> Option<Budget> + Send + Sync + 'static) -> Self {
        Self(Some(Arc::new(lookup)))
    }

    pub(crate) fn budget(&self, principal: &str) -> Option<Budget> {
        self.0.as_ref().and_then(|lookup| lookup(principal))
    }
}

impl fmt::Debug for BudgetSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "BudgetSource(tokens file)"
        } else {
            "BudgetSource(none)"
        })
    }
}

impl EngineContext {
    /// Refuses with BUDGET_EXHAUSTED when `owner`'s budget for the current period is spent.
    /// Called before anything of a prompt or a compaction is stored (`refused` says what was
    /// not done), and by the model proxy before each model call.
    pub(crate) async fn check_budget(&self, owner: &str, refused: &str) -> Result<()> {
        let Some(budget) = self.budgets.budget(owner) else {
            return Ok(());
        };
        let since = budget.period.start(SystemTime::now());
        let query = UsageQuery {
            principal: Some(owner.to_owned()),
            since: Some(since),
            ..UsageQuery::default()
        };
        let rows = self.store.usage(&query).await?;
        let used = UsageReport::of(&rows)
            .by_principal
            .remove(owner)
            .unwrap_or_default();
        if !budget.is_spent(&used) {
            return Ok(());
        }
        let mut limits = Vec::new();
        if let Some((micros, currency)) = &budget.cost {
            let spent = used.costs.get(currency).copied().unwrap_or(0);
            limits.push(format!(
                "{} of {} {currency}",
                micros_to_decimal(spent),
                micros_to_decimal(*micros)
            ));
        }
        if let Some(tokens) = budget.tokens {
            limits.push(format!("{} of {tokens} tokens", used.tokens()));
        }
        Err(Error::new(
            ErrorCode::BudgetExhausted,
            format!(
                "the budget of {owner:?} for this {} is spent ({}); {refused}",
                budget.period.as_str(),
                limits.join(", ")
            ),
        )
        .with("principal", owner)
        .with("period", budget.period.as_str()))
    }
}

/// Counts what an agent reported, per profile only (never per session or principal: those would
/// grow the series without bound).
pub(crate) fn usage_reported(profile: &str, input: u64, output: u64, cost: Option<(&str, i64)>) {
    if input > 0 {
        metrics::counter!(USAGE_TOKENS, "profile" => profile.to_owned(), "direction" => "input")
            .increment(input);
    }
    if output > 0 {
        metrics::counter!(USAGE_TOKENS, "profile" => profile.to_owned(), "direction" => "output")
            .increment(output);
    }
    if let Some((currency, micros)) = cost
        && micros > 0
    {
        metrics::counter!(USAGE_COST, "profile" => profile.to_owned(), "currency" => currency_label(currency))
            .increment(micros as u64);
    }
}

/// What the model proxy of a session's box asks of the engine (docs/model-proxy.md): the
/// owner's budget before each model call, and a place for what each call took. Its usage is
/// the provider's own word, recorded in place of what the agent reports (the actor leaves an
/// agent's reports out for such a profile), so the two are never added together.
pub(crate) struct SessionMeter {
    pub(crate) ctx: Arc<EngineContext>,
    pub(crate) session: uuid::Uuid,
    pub(crate) owner: String,
    pub(crate) profile: String,
    /// Calls ended whose usage is still on its way to the store: the next call of the session
    /// waits for them, so its budget check counts them (an agent's calls follow one another).
    pub(crate) storing: Arc<Storing>,
    /// The session's actor: told when a call is refused for a spent budget, so the turn ends
    /// with BUDGET_EXHAUSTED whatever the agent makes of the refusal.
    pub(crate) actor: tokio::sync::mpsc::WeakSender<super::Command>,
    /// The running turn, whose spans each call's `model_call` span hangs under.
    pub(crate) turn: TurnSlot,
}

/// The running turn as the session's model proxy sees it (set by the actor while a turn runs):
/// each call's usage is charged to it and its `model_call` span hangs under it.
pub(crate) type TurnSlot = Arc<std::sync::Mutex<Option<TurnSpans>>>;

/// The running turn's spans: its log span and, when traced, its trace context.
#[derive(Clone)]
pub(crate) struct TurnSpans {
    pub(crate) action_id: crate::domain::ActionId,
    pub(crate) log: tracing::Span,
    pub(crate) trace: Option<(super::traces::Traces, opentelemetry::Context)>,
}

/// Usage records on their way to the store.
#[derive(Default)]
pub(crate) struct Storing {
    count: std::sync::atomic::AtomicUsize,
    done: tokio::sync::Notify,
}

/// The longest a budget check waits for the session's earlier calls' usage to be stored.
const STORING_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl crate::model_proxy::Meter for SessionMeter {
    fn admit(
        &self,
        _session: uuid::Uuid,
    ) -> futures::future::BoxFuture<'static, Result<(), String>> {
        let ctx = self.ctx.clone();
        let owner = self.owner.clone();
        let storing = self.storing.clone();
        let actor = self.actor.clone();
        Box::pin(async move {
            let stored = async {
                loop {
                    let done = storing.done.notified();
                    if storing.count.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                        return;
                    }
                    done.await;
                }
            };
            let _ = tokio::time::timeout(STORING_WAIT, stored).await;
            let Err(error) = ctx
                .check_budget(&owner, "the model call was not forwarded")
                .await
            else {
                return Ok(());
            };
            let reason = format!("{}: {}", error.code.reason(), error.message);
            if error.code == ErrorCode::BudgetExhausted
                && let Some(actor) = actor.upgrade()
            {
                // The turn is failed before the agent hears of the refusal, so its own answer
                // (an error, or a retry) cannot come first.
                let (reply, done) = tokio::sync::oneshot::channel();
                let told = actor.send(super::Command::BudgetSpent {
                    reason: reason.clone(),
                    reply,
                });
                let _ = tokio::time::timeout(STORING_WAIT, async {
                    if told.await.is_ok() {
                        let _ = done.await;
                    }
                })
                .await;
            }
            Err(reason)
        })
    }

    fn record(&self, call: crate::model_proxy::ModelCall) {
        let turn = self.turn.lock().unwrap_or_else(|e| e.into_inner()).clone();
        self.trace(&call, turn.as_ref());
        let Some(usage) = call.usage else {
            return;
        };
        let record = crate::domain::usage::UsageRecord {
            session_id: self.session,
            principal: self.owner.clone(),
            profile: self.profile.clone(),
            at: crate::domain::now(),
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cost_micros: 0,
            currency: String::new(),
            source: crate::domain::usage::UsageSource::ModelProxy,
            // The turn running as the call ends (calls outside a turn have none).
            action_id: turn.map(|turn| turn.action_id),
        };
        // Priced when the table names the model the answer named.
        let price = usage
            .model
            .as_deref()
            .and_then(|model| self.ctx.prices.price_of(model));
        let record = match price {
            Some(price) => crate::domain::usage::UsageRecord {
                cost_micros: price.cost_micros(
                    usage.input_tokens,
                    usage.output_tokens,
                    usage.cache_read_tokens,
                    usage.cache_write_tokens,
                ),
                currency: price.currency.clone(),
                ..record
            },
            None => record,
        };
        let ctx = self.ctx.clone();
        let profile = self.profile.clone();
        let storing = self.storing.clone();
        // Counted now, before the agent reads the end of the answer.
        storing
            .count
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tokio::spawn(async move {
            let batch = crate::store::Batch {
                usage: vec![record.clone()],
                ..Default::default()
            };
            match ctx.store.commit(record.session_id, batch).await {
                Ok(()) => usage_reported(
                    &profile,
                    record.input_tokens,
                    record.output_tokens,
                    (!record.currency.is_empty())
                        .then_some((record.currency.as_str(), record.cost_micros)),
                ),
                Err(error) => tracing::warn!(
                    session_id = %record.session_id,
                    %error,
                    "the model proxy's usage could not be stored"
                ),
            }
            storing
                .count
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            storing.done.notify_waiters();
        });
    }
}

impl SessionMeter {
    /// The call's `model_call` span under the running turn's (a log line in the turn's span,
    /// and a trace span when traces are exported).
    fn trace(&self, call: &crate::model_proxy::ModelCall, turn: Option<&TurnSpans>) {
        let usage = call.usage.clone().unwrap_or_default();
        let model = usage.model.as_deref().unwrap_or("");
        let took_ms = call.took.as_millis() as u64;
        let log = || {
            tracing::info!(
                session_id = %self.session,
                provider = call.provider.name(),
                model,
                status = call.status,
                input_tokens = usage.input_tokens,
                output_tokens = usage.output_tokens,
                took_ms,
                "model call"
            )
        };
        let Some(turn) = turn else {
            return log();
        };
        turn.log.in_scope(log);
        if let Some((traces, parent)) = &turn.trace {
            use opentelemetry::KeyValue;
            let started = SystemTime::now()
                .checked_sub(call.took)
                .unwrap_or_else(SystemTime::now);
            let error = (call.status >= 400).then(|| format!("status {}", call.status));
            traces.finished(
                "model_call",
                parent,
                vec![
                    KeyValue::new("agent_harness.provider", call.provider.name()),
                    KeyValue::new("agent_harness.model", model.to_owned()),
                    KeyValue::new("http.response.status_code", i64::from(call.status)),
                    KeyValue::new("agent_harness.input_tokens", usage.input_tokens as i64),
                    KeyValue::new("agent_harness.output_tokens", usage.output_tokens as i64),
                ],
                started,
                error.as_deref(),
            );
        }
    }
}

/// A currency code as a label: three ASCII capitals, else `other` (the agent writes it).
fn currency_label(currency: &str) -> String {
    if currency.len() == 3 && currency.bytes().all(|b| b.is_ascii_uppercase()) {
        currency.to_owned()
    } else {
        "other".to_owned()
    }
}

/// A usage read: the sums, and the budget of the principal asked about.
pub(crate) struct UsageAnswer {
    pub report: UsageReport,
    pub budget: Option<BudgetStatus>,
}

/// A principal's budget and its current period.
pub(crate) struct BudgetStatus {
    pub principal: String,
    pub budget: Budget,
    pub period_start: SystemTime,
    pub used: crate::domain::usage::UsageTotals,
}

impl super::Sessions {
    /// Usage as `caller` may see it: `asked` names a principal (empty: the caller's own; for
    /// `local` or a service acting for nobody, everyone's). A user may ask only about themselves.
    pub(crate) async fn usage(
        &self,
        caller: &Principal,
        asked: &str,
        since: Option<SystemTime>,
    ) -> Result<UsageAnswer> {
        let whose = match (asked.is_empty(), caller.kind) {
            (true, PrincipalKind::User) => Some(caller.id.clone()),
            (true, _) => caller.acting_user.clone(),
            (false, PrincipalKind::User) if asked != caller.id => {
                return Err(Error::new(
                    ErrorCode::Forbidden,
                    "a user may read only their own usage",
                ));
            }
            (false, PrincipalKind::User | PrincipalKind::Service | PrincipalKind::Local) => {
                Some(asked.to_owned())
            }
            (false, _) => {
                return Err(Error::new(
                    ErrorCode::Forbidden,
                    "this principal may not read usage",
                ));
            }
        };
        let ctx = self.context();
        let query = UsageQuery {
            principal: whose.clone(),
            since,
            ..UsageQuery::default()
        };
        let report = UsageReport::of(&ctx.store.usage(&query).await?);
        let budget = match whose.and_then(|p| ctx.budgets.budget(&p).map(|b| (p, b))) {
            Some((principal, budget)) => {
                let period_start = budget.period.start(SystemTime::now());
                let query = UsageQuery {
                    principal: Some(principal.clone()),
                    since: Some(period_start),
                    ..UsageQuery::default()
                };
                let used = UsageReport::of(&ctx.store.usage(&query).await?)
                    .by_principal
                    .remove(&principal)
                    .unwrap_or_default();
                Some(BudgetStatus {
                    principal,
                    budget,
                    period_start,
                    used,
                })
            }
            None => None,
        };
        Ok(UsageAnswer { report, budget })
    }
}
