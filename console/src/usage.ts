// What the session has used: the agent's latest `usage_update` (tokens in the context, the
// window's size, and the cumulative cost when the agent reports one), as the session carries it.

import type { Usage } from "./gen/agent_harness/v1/session_pb.js";

const count = new Intl.NumberFormat("en");

/** One line, or "" when the agent has reported nothing. */
export function usageText(usage: Usage | undefined): string {
  if (!usage || (usage.usedTokens === 0n && usage.contextSize === 0n && !usage.cost)) return "";
  const parts: string[] = [];
  if (usage.contextSize > 0n) {
    const share = Number((usage.usedTokens * 1000n) / usage.contextSize) / 10;
    parts.push(`context ${count.format(usage.usedTokens)} / ${count.format(usage.contextSize)} tokens (${share}%)`);
  } else {
    parts.push(`context ${count.format(usage.usedTokens)} tokens`);
  }
  if (usage.cost) parts.push(`cost ${costText(usage.cost.amount, usage.cost.currency)}`);
  return parts.join(" · ");
}

const plainAmount = new Intl.NumberFormat("en", { maximumFractionDigits: 4 });

/**
 * An amount in its currency. The agent writes the currency code: one `Intl` does not know
 * (`U<b>`, an empty one) throws from the formatter's constructor, so the amount is then shown
 * without it — a bad code never breaks the page.
 */
export function costText(amount: number, currency: string): string {
  try {
    return new Intl.NumberFormat("en", { style: "currency", currency: currency || "USD", maximumFractionDigits: 4 })
      .format(amount);
  } catch {
    return Number.isFinite(amount) ? plainAmount.format(amount) : String(amount);
  }
}

/** What a session spent, as GetUsage sums it: "used 1,200 in + 310 out tokens" ("" for none). */
export function spentText(totals: { inputTokens: bigint; outputTokens: bigint } | undefined): string {
  if (!totals || (totals.inputTokens === 0n && totals.outputTokens === 0n)) return "";
  return `used ${count.format(totals.inputTokens)} in + ${count.format(totals.outputTokens)} out tokens`;
}
