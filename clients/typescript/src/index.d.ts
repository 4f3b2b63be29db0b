// Types of @agent-harness/client (src/index.js). The generated message types are re-exported
// from src/gen.
import type { Client, Code, Transport } from "@connectrpc/connect";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type {
  AgentSessionService,
  ControlRequestSchema,
  ControlResponse,
  GetUsageResponse,
  QueueSnapshot,
  SessionStatusChange,
  SubscribeResponse,
  SubscribeView,
} from "./gen/agent_harness/v1/agent_session_service_pb.js";
import type { JsonRpcId, PromptAttachment } from "./gen/agent_harness/v1/actions_pb.js";
import type { ChannelMessage } from "./gen/agent_harness/v1/channel_pb.js";
import type { AgentSession, QueuedAction, SessionStatus, Usage } from "./gen/agent_harness/v1/session_pb.js";
import type {
  ElicitationPart,
  LogEntry,
  MessagePart,
  PermissionPart,
  SessionMetadata,
  StopReason,
  ToolPart,
  TranscriptMessage,
  TurnEnded,
} from "./gen/agent_harness/v1/transcript_pb.js";
import type {
  ChannelTranslatorService,
  TranslateChannelMessageResponse,
} from "./gen/agent_harness/v1/translator_service_pb.js";

export * from "./gen/agent_harness/v1/actions_pb.js";
export * from "./gen/agent_harness/v1/agent_session_service_pb.js";
export * from "./gen/agent_harness/v1/channel_pb.js";
export * from "./gen/agent_harness/v1/errors_pb.js";
export * from "./gen/agent_harness/v1/session_pb.js";
export * from "./gen/agent_harness/v1/transcript_pb.js";
export * from "./gen/agent_harness/v1/translator_service_pb.js";
export * from "./gen/agent_harness/v1/usage_pb.js";
export { Code } from "@connectrpc/connect";

export declare const ERROR_DOMAIN: "agent-harness";
/** The server when neither an argument nor AGENT_HARNESS_SERVER names one. */
export declare const DEFAULT_SERVER: "http://127.0.0.1:50051";
/** How long runTurn and turnEvents wait for a turn unless told (ten minutes). */
export declare const DEFAULT_TURN_TIMEOUT_MS: 600000;

export declare class HarnessError extends Error {
  readonly code: Code;
  readonly codeName: string;
  readonly rawMessage: string;
  /** The ErrorInfo reason, or the status code's gRPC name ("UNAVAILABLE") when there is none. */
  readonly reason: string;
  readonly metadata: Record<string, string>;
  readonly domain: string | undefined;
  /** Whether the service chose this error (it carried an ErrorInfo), not the transport. */
  readonly fromService: boolean;
  static from(error: unknown): HarnessError;
}

/** `http://host[:port]` or `https://host[:port]` normalised; else throws HarnessError INVALID_SERVER_URL. */
export declare function parseServer(server: string, source?: string): string;
/** The text parts of a transcript message, joined. */
export declare function messageText(message: TranscriptMessage): string;
/** The values of a message's parts of one kind. */
export declare function partsOf<K extends NonNullable<MessagePart["kind"]["case"]>>(
  message: TranscriptMessage | undefined,
  kind: K,
): Extract<MessagePart["kind"], { case: K }>["value"][];
/** A message's tool calls, in order. */
export declare function toolCalls(message: TranscriptMessage | undefined): ToolPart[];
/** The permission requests of a message that still wait for an answer (each has its id). */
export declare function pendingPermissions(
  message: TranscriptMessage | undefined,
): (PermissionPart & { requestId: JsonRpcId })[];
/** The elicitations of a message that still wait for an answer (each has its id). */
export declare function pendingElicitations(
  message: TranscriptMessage | undefined,
): (ElicitationPart & { requestId: JsonRpcId })[];

/** A stream event, flattened (as the Python client's Event). */
export interface HarnessEvent {
  kind: "message" | "turnEnded" | "status" | "queue" | "entry" | "caughtUp" | "heartbeat" | "unknown";
  offset: bigint;
  message?: TranscriptMessage;
  turnEnded?: TurnEnded;
  status?: SessionStatusChange;
  queue?: QueueSnapshot;
  entry?: LogEntry;
}
export declare function eventOf(response: SubscribeResponse): HarnessEvent;

/** What runTurn (or prompt with `wait: true`) resolves to once the turn has ended. */
export interface TurnResult {
  /** The prompt's action id (the agent message's `requestId`). */
  actionId: string;
  turn: number;
  stopReason: StopReason;
  /** e.g. "END_TURN", "FAILED"; "UNKNOWN_<n>" for a value newer than this package. */
  stopReasonName: string;
  /** stopReason is END_TURN. */
  ok: boolean;
  /** Set when the turn failed. */
  error: string | undefined;
  /** The agent's final text: its message's text parts, joined. */
  text: string;
  toolCalls: ToolPart[];
  /** The session's usage after the turn, when the agent reports it. */
  usage: Usage | undefined;
  message: TranscriptMessage | undefined;
}

