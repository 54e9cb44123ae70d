// runnerctl page: polls /api/host, /api/fleet, /api/queue and /api/history (with the
// filters applied) 2 s after the last poll ended; toggles POST /api/toggles with the CSRF token.
"use strict";
let session = null;
let historyQuery = "";
let pollError = false;  // the message shows a failed poll: the next good one clears it
let shownAt = null;     // when the data on the page was read
const POLL_MS = 2000, POLL_TIMEOUT_MS = 15000;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "text") node.textContent = value; else node.setAttribute(key, value);
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

function ago(seconds) {
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

const FIELD_HINTS = { target: "the target is gpu:N, slot:KEY (e.g. slot:gpu0-3) or host",
                      since: "since is a date, YYYY-MM-DD, or a date and time, YYYY-MM-DDTHH:MM" };

async function call(method, url, body) {
  const headers = { "Accept": "application/json" };
  if (method !== "GET") headers["X-CSRF-Token"] = session ? session.csrf : "";
  if (body) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(url, { method, headers, body: body ? JSON.stringify(body) : undefined,
                                  credentials: "same-origin", signal: AbortSignal.timeout(POLL_TIMEOUT_MS) });
  } catch (error) {  // no answer: the controller is down, restarting or unreachable
    throw Object.assign(new Error("cannot reach the controller"), { status: 0 });
  }
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    const first = Array.isArray(data.detail) && data.detail[0];  // FastAPI's 422: the failing field
    const field = first ? String(first.loc[first.loc.length - 1]) : "";
    const text = typeof data.detail === "string" ? data.detail
      : first ? (FIELD_HINTS[field] || `${field}: ${first.msg}`) : `HTTP ${response.status}`;
    throw Object.assign(new Error(response.status === 503 ? `the controller is busy (${text}); retrying` : text),
                        { status: response.status });
  }
  return data;
}

function say(text, error) {
  const box = document.getElementById("message");
  if (box.textContent !== text) box.textContent = text;  // a live region: said again only when it changes
  box.className = error ? "error" : "";
}

function offsetOf(d) {
  // the date's UTC offset as +HH:MM, as the history filter takes it
  const offset = -d.getTimezoneOffset(), abs = Math.abs(offset), pad = (n) => String(n).padStart(2, "0");
  return `${offset < 0 ? "-" : "+"}${pad(Math.floor(abs / 60))}:${pad(abs % 60)}`;
}

