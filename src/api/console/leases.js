// The leases page: every lease with its TTL left, its granted TTL and its
// keys (those the visitor may read), 50 a page in ID order; live from
// `/ui/api/leases` (the member sends the page again every second: etcd has
// no watch on leases). Revoke, with a confirmation, for a visitor who may
// write every key on the lease.

import { el, stream, call, action, say, pagerButtons, secs } from "./app.js";

const PAGE = 50;

export function render(main) {
  const state = el("p", { class: "muted", role: "status" }, "Loading…");
  // What a revocation answered, kept while the rows are drawn anew.
  const notice = el("p", { class: "muted", role: "alert" });
  const body = el("tbody");
  const pager = el("div", { class: "pager" });
  const col = (h) => el("th", { scope: "col" }, h);
  main.append(el("h1", {}, "Leases"), state, notice,
    el("table", { "aria-label": "Leases" }, el("thead", {}, el("tr", {}, col("Lease"), col("TTL left"), col("Granted TTL"),
      col("Keys"), col(""))), body), pager);
  // Where each page visited starts ("": the first lease); the top is shown.
  const visited = [""];
  let reading = null;
  const revoke = (l) => async () => {
    try {
      await call("/v3/lease/revoke", { ID: l.ID });
      say(notice, "");
    } catch (e) {
      say(notice, `Lease ${l.id} was not revoked: ${e.message}`, true);
      throw e;
    }
  };
  const draw = (page) => {
    // A later page that emptied: back to the one before.
    if (!page.leases.length && visited.length > 1) {
      visited.pop();
      load();
      return;
    }
    body.replaceChildren(...page.leases.map((l) => {
      // What the lease holds is told only to who may read all of it.
      const told = l.keys !== null;
      const more = told ? l.key_count - l.keys.length : 0;
      const keys = !told ? el("span", { class: "muted" }, "not yours to read")
        : l.key_count ? l.keys.map((k) => el("div", {}, el("code", {}, k))) : el("span", { class: "muted" }, "none");
      return el("tr", { "data-lease": l.id },
        el("th", { scope: "row" }, el("code", {}, l.id)),
        el("td", { class: "num" }, l.ttl === null ? "–" : secs(l.ttl)),
        el("td", { class: "num" }, l.granted_ttl === null ? "–" : secs(l.granted_ttl)),
        el("td", {}, keys, more > 0 ? el("div", { class: "muted" }, `and ${more} more`) : null),
        el("td", {}, action("Revoke", l.revocable,
          `Revoke lease ${l.id}? ${told ? `Its ${l.key_count} keys are deleted.` : "Every key on it is deleted."}`, revoke(l))));
    }));
    if (!page.leases.length) body.replaceChildren(el("tr", {}, el("td", { colspan: 5, class: "muted" }, "No leases.")));
    say(state, `${page.count} lease${page.count === 1 ? "" : "s"} in all; page ${visited.length}. `
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
