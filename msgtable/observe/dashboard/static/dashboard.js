// The msgtable dashboard: polls /api/state every 2 s and draws every table and subscription.
// Nothing is fetched from anywhere but this server. With --auth the token is asked once and
// kept in sessionStorage (this tab only); it travels in the Authorization header, never a cookie.
"use strict";

const POLL_MS = 2000;
const TOKEN_KEY = "msgtable.observe.dashboard.token";
const SERIES = [
  ["sent", "#4477aa"],
  ["acked", "#228833"],
  ["released", "#ccbb44"],
  ["rejected", "#ee6677"],
  ["dead_lettered", "#aa3377"],
];
const STATS = [
  ["in_flight", "in flight"],
  ["cached", "cached (due)"],
  ["subscribers", "subscribers"],
  ["dead", "dead letters"],
  ["sent", "sent"],
  ["acked", "acked"],
  ["rejected", "rejected"],
  ["lag", "unsettled"],
];

const cards = new Map(); // key -> {el, plot, entry, rates}
// The rate history as the page holds it: the server sends the whole last hour once, then
// only the samples after the newest the page has (?after=); the page trims to the window.
const hist = { times: [], window_s: 3600 };
let timer = null;
let waitingForToken = false;

function headers(extra) {
  const h = Object.assign({}, extra || {});
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) h["Authorization"] = "Bearer " + token;
  return h;
}

async function api(path, init) {
  const answer = await fetch(path, Object.assign({ cache: "no-store" }, init || {}));
  if (answer.status === 401) {
    askForToken((await answer.json()).error);
    throw new Error("unauthenticated");
  }
  const body = await answer.json();
  if (!answer.ok) throw new Error(body.error || answer.statusText);
  return body;
}

function askForToken(why) {
  waitingForToken = true;
  const form = document.getElementById("login");
  if (sessionStorage.getItem(TOKEN_KEY)) {
    document.getElementById("login-why").textContent = "The token was refused: " + why;
    sessionStorage.removeItem(TOKEN_KEY);
  }
  form.hidden = false;
  document.getElementById("token").focus();
}

document.getElementById("login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const token = document.getElementById("token").value.trim();
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  document.getElementById("token").value = "";
  document.getElementById("login").hidden = true;
  waitingForToken = false;
  poll();
});

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) e.append(c);
  return e;
}

function fmt(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") return v.toLocaleString("en");
  return String(v);
}

// "1 attempt", "2 attempts" (msgtable.core.words.counted on the server)
function counted(n, noun) {
  return fmt(n) + " " + noun + (n === 1 ? "" : "s");
}

// A time as the header shows it: the 24-hour clock ("19:23", with seconds when asked).
function clock(unixS, seconds) {
  const options = { hour: "2-digit", minute: "2-digit", hourCycle: "h23" };
  if (seconds) options.second = "2-digit";
  return new Date(unixS * 1000).toLocaleTimeString("en-GB", options);
}

// An age bound as the strip's labels show it: "1m", "15m", "6h", "1d".
function shortAge(s) {
  if (s < 60) return Math.round(s) + "s";
  if (s < 3600) return Math.round(s / 60) + "m";
  if (s < 86400) return Math.round(s / 3600) + "h";
  return Math.round(s / 86400) + "d";
}

function age(s) {
  if (s === null || s === undefined) return "–";
  if (s < 120) return s.toFixed(1) + " s";
  if (s < 7200) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}

function keyOf(t) {
  return t.subscription ? t.name + "/" + t.subscription : t.name;
}

function newCard(t) {
  const key = keyOf(t);
  const title = el("h2", {}, t.name);
  const lazy = t.state_rows === "lazy"; // served from its cursor: its mode, its cursor lag
  if (t.subscription) {
    title.append(el("span", { class: "sub" }, " / " + t.subscription + (lazy ? " (lazy)" : "")));
  }
  const stats = el("dl", { class: "stats" });
  for (const [field, label] of STATS) {
    stats.append(el("dt", {}, label), el("dd", { class: "v-" + field }, "–"));
  }
  if (lazy) stats.append(el("dt", {}, "never sent (cursor)"), el("dd", { class: "v-cursor_lag" }, "–"));
  const card = el(
    "section",
    { class: "card", "data-key": key },
    title,
    el("p", { class: "error" }),
    el("p", { class: "advice" }),
    stats,
    el("div", { class: "backlog" }),
    el("div", { class: "push" }),
    el("div", { class: "flow" }),
    el("div", { class: "dedup" }),
    el("ul", { class: "schedules" }),
    el("div", { class: "rate-plot", "data-samples": "0" }),
    el("div", { class: "dead" })
  );
  document.getElementById("tables").append(card);
  return { el: card, plot: null, entry: t, rates: null };
}

