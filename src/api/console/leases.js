// The leases page: every lease with its TTL left, its granted TTL and its
// keys (those the visitor may read), 50 a page in ID order; live from
// `/ui/api/leases` (the member sends the page again every second: etcd has
// no watch on leases). Revoke, with a confirmation, for a visitor who may
// write every key on the lease.

import { el, stream, call, action, say, pagerButtons, secs } from "./app.js";

const PAGE = 50;

export function render(main) {
  const state = el("p", { class: "muted", role: "status" }, "Loading…");
  const body = el("tbody");
  const pager = el("div", { class: "pager" });
  const col = (h) => el("th", { scope: "col" }, h);
  main.append(el("h1", {}, "Leases"), state,
    el("table", { "aria-label": "Leases" }, el("thead", {}, el("tr", {}, col("Lease"), col("TTL left"), col("Granted TTL"),
      col("Keys"), col(""))), body), pager);
  // Where each page visited starts ("": the first lease); the top is shown.
  const visited = [""];
  let reading = null;
  const draw = (page) => {
    body.replaceChildren(...page.leases.map((l) => {
      const hidden = l.key_count - l.keys.length;
      return el("tr", { "data-lease": l.id },
        el("th", { scope: "row" }, el("code", {}, l.id)),
        el("td", { class: "num" }, l.ttl === null ? "?" : secs(l.ttl)),
        el("td", { class: "num" }, secs(l.granted_ttl)),
        el("td", {}, l.key_count ? l.keys.map((k) => el("div", {}, el("code", {}, k))) : el("span", { class: "muted" }, "none"),
          hidden > 0 ? el("div", { class: "muted" }, `and ${hidden} more`) : null),
        el("td", {}, action("Revoke", l.revocable, `Revoke lease ${l.id}? Its ${l.key_count} keys are deleted.`,
          () => call("/v3/lease/revoke", { ID: l.ID }))));
    }));
    if (!page.leases.length) body.replaceChildren(el("tr", {}, el("td", { colspan: 5, class: "muted" }, "No leases here.")));
    const first = (visited.length - 1) * PAGE;
    say(state, `${page.count} lease${page.count === 1 ? "" : "s"}${page.leases.length ? `; ${first + 1} to ${first + page.leases.length} shown` : ""}. `
      + `Live, ${new Date().toLocaleTimeString()}.`);
    pager.replaceChildren(...pagerButtons(visited, page.next, load));
  };
  // Read the page on top of `visited` until another is chosen.
  function load() {
    if (reading) reading.abort();
    const mine = new AbortController();
    reading = mine;
    const after = visited[visited.length - 1];
    const path = `/ui/api/leases?limit=${PAGE}` + (after ? `&after=${after}` : "");
    (async () => {
      while (!mine.signal.aborted) {
        try {
          await stream(path, null, draw, mine.signal, "GET");
        } catch (e) {
          if (mine.signal.aborted) return;
          say(state, e.message, true);
        }
        await new Promise((r) => setTimeout(r, 1000));
      }
    })();
  }
  load();
  return () => { if (reading) reading.abort(); };
}
