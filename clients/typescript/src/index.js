// @agent-harness/client: typed calls to agent-harness over gRPC or gRPC-Web (connect-es), every
// error thrown as one HarnessError carrying a reason, a subscribe() that reconnects, resumes from
// the last offset and drops re-sent snapshots, and runTurn() for "send and wait for the result".
// Types: index.d.ts.

import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { equals } from "@bufbuild/protobuf";
import { BinaryReader } from "@bufbuild/protobuf/wire";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";

import {
  AgentSessionService,
  SubscribeView,
} from "./gen/agent_harness/v1/agent_session_service_pb.js";
import { Delivery, Expect } from "./gen/agent_harness/v1/session_pb.js";
import {
  InteractionOutcome,
  MessageRole,
  StopReason,
  TranscriptMessageSchema,
} from "./gen/agent_harness/v1/transcript_pb.js";
import { ChannelTranslatorService } from "./gen/agent_harness/v1/translator_service_pb.js";

export * from "./gen/agent_harness/v1/actions_pb.js";
export * from "./gen/agent_harness/v1/agent_session_service_pb.js";
export * from "./gen/agent_harness/v1/channel_pb.js";
export * from "./gen/agent_harness/v1/errors_pb.js";
export * from "./gen/agent_harness/v1/session_pb.js";
export * from "./gen/agent_harness/v1/transcript_pb.js";
export * from "./gen/agent_harness/v1/translator_service_pb.js";
export * from "./gen/agent_harness/v1/usage_pb.js";
export { Code } from "@connectrpc/connect";

/** The `ErrorInfo.domain` of every error agent-harness returns. */
export const ERROR_DOMAIN = "agent-harness";

const ERROR_INFO = "google.rpc.ErrorInfo";

/** Decodes a google.rpc.ErrorInfo (reason = 1, domain = 2, map<string,string> metadata = 3). */
function decodeErrorInfo(bytes) {
  const reader = new BinaryReader(bytes);
  const info = { reason: "", domain: "", metadata: {} };
  while (reader.pos < reader.len) {
    const [field, wireType] = reader.tag();
    if (field === 1) info.reason = reader.string();
    else if (field === 2) info.domain = reader.string();
    else if (field === 3) {
      const entry = new BinaryReader(reader.bytes());
      let key = "";
      let value = "";
      while (entry.pos < entry.len) {
        const [n, t] = entry.tag();
        if (n === 1) key = entry.string();
        else if (n === 2) value = entry.string();
        else entry.skip(t);
      }
      info.metadata[key] = value;
    } else reader.skip(wireType);
  }
  return info;
}

/** The gRPC name of a status code ("UNAVAILABLE"), as servers and the Python package spell it. */
function statusName(code) {
  if (code === Code.Canceled) return "CANCELLED";
  return String(Code[code] ?? "UNKNOWN").replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
}

/**
 * A failed call. Branch on `reason` (e.g. "SESSION_NOT_FOUND"), never on the message text.
 * `reason` is always set: the service's ErrorInfo reason when it sent one (`fromService`), else
 * the status code's gRPC name, e.g. "UNAVAILABLE" while the server restarts. A malformed server
 * URL is thrown as this type too, with reason "INVALID_SERVER_URL".
 */
export class HarnessError extends Error {
  constructor(code, message, reason = undefined, metadata = {}, domain = undefined) {
    reason = reason || statusName(code);
    super(`${reason}: ${String(message).split(/\s+/).filter(Boolean).join(" ")}`);
    this.name = "HarnessError";
    /** The gRPC status code (`Code` of @connectrpc/connect). */
    this.code = code;
    /** Its name, e.g. "NotFound". */
    this.codeName = Code[code];
    this.rawMessage = message;
    /** ErrorInfo.reason, when the service set one. */
    this.reason = reason;
    /** ErrorInfo.metadata (e.g. { head_offset: "12" }; errors.proto lists the keys). */
    this.metadata = metadata;
    this.domain = domain;
  }

  /** Whether the service chose this error (it carried an ErrorInfo), not the transport. */
  get fromService() {
    return this.domain === ERROR_DOMAIN;
  }

