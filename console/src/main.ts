// The built-in console: a page served by the harness itself at `/`, talking gRPC-Web
// to the same origin. No framework: the DOM is built with `el()`, and text from the server is
// only ever set as text (an agent's output must never become markup), except the agent's own
// text, which goes through the sanitising Markdown renderer (markdown.ts).

import { create, toJson, type MessageInitShape } from "@bufbuild/protobuf";
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import {
  AgentSessionService,
  GetTranscriptResponseSchema,
  SubscribeView,
  type GetTranscriptResponse,
  type SubscribeResponse,
} from "./gen/agent_harness/v1/agent_session_service_pb.js";
import {
  AgentSessionSchema,
  type AgentSession,
  Delivery,
  type QueuedAction,
  SessionStatus,
} from "./gen/agent_harness/v1/session_pb.js";
import {
  ControlKind,
  InteractionOutcome,
  MessageRole,
  StopReason,
  type MessagePart,
  type TranscriptMessage,
} from "./gen/agent_harness/v1/transcript_pb.js";
import { JsonRpcIdSchema, PromptAttachmentSchema, type JsonRpcId } from "./gen/agent_harness/v1/actions_pb.js";
import { markdown } from "./markdown.js";
import { spentText, usageText } from "./usage.js";

// ---------------------------------------------------------------------------------------------
// The client

const TOKEN_KEY = "agent-harness-console-token";
let token = sessionStorage.getItem(TOKEN_KEY) ?? "";

const withToken: Interceptor = (next) => (req) => {
  if (token) req.header.set("authorization", `Bearer ${token}`);
  return next(req);
};

const client = createClient(
  AgentSessionService,
  createGrpcWebTransport({ baseUrl: location.origin, interceptors: [withToken] }),
);

/** `google.rpc.ErrorInfo.reason` (field 1, a string) from the status details, read by hand so the
 * console needs no generated google.rpc code. */
function errorReason(e: ConnectError): string | undefined {
  for (const detail of e.details) {
    if (!("type" in detail) || detail.type !== "google.rpc.ErrorInfo") continue;
    const bytes = detail.value;
    let at = 0;
    while (at < bytes.length) {
      const tag = bytes[at++];
      let len = 0;
      for (let shift = 0; ; shift += 7) {
        const b = bytes[at++];
        len |= (b & 0x7f) << shift;
        if (b < 0x80) break;
      }
      if (tag === 0x0a) return new TextDecoder().decode(bytes.subarray(at, at + len));
      if ((tag & 7) !== 2) return undefined;
      at += len;
    }
  }
  return undefined;
}

/** One line for a person: the gRPC code, the ErrorInfo reason, and the server's message. */
function describe(err: unknown): string {
  const e = ConnectError.from(err);
  if (e.code === Code.Unauthenticated) {
    return token
      ? "Not signed in: the server refused the token (UNAUTHENTICATED). Check the token field."
      : "This server needs a token (UNAUTHENTICATED): enter it in the token field.";
  }
  const reason = errorReason(e);
  const code = Code[e.code] ?? String(e.code);
  return `${code}${reason ? ` (${reason})` : ""}: ${e.rawMessage}`;
}

// ---------------------------------------------------------------------------------------------
// DOM helpers

type Attrs = Record<string, string | boolean | ((ev: Event) => void)>;

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Attrs = {},
  ...children: (Node | string | null | undefined | false)[]
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (typeof value === "function") node.addEventListener(name.slice(2), value);
    else if (value === true) node.setAttribute(name, "");
    else if (value !== false) node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child);
  }
  return node;
}

function byId<T extends HTMLElement>(id: string): T {
  const node = document.getElementById(id);
  if (!node) throw new Error(`#${id} is missing from index.html`);
  return node as T;
}

const statusName = (s: SessionStatus) =>
  (SessionStatus[s] ?? "UNSPECIFIED").toLowerCase().replace(/_/g, " ");
const outcomeName = (o: InteractionOutcome) =>
  (InteractionOutcome[o] ?? "UNSPECIFIED").toLowerCase();

