// The leases page: every lease with its TTL left (counting down between
// answers) and its keys, a page of 50 at a time, asked again every two
// seconds; revoke (with a confirmation) for a visitor who may.

import { el, call, action, may, say, pagerButtons, hex, text, secs } from "./app.js";

const PAGE = 50;
const EVERY_MS = 2000;

export function render(main) {
  const state = el("p", { class: "muted", role: "status" }, "Loading…");
  const body = el("tbody");
  const pager = el("div", { class: "pager" });
  const col = (h) => el("th", { scope: "col" }, h);
  main.append(el("h1", {}, "Leases"), state,
    el("table", { "aria-label": "Leases" }, el("thead", {}, el("tr", {}, col("Lease"), col("TTL left"), col("Granted TTL"),
      col("Keys"), col(""))), body), pager);
  // The pages visited, by number (the top is shown).
  const visited = [0];
  let rows = [];
  const load = async () => {
    try {
      const all = ((await call("/v3/lease/leases")).leases || []).map((l) => l.ID).sort((a, b) => (BigInt(a) < BigInt(b) ? -1 : 1));
      const pages = Math.max(1, Math.ceil(all.length / PAGE));
      // Fewer leases than when the page was chosen: the last page there is.
      while (visited.length > 1 && visited[visited.length - 1] >= pages) visited.pop();
      const page = Math.min(visited[visited.length - 1], pages - 1);
      const shown = all.slice(page * PAGE, (page + 1) * PAGE);
      const answers = await Promise.all(shown.map((id) => call("/v3/lease/timetolive", { ID: id, keys: true }).catch(() => null)));
      rows = [];
      body.replaceChildren(...answers.filter(Boolean).map((l) => {
        const ttl = el("td", { class: "num" }, secs(l.TTL || 0));
        rows.push({ cell: ttl, left: Number(l.TTL || 0) });
        const keys = (l.keys || []).map(text);
        const allowed = keys.every((k) => may("write", k));
        return el("tr", { "data-lease": hex(l.ID) },
          el("th", { scope: "row" }, el("code", {}, hex(l.ID))), ttl, el("td", { class: "num" }, secs(l.grantedTTL || 0)),
          el("td", {}, keys.length ? keys.slice(0, 10).map((k) => el("div", {}, el("code", {}, k))) : el("span", { class: "muted" }, "none"),
            keys.length > 10 ? el("div", { class: "muted" }, `and ${keys.length - 10} more`) : null),
          el("td", {}, action("Revoke", allowed, `Revoke lease ${hex(l.ID)}? Its ${keys.length} keys are deleted.`,
            () => call("/v3/lease/revoke", { ID: l.ID }), load)));
      }));
      say(state, `${all.length} leases; page ${page + 1} of ${pages}. Live.`);
      pager.replaceChildren(...pagerButtons(visited, page + 1 < pages ? page + 1 : null, load));
    } catch (e) {
      say(state, e.message, true);
    }
  };
  load();
  const again = setInterval(load, EVERY_MS);
  const tick = setInterval(() => {
    for (const r of rows) {
      r.left = Math.max(-1, r.left - 1);
      r.cell.textContent = secs(r.left);
    }
  }, 1000);
  return () => { clearInterval(again); clearInterval(tick); };
}
