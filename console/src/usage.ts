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
  if (usage.cost) {
    const money = new Intl.NumberFormat("en", {
      style: "currency",
      currency: usage.cost.currency || "USD",
      maximumFractionDigits: 4,
    });
    let shown: string;
    try {
      shown = money.format(usage.cost.amount);
    } catch {
      shown = `${usage.cost.amount} ${usage.cost.currency}`;
    }
    parts.push(`cost ${shown}`);
  }
  return parts.join(" · ");
}
