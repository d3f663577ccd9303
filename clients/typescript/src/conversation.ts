/**
 * `Conversation`: one conversation of a host, served by the memory server (N1, N3).
 *
 * Each method is one request to `/v1/conversations/{handle}/...` and has the name of the
 * Python client's (`append_user` is `appendUser`), so a host reads the same turn in
 * either language: `appendUser`, `compose`, the model call, `commit`.
 *
 * Appends and commits always carry a client key: the caller's, or a fresh one made here.
 * The transport may then send one again after a lost answer (the connection broke, the
 * server was restarting) and the server still stores it once (N3).
 */

import { InvalidInputError, NotFoundError } from "./errors.js";
import type { Transport } from "./transport.js";
import type {
  AppendBody,
  CommitBody,
  ComposedMessage,
  ConversationState,
  ForgetReport,
  MemoryFiles,
  Message,
  OpenedConversation,
  Role,
  Trust,
} from "./types.js";

/** What an append may say besides its role and text. */
export interface AppendOptions {
  /** Who sent it, as the chat names them (a user's message: the author by default). */
  sender?: string;
  /** The kind of message: `chat` (default), `voice_turn`... */
  kind?: string;
  /** Any JSON object, stored with the message (tool calls ride here: `tool_calls`). */
  metadata?: Record<string, unknown>;
  /** The turn's peak prompt tokens, recorded for compaction (K3). */
  peakPromptTokens?: number | null;
  /** The author in a group chat (M1); the conversation's owner when not given. */
  ownerId?: string | null;
  /** The author's trust; a host token's messages are always a guest's (M2, N2). */
  trust?: Trust | null;
  /** The host's own key for the message (the chat's message id will do); fresh if not given. */
  clientKey?: string;
}

/** What a user's message may say: who wrote it and with what trust (M1). */
export type AppendUserOptions = Pick<AppendOptions, "sender" | "metadata" | "ownerId" | "trust" | "clientKey">;

/** What the assistant's own message may carry. */
export type AppendAssistantOptions = Pick<AppendOptions, "metadata" | "clientKey">;

/** A stored message, and whether it was stored before under its client key (N3). */
export interface AppendResult {
  message: Message;
  replayed: boolean;
}

/** The usage of a turn: the provider's, of which only `prompt_tokens` is read (K3). */
export interface TurnUsage {
  prompt_tokens?: number | null;
  [key: string]: unknown;
}

/** One conversation, by the handle the server gave it. */
export class Conversation {
  /** The server's name for this conversation (in its URLs). */
  readonly handle: string;
  readonly agentId: string;
  readonly channel: string;
  readonly chatId: string;
  readonly threadScope: string;
  readonly ownerId: string;
  /** The trust the server granted (a host token's is always `guest`, N2). */
  readonly trust: Trust;
  readonly #http: Transport;
  readonly #path: string;

  constructor(http: Transport, opened: OpenedConversation) {
    this.#http = http;
    this.handle = opened.handle;
    this.agentId = opened.agent_id;
    this.channel = opened.channel;
    this.chatId = opened.chat_id;
    this.threadScope = opened.thread_scope;
    this.ownerId = opened.owner_id;
    this.trust = opened.trust;
    this.#path = `/v1/conversations/${opened.handle}`;
  }

  /** Store a message; answers once the server committed it (A1). A retried request never
   * doubles history: it carries `clientKey`, or a fresh key made here (N3). */
  async append(role: Role, text: string, options: AppendOptions = {}): Promise<Message> {
    return (await this.appendKeyed(role, text, options)).message;
  }

  /** As `append`, saying too whether the server had the message already under its client
   * key (`replayed`: a 200 with `Idempotent-Replayed`, nothing stored now; N3). */
  async appendKeyed(role: Role, text: string, options: AppendOptions = {}): Promise<AppendResult> {
    const body: AppendBody = {
      role,
      text,
      sender: options.sender ?? "",
      kind: options.kind ?? "chat",
      metadata: { ...(options.metadata ?? {}) },
      peak_prompt_tokens: options.peakPromptTokens ?? null,
      owner_id: options.ownerId ?? null,
      trust: options.trust ?? null,
      client_key: options.clientKey ?? newKey(),
    };
    const answer = await this.#http.send<Message>("POST", `${this.#path}/messages`, { json: body, idempotent: true });
    return { message: answer.data, replayed: answer.headers.get("idempotent-replayed") === "true" };
  }

