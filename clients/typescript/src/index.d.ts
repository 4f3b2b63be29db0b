// Types of @agent-harness/client (src/index.js). The generated message types are re-exported
// from src/gen.
import type { Client, Code, Transport } from "@connectrpc/connect";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type {
  AgentSessionService,
  ControlRequestSchema,
  ControlResponse,
  SubscribeResponse,
  SubscribeView,
} from "./gen/agent_harness/v1/agent_session_service_pb.js";
import type { JsonRpcId, PromptAttachment } from "./gen/agent_harness/v1/actions_pb.js";
import type { ChannelMessage } from "./gen/agent_harness/v1/channel_pb.js";
import type { AgentSession, QueuedAction, SessionStatus } from "./gen/agent_harness/v1/session_pb.js";
import type { LogEntry, SessionMetadata, TranscriptMessage } from "./gen/agent_harness/v1/transcript_pb.js";
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
export { Code } from "@connectrpc/connect";

export declare const ERROR_DOMAIN: "agent-harness";

export declare class HarnessError extends Error {
  readonly code: Code;
  readonly codeName: string;
  readonly rawMessage: string;
  readonly reason: string | undefined;
  readonly metadata: Record<string, string>;
  readonly domain: string | undefined;
  static from(error: unknown): HarnessError;
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
  constructor(options?: ClientOptions);
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
  prompt(
    sessionId: string,
    text: string,
    options?: { attachments?: Attachment[]; interrupt?: boolean; actionId?: string },
  ): Promise<ControlResponse>;
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
    options?: { view?: "all" | "log" | "messages" | SubscribeView; afterOffset?: bigint; signal?: AbortSignal },
  ): AsyncGenerator<SubscribeResponse, never, void>;
  translateChannelMessage(message: ChannelMessage | Record<string, unknown>): Promise<TranslateChannelMessageResponse>;
}
