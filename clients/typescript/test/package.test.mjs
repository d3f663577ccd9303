// `npm pack` makes a package a host installs as it is: ESM with its .d.ts, no runtime
// dependency (the client needs only the global fetch), `ai` needed by the middleware's
// entry point alone (I5).

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const run = promisify(execFile);
const ROOT = fileURLToPath(new URL("..", import.meta.url));

test("I5: npm pack makes an installable package with no runtime dependency, and ai-sdk needs only its peer", async () => {
  const dir = await mkdtemp(join(tmpdir(), "fermix-pack-"));
  try {
    const { stdout } = await run("npm", ["pack", "--json", "--pack-destination", dir], { cwd: ROOT });
    const [packed] = JSON.parse(stdout.slice(stdout.indexOf("[")));
    const files = packed.files.map((f) => f.path);
    for (const name of ["dist/index.js", "dist/index.d.ts", "dist/ai-sdk.js", "dist/ai-sdk.d.ts", "dist/schema.d.ts", "package.json"]) {
      assert.ok(files.includes(name), `${name} is not in the package: ${files.join(", ")}`);
    }
    assert.ok(!files.some((f) => f.startsWith("test/") || f.startsWith("node_modules/")));
    const manifest = JSON.parse(await readFile(join(ROOT, "package.json"), "utf8"));
    assert.equal(manifest.dependencies, undefined);
    assert.equal(manifest.peerDependenciesMeta.ai.optional, true);

    const host = join(dir, "host");
    await run("mkdir", ["-p", host]);
    await writeFile(join(host, "package.json"), JSON.stringify({ name: "host", private: true, type: "module" }));
    await run("npm", ["install", "--offline", "--no-audit", "--no-fund", "--legacy-peer-deps", join(dir, packed.filename)], {
      cwd: host,
    });
    const probe = `
      const client = await import("@fermix/client");
      let middleware = "loaded";
      try { await import("@fermix/client/ai-sdk"); } catch (e) { middleware = e.code + " " + e.message; }
      console.log(JSON.stringify({ exports: Object.keys(client).sort(), middleware }));
    `;
    const out = JSON.parse((await run("node", ["--input-type=module", "-e", probe], { cwd: host })).stdout);
    for (const name of ["Client", "Conversation", "FermixError", "InvalidInputError", "ActorUnavailableError"]) {
      assert.ok(out.exports.includes(name), out.exports.join());
    }
    // Without `ai` installed the client works; its middleware's entry point asks for ai.
    assert.match(out.middleware, /^ERR_MODULE_NOT_FOUND .*'ai'/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