// Appends the new samples of this answer to the page's history; returns how many of the
// answer's samples were new (an answer to an overlapping poll repeats some) and how many of
// the oldest the page dropped out of the window.
function mergeTimes(state) {
  const last = hist.times.length ? hist.times[hist.times.length - 1] : -Infinity;
  const times = state.history.times;
  let skip = 0;
  while (skip < times.length && times[skip] <= last) skip++;
  for (let i = skip; i < times.length; i++) hist.times.push(times[i]);
  hist.window_s = state.history.window_s;
  let drop = 0;
  const newest = hist.times.length ? hist.times[hist.times.length - 1] : 0;
  while (drop < hist.times.length && hist.times[drop] <= newest - hist.window_s) drop++;
  hist.times.splice(0, drop);
  return { skip: skip, drop: drop, added: times.length - skip };
}

function mergeRates(card, t, merged) {
  const n = hist.times.length;
  if (!t.rates) {
    card.rates = null;
    return;
  }
  const rates = card.rates || {};
  for (const [field] of SERIES) {
    const held = (rates[field] || []).slice(merged.drop);
    const fresh = t.rates[field].slice(merged.skip);
    let values = held.concat(fresh);
    if (values.length < n) values = new Array(n - values.length).fill(0).concat(values);
    rates[field] = values.slice(values.length - n);
  }
  card.rates = rates;
}

function plotData(state, card) {
  const per = state.history.interval_s;
  const data = [hist.times.slice()];
  for (const [field] of SERIES) data.push(card.rates[field].map((d) => d / per));
  return data;
}

function drawPlot(card, state) {
  const box = card.el.querySelector(".rate-plot");
  if (!card.rates) {
    box.hidden = true;
    return;
  }
  box.hidden = false;
  const data = plotData(state, card);
  const sums = {};
  SERIES.forEach(([field]) => {
    sums[field] = card.rates[field].reduce((a, b) => a + b, 0);
    box.setAttribute("data-" + field.replace("_", "-"), String(sums[field]));
  });
  box.setAttribute("data-samples", String(data[0].length));
  if (typeof uPlot === "undefined") return;
  if (card.plot === null) {
    const width = Math.max(300, box.clientWidth || card.el.clientWidth - 20);
    card.plot = new uPlot(
      {
        width: width,
        height: 150,
        // one line of coloured labels: no "Time: --", no values (they show on hover only)
        legend: { show: true, live: false },
        cursor: { drag: { x: false, y: false } },
        scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max)] } },
        axes: [
          // the 24-hour clock of the header, seconds when the ticks are under a minute apart
          { space: 70, values: (u, ticks) => ticks.map((t) => clock(t, ticks.length > 1 && ticks[1] - ticks[0] < 60)) },
          { label: "msg/s", size: 50 },
        ],
        series: [{}].concat(
          SERIES.map(([field, colour]) => ({ label: field.replace("_", " "), stroke: colour, width: 1.5 }))
        ),
      },
      data,
      box
    );
  } else {
    card.plot.setData(data);
  }
}

// The backlog by age arrives cumulative (created within 1 min, 5 min, ..., all): the bars
// show each bucket's own count (1-5 min: within 5 min less within 1 min).
function ageBuckets(byAge) {
  const out = [];
  let before = 0;
  let lower = 0;
  for (const [upper, n] of byAge) {
    const label =
      upper === null ? "> " + shortAge(lower) : lower === 0 ? "< " + shortAge(upper) : shortAge(lower) + "–" + shortAge(upper);
    out.push([label, n - before]);
    before = n;
    if (upper !== null) lower = upper;
  }
  return out;
}

