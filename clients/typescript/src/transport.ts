/**
 * HTTP to the memory server: JSON both ways over the global `fetch`, errors as fermix's.
 *
 * The same retry rules as fermix's Python client (fermix/remote/transport.py), so a host
 * behaves the same in either language. A request that never reached the server (the
 * connection was refused, the name did not resolve) and a 503 are tried again, up to
 * `retries` times, pausing 0.1 s, 0.2 s, 0.4 s... (at most 2 s) between tries. A request
 * that may have reached it (the connection broke, the answer timed out) is tried again
 * only when repeating it is harmless: a GET, or a request the caller marks `idempotent`
 * (an append or commit carrying its client key, which the server stores once, N3).
 * Anything else is raised: doubling a review is not this layer's call to make.
 */

import { ActorUnavailableError, FermixError, InvalidInputError, errorOf } from "./errors.js";

/** The routes' prefix: every path the transport sends starts with it. */
export const API_PREFIX = "/v1";
/** The first pause between tries, in ms; it doubles each time. */
export const RETRY_PAUSE_MS = 100;
/** The longest pause between tries, in ms. */
export const MAX_PAUSE_MS = 2000;

/** The error codes of a connection that was never made: the request did not get through. */
const NOT_CONNECTED = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EADDRNOTAVAIL",
  "UND_ERR_CONNECT_TIMEOUT",
]);

/** How the client reaches the server: `timeoutMs` per try, `retries` after the first. */
export interface TransportOptions {
  /** The longest wait for one answer, in ms (default 30 000; a forced review may need more). */
  timeoutMs?: number;
  /** How often a request that did not get through, or was answered 503, is tried again (3). */
  retries?: number;
  /** The fetch to send with (the global one unless given: a test's, or one with a proxy). */
  fetch?: typeof globalThis.fetch;
}

/** One answer: its status, headers and decoded body (JSON, text, or null for none). */
export interface Answer<T = unknown> {
  status: number;
  headers: Headers;
  data: T;
}

/** Query parameters; undefined and null values are left out, booleans sent as true/false. */
export type Params = Record<string, string | number | boolean | null | undefined>;

/** What one request sends besides its method and path. */
export interface RequestOptions {
  json?: unknown;
  params?: Params;
  /** Whether sending it again after a lost answer is harmless (default: only for GET). */
  idempotent?: boolean;
}

/** JSON over `fetch` to the server at `url`, with `token`, retried as the module says. */
export class Transport {
  readonly url: string;
  readonly retries: number;
  readonly timeoutMs: number;
  readonly #headers: Record<string, string>;
  readonly #fetch: typeof globalThis.fetch;

  constructor(url: string, token: string, options: TransportOptions = {}) {
    if (typeof token !== "string" || !token.trim()) {
      throw new InvalidInputError("the client needs a token (fermix token create)");
    }
    const retries = options.retries ?? 3;
    if (!Number.isInteger(retries) || retries < 0) {
      throw new InvalidInputError(`retries must be a non-negative integer, not ${String(retries)}`);
    }
    const timeoutMs = options.timeoutMs ?? 30_000;
    if (!(typeof timeoutMs === "number" && timeoutMs > 0)) {
      throw new InvalidInputError(`timeoutMs must be a positive number, not ${String(timeoutMs)}`);
    }
    this.url = checkedUrl(url);
    this.retries = retries;
    this.timeoutMs = timeoutMs;
    this.#fetch = options.fetch ?? globalThis.fetch;
    this.#headers = {
      Authorization: `Bearer ${token.trim()}`,
      Accept: "application/json",
      "User-Agent": "fermix-client-ts",
    };
  }

  /** Send one request; answer its decoded body. Raises the fermix error of a 4xx or 5xx. */
  async request<T>(method: string, path: string, options: RequestOptions = {}): Promise<T> {
    return (await this.send<T>(method, path, options)).data;
  }

  /** As `request`, answering the status and headers too (a replayed append's 200). */
  async send<T>(method: string, path: string, options: RequestOptions = {}): Promise<Answer<T>> {
    const response = await this.#exchange(method, path, options, async (answer) => ({
      status: answer.status,
      headers: answer.headers,
      data: decode(await answer.text()) as T,
    }));
    if (response.status >= 400) throw errorOf(response.status, response.data);
    return response;
  }

  /**
   * GET `path` and answer its body as a stream (a streamed export), once the status says
   * it is no error. Retried as a GET until the body starts; not once it is flowing.
   */
  async download(path: string, params?: Params): Promise<ReadableStream<Uint8Array>> {
    const answer = await this.#exchange("GET", path, { params }, async (response) => {
      if (response.status >= 400) {
        return { status: response.status, data: decode(await response.text()), body: null };
      }
      return { status: response.status, data: null, body: response.body };
    });
    if (answer.status >= 400 || answer.body === null) throw errorOf(answer.status, answer.data);
    return answer.body;
  }

  /** One request, tried again as the module says; `read` takes the answer apart. */
  async #exchange<R extends { status: number }>(
    method: string,
    path: string,
    options: RequestOptions,
    read: (response: Response) => Promise<R>,
  ): Promise<R> {
    const url = this.url + (path.startsWith(API_PREFIX + "/") ? path : API_PREFIX + path) + query(options.params);
    const body = options.json === undefined ? undefined : JSON.stringify(options.json);
    const headers = body === undefined ? this.#headers : { ...this.#headers, "Content-Type": "application/json" };
    const repeatable = options.idempotent ?? method === "GET";
    for (let attempt = 0; ; attempt++) {
      let answer: R;
      // The deadline covers the answer as `read` takes it: all of a JSON body, only the
      // status of a streamed one (an export may flow for longer than any one answer).
      const deadline = new AbortController();
      const timer = setTimeout(() => deadline.abort(new DOMException("timed out", "TimeoutError")), this.timeoutMs);
      try {
        const response = await this.#fetch(url, { method, headers, body, signal: deadline.signal, redirect: "manual" });
        answer = await read(response);
      } catch (error) {
        if (!isNetworkFailure(error)) throw error;
        const reached = !notConnected(error);
        if (attempt < this.retries && (!reached || repeatable)) {
          await pause(attempt);
          continue;
        }
        throw unavailable(method, path, this.url, error, reached);
      } finally {
        clearTimeout(timer);
      }
      if (answer.status === 503 && attempt < this.retries) {
        await pause(attempt);
        continue;
      }
      return answer;
    }
  }
}

