// The locks pages. The list: every lock under a prefix, a page at a time
// (`/v1/locks/list`, never the whole list at once), with its holders and
// how many wait, redrawn when a key under the prefix changes (a watch). A
// lock's page: its holders with their lease's TTL counting down, its
// waiters in queue order, its lock-delay, and its events as they happen
// (`/v1/locks/observe`), from 10,000 revisions back. The elections page lists the same queues as
// elections: the leader's key, lease and value.

import { el, call, stream, watchPrefix, action, may, say, pagerButtons, b64, text, hex, secs } from "./app.js";

const PAGE = 50;
/// How many revisions back a lock's page shows its events from.
const HISTORY = 10000;
// Waiters on a page of a lock's page.
const WAITERS = 100;

/// The list pages (locks, or elections with `elections`).
function listPage(main, params, elections) {
  const abort = new AbortController();
  const prefix = params.prefix || "";
  const pages = [params.page || ""];
  const input = el("input", { type: "search", id: "prefix", value: prefix, placeholder: "all names" });
  const form = el("form", { class: "inline", role: "search", onsubmit: (ev) => {
    ev.preventDefault();
    location.hash = `#/${elections ? "elections" : "locks"}?prefix=${encodeURIComponent(input.value)}`;
  } }, el("label", { for: "prefix" }, "Names starting with"), input, el("button", { type: "submit" }, "Show"));
  const state = el("p", { class: "muted", role: "status" }, "Loading…");
  const body = el("tbody");
  const pager = el("div", { class: "pager" });
  const head = elections
    ? ["Election", "Leader key", "Lease", "Value", "Candidates waiting"]
    : ["Lock", "Holders (key, token, lease, mode, metadata)", "Waiting"];
  main.append(el("h1", {}, elections ? "Elections" : "Locks"), form, state,
    el("table", { "aria-label": elections ? "Elections" : "Locks" },
      el("thead", {}, el("tr", {}, head.map((h) => el("th", { scope: "col" }, h)))), body),
    pager);
  const load = async () => {
    const page = pages[pages.length - 1];
    try {
      const answer = await call("/v1/locks/list", { prefix: b64(prefix), limit: PAGE, page: page || undefined });
      const locks = answer.locks || [];
      body.replaceChildren(...locks.map((l) => (elections ? electionRow(l) : lockRow(l))));
      say(state, locks.length ? `${locks.length} on this page (page ${pages.length}), live.` : "None.");
      pager.replaceChildren(...pagerButtons(pages, answer.next_page, load));
    } catch (e) {
      say(state, e.message, true);
    }
  };
  load();
  watchPrefix(prefix, load, abort.signal);
  return () => abort.abort();
}

function lockLink(name) {
  return el("a", { href: `#/lock/${encodeURIComponent(name)}` }, name || "(empty name)");
}

function lockRow(l) {
  const name = text(l.name);
  // List tells no TTLs or hold counts (Describe does: the lock's page).
  const holders = (l.holders || []).map((h) => {
    const metadata = text(h.metadata);
    return el("div", {}, el("code", {}, text(h.key)), " token ", el("strong", {}, h.token), " lease ", el("code", {}, hex(h.lease)),
      h.mode === "READ" ? " (read)" : "", metadata ? [", ", el("code", {}, metadata)] : "");
  });
  return el("tr", { "data-lock": name },
    el("th", { scope: "row" }, lockLink(name)),
    el("td", {}, holders.length ? holders : el("span", { class: "muted" }, "none")),
    el("td", { class: "num" }, l.waiters || 0));
}

function electionRow(l) {
  const name = text(l.name);
  const leader = (l.holders || [])[0];
  return el("tr", { "data-election": name },
    el("th", { scope: "row" }, lockLink(name)),
    el("td", {}, leader ? el("code", {}, text(leader.key)) : el("span", { class: "muted" }, "no leader")),
    el("td", {}, leader ? el("code", {}, hex(leader.lease)) : ""),
    el("td", {}, leader ? el("code", {}, text(leader.metadata)) : ""),
    el("td", { class: "num" }, l.waiters || 0));
}

export function renderList(main, params) {
  return listPage(main, params, false);
}

export function renderElections(main, params) {
  return listPage(main, params, true);
}

const EVENT_NAMES = {
  HOLDING: "holding", WAITING: "waiting", QUEUED: "queued", GRANTED: "granted", RELEASED: "released",
  LEASE_ENDED: "lease ended", ENDED: "ended", DELAY_STARTED: "lock-delay started", DELAY_ENDED: "lock-delay ended",
};