function drawBacklog(card, t) {
  const b = t.backlog;
  const box = card.el.querySelector(".backlog");
  box.replaceChildren();
  const parts = ["backlog: " + fmt(b.due) + " due"];
  if (b.scheduled !== null && b.scheduled !== undefined) parts.push(fmt(b.scheduled) + " scheduled");
  parts.push(fmt(b.in_flight) + " in flight");
  if (b.unsettled !== null && b.unsettled !== undefined) parts.push(fmt(b.unsettled) + " unsettled");
  parts.push("oldest unacked " + age(b.oldest_unacked_age_s));
  box.append(el("span", { class: "backlog-text" }, parts.join(" · ")));
  if (b.by_age && b.by_age.length) {
    // a bucket a column: its count on a bar filled to its share of the largest, its ages
    // under it; an empty bucket is an empty column, not a missing one
    const buckets = ageBuckets(b.by_age);
    const most = Math.max(1, ...buckets.map(([, n]) => n));
    const bars = el("div", { class: "bars", title: "unacked messages by age" });
    const axis = el("div", { class: "bars-axis" });
    for (const [label, n] of buckets) {
      const bar = el("span", { title: label + ": " + n, "data-age": label, "data-count": String(n) }, n ? fmt(n) : "");
      const fill = n ? Math.max(15, Math.round((100 * n) / most)) : 0;
      bar.style.setProperty("--fill", fill + "%");
      if (fill < 50) bar.className = "low"; // its count dark on the light track
      bars.append(bar);
      axis.append(el("span", {}, label));
    }
    box.append(el("div", { class: "bars-label" }, "unacked by age"), bars, axis);
  }
}

function drawPush(card, t) {
  const box = card.el.querySelector(".push");
  const p = t.push;
  box.textContent = p
    ? "push → " + p.url + " (" + p.state + ", " + p.in_flight + " in flight, " + p.pushed + " pushed, " + p.failed + " failed)"
    : "";
}

// Flow control (msgtable.engine.flow): the limits, what they held back, keys at their cap.
function drawFlow(card, t) {
  const box = card.el.querySelector(".flow");
  if (!t.limits) {
    box.textContent = "";
    return;
  }
  const held = Object.entries(t.throttled || {})
    .filter(([, n]) => n > 0)
    .map(([why, n]) => why + " " + fmt(n))
    .join(", ");
  const capped = t.keys_at_cap ? "; " + fmt(t.keys_at_cap) + " keys at their cap" : "";
  box.textContent = "limits: " + t.limits + "; held back: " + (held || "never") + capped;
}

// Idempotent enqueue (msgtable.core.dedup): the key column and its window.
function drawDedup(card, t) {
  const d = t.dedup;
  card.el.querySelector(".dedup").textContent = d
    ? "dedup: key " + d.column + ", window " + age(d.window_s)
    : "";
}

// A tick's time as `msgtable tables` shows it: UTC, to the second.
function tickTime(unixS) {
  if (unixS === null || unixS === undefined) return "none yet";
  return new Date(unixS * 1000).toISOString().slice(0, 19) + "Z";
}

// Schedules (msgtable.core.schedules) that enqueue into the table: last and next tick.
function drawSchedules(card, t) {
  const list = card.el.querySelector(".schedules");
  const items = (t.schedules || []).map((s) =>
    el(
      "li",
      { "data-schedule": s.name },
      "schedule " + s.name + " ('" + s.cron + "' in " + s.timezone + ", missed: " + s.missed +
        "): last tick " + tickTime(s.last_tick_s) + ", next " + tickTime(s.next_tick_s) +
        ", " + fmt(s.ticks) + " enqueued"
    )
  );
  list.replaceChildren(...items);
}

async function drawDead(card, t) {
  const box = card.el.querySelector(".dead");
  const has = (t.dead || 0) > 0 || (t.subscription && t.totals.dead_lettered > 0);
  if (!has) {
    box.replaceChildren();
    return;
  }
  const q = new URLSearchParams({ table: t.name, subscription: t.subscription, limit: "50" });
  let answer;
  try {
    answer = await api("/api/dead?" + q, { headers: headers() });
  } catch (e) {
    box.replaceChildren(el("p", { class: "error" }, "dead letters: " + e.message));
    return;
  }
  const list = el("ul", {});
  for (const d of answer.dead_letters) {
    const button = el("button", { class: "redrive", type: "button", "data-id": String(d.id) }, "redrive");
    button.addEventListener("click", () => redrive(t, [d.id], button));
    list.append(
      el(
        "li",
        { "data-id": String(d.id) },
        el("span", { class: "id" }, "#" + d.id),
        el("span", { class: "why", title: d.last_error || "" }, d.last_error || "(no reason)"),
        el("span", {}, counted(d.attempts, "attempt")),
        button
      )
    );
  }
  const all = el("button", { class: "redrive-all", type: "button" }, "redrive all");
  all.addEventListener("click", () => redrive(t, null, all));
  box.replaceChildren(el("h3", {}, "Dead letters (" + fmt(answer.count) + ") ", all), list);
  // the counter from the same answer as the list: the state's count is the last refresh's
  // (up to a few seconds older), and showed 6 beside a list of 7
  card.el.querySelector(".v-dead").textContent = fmt(answer.count);
}

