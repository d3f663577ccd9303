/**
 * fermix inside the Vercel AI SDK: a middleware for `wrapLanguageModel` that gives one
 * conversation fermix's memory, and fermix's memory tools as AI SDK tools (I5).
 *
 *     const model = wrapLanguageModel({
 *       model: openai("gpt-4o-mini"),
 *       middleware: fermixMiddleware({ conversation: conv, system: "You are a helpful assistant." }),
 *     });
 *     const { text } = await generateText({ model, prompt: "Hi! I'm Ana, a nurse in Porto." });
 *
 * What a hand-written host does around its model call, the middleware does around each
 * call the AI SDK makes (README "Embedding fermix in a bot"):
 *
 * - **Before** (`transformParams`): a call whose prompt ends in a user message starts a
 *   turn: the conversation is preflighted (compacted first if the last turn was too big,
 *   K3) and that message appended with its author and trust (M1). Then the prompt is
 *   rebuilt from `compose`: the system prompt (the option's, then the prompt's own system
 *   messages), the operator's standing rules, the fenced memory context and fermix's
 *   window before this turn, followed by this turn's messages as the AI SDK gave them
 *   (their files and provider options kept). fermix's window *is* the history: prompt
 *   messages before the last user message are dropped, not sent twice, since a host that
 *   goes through the middleware stored them turn by turn.
 * - **A tool step**: a call whose prompt ends in the assistant's tool calls and their
 *   results (the AI SDK's tool loop, or a host that ran the tools itself) continues the
 *   turn: those messages are stored as fermix stores tool calls (an assistant message with
 *   `tool_calls` metadata, a tool message per result with `tool_call_id` and `name`).
 * - **After** `generate`, and after a stream's last part: a reply that asks for no tool
 *   call is committed with the turn's peak prompt tokens (the most any step's prompt took),
 *   which stores it and sets off the review and compaction as a hand-written host's commit
 *   does. A stream that errors or is cancelled commits nothing.
 *
 * Every write carries a client key made from the turn's (the caller's, or a fresh one), so
 * the transport's retries store each message once (N3). Trust passes through: the author's
 * `trust` is sent only when given, and a host token's messages are a guest's whatever is
 * asked (the server decides, N2); nothing here defaults to the operator.
 *
 * One middleware serves one conversation, one turn at a time: it remembers how much of
 * the current turn it stored. `ai` is a peer dependency of this entry point only.
 */

import { jsonSchema, tool, type LanguageModelMiddleware, type ToolSet } from "ai";

import type { Client } from "./client.js";
import type { Conversation } from "./conversation.js";
import { ConflictError, InvalidInputError } from "./errors.js";
import { newKey } from "./conversation.js";
import type { ComposedMessage, Trust } from "./types.js";

type CallOptions = Parameters<NonNullable<LanguageModelMiddleware["transformParams"]>>[0]["params"];
type PromptMessage = CallOptions["prompt"][number];
type GenerateResult = Awaited<ReturnType<NonNullable<LanguageModelMiddleware["wrapGenerate"]>>>;
type StreamResult = Awaited<ReturnType<NonNullable<LanguageModelMiddleware["wrapStream"]>>>;
type StreamPart = StreamResult["stream"] extends ReadableStream<infer P> ? P : never;
type ModelUsage = GenerateResult["usage"];

/** Who wrote a user's message: fermix's author fields (M1). */
export interface Speaker {
  /** The author in a group chat; the conversation's owner when not given. */
  ownerId?: string;
  /** Who sent it, as the chat names them; the author by default. */
  sender?: string;
  /** The author's trust; left to the server when not given (a host token's: guest). */
  trust?: Trust;
}

/**
 * What a call may tell the middleware, under `providerOptions.fermix` of the call or of
 * the user's message (the message's wins): its speaker and the host's key for it.
 */
export interface FermixCallOptions extends Speaker {
  /** The host's key for the user's message (the chat's message id); fresh if not given.
   * The turn's other writes derive theirs from it. */
  clientKey?: string;
}

/** How the middleware works for its conversation. */
export interface FermixMiddlewareOptions {
  /** The conversation every call of the wrapped model belongs to. */
  conversation: Conversation;
  /** The host's system prompt; the prompt's own system messages follow it. */
  system?: string;
  /** The author of every user's message unless a call says otherwise. */
  speaker?: Speaker;
  /** Only the newest messages of fermix's window go into the prompt. */
  limit?: number;
  /** Called with the preflight's notice when it compacted before a turn (K3): the host
   * may send it to the chat. */
  onNotice?: (notice: string) => void;
}

