// The client against a real memory server: a whole turn, stored once however often it is
// sent (N1, N3), a guest kept a guest (M2, N2), typed errors that change nothing, the
// memory tools and rows (T4, S7), and an owner's export and forget (F1, F6).

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  AccessDeniedError,
  Client,
  InvalidInputError,
  NotFoundError,
} from "@fermix/client";

import { AGENT, chatId, server } from "./support.mjs";

const { url, hostToken, operatorToken } = server();
const host = new Client(url, hostToken);
const operator = new Client(url, operatorToken);

test("N1 N3: a turn through the client: append, the same append again stored once, compose, commit, history", async () => {
  const chat = chatId("turn");
  const conv = await host.conversation(AGENT, "node", chat, { ownerId: "ana" });
  assert.equal(conv.trust, "guest"); // a host token's, whatever owner it names
  assert.equal(conv.ownerId, "ana");

  const said = "Hi! I am Ana, a nurse. I moved to Porto last month.";
  const first = await conv.appendUser(said, { clientKey: `${chat}-1` });
  const again = await conv.appendUser(said, { clientKey: `${chat}-1` });
  assert.equal(again.id, first.id);
  assert.equal(first.sender, "ana");
  assert.equal(first.trust, "guest");
  assert.equal(await conv.preflight(), null);

  const composed = await conv.compose("You are a friendly assistant.");
  assert.equal(composed[0].role, "system");
  assert.ok(String(composed[0].content).startsWith("You are a friendly assistant."));
  assert.deepEqual(composed.at(-1), { role: "user", content: said });

  const reply = await conv.commit("Welcome to Porto, Ana!", { prompt_tokens: 412 }, { clientKey: `${chat}-r` });
  assert.equal(reply.role, "assistant");
  const replayed = await conv.commit("Welcome to Porto, Ana!", { prompt_tokens: 412 }, { clientKey: `${chat}-r` });
  assert.equal(replayed.id, reply.id);

  const history = await conv.history();
  assert.deepEqual(
    history.map((m) => [m.role, m.content, m.client_key]),
    [
      ["user", said, `${chat}-1`],
      ["assistant", "Welcome to Porto, Ana!", `${chat}-r`],
    ],
  );
  assert.deepEqual((await conv.history({ limit: 1 })).map((m) => m.role), ["assistant"]);
  const state = await conv.state();
  assert.equal(state?.owner_id, "ana");
});

test("N3: an append or commit without a client key gets a fresh one: two sends are two messages", async () => {
  const conv = await host.conversation(AGENT, "node", chatId("keys"), { ownerId: "ana" });
  const a = await conv.appendUser("ok");
  const b = await conv.appendUser("ok");
  assert.notEqual(a.id, b.id);
  assert.match(a.client_key ?? "", /^[0-9a-f]{32}$/);
  assert.equal((await conv.history()).length, 2);
});

test("M2 N2: a host token asking for operator trust is refused, and nothing is stored", async () => {
  await assert.rejects(
    host.conversation(AGENT, "node", chatId("op"), { ownerId: "ana", trust: "operator" }),
    (error) => error instanceof AccessDeniedError && error.status === 403,
  );
  const conv = await host.conversation(AGENT, "node", chatId("op2"), { ownerId: "ana" });
  await assert.rejects(conv.appendUser("make me the operator", { trust: "operator" }), AccessDeniedError);
  assert.deepEqual(await conv.history(), []);
  assert.equal(await conv.state(), null);
});

test("bad input is a typed error naming the field, and nothing is stored", async () => {
  const conv = await host.conversation(AGENT, "node", chatId("bad"), { ownerId: "ana" });
  await assert.rejects(conv.append("bogus", "hello"), (error) => {
    assert.ok(error instanceof InvalidInputError);
    assert.equal(error.status, 422);
    assert.equal(error.field, "body.role");
    assert.equal(error.type, "invalid_input");
    return true;
  });
  // Refused before a request: a usage the embedded commit would refuse too.
  await assert.rejects(conv.commit("hi", { prompt_tokens: -1 }), InvalidInputError);
  await assert.rejects(conv.history({ limit: -1 }), InvalidInputError);
  assert.deepEqual(await conv.history(), []);

  await assert.rejects(host.conversation("someone-else", "node", "1"), AccessDeniedError);
  await assert.rejects(host.conversation(AGENT, "", "1"), InvalidInputError);
  assert.throws(() => new Client(url, " "), InvalidInputError);
  assert.throws(() => new Client("http+unix:///tmp/s.sock", hostToken), InvalidInputError);
  assert.throws(() => new Client(url, hostToken, { retries: -1 }), InvalidInputError);
});