/** `url` without its trailing slashes, refused unless it is http:// or https://. */
function checkedUrl(url: string): string {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new InvalidInputError(`the server url must be http://HOST:PORT or https://..., not ${JSON.stringify(url)}`);
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    throw new InvalidInputError(
      `the server url must be http://HOST:PORT or https://... (a Unix socket needs the Python client), not ${JSON.stringify(url)}`,
    );
  }
  return url.replace(/\/+$/, "");
}

/**
 * Whether `error` is one of fetch's own failures: its TypeError ("fetch failed", the
 * connection refused or broken) or the deadline's abort. Nothing else is retried.
 */
function isNetworkFailure(error: unknown): boolean {
  return error instanceof TypeError || (error instanceof Error && (error.name === "TimeoutError" || error.name === "AbortError"));
}

/** Whether `error` is fetch's failure to connect at all (nothing was sent). */
function notConnected(error: unknown): boolean {
  const cause = error instanceof Error ? (error.cause as { code?: unknown; errors?: unknown } | undefined) : undefined;
  if (cause === undefined || cause === null) return false;
  if (typeof cause.code === "string" && NOT_CONNECTED.has(cause.code)) return true;
  // Happy eyeballs tries every address of a name and reports them together.
  return (
    Array.isArray(cause.errors) &&
    cause.errors.length > 0 &&
    cause.errors.every((e: { code?: unknown }) => typeof e?.code === "string" && NOT_CONNECTED.has(e.code))
  );
}

function unavailable(method: string, path: string, url: string, error: unknown, reached: boolean): FermixError {
  const detail = error instanceof Error ? describe(error) : String(error);
  const message = reached
    ? `${method} ${path}: no answer from ${url}: ${detail}`
    : `the memory server at ${url} is not reachable: ${detail}`;
  return new ActorUnavailableError(message, { cause: error });
}

function describe(error: Error): string {
  const cause = error.cause instanceof Error ? `: ${error.cause.message}` : "";
  return `${error.message}${cause}`;
}

/**
 * A pause between tries of a request, not a wait for another task: the server was
 * unreachable or busy, and asking again at once would fail the same way.
 */
function pause(attempt: number): Promise<void> {
  const ms = Math.min(RETRY_PAUSE_MS * 2 ** attempt, MAX_PAUSE_MS);
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function decode(text: string): unknown {
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

function query(params: Params | undefined): string {
  if (!params) return "";
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value === undefined || value === null) continue;
    search.append(name, typeof value === "boolean" ? (value ? "true" : "false") : String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

/** `part` quoted as one path segment (an owner id with a `/` in it). */
export function segment(part: string): string {
  return encodeURIComponent(part);
}