/** The current turn: its key, how much of it is stored, its peak prompt tokens. */
interface Turn {
  key: string;
  /** This turn's prompt messages (from the user's on) stored so far. */
  storedPrompt: number;
  /** The fermix messages they became (one per tool result): the window's tail. */
  storedWindow: number;
  peak: number | null;
}

/** The middleware for `wrapLanguageModel` that gives `options.conversation` fermix's
 * memory: compose before each call, append and commit around it (see the module). */
export function fermixMiddleware(options: FermixMiddlewareOptions): LanguageModelMiddleware {
  const conv = options.conversation;
  if (conv === null || typeof conv !== "object" || typeof conv.compose !== "function") {
    throw new InvalidInputError("fermixMiddleware needs a conversation (client.conversation(...))");
  }
  let turn: Turn | undefined;

  /** The turn's reply is in: commit it unless it asks for tools (the loop goes on). */
  async function finish(text: string, toolCalls: number, usage: ModelUsage | undefined): Promise<void> {
    if (turn === undefined) return;
    turn.peak = peakOf(turn.peak, usage);
    if (toolCalls > 0) return;
    const done = turn;
    turn = undefined;
    await conv.commit(text, { prompt_tokens: done.peak }, { clientKey: `${done.key}-reply` });
  }

  return {
    specificationVersion: "v4",

    async transformParams({ params }) {
      const system = [options.system ?? "", ...systemTexts(params.prompt)].filter((s) => s.trim()).join("\n\n");
      const rest = params.prompt.filter((m) => m.role !== "system");
      const start = lastUserIndex(rest);
      if (start < 0) {
        throw new InvalidInputError("the prompt has no user message for fermix to store (prompt or messages)");
      }
      const current = rest.slice(start);
      const user = current[0] as Extract<PromptMessage, { role: "user" }>;
      if (current.length === 1) {
        turn = await begin(conv, user, params, options);
      } else {
        turn ??= { key: newKey(), storedPrompt: 1, storedWindow: 1, peak: null };
        await storeSteps(conv, turn, current);
      }
      const composed = await conv.compose(system, options.limit === undefined ? {} : { limit: options.limit });
      const prompt = [...composedPrompt(withoutTail(composed, turn.storedWindow, current)), ...current];
      return { ...params, prompt };
    },

    async wrapGenerate({ doGenerate }) {
      const result = await doGenerate();
      const text = result.content.flatMap((part) => (part.type === "text" ? [part.text] : [])).join("");
      const calls = result.content.filter((part) => part.type === "tool-call" && !part.providerExecuted).length;
      await finish(text, calls, result.usage);
      return result;
    },

    async wrapStream({ doStream }) {
      const { stream, ...rest } = await doStream();
      let text = "";
      let calls = 0;
      let usage: ModelUsage | undefined;
      let failed = false;
      const watch = new TransformStream<StreamPart, StreamPart>({
        transform(part, controller) {
          if (part.type === "text-delta") text += part.delta;
          else if (part.type === "tool-call" && !part.providerExecuted) calls += 1;
          else if (part.type === "finish") usage = part.usage;
          else if (part.type === "error") failed = true;
          controller.enqueue(part);
        },
        // After the last part, before the stream closes: a reply that could not be
        // committed errors the stream rather than vanish.
        async flush() {
          if (failed) {
            turn = undefined;
            return;
          }
          await finish(text, calls, usage);
        },
      });
      return { stream: stream.pipeThrough(watch), ...rest };
    },
  };
}

/** fermix's memory tools (memory_store, memory_recall...) as AI SDK tools that the server
 * runs for `conv` (T4); a refusal comes back as the tool's output, for the model to read. */
export async function memoryTools(client: Client, conv: Conversation): Promise<ToolSet> {
  const tools: ToolSet = {};
  for (const schema of await client.tools.schemas()) {
    const spec = (schema as { function?: { name?: unknown; description?: unknown; parameters?: unknown } }).function;
    if (typeof spec?.name !== "string") continue;
    const name = spec.name;
    tools[name] = tool({
      description: typeof spec.description === "string" ? spec.description : "",
      inputSchema: jsonSchema((spec.parameters ?? { type: "object", properties: {} }) as Parameters<typeof jsonSchema>[0]),
      execute: (input: unknown, { toolCallId }: { toolCallId: string }) =>
        client.tools.run({ id: toolCallId, type: "function", function: { name, arguments: JSON.stringify(input ?? {}) } }, conv),
    });
  }
  return tools;
}

