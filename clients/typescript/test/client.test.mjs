// @agent-harness/client against the real release server, run with node's test runner
// by `scripts/test clients`: sessions, prompts with attachments, the queue, permissions, the
// transcript, typed errors, and a subscribe that survives a server restart with every event once.
// AGENT_HARNESS_BIN names the server binary.

import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, openSync, readFileSync, writeFileSync } from "node:fs";
import { createHash } from "node:crypto";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import assert from "node:assert/strict";
import { after, test } from "node:test";

import { equals } from "@bufbuild/protobuf";
import { ConnectError } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

import {
  AgentHarnessClient,
  Code,
  ControlStatus,
  DEFAULT_TURN_TIMEOUT_MS,
  HarnessError,
  InteractionOutcome,
  SessionStatus,
  StopReason,
  TranscriptMessageSchema,
  UsageSource,
  eventOf,
  pendingPermissions,
  toolCalls,
  messageText,
} from "@agent-harness/client";

const TIMEOUT = 20_000;
const BIN = process.env.AGENT_HARNESS_BIN;
assert.ok(BIN, "AGENT_HARNESS_BIN must name the agent-harness binary (scripts/test sets it)");

function freePort() {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const { port } = probe.address();
      probe.close(() => resolve(port));
    });
  });
}

/** A directory for a session to work in: its own, apart from the server's files (a cwd holding
 * them is refused). */
function workdir() {
  return mkdtempSync(join(tmpdir(), "agent-harness-ts-work-"));
}

/** The real server as a process, restartable on the same port and data dir. */
class Server {
  /** `tokensFile`: serve with these tokens (and then no extra profiles: they would need cwd roots). */
  static async create({ tokensFile } = {}) {
    const server = new Server();
    server.extraArgs = tokensFile ? ["--tokens-file", tokensFile] : [];
    server.dir = mkdtempSync(join(tmpdir(), "agent-harness-ts-"));
    server.port = await freePort();
    server.config = join(server.dir, "config.toml");
    // `mock-resume`: the mock agent with session/resume, so a session reopens after a restart.
    // `mock-fork`: the mock agent with session/fork.
    writeFileSync(
      server.config,
      tokensFile ? "" : `[profiles.mock-resume]\ncommand = ${JSON.stringify(BIN)}\nargs = ["mock-agent", "--resume"]\n`
        + `[profiles.mock-fork]\ncommand = ${JSON.stringify(BIN)}\nargs = ["mock-agent", "--resume", "--fork"]\n`,
    );
    await server.start();
    return server;
  }

  get baseUrl() {
    return `http://127.0.0.1:${this.port}`;
  }

  async start() {
    const log = openSync(join(this.dir, "server.log"), "a");
    this.child = spawn(BIN, ["serve", "--listen", `127.0.0.1:${this.port}`, "--data-dir", join(this.dir, "data"), "--config", this.config, ...this.extraArgs], {
      stdio: ["ignore", log, log],
    });
    this.exited = new Promise((resolve) => this.child.once("exit", resolve));
    // Serving once a call answers (any answer: NOT_FOUND is fine).
    const probe = new AgentHarnessClient({ baseUrl: this.baseUrl, timeoutMs: 1000 });
    const deadline = Date.now() + TIMEOUT;
    for (;;) {
      if (this.child.exitCode !== null) throw new Error(`server exited: ${readFileSync(join(this.dir, "server.log"), "utf8")}`);
      try {
        await probe.listSessions();
        return;
      } catch (error) {
        if (error instanceof HarnessError && error.fromService) return; // it answers
        if (Date.now() > deadline) throw error;
      }
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }

  async kill(signal = "SIGKILL") {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      this.child.kill(signal);
      await this.exited;
    }
  }
}

const servers = [];
after(async () => {
  for (const server of servers) await server.kill("SIGTERM");
});

async function setup() {
  const server = await Server.create();
  servers.push(server);
  return { server, client: new AgentHarnessClient({ baseUrl: server.baseUrl, timeoutMs: TIMEOUT }) };
}

/** Consumes subscribe() in the background; `until` waits for a matching event. */
class Events {
  constructor(client, sessionId, view) {
    this.seen = [];
    this.waiters = [];
    this.controller = new AbortController();
    this.done = (async () => {
      try {
        for await (const event of client.subscribe(sessionId, { view, signal: this.controller.signal })) {
          this.seen.push(event);
          this.#wake();
        }
      } catch (error) {
        this.error = error;
        this.#wake();
      }
    })();
  }

