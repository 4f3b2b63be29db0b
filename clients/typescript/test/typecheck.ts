// Compiled (never run) by scripts/test clients with tsc --strict: the package's types (src/index.d.ts)
// fit the way its README uses it.
import { AgentHarnessClient, HarnessError, StopReason, Code } from "@agent-harness/client";
const client = new AgentHarnessClient({ baseUrl: "http://127.0.0.1:50051" });
async function main(): Promise<void> {
  const session = await client.createSession({ profile: "mock", cwd: "/" });
  const sent = await client.prompt(session.id, "hi", { attachments: ["https://x/a.png"] });
  for await (const event of client.subscribe(session.id, { view: "messages" })) {
    if (event.event.case === "turnEnded" && event.event.value.requestId === sent.actionId) {
      const r: StopReason = event.event.value.stopReason;
      console.log(r);
      break;
    }
  }
  const forked = await client.forkSession(session.id, { name: "branch" });
  console.log(forked.id);
  try { await client.getSession("x"); } catch (e) { if (e instanceof HarnessError && e.code === Code.NotFound) console.log(e.reason); }
}
void main;
async function turn(): Promise<void> {
  const fromEnv = AgentHarnessClient.fromEnv({ timeoutMs: 1000 });
  const result = await fromEnv.runTurn("id", "hello", { timeoutMs: 1000, onEvent: (e) => console.log(e.offset) });
  const reason: StopReason = result.stopReason;
  console.log(reason, result.stopReasonName, result.text, result.toolCalls.map((t) => t.title), result.usage?.usedTokens);
  const waited = await new AgentHarnessClient("http://127.0.0.1:50051").prompt("id", "x", { wait: true });
  console.log(waited.ok);
}
void turn;
async function helpers(): Promise<void> {
  const { eventOf, pendingPermissions, toolCalls, partsOf } = await import("@agent-harness/client");
  const c = new AgentHarnessClient("http://127.0.0.1:50051");
  await c.runTurn("id", "x", {
    timeoutMs: null,
    onEvent: async (response) => {
      const event = eventOf(response);
      for (const p of pendingPermissions(event.message)) await c.respondToPermission("id", p.requestId, p.options[0].optionId);
      console.log(event.kind, toolCalls(event.message).map((t) => t.toolCallId), partsOf(event.message, "text").map((t) => t.text));
    },
  });
  const usage = await c.getUsage({ since: new Date() });
  console.log(usage.sources.map((s) => s.totals?.inputTokens));
}
void helpers;