// -- before a turn ----------------------------------------------------------------------

/** A new turn: preflight, then the user's message stored with its speaker (K3, M1). */
async function begin(
  conv: Conversation,
  user: Extract<PromptMessage, { role: "user" }>,
  params: CallOptions,
  options: FermixMiddlewareOptions,
): Promise<Turn> {
  const said: FermixCallOptions = { ...options.speaker, ...fermixOptions(params.providerOptions), ...fermixOptions(user.providerOptions) };
  const notice = await conv.preflight();
  if (notice !== null) options.onNotice?.(notice);
  const key = said.clientKey ?? newKey();
  const files = user.content.flatMap((part) =>
    part.type === "file" ? [{ mediaType: part.mediaType, ...(part.filename ? { filename: part.filename } : {}) }] : [],
  );
  const author = said.ownerId ?? conv.ownerId;
  const stored = await conv.appendKeyed("user", textOf(user.content), {
    sender: said.sender || author,
    ...(said.ownerId === undefined ? {} : { ownerId: said.ownerId }),
    ...(said.trust === undefined ? {} : { trust: said.trust }),
    metadata: files.length ? { files } : {},
    clientKey: key,
  });
  if (stored.replayed) {
    // The host sent this message before (a redelivered update). A turn that stopped
    // before its reply runs again; one that went on is not run twice.
    const window = await conv.history();
    if (window.at(-1)?.id !== stored.message.id) {
      throw new ConflictError(
        `the message under client key ${JSON.stringify(key)} was answered already: its turn is not run again`,
        { field: "providerOptions.fermix.clientKey" },
      );
    }
  }
  return { key, storedPrompt: 1, storedWindow: 1, peak: null };
}

/** A tool step: the turn's assistant tool calls and tool results not stored yet, stored
 * as fermix stores them (README: `tool_calls`, `tool_call_id`, `name`). */
async function storeSteps(conv: Conversation, turn: Turn, current: PromptMessage[]): Promise<void> {
  for (let at = turn.storedPrompt; at < current.length; at++) {
    const message = current[at] as PromptMessage;
    if (message.role === "assistant") {
      const calls = message.content.flatMap((part) =>
        part.type === "tool-call"
          ? [{ id: part.toolCallId, type: "function", function: { name: part.toolName, arguments: argumentsOf(part.input) } }]
          : [],
      );
      await conv.append("assistant", textOf(message.content), {
        sender: "assistant",
        metadata: calls.length ? { tool_calls: calls } : {},
        clientKey: `${turn.key}-${at}`,
      });
      turn.storedWindow += 1;
    } else if (message.role === "tool") {
      let index = 0;
      for (const part of message.content) {
        if (part.type !== "tool-result") continue;
        await conv.append("tool", outputText(part.output), {
          metadata: { tool_call_id: part.toolCallId, name: part.toolName },
          clientKey: `${turn.key}-${at}-${index++}`,
        });
        turn.storedWindow += 1;
      }
    } else {
      // A user message after the turn's first one would have started a turn of its own.
      throw new InvalidInputError(`a ${message.role} message cannot follow the turn's user message`);
    }
    turn.storedPrompt = at + 1;
  }
}

// -- the prompt -------------------------------------------------------------------------

/** `composed` without the window's last `count` messages, which are this turn's: the
 * prompt carries them as the AI SDK gave them. */
function withoutTail(composed: ComposedMessage[], count: number, current: PromptMessage[]): ComposedMessage[] {
  const tail = composed.slice(composed.length - count);
  const expected = current.flatMap((m) =>
    m.role === "tool" ? m.content.filter((p) => p.type === "tool-result").map(() => "tool") : [m.role],
  );
  const found = tail.map((m) => String(m.role));
  if (count > composed.length || found.join() !== expected.slice(0, count).join()) {
    throw new InvalidInputError(
      `fermix's window does not end with this turn's messages (${found.join(", ")}; expected ${expected.join(", ")}):` +
        " another writer on this conversation, or a limit smaller than the turn",
    );
  }
  return composed.slice(0, composed.length - count);
}

