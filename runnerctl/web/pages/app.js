// runnerctl page: polls /api/host, /api/fleet, /api/queue and /api/history (with the
// filters applied) every 2 s; toggles POST /api/toggles with the CSRF token.
"use strict";
let session = null;
let historyQuery = "";

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

async function call(method, url, body) {
  const headers = { "Accept": "application/json" };
  if (method !== "GET") headers["X-CSRF-Token"] = session ? session.csrf : "";
  if (body) headers["Content-Type"] = "application/json";
  const response = await fetch(url, { method, headers, body: body ? JSON.stringify(body) : undefined,
                                      credentials: "same-origin" });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    const first = Array.isArray(data.detail) && data.detail[0];  // FastAPI's 422: the failing field
    throw new Error(typeof data.detail === "string" ? data.detail
      : first ? `${first.loc.slice(1).join(".")}: ${first.msg}` : `HTTP ${response.status}`);
  }
  return data;
}

function say(text, error) {
  const box = document.getElementById("message");
  box.textContent = text;
  box.className = error ? "error" : "";
}

async function loadSession() {
  session = await call("GET", "/api/session");
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
                                    "data-target": `gpu:${gpu.index}`, text: action });
      button.addEventListener("click", () => prefill(action, `gpu:${gpu.index}`));
      buttons.append(button);
    }
    card.append(buttons);
  }
  return card;
}

function prefill(action, target) {
  document.getElementById("toggle-action").value = action;
  document.getElementById("toggle-target").value = target;
  document.getElementById("toggle-reason").focus();
  say(`${action} ${target}: give a reason, then Apply`);
}

function rows(id, items, cells, key) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren(...items.map((item) => el("tr", key ? { "data-key": key(item) } : {},
                                                 ...cells(item).map((c) => el("td", {}, c)))));
}

function render(host) {
  document.getElementById("host").textContent = host.host;
  document.getElementById("gpus").replaceChildren(...host.gpus.map(gpuCard));
  document.getElementById("activity").replaceChildren(...host.activity.map((line) => el("li", { text: line })));
  document.getElementById("gitlab-error").textContent = host.gitlab_error ? `GitLab: ${host.gitlab_error}` : "";
  rows("slots", host.slots, (s) => [s.key, s.gpus.join(","), s.state, s.running_jobs.join(", ") || "-", s.reason],
       (s) => s.key);
  rows("events", host.events, (e) => [new Date(e.at * 1000).toLocaleString(), e.kind, e.subject, e.detail],
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
                     title: gpu.detail || gpu.state },
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
  const now = Date.now() / 1000;
  rows("history", jobs, (j) => {
    const job = j.url ? el("a", { href: j.url, text: String(j.job_id) }) : el("span", { text: String(j.job_id) });
    const cell = el("span", {}, job, j.name ? ` ${j.name}` : "");
    if (j.unused) cell.append(" ", el("span", { class: "badge unused", text: "requested but unused" }));
    return [new Date(j.started_at * 1000).toLocaleString(), cell, j.user || "?", j.project || "?", j.host,
      j.gpus.join(","), j.wait_s === null ? "?" : ago(j.wait_s), ago((j.ended_at ?? now) - j.started_at),
      j.outcome, j.gpu_hours.toFixed(2),
      j.mean_utilization === null ? "?" : `${Math.round(j.mean_utilization * 100)} %`];
  }, (j) => `${j.host}:${j.job_id}`);
}

function filterHistory() {
  const params = new URLSearchParams({ limit: "50" });
  for (const name of ["user", "project", "host", "since"]) {
    const value = document.getElementById(`history-${name}`).value.trim();
    if (value) params.set(name, value);
  }
  historyQuery = params.toString();
}

async function refresh() {
  try {
    if (!historyQuery) filterHistory();
    const [host, fleet, queue, history] = await Promise.all(
      [call("GET", "/api/host"), call("GET", "/api/fleet"), call("GET", "/api/queue"),
       call("GET", `/api/history?${historyQuery}`).catch((error) => error)]);
    render(host);
    renderFleet(fleet);
    renderQueue(queue);
    if (history instanceof Error) say(`history: ${history.message}`, true); else renderHistory(history);
  } catch (error) {
    say(error.message, true);
  }
}

document.addEventListener("DOMContentLoaded", async () => {
  document.getElementById("signin").addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      await call("POST", "/api/session", { name: document.getElementById("signin-name").value,
                                           password: document.getElementById("signin-password").value });
      document.getElementById("signin-password").value = "";
      await loadSession();
      say("signed in");
      await refresh();
    } catch (error) { say(error.message, true); }
  });
  document.getElementById("signout").addEventListener("click", async () => {
    try { await call("POST", "/api/session/end"); await loadSession(); await refresh(); say("signed out"); }
    catch (error) { say(error.message, true); }
  });
  document.getElementById("history-filter").addEventListener("submit", async (event) => {
    event.preventDefault();
    filterHistory();
    say("");
    await refresh();
  });
  document.getElementById("toggle-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const result = await call("POST", "/api/toggles", {
        action: document.getElementById("toggle-action").value,
        target: document.getElementById("toggle-target").value.trim(),
        reason: document.getElementById("toggle-reason").value });
      document.getElementById("toggle-reason").value = "";
      say(result.message);
      await refresh();
    } catch (error) { say(error.message, true); }
  });
  await loadSession();
  await refresh();
  setInterval(refresh, 2000);
});