  /** A HarnessError from anything a connect-es call threw. */
  static from(error) {
    if (error instanceof HarnessError) return error;
    const connect = ConnectError.from(error);
    for (const detail of connect.details) {
      if ("type" in detail && detail.type === ERROR_INFO) {
        const info = decodeErrorInfo(detail.value);
        return new HarnessError(connect.code, connect.rawMessage, info.reason, info.metadata, info.domain);
      }
    }
    return new HarnessError(connect.code, connect.rawMessage || (connect.code === Code.Unavailable ? "the server is not reachable" : ""));
  }
}

/** Whether resubscribing can help: a dropped connection, a restarting or draining server. */
function resumable(error) {
  if (error.code === Code.Unavailable) return true;
  if (error.fromService) return false;
  return [Code.Unknown, Code.Internal, Code.Canceled, Code.Aborted].includes(error.code);
}

/** The server when neither an argument nor AGENT_HARNESS_SERVER names one (the CLI's default). */
export const DEFAULT_SERVER = "http://127.0.0.1:50051";

/** `http://host[:port]` or `https://host[:port]`, else a HarnessError that says so in one line. */
export function parseServer(server, source = "server") {
  let url;
  try {
    url = new URL(String(server).trim());
  } catch {
    url = undefined;
  }
  if (!url || !["http:", "https:"].includes(url.protocol) || !url.hostname || (url.pathname !== "/" && url.pathname !== "") || url.search) {
    throw new HarnessError(
      Code.InvalidArgument,
      `${source} ${JSON.stringify(String(server))} is not a server URL; want http://host:port or https://host[:port]`,
      "INVALID_SERVER_URL",
    );
  }
  return `${url.protocol}//${url.host}`;
}

/** The text parts of a transcript message, joined: what the agent said. */
export function messageText(message) {
  return message.parts.filter((p) => p.kind.case === "text").map((p) => p.kind.value.text).join("");
}

/** The values of a message's parts of one kind (`"text"`, `"tool"`, `"permission"`, …). */
export function partsOf(message, kind) {
  return (message?.parts ?? []).filter((p) => p.kind.case === kind).map((p) => p.kind.value);
}

/** A message's tool calls, in order. */
export function toolCalls(message) {
  return partsOf(message, "tool");
}

/** The permission requests of a message that still wait for an answer. */
export function pendingPermissions(message) {
  return partsOf(message, "permission").filter((p) => p.outcome === InteractionOutcome.PENDING && p.requestId);
}

/** The elicitations (questions) of a message that still wait for an answer. */
export function pendingElicitations(message) {
  return partsOf(message, "elicitation").filter((e) => e.outcome === InteractionOutcome.PENDING && e.requestId);
}

/**
 * A stream event, flattened: `kind` (`"message"`, `"turnEnded"`, `"status"`, `"queue"`,
 * `"entry"`, `"caughtUp"`, `"heartbeat"`), its `offset`, and the one field of that kind set
 * (`message`, `turnEnded`, `status`, `queue`, `entry`), as the Python client's Event.
 */
export function eventOf(response) {
  const { case: kind, value } = response.event;
  const event = { kind: kind ?? "unknown", offset: response.offset };
  if (kind === "message" || kind === "turnEnded" || kind === "status" || kind === "queue" || kind === "entry") {
    event[kind] = value;
  }
  return event;
}

/**
 * Resuming is at-least-once for message snapshots: after a reconnect the server may send one
 * again. This drops a snapshot equal to the last one seen for its message id, and a log entry at
 * or below the last offset seen, so the caller sees every change once.
 */
class Dedupe {
  #snapshots = new Map();
  #lastEntry = 0n;

  fresh(event) {
    const { case: kind, value } = event.event;
    if (kind === "message") {
      const last = this.#snapshots.get(value.id);
      if (last !== undefined && equals(TranscriptMessageSchema, last, value)) return false;
      this.#snapshots.set(value.id, value);
    } else if (kind === "entry") {
      if (value.offset <= this.#lastEntry) return false;
      this.#lastEntry = value.offset;
    }
    return true;
  }
}

/** Follows one prompt's turn through a MESSAGES stream: its agent message and its end. */
class Turn {
  constructor(actionId) {
    this.actionId = actionId;
    this.message = undefined;
    this.ended = undefined;
  }

