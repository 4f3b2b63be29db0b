// The peer comparison of agent-harness-bench (`--only peers`, docs/benchmarks.md): one client
// process drives the same ACP agent (the Python SDK's example agent) through
//
//   direct         the agent's stdio, JSON-RPC lines
//   harness-log    agent-harness: Control, then the response entry on a LOG-view Subscribe
//   harness-msgs   agent-harness: Control, then TurnEnded on a MESSAGES-view Subscribe
//   sandbox-agent  Rivet sandbox-agent: POST /v1/acp/{id} (answered with the response), SSE open
//   acpx           acpx's library (createAcpRuntime), one persistent session, runTurn to its end
//
// and times each turn from sending the prompt to seeing its end. Turns are interleaved in
// blocks (every system, then every system again) so load on the shared machine hits all alike.
// Node is the client language because acpx exists only as a Node library: in Node every peer is
// driven in-process; from another language acpx could only be reached by starting its CLI (a
// Node process) per turn. It prints one JSON object on stdout: per system, the sorted samples in
// microseconds, and the versions it ran.
//
// Inputs (environment): PEERS_AGENT (JSON array: the agent's argv), PEERS_HARNESS (host:port of
// a serve with profile `echo` running that agent), PEERS_CWD, PEERS_SANDBOX_AGENT (its binary),
// PEERS_SCRATCH (a directory to use), PEERS_TURNS, PEERS_WARMUP, PEERS_BLOCKS, PEERS_SYSTEMS
// (comma-separated subset), PEERS_SLOW_TURNS (turns of acpx).

