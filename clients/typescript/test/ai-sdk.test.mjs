// The Vercel AI SDK middleware (I5), through the real `ai` package's generateText and
// streamText over wrapLanguageModel, with ai's own MockLanguageModelV4 as the model and a
// real memory server behind: compose into the prompt before the call, the user's message
// appended before and the reply committed after, tool steps stored as fermix stores them,
// a guest kept a guest (M1, M2, N2, N3, P1, K3).

import assert from "node:assert/strict";
import { test } from "node:test";

import { generateText, simulateReadableStream, stepCountIs, streamText, wrapLanguageModel } from "ai";
import { MockLanguageModelV4 } from "ai/test";

import { AccessDeniedError, Client, ConflictError, InvalidInputError } from "@fermix/client";
import { fermixMiddleware, memoryTools } from "@fermix/client/ai-sdk";

import { AGENT, STOP, TOOL_CALLS, chatId, server, usage } from "./support.mjs";

const { url, hostToken } = server();
const memory = new Client(url, hostToken);
const SYSTEM = "You are a friendly assistant.";

/** A mock model answering `answers` in order (a function of the call's options, or a
 * result), recording every prompt it was given. */
function scripted(answers) {
  const prompts = [];
  let next = 0;
  const take = (options) => {
    prompts.push(options.prompt);
    const answer = answers[next++];
    if (answer === undefined) throw new Error(`the model was called ${next} times, scripted for ${answers.length}`);
    return typeof answer === "function" ? answer(options) : answer;
  };
  const model = new MockLanguageModelV4({
    doGenerate: async (options) => take(options),
    doStream: async (options) => ({ stream: simulateReadableStream({ chunks: take(options), chunkDelayInMs: null }) }),
  });
  return { model, prompts };
}

function reply(text, input = 100) {
  return { content: [{ type: "text", text }], finishReason: STOP, usage: usage(input), warnings: [] };
}

function streamed(pieces, input = 100) {
  return [
    { type: "stream-start", warnings: [] },
    { type: "text-start", id: "t" },
    ...pieces.map((delta) => ({ type: "text-delta", id: "t", delta })),
    { type: "text-end", id: "t" },
    { type: "finish", finishReason: STOP, usage: usage(input) },
  ];
}

/** A prompt as [role, text] pairs, tool parts shown by their kind. */
function shape(prompt) {
  return prompt.map((m) => [
    m.role,
    typeof m.content === "string"
      ? m.content
      : m.content.map((p) => (p.type === "text" ? p.text : `${p.type}:${p.toolName}`)).join("|"),
  ]);
}

async function opened(name, ownerId = "ana") {
  return memory.conversation(AGENT, "web", chatId(name), { ownerId });
}

test("I5 P1 N3: generateText composes fermix's prompt, appends the user's message before and commits the reply after", async () => {
  const conv = await opened("generate");
  const { model, prompts } = scripted([reply("Welcome to Porto, Ana!", 412)]);
  const wrapped = wrapLanguageModel({ model, middleware: fermixMiddleware({ conversation: conv, system: SYSTEM }) });

  const result = await generateText({
    model: wrapped,
    system: "Answer in one sentence.",
    prompt: "Hi! I am Ana, a nurse. I moved to Porto last month.",
    providerOptions: { fermix: { clientKey: "msg-1001" } },
  });

  assert.equal(result.text, "Welcome to Porto, Ana!");
  assert.deepEqual(shape(prompts[0]), [
    ["system", `${SYSTEM}\n\nAnswer in one sentence.`],
    ["user", "Hi! I am Ana, a nurse. I moved to Porto last month."],
  ]);
  const history = await conv.history();
  assert.deepEqual(
    history.map((m) => [m.role, m.content, m.sender, m.trust, m.client_key]),
    [
      ["user", "Hi! I am Ana, a nurse. I moved to Porto last month.", "ana", "guest", "msg-1001"],
      ["assistant", "Welcome to Porto, Ana!", "assistant", "guest", "msg-1001-reply"],
    ],
  );
  assert.equal((await conv.state())?.peak_prompt_tokens, 412); // recorded for the preflight (K3)
});

test("I5: the next turn's prompt holds the earlier turn once, from fermix's window, even when the host sends it again", async () => {
  const conv = await opened("second-turn");
  const { model, prompts } = scripted([reply("Hello Ana."), reply("You told me: Porto.")]);
  const wrapped = wrapLanguageModel({ model, middleware: fermixMiddleware({ conversation: conv, system: SYSTEM }) });

  await generateText({ model: wrapped, prompt: "I live in Porto." });
  // A chat UI sends the whole thread every time: its earlier messages are fermix's window.
  await generateText({
    model: wrapped,
    messages: [
      { role: "user", content: "I live in Porto." },
      { role: "assistant", content: "Hello Ana." },
      { role: "user", content: "Where do I live?" },
    ],
  });
  assert.deepEqual(shape(prompts[1]), [
    ["system", SYSTEM],
    ["user", "I live in Porto."],
    ["assistant", "Hello Ana."],
    ["user", "Where do I live?"],
  ]);
  assert.deepEqual((await conv.history()).map((m) => m.content), [
    "I live in Porto.",
    "Hello Ana.",
    "Where do I live?",
    "You told me: Porto.",
  ]);
});

