// The transport's retry rules (those of fermix/remote/transport.py), through a local
// Node proxy in front of the real memory server that loses answers on purpose: a 503, an
// answer dropped after the server stored the write, one that never comes, a connection
// refused. A retried append or commit is stored once: it carries its client key (N3).

import assert from "node:assert/strict";
import http from "node:http";
import { after, test } from "node:test";

import { ActorUnavailableError, Client } from "@fermix/client";

import { AGENT, chatId, server } from "./support.mjs";

const { url, hostToken } = server();
const direct = new Client(url, hostToken);
const proxies = [];
after(() => Promise.all(proxies.map((p) => p.close())));

/**
 * A proxy to the memory server. `plan(n, req)` says what to do with the n-th request
 * (from 0) to a path ending in `route`: "forward" (the default), "503", "lose" (forward
 * it, then drop the connection instead of answering) or "hold" (never answer).
 */
async function proxy(route, plan) {
  const seen = { attempts: 0, forwarded: 0 };
  const held = new Set();
  const upstream = new URL(url);
  const proxyServer = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const mine = req.url.split("?")[0].endsWith(route);
      const step = mine ? plan(seen.attempts++) ?? "forward" : "forward";
      if (step === "503") {
        res.writeHead(503, { "Content-Type": "application/json" });
        res.end(JSON.stringify({ error: { type: "unavailable", message: "busy (the test's proxy)", field: null } }));
        return;
      }
      if (step === "hold") {
        held.add(res);
        return;
      }
      if (mine) seen.forwarded++;
      const forward = http.request(
        { host: upstream.hostname, port: upstream.port, path: req.url, method: req.method, headers: req.headers },
        (answer) => {
          const body = [];
          answer.on("data", (c) => body.push(c));
          answer.on("end", () => {
            if (step === "lose") {
              req.socket.destroy(); // the server stored it; the client never hears so
              return;
            }
            res.writeHead(answer.statusCode ?? 502, answer.headers);
            res.end(Buffer.concat(body));
          });
        },
      );
      forward.end(Buffer.concat(chunks));
    });
  });
  await new Promise((resolve) => proxyServer.listen(0, "127.0.0.1", resolve));
  const entry = {
    url: `http://127.0.0.1:${proxyServer.address().port}`,
    seen,
    close: () =>
      new Promise((resolve) => {
        for (const res of held) res.destroy();
        proxyServer.closeAllConnections();
        proxyServer.close(resolve);
      }),
  };
  proxies.push(entry);
  return entry;
}

async function opened(client, name) {
  return client.conversation(AGENT, "node", chatId(name), { ownerId: "ana" });
}

test("N3: an append whose answer was lost after the server stored it is sent again and stored once", async () => {
  const p = await proxy("/messages", (n) => (n === 0 ? "lose" : "forward"));
  const conv = await opened(new Client(p.url, hostToken), "lost-append");
  const message = await conv.appendUser("Hi, I am Ana"); // no key given: the client's own
  assert.deepEqual(p.seen, { attempts: 2, forwarded: 2 });
  const history = await (await direct.conversation(AGENT, "node", conv.chatId, { ownerId: "ana" })).history();
  assert.deepEqual(history.map((m) => [m.id, m.content]), [[message.id, "Hi, I am Ana"]]);
});

test("N3: a commit whose answer was lost is sent again and stores the reply once", async () => {
  const p = await proxy("/commit", (n) => (n === 0 ? "lose" : "forward"));
  const conv = await opened(new Client(p.url, hostToken), "lost-commit");
  await conv.appendUser("hello");
  await conv.commit("hi Ana", { prompt_tokens: 40 });
  assert.equal(p.seen.forwarded, 2);
  assert.deepEqual((await conv.history()).map((m) => m.role), ["user", "assistant"]);
});

test("a 503 is tried again with a pause, and the append is stored once", async () => {
  const p = await proxy("/messages", (n) => (n < 2 ? "503" : "forward"));
  const conv = await opened(new Client(p.url, hostToken), "busy");
  await conv.appendUser("are you there?");
  assert.deepEqual(p.seen, { attempts: 3, forwarded: 1 });
  assert.equal((await conv.history()).length, 1);
});

test("a 503 past the retries is an ActorUnavailableError with its status", async () => {
  const p = await proxy("/messages", () => "503");
  const conv = await opened(new Client(p.url, hostToken, { retries: 2 }), "always-busy");
  await assert.rejects(conv.appendUser("hello?"), (error) => error instanceof ActorUnavailableError && error.status === 503);
  assert.deepEqual(p.seen, { attempts: 3, forwarded: 0 });
});

test("a request that is not idempotent is not sent again once it may have reached the server", async () => {
  const p = await proxy("/preflight", () => "lose");
  const conv = await opened(new Client(p.url, hostToken), "preflight");
  await assert.rejects(conv.preflight(), (error) => error instanceof ActorUnavailableError && error.status === 0);
  assert.deepEqual(p.seen, { attempts: 1, forwarded: 1 });
});

test("a GET whose answer does not come within the timeout is tried again", async () => {
  const p = await proxy("/messages", (n) => (n === 0 ? "hold" : "forward"));
  const conv = await opened(new Client(p.url, hostToken, { timeoutMs: 300 }), "slow");
  assert.deepEqual(await conv.history(), []);
  assert.deepEqual(p.seen, { attempts: 2, forwarded: 1 });
});

test("a refused connection never reached the server: tried again, even a request that is not idempotent", async () => {
  const p = await proxy("/preflight", () => "forward");
  const dead = http.createServer();
  await new Promise((resolve) => dead.listen(0, "127.0.0.1", resolve));
  const deadUrl = `http://127.0.0.1:${dead.address().port}`;
  await new Promise((resolve) => dead.close(resolve)); // nothing listens there now
  let refused = 0;
  const refusedOnce = (input, init) => {
    const first = String(input).endsWith("/preflight") && refused++ === 0;
    return fetch(first ? String(input).replace(p.url, deadUrl) : input, init);
  };
  const conv = await opened(new Client(p.url, hostToken, { fetch: refusedOnce }), "refused");
  assert.equal(await conv.preflight(), null); // a POST that is not idempotent
  assert.equal(refused, 2);
  assert.deepEqual(p.seen, { attempts: 1, forwarded: 1 });

  const never = new Client(deadUrl, hostToken, { retries: 1 });
  await assert.rejects(never.health(), (error) => error instanceof ActorUnavailableError && /not reachable/.test(error.message));
});