// ---------------------------------------------------------------------------------------------
// State

interface Current {
  id: string;
  messages: Map<string, TranscriptMessage>;
  queue: QueuedAction[];
  status: SessionStatus;
  caughtUp: boolean;
  abort: AbortController;
}

let current: Current | null = null;

function showError(text: string) {
  const box = byId("error");
  box.textContent = text;
  box.hidden = text === "";
}

async function attempt(what: () => Promise<unknown>) {
  try {
    await what();
    showError("");
  } catch (err) {
    showError(describe(err));
  }
}

// ---------------------------------------------------------------------------------------------
// Sessions list

async function refreshSessions() {
  const list = byId("sessions");
  const response = await client.listSessions({ pageSize: 100 });
  list.replaceChildren(
    ...response.sessions.map((s) => {
      const selected = current?.id === s.id;
      return el(
        "li",
        {},
        el(
          "a",
          {
            href: `#session=${encodeURIComponent(s.id)}`,
            "aria-current": selected ? "true" : false,
            "data-session": s.id,
          },
          el("span", { class: "name" }, s.name || s.id),
          " ",
          el("span", { class: `status status-${SessionStatus[s.status]?.toLowerCase()}` }, statusName(s.status)),
        ),
      );
    }),
  );
  if (response.sessions.length === 0) list.append(el("li", { class: "empty" }, "No sessions yet."));
  // A new session starts where the newest one works, unless the person typed a directory.
  const cwd = byId<HTMLInputElement>("create-cwd");
  const newest = response.sessions[0]?.cwd;
  if (newest && (cwd.value === "" || cwd.dataset.suggested === cwd.value)) {
    cwd.value = newest;
    cwd.dataset.suggested = newest;
  }
}

async function createSession(form: HTMLFormElement) {
  const data = new FormData(form);
  const name = String(data.get("name") ?? "").trim();
  const response = await client.createSession({
    profile: String(data.get("profile") ?? "mock"),
    cwd: String(data.get("cwd") ?? ""),
    name: name || undefined,
  });
  const id = response.session?.id ?? "";
  const cwd = byId<HTMLInputElement>("create-cwd").value;
  form.reset();
  byId<HTMLInputElement>("create-cwd").value = cwd;
  byId<HTMLInputElement>("create-cwd").dataset.suggested = cwd;
  byId<HTMLDetailsElement>("create").open = false;
  location.hash = `session=${encodeURIComponent(id)}`;
}

// ---------------------------------------------------------------------------------------------
// One session: subscribe (MESSAGES view), render

function selectedFromHash(): string | null {
  const match = /^#session=(.+)$/.exec(location.hash);
  return match ? decodeURIComponent(match[1]) : null;
}