function when(seconds) {
  // local time with its offset (YYYY-MM-DD HH:MM:SS +HH:MM)
  const d = new Date(seconds * 1000), pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:` +
         `${pad(d.getMinutes())}:${pad(d.getSeconds())} ${offsetOf(d)}`;
}

async function loadSession() {
  session = await call("GET", "api/session");
  document.getElementById("user-name").textContent = session.user ? `${session.user} (${session.role})` : "";
  document.getElementById("signin").hidden = Boolean(session.user);
  document.getElementById("signout").hidden = !session.user;
  document.getElementById("gitlab-signin").hidden = Boolean(session.user) || !session.gitlab_signin;
  document.getElementById("toggle-panel").hidden = !session.can_toggle;
}

function gpuCard(gpu) {
  const card = el("div", { class: "gpu", "data-gpu": String(gpu.index), "data-state": gpu.state },
    el("h3", {}, el("span", { text: `GPU ${gpu.index}` }), el("span", { class: "state", text: gpu.state })));
  const detail = el("div", { class: "detail" });
  for (const job of gpu.jobs) {
    const label = `job ${job.job_id}` + (job.user ? ` by ${job.user}` : "") + `, ${ago(job.runtime_s)}`;
    detail.append(job.url ? el("a", { href: job.url, text: label }) : el("span", { text: label }), " ");
    if (job.unused) detail.append(el("span", { class: "badge unused", text: "requested but unused",
      title: "holds its GPUs at near-zero utilization" }), " ");
  }
  for (const proc of gpu.processes) {
    detail.append(el("div", { class: "process",
      text: `${proc.user || "unknown user"}: ${proc.command || "pid " + proc.pid}` +
            (proc.memory_mib !== null ? `, ${proc.memory_mib} MiB` : "") }));
  }
  if (gpu.detail && !gpu.jobs.length && !gpu.processes.length) detail.append(el("div", { text: gpu.detail }));
  card.append(detail);
  const util = gpu.utilization === null ? null : Math.round(gpu.utilization * 100);
  const bar = el("div", { class: "bar" }, el("div"));
  bar.firstChild.style.width = `${util || 0}%`;
  card.append(bar, el("div", { class: "numbers", text:
    `util ${util === null ? "?" : util + " %"} · memory ${gpu.memory_used_mib ?? "?"} / ${gpu.memory_total_mib ?? "?"} MiB` }));
  if (session && session.can_toggle) {
    const buttons = el("div", { class: "buttons" });
    for (const action of gpu.toggle ? ["resume"] : ["drain", "pause"]) {
      const button = el("button", { type: "button", class: "toggle", "data-action": action,
                                    "data-target": `gpu:${gpu.index}`, text: action,
                                    "aria-label": `${action} GPU ${gpu.index}` });
      button.addEventListener("click", () => prefill(action, `gpu:${gpu.index}`));
      buttons.append(button);
    }
    card.append(buttons);
  }
  return card;
}

function reasonRule() {
  // pause and drain need a reason; resume does not (docs/web.md)
  const resume = document.getElementById("toggle-action").value === "resume";
  const reason = document.getElementById("toggle-reason");
  reason.required = !resume;
  reason.placeholder = resume ? "reason (optional)" : "reason (required)";
}

function prefill(action, target) {
  document.getElementById("toggle-action").value = action;
  document.getElementById("toggle-target").value = target;
  reasonRule();
  document.getElementById("toggle-reason").focus();
  say(action === "resume" ? `resume ${target}: Apply (a reason is optional)`
                          : `${action} ${target}: give a reason, then Apply`);
}

function rows(id, items, cells, key) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren(...items.map((item) => el("tr", key ? { "data-key": key(item) } : {},
                                                 ...cells(item).map((c) => el("td", {}, c)))));
}

// The polls rebuild the cards and tables: the element that had the keyboard focus is found
// again in the new ones (by its row or card and what it is), so Tab and Enter keep working.
function focusedKey() {
  const node = document.activeElement;
  const holder = node && node !== document.body && node.closest("[data-key], [data-gpu], [data-host]");
  if (!holder) return null;
  const scope = holder.closest("[id]");
  return { scope: scope ? scope.id : "", key: holder.dataset.key ?? "", gpu: holder.dataset.gpu ?? "",
           host: holder.dataset.host ?? "", tag: node.tagName, action: node.dataset.action ?? "",
           href: node.getAttribute("href") ?? "" };
}

function refocus(found) {
  if (!found || (document.activeElement && document.activeElement !== document.body)) return;
  const scope = document.getElementById(found.scope);
  if (!scope) return;
  const holders = [...scope.querySelectorAll("[data-key], [data-gpu], [data-host]")].filter((h) =>
    (h.dataset.key ?? "") === found.key && (h.dataset.gpu ?? "") === found.gpu && (h.dataset.host ?? "") === found.host);
  for (const holder of holders) {
    const match = [...holder.querySelectorAll(found.tag)].find((n) =>
      (n.dataset.action ?? "") === found.action && (n.getAttribute("href") ?? "") === found.href);
    if (match) { match.focus(); return; }
  }
}

function selecting() {
  const selection = window.getSelection();
  return Boolean(selection && !selection.isCollapsed && selection.toString());
}

function render(host) {
  document.getElementById("host").textContent = host.host;
  document.getElementById("gpus").replaceChildren(...host.gpus.map(gpuCard));
  document.getElementById("activity").replaceChildren(...host.activity.map((line) => el("li", { text: line })));
  document.getElementById("gitlab-error").textContent = host.gitlab_error ? `GitLab: ${host.gitlab_error}` : "";
  rows("slots", host.slots, (s) => [s.key, s.gpus.join(","), s.state, s.running_jobs.join(", ") || "-", s.reason],
       (s) => s.key);
  rows("events", host.events, (e) => [when(e.at), e.kind, e.subject, e.detail],
       (e) => `${e.kind} ${e.subject}`);
}

const REASONS = { starting: "starting", draining: "draining for it", priority: "behind a higher priority",
                  resources: "resources", foreign: "foreign use", held: "held by an admin",
                  pinned: "pinned to another host" };

function tile(host, gpu) {
  const who = gpu.jobs.map((j) => `job ${j.job_id}` + (j.user ? ` by ${j.user}` : ""))
    .concat(gpu.processes.map((p) => p.user || `pid ${p.pid}`)).join(", ") || gpu.detail;
  const util = gpu.utilization === null ? "?" : `${Math.round(gpu.utilization * 100)} %`;
  return el("div", { class: "tile", "data-host": host, "data-gpu": String(gpu.index), "data-state": gpu.state,
                     title: [`GPU ${gpu.index}: ${gpu.state}`, who, gpu.detail].filter(Boolean).join(" · ") },
    el("div", { class: "tile-head" }, el("b", { text: String(gpu.index) }), el("span", { text: gpu.state })),
    el("div", { class: "tile-who", text: who || "\u00a0" }), el("div", { class: "numbers", text: `util ${util}` }));
}

function renderFleet(hosts) {
  document.getElementById("fleet").replaceChildren(...hosts.map((h) => {
    const age = h.age_s === null ? "never ticked" : `last good tick ${ago(h.age_s)} ago`;
    const notes = h.toggles.map((t) => `${t.target} ${t.action} by ${t.who}: ${t.why}`);
    if (h.gitlab_error) notes.push(`GitLab: ${h.gitlab_error}`);
    return el("div", { class: "host", "data-host": h.host, "data-state": h.state },
      el("h3", {}, el("span", { text: h.host }), el("span", { class: "state", text: h.state }),
         el("span", { class: "age", text: age })),
      notes.length ? el("div", { class: "notes", text: notes.join("; ") }) : null,
      el("div", { class: "tiles" }, ...h.gpus.map((g) => tile(h.host, g))));
  }));
}

function renderQueue(queue) {
  rows("queue", queue, (j) => [String(j.position),
    j.url ? el("a", { href: j.url, text: String(j.job_id) }) : String(j.job_id), String(j.gpus),
    j.user || "?", ago(j.waiting_s), el("span", { class: "reason", text: REASONS[j.reason] || j.reason }),
    `${j.host}: ${j.detail}`], (j) => String(j.job_id));
  for (const [i, row] of document.querySelectorAll("#queue tbody tr").entries()) {
    row.dataset.reason = queue[i].reason;
  }
  document.getElementById("queue-empty").hidden = queue.length > 0;
}

function renderHistory(jobs) {
  document.getElementById("history-empty").hidden = jobs.length > 0;
  const now = Date.now() / 1000;
  rows("history", jobs, (j) => {
    const job = j.url ? el("a", { href: j.url, text: String(j.job_id) }) : el("span", { text: String(j.job_id) });
    const cell = el("span", {}, job, j.name ? ` ${j.name}` : "");
    if (j.unused) cell.append(" ", el("span", { class: "badge unused", text: "requested but unused" }));
    return [when(j.started_at), cell, j.user || "?", j.project || "?", j.host,
      j.gpus.join(","), j.wait_s === null ? "?" : ago(j.wait_s), ago((j.ended_at ?? now) - j.started_at),
      j.outcome, j.gpu_hours.toFixed(2),
      j.mean_utilization === null ? "?" : `${Math.round(j.mean_utilization * 100)} %`];
  }, (j) => `${j.host}:${j.job_id}`);
}

function filterHistory() {
  const params = new URLSearchParams({ limit: "50" });
  for (const name of ["user", "project", "host", "since"]) {
    let value = document.getElementById(`history-${name}`).value.trim();
    // a date or time as typed is this browser's local time, as the table shows it
    if (name === "since" && /^\d{4}-\d{2}-\d{2}$/.test(value)) value += "T00:00";
    if (name === "since" && /^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2})?$/.test(value)) {
      value += offsetOf(new Date(value.replace(" ", "T")));  // that day's offset (summer time)
    }
    if (value) params.set(name, value);
  }
  historyQuery = params.toString();
}

function clearData() {
  // what the page may no longer show (signed out of a private page): not left standing, stale
  for (const id of ["gpus", "fleet", "activity"]) document.getElementById(id).replaceChildren();
  for (const id of ["queue", "history", "slots", "events"]) document.querySelector(`#${id} tbody`).replaceChildren();
}

