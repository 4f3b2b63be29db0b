// @agent-harness/client: typed calls to agent-harness over gRPC or gRPC-Web (connect-es), every
// error thrown as one HarnessError carrying the ErrorInfo reason, and a subscribe() that
// reconnects and resumes from the last offset by itself. Types: index.d.ts.

import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { BinaryReader } from "@bufbuild/protobuf/wire";

import {
  AgentSessionService,
  SubscribeView,
} from "./gen/agent_harness/v1/agent_session_service_pb.js";
import { Delivery } from "./gen/agent_harness/v1/session_pb.js";
import { ChannelTranslatorService } from "./gen/agent_harness/v1/translator_service_pb.js";

export * from "./gen/agent_harness/v1/actions_pb.js";
export * from "./gen/agent_harness/v1/agent_session_service_pb.js";
export * from "./gen/agent_harness/v1/channel_pb.js";
export * from "./gen/agent_harness/v1/errors_pb.js";
export * from "./gen/agent_harness/v1/session_pb.js";
export * from "./gen/agent_harness/v1/transcript_pb.js";
export * from "./gen/agent_harness/v1/translator_service_pb.js";
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

/** A failed call. Branch on `reason` (e.g. "SESSION_NOT_FOUND"), never on the message text. */
export class HarnessError extends Error {
  constructor(code, message, reason = undefined, metadata = {}, domain = undefined) {
    super(`${reason ?? Code[code]}: ${message}`);
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
    return new HarnessError(connect.code, connect.rawMessage);
  }
}

/** Whether resubscribing can help: a dropped connection, a restarting or draining server. */
function resumable(error) {
  if (error.code === Code.Unavailable) return true;
  if (error.reason !== undefined) return false;
  return [Code.Unknown, Code.Internal, Code.Canceled, Code.Aborted].includes(error.code);
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
    const {
      baseUrl = "http://127.0.0.1:50051",
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
    this.transport = transport ?? make({ baseUrl, interceptors });
    /** The generated connect-es clients, for anything the helpers do not cover. */
    this.sessions = createClient(AgentSessionService, this.transport);
    this.translator = createClient(ChannelTranslatorService, this.transport);
    this.timeoutMs = timeoutMs;
    this.reconnectForMs = reconnectForMs;
  }

  async #call(method, request) {
    try {
      return await method(request, { timeoutMs: this.timeoutMs });
    } catch (error) {
      throw HarnessError.from(error);
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

  /** Sends or queues a prompt; `interrupt` cancels the running turn first. */
  async prompt(sessionId, text, { attachments = [], interrupt = false, actionId } = {}) {
    return this.control({
      sessionId,
      actionId,
      delivery: interrupt ? Delivery.INTERRUPT : Delivery.QUEUE,
      action: { case: "prompt", value: { prompt: text, attachments: attachments.map(attachment) } },
    });
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
  async *subscribe(sessionId, { view = "messages", afterOffset = 0n, signal } = {}) {
    let cursor = BigInt(afterOffset);
    let failingSince = null;
    let backoff = 100;
    const viewValue = typeof view === "string" ? VIEWS[view] : view;
    for (;;) {
      let error;
      try {
        const stream = this.sessions.subscribe({ sessionId, afterOffset: cursor, view: viewValue }, { signal });
        for await (const event of stream) {
          failingSince = null;
          backoff = 100;
          cursor = event.offset;
          yield event;
        }
        error = new HarnessError(Code.Unavailable, "the stream ended");
      } catch (thrown) {
        error = HarnessError.from(thrown);
        if (signal?.aborted || !resumable(error)) throw error;
      }
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