import { spawn } from "node:child_process";
import { mkdirSync, writeFileSync, chmodSync, readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { join, dirname } from "node:path";
import { createRequire } from "node:module";

const env = process.env;
const agent = JSON.parse(env.PEERS_AGENT);
const cwd = env.PEERS_CWD;
const scratch = env.PEERS_SCRATCH;
const turns = Number(env.PEERS_TURNS ?? 1000);
const warmup = Number(env.PEERS_WARMUP ?? 50);
const blocks = Number(env.PEERS_BLOCKS ?? 4);
// acpx ends each turn about 1 s after the agent's reply (measured: see docs/benchmarks.md), so it
// runs fewer turns, in the same blocks.
const slowTurns = Number(env.PEERS_SLOW_TURNS ?? 40);
const slow = new Set(["acpx"]);
const wanted = (env.PEERS_SYSTEMS ?? "direct,harness-log,harness-msgs,sandbox-agent,acpx").split(",");
const TEXT = "ping";
const TIMEOUT_MS = 60_000;

const now = () => process.hrtime.bigint();
const micros = (start) => Number((now() - start) / 1000n);

function withTimeout(promise, what) {
  let timer;
  const limit = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${TIMEOUT_MS} ms`)), TIMEOUT_MS);
  });
  return Promise.race([promise, limit]).finally(() => clearTimeout(timer));
}

// ---------------------------------------------------------------------------------------------
// direct: JSON-RPC lines over the agent's stdio.

async function direct() {
  const child = spawn(agent[0], agent.slice(1), { cwd, stdio: ["pipe", "pipe", "ignore"] });
  const waiting = new Map();
  createInterface({ input: child.stdout }).on("line", (line) => {
    const frame = JSON.parse(line);
    if (frame.method === undefined && waiting.has(frame.id)) {
      waiting.get(frame.id)(frame);
      waiting.delete(frame.id);
    }
  });
  let next = 0;
  const call = (method, params) => {
    const id = next++;
    const answer = new Promise((resolve) => waiting.set(id, resolve));
    child.stdin.write(JSON.stringify({ jsonrpc: "2.0", id, method, params }) + "\n");
    return withTimeout(answer, `direct ${method}`);
  };
  await call("initialize", { protocolVersion: 1, clientCapabilities: {} });
  const { result } = await call("session/new", { cwd, mcpServers: [] });
  const sessionId = result.sessionId;
  return {
    turn: async () => {
      const start = now();
      const answer = await call("session/prompt", { sessionId, prompt: [{ type: "text", text: TEXT }] });
      if (!answer.result) throw new Error(`direct: ${JSON.stringify(answer)}`);
      return micros(start);
    },
    close: async () => child.kill("SIGKILL"),
  };
}

// ---------------------------------------------------------------------------------------------
// agent-harness through its TypeScript client (connect-es over gRPC, HTTP/2).

async function harness(view) {
  const { AgentHarnessClient, SubscribeView, LogDirection } = await import("@agent-harness/client");
  const client = new AgentHarnessClient({ baseUrl: `http://${env.PEERS_HARNESS}` });
  const session = await client.createSession({ profile: "echo", cwd });
  const abort = new AbortController();
  const stream = client.sessions.subscribe(
    {
      sessionId: session.id,
      afterOffset: session.headOffset,
      view: view === "log" ? SubscribeView.LOG : SubscribeView.MESSAGES,
    },
    { signal: abort.signal },
  );
  const events = stream[Symbol.asyncIterator]();
  const until = async (matches) => {
    for (;;) {
      const { value, done } = await events.next();
      if (done) throw new Error("the harness stream ended");
      if (matches(value.event)) return;
    }
  };
  await withTimeout(until((e) => e.case === "caughtUp"), "caught_up");
  const isResponse = (event, actionId) => {
    if (event.case !== "entry") return false;
    const entry = event.value;
    if (entry.direction !== LogDirection.FROM_RUNTIME || entry.actionId !== actionId) return false;
    const frame = JSON.parse(entry.json);
    return frame.method === undefined && frame.id === actionId;
  };
  return {
    turn: async () => {
      const start = now();
      const { actionId } = await client.prompt(session.id, TEXT);
      await withTimeout(
        until((e) =>
          view === "log" ? isResponse(e, actionId) : e.case === "turnEnded" && e.value.requestId === actionId,
        ),
        `harness ${view}`,
      );
      return micros(start);
    },
    close: async () => abort.abort(),
  };
}

// ---------------------------------------------------------------------------------------------
// Rivet sandbox-agent: its `pi` slot runs a two-line script that execs the same agent.

async function sandboxAgent() {
  const data = join(scratch, "sandbox", "data");
  const slot = join(data, "sandbox-agent", "bin", "agent_processes");
  mkdirSync(slot, { recursive: true });
  const quoted = agent.map((a) => `'${a.replaceAll("'", "'\\''")}'`).join(" ");
  writeFileSync(join(slot, "pi-acp"), `#!/bin/sh\nexec ${quoted} "$@"\n`);
  chmodSync(join(slot, "pi-acp"), 0o755);
  const port = Number(env.PEERS_SANDBOX_PORT);
  const server = spawn(
    env.PEERS_SANDBOX_AGENT,
    ["server", "--no-token", "--no-telemetry", "-H", "127.0.0.1", "-p", String(port)],
    {
      stdio: ["ignore", "ignore", "ignore"],
      env: {
        PATH: env.PATH,
        SANDBOX_AGENT_REQUIRE_PREINSTALL: "1",
        XDG_DATA_HOME: data,
        HOME: join(scratch, "sandbox"),
      },
    },
  );
  const base = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + TIMEOUT_MS;
  for (;;) {
    try {
      await fetch(`${base}/v1/health`);
      break;
    } catch {
      if (Date.now() > deadline) throw new Error("sandbox-agent did not listen");
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  const url = `${base}/v1/acp/bench?agent=pi`;
  let next = 0;
  const call = async (method, params) => {
    const response = await withTimeout(
      fetch(url, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ jsonrpc: "2.0", id: next++, method, params }),
      }),
      `sandbox-agent ${method}`,
    );
    const answer = await response.json();
    if (!answer.result) throw new Error(`sandbox-agent ${method}: ${JSON.stringify(answer)}`);
    return answer.result;
  };
  await call("initialize", { protocolVersion: 1, clientCapabilities: {} });
  const { sessionId } = await call("session/new", { cwd, mcpServers: [] });
  // The SSE stream carries the agent's notifications; it is read (and dropped) throughout.
  const abort = new AbortController();
  const sse = await fetch(`${base}/v1/acp/bench`, {
    headers: { accept: "text/event-stream" },
    signal: abort.signal,
  });
  if (!sse.ok) throw new Error(`sandbox-agent SSE: ${sse.status}`);
  const drain = (async () => {
    try {
      for await (const _ of sse.body) {
        // dropped
      }
    } catch {
      // aborted at the end
    }
  })();
  return {
    turn: async () => {
      const start = now();
      await call("session/prompt", { sessionId, prompt: [{ type: "text", text: TEXT }] });
      return micros(start);
    },
    close: async () => {
      abort.abort();
      await drain;
      server.kill("SIGKILL");
    },
  };
}

