// The console's JSON calls: the /v1 routes and the console's own, with the session cookie
// as the credential and the session's CSRF token on every write (W2).

let csrf = "";

/** A refused call: the server's message and the field it names. */
export class Refused extends Error {
  constructor(status, message, field) {
    super(field ? `${message} (${field})` : message);
    this.status = status;
    this.field = field;
  }
}

async function answer(response) {
  if (response.status === 401) {
    // The session ended (expired, signed out, token revoked): back to the sign-in page.
    window.location.assign("/console/");
    throw new Refused(401, "signed out");
  }
  const body = response.status === 204 ? {} : await response.json();
  if (!response.ok) {
    const error = body.error || {};
    throw new Refused(response.status, error.message || response.statusText, error.field);
  }
  return body;
}

function url(path, params) {
  const u = new URL(path, window.location.origin);
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== undefined && v !== null) u.searchParams.set(k, String(v));
  }
  return u;
}

/** GET ``path`` with ``params`` as its query; the JSON answer. */
export async function get(path, params) {
  return answer(await fetch(url(path, params), { credentials: "same-origin" }));
}

/** A write (POST, DELETE...) with a JSON body and the CSRF token. */
export async function send(method, path, body, params) {
  const init = {
    method,
    credentials: "same-origin",
    headers: { "X-CSRF-Token": csrf },
  };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  return answer(await fetch(url(path, params), init));
}

/** The session (who, its CSRF token); remembers the token for the writes. */
export async function session() {
  const s = await get("/console/api/session");
  csrf = s.csrf;
  return s;
}

/** A path segment, percent-encoded (owner ids may hold '/' or ':'). */
export function seg(value) {
  return encodeURIComponent(value);
}
