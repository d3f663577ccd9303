// Setup: the values of config.toml the seed's web setup sets, checked by the server as
// `fermix config set` checks them (W1).

import { el, fill } from "./dom.js";

export async function render(root, ctx) {
  const state = await ctx.get("/console/api/setup");
  draw(root, ctx, state);
}

function draw(root, ctx, state) {
  const rows = state.keys.map((k) => {
    const id = `set-${k.key.split(".").slice(1).join("-")}`;
    const input = el("input", { id, name: k.key, value: k.value, "aria-describedby": `${id}-doc` });
    const form = el("form", { class: "inline" },
      el("label", { for: id }, k.key.split(".").slice(1).join(".")),
      input,
      el("button", { type: "submit" }, "Save"));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      ctx.attempt(async () => {
        const next = await ctx.send("POST", "/console/api/setup", { key: k.key, value: input.value });
        draw(root, ctx, next);
      }, `${k.key} saved; it applies ${k.applies}.`);
    });
    return el("li", { class: "setting" }, form,
      el("p", { id: `${id}-doc`, class: "help" },
        `${k.doc} Accepts ${k.accepts}. Default ${k.default || "(unset)"}; now from `
        + `${k.set_in_file ? "config.toml" : "the default"}. A change applies ${k.applies}.`));
  });
  fill(root,
    el("h2", {}, "Setup"),
    el("p", { class: "help" }, `Written to ${state.path}, keeping its comments. `
      + "An empty value unsets the key (its default applies). Review interval: hours, 0 turns background review off."),
    el("ul", { class: "plain settings" }, rows));
}
