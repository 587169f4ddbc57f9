// waypost console: renders the snapshots of /api/events; drain/undrain/weight through the JSON API.
// Everything from the registry is shown with textContent (never parsed as HTML).
"use strict";

// tokenState: "none" (no token in this tab), "checking", "accepted" or "refused": what the server last said of it
const state = { snap: null, receivedAt: 0, config: null, weights: {}, tokenState: "none", colors: {} };
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
}

const TOKEN_BADGE = {  // state -> [text, class, title]
  none: ["not set", "badge", "drain and weight need the write token waypost console printed at start"],
  checking: ["checking…", "badge", "asking the console whether it is the right token"],
  accepted: ["accepted", "badge on", "the console accepted this token"],
  refused: ["refused", "badge off", "the console refused this token: paste the one waypost console printed"],
};

function setTokenState(s) {
  state.tokenState = token() ? s : "none";
  const [text, cls, title] = TOKEN_BADGE[state.tokenState];
  const b = $("token-state");
  b.textContent = text;
  b.className = cls;
  b.title = title;
}

// The badge shows what the server says of the token (POST /api/token writes nothing), not that a field was filled.
async function checkToken() {
  if (!token()) { setTokenState("none"); return; }
  setTokenState("checking");
  try {
    const resp = await fetch("/api/token", { method: "POST", credentials: "omit",
      headers: { "X-Waypost-Token": token() } });
    setTokenState(resp.ok ? "accepted" : "refused");
  } catch (e) {
    setTokenState("refused");
  }
}

function askForToken() {
  $("token").focus();
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
    setTokenState("accepted");
    say(`${verb} ${key} ${address}: done` + (weight !== undefined ? ` (weight ${weight})` : ""), true);
  } else if (answer.token === "missing") {  // the API's wording names headers; on the page: the token field
    setTokenState("none");
    say(`${verb} ${key} ${address} refused (${resp.status}): this needs the console's write token. Paste it in ` +
      `the token field above and press "use" (waypost console prints it at start, and a #token= link).`, false);
    askForToken();
  } else if (answer.token === "wrong") {
    setTokenState("refused");
    say(`${verb} ${key} ${address} refused (${resp.status}): the token in this tab is not this console's. Paste ` +
      `the one waypost console printed in the token field above and press "use".`, false);
    askForToken();
  } else {
    say(`${verb} ${key} ${address} refused (${resp.status}): ${answer.error || resp.statusText}`, false);
  }
}

function drain(svc, inst) {
  const ask = `Drain ${inst.address} of ${svc.key} (${svc.source})?\n\nIts weight becomes 0: clients stop ` +
    `sending it new calls; calls in flight finish. Undo with "undrain".`;
  if (!confirm(ask)) { say(`drain ${svc.key} ${inst.address}: cancelled, nothing changed`, true); return; }
  act("drain", svc.key, inst.address, svc.source);
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
  for (const v of values) if (v && !have.has(v)) { select.append(el("option", { value: v }, v)); have.add(v); }
}

// The filters live in the query string (?q=&format=&source=&drained=1&unhealthy=1): a link opens with them.
const FILTERS = { q: "search", format: "f-format", source: "f-source" };
const FLAGS = { drained: "f-drained", unhealthy: "f-unhealthy" };

function filtersToUrl() {
  const p = new URLSearchParams();
  for (const [name, id] of Object.entries(FILTERS)) if ($(id).value.trim()) p.set(name, $(id).value.trim());
  for (const [name, id] of Object.entries(FLAGS)) if ($(id).checked) p.set(name, "1");
  const qs = p.toString();
  const want = location.pathname + (qs ? `?${qs}` : "") + location.hash;
  if (want !== location.pathname + location.search + location.hash) history.replaceState(null, "", want);
}

function filtersFromUrl() {
  const p = new URLSearchParams(location.search);
  for (const [name, id] of Object.entries(FILTERS)) {
    const v = p.get(name) || "";
    if ($(id).tagName === "SELECT") syncOptions($(id), [v]);  // its options come with the first snapshot
    $(id).value = v;
  }
  for (const [name, id] of Object.entries(FLAGS)) $(id).checked = p.get(name) === "1";
}