test("K4: a fermix command is answered, a guest's state-changing one refused, other text left to the host", async () => {
  const conv = await host.conversation(AGENT, "node", chatId("cmd"), { ownerId: "ana" });
  await conv.appendUser("remember this");
  assert.equal(await conv.handleCommand("just chatting"), null);
  const refused = await host.handleCommand(conv, "/new");
  assert.match(refused ?? "", /Only the operator can use \/new/);
  assert.equal((await conv.history()).length, 1); // nothing was cleared

  const mine = await operator.conversation(AGENT, "node", chatId("cmd-op"), { ownerId: "me", trust: "operator" });
  await mine.appendUser("remember this");
  assert.match((await mine.handleCommand("/new")) ?? "", /fresh conversation window/);
  assert.deepEqual(await mine.history(), []);
});

test("T4 S7: the memory tools run on the server for the conversation; their row is listed, searched and read", async () => {
  const conv = await host.conversation(AGENT, "node", chatId("tools"), { ownerId: "tool-owner" });
  const names = (await host.tools.schemas()).map((t) => t.function.name);
  assert.ok(names.includes("memory_store"), names.join());

  const content = await host.tools.run(
    { id: "call_1", function: { name: "memory_store", arguments: JSON.stringify({ key: "job", value: "nurse in Porto" }) } },
    conv,
  );
  assert.ok(!("error" in JSON.parse(content)), content);
  const rows = await host.listRows({ agentId: AGENT, ownerId: "tool-owner", key: "job" });
  assert.deepEqual(rows.map((r) => r.value), ["nurse in Porto"]);
  const found = await host.searchRows("nurse", { agentId: AGENT, ownerId: "tool-owner" });
  assert.deepEqual(found.map((r) => r.id), [rows[0].id]);
  assert.equal((await host.getRow(rows[0].id))?.value, "nurse in Porto");
  assert.equal(await host.getRow(2 ** 52), null);
  assert.deepEqual(await host.searchRows("   ", { agentId: AGENT }), []);

  // A refusal is the tool's content, for the model to read, never a throw.
  const refused = JSON.parse(await host.tools.run({ id: "c2", function: { name: "no_such_tool", arguments: "{}" } }, conv));
  assert.ok(typeof refused.error === "string", JSON.stringify(refused));
  await assert.rejects(host.listRows({ agentId: "" }), InvalidInputError);
});

test("F1 F6: an owner's export streams their messages; forgetting them is the operator's, and erases them", async () => {
  const owner = `gone-${chatId("o")}`;
  const conv = await host.conversation(AGENT, "node", chatId("forget"), { ownerId: owner });
  await conv.appendUser("I live at 12 Rua Augusta");
  await conv.commit("Noted.");

  await assert.rejects(host.forgetOwner(owner, { agentId: AGENT }), AccessDeniedError);
  await assert.rejects(host.exportOwner(owner, { agentId: AGENT }), AccessDeniedError);

  const stream = await operator.exportOwner(owner, { agentId: AGENT });
  const document = JSON.parse(await new Response(stream).text());
  assert.ok(JSON.stringify(document).includes("12 Rua Augusta"));

  const report = await operator.forgetOwner(owner, { agentId: AGENT });
  assert.equal(report.target, "owner");
  assert.equal(report.state, "done");
  assert.deepEqual(await conv.history(), []);
  await assert.rejects(operator.exportOwner(owner, { agentId: AGENT }), NotFoundError);
});

test("N1: health answers without a token", async () => {
  const health = await new Client(url, "fmx_not_a_token").health();
  assert.equal(health.status, "ok");
  assert.equal(typeof health.version, "string");
});
