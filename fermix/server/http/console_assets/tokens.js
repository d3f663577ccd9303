// Tokens: create (the secret shown once), list, revoke (W1, N2).

import { button, el, field, fill, table, when } from "./dom.js";

export async function render(root, ctx) {
  const list = el("div", { id: "token-list" });
  const secretOut = el("div", { id: "token-secret", "aria-live": "polite" });
  const name = el("input", { id: "token-name", name: "name", maxlength: 200 });
  const agents = el("input", { id: "token-agents", name: "agents", value: ctx.agent,
                               "aria-describedby": "token-agents-help" });
  const operator = el("input", { id: "token-operator", name: "operator", type: "checkbox" });
  const form = el("form", { class: "inline", id: "token-create" },
    field("Name", name),
    field("Agents", agents),
    el("span", { id: "token-agents-help", class: "help" }, "comma-separated"),
    el("div", { class: "field" }, operator, el("label", { for: "token-operator" }, "Operator")),
    el("button", { type: "submit" }, "Create token"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    ctx.attempt(async () => {
      const made = await ctx.send("POST", "/console/api/tokens", {
        name: name.value,
        agents: agents.value.split(",").map((a) => a.trim()).filter(Boolean),
        operator: operator.checked,
      });
      fill(secretOut,
        el("p", {}, `Token ${made.token.id} made. Its secret, shown only now:`),
        el("p", { class: "secret", id: "new-secret" }, made.secret));
      await refresh();
    }, "Token created; copy its secret now.");
  });
  const refresh = async () => {
    const { tokens } = await ctx.get("/console/api/tokens");
    fill(list, table("tokens, oldest first", ["id", "name", "prefix", "agents", "operator", "made", "state", ""],
      tokens.map((t) => [
        String(t.id), t.name, `${t.prefix}…`, t.agents.join(", "), t.operator ? "yes" : "no",
        when(t.created_at), t.revoked_at ? `revoked ${when(t.revoked_at)}` : "live",
        t.revoked_at ? "" : button(`Revoke token ${t.id}`, () => ctx.attempt(async () => {
          await ctx.send("POST", `/console/api/tokens/${t.id}/revoke`);
          await refresh();
        }, `Token ${t.id} revoked.`)),
      ])));
  };
  fill(root, el("h2", {}, "Tokens"), form, secretOut, list);
  await refresh();
}
