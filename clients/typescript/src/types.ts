/**
 * The wire types a host sees, named from the server's OpenAPI document (src/schema.ts,
 * generated): what the client answers is what the server sent, field for field.
 */

import type { components } from "./schema.js";

type Schemas = components["schemas"];

/** A stored message (its author, trust and client key included; M1, N3). */
export type Message = Schemas["MessageOut"];
/** An opened conversation: its handle, key, owner and the trust the server granted. */
export type OpenedConversation = Schemas["OpenedConversation"];
/** One OpenAI-style message of a composed model call (`{role, content, ...}`). */
export type ComposedMessage = Schemas["ComposedOut"]["messages"][number];
/** USER.md and MEMORY.md as they are now. */
export type MemoryFiles = Schemas["FilesOut"];
/** A conversation's stored state: owner, trust, window, gates. */
export type ConversationState = Schemas["StateOut"];
/** What one review did. */
export type ReviewResult = Schemas["ReviewOut"];
/** What one compaction attempt did. */
export type CompactionResult = Schemas["CompactionOut"];
/** A memory row (S7). */
export type MemoryRow = Schemas["MemoryRowOut"];
/** What a forget erased, and whether it is done (F1, F2). */
export type ForgetReport = Schemas["ForgetReportOut"];
/** The server's health answer. */
export type Health = Schemas["Health"];
/** A memory tool's definition, as `tools=` for an OpenAI-style model call (T4). */
export type ToolSchema = Schemas["ToolsOut"]["tools"][number];
/** The trust of a conversation or an author. */
export type Trust = NonNullable<Schemas["OpenRequest"]["trust"]>;
/** A message's role. */
export type Role = Schemas["AppendRequest"]["role"];
/** The provider's usage of a turn; only `prompt_tokens` is read (K3). */
export type Usage = Schemas["Usage"];

/** The request bodies, for the client's own use. */
export type AppendBody = Schemas["AppendRequest"];
export type CommitBody = Schemas["CommitRequest"];
export type OpenBody = Schemas["OpenRequest"];