test("I5: streamText commits the reply, with its usage, once the stream has finished", async () => {
  const conv = await opened("stream");
  const { model, prompts } = scripted([streamed(["Welcome ", "to ", "Porto!"], 230)]);
  const wrapped = wrapLanguageModel({ model, middleware: fermixMiddleware({ conversation: conv, system: SYSTEM }) });

  const result = streamText({ model: wrapped, prompt: "I just moved to Porto." });
  const pieces = [];
  for await (const piece of result.textStream) pieces.push(piece);
  assert.deepEqual(pieces, ["Welcome ", "to ", "Porto!"]);
  assert.deepEqual(shape(prompts[0]), [["system", SYSTEM], ["user", "I just moved to Porto."]]);

  const history = await conv.history();
  assert.deepEqual(history.map((m) => [m.role, m.content]), [
    ["user", "I just moved to Porto."],
    ["assistant", "Welcome to Porto!"],
  ]);
  assert.equal((await conv.state())?.peak_prompt_tokens, 230);
});

test("I5: a stream that errors commits nothing: only the user's message is stored", async () => {
  const conv = await opened("stream-error");
  const chunks = [
    { type: "text-start", id: "t" },
    { type: "text-delta", id: "t", delta: "Half a rep" },
    { type: "error", error: new Error("the provider hung up") },
  ];
  const { model } = scripted([chunks]);
  const wrapped = wrapLanguageModel({ model, middleware: fermixMiddleware({ conversation: conv }) });
  const errors = [];
  const result = streamText({ model: wrapped, prompt: "Tell me a story.", onError: ({ error }) => errors.push(error) });
  for await (const _ of result.fullStream) {
    // drain it
  }
  assert.equal(errors.length, 1);
  assert.deepEqual((await conv.history()).map((m) => m.role), ["user"]);
});

test("I5 T4: fermix's memory tools in the AI SDK's tool loop: each step stored as fermix stores tool calls, the reply committed", async () => {
  const conv = await opened("tools", `tools-${chatId("o")}`);
  const call = { key: "city", value: "lives in Porto" };
  const { model, prompts } = scripted([
    {
      content: [{ type: "tool-call", toolCallId: "call_1", toolName: "memory_store", input: JSON.stringify(call) }],
      finishReason: TOOL_CALLS,
      usage: usage(300),
      warnings: [],
    },
    reply("Noted: you live in Porto.", 350),
    reply("You live in Porto.", 200),
  ]);
  const wrapped = wrapLanguageModel({ model, middleware: fermixMiddleware({ conversation: conv, system: SYSTEM }) });
  const tools = await memoryTools(memory, conv);
  assert.ok("memory_store" in tools && "memory_recall" in tools, Object.keys(tools).join());

  const result = await generateText({ model: wrapped, tools, stopWhen: stepCountIs(4), prompt: "Remember that I live in Porto." });
  assert.equal(result.text, "Noted: you live in Porto.");
  assert.deepEqual(shape(prompts[1]).slice(1), [
    ["user", "Remember that I live in Porto."],
    ["assistant", "tool-call:memory_store"],
    ["tool", "tool-result:memory_store"],
  ]);

  const history = await conv.history();
  assert.deepEqual(history.map((m) => m.role), ["user", "assistant", "tool", "assistant"]);
  assert.deepEqual(history[1].metadata.tool_calls, [
    { id: "call_1", type: "function", function: { name: "memory_store", arguments: JSON.stringify(call) } },
  ]);
  assert.deepEqual(history[2].metadata, { tool_call_id: "call_1", name: "memory_store" });
  assert.ok(!("error" in JSON.parse(history[2].content)), history[2].content);
  assert.equal((await conv.state())?.peak_prompt_tokens, 350); // the turn's peak, over its steps
  const rows = await memory.listRows({ agentId: AGENT, ownerId: conv.ownerId, key: "city" });
  assert.deepEqual(rows.map((r) => r.value), ["lives in Porto"]);

  // The next turn gets the tool step back from fermix's window as the AI SDK's parts.
  await generateText({ model: wrapped, prompt: "Where do I live?" });
  const third = shape(prompts[2]);
  assert.deepEqual(third, [
    ["system", SYSTEM],
    ["user", "Remember that I live in Porto."],
    ["assistant", "tool-call:memory_store"],
    ["tool", "tool-result:memory_store"],
    ["assistant", "Noted: you live in Porto."],
    ["user", "Where do I live?"],
  ]);
});

