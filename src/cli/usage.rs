//! `usage`: what sessions used (tokens, cost per currency), per principal, profile and source,
//! and the budget of the principal asked about.

use clap::Args;

use super::{Failure, Outcome, ServerArgs, exit};
use crate::pb::v1 as pb;

#[derive(Args)]
pub struct UsageArgs {
    /// Whose usage: a principal (a user reads only their own; `local` and services may name
    /// anyone). Without it: your own, or for `local`, everyone's.
    #[arg(long)]
    principal: Option<String>,
    /// Only what was used since this long ago (e.g. `24h`, `7d`).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    since: Option<std::time::Duration>,
    /// List every session too.
    #[arg(long)]
    sessions: bool,
    /// The whole answer as one JSON object.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    server: ServerArgs,
}

pub(crate) async fn run(args: UsageArgs) -> Outcome {
    let since = match args.since {
        Some(ago) => Some(
            std::time::SystemTime::now()
                .checked_sub(ago)
                .ok_or_else(|| Failure::new(exit::USAGE, "--since reaches before 1970"))?,
        ),
        None => None,
    };
    let mut client = args.server.connect().await?;
    let answer = client
        .get_usage(pb::GetUsageRequest {
            principal: args.principal.unwrap_or_default(),
            since: since.map(prost_types::Timestamp::from),
        })
        .await?
        .into_inner();
    if args.json {
        outln!("{}", super::json::usage(&answer));
        return Ok(0);
    }
    if answer.principals.is_empty() && answer.budget.is_none() {
        outln!(
            "nothing used{}",
            if since.is_some() { " in that time" } else { "" }
        );
        return Ok(0);
    }
    for principal in &answer.principals {
        outln!(
            "{:<24} {}",
            principal.principal,
            totals(principal.totals.as_ref())
        );
    }
    if !answer.profiles.is_empty() {
        outln!("by profile:");
        for profile in &answer.profiles {
            outln!(
                "  {:<22} {}",
                profile.profile,
                totals(profile.totals.as_ref())
            );
        }
    }
    if !answer.sources.is_empty() {
        outln!("by source:");
        for source in &answer.sources {
            outln!(
                "  {:<22} {}",
                source_name(source.source()),
                totals(source.totals.as_ref())
            );
        }
    }
    if args.sessions {
        outln!("by session:");
        for session in &answer.sessions {
            outln!(
                "  {} {} {}  {}",
                session.session_id,
                session.principal,
                session.profile,
                totals(session.totals.as_ref())
            );
        }
    }
    if let Some(budget) = &answer.budget {
        let mut limits = Vec::new();
        if let Some(cost) = &budget.cost_limit {
            limits.push(format!("{} {}", cost.amount, cost.currency));
        }
        if let Some(tokens) = budget.token_limit {
            limits.push(format!("{tokens} tokens"));
        }
        outln!(
            "budget of {} per {}: {}; this {} used {}{}",
            budget.principal,
            budget.period,
            limits.join(" or "),
            budget.period,
            totals(budget.used.as_ref()),
            if budget.exhausted { " — spent" } else { "" }
        );
    }
    Ok(0)
}

fn totals(totals: Option<&pb::UsageTotals>) -> String {
    let Some(totals) = totals else {
        return "-".to_owned();
    };
    let mut text = format!(
        "{} in + {} out tokens",
        totals.input_tokens, totals.output_tokens
    );
    for cost in &totals.costs {
        text.push_str(&format!(", {} {}", cost.amount, cost.currency));
    }
    text
}

fn source_name(source: pb::UsageSource) -> String {
    super::json::enum_name(source.as_str_name(), "USAGE_SOURCE_")
}