// ---------------------------------------------------------------------------------------------- rendering

function plural(n, word) { return `${n} ${word}${n === 1 ? "" : "s"}`; }

// "2 keys, 6 instances" when everything is shown; "1 of 2 keys, 3 of 6 instances shown" under a filter
function countText(keysShown, keys, shown, total) {
  if (keysShown === keys && shown === total) return `${plural(keys, "key")}, ${plural(total, "instance")}`;
  return `${keysShown} of ${plural(keys, "key")}, ${shown} of ${plural(total, "instance")} shown`;
}

function clock(t) { return new Date(t * 1000).toLocaleTimeString([], { hour12: false }); }

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

const COLUMNS = [["address", "address"], ["weight", "weight"], ["zone", "zone"], ["version", "version"],
  ["metadata", "meta"], ["lease TTL", "ttl"], ["age", "age"], ["health", "health"], ["", "actions"]];

// address -> the xDS splits it is in ({service, subset, share}), from the control plane's clients (--xds)
function splitsByAddress() {
  const out = {};
  for (const [service, t] of Object.entries((state.xds && state.xds.traffic) || {})) {
    if (!t.split || t.split.length < 2) continue;  // one cluster: no split to show
    for (const part of t.split) {
      for (const a of part.addresses) (out[a] = out[a] || []).push({ service, subset: part.subset, share: part.share });
    }
  }
  return out;
}

function percent(share) { return `${Math.round(share * 1000) / 10} %`; }

function splitBadges(splits) {
  return (splits || []).map((sp) => el("span", { class: "badge split", "data-subset": sp.subset,
    title: `xDS: the default route of ${sp.service} sends ${percent(sp.share)} of the calls to the subset ` +
      `${sp.subset || sp.service} (as its clients were sent it)` }, `${sp.subset || sp.service} · ${percent(sp.share)}`));
}