async function openSession(id: string | null) {
  current?.abort.abort();
  current = null;
  byId("session").hidden = id === null;
  byId("placeholder").hidden = id !== null;
  if (id === null) return;
  const abort = new AbortController();
  current = { id, messages: new Map(), queue: [], status: SessionStatus.UNSPECIFIED, caughtUp: false, abort };
  byId("session-title").textContent = id;
  byId("transcript").replaceChildren();
  showUsage("");
  render();
  const me = current;
  try {
    const session = await client.getSession({ sessionId: id }, { signal: abort.signal });
    if (session.session) showSession(session.session);
  } catch (err) {
    if (!abort.signal.aborted) showError(describe(err));
    return;
  }
  // Follow the stream; when it drops (a restart, a network blip) resume after the last offset
  // seen, so nothing is shown twice or lost.
  let after = 0n;
  let dropped = false;
  while (!abort.signal.aborted && current === me) {
    try {
      const stream = client.subscribe(
        { sessionId: id, afterOffset: after, view: SubscribeView.MESSAGES },
        { signal: abort.signal },
      );
      for await (const event of stream) {
        if (current !== me) return;
        if (dropped) {
          dropped = false;
          showError("");
        }
        if (event.offset > after) after = event.offset;
        apply(me, event);
      }
    } catch (err) {
      if (abort.signal.aborted) return;
      const code = ConnectError.from(err).code;
      showError(describe(err));
      if (code === Code.Unauthenticated || code === Code.NotFound || code === Code.PermissionDenied) return;
    }
    dropped = true;
    me.caughtUp = false;
    byId("live").textContent = "reconnecting…";
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

function showSession(s: AgentSession) {
  byId("session-title").textContent = s.name || s.id;
  byId("session-meta").textContent = `${s.profile} · ${s.cwd}${s.model ? ` · ${s.model}` : ""} · ${s.id}`;
  const context = usageText(s.usage);
  showUsage(context);
  if (current) current.status = s.status;
  // The tokens it used, as GetUsage sums them (the agent's reports, or the model proxy's
  // reading of the provider's answers): beside the context window the agent reports.
  void client
    .getUsage({})
    .then((answer) => {
      const spent = spentText(answer.sessions.find((u) => u.sessionId === s.id)?.totals);
      if (current?.id === s.id && spent) showUsage([context, spent].filter(Boolean).join(" · "));
    })
    .catch(() => {});
}

function showUsage(text: string) {
  const usage = byId("usage");
  usage.textContent = text;
  usage.hidden = text === "";
}

/** The session again, for what a turn changed beyond the transcript (usage and cost). */
function refreshSession(state: Current) {
  void client
    .getSession({ sessionId: state.id }, { signal: state.abort.signal })
    .then((response) => {
      if (current === state && response.session) {
        showSession(response.session);
        render();
      }
    })
    .catch(() => {});
}

function apply(state: Current, event: SubscribeResponse) {
  switch (event.event.case) {
    case "message": {
      state.messages.set(event.event.value.id, event.event.value);
      break;
    }
    case "queue":
      state.queue = event.event.value.entries;
      break;
    case "status":
      state.status = event.event.value.status;
      void refreshSessions().catch(() => {});
      refreshSession(state);
      break;
    case "turnEnded":
      refreshSession(state);
      return;
    case "caughtUp":
      state.caughtUp = true;
      break;
    default:
      return;
  }
  render();
}

function render() {
  const state = current;
  if (!state) return;
  const status = byId("session-status");
  status.textContent = statusName(state.status);
  status.className = `status status-${SessionStatus[state.status]?.toLowerCase()}`;
  // Stop means something only while a turn runs (or waits on an answer).
  byId("stop").hidden = !(state.status === SessionStatus.RUNNING || state.status === SessionStatus.AWAITING_INPUT);
  byId("live").textContent = state.caughtUp ? "live" : "catching up…";
  const ordered = [...state.messages.values()].sort((a, b) => Number(a.firstOffset - b.firstOffset));
  const transcript = byId("transcript");
  const stick = transcript.scrollHeight - transcript.scrollTop - transcript.clientHeight < 40;
  // What a person has typed into a question the agent waits on survives the re-render (a status
  // change or a streamed chunk arrives while they type), and so does the focus.
  const typed = new Map<string, string>();
  for (const input of transcript.querySelectorAll<HTMLInputElement>("form.elicitation.pending input")) {
    typed.set(fieldKey(input), input.value);
  }
  const focused = document.activeElement instanceof HTMLInputElement && transcript.contains(document.activeElement)
    ? fieldKey(document.activeElement)
    : undefined;
  transcript.replaceChildren(...ordered.map(renderMessage));
  for (const input of transcript.querySelectorAll<HTMLInputElement>("form.elicitation.pending input")) {
    const key = fieldKey(input);
    const value = typed.get(key);
    if (value !== undefined) input.value = value;
    if (key === focused) input.focus();
  }
  if (stick) transcript.scrollTop = transcript.scrollHeight;
  renderQueue(state.queue);
}

/** An input of a question, by its message and field: the same after a re-render. */
function fieldKey(input: HTMLInputElement): string {
  return `${input.closest("[data-message]")?.getAttribute("data-message") ?? ""}/${input.name}`;
}

function renderMessage(m: TranscriptMessage): HTMLElement {
  const role = m.role === MessageRole.USER ? "user" : "agent";
  const footer: string[] = [];
  if (m.stopReason !== undefined && m.stopReason !== StopReason.UNSPECIFIED) {
    footer.push(`stopped: ${(StopReason[m.stopReason] ?? "").toLowerCase().replace(/_/g, " ")}`);
  }
  if (m.error) footer.push(`error: ${m.error}`);
  return el(
    "article",
    { class: `message ${role}`, "data-message": m.id, "aria-label": `${role} message, turn ${m.turn}` },
    el("header", {}, el("span", { class: "role" }, role === "user" ? `You (${m.actor})` : "Agent"), el("span", { class: "turn" }, `turn ${m.turn}`)),
    ...m.parts.map((p) => renderPart(p, role)),
    footer.length ? el("footer", { class: "stop" }, footer.join(" · ")) : null,
  );
}

function renderPart(part: MessagePart, role: "user" | "agent"): HTMLElement | null {
  const kind = part.kind;
  switch (kind.case) {
    case "text":
      // A person's prompt is shown as typed; the agent's text is Markdown.
      return role === "agent" ? markdown(kind.value.text, "text markdown") : el("p", { class: "text" }, kind.value.text);
    case "thought":
      return el("p", { class: "thought" }, el("span", { class: "label" }, "thinking: "), kind.value.text);
    case "attachment":
      return el("p", { class: "attachment" }, "📎 ", el("a", { href: safeHref(kind.value.uri), rel: "noreferrer noopener", target: "_blank" }, kind.value.name || kind.value.uri));
    case "tool":
      return el(
        "div",
        { class: `tool tool-${kind.value.status}`, "data-tool": kind.value.toolCallId },
        el("span", { class: "label" }, "tool"),
        " ",
        el("strong", {}, kind.value.title || kind.value.toolCallId),
        " ",
        el("span", { class: "tool-status" }, kind.value.status || "pending"),
      );
    case "plan":
      return el(
        "ol",
        { class: "plan", "aria-label": "plan" },
        ...kind.value.entries.map((e) => el("li", { class: `plan-${e.status}` }, `${e.content} (${e.status})`)),
      );
    case "permission":
      return renderPermission(kind.value.requestId, kind.value.toolCallJson, kind.value.options, kind.value.outcome, kind.value.selectedOptionId);
    case "elicitation":
      return renderElicitation(kind.value.requestId, kind.value.message, kind.value.requestJson, kind.value.outcome);
    case "control":
      return el("p", { class: "control" }, `control: ${kind.value.value || "stop"} (${outcomeName(kind.value.outcome)})`);
    case "content":
      return el("p", { class: "content" }, `[${kind.value.type} content]`);
    case "contextRebuilt":
      return el("p", { class: "control" }, `context rebuilt: a new agent session, given the last ${kind.value.turns} turns (${kind.value.reason})`);
    default:
      return null;
  }
}

/** Only http(s) links are followed; anything else (javascript:, data:) is shown inert. */
function safeHref(uri: string): string {
  return /^https?:\/\//i.test(uri) ? uri : "#";
}

function titleOf(toolCallJson: string): string {
  try {
    const call = JSON.parse(toolCallJson) as { title?: string };
    return call.title ?? "a tool call";
  } catch {
    return "a tool call";
  }
}

function copyId(id: JsonRpcId | undefined): JsonRpcId {
  return create(JsonRpcIdSchema, { id: id?.id ?? { case: undefined } });
}

function renderPermission(
  requestId: JsonRpcId | undefined,
  toolCallJson: string,
  options: { optionId: string; name: string; kind: string }[],
  outcome: InteractionOutcome,
  selected: string | undefined,
): HTMLElement {
  const title = titleOf(toolCallJson);
  const pending = outcome === InteractionOutcome.PENDING;
  return el(
    "fieldset",
    { class: `permission ${pending ? "pending" : "answered"}` },
    el("legend", {}, `Permission: ${title}`),
    pending
      ? el(
          "div",
          { class: "choices", role: "group", "aria-label": `Answer the permission request: ${title}` },
          ...options.map((o) =>
            el(
              "button",
              {
                type: "button",
                class: o.kind.startsWith("allow") ? "allow" : "reject",
                onclick: () =>
                  attempt(() =>
                    client.control({
                      sessionId: current?.id ?? "",
                      action: {
                        case: "respondToPermission",
                        value: { requestId: copyId(requestId), outcome: { case: "selectedOptionId", value: o.optionId } },
                      },
                    }),
                  ),
              },
              o.name,
            ),
          ),
        )
      : el("p", {}, `${outcomeName(outcome)}${selected ? `: ${selected}` : ""}`),
  );
}

function renderElicitation(
  requestId: JsonRpcId | undefined,
  message: string,
  requestJson: string,
  outcome: InteractionOutcome,
): HTMLElement {
  const pending = outcome === InteractionOutcome.PENDING;
  let fields: [string, string][] = [];
  try {
    const schema = (JSON.parse(requestJson) as { requestedSchema?: { properties?: Record<string, { title?: string }> } })
      .requestedSchema;
    fields = Object.entries(schema?.properties ?? {}).map(([name, p]) => [name, p.title ?? name]);
  } catch {
    fields = [];
  }
  const send = (answer: "accept" | "decline" | "cancel", form?: HTMLFormElement) =>
    attempt(() => {
      const data = form ? new FormData(form) : new FormData();
      const content: Record<string, { kind: { case: "text"; value: string } }> = {};
      for (const [name] of fields) content[name] = { kind: { case: "text", value: String(data.get(name) ?? "") } };
      return client.control({
        sessionId: current?.id ?? "",
        action: {
          case: "respondElicitation",
          value: {
            requestId: copyId(requestId),
            answer:
              answer === "accept"
                ? { case: "accept", value: { content } }
                : answer === "decline"
                  ? { case: "decline", value: {} }
                  : { case: "cancel", value: {} },
          },
        },
      });
    });
  if (!pending) {
    return el("fieldset", { class: "elicitation answered" }, el("legend", {}, `Question: ${message}`), el("p", {}, outcomeName(outcome)));
  }
  const form: HTMLFormElement = el(
    "form",
    {
      class: "elicitation pending",
      onsubmit: (ev: Event) => {
        ev.preventDefault();
        void send("accept", form);
      },
    },
    el("fieldset", {}, el("legend", {}, `Question: ${message}`),
      ...fields.map(([name, title]) => el("label", {}, title, " ", el("input", { name, required: true }))),
      el("div", { class: "choices" },
        el("button", { type: "submit", class: "allow" }, "Send"),
        el("button", { type: "button", onclick: () => void send("decline") }, "Decline"),
        el("button", { type: "button", onclick: () => void send("cancel") }, "Cancel"),
      ),
    ),
  );
  return form;
}

function renderQueue(queue: QueuedAction[]) {
  const list = byId("queue");
  byId("queue-section").hidden = queue.length === 0;
  list.replaceChildren(
    ...queue.map((q, i) =>
      el(
        "li",
        { "data-action": q.actionId },
        el("span", { class: "position" }, `${i + 1}.`),
        " ",
        el("span", { class: "queued-text" }, q.prompt ?? "(compact)"),
        " ",
        q.prompt !== undefined
          ? el("button", {
              type: "button",
              "aria-label": `Edit queued prompt ${i + 1}`,
              onclick: () => {
                const text = prompt("Edit the queued prompt", q.prompt ?? "");
                if (text === null) return;
                void attempt(() => client.editQueuedPrompt({ sessionId: current?.id ?? "", actionId: q.actionId, prompt: text }));
              },
            }, "Edit")
          : null,
        el("button", {
          type: "button",
          "aria-label": `Remove queued action ${i + 1}`,
          onclick: () => void attempt(() => client.removeQueuedAction({ sessionId: current?.id ?? "", actionId: q.actionId })),
        }, "Remove"),
      ),
    ),
  );
}

// ---------------------------------------------------------------------------------------------
// The prompt box

function addAttachmentRow() {
  const rows = byId("attachments");
  const n = rows.children.length + 1;
  rows.append(
    el("div", { class: "attachment-row" },
      el("label", {}, `Attachment ${n} URL`, el("input", { type: "url", name: "attachment-uri", placeholder: "https://…" })),
      el("label", {}, "Name", el("input", { name: "attachment-name" })),
    ),
  );
}

async function sendPrompt(form: HTMLFormElement, delivery: Delivery) {
  if (!current) return;
  const data = new FormData(form);
  const text = String(data.get("prompt") ?? "");
  const uris = data.getAll("attachment-uri").map(String);
  const names = data.getAll("attachment-name").map(String);
  const attachments: MessageInitShape<typeof PromptAttachmentSchema>[] = uris
    .map((uri, i) => ({ uri: uri.trim(), name: names[i]?.trim() || uri.trim() }))
    .filter((a) => a.uri !== "");
  await client.control({
    sessionId: current.id,
    delivery,
    action: { case: "prompt", value: { prompt: text, attachments } },
  });
  form.reset();
  byId("attachments").replaceChildren();
}

// ---------------------------------------------------------------------------------------------
// Download: the same two forms `agent-harness export` writes

async function fetchExport(id: string): Promise<{ session: AgentSession; transcript: GetTranscriptResponse }> {
  const session = (await client.getSession({ sessionId: id })).session ?? create(AgentSessionSchema);
  const transcript = create(GetTranscriptResponseSchema);
  let pageToken = "";
  do {
    const page = await client.getTranscript({ sessionId: id, pageSize: 500, pageToken });
    transcript.messages.push(...page.messages);
    transcript.metadata = page.metadata;
    transcript.headOffset = page.headOffset;
    pageToken = page.nextPageToken;
  } while (pageToken);
  return { session, transcript };
}

const enumName = (names: Record<number, string>, value: number, prefix = "") =>
  (names[value] ?? "UNSPECIFIED").replace(prefix, "").toLowerCase();
const when = (ts: Timestamp | undefined) => (ts ? timestampDate(ts).toISOString() : "—");
// Everything an agent (or a caller) wrote is foreign to the page, as in `agent-harness export`:
// multi-line text is fenced (shown as written), text inside a line of ours escaped or in a code
// span, so it can neither forge a turn heading nor carry live HTML.
/** Foreign text inside a line: one line, HTML and Markdown punctuation escaped. */
const inline = (text: string) =>
  text.replace(/[\r\n]/g, " ").replace(/[<>&\\`*_[\]#|~!]/g, (c) =>
    c === "<" ? "&lt;" : c === ">" ? "&gt;" : c === "&" ? "&amp;" : `\\${c}`);
/** Foreign text as a code span. */
const code = (text: string) => "`" + text.replace(/`/g, "'").replace(/[\r\n]/g, " ") + "`";
const cell = inline;
/** Text shown exactly as written, in a fence longer than any run of backticks inside it. */
function fenced(text: string, info = "text"): string {
  const longest = Math.max(0, ...(text.match(/`+/g) ?? []).map((run) => run.length));
  const fence = "`".repeat(Math.max(longest, 2) + 1);
  return `${fence}${info}\n${text.replace(/\n+$/, "")}\n${fence}\n\n`;
}

function jsonBlock(text: string): string {
  let pretty = text;
  try {
    pretty = JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    // Not JSON: shown as it came.
  }
  const cut = pretty.length > 2000 ? "\n… (cut; the JSON export has it whole)" : "";
  return fenced(pretty.slice(0, 2000) + cut, "json").replace(/\n+$/, "\n");
}

/** An attachment as a link when its URI is a web address, else as code. */
function link(name: string, uri: string): string {
  if (/^https?:\/\//.test(uri) && !/[\s<>]/.test(uri)) {
    return `[${inline(name)}](${uri.replace(/\(/g, "%28").replace(/\)/g, "%29")})`;
  }
  return `${inline(name)} ${code(uri)}`;
}

/** The Markdown form: a metadata header, then each turn's messages in order. */
function exportMarkdown(s: AgentSession, t: GetTranscriptResponse): string {
  let md = `# Session transcript: ${cell(s.name || s.id)}\n\n| | |\n|---|---|\n`;
  const statusText = enumName(SessionStatus, s.status);
  const status = statusText + (s.statusReason && s.statusReason !== statusText ? ` (${s.statusReason})` : "");
  const labels = Object.entries(s.labels).map(([k, v]) => code(`${k}=${v}`)).join(", ");
  const rows: [string, string][] = [
    ["Session", code(s.id)], ["Name", s.name], ["Owner", s.owner], ["Editors", s.editors.join(", ")],
    ["Profile", s.profile], ["Agent", s.agentInfo ? `${s.agentInfo.name} ${s.agentInfo.version}` : ""],
    ["Model", s.model], ["Working directory", code(s.cwd)], ["Status", status],
    ["Created", when(s.createdAt)], ["Last change", when(s.updatedAt)], ["Labels", labels],
    ["Log offset", String(t.headOffset)],
  ];
  for (const [key, value] of rows) {
    // Values already made safe (code spans) are kept as they are.
    const shown = value.startsWith("`") && value.endsWith("`") ? value.replace(/\|/g, "\\|") : cell(value);
    if (value) md += `| ${key} | ${shown} |\n`;
  }
  md += "\n";
  if (t.messages.length === 0) md += "_No turns yet._\n";
  let turn = -1;
  for (const m of t.messages) {
    if (m.turn !== turn) {
      turn = m.turn;
      md += `## Turn ${m.turn}\n\n`;
    }
    const user = m.role === MessageRole.USER;
    md += `### ${user ? "User" : "Agent"}${user && m.actor ? ` — ${inline(m.actor)}` : ""}${m.inherited ? " (from the parent session)" : ""}\n\n`;
    const attachments: string[] = [];
    for (const part of m.parts) {
      const v = part.kind;
      switch (v.case) {
        // A person's prompt as typed, line for line; an agent's text as its Markdown source.
        case "text": md += user ? fenced(v.value.text) : fenced(v.value.text, "markdown"); break;
        case "thought": md += `_Thinking:_\n\n${fenced(v.value.text, "markdown")}`; break;
        case "attachment": {
          const mime = v.value.mimeType !== undefined ? inline(v.value.mimeType) : undefined;
          const about = [mime, v.value.size !== undefined ? `${v.value.size} bytes` : undefined].filter(Boolean);
          attachments.push(`- ${link(v.value.name, v.value.uri)}${about.length ? ` (${about.join(", ")})` : ""}`);
          break;
        }
        case "tool": {
          md += `**Tool call** ${code(v.value.title || v.value.toolCallId)}${v.value.kind ? ` (${inline(v.value.kind)})` : ""} — **${inline(v.value.status || "pending")}**\n\n`;
          if (v.value.contentJson && v.value.contentJson !== "[]") md += jsonBlock(v.value.contentJson) + "\n";
          break;
        }
        case "plan":
          md += "**Plan**\n\n" + v.value.entries.map((e) => `- [${e.status === "completed" ? "x" : " "}] ${inline(e.content)} (${inline(e.status)})\n`).join("") + "\n";
          break;
        case "permission": {
          const options = v.value.options.map((o) => `${code(o.optionId)} (${inline(o.name)})`).join(", ");
          const outcome = enumName(InteractionOutcome, v.value.outcome, "INTERACTION_OUTCOME_");
          const answer = v.value.selectedOptionId !== undefined ? `${outcome}: ${code(v.value.selectedOptionId)}` : outcome;
          md += `**Permission asked** for ${inline(titleOf(v.value.toolCallJson))}; options ${options} — answer: **${answer}**\n\n`;
          break;
        }
        case "elicitation": {
          const outcome = enumName(InteractionOutcome, v.value.outcome, "INTERACTION_OUTCOME_");
          md += `**Question** ${inline(v.value.message)} — answer: **${outcome}**${v.value.answerJson ? ` ${code(v.value.answerJson)}` : ""}\n\n`;
          break;
        }
        case "control": {
          const kind = enumName(ControlKind, v.value.kind, "CONTROL_KIND_");
          md += `_Control:_ ${kind}${v.value.value ? ` ${code(v.value.value)}` : ""} — ${enumName(InteractionOutcome, v.value.outcome, "INTERACTION_OUTCOME_")}\n\n`;
          break;
        }
        case "content": md += `_Content (${inline(v.value.type)}):_\n\n${jsonBlock(v.value.json)}\n`; break;
        case "contextRebuilt":
          md += `_Context rebuilt (${inline(v.value.reason)}): ${v.value.turns} turns, ${v.value.bytes} bytes replayed._\n\n`;
          break;
        default: break;
      }
    }
    if (attachments.length) md += `Attachments:\n\n${attachments.join("\n")}\n\n`;
    if (m.stopReason !== undefined) md += `_Turn ended: ${enumName(StopReason, m.stopReason, "STOP_REASON_")}._\n\n`;
    if (m.error !== undefined) md += `_Error:_ ${inline(m.error)}\n\n`;
  }
  return md;
}

async function download(format: "json" | "markdown") {
  if (!current) return;
  const id = current.id;
  const { session, transcript } = await fetchExport(id);
  const text = format === "json"
    ? JSON.stringify({
      format: "agent-harness.export.v1",
      session: toJson(AgentSessionSchema, session),
      transcript: toJson(GetTranscriptResponseSchema, transcript),
    }, null, 2) + "\n"
    : exportMarkdown(session, transcript);
  const blob = new Blob([text], { type: format === "json" ? "application/json" : "text/markdown" });
  const url = URL.createObjectURL(blob);
  const link = el("a", { href: url, download: `session-${id}.${format === "json" ? "json" : "md"}` });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

// ---------------------------------------------------------------------------------------------
// Wiring

function main() {
  const tokenInput = byId<HTMLInputElement>("token");
  tokenInput.value = token;
  byId<HTMLFormElement>("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    token = tokenInput.value.trim();
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
    void attempt(refreshSessions).then(() => openSession(selectedFromHash()));
  });
  byId<HTMLFormElement>("create-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    void attempt(() => createSession(ev.target as HTMLFormElement));
  });
  const promptForm = byId<HTMLFormElement>("prompt-form");
  promptForm.addEventListener("submit", (ev) => {
    ev.preventDefault();
    void attempt(() => sendPrompt(promptForm, Delivery.QUEUE));
  });
  byId("interrupt").addEventListener("click", () => void attempt(() => sendPrompt(promptForm, Delivery.INTERRUPT)));
  byId<HTMLTextAreaElement>("prompt").addEventListener("keydown", (ev) => {
    // Ctrl/Cmd+Enter sends; Enter alone is a new line.
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) {
      ev.preventDefault();
      promptForm.requestSubmit();
    }
  });
  byId("add-attachment").addEventListener("click", addAttachmentRow);
  byId("stop").addEventListener("click", () =>
    void attempt(() => client.control({ sessionId: current?.id ?? "", action: { case: "stop", value: { clearQueue: false } } })),
  );
  byId("refresh").addEventListener("click", () => void attempt(refreshSessions));
  byId("download-json").addEventListener("click", () => void attempt(() => download("json")));
  byId("download-markdown").addEventListener("click", () => void attempt(() => download("markdown")));
  window.addEventListener("hashchange", () => {
    void openSession(selectedFromHash());
    void attempt(refreshSessions);
  });
  void suggestCwd();
  void attempt(refreshSessions);
  void openSession(selectedFromHash());
}

/** The server's suggestion for a new session's directory (where it was started; only given to
 * loopback pages), used until there is a newest session to follow. */
async function suggestCwd() {
  try {
    const response = await fetch("/defaults.json");
    if (!response.ok) return;
    const { cwd } = (await response.json()) as { cwd?: string | null };
    const input = byId<HTMLInputElement>("create-cwd");
    if (cwd && input.value === "") {
      input.value = cwd;
      input.dataset.suggested = cwd;
    }
  } catch {
    // No suggestion: the field stays empty with its placeholder.
  }
}

main();