  /** Store what a user said, recording who said it and with what trust (M1). */
  appendUser(text: string, options: AppendUserOptions = {}): Promise<Message> {
    const author = options.ownerId ?? this.ownerId;
    return this.append("user", text, { ...options, sender: options.sender || author });
  }

  /** Store what the assistant said (`commit` also dispatches the post-delivery work). */
  appendAssistant(text: string, options: AppendAssistantOptions = {}): Promise<Message> {
    return this.append("assistant", text, { ...options, sender: "assistant" });
  }

  /** The conversation's window, oldest first (the newest `limit` messages if given). */
  async history(options: { limit?: number } = {}): Promise<Message[]> {
    const limit = checkedLimit(options.limit);
    const data = await this.#http.request<{ messages: Message[] }>("GET", `${this.#path}/messages`, {
      params: { limit },
    });
    return data.messages;
  }

  /** The current USER.md and MEMORY.md of this agent and owner. */
  memoryFiles(): Promise<MemoryFiles> {
    return this.#http.request<MemoryFiles>("GET", `${this.#path}/files`);
  }

  /** The OpenAI-style messages for the next model call: `system`, the operator's standing
   * rules, the fenced memory context, then the window (P1, T5). */
  async compose(system: string, options: { limit?: number } = {}): Promise<ComposedMessage[]> {
    const data = await this.#http.request<{ messages: ComposedMessage[] }>("POST", `${this.#path}/compose`, {
      json: { system, limit: checkedLimit(options.limit) ?? null },
      idempotent: true, // it only reads: sending it again is harmless
    });
    return data.messages;
  }

  /** Before a turn: compact if the previous turn's peak calls for it (K3); the notice to
   * send when it did, else null. */
  async preflight(): Promise<string | null> {
    const data = await this.#http.request<{ notice: string | null }>("POST", `${this.#path}/preflight`);
    return data.notice;
  }

  /** Store the turn's reply and its peak prompt tokens, then have the server dispatch the
   * review and compaction (E1, K3). Stored once, whatever the retries (N3). */
  async commit(
    reply: string,
    usage?: TurnUsage | null,
    options: { metadata?: Record<string, unknown>; clientKey?: string } = {},
  ): Promise<Message> {
    const tokens = promptTokens(usage);
    const body: CommitBody = {
      reply,
      usage: tokens === null ? null : { prompt_tokens: tokens },
      metadata: { ...(options.metadata ?? {}) },
      client_key: options.clientKey ?? newKey(),
    };
    return this.#http.request<Message>("POST", `${this.#path}/commit`, { json: body, idempotent: true });
  }

  /** Run `text` if it is a fermix chat command (`/new`, `/compact`) and answer the reply to
   * send; null when it is not one (K4). A guest's state-changing command is refused. */
  async handleCommand(text: string): Promise<string | null> {
    const data = await this.#http.request<{ reply: string | null }>("POST", `${this.#path}/command`, {
      json: { text },
    });
    return data.reply;
  }

  /** The conversation's stored state, or null when nothing is stored yet. */
  async state(): Promise<ConversationState | null> {
    try {
      return await this.#http.request<ConversationState>("GET", `${this.#path}/state`);
    } catch (error) {
      if (error instanceof NotFoundError) return null;
      throw error;
    }
  }

  /** Make the server re-read the window from the database. */
  async reload(): Promise<void> {
    await this.#http.request("POST", `${this.#path}/reload`);
  }

  /** Erase this conversation (operator token; F2). */
  forget(): Promise<ForgetReport> {
    return this.#http.request<ForgetReport>("DELETE", this.#path);
  }
}

/** `prompt_tokens` of a usage, checked as the embedded commit checks it. */
export function promptTokens(usage: TurnUsage | null | undefined): number | null {
  const value = usage?.prompt_tokens;
  if (value === undefined || value === null) return null;
  if (!Number.isInteger(value) || value < 0) {
    throw new InvalidInputError(`usage.prompt_tokens must be a non-negative integer: ${JSON.stringify(value)}`, {
      field: "usage.prompt_tokens",
    });
  }
  return value;
}

function checkedLimit(limit: number | undefined): number | undefined {
  if (limit !== undefined && (!Number.isInteger(limit) || limit < 0)) {
    throw new InvalidInputError(`limit must be a non-negative integer, not ${JSON.stringify(limit)}`);
  }
  return limit;
}

/** A fresh client key: 32 hex digits, as the Python client's uuid4().hex. */
export function newKey(): string {
  return globalThis.crypto.randomUUID().replaceAll("-", "");
}