/** fermix's OpenAI-style messages as the AI SDK's prompt messages. */
export function composedPrompt(composed: ComposedMessage[]): PromptMessage[] {
  const out: PromptMessage[] = [];
  for (const message of composed) {
    const content = typeof message.content === "string" ? message.content : "";
    switch (message.role) {
      case "system":
        if (content.trim()) out.push({ role: "system", content });
        break;
      case "user":
        out.push({ role: "user", content: [{ type: "text", text: content }] });
        break;
      case "assistant": {
        const calls = Array.isArray(message.tool_calls) ? (message.tool_calls as WireToolCall[]) : [];
        const parts: Extract<PromptMessage, { role: "assistant" }>["content"] = [];
        if (content) parts.push({ type: "text", text: content });
        for (const call of calls) {
          parts.push({
            type: "tool-call",
            toolCallId: String(call.id ?? ""),
            toolName: String(call.function?.name ?? ""),
            input: inputOf(call.function?.arguments),
          });
        }
        if (parts.length) out.push({ role: "assistant", content: parts });
        break;
      }
      case "tool":
        out.push({
          role: "tool",
          content: [
            {
              type: "tool-result",
              toolCallId: String(message.tool_call_id ?? ""),
              toolName: String(message.name ?? ""),
              output: { type: "text", value: content },
            },
          ],
        });
        break;
      default:
        throw new InvalidInputError(`fermix composed a message of an unknown role: ${String(message.role)}`);
    }
  }
  return out;
}

interface WireToolCall {
  id?: unknown;
  function?: { name?: unknown; arguments?: unknown };
}

function systemTexts(prompt: CallOptions["prompt"]): string[] {
  return prompt.flatMap((m) => (m.role === "system" ? [m.content] : []));
}

function lastUserIndex(messages: PromptMessage[]): number {
  for (let at = messages.length - 1; at >= 0; at--) if (messages[at]?.role === "user") return at;
  return -1;
}

function textOf(content: ReadonlyArray<{ type: string; text?: string }>): string {
  return content.flatMap((part) => (part.type === "text" && typeof part.text === "string" ? [part.text] : [])).join("\n");
}

/** A tool result's output as the text of fermix's tool message. */
function outputText(output: Extract<PromptMessage, { role: "tool" }>["content"][number] extends infer P
  ? P extends { type: "tool-result"; output: infer O }
    ? O
    : never
  : never): string {
  switch (output.type) {
    case "text":
    case "error-text":
      return output.value;
    case "json":
    case "error-json":
      return JSON.stringify(output.value);
    case "execution-denied":
      return JSON.stringify({ error: output.reason ?? "the tool call was denied" });
    case "content":
      return output.value.flatMap((part) => (part.type === "text" ? [part.text] : [])).join("\n");
    default:
      return JSON.stringify(output);
  }
}

function argumentsOf(input: unknown): string {
  return typeof input === "string" ? input : JSON.stringify(input ?? {});
}

function inputOf(text: unknown): unknown {
  if (typeof text !== "string") return text ?? {};
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

function peakOf(peak: number | null, usage: ModelUsage | undefined): number | null {
  const tokens = usage?.inputTokens?.total;
  if (typeof tokens !== "number" || !Number.isInteger(tokens) || tokens < 0) return peak;
  return peak === null ? tokens : Math.max(peak, tokens);
}

function fermixOptions(providerOptions: unknown): FermixCallOptions {
  const value = (providerOptions as { fermix?: unknown } | undefined)?.fermix;
  if (value === undefined) return {};
  if (typeof value !== "object" || value === null) {
    throw new InvalidInputError("providerOptions.fermix must be an object: {ownerId, sender, trust, clientKey}");
  }
  const given = value as Record<string, unknown>;
  const out: FermixCallOptions = {};
  for (const name of ["ownerId", "sender", "clientKey"] as const) {
    const field = given[name];
    if (field === undefined) continue;
    if (typeof field !== "string") throw new InvalidInputError(`providerOptions.fermix.${name} must be a string`);
    out[name] = field;
  }
  if (given.trust !== undefined) {
    if (given.trust !== "guest" && given.trust !== "operator") {
      throw new InvalidInputError("providerOptions.fermix.trust must be 'guest' or 'operator'");
    }
    out.trust = given.trust;
  }
  return out;
}
