// waypost console: renders the snapshots of /api/events; drain/undrain/weight through the JSON API.
// Everything from the registry is shown with textContent (never parsed as HTML).
"use strict";

const state = { snap: null, receivedAt: 0, config: null, weights: {} };
const $ = (id) => document.getElementById(id);
const COLORS = ["#2458c6", "#c0392b", "#1f8a4c", "#b9770e", "#7d3cb5", "#0e8c8c", "#d35400", "#5d6d7e"];

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function svg(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

// ---------------------------------------------------------------------------------------------- token

function token() { return sessionStorage.getItem("waypost-token") || ""; }

function takeTokenFromFragment() {
  const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (m) {
    sessionStorage.setItem("waypost-token", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  showTokenState();
}

function showTokenState() {
  $("token-state").textContent = token() ? "set" : "not set";
  $("token-state").className = token() ? "badge on" : "badge";
}

// ---------------------------------------------------------------------------------------------- actions

function say(text, ok) {
  const m = $("message");
  m.textContent = text;
  m.className = ok ? "ok" : "error";
}

async function act(verb, key, address, source, weight) {
  const body = { key, address, source };
  if (weight !== undefined) body.weight = weight;
  let resp;
  try {
    resp = await fetch("/api/" + verb, {
      method: "POST", credentials: "omit",
      headers: { "Content-Type": "application/json", "X-Waypost-Token": token() },
      body: JSON.stringify(body),
    });
  } catch (e) {
    say(`${verb} ${address}: ${e}`, false);
    return;
  }
  let answer = {};
  try { answer = await resp.json(); } catch (e) { /* not JSON */ }
  if (resp.ok) {
    say(`${verb} ${key} ${address}: done` + (weight !== undefined ? ` (weight ${weight})` : ""), true);
  } else {
    say(`${verb} ${key} ${address} refused (${resp.status}): ${answer.error || resp.statusText}`, false);
  }
}

// ---------------------------------------------------------------------------------------------- filters

function matches(svc, inst) {
  const q = $("search").value.trim().toLowerCase();
  const fmt = $("f-format").value, src = $("f-source").value;
  if (fmt && svc.format !== fmt) return false;
  if (src && svc.source !== src) return false;
  if (inst) {
    if ($("f-drained").checked && inst.weight !== 0) return false;
    if ($("f-unhealthy").checked && inst.health === "SERVING") return false;
  } else if ($("f-drained").checked || $("f-unhealthy").checked) {
    return false;
  }
  if (!q) return true;
  const hay = [svc.key, svc.source, svc.format, inst ? inst.address : "", inst ? JSON.stringify(inst.metadata) : "",
    inst ? inst.health || "" : ""].join(" ").toLowerCase();
  return hay.includes(q);
}

function syncOptions(select, values) {
  const have = new Set([...select.options].map((o) => o.value));
  for (const v of values) if (!have.has(v)) select.append(el("option", { value: v }, v));
}

// ---------------------------------------------------------------------------------------------- rendering

function dur(s) {
  if (s === null || s === undefined) return "-";
  if (s < 0) return "expired";
  if (s < 120) return `${Math.floor(s)}s`;
  if (s < 7200) return `${Math.floor(s / 60)}m`;
  if (s < 172800) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

function otherMeta(md) {
  return Object.entries(md || {}).filter(([k]) => !["weight", "zone", "version"].includes(k))
    .map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`).join(", ");
}

function instanceRow(svc, inst, elapsed) {
  const rowId = `${svc.id}|${inst.address}`;
  const writable = svc.writable && state.config && !state.config.read_only;
  const md = inst.metadata || {};
  const drained = inst.weight === 0;
  const ovr = inst.override;
  const wInput = el("input", {
    type: "number", min: "0", step: "1", class: "weight-input", "aria-label": "new weight",
    value: state.weights[rowId] !== undefined ? state.weights[rowId] : "",
    placeholder: String(inst.weight), disabled: !writable,
    oninput: (e) => { state.weights[rowId] = e.target.value; },
  });
  const actions = el("td", { class: "actions" },
    drained
      ? el("button", { class: "undrain", disabled: !writable || !ovr,
        title: ovr ? "remove the override: the instance's own weight again" : "drained by its own registration",
        onclick: () => act("undrain", svc.key, inst.address, svc.source) }, "undrain")
      : el("button", { class: "drain", disabled: !writable,
        onclick: () => act("drain", svc.key, inst.address, svc.source) }, "drain"),
    " ", wInput, " ",
    el("button", { class: "set-weight", disabled: !writable, onclick: () => {
      const v = state.weights[rowId];
      if (v === undefined || v === "" || !/^\d+$/.test(v)) { say("weight: a whole number >= 0", false); return; }
      delete state.weights[rowId];
      act("weight", svc.key, inst.address, svc.source, parseInt(v, 10));
    } }, "set"),
    ovr && !drained ? [" ", el("button", { class: "undo", disabled: !writable,
      onclick: () => act("undrain", svc.key, inst.address, svc.source) }, "undo")] : null);
  const health = inst.health || "…";
  return el("tr", { class: drained ? "drained" : "", "data-key": svc.key, "data-address": inst.address },
    el("td", {}, inst.address),
    el("td", { class: "num weight" }, drained ? el("span", { class: "badge warn" }, "drained") : String(inst.weight),
      ovr ? el("span", { class: "muted", title: `override by ${ovr.by} at ${new Date(ovr.at * 1000).toISOString()}` },
        ` (override by ${ovr.by})`) : null),
    el("td", {}, md.zone !== undefined ? String(md.zone) : ""),
    el("td", {}, md.version !== undefined ? String(md.version) : ""),
    el("td", { class: "muted" }, otherMeta(md)),
    el("td", { class: "num" }, inst.ttl === null ? "-" : dur(inst.ttl - elapsed)),
    el("td", { class: "num" }, (inst.age_at_least ? "≥" : "") + dur(inst.age + elapsed)),
    el("td", { class: `health h-${health}`, title: inst.health_detail || "" }, health),
    actions);
}

function renderServices(snap, elapsed) {
  const box = $("services");
  const focused = document.activeElement && document.activeElement.classList.contains("weight-input")
    ? document.activeElement.closest("tr") : null;
  const focusKey = focused ? `${focused.dataset.key}|${focused.dataset.address}` : null;
  box.replaceChildren();
  let shown = 0, total = 0;
  for (const svc of snap.services) {
    total += svc.instances.length;
    const rows = svc.instances.filter((i) => matches(svc, i));
    if (!rows.length && !(svc.instances.length === 0 && matches(svc, null))) continue;
    shown += rows.length;
    const table = el("table", {},
      el("thead", {}, el("tr", {}, ["address", "weight", "zone", "version", "metadata", "lease TTL", "age",
        "health", ""].map((h) => el("th", {}, h)))),
      el("tbody", {}, rows.map((i) => instanceRow(svc, i, elapsed))));
    box.append(el("div", { class: "service", "data-service": svc.key },
      el("h2", {}, svc.key, el("span", { class: "badge" }, svc.format),
        el("span", { class: "meta" }, `${svc.instances.length} instance(s) in ${svc.source}`),
        svc.writable ? null : el("span", { class: "badge" }, "read-only source"),
        svc.error ? el("span", { class: "badge bad" }, svc.error) : null),
      svc.instances.length ? table : el("div", { class: "empty" }, "no instance")));
  }
  if (!snap.services.length) box.append(el("div", { class: "empty" }, "nothing registered yet"));
  $("counts").textContent = `${snap.services.length} key(s), ${shown} of ${total} instance(s) shown`;
  if (focusKey) {
    for (const tr of box.querySelectorAll("tr[data-address]")) {
      if (`${tr.dataset.key}|${tr.dataset.address}` === focusKey) tr.querySelector(".weight-input").focus();
    }
  }
}

function renderOrphans(snap) {
  const box = $("orphans");
  box.replaceChildren();
  if (!snap.orphan_overrides.length) return;
  const writable = state.config && !state.config.read_only;
  box.append(el("div", { class: "service" }, el("h2", {}, "overrides of no registered instance"),
    el("table", {}, el("tbody", {}, snap.orphan_overrides.map((o) => el("tr", { "data-key": o.key,
      "data-address": o.address }, el("td", {}, o.key), el("td", {}, o.address), el("td", {}, `weight ${o.weight}`),
    el("td", { class: "muted" }, `by ${o.by} at ${new Date(o.at * 1000).toISOString()} in ${o.source}`),
    el("td", {}, el("button", { class: "undrain", disabled: !writable,
      onclick: () => act("undrain", o.key, o.address, o.source) }, "remove"))))))));
}

function chart(title, series, backends, value, fmt) {
  const W = 260, H = 90, P = 4;
  const pts = series.map((p) => backends.map((b) => value(p, b)));
  let max = 0;
  for (const row of pts) for (const v of row) if (v !== null && v > max) max = v;
  if (max <= 0) max = 1;
  const s = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
  const x = (i) => P + (series.length > 1 ? (i * (W - 2 * P)) / (series.length - 1) : 0);
  const y = (v) => H - P - (v / max) * (H - 2 * P);
  backends.forEach((b, j) => {
    const coords = [];
    pts.forEach((row, i) => { if (row[j] !== null) coords.push(`${x(i).toFixed(1)},${y(row[j]).toFixed(1)}`); });
    if (coords.length) s.append(svg("polyline", { points: coords.join(" "), fill: "none",
      stroke: COLORS[j % COLORS.length], "stroke-width": "1.5" }));
  });
  const last = pts.length ? pts[pts.length - 1] : [];
  const now = backends.map((b, j) => `${b} ${last[j] === null || last[j] === undefined ? "-" : fmt(last[j])}`);
  return el("div", { class: "chart", title: now.join("\n") }, el("h3", {}, `${title} (max ${fmt(max)})`), s);
}

function renderClients(snap) {
  const box = $("clients");
  box.replaceChildren();
  for (const [url, c] of Object.entries(snap.clients || {})) {
    const card = el("div", { class: "service client", "data-metrics": url },
      el("h2", {}, "client ", el("span", { class: "meta" }, url),
        c.error ? el("span", { class: "badge bad" }, c.error) : null));
    for (const [target, t] of Object.entries(c.targets || {})) {
      const backends = t.backends || [];
      card.append(el("div", { class: "meta empty" }, target),
        el("div", { class: "charts" },
          chart("share of calls", t.series, backends, (p, b) => (p.share[b] ?? null), (v) => `${Math.round(v * 100)}%`),
          chart("in flight", t.series, backends, (p, b) => (p.in_flight[b] ?? null), (v) => v.toFixed(0)),
          chart("latency estimate", t.series, backends, (p, b) => (p.latency[b] ?? null),
            (v) => `${(v * 1000).toFixed(1)} ms`)),
        el("div", { class: "legend" }, backends.map((b, j) => {
          const sw = svg("svg", { width: 10, height: 10 });
          sw.append(svg("rect", { width: 10, height: 10, fill: COLORS[j % COLORS.length] }));
          const last = t.series.length ? t.series[t.series.length - 1] : null;
          const share = last && last.share[b] !== undefined ? ` ${Math.round(last.share[b] * 100)}%` : "";
          return el("span", { "data-backend": b }, sw, ` ${b}${share}`);
        })));
    }
    box.append(card);
  }
}

function render() {
  const snap = state.snap;
  if (!snap) return;
  const elapsed = (Date.now() - state.receivedAt) / 1000;
  syncOptions($("f-format"), [...new Set(snap.services.map((s) => s.format))]);
  syncOptions($("f-source"), [...new Set(snap.services.map((s) => s.source))]);
  const down = Object.entries(snap.sources || {}).filter(([, why]) => why);
  $("sources").textContent = down.length ? down.map(([n, why]) => `${n}: ${why}`).join("; ") : "";
  renderServices(snap, elapsed);
  renderOrphans(snap);
  renderClients(snap);
}

// ---------------------------------------------------------------------------------------------- wiring

function connect() {
  const es = new EventSource("/api/events");
  es.addEventListener("open", () => { $("live").textContent = "live"; $("live").className = "badge on"; });
  es.addEventListener("error", () => { $("live").textContent = "reconnecting"; $("live").className = "badge off"; });
  es.addEventListener("snapshot", (ev) => {
    state.snap = JSON.parse(ev.data);
    state.receivedAt = Date.now();
    render();
  });
}

async function loadConfig() {
  try {
    state.config = await (await fetch("/api/config")).json();
  } catch (e) {
    state.config = { read_only: true };
  }
  $("readonly").hidden = !state.config.read_only;
  render();
}

document.addEventListener("DOMContentLoaded", () => {
  takeTokenFromFragment();
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem("waypost-token", $("token").value.trim());
    $("token").value = "";
    showTokenState();
  });
  for (const id of ["search", "f-format", "f-source", "f-drained", "f-unhealthy"]) {
    $(id).addEventListener("input", render);
  }
  loadConfig();
  connect();
  setInterval(() => {  // TTLs and ages tick between snapshots; not while typing a weight
    if (!(document.activeElement && document.activeElement.classList.contains("weight-input"))) render();
  }, 1000);
});
