// The console's shell: the session, the agent chosen, the pages by the URL's #fragment.

import { get, send, session, Refused } from "./api.js";
import { el, fill } from "./dom.js";
import * as people from "./people.js";
import * as setup from "./setup.js";
import * as tokens from "./tokens.js";
import * as reviews from "./reviews.js";
import * as status from "./status.js";

const PAGES = { people, setup, tokens, reviews, status };
const main = document.getElementById("main");
const notice = document.getElementById("notice");
const agentSelect = document.getElementById("agent");
let stopPage = null;

/** Say something in the live region (errors in red). */
function say(message, bad = false) {
  notice.textContent = message;
  notice.classList.toggle("bad", bad);
}

/** Run an action, saying what a refusal was instead of failing silently. */
async function attempt(action, done) {
  try {
    const result = await action();
    if (done) say(done);
    return result;
  } catch (error) {
    if (error instanceof Refused && error.status === 401) return undefined;
    say(error.message, true);
    return undefined;
  }
}

async function show(ctx) {
  const name = (window.location.hash || "#people").slice(1);
  const page = PAGES[name] || people;
  for (const a of document.querySelectorAll("nav a")) {
    if (a.dataset.page === name) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  if (stopPage) stopPage();
  stopPage = null;
  fill(main);
  say("");
  const stop = await attempt(() => page.render(main, { ...ctx, agent: agentSelect.value }));
  if (typeof stop === "function") stopPage = stop;
}

async function start() {
  const s = await session();
  for (const agent of s.token.agents) agentSelect.append(el("option", { value: agent }, agent));
  document.getElementById("signed-in").textContent = `signed in as token ${s.token.id} ${s.token.name}`;
  const ctx = { session: s, say, attempt, get, send };
  document.getElementById("signout").addEventListener("click", async () => {
    await attempt(() => send("POST", "/console/api/signout"));
    window.location.assign("/console/");
  });
  agentSelect.addEventListener("change", () => show(ctx));
  window.addEventListener("hashchange", () => show(ctx).then(() => main.focus()));
  await show(ctx);
}

start().catch((error) => say(error.message, true));