  #wake() {
    for (const wake of this.waiters.splice(0)) wake();
  }

  async until(predicate, from = 0) {
    const deadline = Date.now() + TIMEOUT;
    let index = from;
    for (;;) {
      for (; index < this.seen.length; index++) {
        if (predicate(this.seen[index])) return this.seen[index];
      }
      if (this.error && !this.controller.signal.aborted) throw this.error;
      const left = deadline - Date.now();
      if (left <= 0) throw new Error("no matching event in time");
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  turnEnded(actionId) {
    return this.until((e) => e.event.case === "turnEnded" && e.event.value.requestId === actionId);
  }

  stop() {
    this.controller.abort();
  }
}

const text = (message) => message.parts.filter((p) => p.kind.case === "text").map((p) => p.kind.value.text).join("");

test("a prompt with attachments streams and ends its turn", { timeout: 60_000 }, async () => {
  const { client } = await setup();
  const session = await client.createSession({ profile: "mock", cwd: workdir(), labels: { suite: "typescript" } });
  const events = new Events(client, session.id, "messages");
  const sent = await client.prompt(session.id, "hello", {
    attachments: ["https://files.example/a.png", { uri: "https://files.example/b.txt", name: "b.txt", mimeType: "text/plain" }],
  });
  assert.equal(sent.status, ControlStatus.SENT);
  const ended = await events.turnEnded(sent.actionId);
  assert.equal(ended.event.value.stopReason, StopReason.END_TURN);
  events.stop();

  const { messages } = await client.getTranscript(session.id);
  const [user, agent] = messages;
  assert.deepEqual(
    user.parts.filter((p) => p.kind.case === "attachment").map((p) => p.kind.value.uri),
    ["https://files.example/a.png", "https://files.example/b.txt"],
  );
  assert.equal(agent.requestId, sent.actionId);
  assert.equal(text(agent), "echo: hello");
  assert.deepEqual((await client.listSessions({ labels: { suite: "typescript" } })).map((s) => s.id), [session.id]);
});

test("a second prompt queues behind a permission and runs once it is answered", { timeout: 60_000 }, async () => {
  const { client } = await setup();
  const session = await client.createSession({ profile: "mock", cwd: workdir() });
  const events = new Events(client, session.id, "messages");
  const first = await client.prompt(session.id, "@permission Deploy");
  const held = await events.until(
    (e) => e.event.case === "message"
      && e.event.value.parts.some((p) => p.kind.case === "permission" && p.kind.value.outcome === InteractionOutcome.PENDING),
  );
  const second = await client.prompt(session.id, "and then this");
  assert.equal(second.status, ControlStatus.QUEUED);
  assert.equal(second.queuePosition, 1);
  assert.deepEqual((await client.getQueue(session.id)).map((q) => q.actionId), [second.actionId]);

  const permission = held.event.value.parts.find((p) => p.kind.case === "permission").kind.value;
  await client.respondToPermission(session.id, permission.requestId, "allow-once");
  assert.equal((await events.turnEnded(first.actionId)).event.value.stopReason, StopReason.END_TURN);
  assert.equal((await events.turnEnded(second.actionId)).event.value.stopReason, StopReason.END_TURN);
  events.stop();

  const { messages } = await client.getTranscript(session.id);
  const answered = messages[1].parts.find((p) => p.kind.case === "permission").kind.value;
  assert.equal(answered.outcome, InteractionOutcome.SELECTED);
  assert.equal(answered.selectedOptionId, "allow-once");
  assert.equal(text(messages[3]), "echo: and then this");
});

test("a fork starts with the parent's messages marked inherited", { timeout: 60_000 }, async () => {
  const { client } = await setup();
  const parent = await client.createSession({ profile: "mock-fork", cwd: workdir() });
  const events = new Events(client, parent.id, "messages");
  const sent = await client.prompt(parent.id, "first question");
  await events.turnEnded(sent.actionId);
  events.stop();

  const forked = await client.forkSession(parent.id, { name: "branch" });
  assert.notEqual(forked.id, parent.id);
  assert.equal(forked.name, "branch");
  const { messages } = await client.getTranscript(forked.id);
  assert.equal(messages.length, 2);
  assert.ok(messages.every((m) => m.inherited));

  const plain = await client.createSession({ profile: "mock", cwd: workdir() });
  await assert.rejects(client.forkSession(plain.id), { reason: "NOT_SUPPORTED" });
});

test("errors carry their code, reason and metadata", { timeout: 60_000 }, async () => {
  const { client } = await setup();
  await assert.rejects(client.getSession("0190e0e0-0000-7000-8000-000000000000"), (error) => {
    assert.ok(error instanceof HarnessError);
    assert.equal(error.code, Code.NotFound);
    assert.equal(error.reason, "SESSION_NOT_FOUND");
    assert.equal(error.domain, "agent-harness");
    return true;
  });
  await assert.rejects(client.createSession({ profile: "no-such-profile", cwd: workdir() }), { reason: "PROFILE_NOT_FOUND" });

  const session = await client.createSession({ profile: "mock", cwd: workdir() });
  const head = (await client.getSession(session.id)).headOffset;
  const beyond = client.subscribe(session.id, { view: "log", afterOffset: head + 100n });
  await assert.rejects(beyond.next(), (error) => {
    assert.equal(error.code, Code.OutOfRange);
    assert.equal(error.reason, "OFFSET_OUT_OF_RANGE");
    assert.equal(error.metadata.head_offset, String(head));
    return true;
  });
});

test("subscribe survives a server restart with every event once", { timeout: 90_000 }, async () => {
  const { server, client } = await setup();
  const session = await client.createSession({ profile: "mock-resume", cwd: workdir() });
  const events = new Events(client, session.id, "log");
  const first = await client.prompt(session.id, "before the restart\n@chunks 3 16");
  await events.turnEnded(first.actionId);

  // The stream is open when the server dies; it comes back on the same port and data dir.
  await server.kill();
  await server.start();

  const second = await client.prompt(session.id, "after the restart\n@chunks 3 16");
  assert.equal((await events.turnEnded(second.actionId)).event.value.stopReason, StopReason.END_TURN);
  events.stop();

  const offsets = events.seen.filter((e) => e.event.case === "entry").map((e) => Number(e.event.value.offset));
  assert.deepEqual(offsets, Array.from({ length: offsets.at(-1) }, (_, i) => i + 1), "every offset once, in order");
  const logged = (await client.readLog(session.id)).map((e) => Number(e.offset)).filter((o) => o <= offsets.at(-1));
  assert.deepEqual(offsets, logged);
  const started = events.seen.filter((e) => e.event.case === "entry" && e.event.value.json.includes('"runtime_started"'));
  assert.equal(started.length, 2, "one runtime before the restart, one reopened after it");
  assert.deepEqual(
    events.seen.filter((e) => e.event.case === "turnEnded").map((e) => e.event.value.requestId),
    [first.actionId, second.actionId],
  );
});

test("runTurn resolves with the stop reason, final text, tool calls and usage", { timeout: 60_000 }, async () => {
  const { client } = await setup();
  const session = await client.createSession({ profile: "mock", cwd: workdir() });
  const result = await client.runTurn(session.id, "Build it\n@tool t1\n@usage 53000 200000 0.045 USD", { timeoutMs: TIMEOUT });
  assert.equal(result.stopReason, StopReason.END_TURN);
  assert.equal(result.stopReasonName, "END_TURN");
  assert.ok(result.ok);
  assert.equal(result.error, undefined);
  assert.ok(result.text.startsWith("echo: Build it"));
  assert.deepEqual(result.toolCalls.map((t) => [t.toolCallId, t.title]), [["t1", "Run t1"]]);
  assert.equal(result.usage.usedTokens, 53000n);
  assert.equal(result.usage.cost.currency, "USD");
  assert.equal(result.message.requestId, result.actionId);

  const failed = await client.prompt(session.id, "@error -32603 it broke badly", { wait: true, timeoutMs: TIMEOUT });
  assert.equal(failed.stopReason, StopReason.FAILED);
  assert.ok(!failed.ok);
  assert.match(failed.error, /it broke badly/);

  const kinds = [];
  for await (const event of client.turnEvents(session.id, "three", { timeoutMs: TIMEOUT })) kinds.push(event.event.case);
  assert.equal(kinds.at(-1), "turnEnded");
});

test("a permission is answered from onEvent while runTurn waits", { timeout: 60_000 }, async () => {
  const { client } = await setup();
  const session = await client.createSession({ profile: "mock", cwd: workdir() });
  const answered = [];
  const result = await client.runTurn(session.id, "@permission Deploy", {
    timeoutMs: TIMEOUT,
    onEvent: async (event) => {
      if (event.event.case !== "message") return;
      for (const part of event.event.value.parts) {
        if (part.kind.case === "permission" && part.kind.value.outcome === InteractionOutcome.PENDING) {
          answered.push(part.kind.value.requestId);
          await client.respondToPermission(session.id, part.kind.value.requestId, "allow-once");
        }
      }
    },
  });
  assert.ok(result.ok);
  assert.equal(answered.length, 1);
});

test("fromEnv takes an http URL and the token; a malformed URL says so in one line", { timeout: 60_000 }, async () => {
  const { server } = await setup();
  const saved = { ...process.env };
  try {
    process.env.AGENT_HARNESS_SERVER = server.baseUrl;
    delete process.env.AGENT_HARNESS_TOKEN;
    const client = AgentHarnessClient.fromEnv({ timeoutMs: TIMEOUT });
    const session = await client.createSession({ profile: "mock", cwd: workdir() });
    assert.equal((await new AgentHarnessClient(server.baseUrl).getSession(session.id)).id, session.id);

    process.env.AGENT_HARNESS_SERVER = "htp:/127.0.0.1";
    assert.throws(() => AgentHarnessClient.fromEnv(), (error) => {
      assert.ok(error instanceof HarnessError);
      assert.equal(error.reason, "INVALID_SERVER_URL");
      assert.equal(
        error.message,
        'INVALID_SERVER_URL: AGENT_HARNESS_SERVER "htp:/127.0.0.1" is not a server URL; want http://host:port or https://host[:port]',
      );
      return true;
    });
  } finally {
    process.env = saved;
  }
});

test("UNAVAILABLE while the server is down is a HarnessError with a reason", { timeout: 60_000 }, async () => {
  const { server, client } = await setup();
  const session = await client.createSession({ profile: "mock-resume", cwd: workdir() });
  const stream = client.subscribe(session.id, { view: "messages", resume: false });
  await stream.next();
  await server.kill();
  await assert.rejects(async () => {
    for (;;) await stream.next();
  }, (error) => error instanceof HarnessError && error.code === Code.Unavailable && error.reason === "UNAVAILABLE");
  await assert.rejects(client.getSession(session.id), (error) => {
    assert.equal(error.reason, "UNAVAILABLE");
    assert.equal(error.fromService, false);
    assert.ok(!error.message.includes("\n"));
    return true;
  });
});

test("the example program runs a turn where the package was installed as README says", { timeout: 60_000 }, async () => {
  const { server } = await setup();
  const folder = process.env.AGENT_HARNESS_TS_DIR;
  assert.ok(folder, "AGENT_HARNESS_TS_DIR must name the folder of the README install (scripts/test sets it)");
  const env = { ...process.env, AGENT_HARNESS_SERVER: server.baseUrl };
  delete env.AGENT_HARNESS_TOKEN;
  const done = spawnSync("node", ["run-turn.mjs", "Say hello\n@chunks 2 4"], { cwd: folder, env, encoding: "utf8", timeout: TIMEOUT });
  assert.equal(done.status, 0, done.stderr);
  const lines = done.stdout.trim().split("\n");
  assert.equal(lines[0], "echo: Say hello");
  assert.equal(lines.at(-1), "stop reason: END_TURN");
  assert.equal(messageText({ parts: [] }), "");
});

test("a snapshot the server sends again after a resume reaches the caller once", { timeout: 60_000 }, async () => {
  const { server, client } = await setup();
  const session = await client.createSession({ profile: "mock", cwd: workdir() });
  await client.runTurn(session.id, "a turn to catch up on\n@chunks 3 8", { timeoutMs: TIMEOUT });

  // The first Subscribe stream loses its connection right after its first message snapshot;
  // later streams are the server's, recorded raw (before the package's dedupe).
  let streams = 0;
  const rawAfterDrop = [];
  const dropFirstStream = (next) => async (request) => {
    const response = await next(request);
    if (!response.stream || request.method.name !== "Subscribe") return response;
    const first = ++streams === 1;
    async function* events() {
      for await (const event of response.message) {
        if (!first) rawAfterDrop.push(event);
        yield event;
        if (first && event.event.case === "message") {
          throw new ConnectError("the connection dropped (injected by the test)", Code.Unavailable);
        }
      }
    }
    return { ...response, message: events() };
  };
  const transport = createGrpcTransport({ baseUrl: server.baseUrl, interceptors: [dropFirstStream] });
  const dropping = new AgentHarnessClient({ transport, timeoutMs: TIMEOUT });

  const seen = [];
  for await (const event of dropping.subscribe(session.id, { view: "messages" })) {
    seen.push(event);
    if (event.event.case === "caughtUp") break;
  }
  // A catch-up snapshot carries the resume cursor: resuming from it makes the server send it again.
  assert.equal(streams, 2);
  const firstSnapshot = seen[0].event.value;
  const resent = rawAfterDrop.filter((e) => e.event.case === "message").map((e) => e.event.value);
  assert.ok(equals(TranscriptMessageSchema, resent[0], firstSnapshot), "the server did send the snapshot again");
  const last = new Map();
  for (const event of seen.filter((e) => e.event.case === "message")) {
    const previous = last.get(event.event.value.id);
    assert.ok(!previous || !equals(TranscriptMessageSchema, previous, event.event.value), `${event.event.value.id} twice unchanged`);
    last.set(event.event.value.id, event.event.value);
  }
  const { messages } = await client.getTranscript(session.id);
  assert.equal(last.size, messages.length);
  for (const message of messages) assert.ok(equals(TranscriptMessageSchema, last.get(message.id), message));
});

test("a call without the token the server wants says in one line which variable to set", { timeout: 60_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), "agent-harness-ts-tokens-"));
  const tokensFile = join(dir, "tokens.toml");
  const token = "s3cret-token";
  writeFileSync(tokensFile, `[[tokens]]\nsha256 = "${createHash("sha256").update(token).digest("hex")}"\nprincipal = "ada"\nkind = "user"\n`);
  const server = await Server.create({ tokensFile });
  servers.push(server);
  await assert.rejects(new AgentHarnessClient(server.baseUrl).listSessions(), (error) => {
    assert.equal(error.reason, "UNAUTHENTICATED");
    assert.equal(error.message, "UNAUTHENTICATED: the server wants a token and none was given: set AGENT_HARNESS_TOKEN (or pass token)");
    return true;
  });
  assert.deepEqual(await new AgentHarnessClient({ baseUrl: server.baseUrl, token }).listSessions(), []);
});

