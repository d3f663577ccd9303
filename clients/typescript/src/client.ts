/**
 * `Client`: what a Node host uses of fermix, served by the memory server (N1, N4).
 *
 * The surface of the Python client (`fermix.Client`) that a host's turn needs, with the
 * same names in camelCase and the same rules: conversation handles, the memory tools,
 * the memory rows, an owner's forget and export, health. A host token is a guest's: what
 * it stores is never the operator's, whatever owner it names (M2, N2).
 *
 *     const memory = new Client(process.env.FERMIX_URL, process.env.FERMIX_TOKEN);
 *     const conv = await memory.conversation("assistant", "telegram", "42", { ownerId: "ana" });
 *     await conv.appendUser("I moved to Porto last month");
 *     const messages = await conv.compose("You are a helpful assistant.");
 *     // ... the model call ...
 *     await conv.commit(reply, { prompt_tokens: 1234 });
 */

import { Conversation } from "./conversation.js";
import { FermixError, InvalidInputError } from "./errors.js";
import { Transport, segment, type TransportOptions } from "./transport.js";
import type {
  CompactionResult,
  ForgetReport,
  Health,
  MemoryRow,
  OpenedConversation,
  ReviewResult,
  ToolSchema,
  Trust,
} from "./types.js";

/** Which rows a listing keeps: the archived filter of the Python client's `list_rows`. */
export interface RowFilters {
  /** The agent whose rows these are; the token must act for it. */
  agentId: string;
  ownerId?: string;
  /** `TYPE` or `TYPE:ID` (owner, agent, conversation, job). */
  scope?: string;
  category?: string;
  key?: string;
  /** false (default): live rows only; true: archived only; null: both. */
  archived?: boolean | null;
  limit?: number;
}

/** Which rows a search keeps. */
export type SearchFilters = Omit<RowFilters, "scope" | "key">;

/** An OpenAI-format tool call, as a model asks for one: `{id, function: {name, arguments}}`. */
export interface ToolCall {
  id?: string;
  type?: "function";
  function: { name: string; arguments: string };
}

/** The memory server at `url` (`http://127.0.0.1:PORT`), with a bearer `token`
 * (`fermix token create`). One client serves every conversation of the host. */
export class Client {
  readonly url: string;
  /** The agent's memory tools: `schemas()` and `run(toolCall, conversation)` (T4). */
  readonly tools: Tools;
  readonly #http: Transport;

  constructor(url: string, token: string, options: TransportOptions = {}) {
    this.#http = new Transport(url, token, options);
    this.url = this.#http.url;
    this.tools = new Tools(this.#http);
  }

  /** The server's `/v1/health` answer (its version); raises when it does not answer. */
  health(): Promise<Health> {
    return this.#http.request<Health>("GET", "/v1/health");
  }

  /** A handle on one conversation. One request: the server checks the token may act for
   * `agentId` and says which trust it grants (a host token's: `guest`). */
  async conversation(
    agentId: string,
    channel: string,
    chatId: string,
    options: { threadScope?: string; ownerId?: string; trust?: Trust | null } = {},
  ): Promise<Conversation> {
    const body = {
      agent_id: agentId,
      channel,
      chat_id: chatId,
      thread_scope: options.threadScope ?? "",
      owner_id: options.ownerId ?? "",
      trust: options.trust ?? null,
    };
    const opened = await this.#http.request<OpenedConversation>("POST", "/v1/conversations/open", {
      json: body,
      idempotent: true, // opening stores nothing
    });
    return new Conversation(this.#http, opened);
  }

  /** Review `conv` now and wait for the result (`force`: past the time gates). */
  review(conv: Conversation, options: { force?: boolean } = {}): Promise<ReviewResult> {
    return this.#http.request<ReviewResult>("POST", `${path(conv)}/review`, { json: { force: options.force ?? true } });
  }