  concerns(event) {
    const { case: kind, value } = event.event;
    if (kind === "message") {
      if (value.requestId !== this.actionId) return false;
      if (value.role === MessageRole.AGENT) this.message = value;
      return true;
    }
    if (kind === "turnEnded") {
      if (value.requestId !== this.actionId) return false;
      this.ended = value;
      return true;
    }
    return kind === "status" || kind === "queue";
  }

  result(usage) {
    const message = this.message;
    return {
      actionId: this.actionId,
      turn: this.ended.turn,
      stopReason: this.ended.stopReason,
      stopReasonName: StopReason[this.ended.stopReason] ?? `UNKNOWN_${this.ended.stopReason}`,
      ok: this.ended.stopReason === StopReason.END_TURN,
      error: this.ended.error ?? message?.error,
      text: message ? messageText(message) : "",
      toolCalls: message ? message.parts.filter((p) => p.kind.case === "tool").map((p) => p.kind.value) : [],
      usage,
      message,
    };
  }
}

const VIEWS = {
  all: SubscribeView.ALL,
  log: SubscribeView.LOG,
  messages: SubscribeView.MESSAGES,
};

function attachment(value) {
  if (typeof value === "string") {
    const name = value.split("?")[0].replace(/\/+$/, "").split("/").pop() || value;
    return { uri: value, name };
  }
  return value;
}

/** The agent's request id with its shape kept: 7 and "7" are different requests. */
function requestId(value) {
  if (value && typeof value === "object" && "id" in value) return value;
  if (typeof value === "number" || typeof value === "bigint") {
    return { id: { case: "number", value: BigInt(value) } };
  }
  return { id: { case: "text", value: String(value) } };
}

function elicitationValue(value) {
  if (typeof value === "boolean") return { kind: { case: "flag", value } };
  if (typeof value === "bigint") return { kind: { case: "integer", value } };
  if (typeof value === "number") {
    return Number.isInteger(value)
      ? { kind: { case: "integer", value: BigInt(value) } }
      : { kind: { case: "number", value } };
  }
  if (Array.isArray(value)) return { kind: { case: "strings", value: { values: value.map(String) } } };
  return { kind: { case: "text", value: String(value) } };
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** How long runTurn and turnEvents wait for a turn unless told: ten minutes. */
export const DEFAULT_TURN_TIMEOUT_MS = 600_000;

/**
 * How long a turn may take: `timeoutMs` as given, none for `null`, else the default; with the
 * caller's `signal`. The timer is AbortSignal.timeout's, which never keeps Node running.
 */
class TurnBound {
  constructor({ timeoutMs, signal }) {
    this.ms = timeoutMs === null ? undefined : (timeoutMs ?? DEFAULT_TURN_TIMEOUT_MS);
    this.timer = this.ms === undefined ? undefined : AbortSignal.timeout(this.ms);
    const signals = [signal, this.timer].filter(Boolean);
    this.signal = signals.length === 0 ? undefined : signals.length === 1 ? signals[0] : AbortSignal.any(signals);
  }

  /** The error to throw: DEADLINE_EXCEEDED when the bound is what ended the wait. */
  error(thrown) {
    if (this.timer?.aborted) {
      return new HarnessError(Code.DeadlineExceeded, `the turn did not end within ${this.ms} ms`);
    }
    return thrown;
  }
}

export class AgentHarnessClient {
  /**
   * @param {object} [options]
   * @param {string} [options.baseUrl] e.g. "http://127.0.0.1:50051"
   * @param {string} [options.token] sent as `authorization: Bearer <token>`
   * @param {"grpc"|"grpc-web"} [options.protocol]
   * @param {import("@connectrpc/connect").Transport} [options.transport] overrides the above
   * @param {number} [options.timeoutMs] bound of every unary call
   * @param {number} [options.reconnectForMs] how long subscribe() keeps trying to resubscribe
   */
  constructor(options = {}) {
    if (typeof options === "string") options = { baseUrl: options };
    const {
      baseUrl = DEFAULT_SERVER,
      token,
      protocol = "grpc",
      transport,
      timeoutMs = 30_000,
      reconnectForMs = 60_000,
    } = options;
    const interceptors = token
      ? [(next) => (request) => {
          request.header.set("authorization", `Bearer ${token}`);
          return next(request);
        }]
      : [];
    const make = protocol === "grpc-web" ? createGrpcWebTransport : createGrpcTransport;
    this.transport = transport ?? make({ baseUrl: parseServer(baseUrl), interceptors });
    this.token = token;
    /** The generated connect-es clients, for anything the helpers do not cover. */
    this.sessions = createClient(AgentSessionService, this.transport);
    this.translator = createClient(ChannelTranslatorService, this.transport);
    this.timeoutMs = timeoutMs;
    this.reconnectForMs = reconnectForMs;
  }

  /**
   * A client of AGENT_HARNESS_SERVER (a URL as the CLI takes it; default http://127.0.0.1:50051)
   * with the token in AGENT_HARNESS_TOKEN (if set); `options` add to or override them.
   */
  static fromEnv(options = {}) {
    const baseUrl = process.env.AGENT_HARNESS_SERVER || DEFAULT_SERVER;
    parseServer(baseUrl, "AGENT_HARNESS_SERVER");
    return new AgentHarnessClient({ baseUrl, token: process.env.AGENT_HARNESS_TOKEN || undefined, ...options });
  }

  #error(thrown) {
    const error = HarnessError.from(thrown);
    if (error.code === Code.Unauthenticated && !this.token) {
      return new HarnessError(
        error.code,
        "the server wants a token and none was given: set AGENT_HARNESS_TOKEN (or pass token)",
        error.reason,
        error.metadata,
        error.domain,
      );
    }
    return error;
  }

  async #call(method, request) {
    try {
      return await method(request, { timeoutMs: this.timeoutMs });
    } catch (error) {
      throw this.#error(error);
    }
  }