test("a runTurn that times out stops its turn, and getUsage sums by source", { timeout: 60_000 }, async () => {
  const { client } = await setup();
  assert.equal(DEFAULT_TURN_TIMEOUT_MS, 600_000);
  const session = await client.createSession({ profile: "mock", cwd: workdir() });
  // Held on a permission nobody answers: past the timeout the turn is stopped, not left running.
  await assert.rejects(client.runTurn(session.id, "@permission Deploy", { timeoutMs: 1_000 }), (error) => {
    assert.equal(error.reason, "DEADLINE_EXCEEDED");
    return true;
  });
  const deadline = Date.now() + TIMEOUT;
  while ((await client.getSession(session.id)).status !== SessionStatus.IDLE) {
    assert.ok(Date.now() < deadline, "the timed-out turn was not stopped");
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  await client.runTurn(session.id, "count\n@usage 100 200000 0.25 USD", { timeoutMs: TIMEOUT });
  const usage = await client.getUsage({ since: new Date(Date.now() - 3_600_000) });
  assert.deepEqual(usage.profiles.map((p) => p.profile), ["mock"]);
  assert.deepEqual(usage.sources.map((s) => s.source), [UsageSource.AGENT]);
});

test("events and parts are typed helpers: eventOf, pendingPermissions, toolCalls", { timeout: 60_000 }, async () => {
  const { client } = await setup();
  const session = await client.createSession({ profile: "mock", cwd: workdir() });
  const kinds = new Set();
  let answered = 0;
  const result = await client.runTurn(session.id, "Build\n@tool t1\n@permission Deploy", {
    timeoutMs: TIMEOUT,
    onEvent: async (response) => {
      const event = eventOf(response);
      kinds.add(event.kind);
      for (const permission of pendingPermissions(event.message)) {
        answered += 1;
        await client.respondToPermission(session.id, permission.requestId, permission.options[0].optionId);
      }
    },
  });
  assert.ok(result.ok);
  assert.equal(answered, 1);
  assert.ok(kinds.has("message") && kinds.has("turnEnded"), [...kinds].join(","));
  assert.deepEqual(toolCalls(result.message).map((t) => t.toolCallId), ["t1"]);
  assert.deepEqual(pendingPermissions(result.message), []);
});
