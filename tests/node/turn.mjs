// One complete turn against the fermix memory server from Node 20, with no package: the
// global fetch only (N1). Run by tests/server/test_node_host.py against a real server:
//
//   FERMIX_URL=http://127.0.0.1:8765 FERMIX_TOKEN=fmx_... node tests/node/turn.mjs
//
// It opens a conversation, appends the user's message with a client_key, sends that same
// append again (as a host does after a timeout: the server must not store it twice),
// preflights, composes, commits the reply with the provider's usage, reads the history,
// and prints one JSON object of what it saw. Any unexpected answer exits 1 with the error.

const url = process.env.FERMIX_URL;
const token = process.env.FERMIX_TOKEN;
const agent = process.env.FERMIX_AGENT ?? "assistant";
const chat = process.env.FERMIX_CHAT ?? "node-1";
if (!url || !token) {
  console.error("set FERMIX_URL and FERMIX_TOKEN");
  process.exit(2);
}

async function call(method, path, body, expected) {
  const answer = await fetch(`${url}/v1${path}`, {
    method,
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await answer.json();
  if (!expected.includes(answer.status)) {
    throw new Error(`${method} ${path}: ${answer.status} ${JSON.stringify(data)}`);
  }
  return { status: answer.status, headers: answer.headers, data };
}

async function turn() {
  const opened = await call(
    "POST",
    "/conversations/open",
    { agent_id: agent, channel: "node", chat_id: chat, owner_id: "ana" },
    [200],
  );
  const conv = `/conversations/${opened.data.handle}`;
  const said = {
    role: "user",
    text: "Hi! I am Ana, a nurse. I moved to Porto last month.",
    sender: "ana",
    client_key: `${chat}-msg-1`,
  };
  const appended = await call("POST", `${conv}/messages`, said, [201, 200]);
  const again = await call("POST", `${conv}/messages`, said, [200]);
  const preflight = await call("POST", `${conv}/preflight`, undefined, [200]);
  const composed = await call(
    "POST",
    `${conv}/compose`,
    { system: "You are a friendly assistant." },
    [200],
  );
  // Here a host calls its model with composed.data.messages; this one answers itself.
  const committed = await call(
    "POST",
    `${conv}/commit`,
    {
      reply: "Welcome to Porto, Ana!",
      usage: { prompt_tokens: 412, completion_tokens: 9 },
      client_key: `${chat}-reply-1`,
    },
    [201, 200],
  );
  const history = await call("GET", `${conv}/messages`, undefined, [200]);
  return {
    handle: opened.data.handle,
    trust: opened.data.trust,
    append: { status: appended.status, id: appended.data.id },
    again: {
      status: again.status,
      id: again.data.id,
      replayed: again.headers.get("idempotent-replayed"),
    },
    preflight: preflight.data,
    composed: composed.data.messages.map((m) => ({ role: m.role, content: m.content })),
    commit: { status: committed.status, id: committed.data.id, role: committed.data.role },
    history: history.data.messages.map((m) => ({
      id: m.id,
      role: m.role,
      content: m.content,
      client_key: m.client_key,
    })),
  };
}

try {
  console.log(JSON.stringify(await turn()));
} catch (error) {
  console.error(String(error));
  process.exit(1);
}