function instanceRow(svc, inst, elapsed, splits) {
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
  const actions = el("td", { class: "actions" }, el("div", { class: "buttons" },
    drained
      ? el("button", { class: "undrain", disabled: !writable || !ovr,
        title: ovr ? "remove the override: the instance's own weight again" : "drained by its own registration",
        onclick: () => act("undrain", svc.key, inst.address, svc.source) }, "undrain")
      : el("button", { class: "drain", disabled: !writable, onclick: () => drain(svc, inst) }, "drain"),
    wInput,
    el("button", { class: "set-weight", disabled: !writable, onclick: () => {
      const v = state.weights[rowId];
      if (v === undefined || v === "" || !/^\d+$/.test(v)) { say("weight: a whole number >= 0", false); return; }
      delete state.weights[rowId];
      if (parseInt(v, 10) === 0) { drain(svc, inst); return; }  // weight 0 is a drain: asked the same way
      act("weight", svc.key, inst.address, svc.source, parseInt(v, 10));
    } }, "set"),
    ovr && !drained ? el("button", { class: "undo", disabled: !writable,
      onclick: () => act("undrain", svc.key, inst.address, svc.source) }, "undo") : null));
  const health = inst.health || "…";
  return el("tr", { class: drained ? "drained" : "", "data-key": svc.key, "data-address": inst.address },
    el("td", { class: "address" }, inst.address),
    el("td", { class: "num weight" }, drained ? el("span", { class: "badge warn" }, "drained") : String(inst.weight),
      ovr ? el("span", { class: "muted", title: `override by ${ovr.by} at ${new Date(ovr.at * 1000).toISOString()}` },
        ` (override by ${ovr.by})`) : null, splitBadges(splits[inst.address])),
    el("td", {}, md.zone !== undefined ? String(md.zone) : ""),
    el("td", {}, md.version !== undefined ? String(md.version) : ""),
    el("td", { class: "muted meta-cell" }, otherMeta(md)),
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
  let shown = 0, total = 0, keysShown = 0;
  const down = downSources(snap);
  const splits = splitsByAddress();
  for (const svc of snap.services) {
    total += svc.instances.length;
    const rows = svc.instances.filter((i) => matches(svc, i));
    if (!rows.length && !(svc.instances.length === 0 && matches(svc, null))) continue;
    shown += rows.length;
    keysShown += 1;
    // fixed column widths (style.css, per col class): a row drained, an override or a split shown never moves
    // the other columns
    const table = el("table", { class: "listing" },
      el("colgroup", {}, COLUMNS.map(([, cls]) => el("col", { class: `c-${cls}` }))),
      el("thead", {}, el("tr", {}, COLUMNS.map(([h, cls]) => el("th", { class: `c-${cls}` }, h)))),
      el("tbody", {}, rows.map((i) => instanceRow(svc, i, elapsed, splits))));
    box.append(el("div", { class: "service", "data-service": svc.key },
      el("h2", {}, svc.key, el("span", { class: "badge" }, svc.format),
        el("span", { class: "meta" }, `${plural(svc.instances.length, "instance")} in ${svc.source}`),
        svc.writable ? null : el("span", { class: "badge" }, "read-only source"),
        down[svc.source] ? el("span", { class: "badge bad", title: down[svc.source].error },
          `registry down since ${clock(down[svc.source].since)}: its last list`) : null,
        svc.error ? el("span", { class: "badge bad" }, svc.error) : null),
      svc.instances.length ? table : el("div", { class: "empty" }, "no instance")));
  }
  if (!snap.services.length) {
    const unread = Object.entries(down).filter(([, st]) => !st.read).map(([n]) => n);
    box.append(el("div", { class: "empty" }, unread.length
      ? `nothing read yet: ${unread.join(", ")} ${unread.length === 1 ? "does" : "do"} not answer (see above)`
      : "nothing registered yet"));
  }
  $("counts").textContent = countText(keysShown, snap.services.length, shown, total);
  if (focusKey) {
    for (const tr of box.querySelectorAll("tr[data-address]")) {
      if (`${tr.dataset.key}|${tr.dataset.address}` === focusKey) tr.querySelector(".weight-input").focus();
    }
  }
}

function downSources(snap) {
  return Object.fromEntries(Object.entries(snap.sources || {}).filter(([, st]) => st && st.error));
}

// One line per registry that does not answer: which one, why, since when; the console reads it again by itself.
function renderSources(snap, elapsed) {
  const box = $("sources");
  box.replaceChildren();
  for (const [name, st] of Object.entries(downSources(snap))) {
    const ago = dur(snap.time - st.since + elapsed);
    box.append(el("div", { class: "source-down", "data-source": name },
      el("strong", {}, `${st.kind} registry ${name} is unreachable`),
      ` since ${clock(st.since)} (${ago}): `, el("code", {}, st.error), ". ",
      st.read ? "Shown below: the last list read from it. " : "Nothing read from it yet. ",
      "The console keeps trying and updates this page when it answers."));
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

// A backend keeps its colour for the page's lifetime (a backend gone keeps its past line, in its colour).
function colorOf(backend) {
  if (!(backend in state.colors)) state.colors[backend] = COLORS[Object.keys(state.colors).length % COLORS.length];
  return state.colors[backend];
}

// Every backend of a series, those in the client's list now first, then those gone (their past points stay).
function seriesBackends(t) {
  const now = t.backends || [];
  const seen = new Set(now);
  const gone = [];
  for (const p of t.series || []) {
    for (const b of Object.keys(p.calls || {})) if (!seen.has(b)) { seen.add(b); gone.push(b); }
  }
  return { all: [...now, ...gone.sort()], gone: new Set(gone) };
}

// Round value ticks: a step of 1, 2 or 5 times a power of ten, about `n` of them from 0 to at least `max`.
function niceTicks(max, n) {
  const raw = max / n;
  const p = 10 ** Math.floor(Math.log10(raw));
  const f = raw / p;
  const step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
  const count = Math.max(1, Math.ceil(max / step - 1e-9));
  const ticks = [];
  for (let i = 0; i <= count; i++) ticks.push(Number((i * step).toPrecision(12)));
  return { ticks, step, top: ticks[ticks.length - 1] };
}

// How wide a tick label is drawn (the .tick font), to leave room for the widest one left of the axis.
const measure = document.createElement("canvas").getContext("2d");
function textWidth(text) {
  measure.font = `10px ${getComputedStyle(document.body).fontFamily}`;
  return measure.measureText(text).width;
}

// A number with the decimals a step needs (a step of 0.5 shows 1.5, a step of 20 shows 40).
function stepped(v, step) {
  return v.toFixed(Math.max(0, Math.min(6, -Math.floor(Math.log10(step) + 1e-9))));
}

// A line chart with round value ticks (niceTicks; `axis(top, step)` gives the label of each) and a time axis
// (clock times of the first, middle and last point). The labels stay inside the frame: the value axis starts
// right of the widest label, the top tick sits below the top edge.
function chart(title, series, backends, value, fmt, axis, cap) {
  const W = 300, H = 130, R = 8, T = 10, B = 20;
  const pts = series.map((p) => backends.map((b) => value(p, b)));
  let max = 0;
  for (const row of pts) for (const v of row) if (v !== null && v > max) max = v;
  if (max <= 0) max = cap || 1;
  const { ticks, step, top } = niceTicks(cap ? Math.min(max, cap) : max, 3);
  const label = axis(top, step);
  const L = Math.ceil(Math.max(...ticks.map((v) => textWidth(label(v))))) + 10;
  const s = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
  const t0 = series.length ? series[0].t : 0, t1 = series.length ? series[series.length - 1].t : 1;
  const x = (t) => L + (t1 > t0 ? ((t - t0) * (W - L - R)) / (t1 - t0) : (W - L - R));
  const y = (v) => H - B - (Math.min(v, top) / top) * (H - B - T);
  for (const v of ticks) {
    const yy = y(v).toFixed(1);
    s.append(svg("line", { x1: L, x2: W - R, y1: yy, y2: yy, class: v ? "grid" : "axis" }));
    const text = svg("text", { x: L - 5, y: yy, "text-anchor": "end", "dominant-baseline": "middle",
      class: "tick value", "data-value": v });
    text.textContent = label(v);
    s.append(text);
  }
  s.append(svg("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }));
  if (series.length) {
    const ticks = series.length > 2 ? [t0, (t0 + t1) / 2, t1] : [t1];
    const shown = new Set();  // a window of a few seconds: the same clock time once
    ticks.forEach((t) => {
      if (shown.has(clock(t))) return;
      shown.add(clock(t));
      const label = svg("text", { x: x(t).toFixed(1), y: H - 5, class: "tick time",
        "text-anchor": t === t0 && ticks.length > 1 ? "start" : t === t1 ? "end" : "middle" });
      label.textContent = clock(t);
      s.append(label);
    });
  } else {
    const label = svg("text", { x: (L + W) / 2, y: H / 2, "text-anchor": "middle", class: "tick" });
    label.textContent = "no points yet";
    s.append(label);
  }
  backends.forEach((b, j) => {
    const coords = [];
    pts.forEach((row, i) => { if (row[j] !== null) coords.push(`${x(series[i].t).toFixed(1)},${y(row[j]).toFixed(1)}`); });
    if (coords.length > 1) s.append(svg("polyline", { points: coords.join(" "), fill: "none", stroke: colorOf(b),
      "stroke-width": "1.5", "data-backend": b }));
    else if (coords.length) {
      const [cx, cy] = coords[0].split(",");
      s.append(svg("circle", { cx, cy, r: 2, fill: colorOf(b), "data-backend": b }));
    }
  });
  const last = pts.length ? pts[pts.length - 1] : [];
  const now = backends.map((b, j) => `${b} ${last[j] === null || last[j] === undefined ? "-" : fmt(last[j])}`);
  return el("div", { class: "chart", title: now.join("\n") }, el("h3", {}, title), s);
}

// Latency ticks in ms below a second, in s from there (one unit per chart).
function latencyAxis(top, step) {
  return top < 1 ? (v) => `${stepped(v * 1000, step * 1000)} ms` : (v) => `${stepped(v, step)} s`;
}

// The share of calls of a point with no call finished is no share (not 0%): no point is drawn.
function share(p, b) {
  const calls = Object.values(p.calls || {}).reduce((a, c) => a + c, 0);
  return calls && p.share[b] !== undefined ? p.share[b] : null;
}

// What of a client target the search box keeps: everything when the target or metrics URL matches, else the
// backends whose address matches (none: the target is not shown).
function clientMatch(url, target, backends) {
  const q = $("search").value.trim().toLowerCase();
  if (!q || `${url} ${target}`.toLowerCase().includes(q)) return backends;
  return backends.filter((b) => b.toLowerCase().includes(q));
}

function renderClients(snap) {
  const box = $("clients");
  box.replaceChildren();
  for (const [url, c] of Object.entries(snap.clients || {})) {
    const card = el("div", { class: "service client", "data-metrics": url },
      el("h2", {}, "client ", el("span", { class: "meta" }, url),
        c.error ? el("span", { class: "badge bad" }, c.error) : null));
    let targets = 0;
    for (const [target, t] of Object.entries(c.targets || {})) {
      const { all, gone } = seriesBackends(t);
      const backends = clientMatch(url, target, all);
      if (!backends.length && all.length) continue;
      targets += 1;
      const series = t.series || [];
      const last = series.length ? series[series.length - 1] : null;
      card.append(el("div", { class: "target", "data-target": target }, el("div", { class: "meta empty" }, target),
        el("div", { class: "charts" },
          chart("share of calls", series, backends, share, (v) => `${Math.round(v * 100)}%`,
            (top, step) => (v) => `${stepped(v * 100, step * 100)}%`, 1),
          chart("in flight", series, backends, (p, b) => (p.in_flight[b] ?? null), (v) => v.toFixed(v < 10 ? 1 : 0),
            (top, step) => (v) => stepped(v, step)),
          chart("latency estimate", series, backends, (p, b) => (p.latency[b] ?? null),
            (v) => `${(v * 1000).toFixed(1)} ms`, latencyAxis)),
        el("div", { class: "legend" }, backends.map((b) => {
          const sw = svg("svg", { width: 10, height: 10 });
          sw.append(svg("rect", { width: 10, height: 10, fill: colorOf(b) }));
          const sh = last && share(last, b) !== null ? ` ${Math.round(share(last, b) * 100)}%` : "";
          return el("span", { "data-backend": b, class: gone.has(b) ? "gone" : "" }, sw, ` ${b}${sh}`,
            gone.has(b) ? " (gone)" : "");
        }))));
    }
    if (targets || !Object.keys(c.targets || {}).length) box.append(card);
  }
}

function renderXds() {
  const box = $("xds");
  box.replaceChildren();
  const x = state.xds;
  if (!x) return;
  const card = el("div", { class: "service xds" },
    el("h2", {}, "xDS clients ", el("span", { class: "meta" }, x.server),
      x.error ? el("span", { class: "badge bad" }, x.error) : null));
  const services = Object.entries(x.services || {});
  if (!services.length) card.append(el("div", { class: "meta empty" }, "no client connected"));
  for (const [name, clients] of services) {
    const table = el("table", { class: "instances", "data-xds-service": name },
      el("tr", {}, ["client", "zone", "LDS", "RDS", "CDS", "EDS", ""].map((h) => el("th", {}, h))));
    for (const c of clients) {
      table.append(el("tr", { "data-node": c.node }, el("td", {}, c.node), el("td", {}, c.zone || "-"),
        ["LDS", "RDS", "CDS", "EDS"].map((t) => {
          const v = c.types[t] || "-";
          return el("td", {}, el("span", { class: "badge " + (v === "SYNCED" ? "on" : v === "-" ? "" : v === "NACKED" ? "bad" : "warn") }, v));
        }),
        el("td", { class: "meta" }, (c.nacks || []).join("; "))));
    }
    const t = (x.traffic || {})[name];
    const split = t && t.split.length > 1 ? el("div", { class: "meta empty split-line", "data-xds-split": name },
      "split of the default route: ", splitBadges(t.split.map((p) => ({ service: name, subset: p.subset,
        share: p.share })))) : null;
    card.append(el("div", { class: "target" }, el("div", { class: "meta empty" }, `${name}: ${clients.length} client${clients.length === 1 ? "" : "s"}`), split, table, xdsLoad(name, (x.load || {})[name])));
  }
  box.append(card);
}

// the load the export's clients report (LRS): per cluster and locality, rates of their last reports, in flight,
// totals, dropped calls, the ORCA metrics most calls carried
function xdsLoad(name, clusters) {
  if (!clusters || !clusters.length) return null;
  const rate = (v) => (v < 100 ? v.toFixed(1) : v.toFixed(0));
  const named = (k) => (k.startsWith("named_metrics.") ? 1 : 0);  // the application's metrics first
  const table = el("table", { class: "instances", "data-xds-load": name },
    el("tr", {}, ["cluster", "locality", "calls/s", "errors/s", "in flight", "succeeded", "errored", "dropped",
      "metrics"].map((h) => el("th", {}, h))));
  for (const c of clusters) {
    const dropped = String(c.dropped) + (Object.keys(c.dropped_by_category).length ? " (" +
      Object.entries(c.dropped_by_category).map(([k, v]) => `${k}=${v}`).join(", ") + ")" : "");
    (c.localities.length ? c.localities : [null]).forEach((l, i) => {
      const metrics = l ? Object.entries(l.metrics).sort((a, b) => named(b[0]) - named(a[0]) || b[1].count - a[1].count).slice(0, 3)
        .map(([k, m]) => `${k}=${m.mean.toPrecision(3)}`).join(", ") : "";
      table.append(el("tr", { "data-locality": l ? l.locality : "-" }, el("td", {}, c.cluster),
        el("td", {}, l ? l.locality : "-"), el("td", {}, l ? rate(l.rates.issued) : "0"),
        el("td", {}, l ? rate(l.rates.errored) : "0"), el("td", {}, l ? String(l.in_flight) : "0"),
        el("td", {}, l ? String(l.succeeded) : "0"),
        el("td", {}, el("span", { class: "badge " + (l && l.errored ? "warn" : "") }, l ? String(l.errored) : "0")),
        el("td", {}, i === 0 ? el("span", { class: "badge " + (c.dropped ? "bad" : "") }, dropped) : ""),
        el("td", { class: "meta" }, metrics)));
    });
  }
  return el("div", {}, el("div", { class: "meta empty" }, "load reported by the clients"), table);
}

async function pollXds() {
  try {
    state.xds = await (await fetch("/api/xds")).json();
  } catch (e) {
    state.xds = { server: state.config.xds, error: "the console did not answer", services: {} };
  }
  renderXds();
  render();  // the instance rows show the splits
}

function render() {
  const snap = state.snap;
  if (!snap) return;
  const elapsed = (Date.now() - state.receivedAt) / 1000;
  syncOptions($("f-format"), [...new Set(snap.services.map((s) => s.format))]);
  syncOptions($("f-source"), [...new Set(snap.services.map((s) => s.source))]);
  renderSources(snap, elapsed);
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
  if (state.config.xds) {
    pollXds();
    setInterval(pollXds, 2000);
  }
  if (state.config.read_only) $("token-form").hidden = true;
  render();
}

document.addEventListener("DOMContentLoaded", () => {
  takeTokenFromFragment();
  checkToken();
  filtersFromUrl();
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem("waypost-token", $("token").value.trim());
    $("token").value = "";
    checkToken();
  });
  for (const id of ["search", "f-format", "f-source", "f-drained", "f-unhealthy"]) {
    $(id).addEventListener("input", () => { filtersToUrl(); render(); });
  }
  loadConfig();
  connect();
  setInterval(() => {  // TTLs and ages tick between snapshots; not while typing a weight
    if (!(document.activeElement && document.activeElement.classList.contains("weight-input"))) render();
  }, 1000);
});