// ---------------------------------------------------------------------------------------------
// acpx, as a library: a runtime with the agent as a custom registry entry.

async function acpx() {
  const { createAcpRuntime, createRuntimeStore, createAgentRegistry } = await import("acpx/runtime");
  const stateDir = join(scratch, "acpx");
  mkdirSync(stateDir, { recursive: true });
  const runtime = createAcpRuntime({
    cwd,
    sessionStore: createRuntimeStore({ stateDir }),
    agentRegistry: createAgentRegistry({ overrides: { echo: agent } }),
    permissionMode: "approve-all",
    timeoutMs: TIMEOUT_MS,
  });
  const handle = await runtime.ensureSession({ sessionKey: "bench", agent: "echo", mode: "persistent", cwd });
  let n = 0;
  return {
    turn: async () => {
      const start = now();
      const run = async () => {
        for await (const _ of runtime.runTurn({ handle, text: TEXT, mode: "prompt", requestId: `bench-${n++}` })) {
          // events dropped; the iterator ends with the turn
        }
      };
      await withTimeout(run(), "acpx runTurn");
      return micros(start);
    },
    close: async () => runtime.shutdown(),
  };
}

// ---------------------------------------------------------------------------------------------

const systems = {
  direct,
  "harness-log": () => harness("log"),
  "harness-msgs": () => harness("messages"),
  "sandbox-agent": sandboxAgent,
  acpx,
};

function version(pkg) {
  try {
    const require = createRequire(import.meta.url);
    let dir = dirname(require.resolve(pkg));
    for (;;) {
      try {
        return JSON.parse(readFileSync(join(dir, "package.json"), "utf8")).version;
      } catch {
        const up = dirname(dir);
        if (up === dir) return "unknown";
        dir = up;
      }
    }
  } catch {
    return "unknown";
  }
}

const drivers = {};
const samples = {};
const errors = {};
for (const name of wanted) {
  try {
    drivers[name] = await withTimeout(systems[name](), `starting ${name}`);
    samples[name] = [];
  } catch (error) {
    errors[name] = String(error?.stack ?? error);
  }
}
const live = Object.keys(drivers);
for (const name of live) {
  for (let i = 0; i < (slow.has(name) ? Math.min(warmup, 2) : warmup); i++) {
    try {
      await drivers[name].turn();
    } catch (error) {
      errors[name] = String(error?.stack ?? error);
      break;
    }
  }
}
const perBlock = Math.max(1, Math.ceil(turns / blocks));
for (let b = 0; b < blocks; b++) {
  for (const name of live) {
    if (errors[name]) continue;
    const count = slow.has(name) ? Math.max(1, Math.ceil(Math.min(turns, slowTurns) / blocks)) : perBlock;
    for (let i = 0; i < count; i++) {
      try {
        samples[name].push(await drivers[name].turn());
      } catch (error) {
        errors[name] = String(error?.stack ?? error);
        break;
      }
    }
  }
}
for (const name of live) {
  try {
    await drivers[name].close();
  } catch {
    // closing is best effort
  }
}
for (const name of Object.keys(samples)) samples[name].sort((a, b) => a - b);
process.stdout.write(
  JSON.stringify({
    node: process.version,
    versions: {
      "@agent-harness/client": version("@agent-harness/client"),
      "@sandbox-agent/cli-linux-x64": env.PEERS_SANDBOX_VERSION ?? "unknown",
      acpx: version("acpx/runtime"),
    },
    samples,
    errors,
  }) + "\n",
);
process.exit(0);
