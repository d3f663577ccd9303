// What every test needs: the server the pytest wrapper started (tests/integrations/
// test_typescript.py passes FERMIX_URL, FERMIX_TOKEN, FERMIX_OPERATOR_TOKEN) and a chat id
// of its own, so tests sharing one server keep apart.

import { randomUUID } from "node:crypto";

/** The agent both tokens act for (tests/server_fixtures.py). */
export const AGENT = process.env.FERMIX_AGENT ?? "assistant";

function need(name) {
  const value = process.env[name];
  if (!value) throw new Error(`set ${name}: the tests run against a real memory server (npm test via pytest)`);
  return value;
}

/** The server's url and its host (guest) and operator tokens. */
export function server() {
  return {
    url: need("FERMIX_URL"),
    hostToken: need("FERMIX_TOKEN"),
    operatorToken: need("FERMIX_OPERATOR_TOKEN"),
  };
}

/** A chat id no other test uses. */
export function chatId(prefix) {
  return `${prefix}-${randomUUID().slice(0, 8)}`;
}

/** The V4 usage of a model call that read `input` prompt tokens. */
export function usage(input, output = 5) {
  return {
    inputTokens: { total: input, noCache: input, cacheRead: 0, cacheWrite: 0 },
    outputTokens: { total: output, text: output, reasoning: 0 },
  };
}

export const STOP = { unified: "stop", raw: "stop" };
export const TOOL_CALLS = { unified: "tool-calls", raw: "tool_calls" };
