/**
 * The errors the client raises, named as fermix's own (fermix/errors.py), so a host in
 * either language reads the same name for the same refusal.
 *
 * Every one carries the answer's `status` (0 when no answer came) and, when the server
 * named one, the `field` it refused (`body.role`, `path.handle`) and its error `type`
 * (`invalid_input`, `forbidden`...; docs/http.md lists them).
 */

/** Base class of every error the client raises on purpose. */
export class FermixError extends Error {
  override name = "FermixError";
  /** The HTTP status of the answer, or 0 when none came (unreachable, timed out). */
  readonly status: number;
  /** The request field the server refused, when it named one. */
  readonly field: string | null;
  /** The server's error type (`invalid_input`, `not_found`...), when it sent one. */
  readonly type: string | null;

  constructor(
    message: string,
    details: { status?: number; field?: string | null; type?: string | null; cause?: unknown } = {},
  ) {
    super(message, details.cause === undefined ? undefined : { cause: details.cause });
    this.status = details.status ?? 0;
    this.field = details.field ?? null;
    this.type = details.type ?? null;
  }
}

/** An argument was refused before anything was changed (422, 413, or by the client). */
export class InvalidInputError extends FermixError {
  override name = "InvalidInputError";
}

/** The row, conversation or route asked for does not exist (404). */
export class NotFoundError extends FermixError {
  override name = "NotFoundError";
}

/** The token may not do this: unknown, revoked, another agent's, not the operator's (401, 403). */
export class AccessDeniedError extends FermixError {
  override name = "AccessDeniedError";
}

/** A request contradicts what is stored: a client key reused for another message (409). */
export class ConflictError extends FermixError {
  override name = "ConflictError";
}

/** The server is unreachable, did not answer in time, or cannot take it now (503). */
export class ActorUnavailableError extends FermixError {
  override name = "ActorUnavailableError";
}

const BY_STATUS: Readonly<Record<number, typeof FermixError>> = {
  401: AccessDeniedError,
  403: AccessDeniedError,
  404: NotFoundError,
  405: NotFoundError,
  409: ConflictError,
  413: InvalidInputError,
  422: InvalidInputError,
  503: ActorUnavailableError,
};

/** The error of an error answer: its class by status, its message and field from the body. */
export function errorOf(status: number, data: unknown): FermixError {
  const error =
    typeof data === "object" && data !== null && "error" in data
      ? (data as { error: unknown }).error
      : undefined;
  let message: string;
  let field: string | null = null;
  let type: string | null = null;
  if (typeof error === "object" && error !== null) {
    const body = error as { message?: unknown; field?: unknown; type?: unknown };
    message = typeof body.message === "string" && body.message ? body.message : `HTTP ${status}`;
    field = typeof body.field === "string" ? body.field : null;
    type = typeof body.type === "string" ? body.type : null;
  } else {
    const text = typeof data === "string" ? data : JSON.stringify(data ?? null);
    message = `HTTP ${status}: ${text.slice(0, 200)}`;
  }
  const Class = BY_STATUS[status] ?? FermixError;
  return new Class(message, { status, field, type });
}