/// One lock: holders, waiters in queue order, lock-delay, events.
export function renderLock(main, params) {
  const abort = new AbortController();
  const name = params.arg || "";
  const state = el("p", { class: "muted", role: "status" }, "Loading…");
  const holders = el("tbody");
  const waiters = el("tbody");
  const delay = el("p");
  const events = el("tbody");
  const more = el("p", { class: "muted" });
  const waiterPager = el("div", { class: "pager" });
  // Where each page of waiters visited starts (null: at the first waiter;
  // else after a waiter's token and key, as Describe continues); the top
  // is shown.
  const waiterPages = [null];
  const since = el("p", { class: "muted" });
  const col = (h) => el("th", { scope: "col" }, h);
  const ownerHead = () => el("thead", {}, el("tr", {}, col("Key"), col("Token"), col("Lease"), col("TTL"), col("Mode"),
    col("Holds"), col("Metadata"), col("")));
  main.append(el("h1", {}, "Lock ", el("code", {}, name)), el("p", {}, el("a", { href: "#/locks" }, "All locks")), state,
    el("h2", {}, "Holders"), el("table", { "aria-label": "Holders" }, ownerHead(), holders),
    delay,
    el("h2", {}, "Waiting, in queue order"), el("table", { "aria-label": "Waiters" }, ownerHead(), waiters), more, waiterPager,
    el("h2", {}, "Events"), since,
    el("div", { class: "events" }, el("table", { "aria-label": "Events" },
      el("thead", {}, el("tr", {}, col("Revision"), col("Event"), col("Key"), col("Token"), col("Lease"), col("Position"))),
      events)));
  // TTLs count down between answers.
  const ttls = [];
  const describe = async () => {
    try {
      const from = waiterPages[waiterPages.length - 1];
      const d = await call("/v1/locks/describe", from
        ? { name: b64(name), limit: WAITERS, waiters_after: from.token, waiters_after_key: from.key }
        : { name: b64(name), limit: WAITERS });
      ttls.length = 0;
      holders.replaceChildren(...(d.holders || []).map((o) => ownerRow(o, true, describe, ttls)));
      if (!(d.holders || []).length) holders.replaceChildren(el("tr", {}, el("td", { colspan: 8, class: "muted" }, "Nobody holds it.")));
      waiters.replaceChildren(...(d.waiters || []).map((o) => ownerRow(o, false, describe, ttls)));
      if (!(d.waiters || []).length) waiters.replaceChildren(el("tr", {}, el("td", { colspan: 8, class: "muted" }, "Nobody waits.")));
      const shown = d.waiters || [];
      const last = shown[shown.length - 1];
      more.textContent = (from ? `Waiting after token ${from.token}. ` : "") + (d.more ? "More wait after these." : "");
      waiterPager.replaceChildren(...pagerButtons(waiterPages, d.more && last ? { token: last.token, key: last.key } : null,
        describe));
      const ld = d.lock_delay;
      delay.replaceChildren(ld ? el("span", { class: "error" }, `In a lock-delay of ${ld.delay_ms || 0} ms since revision ${ld.revision}: `
        + `about ${Math.ceil((ld.remaining_ms || 0) / 1000)} s left.`) : "");
      say(state, `Live as of revision ${d.header ? d.header.revision : "?"}.`);
    } catch (e) {
      say(state, e.message, true);
    }
  };
  const tick = setInterval(() => {
    for (const t of ttls) {
      t.left = Math.max(-1, t.left - 1);
      t.cell.textContent = secs(t.left);
    }
  }, 1000);
  describe();
  // The events of the last HISTORY revisions first (replayed from the
  // store's history), then live; after a broken stream, from the revision
  // after the last one shown. A history compacted away: from now on.
  let from = null;
  (async () => {
    while (!abort.signal.aborted) {
      try {
        if (from === null) {
          const now = await call("/v1/locks/describe", { name: b64(name), limit: 1 });
          from = Math.max(1, Number(now.header.revision) - HISTORY);
          since.textContent = `Since revision ${from}, newest first.`;
        }
        await stream("/v1/locks/observe", { name: b64(name), start_revision: String(from) }, (r) => {
          for (const e of r.events || []) {
            if (from > 0) from = Math.max(from, Number(e.revision || 0) + 1);
            const o = e.owner || {};
            events.prepend(el("tr", {},
              el("td", { class: "num" }, e.revision || "0"), el("td", {}, EVENT_NAMES[e.kind || "HOLDING"] || e.kind),
              el("td", {}, el("code", {}, text(o.key))), el("td", { class: "num" }, o.token || ""),
              el("td", {}, el("code", {}, hex(o.lease))), el("td", { class: "num" }, e.kind === "WAITING" || e.kind === "QUEUED" ? e.position || "0" : "")));
          }
          while (events.children.length > 200) events.lastChild.remove();
          describe();
        }, abort.signal);
      } catch (e) {
        if (abort.signal.aborted) return;
        if (/compact|out of range/i.test(e.message)) {
          from = 0;
          since.textContent = "From now on (the history before is compacted), newest first.";
        }
      }
      await new Promise((r) => setTimeout(r, 1000));
    }
  })();
  return () => { abort.abort(); clearInterval(tick); };
}

function ownerRow(o, holding, after, ttls) {
  const key = text(o.key);
  const ttl = el("td", { class: "num" }, secs(o.ttl || 0));
  ttls.push({ cell: ttl, left: Number(o.ttl || 0) });
  const release = holding
    ? action("Release", may("write", key), `Release the grant ${key} (token ${o.token})? Its holder loses the lock.`,
        () => call("/v1/locks/release", { key: o.key, token: o.token }), after)
    : null;
  const revoke = action("Revoke lease", may("write", key), `Revoke lease ${hex(o.lease)}? Every key on it is deleted.`,
    () => call("/v3/lease/revoke", { ID: o.lease }), after);
  return el("tr", { "data-key": key },
    el("td", {}, el("code", {}, key)), el("td", { class: "num" }, o.token || ""), el("td", {}, el("code", {}, hex(o.lease))),
    ttl, el("td", {}, o.mode === "READ" ? "read" : "write"), el("td", { class: "num" }, o.holds || 1),
    el("td", {}, el("code", {}, text(o.metadata))), el("td", {}, release, revoke));
}