  /** Compact `conv` now if due (`force`: whatever its peak) and wait for it. */
  compact(conv: Conversation, options: { force?: boolean } = {}): Promise<CompactionResult> {
    return this.#http.request<CompactionResult>("POST", `${path(conv)}/compact`, {
      json: { force: options.force ?? false },
    });
  }

  /** Run `text` if it is a fermix chat command and answer the reply to send (K4). */
  handleCommand(conv: Conversation, text: string): Promise<string | null> {
    return conv.handleCommand(text);
  }

  // -- memory rows (S7) ------------------------------------------------------------------

  /** The memory row `id` (archived or not), or null (also for another agent's row: the
   * server does not say it exists). */
  async getRow(id: number): Promise<MemoryRow | null> {
    try {
      return await this.#http.request<MemoryRow>("GET", `/v1/memories/${checkedId(id)}`);
    } catch (error) {
      if (error instanceof FermixError && error.status === 404) return null;
      throw error;
    }
  }

  /** The agent's memory rows matching `filters`, most recently updated first. */
  async listRows(filters: RowFilters): Promise<MemoryRow[]> {
    const params = {
      owner_id: filters.ownerId,
      scope: filters.scope,
      category: filters.category,
      key: filters.key,
      limit: filters.limit ?? 100_000,
      ...archivedParams(filters.archived),
    };
    const data = await this.#http.request<{ memories: MemoryRow[] }>(
      "GET",
      `/v1/agents/${segment(agentOf(filters))}/memories`,
      { params },
    );
    return data.memories;
  }

  /** The agent's rows matching any word of `query`, best first. */
  async searchRows(query: string, filters: SearchFilters): Promise<MemoryRow[]> {
    if (!query.trim()) return []; // as the embedded search: no words find nothing
    const params = {
      q: query,
      owner_id: filters.ownerId,
      category: filters.category,
      limit: filters.limit ?? 10,
      ...archivedParams(filters.archived),
    };
    const data = await this.#http.request<{ memories: MemoryRow[] }>(
      "GET",
      `/v1/agents/${segment(agentOf(filters))}/memories/search`,
      { params },
    );
    return data.memories;
  }

  // -- forgetting and export (F1, F2, F6): an operator token ------------------------------

  /** Erase everything of `ownerId` for `agentId` (operator token; F1). */
  forgetOwner(ownerId: string, options: { agentId: string }): Promise<ForgetReport> {
    return this.#http.request<ForgetReport>("DELETE", `/v1/owners/${segment(ownerId)}`, {
      params: { agent_id: agentOf(options) },
    });
  }

  /** Erase one message and what was drawn from it (operator token; F2). */
  forgetMessage(id: number): Promise<ForgetReport> {
    return this.#http.request<ForgetReport>("DELETE", `/v1/messages/${checkedId(id)}`);
  }

  /** Erase one memory row, archived or not (operator token; F2). */
  forgetMemory(id: number): Promise<ForgetReport> {
    return this.#http.request<ForgetReport>("DELETE", `/v1/memories/${checkedId(id)}`);
  }

  /** Everything kept of `ownerId` for `agentId` as one JSON document, streamed as the
   * server sends it (operator token; F6): pipe it to a file, or read it whole. */
  exportOwner(ownerId: string, options: { agentId: string }): Promise<ReadableStream<Uint8Array>> {
    return this.#http.download(`/v1/owners/${segment(ownerId)}/export`, { agent_id: agentOf(options) });
  }
}

/** The memory tools, run by the server for a conversation (T4). */
export class Tools {
  readonly #http: Transport;

  constructor(http: Transport) {
    this.#http = http;
  }

  /** The tool definitions, as `tools` for an OpenAI-style model call (T4). */
  async schemas(): Promise<ToolSchema[]> {
    return (await this.#http.request<{ tools: ToolSchema[] }>("GET", "/v1/tools")).tools;
  }

  /** Run one tool call for `conv` and answer the tool message's content (JSON text).
   * Never raises, as the embedded one: a refusal, and a server that cannot be reached,
   * come back as `{"error": ...}` for the model to read. */
  async run(toolCall: ToolCall, conv: Conversation): Promise<string> {
    try {
      const data = await this.#http.request<{ content: string }>("POST", `${path(conv)}/tools/run`, {
        json: { tool_call: { type: "function", ...toolCall } },
      });
      return data.content;
    } catch (error) {
      if (error instanceof FermixError) return JSON.stringify({ error: error.message });
      throw error;
    }
  }
}

function path(conv: Conversation): string {
  if (!(conv instanceof Conversation)) {
    throw new InvalidInputError("a Client works on the conversations it opened (client.conversation)");
  }
  return `/v1/conversations/${conv.handle}`;
}

function agentOf(options: { agentId?: string }): string {
  if (typeof options.agentId !== "string" || !options.agentId) {
    throw new InvalidInputError("agentId is needed: a token acts for its agents", { field: "agentId" });
  }
  return options.agentId;
}

function checkedId(id: number): number {
  if (!Number.isSafeInteger(id) || id < 1) {
    throw new InvalidInputError(`an id must be a positive integer, not ${JSON.stringify(id)}`);
  }
  return id;
}

/** The Python client's `archived` filter as the routes' two flags. */
function archivedParams(archived: boolean | null | undefined): Record<string, boolean> {
  if (archived === null) return { include_archived: true };
  return archived ? { archived_only: true } : {};
}
