// raftlock's console: the router, the session (auth token, permissions),
// and the helpers every page uses to call the gateway's JSON API.
//
// Pages are modules with `render(main, params)`, which draws into `main`
// and returns a function that stops what the page started (streams,
// timers) when the visitor leaves it. Every request goes to the gateway
// (`/v3/...`, `/v1/locks/...`) of the member that served the console, with
// the visitor's token: the console can do nothing its visitor may not.
// Keys, names and values travel base64-encoded and 64-bit numbers as
// strings (protobuf's JSON mapping); pages decode them with `text` and
// compare numbers as BigInt.

const session = { authEnabled: false, user: "", token: "", root: false, perms: [] };

/// A DOM element: `el("td", {class: "num"}, "3")`.
export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

/// UTF-8 text to base64, and back (bytes that are not UTF-8 show escaped).
export function b64(text) {
  const bytes = new TextEncoder().encode(text);
  let s = "";
  for (const b of bytes) s += String.fromCharCode(b);
  return btoa(s);
}
export function text(base64) {
  if (!base64) return "";
  const s = atob(base64);
  const bytes = Uint8Array.from(s, (c) => c.charCodeAt(0));
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    return Array.from(bytes, (b) => (b >= 32 && b < 127 ? String.fromCharCode(b) : "\\x" + b.toString(16).padStart(2, "0"))).join("");
  }
}

/// The end of the range of every key that starts with `prefix` (etcd's prefix_end), base64.
export function prefixEnd(prefix) {
  const bytes = Array.from(new TextEncoder().encode(prefix));
  while (bytes.length && bytes[bytes.length - 1] === 0xff) bytes.pop();
  if (!bytes.length) return btoa("\0");
  bytes[bytes.length - 1] += 1;
  return btoa(String.fromCharCode(...bytes));
}

/// A lease ID as etcdctl prints it (16 hexadecimal digits); "" for none.
export function hex(id) {
  if (!id || String(id) === "0") return "";
  return BigInt(id).toString(16).padStart(16, "0");
}

function headers() {
  const h = { "Content-Type": "application/json" };
  if (session.token) h.Authorization = session.token;
  return h;
}

/// One unary call: its answer, or an Error with the server's message.
export async function call(path, body = {}) {
  const resp = await fetch(path, { method: "POST", headers: headers(), body: JSON.stringify(body) });
  let answer;
  try {
    answer = await resp.json();
  } catch {
    throw new Error(`${path}: HTTP ${resp.status}`);
  }
  if (answer.error !== undefined || !resp.ok) {
    const message = answer.message || answer.error || `HTTP ${resp.status}`;
    if (/token|user name is empty|authentication failed/i.test(message) && session.authEnabled) signOut(message);
    throw new Error(message);
  }
  return answer;
}

/// A streamed call (the gateway answers one JSON object a line): `onMessage`
/// for each `result` (or each line of `/ui/api/...`) until `signal` aborts
/// it or the stream ends. Resolves when it ends; rejects on its error.
export async function stream(path, body, onMessage, signal, method = "POST") {
  const init = { method, headers: headers(), signal };
  if (method === "POST") init.body = JSON.stringify(body);
  const resp = await fetch(path, init);
  if (!resp.ok) {
    let message = `HTTP ${resp.status}`;
    try { message = (await resp.json()).message || message; } catch {}
    throw new Error(message);
  }
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffered = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffered += value;
    let nl;
    while ((nl = buffered.indexOf("\n")) >= 0) {
      const line = buffered.slice(0, nl).trim();
      buffered = buffered.slice(nl + 1);
      if (!line) continue;
      const obj = JSON.parse(line);
      if (obj.error) throw new Error(obj.error.message || JSON.stringify(obj.error));
      // Lines read before the reader was called off are not its caller's.
      if (signal && signal.aborted) return;
      onMessage(obj.result !== undefined ? obj.result : obj);
    }
  }
}