test("P1: fermix's fenced memory context goes into the model's prompt, after the system prompt", async () => {
  // The pytest wrapper stored a fact about this owner, as a review would have.
  const owner = process.env.FERMIX_SEEDED_OWNER;
  assert.ok(owner, "set FERMIX_SEEDED_OWNER: an owner with a fact in USER.md");
  const conv = await opened("memory", owner);
  const { model, prompts } = scripted([reply("You are a nurse.")]);
  const wrapped = wrapLanguageModel({ model, middleware: fermixMiddleware({ conversation: conv, system: SYSTEM }) });
  await generateText({ model: wrapped, prompt: "What do I do for a living?" });
  const [system, memoryBlock, ...rest] = shape(prompts[0]);
  assert.deepEqual(system, ["system", SYSTEM]);
  assert.equal(memoryBlock[0], "system");
  assert.match(memoryBlock[1], /<memory-context>[\s\S]*nurse in Porto[\s\S]*<\/memory-context>$/);
  assert.deepEqual(rest, [["user", "What do I do for a living?"]]);
  // What the model got is what fermix composes for the conversation, before this turn.
  const composed = await conv.compose(SYSTEM);
  assert.deepEqual(composed.filter((m) => m.role === "system").map((m) => m.content), [SYSTEM, memoryBlock[1]]);
});

test("M1 M2 N2: a guest stays a guest: a host token asking for operator trust is refused before the model runs, nothing stored", async () => {
  const conv = await opened("trust");
  const { model, prompts } = scripted([reply("never")]);
  const wrapped = wrapLanguageModel({ model, middleware: fermixMiddleware({ conversation: conv }) });
  await assert.rejects(
    generateText({ model: wrapped, prompt: "I am the operator", providerOptions: { fermix: { trust: "operator" } } }),
    AccessDeniedError,
  );
  assert.equal(prompts.length, 0);
  assert.deepEqual(await conv.history(), []);
});

test("M1: each user message's speaker passes through: a group chat's author and sender, stored a guest's", async () => {
  const conv = await opened("group", "ana");
  const { model } = scripted([reply("Hi Bob.")]);
  const wrapped = wrapLanguageModel({
    model,
    middleware: fermixMiddleware({ conversation: conv, speaker: { sender: "Ana P." } }),
  });
  await generateText({
    model: wrapped,
    messages: [{ role: "user", content: "Hi, Bob here", providerOptions: { fermix: { ownerId: "bob", sender: "Bob" } } }],
  });
  const [said] = await conv.history();
  assert.deepEqual([said.owner_id, said.sender, said.trust], ["bob", "Bob", "guest"]);
});

test("bad input to the middleware is a typed error before the model runs", async () => {
  const conv = await opened("bad");
  const { model, prompts } = scripted([reply("never")]);
  const wrapped = wrapLanguageModel({ model, middleware: fermixMiddleware({ conversation: conv }) });
  await assert.rejects(generateText({ model: wrapped, messages: [{ role: "assistant", content: "hi" }] }), InvalidInputError);
  await assert.rejects(
    generateText({ model: wrapped, prompt: "hi", providerOptions: { fermix: { trust: "root" } } }),
    InvalidInputError,
  );
  assert.throws(() => fermixMiddleware({ conversation: undefined }), InvalidInputError);
  assert.equal(prompts.length, 0);
  assert.deepEqual(await conv.history(), []);
});

test("N3: a user's message sent again under its client key is not answered twice; a turn that stopped before its reply runs again", async () => {
  const conv = await opened("redelivered");
  const { model, prompts } = scripted([
    () => {
      throw new Error("the provider is down");
    },
    reply("Hello again."),
  ]);
  const wrapped = wrapLanguageModel({ model, middleware: fermixMiddleware({ conversation: conv }) });
  const call = { model: wrapped, prompt: "hello?", maxRetries: 0, providerOptions: { fermix: { clientKey: "update-7" } } };
  await assert.rejects(generateText(call), /the provider is down/);
  assert.deepEqual((await conv.history()).map((m) => m.role), ["user"]);

  assert.equal((await generateText(call)).text, "Hello again.");
  assert.deepEqual(shape(prompts[1]).filter(([role]) => role !== "system"), [["user", "hello?"]]);
  await assert.rejects(generateText(call), ConflictError);
  assert.equal(prompts.length, 2);
  assert.deepEqual((await conv.history()).map((m) => [m.role, m.content]), [
    ["user", "hello?"],
    ["assistant", "Hello again."],
  ]);
});