  async createSession({ profile, cwd, model, name, labels = {}, editors = [], sessionId } = {}) {
    const response = await this.#call(this.sessions.createSession, {
      profile, cwd, model, name, labels, editors, sessionId,
    });
    return response.session;
  }

  async getSession(sessionId) {
    return (await this.#call(this.sessions.getSession, { sessionId })).session;
  }

  /** Every visible session (all pages), newest first. */
  async listSessions({ statuses = [], labels = {} } = {}) {
    const sessions = [];
    let pageToken = "";
    do {
      const page = await this.#call(this.sessions.listSessions, { pageSize: 100, pageToken, statuses, labels });
      sessions.push(...page.sessions);
      pageToken = page.nextPageToken;
    } while (pageToken);
    return sessions;
  }

  /** A new session with the context of `sessionId`, when its agent supports fork (else a
   * HarnessError with reason NOT_SUPPORTED); its transcript starts with the parent's messages,
   * marked `inherited`. */
  async forkSession(sessionId, { name } = {}) {
    return (await this.#call(this.sessions.forkSession, { sessionId, name })).session;
  }

  async closeSession(sessionId) {
    return (await this.#call(this.sessions.closeSession, { sessionId })).session;
  }

  async deleteSession(sessionId) {
    await this.#call(this.sessions.deleteSession, { sessionId });
  }

  /** Any ControlRequest (init object of ControlRequestSchema). */
  async control(request) {
    return this.#call(this.sessions.control, request);
  }

  /**
   * Sends or queues a prompt; `interrupt` cancels the running turn first; `onlyIfIdle` refuses
   * (reason SESSION_BUSY, nothing stored) unless the session is idle with an empty queue. With
   * `wait: true` it resolves to the TurnResult once the turn has ended (as runTurn).
   */
  async prompt(sessionId, text, options = {}) {
    if (options.wait) return this.runTurn(sessionId, text, options);
    const { attachments = [], interrupt = false, actionId, onlyIfIdle = false } = options;
    return this.control({
      sessionId,
      actionId,
      delivery: interrupt ? Delivery.INTERRUPT : Delivery.QUEUE,
      expect: onlyIfIdle ? Expect.IDLE : undefined,
      action: { case: "prompt", value: { prompt: text, attachments: attachments.map(attachment) } },
    });
  }

  /**
   * Sends a prompt and yields the events of its turn (its messages' snapshots, status and queue
   * changes) until its `turnEnded` event, the last one. Survives a server restart like
   * subscribe(); `timeoutMs` bounds the whole turn.
   */
  async *turnEvents(sessionId, text, options = {}) {
    const bound = new TurnBound(options);
    const head = (await this.getSession(sessionId)).headOffset;
    const sent = await this.prompt(sessionId, text, { ...options, wait: false });
    const turn = new Turn(sent.actionId);
    try {
      for await (const event of this.subscribe(sessionId, { view: "messages", afterOffset: head, signal: bound.signal })) {
        if (turn.concerns(event)) {
          yield event;
          if (turn.ended) return;
        }
      }
    } catch (thrown) {
      const error = bound.error(thrown);
      await this.#stopOnTimeout(sessionId, turn, error);
      throw error;
    }
  }

  /**
   * Sends a prompt and waits for its turn to end: the result holds the stop reason, the agent's
   * final text, its tool calls and the session's usage. A failed turn resolves with stop reason
   * FAILED and `error` set (it does not throw); `onEvent` sees each event of the turn as it comes
   * (e.g. to answer a permission request).
   */
  async runTurn(sessionId, text, options = {}) {
    const { onEvent } = options;
    const bound = new TurnBound(options);
    const head = (await this.getSession(sessionId)).headOffset;
    const sent = await this.prompt(sessionId, text, { ...options, wait: false });
    const turn = new Turn(sent.actionId);
    try {
      for await (const event of this.subscribe(sessionId, { view: "messages", afterOffset: head, signal: bound.signal })) {
        if (turn.concerns(event)) {
          if (onEvent) await onEvent(event);
          if (turn.ended) break;
        }
      }
    } catch (thrown) {
      const error = bound.error(thrown);
      await this.#stopOnTimeout(sessionId, turn, error);
      throw error;
    }
    return turn.result((await this.getSession(sessionId)).usage);
  }

  /** A turn that outlived its timeout is stopped before the error is thrown: nobody waits for
   * it any more, and an agent left running would go on spending. */
  async #stopOnTimeout(sessionId, turn, error) {
    if (error?.reason !== "DEADLINE_EXCEEDED" || turn.ended) return;
    try {
      await this.stop(sessionId);
    } catch {
      // The stop is a courtesy; the timeout is what the caller learns.
    }
  }

  /**
   * What sessions used (tokens, cost per currency) per session, principal, profile and source
   * (`sources`: the agents' reports, or the model proxy's reading of the provider's answers),
   * with the budget of the principal asked about. `principal` empty: your own.
   */
  async getUsage({ principal = "", since } = {}) {
    const request = { principal };
    if (since !== undefined) request.since = timestampFromDate(since);
    return this.#call(this.sessions.getUsage, request);
  }

  async stop(sessionId, { clearQueue = false } = {}) {
    return this.control({ sessionId, action: { case: "stop", value: { clearQueue } } });
  }

  /** Selects `optionId`, or dismisses the request when it is null. */
  async respondToPermission(sessionId, id, optionId) {
    const outcome = optionId == null
      ? { case: "cancelled", value: {} }
      : { case: "selectedOptionId", value: optionId };
    return this.control({
      sessionId,
      action: { case: "respondToPermission", value: { requestId: requestId(id), outcome } },
    });
  }

  /** Accepts with `accept`'s content, or declines (`decline: true`), or cancels (neither). */
  async respondElicitation(sessionId, id, { accept, decline = false } = {}) {
    let answer;
    if (accept) {
      const content = Object.fromEntries(Object.entries(accept).map(([k, v]) => [k, elicitationValue(v)]));
      answer = { case: "accept", value: { content } };
    } else if (decline) answer = { case: "decline", value: {} };
    else answer = { case: "cancel", value: {} };
    return this.control({
      sessionId,
      action: { case: "respondElicitation", value: { requestId: requestId(id), answer } },
    });
  }

  async getQueue(sessionId) {
    return (await this.#call(this.sessions.getQueue, { sessionId })).entries;
  }

  async editQueuedPrompt(sessionId, actionId, prompt) {
    return (await this.#call(this.sessions.editQueuedPrompt, { sessionId, actionId, prompt })).entry;
  }

  async removeQueuedAction(sessionId, actionId) {
    await this.#call(this.sessions.removeQueuedAction, { sessionId, actionId });
  }

  /** Every log entry after `afterOffset`, all pages. */
  async readLog(sessionId, afterOffset = 0n) {
    const entries = [];
    let after = BigInt(afterOffset);
    for (;;) {
      const page = await this.#call(this.sessions.readLog, { sessionId, afterOffset: after, limit: 5000 });
      entries.push(...page.entries);
      if (page.entries.length === 0) return entries;
      after = page.entries[page.entries.length - 1].offset;
      if (after >= page.headOffset) return entries;
    }
  }

  /** The whole transcript: every page's messages, the last page's metadata and head. */
  async getTranscript(sessionId) {
    const messages = [];
    let pageToken = "";
    let page;
    do {
      page = await this.#call(this.sessions.getTranscript, { sessionId, pageToken });
      messages.push(...page.messages);
      pageToken = page.nextPageToken;
    } while (pageToken);
    return { messages, metadata: page.metadata, headOffset: page.headOffset };
  }

  /**
   * The session's events from `afterOffset` on, until the loop breaks or `signal` aborts.
   * When the connection drops or the server restarts or drains, it resubscribes from the offset
   * of the last event it yielded, so every entry, message snapshot and turn end arrives once, in
   * order; each (re)connection's catch-up ends with a `caughtUp` event. Errors resubscribing
   * cannot fix (SESSION_NOT_FOUND, UNAUTHENTICATED, …), or a server gone longer than
   * `reconnectForMs`, are thrown as HarnessError.
   */
  async *subscribe(sessionId, { view = "messages", afterOffset = 0n, signal, resume = true, timeoutMs } = {}) {
    let cursor = BigInt(afterOffset);
    let failingSince = null;
    let backoff = 100;
    const viewValue = typeof view === "string" ? VIEWS[view] : view;
    const deadline = timeoutMs === undefined ? undefined : Date.now() + timeoutMs;
    const dedupe = new Dedupe();
    for (;;) {
      let error;
      // Aborted when the caller stops iterating: leaving the loop alone does not end the HTTP/2
      // stream, which would keep the connection (and a Node process) alive.
      const done = new AbortController();
      const streamSignal = signal ? AbortSignal.any([signal, done.signal]) : done.signal;
      try {
        const remaining = deadline === undefined ? undefined : Math.max(deadline - Date.now(), 1);
        const stream = this.sessions.subscribe(
          { sessionId, afterOffset: cursor, view: viewValue },
          { signal: streamSignal, timeoutMs: remaining },
        );
        for await (const event of stream) {
          failingSince = null;
          backoff = 100;
          cursor = event.offset;
          if (dedupe.fresh(event)) yield event;
        }
        error = new HarnessError(Code.Unavailable, "the stream ended");
      } catch (thrown) {
        error = this.#error(thrown);
        if (signal?.aborted) throw error;
        if (error.code === Code.Canceled) {
          // Not cancelled by the caller: the server went away (a kill, a restart, a cut network).
          error = new HarnessError(Code.Unavailable, `the connection dropped (${error.rawMessage})`);
        }
        if (!resume || !resumable(error)) throw error;
      } finally {
        done.abort();
      }
      if (!resume) throw error;
      failingSince ??= Date.now();
      if (Date.now() - failingSince > this.reconnectForMs) throw error;
      await sleep(backoff);
      backoff = Math.min(backoff * 2, 2000);
    }
  }

  async translateChannelMessage(message) {
    return this.#call(this.translator.translateChannelMessage, { message });
  }
}
