// Runs one turn and prints the agent's final text and stop reason.
//   AGENT_HARNESS_SERVER=http://127.0.0.1:50051 node run-turn.mjs "Say hello"
import { AgentHarnessClient, HarnessError } from "@agent-harness/client";

try {
  const client = AgentHarnessClient.fromEnv();
  const session = await client.createSession({ profile: process.env.PROFILE ?? "mock", cwd: process.cwd() });
  const result = await client.runTurn(session.id, process.argv[2] ?? "hello");
  console.log(result.text);
  console.log(`stop reason: ${result.stopReasonName}`);
  process.exitCode = result.ok ? 0 : 1;
} catch (error) {
  if (!(error instanceof HarnessError)) throw error;
  console.error(`error: ${error.message}`); // one line, e.g. "UNAVAILABLE: ..."
  process.exitCode = 2;
}
