/**
 * fermix's memory server from Node: `Client`, its `Conversation` handles and the errors
 * it raises, typed from the server's OpenAPI document. No runtime dependency: the global
 * `fetch` only. The Vercel AI SDK middleware is at `@fermix/client/ai-sdk`.
 */

export { Client, Tools, type RowFilters, type SearchFilters, type ToolCall } from "./client.js";
export {
  Conversation,
  newKey,
  type AppendAssistantOptions,
  type AppendOptions,
  type AppendResult,
  type AppendUserOptions,
  type TurnUsage,
} from "./conversation.js";
export {
  AccessDeniedError,
  ActorUnavailableError,
  ConflictError,
  FermixError,
  InvalidInputError,
  NotFoundError,
} from "./errors.js";
export { Transport, type Answer, type TransportOptions } from "./transport.js";
export type * from "./types.js";
export type { components, paths } from "./schema.js";
