// The cluster page: every member with its role, term, indexes, release,
// database size against the quota and health, the leader marked, and the
// cluster's alarms; live from `/ui/api/cluster` (a line a second). A member
// that does not answer its status, or a page that heard nothing for two
// seconds, turns red.

import { el, stream, call, action, may, say, size } from "./app.js";

/// How long without a line before every member shows as unknown.
const STALE_MS = 2000;

export function render(main) {
  const abort = new AbortController();
  const state = el("p", { class: "muted", role: "status" }, "Asking every member…");
  const body = el("tbody");
  const alarms = el("div");
  main.append(
    el("h1", {}, "Cluster"),
    state,
    el("table", { "aria-label": "Members" },
      el("thead", {}, el("tr", {},
        el("th", { scope: "col" }, "Member"), el("th", { scope: "col" }, "Role"), el("th", { scope: "col" }, "Health"),
        el("th", { scope: "col", class: "num" }, "Term"), el("th", { scope: "col", class: "num" }, "Applied index"),
        el("th", { scope: "col", class: "num" }, "Raft index"), el("th", { scope: "col" }, "Release"),
        el("th", { scope: "col" }, "Database"), el("th", { scope: "col" }, "Client URLs"), el("th", { scope: "col" }, ""))),
      body),
    el("h2", {}, "Alarms"),
    alarms,
  );
  let heard = 0;
  let last = null;
  const draw = (view, stale) => {
    const leader = view.members.map((m) => m.status && m.status.leader).find((l) => l && l !== "0");
    body.replaceChildren(...view.members.map((m) => row(m, view, leader, stale)));
    alarms.replaceChildren(view.alarms.length
      ? el("ul", {}, view.alarms.map((a) => el("li", { class: "error" }, `${a.alarm} on member ${a.member}`)))
      : el("p", { class: "muted" }, "None."));
    say(state, stale
      ? "No word from the member serving this page for over two seconds."
      : `As member ${view.served_by} sees it, ${new Date().toLocaleTimeString()}.`, stale);
  };
  const timer = setInterval(() => {
    if (last && Date.now() - heard > STALE_MS) draw(last, true);
  }, 500);
  (async () => {
    while (!abort.signal.aborted) {
      try {
        await stream("/ui/api/cluster", null, (view) => { heard = Date.now(); last = view; draw(view, false); }, abort.signal, "GET");
      } catch (e) {
        if (abort.signal.aborted) return;
        say(state, `The member serving this page did not answer: ${e.message}`, true);
      }
      await new Promise((r) => setTimeout(r, 1000));
    }
  })();
  return () => { abort.abort(); clearInterval(timer); };
}

function row(m, view, leader, stale) {
  const s = m.status;
  const down = stale || !s;
  // A member that does not answer may lead or follow: unknown from here.
  const role = m.is_learner ? "learner" : !s ? "unknown" : leader === m.id ? "leader" : "follower";
  const health = down
    ? el("span", { class: "badge bad" }, stale ? "unknown" : "not answering")
    : el("span", { class: "badge ok" }, "answering");
  const quota = Number(view.quota || 0);
  const db = s ? Number(s.db_size) : 0;
  const bar = quota
    ? el("span", { class: "bar", role: "img", "aria-label": `${Math.round((100 * db) / quota)}% of the quota` },
        el("span", { style: `width: ${Math.min(100, (100 * db) / quota).toFixed(1)}%` }))
    : null;
  const move = role === "follower" && s && !stale
    ? action("Make leader", may("admin"), `Move the leadership to member ${m.name} (${m.id})?`,
        () => call("/v3/maintenance/transfer-leadership", { targetID: BigInt("0x" + m.id).toString() }))
    : null;
  return el("tr", { class: down ? "down" : "", "data-member": m.name, "data-role": role },
    el("th", { scope: "row" }, el("strong", {}, m.name || "(unstarted)"), el("br"), el("code", {}, m.id)),
    el("td", {}, el("span", { class: `badge ${role}` }, role)),
    el("td", {}, health, m.error ? el("div", { class: "error" }, m.error) : null),
    el("td", { class: "num" }, s ? s.raft_term : "–"),
    el("td", { class: "num" }, s ? s.applied_index : "–"),
    el("td", { class: "num" }, s ? s.raft_index : "–"),
    el("td", {}, s ? s.release : "–"),
    el("td", {}, s ? size(db) : "–", quota ? [" of ", size(quota), " ", bar] : ""),
    el("td", {}, (m.client_urls || []).map((u) => el("div", {}, el("code", {}, u)))),
    el("td", {}, move),
  );
}
