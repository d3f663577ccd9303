// People: an agent's owners, their memory rows, prompt files and conversations (W1).

import { seg } from "./api.js";
import { button, el, field, fill, ownerLabel, select, table, when } from "./dom.js";

const FILES = [["user_md", "USER.md"], ["memory_md", "MEMORY.md"]];

export async function render(root, ctx) {
  const { agent, get } = ctx;
  const { owners } = await get("/console/api/owners", { agent_id: agent });
  const ownerSelect = select("owner", owners.map((o) => [o, ownerLabel(o)]), owners[0]);
  const body = el("div", { id: "person" });
  fill(
    root,
    el("h2", {}, "People"),
    owners.length === 0
      ? el("p", { class: "muted" }, `Agent ${agent} has no owners yet.`)
      : el("div", { class: "controls" }, field("Owner", ownerSelect)),
    body,
  );
  if (owners.length === 0) return;
  const showOwner = () => person(body, ctx, ownerSelect.value);
  ownerSelect.addEventListener("change", () => ctx.attempt(showOwner));
  await showOwner();
}

async function person(root, ctx, owner) {
  const rows = el("section", { "aria-labelledby": "rows-h" });
  const files = el("section", { "aria-labelledby": "files-h" });
  const talks = el("section", { "aria-labelledby": "talks-h" });
  fill(root, rows, files, talks);
  await Promise.all([rowsSection(rows, ctx, owner), filesSection(files, ctx, owner),
                     talksSection(talks, ctx, owner)]);
}

// -- memory rows ---------------------------------------------------------------------------

async function rowsSection(root, ctx, owner) {
  const { session } = ctx;
  const q = el("input", { id: "row-q", type: "search", name: "q" });
  const scope = select("row-scope", [["", "any"], ...session.scope_types.map((s) => [s, s])], "");
  const category = select("row-category", [["", "any"], ...session.categories.map((c) => [c, c])], "");
  const archived = select("row-archived", [["live", "live"], ["all", "live and archived"],
                                           ["archived", "archived only"]], "live");
  const form = el("form", { class: "inline", id: "row-filter" },
    field("Search", q), field("Scope", scope), field("Category", category),
    field("Archived", archived), el("button", { type: "submit" }, "Find"));
  const out = el("div", { id: "rows" });
  fill(root, el("h3", { id: "rows-h" }, "Memory rows"), form, out);
  const find = async () => {
    const params = { owner_id: owner, category: category.value || undefined, limit: 200 };
    if (archived.value === "all") params.include_archived = true;
    if (archived.value === "archived") params.archived_only = true;
    let found;
    if (q.value.trim()) {
      found = (await ctx.get(`/v1/agents/${seg(ctx.agent)}/memories/search`,
                             { ...params, q: q.value.trim() })).memories;
      if (scope.value) found = found.filter((r) => r.scope_type === scope.value);
    } else {
      found = (await ctx.get(`/v1/agents/${seg(ctx.agent)}/memories`,
                             { ...params, scope: scope.value || undefined })).memories;
    }
    fill(out, rowsTable(found, ctx, find));
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    ctx.attempt(find);
  });
  await find();
}

function rowsTable(found, ctx, refresh) {
  if (found.length === 0) return el("p", { class: "muted" }, "No rows match.");
  const act = (label, call, done) => button(label, () => ctx.attempt(async () => {
    await call();
    await refresh();
  }, done));
  return table(`${found.length} rows`, ["id", "key", "value", "category", "scope", "state", "actions"],
    found.map((r) => [
      String(r.id), r.key, r.value, r.category, `${r.scope_type}:${r.scope_id}`,
      r.archived_at ? `archived ${when(r.archived_at)}` : "live",
      el("span", {},
        r.archived_at
          ? act(`Restore ${r.key}`, () => ctx.send("POST", `/v1/memories/${r.id}/restore`),
                `Row ${r.id} restored.`)
          : act(`Archive ${r.key}`, () => ctx.send("POST",
                `/v1/agents/${seg(r.agent_id)}/memories/archive`, {
                  key: r.key, scope_type: r.scope_type, scope_id: r.scope_id,
                  owner_id: r.owner_id, trust: "operator", source: "console" }),
                `Row ${r.id} archived.`),
        " ",
        act(`Forget ${r.key}`, async () => {
          if (!window.confirm(`Erase row ${r.id} for good?`)) return;
          const report = await ctx.send("DELETE", `/v1/memories/${r.id}`);
          ctx.say(`Row ${r.id} forgotten (erasure ${report.erasure_id}: ${report.state}).`);
        }, undefined)),
    ]));
}

