//! Metering: what agents report they used (tokens, cost), recorded per session and summed per
//! principal and per profile, and the budgets that bound a principal's spending per period.
//!
//! Money is held in millionths of a unit (`micros`), so sums are exact; agents send amounts as
//! JSON numbers and budgets are written as decimal strings.

use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use uuid::Uuid;

/// Millionths of a currency unit per unit.
pub const MICROS_PER_UNIT: i64 = 1_000_000;

/// The most tokens one report of an agent is taken for (a trillion: far past any turn). An
/// agent's figure is its own to make up; a larger one is clamped and logged, so that a few
/// absurd reports cannot push the sums to the bounds of the stores' integers.
pub const MAX_REPORTED_TOKENS: u64 = 1_000_000_000_000;

/// The most cost one report is taken to add, in micros (a billion units of its currency).
pub const MAX_REPORTED_COST_MICROS: i64 = 1_000_000_000_000_000;

/// Whose word a usage record is. The two are never added for one profile: where the model
/// proxy meters a session's calls, its agent's own reports are left out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum UsageSource {
    /// What the agent reported (`usage_update`, a prompt reply's `usage`).
    #[default]
    Agent,
    /// What the provider's answer said, read by the model proxy.
    ModelProxy,
}

impl UsageSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::ModelProxy => "model_proxy",
        }
    }

    /// A stored name back (an unknown one reads as the agent's: older rows have no source).
    pub fn parse(text: &str) -> Self {
        match text {
            "model_proxy" => Self::ModelProxy,
            _ => Self::Agent,
        }
    }
}

/// One usage record: what one report of the agent, or one model call the model proxy read,
/// added to a session's use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRecord {
    pub session_id: Uuid,
    /// The session's owner: who is charged.
    pub principal: String,
    pub profile: String,
    pub at: SystemTime,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Cost added by this report, in micros of `currency` (0 and `""` when none was sent).
    pub cost_micros: i64,
    pub currency: String,
    pub source: UsageSource,
    /// The turn (its prompt's or compact's action) it was spent in, when one was running.
    pub action_id: Option<super::ActionId>,
}

/// Which records a usage read sums.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageQuery {
    /// Only this principal's (`None`: everyone's).
    pub principal: Option<String>,
    /// Only this session's.
    pub session_id: Option<Uuid>,
    /// Only records made at or after this time.
    pub since: Option<SystemTime>,
}

/// The sums of one (session, principal, profile, source, currency) group of records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRow {
    pub session_id: Uuid,
    pub principal: String,
    pub profile: String,
    pub source: UsageSource,
    pub currency: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_micros: i64,
}

/// Summed usage: tokens, and cost per currency.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageTotals {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Micros per currency code; currencies with no cost reported are absent.
    pub costs: BTreeMap<String, i64>,
}

impl UsageTotals {
    pub fn add(&mut self, row: &UsageRow) {
        self.input_tokens = self.input_tokens.saturating_add(row.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(row.output_tokens);
        if !row.currency.is_empty() {
            let cost = self.costs.entry(row.currency.clone()).or_default();
            *cost = cost.saturating_add(row.cost_micros);
        }
    }

    pub fn tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

/// Usage summed four ways.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageReport {
    pub by_session: BTreeMap<Uuid, SessionTotals>,
    pub by_principal: BTreeMap<String, UsageTotals>,
    pub by_profile: BTreeMap<String, UsageTotals>,
    pub by_source: BTreeMap<UsageSource, UsageTotals>,
}

/// One session's sums: its owner and profile, its totals and their split by source.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionTotals {
    pub principal: String,
    pub profile: String,
    pub totals: UsageTotals,
    pub by_source: BTreeMap<UsageSource, UsageTotals>,
}

impl UsageReport {
    pub fn of(rows: &[UsageRow]) -> Self {
        let mut report = Self::default();
        for row in rows {
            let session =
                report
                    .by_session
                    .entry(row.session_id)
                    .or_insert_with(|| SessionTotals {
                        principal: row.principal.clone(),
                        profile: row.profile.clone(),
                        ..SessionTotals::default()
                    });
            session.totals.add(row);
            session.by_source.entry(row.source).or_default().add(row);
            report.by_source.entry(row.source).or_default().add(row);
            report
                .by_principal
                .entry(row.principal.clone())
                .or_default()
                .add(row);
            report
                .by_profile
                .entry(row.profile.clone())
                .or_default()
                .add(row);
        }
        report
    }
}

/// The cost an agent reported, converted to micros (rounded to the nearest; negative, NaN and
/// absurd amounts read as none).
pub fn amount_to_micros(amount: f64) -> Option<i64> {
    let micros = (amount * MICROS_PER_UNIT as f64).round();
    (0.0..9.0e18).contains(&micros).then_some(micros as i64)
}