/// Watch every key under `prefix` from now on; `onChange()` (debounced to
/// one call per 200 ms) on each event. Reconnects after an error.
export function watchPrefix(prefix, onChange, signal) {
  let timer = null;
  const changed = () => {
    if (timer) return;
    timer = setTimeout(() => { timer = null; onChange(); }, 200);
  };
  const request = { create_request: { key: b64(prefix) || btoa("\0"), range_end: prefix ? prefixEnd(prefix) : btoa("\0") } };
  (async () => {
    while (!signal.aborted) {
      try {
        await stream("/v3/watch", request, (r) => { if (r.events && r.events.length) changed(); }, signal);
      } catch (e) {
        if (signal.aborted) return;
      }
      await new Promise((r) => setTimeout(r, 1000));
    }
  })();
}

/// Show `message` in a page's status line, as an error or as news.
export function say(state, message, error = false) {
  state.textContent = message;
  state.className = error ? "error" : "muted";
}

/// Previous and Next buttons over `pages`, a stack of where each page
/// visited starts: Previous drops the top, Next (when there is a `next`
/// start) pushes it; either then calls `load`, which reads the top.
export function pagerButtons(pages, next, load) {
  const go = (step) => () => { step(); load(); };
  return [
    pages.length > 1 ? el("button", { type: "button", onclick: go(() => pages.pop()) }, "Previous page") : null,
    next !== null && next !== undefined && next !== ""
      ? el("button", { type: "button", onclick: go(() => pages.push(next)) }, "Next page") : null,
  ].filter(Boolean);
}

/// Ask before an action; resolves true if the visitor confirmed.
export function confirmAction(what) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = what;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.showModal();
    document.getElementById("confirm-ok").focus();
  });
}

/// An action button, shown only when `allowed`: asks first, runs `act`,
/// then `after()`; a failure is shown beside it.
export function action(label, allowed, question, act, after) {
  if (!allowed) return null;
  const status = el("span", { class: "error", role: "status" });
  const button = el("button", { class: "danger", type: "button", onclick: async () => {
    if (!(await confirmAction(question))) return;
    button.disabled = true;
    status.textContent = "";
    try {
      await act();
      if (after) after();
    } catch (e) {
      status.textContent = e.message;
    } finally {
      button.disabled = false;
    }
  } }, label);
  return el("span", {}, button, " ", status);
}

/// Whether the visitor may write `key` (or do admin work, with no key):
/// anyone while auth is off; root; or a role with write permission over it.
export function may(kind, key) {
  if (!session.authEnabled) return true;
  if (session.root) return true;
  if (kind === "admin") return false;
  const k = new TextEncoder().encode(key);
  return session.perms.some((p) => {
    const type = p.permType || "READ";
    if (type !== "WRITE" && type !== "READWRITE") return false;
    const from = Uint8Array.from(atob(p.key || ""), (c) => c.charCodeAt(0));
    const to = Uint8Array.from(atob(p.range_end || ""), (c) => c.charCodeAt(0));
    if (!to.length) return compare(k, from) === 0;
    if (to.length === 1 && to[0] === 0) return compare(k, from) >= 0;
    return compare(k, from) >= 0 && compare(k, to) < 0;
  });
}
function compare(a, b) {
  for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return a[i] - b[i];
  return a.length - b.length;
}