async function sessionEnded(error) {
  // 401 or 403: the session ended (it expired, or an admin ended it) or never was
  if (error.status !== 401 && error.status !== 403) return false;
  const before = session && session.user;
  await loadSession().catch(() => {});
  if (!session || !session.user) {
    if (error.status === 401) clearData();
    say(before ? "your session ended: sign in again" : error.message, true);
    if (before) document.getElementById("signin-name").focus();
    return true;
  }
  return false;
}

async function refresh() {
  try {
    if (!historyQuery) filterHistory();
    const [host, fleet, queue, history] = await Promise.all(
      [call("GET", "api/host"), call("GET", "api/fleet"), call("GET", "api/queue"),
       call("GET", `api/history?${historyQuery}`).catch((error) => error)]);
    if (selecting()) return;  // a selection in the page is not wiped out: the next poll draws it
    const focused = focusedKey();
    render(host);
    renderFleet(fleet);
    renderQueue(queue);
    if (history instanceof Error) {
      document.querySelector("#history tbody").replaceChildren();  // not old rows under the error
      say(`history: ${history.message}`, true);
      pollError = true;
    } else {
      renderHistory(history);
      if (pollError) say("");
      pollError = false;
    }
    refocus(focused);
    shownAt = new Date();
  } catch (error) {
    if (await sessionEnded(error)) return;
    const stale = shownAt ? ` (the page shows what it read at ${shownAt.toLocaleTimeString()})` : "";
    say(`${error.message}${stale}${error.status === 0 ? "; retrying" : ""}`, true);
    pollError = true;
  }
}