/// Micros written as a decimal with at least two and at most six fraction digits.
pub fn micros_to_decimal(micros: i64) -> String {
    let sign = if micros < 0 { "-" } else { "" };
    let micros = micros.unsigned_abs();
    let whole = micros / MICROS_PER_UNIT as u64;
    let mut fraction = format!("{:06}", micros % MICROS_PER_UNIT as u64);
    while fraction.len() > 2 && fraction.ends_with('0') {
        fraction.pop();
    }
    format!("{sign}{whole}.{fraction}")
}

/// Reads a non-negative decimal with at most six fraction digits (`"25"`, `"25.00"`, `"0.125"`).
pub fn decimal_to_micros(text: &str) -> Option<i64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty()
        || fraction.len() > 6
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !fraction.bytes().all(|b| b.is_ascii_digit())
        || (text.contains('.') && fraction.is_empty())
    {
        return None;
    }
    let whole: i64 = whole.parse().ok()?;
    let fraction: i64 = format!("{fraction:0<6}").parse().ok()?;
    whole.checked_mul(MICROS_PER_UNIT)?.checked_add(fraction)
}

/// What one model costs, per million tokens, in micros of `currency` (the model proxy prices
/// each call it reads from the wire with it; docs/model-proxy.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelPrice {
    pub currency: String,
    pub input: i64,
    pub output: i64,
    /// Input tokens read from the provider's cache (their input price when not given).
    pub cache_read: i64,
    /// Input tokens written to the provider's cache (likewise).
    pub cache_write: i64,
}

impl ModelPrice {
    /// The cost in micros of a call that took these tokens (`input` counts the cache's too),
    /// rounded to the nearest micro.
    pub fn cost_micros(&self, input: u64, output: u64, cache_read: u64, cache_write: u64) -> i64 {
        let plain = input.saturating_sub(cache_read.saturating_add(cache_write));
        let per_million: u128 = [
            (plain, self.input),
            (output, self.output),
            (cache_read, self.cache_read),
            (cache_write, self.cache_write),
        ]
        .iter()
        .map(|&(tokens, price)| u128::from(tokens) * price.max(0) as u128)
        .sum();
        let micros = (per_million + 500_000) / 1_000_000;
        i64::try_from(micros)
            .unwrap_or(i64::MAX)
            .min(MAX_REPORTED_COST_MICROS)
    }
}

/// Prices by model name: an exact name, or a prefix written with a trailing `*`
/// (`claude-sonnet-4-5*` prices `claude-sonnet-4-5-20250929`); the exact name, else the
/// longest prefix, wins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PriceTable {
    exact: BTreeMap<String, ModelPrice>,
    prefixes: Vec<(String, ModelPrice)>,
}

impl PriceTable {
    pub fn insert(&mut self, pattern: &str, price: ModelPrice) {
        match pattern.strip_suffix('*') {
            Some(prefix) => {
                self.prefixes.push((prefix.to_owned(), price));
                self.prefixes
                    .sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
            }
            None => {
                self.exact.insert(pattern.to_owned(), price);
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.prefixes.is_empty()
    }

    /// The price of `model`, if the table names it.
    pub fn price_of(&self, model: &str) -> Option<&ModelPrice> {
        self.exact.get(model).or_else(|| {
            self.prefixes
                .iter()
                .find(|(prefix, _)| model.starts_with(prefix.as_str()))
                .map(|(_, price)| price)
        })
    }
}

/// How long a budget lasts before it starts again (calendar periods in UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    Day,
    /// From Monday 00:00 UTC.
    Week,
    Month,
}

impl Period {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "day" => Some(Self::Day),
            "week" => Some(Self::Week),
            "month" => Some(Self::Month),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
        }
    }

    /// When the period holding `now` began.
    pub fn start(self, now: SystemTime) -> SystemTime {
        let days = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() / 86_400;
        let start_day = match self {
            Self::Day => days,
            // 1970-01-01 was a Thursday: Monday is three days later in the cycle.
            Self::Week => days - (days + 3) % 7,
            Self::Month => {
                let (year, month, _) = civil_from_days(days as i64);
                days_from_civil(year, month, 1) as u64
            }
        };
        UNIX_EPOCH + Duration::from_secs(start_day * 86_400)
    }
}

