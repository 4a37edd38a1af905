// The keys pages. The browser: keys under a prefix, 100 at a time, with
// their revisions, version, lease and value, redrawn when one changes (a
// watch). A key's page: its value now and its earlier versions, each read
// at the revision before the next one was written, back to its creation
// or to the compacted revision.

import { el, call, watchPrefix, say, pagerButtons, b64, text, prefixEnd, hex } from "./app.js";

const PAGE = 100;
const VERSIONS = 20;

export function renderList(main, params) {
  const abort = new AbortController();
  const prefix = params.prefix || "";
  const starts = [params.from ? b64(params.from) : b64(prefix) || btoa("\0")];
  const input = el("input", { type: "search", id: "key-prefix", value: prefix, placeholder: "every key" });
  const form = el("form", { class: "inline", role: "search", onsubmit: (ev) => {
    ev.preventDefault();
    location.hash = `#/keys?prefix=${encodeURIComponent(input.value)}`;
  } }, el("label", { for: "key-prefix" }, "Keys starting with"), input, el("button", { type: "submit" }, "Show"));
  const state = el("p", { class: "muted", role: "status" }, "Loading…");
  const body = el("tbody");
  const pager = el("div", { class: "pager" });
  const col = (h, c) => el("th", { scope: "col", class: c }, h);
  main.append(el("h1", {}, "Keys"), form, state,
    el("table", { "aria-label": "Keys" }, el("thead", {}, el("tr", {}, col("Key"), col("Value"), col("Created", "num"),
      col("Modified", "num"), col("Version", "num"), col("Lease"))), body), pager);
  const load = async () => {
    try {
      const answer = await call("/v3/kv/range", {
        key: starts[starts.length - 1], range_end: prefix ? prefixEnd(prefix) : btoa("\0"), limit: PAGE,
      });
      const kvs = answer.kvs || [];
      body.replaceChildren(...kvs.map((kv) => {
        const key = text(kv.key);
        const value = text(kv.value);
        return el("tr", { "data-key": key },
          el("th", { scope: "row" }, el("a", { href: `#/key/${encodeURIComponent(key)}` }, el("code", {}, key))),
          el("td", {}, el("code", {}, value.length > 80 ? value.slice(0, 80) + "…" : value)),
          el("td", { class: "num" }, kv.create_revision), el("td", { class: "num" }, kv.mod_revision),
          el("td", { class: "num" }, kv.version), el("td", {}, kv.lease ? el("code", {}, hex(kv.lease)) : ""));
      }));
      say(state, `${answer.count || 0} keys in all; page ${starts.length}, at revision ${answer.header.revision}. Live.`);
      // The next page starts just after the last key shown.
      const next = answer.more ? b64(text(kvs[kvs.length - 1].key) + "\0") : null;
      pager.replaceChildren(...pagerButtons(starts, next, load));
    } catch (e) {
      say(state, e.message, true);
    }
  };
  load();
  watchPrefix(prefix, load, abort.signal);
  return () => abort.abort();
}

export function renderKey(main, params) {
  const abort = new AbortController();
  const key = params.arg || "";
  const state = el("p", { class: "muted", role: "status" }, "Loading…");
  const body = el("tbody");
  const col = (h, c) => el("th", { scope: "col", class: c }, h);
  main.append(el("h1", {}, "Key ", el("code", {}, key)), el("p", {}, el("a", { href: "#/keys" }, "All keys")), state,
    el("h2", {}, "Versions, newest first"),
    el("table", { "aria-label": "Versions" }, el("thead", {}, el("tr", {}, col("Version", "num"), col("Written at", "num"),
      col("Lease"), col("Value"))), body));
  const load = async () => {
    const rows = [];
    let note = "";
    try {
      let at = 0;
      for (let i = 0; i < VERSIONS; i++) {
        const answer = await call("/v3/kv/range", at ? { key: b64(key), revision: at } : { key: b64(key) });
        const kv = (answer.kvs || [])[0];
        if (!kv) {
          if (i === 0) note = "The key does not exist now.";
          break;
        }
        rows.push(el("tr", {}, el("td", { class: "num" }, kv.version), el("td", { class: "num" }, kv.mod_revision),
          el("td", {}, kv.lease ? el("code", {}, hex(kv.lease)) : ""), el("td", {}, el("code", {}, text(kv.value)))));
        if (Number(kv.version) <= 1) break;
        at = (BigInt(kv.mod_revision) - 1n).toString();
      }
    } catch (e) {
      note = /compacted/.test(e.message) ? "Older versions were compacted away." : e.message;
    }
    body.replaceChildren(...rows);
    say(state, note || "Live.", note && !/compacted/.test(note) && rows.length === 0);
  };
  load();
  watchPrefix(key, load, abort.signal);
  return () => abort.abort();
}