async function redrive(t, ids, button) {
  button.disabled = true;
  const body = { table: t.name, subscription: t.subscription };
  if (ids) body.ids = ids;
  try {
    const answer = await api("/api/redrive", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify(body),
    });
    showProblem("");
    button.textContent = "redriven (" + fmt(answer.moved) + ")";
  } catch (e) {
    showProblem("redrive failed: " + e.message);
    button.disabled = false;
  }
  poll();
}

function showProblem(text) {
  const p = document.getElementById("problem");
  p.textContent = text;
  p.hidden = !text;
}

function drawServer(state) {
  // "keyspace msgtable", not "msgtable msgtable" beside the product's name
  document.getElementById("keyspace").textContent = "keyspace " + state.keyspace;
  document.title = "msgtable: keyspace " + state.keyspace;
  const s = state.server;
  const db = document.getElementById("database");
  db.textContent = s.database.up ? "database up" : "database down: " + s.database.error;
  db.className = "pill" + (s.database.up ? "" : " bad");
  const lease = document.getElementById("lease");
  lease.textContent = (s.leading ? "sending here" : "standby") + " · lease holder " + (s.lease_holder || "none");
  lease.className = "pill" + (s.leading ? "" : " muted");
  const binlog = document.getElementById("binlog");
  if (s.binlog === null) {
    binlog.textContent = "binlog off (polling)";
    binlog.className = "pill muted";
  } else {
    binlog.textContent = s.binlog.following ? "binlog following" : "binlog not following (polling)";
    binlog.className = "pill" + (s.binlog.following ? "" : " bad");
  }
  drawSqs(s.sqs);
  document.getElementById("updated").textContent = "updated " + clock(state.now_s, true);
}

// The SQS API (msgtable serve --sqs-listen): its address, its calls by action since the start
function drawSqs(sqs) {
  const pill = document.getElementById("sqs");
  pill.hidden = !sqs;
  if (!sqs) return;
  const calls = Object.entries(sqs.calls).sort();
  const total = calls.reduce((n, [, c]) => n + c, 0);
  pill.textContent = "sqs on " + sqs.listen + " · " + counted(total, "call");
  pill.title = calls.map(([action, c]) => action + " " + c).join("\n") || "no calls yet";
}

function render(state) {
  drawServer(state);
  const merged = mergeTimes(state);
  const seen = new Set();
  for (const t of state.tables) {
    const key = keyOf(t);
    seen.add(key);
    let card = cards.get(key);
    if (!card) {
      card = newCard(t);
      cards.set(key, card);
    }
    card.entry = t;
    card.el.querySelector(".error").textContent = t.load_error || (t.state === "expired" ? "expired" : "");
    const values = Object.assign({}, t, t.totals);
    // dead: its list's answer says it (drawDead) while there is a list to fetch
    const listed = (t.dead || 0) > 0 || (t.subscription && t.totals.dead_lettered > 0);
    for (const [field] of STATS) {
      if (field === "dead" && listed && card.el.querySelector(".dead h3")) continue;
      card.el.querySelector(".v-" + field).textContent = fmt(values[field]);
    }
    card.el.querySelector(".advice").textContent = t.advice || "";
    const cursorLag = card.el.querySelector(".v-cursor_lag");
    if (cursorLag) cursorLag.textContent = fmt(t.cursor_lag);
    drawBacklog(card, t);
    drawPush(card, t);
    drawFlow(card, t);
    drawDedup(card, t);
    drawSchedules(card, t);
    mergeRates(card, t, merged);
    drawPlot(card, state);
    drawDead(card, t);
  }
  for (const [key, card] of cards) {
    if (!seen.has(key)) {
      if (card.plot) card.plot.destroy();
      card.el.remove();
      cards.delete(key);
    }
  }
  document.getElementById("empty").hidden = state.tables.length > 0;
  document.body.setAttribute("data-polls", String(Number(document.body.getAttribute("data-polls") || 0) + 1));
}

async function poll() {
  clearTimeout(timer);
  if (waitingForToken) return;
  try {
    const after = hist.times.length ? "?after=" + hist.times[hist.times.length - 1] : "";
    render(await api("/api/state" + after, { headers: headers() }));
    if (!document.getElementById("problem").textContent.startsWith("redrive")) showProblem("");
  } catch (e) {
    if (e.message !== "unauthenticated") showProblem("cannot reach the server: " + e.message);
  }
  if (!waitingForToken) timer = setTimeout(poll, POLL_MS);
}

poll();
