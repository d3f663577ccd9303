// The client's types follow the server: src/schema.ts is what openapi-typescript makes of
// the document the running server serves. A route or body the server changed and the
// client did not follow fails here; `FERMIX_URL=... npm run schema` writes it again.

import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { test } from "node:test";

import { SCHEMA_FILE, fetchDocument, render } from "../scripts/schema.mjs";
import { server } from "./support.mjs";

test("I5: the committed src/schema.ts is the server's OpenAPI document, as openapi-typescript renders it", async () => {
  const document = await fetchDocument(server().url);
  assert.ok(document.paths["/v1/conversations/{handle}/messages"], "not the memory server's document");
  const expected = await render(document);
  const committed = await readFile(SCHEMA_FILE, "utf8");
  assert.ok(
    committed === expected,
    "src/schema.ts differs from the server's /openapi.json: run `FERMIX_URL=<a running server> npm run schema` and follow the change in the client",
  );
});

test("I5: a change in the server's document changes the rendered schema (the check can fail)", async () => {
  const document = await fetchDocument(server().url);
  const changed = structuredClone(document);
  changed.components.schemas.AppendRequest.properties.text.maxLength += 1;
  changed.components.schemas.AppendRequest.properties.mood = { type: "string" };
  assert.notEqual(await render(changed), await render(document));
});