// -- prompt files: revisions, diff, rollback -------------------------------------------------

async function filesSection(root, ctx, owner) {
  const { resources } = await ctx.get(`/v1/agents/${seg(ctx.agent)}/resources`, { owner_id: owner });
  const head = el("h3", { id: "files-h" }, "Prompt files");
  if (resources.length === 0) {
    fill(root, head, el("p", { class: "muted" }, "No prompt files yet."));
    return;
  }
  const names = FILES.filter(([n]) => resources.some((r) => r.name === n));
  const fileSelect = select("file", names, names[0][0]);
  const out = el("div", { id: "file" });
  fill(root, head, el("div", { class: "controls" }, field("File", fileSelect)), out);
  const show = () => ctx.attempt(() => fileHistory(out, ctx, owner, fileSelect.value));
  fileSelect.addEventListener("change", show);
  await show();
}

async function fileHistory(root, ctx, owner, name) {
  const base = `/v1/agents/${seg(ctx.agent)}/resources/${name}`;
  const [current, { revisions }] = await Promise.all([
    ctx.get(base, { owner_id: owner }),
    ctx.get(`${base}/history`, { owner_id: owner, limit: 50 }),
  ]);
  const shown = el("pre", { id: "file-text" }, current.content);
  const diffOut = el("pre", { id: "diff", "aria-label": "Diff" });
  const label = FILES.find(([n]) => n === name)[1];
  const rows = revisions.map((r) => [
    String(r.revision), r.reason, when(r.created_at),
    el("span", {},
      button(`Show ${label} revision ${r.revision}`, () => ctx.attempt(async () => {
        const old = await ctx.get(base, { owner_id: owner, revision: r.revision });
        fill(shown, old.content);
      })),
      " ",
      button(`Diff ${label} revision ${r.revision} with current`, () => ctx.attempt(async () => {
        const d = await ctx.get("/console/api/diff", {
          agent_id: ctx.agent, name, owner_id: owner, a: r.revision, b: current.revision });
        fill(diffOut, ...diffLines(d.diff));
      })),
      " ",
      r.revision === current.revision ? null : button(`Roll ${label} back to revision ${r.revision}`,
        () => ctx.attempt(async () => {
          await ctx.send("POST", `${base}/rollback`, { revision: r.revision, owner_id: owner });
          await fileHistory(root, ctx, owner, name);
        }, `${label} rolled back to revision ${r.revision}.`))),
  ]);
  fill(root,
    el("p", {}, `${label}, revision ${current.revision}:`), shown,
    table(`${label} revisions, newest first`, ["revision", "reason", "when", "actions"], rows),
    el("h4", {}, "Diff"), diffOut);
}

function diffLines(text) {
  if (!text) return ["(no difference)"];
  return text.split("\n").map((line) => {
    const cls = line.startsWith("+") && !line.startsWith("+++") ? "diff-add"
      : line.startsWith("-") && !line.startsWith("---") ? "diff-del" : undefined;
    return el("span", { class: cls }, `${line}\n`);
  });
}

// -- conversations and their messages ----------------------------------------------------------

async function talksSection(root, ctx, owner) {
  const { conversations } = await ctx.get("/console/api/conversations",
                                          { agent_id: ctx.agent, owner_id: owner });
  const out = el("div", { id: "messages" });
  const rows = conversations.map((c) => [
    `${c.channel} / ${c.chat_id}${c.thread_scope ? ` / ${c.thread_scope}` : ""}`,
    when(c.updated_at), when(c.last_reviewed_at),
    button(`Messages of ${c.channel} ${c.chat_id}`, () => ctx.attempt(async () => {
      const { messages } = await ctx.get("/console/api/messages", {
        agent_id: c.agent_id, channel: c.channel, chat_id: c.chat_id,
        thread_scope: c.thread_scope });
      fill(out, table(`${messages.length} newest messages, oldest first`,
        ["id", "when", "role", "sender", "text"],
        messages.map((m) => [String(m.id), when(m.created_at), m.role, m.sender, m.content])));
    })),
  ]);
  fill(root, el("h3", { id: "talks-h" }, "Conversations"),
    conversations.length === 0 ? el("p", { class: "muted" }, "No conversations.")
      : table("conversations", ["chat", "last activity", "last review", "messages"], rows),
    out);
}