/// (year, month 1–12, day 1–31) of a day count since 1970-01-01 (proleptic Gregorian).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The day count since 1970-01-01 of a civil date (inverse of [`civil_from_days`]).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let month = i64::from(month);
    let day_of_year =
        (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// A principal's spending limit per period: a cost in one currency, a number of tokens (input
/// plus output), or both; whichever is reached first spends the budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// Micros and currency.
    pub cost: Option<(i64, String)>,
    pub tokens: Option<u64>,
    pub period: Period,
}

impl Budget {
    /// Whether `used` (summed over the current period) reaches the budget.
    pub fn is_spent(&self, used: &UsageTotals) -> bool {
        let tokens_spent = self.tokens.is_some_and(|limit| used.tokens() >= limit);
        let cost_spent = self.cost.as_ref().is_some_and(|(limit, currency)| {
            used.costs.get(currency).is_some_and(|spent| spent >= limit)
        });
        tokens_spent || cost_spent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_price_table_prices_by_exact_name_then_longest_prefix_and_rounds_to_the_micro() {
        let price = |input: i64| ModelPrice {
            currency: "USD".into(),
            input,
            output: 15_000_000,
            cache_read: 300_000,
            cache_write: 3_750_000,
        };
        let mut table = PriceTable::default();
        table.insert("claude-*", price(1_000_000));
        table.insert("claude-sonnet-4-5*", price(3_000_000));
        table.insert("claude-sonnet-4-5-exact", price(5_000_000));
        assert_eq!(
            table.price_of("claude-sonnet-4-5-20250929").unwrap().input,
            3_000_000
        );
        assert_eq!(table.price_of("claude-haiku-4-5").unwrap().input, 1_000_000);
        assert_eq!(
            table.price_of("claude-sonnet-4-5-exact").unwrap().input,
            5_000_000
        );
        assert!(table.price_of("gpt-5").is_none());
        // 100 input (of which 20 read from the cache, 10 written), 10 output, at $3/M in,
        // $15/M out, $0.30/M cache reads, $3.75/M cache writes: 210 + 150 + 6 + 37.5 micros.
        let sonnet = table.price_of("claude-sonnet-4-5").unwrap();
        assert_eq!(sonnet.cost_micros(100, 10, 20, 10), 404);
        assert_eq!(sonnet.cost_micros(0, 0, 0, 0), 0);
        assert_eq!(
            sonnet.cost_micros(u64::MAX, u64::MAX, 0, 0),
            MAX_REPORTED_COST_MICROS
        );
    }

    fn at(text_days: i64, seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(text_days as u64 * 86_400 + seconds)
    }

    #[test]
    fn decimals_read_exactly_and_anything_else_is_refused() {
        assert_eq!(decimal_to_micros("25.00"), Some(25_000_000));
        assert_eq!(decimal_to_micros("25"), Some(25_000_000));
        assert_eq!(decimal_to_micros("0.000001"), Some(1));
        for bad in ["", "-1", "1.", ".5", "1.0000001", "1e3", "ten", "1,5", " 1"] {
            assert_eq!(decimal_to_micros(bad), None, "{bad:?}");
        }
        assert_eq!(micros_to_decimal(25_000_000), "25.00");
        assert_eq!(micros_to_decimal(45_000), "0.045");
        assert_eq!(amount_to_micros(0.045), Some(45_000));
        assert_eq!(amount_to_micros(-1.0), None);
        assert_eq!(amount_to_micros(f64::NAN), None);
    }

    #[test]
    fn a_period_starts_at_midnight_utc_of_its_first_day() {
        // 2026-12-02 is day 20_789, a Wednesday.
        let now = at(20_789, 5_000);
        assert_eq!(civil_from_days(20_789), (2026, 12, 2));
        assert_eq!(Period::Day.start(now), at(20_789, 0));
        assert_eq!(Period::Week.start(now), at(20_787, 0));
        assert_eq!(Period::Month.start(now), at(20_788, 0));
        assert_eq!(days_from_civil(2024, 2, 29), 19_782);
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    }

    #[test]
    fn a_budget_is_spent_once_either_limit_is_reached_in_its_currency() {
        let budget = Budget {
            cost: Some((1_000_000, "USD".into())),
            tokens: Some(100),
            period: Period::Month,
        };
        let mut used = UsageTotals::default();
        assert!(!budget.is_spent(&used));
        used.costs.insert("EUR".into(), 5_000_000);
        assert!(!budget.is_spent(&used), "another currency does not count");
        used.costs.insert("USD".into(), 1_000_000);
        assert!(budget.is_spent(&used));
        let mut tokens = UsageTotals {
            input_tokens: 60,
            output_tokens: 40,
            ..Default::default()
        };
        assert!(budget.is_spent(&tokens));
        tokens.output_tokens = 39;
        assert!(!budget.is_spent(&tokens));
    }
}
