// Reviews and jobs: recent reviews and compactions, the due and the failed, jobs and runs (W1).

import { seg } from "./api.js";
import { button, el, fill, table, when } from "./dom.js";

function chat(c) {
  return `${c.channel} / ${c.chat_id}${c.thread_scope ? ` / ${c.thread_scope}` : ""} (${c.owner_id || "shared"})`;
}

// An outcome and when, or what the state says when none was kept yet.
function outcome(value, at, otherwise) {
  return value ? `${value} ${when(at)}` : otherwise;
}

// One failed conversation and why: the review's and the compaction's kept reasons.
function failure(c) {
  const why = [];
  if (c.review_failed_at) why.push(`review: ${c.review_reason || "failed"}`);
  if (c.compaction_failed_at) why.push(`compaction: ${c.compaction_reason || "failed"}`);
  return `${chat(c)}: ${why.join("; ")}`;
}

export async function render(root, ctx) {
  const r = await ctx.get("/console/api/reviews", { agent_id: ctx.agent });
  const { jobs } = await ctx.get(`/v1/agents/${seg(ctx.agent)}/jobs`);
  const runsOut = el("div", { id: "runs" });
  fill(root,
    el("h2", {}, "Reviews and jobs"),
    el("p", { class: "help" }, r.review_interval_hours === 0
      ? "Background review is off (interval 0)."
      : `Reviews every ${r.review_interval_hours} h.`),
    el("section", {},
      el("h3", {}, "Recent reviews and compactions"),
      table("conversations, latest review first",
        ["chat", "last review", "review outcome", "review reason", "compaction", "compaction reason"],
        r.conversations.map((c) => [
          chat(c), when(c.last_reviewed_at),
          outcome(c.review_outcome, c.review_outcome_at, c.last_reviewed_at ? "reviewed" : "not yet"),
          c.review_reason || "",
          outcome(c.compaction_outcome, c.compaction_outcome_at,
            c.checkpoint_message_id ? `checkpoint at message ${c.checkpoint_message_id}` : "none"),
          c.compaction_reason || "",
        ]))),
    el("section", {},
      el("h3", {}, "Due now"),
      r.due.length === 0 ? el("p", { class: "muted" }, "None due.")
        : el("ul", { class: "plain" }, r.due.map((k) => el("li", {}, `${k.channel} / ${k.chat_id}`)))),
    el("section", {},
      el("h3", {}, "Failed"),
      r.failed.length === 0 ? el("p", { class: "muted" }, "No failures.")
        : el("ul", { class: "plain" }, r.failed.map((c) => el("li", {}, failure(c)))),
      el("h4", {}, "The server's last errors (why)"),
      r.last_errors.length === 0 ? el("p", { class: "muted" }, "None.")
        : el("ul", { class: "plain" }, r.last_errors.map((e) =>
            el("li", {}, `${new Date(e.at * 1000).toLocaleString()} ${e.where}: ${e.message}`)))),
    el("section", {},
      el("h3", {}, "Jobs"),
      jobs.length === 0 ? el("p", { class: "muted" }, "No scheduled jobs.")
        : table("jobs", ["id", "name", "schedule", "owner", "runs"], jobs.map((j) => [
            String(j.id), j.name, j.schedule, j.owner_id,
            button(`Runs of job ${j.id}`, () => ctx.attempt(async () => {
              const { runs } = await ctx.get(`/v1/jobs/${j.id}/runs`, { limit: 20 });
              fill(runsOut, table(`runs of ${j.name}`, ["id", "status", "started", "finished", "error"],
                runs.map((x) => [String(x.id), x.status, when(x.started_at), when(x.finished_at),
                                 x.error || ""])));
            })),
          ])),
      runsOut));
}