export interface PromptOptions {
  attachments?: Attachment[];
  interrupt?: boolean;
  actionId?: string;
  /** Refuse (SESSION_BUSY, nothing stored) unless the session is idle with an empty queue. */
  onlyIfIdle?: boolean;
}

export interface TurnOptions extends PromptOptions {
  /** Bounds the whole turn: past it the turn is stopped and HarnessError DEADLINE_EXCEEDED
   * thrown. Default DEFAULT_TURN_TIMEOUT_MS (ten minutes); `null`: no bound. */
  timeoutMs?: number | null;
  signal?: AbortSignal;
  /** Sees each event of the turn as it comes (e.g. to answer a permission request). */
  onEvent?: (event: SubscribeResponse) => void | Promise<void>;
}

export type Attachment = string | { uri: string; name: string; mimeType?: string; size?: bigint };
export type RequestId = number | bigint | string | JsonRpcId;

export interface ClientOptions {
  baseUrl?: string;
  token?: string;
  protocol?: "grpc" | "grpc-web";
  transport?: Transport;
  timeoutMs?: number;
  reconnectForMs?: number;
}

export declare class AgentHarnessClient {
  /** A base URL ("http://127.0.0.1:50051") or options. */
  constructor(options?: ClientOptions | string);
  /** AGENT_HARNESS_SERVER (default http://127.0.0.1:50051) and AGENT_HARNESS_TOKEN; `options` override. */
  static fromEnv(options?: ClientOptions): AgentHarnessClient;
  readonly transport: Transport;
  readonly sessions: Client<typeof AgentSessionService>;
  readonly translator: Client<typeof ChannelTranslatorService>;
  createSession(request: {
    profile: string;
    cwd: string;
    model?: string;
    name?: string;
    labels?: Record<string, string>;
    editors?: string[];
    sessionId?: string;
  }): Promise<AgentSession>;
  getSession(sessionId: string): Promise<AgentSession>;
  listSessions(filter?: { statuses?: SessionStatus[]; labels?: Record<string, string> }): Promise<AgentSession[]>;
  forkSession(sessionId: string, options?: { name?: string }): Promise<AgentSession>;
  closeSession(sessionId: string): Promise<AgentSession>;
  deleteSession(sessionId: string): Promise<void>;
  control(request: MessageInitShape<typeof ControlRequestSchema>): Promise<ControlResponse>;
  prompt(sessionId: string, text: string, options?: PromptOptions & { wait?: false }): Promise<ControlResponse>;
  prompt(sessionId: string, text: string, options: TurnOptions & { wait: true }): Promise<TurnResult>;
  runTurn(sessionId: string, text: string, options?: TurnOptions): Promise<TurnResult>;
  /** What sessions used per session, principal, profile and source, and the budget. */
  getUsage(options?: { principal?: string; since?: Date }): Promise<GetUsageResponse>;
  turnEvents(sessionId: string, text: string, options?: TurnOptions): AsyncGenerator<SubscribeResponse, void, void>;
  stop(sessionId: string, options?: { clearQueue?: boolean }): Promise<ControlResponse>;
  respondToPermission(sessionId: string, requestId: RequestId, optionId: string | null): Promise<ControlResponse>;
  respondElicitation(
    sessionId: string,
    requestId: RequestId,
    answer?: { accept?: Record<string, string | number | bigint | boolean | string[]>; decline?: boolean },
  ): Promise<ControlResponse>;
  getQueue(sessionId: string): Promise<QueuedAction[]>;
  editQueuedPrompt(sessionId: string, actionId: string, prompt: string): Promise<QueuedAction>;
  removeQueuedAction(sessionId: string, actionId: string): Promise<void>;
  readLog(sessionId: string, afterOffset?: bigint): Promise<LogEntry[]>;
  getTranscript(
    sessionId: string,
  ): Promise<{ messages: TranscriptMessage[]; metadata: SessionMetadata | undefined; headOffset: bigint }>;
  subscribe(
    sessionId: string,
    options?: {
      view?: "all" | "log" | "messages" | SubscribeView;
      afterOffset?: bigint;
      signal?: AbortSignal;
      /** false: throw on the first error (e.g. UNAVAILABLE while the server restarts). */
      resume?: boolean;
      timeoutMs?: number;
    },
  ): AsyncGenerator<SubscribeResponse, never, void>;
  translateChannelMessage(message: ChannelMessage | Record<string, unknown>): Promise<TranslateChannelMessageResponse>;
}