async function poll() {
  // the next poll starts after this one ended: a slow controller never has polls piling up
  await refresh();
  setTimeout(poll, POLL_MS);
}

document.addEventListener("DOMContentLoaded", async () => {
  document.getElementById("signin").addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      await call("POST", "api/session", { name: document.getElementById("signin-name").value,
                                           password: document.getElementById("signin-password").value });
      document.getElementById("signin-password").value = "";
      await loadSession();
      say("signed in");
      document.getElementById("signout").focus();  // the form it was in is hidden now
      await refresh();
    } catch (error) { say(error.message, true); }
  });
  document.getElementById("signout").addEventListener("click", async () => {
    try {
      await call("POST", "api/session/end"); await loadSession(); await refresh(); say("signed out");
      document.getElementById("signin-name").focus();
    } catch (error) { say(error.message, true); }
  });
  document.getElementById("toggle-action").addEventListener("change", reasonRule);
  document.getElementById("history-filter").addEventListener("submit", async (event) => {
    event.preventDefault();
    filterHistory();
    say("");
    await refresh();
  });
  document.getElementById("toggle-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const result = await call("POST", "api/toggles", {
        action: document.getElementById("toggle-action").value,
        target: document.getElementById("toggle-target").value.trim(),
        reason: document.getElementById("toggle-reason").value });
      document.getElementById("toggle-reason").value = "";
      say(result.message);
      await refresh();
    } catch (error) { if (!(await sessionEnded(error))) say(error.message, true); }
  });
  reasonRule();
  try { await loadSession(); } catch (error) { say(error.message, true); }
  await poll();
});