/// A duration in seconds, short.
export function secs(s) {
  s = Number(s);
  if (s < 0) return "gone";
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

/// Bytes, short.
export function size(n) {
  n = Number(n);
  if (n < 1024) return `${n} B`;
  if (n < 1 << 20) return `${(n / 1024).toFixed(1)} KiB`;
  if (n < 1 << 30) return `${(n / (1 << 20)).toFixed(1)} MiB`;
  return `${(n / (1 << 30)).toFixed(2)} GiB`;
}

// ---- the session ----

async function detectAuth() {
  try {
    const status = await call("/v3/auth/status");
    session.authEnabled = !!status.enabled;
  } catch {
    session.authEnabled = true;
  }
}

async function loadPermissions() {
  session.root = false;
  session.perms = [];
  const user = await call("/v3/auth/user/get", { name: session.user });
  for (const role of user.roles || []) {
    if (role === "root") session.root = true;
    const r = await call("/v3/auth/role/get", { role });
    session.perms.push(...(r.perm || []));
  }
}

function signOut(why) {
  session.token = "";
  session.user = "";
  sessionStorage.removeItem("raftlock-session");
  route(why);
}

function drawWho() {
  const who = document.getElementById("who");
  who.replaceChildren();
  if (!session.authEnabled) {
    who.append(el("span", { class: "muted" }, "auth off"));
    return;
  }
  if (session.user) {
    who.append(el("span", {}, "signed in as ", el("strong", {}, session.user), session.root ? " (root)" : ""),
      el("button", { type: "button", onclick: () => signOut("") }, "Sign out"));
  }
}

function login(main, why) {
  const user = el("input", { type: "text", id: "login-user", autocomplete: "username", required: true });
  const password = el("input", { type: "password", id: "login-password", autocomplete: "current-password" });
  const status = el("p", { class: "error", role: "alert" }, why || "");
  const form = el("form", { class: "login", onsubmit: async (ev) => {
    ev.preventDefault();
    status.textContent = "";
    try {
      const answer = await call("/v3/auth/authenticate", { name: user.value, password: password.value });
      session.token = answer.token;
      session.user = user.value;
      await loadPermissions();
      sessionStorage.setItem("raftlock-session", JSON.stringify({ user: session.user, token: session.token }));
      route();
    } catch (e) {
      status.textContent = e.message;
    }
  } },
  el("h1", {}, "Sign in"),
  el("p", {}, "Auth is on in this cluster: sign in as a raftlock user."),
  el("div", {}, el("label", { for: "login-user" }, "User"), user),
  el("div", {}, el("label", { for: "login-password" }, "Password"), password),
  status,
  el("button", { type: "submit", id: "login-submit" }, "Sign in"));
  main.replaceChildren(form);
  user.focus();
}

// ---- the router ----

const pages = {
  cluster: () => import("./cluster.js").then((m) => m.render),
  locks: () => import("./locks.js").then((m) => m.renderList),
  lock: () => import("./locks.js").then((m) => m.renderLock),
  elections: () => import("./locks.js").then((m) => m.renderElections),
  leases: () => import("./leases.js").then((m) => m.render),
  keys: () => import("./keys.js").then((m) => m.renderList),
  key: () => import("./keys.js").then((m) => m.renderKey),
};
let leave = null;

/// `#/page/arg?x=y` as ("page", {arg, x: y}).
function parse(hash) {
  const [path, query] = (hash.replace(/^#\/?/, "") || "cluster").split("?");
  const [page, ...rest] = path.split("/");
  const params = Object.fromEntries(new URLSearchParams(query || ""));
  if (rest.length) params.arg = decodeURIComponent(rest.join("/"));
  return [page in pages ? page : "cluster", params];
}

async function route(why) {
  if (leave) { leave(); leave = null; }
  const main = document.getElementById("page");
  drawWho();
  if (session.authEnabled && !session.token) {
    login(main, why);
    return;
  }
  const [page, params] = parse(location.hash);
  for (const a of document.querySelectorAll("nav a")) {
    const current = a.dataset.page === page || (page === "lock" && a.dataset.page === "locks") || (page === "key" && a.dataset.page === "keys");
    if (current) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  const render = await pages[page]();
  main.replaceChildren();
  leave = render(main, params) || null;
}

async function start() {
  await detectAuth();
  const saved = JSON.parse(sessionStorage.getItem("raftlock-session") || "null");
  if (session.authEnabled && saved) {
    session.user = saved.user;
    session.token = saved.token;
    try {
      await loadPermissions();
    } catch {
      session.user = "";
      session.token = "";
    }
  }
  window.addEventListener("hashchange", () => route());
  await route();
}

start();
