// Leveret's web UI: plain JavaScript, no build step, no outside URLs.
// Everything it shows comes from the same /api the tools use, with HTTP Basic auth.
"use strict";

const AUTH_KEY = "leveret-auth";
const POLL_MS = 2000;
let me = null;          // /api/whoami
let timers = [];        // intervals of the page on screen; cleared on navigation

// --- API --------------------------------------------------------------------------------

async function api(method, path, body) {
  const headers = {
    authorization: "Basic " + sessionStorage.getItem(AUTH_KEY),
    "x-requested-with": "XMLHttpRequest",  // a 401 then comes without the browser's login box
  };
  if (body !== undefined) headers["content-type"] = "application/json";
  const res = await fetch("/api" + path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { reason: text.trim() || res.statusText };  // e.g. aiohttp's plain-text 404
  }
  if (!res.ok) {
    const reason = data && data.reason !== undefined ? data.reason : res.statusText;
    const err = new Error(typeof reason === "string" ? reason : JSON.stringify(reason));
    err.status = res.status;
    // Credentials that stopped working (password changed, user deleted): back to the login form.
    if (res.status === 401 && me && path !== "/whoami" && reason === "Login failed") signOut("Your session has ended; please sign in again.");
    throw err;
  }
  return data;
}
const get = (path) => api("GET", path);
const enc = encodeURIComponent;

// --- small DOM helpers -------------------------------------------------------------------

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
const main = () => document.getElementById("main");

function toast(text, bad = false) {
  const t = document.getElementById("toast");
  t.textContent = text;
  t.className = "toast" + (bad ? " bad" : "");
  t.hidden = false;
  clearTimeout(t._timer);
  t._timer = setTimeout(() => (t.hidden = true), 4000);
}

// Run an action from a button or form and report its outcome.
async function act(what, fn) {
  try {
    await fn();
    toast(what);
  } catch (e) {
    toast(`${what} failed: ${e.message}`, true);
  }
}

function formValues(form) {
  return Object.fromEntries(new FormData(form).entries());
}

const num = (n) => (n === undefined || n === null ? "" : Number(n).toLocaleString(undefined, { maximumFractionDigits: 1 }));
const rate = (stats, key) => (stats && stats[key + "_details"] ? stats[key + "_details"].rate : 0);
const has = (tag) => me && (me.tags.includes(tag) || me.tags.includes("administrator"));

// --- a table that sorts, filters and pages, on the client ---------------------------------

class Table {
  // columns: [{key, label, num?, render?(row), optional?}]; rows come from load(), again on
  // refresh(). Columns without a label hold buttons: they neither sort nor take part in the
  // filter. An optional column shows only when some row has its key (`worker`: a broker of
  // several workers).
  constructor(columns, load, { pageSize = 20, id } = {}) {
    Object.assign(this, { columns, load, pageSize });
    this.rows = [];
    this.sortKey = columns[0].key;
    this.desc = false;
    this.filter = "";
    this.page = 0;
    this.filterInput = h("input", {
      type: "search", placeholder: "Filter…", "aria-label": "filter",
      oninput: (e) => { this.filter = e.target.value.toLowerCase(); this.page = 0; this.draw(); },
    });
    this.body = h("tbody");
    this.head = h("tr", {}, columns.map((c) => h("th", {
      class: [c.num ? "num" : "", c.label ? "sortable" : ""].join(" ").trim(), "data-key": c.key,
      onclick: () => {
        if (!c.label) return;
        this.desc = this.sortKey === c.key ? !this.desc : c.num === true;  // numbers: biggest first
        this.sortKey = c.key;
        this.draw();
      },
    }, c.label)));
    this.pager = h("span", { class: "pager" });
    this.el = h("div", { class: "table", id },
      h("div", { class: "table-tools" }, this.filterInput, this.pager),
      h("div", { class: "scroll" }, h("table", {}, h("thead", {}, this.head), this.body)));
  }
  async refresh() {
    this.rows = await this.load();
    this.draw();
  }
  value(row, column) {
    const v = column.key.split(".").reduce((v, k) => (v && typeof v === "object" ? v[k] : undefined), row);
    // A statistic the broker does not report (yet) counts as 0, so it sorts and shows as one.
    return column.num && (v === undefined || v === null) ? 0 : v;
  }
  matches(row) {
    if (!this.filter) return true;
    return this.columns.some((c) => c.label && !c.num && String(this.value(row, c) ?? "").toLowerCase().includes(this.filter));
  }
  shownColumns() {
    return this.columns.filter((c) => !c.optional || this.rows.some((r) => r[c.key] !== undefined));
  }
  draw() {
    const column = this.columns.find((c) => c.key === this.sortKey);
    const columns = this.shownColumns();
    let rows = this.rows.filter((r) => this.matches(r));
    rows = rows.slice().sort((a, b) => {
      const x = this.value(a, column), y = this.value(b, column);
      const c = typeof x === "number" && typeof y === "number" ? x - y : String(x ?? "").localeCompare(String(y ?? ""));
      return this.desc ? -c : c;
    });
    const pages = Math.max(1, Math.ceil(rows.length / this.pageSize));
    this.page = Math.min(this.page, pages - 1);
    const shown = rows.slice(this.page * this.pageSize, (this.page + 1) * this.pageSize);
    for (const [i, th] of [...this.head.children].entries()) {
      th.hidden = !columns.includes(this.columns[i]);
      th.classList.toggle("sorted", th.dataset.key === this.sortKey);
      th.classList.toggle("desc", th.dataset.key === this.sortKey && this.desc);
    }
    this.body.replaceChildren(...(shown.length ? shown.map((r) => h("tr", {},
      columns.map((c) => {
        const v = this.value(r, c);
        return h("td", { class: c.num ? "num" : "", title: c.render || typeof v === "object" ? null : v },
          c.render ? c.render(r) : (c.num ? num(v) : String(v ?? "")));
      })))
      : [h("tr", {}, h("td", { colspan: columns.length, class: "muted empty" },
        this.rows.length ? "Nothing matches the filter." : "Nothing here yet."))]));
    this.pager.replaceChildren(
      h("button", { class: "secondary", "aria-label": "previous page", disabled: this.page === 0, onclick: () => { this.page--; this.draw(); } }, "‹"),
      h("span", { "data-role": "page" }, `${rows.length ? this.page + 1 : 0} / ${rows.length ? pages : 0} · ${rows.length} items`),
      h("button", { class: "secondary", "aria-label": "next page", disabled: this.page >= pages - 1, onclick: () => { this.page++; this.draw(); } }, "›"));
  }
}

// --- a line chart on a canvas ------------------------------------------------------------

const charts = new Set();  // the charts on screen, redrawn when the window changes size
window.addEventListener("resize", () => charts.forEach((c) => c.draw()));

class Chart {
  // series: [{label, color, dash?, unit?}]; push() adds one sample per series and redraws.
  constructor(id, series, capacity = 60) {
    Object.assign(this, { series, capacity });
    this.data = series.map(() => []);
    this.canvas = h("canvas", { class: "chart", id, "data-samples": "0", role: "img", "aria-label": series.map((s) => s.label).join(", ") });
    this.values = series.map(() => h("b", {}, "0"));  // the newest value, beside its label
    this.el = h("div", {}, this.canvas, h("div", { class: "legend" },
      series.map((s, i) => h("span", {}, h("i", { style: `background:${s.color}` }), s.label, " ", this.values[i], s.unit || "")),
      h("span", { class: "span" }, `last ${Math.round(capacity * POLL_MS / 60000)} min`)));
    charts.add(this);
  }
  push(values) {
    values = values.map((v) => Number(v) || 0);
    values.forEach((v, i) => {
      this.data[i].push(v);
      if (this.data[i].length > this.capacity) this.data[i].shift();
      this.values[i].textContent = num(v);
    });
    // The tests read these to see the chart move without timing anything.
    this.canvas.dataset.samples = String(Number(this.canvas.dataset.samples) + 1);
    this.canvas.dataset.last = values.join(",");
    this.draw();
  }
  draw() {
    if (!this.canvas.isConnected) return charts.delete(this);  // the page was left
    const c = this.canvas, ratio = window.devicePixelRatio || 1;
    const w = c.clientWidth || 400, hgt = c.clientHeight || 200;
    c.width = w * ratio; c.height = hgt * ratio;
    const g = c.getContext("2d");
    g.scale(ratio, ratio);
    g.clearRect(0, 0, w, hgt);
    const max = niceMax(Math.max(...this.data.flat(), 0));
    const left = 48, bottom = hgt - 8, top = 8;
    g.strokeStyle = "#e3e6ec"; g.fillStyle = "#6b7385"; g.font = "11px system-ui, sans-serif";
    g.lineWidth = 1; g.setLineDash([]);
    for (let i = 0; i <= 4; i++) {
      const y = Math.round(bottom - (bottom - top) * i / 4) + 0.5;
      g.beginPath(); g.moveTo(left, y); g.lineTo(w, y); g.stroke();
      g.fillText(formatShort(max * i / 4), 2, y + 4);
    }
    this.data.forEach((points, i) => {
      if (!points.length) return;
      const s = this.series[i];
      g.strokeStyle = s.color; g.lineWidth = 2; g.lineJoin = "round";
      g.setLineDash(s.dash ? [6, 4] : []);  // dashed, so equal series stay visible
      g.beginPath();
      points.forEach((v, j) => {
        const x = left + (w - left) * (j + this.capacity - points.length) / (this.capacity - 1);
        const y = bottom - (bottom - top) * v / max;
        j ? g.lineTo(x, y) : g.moveTo(x, y);
      });
      g.stroke();
    });
  }
}
// The axis top: four gridline steps of a round size, so labels read 0, 3k, 6k… not 0, 3.9k, 7.8k…
function niceMax(n) {
  if (n <= 4) return 4;  // whole-number gridlines for small values too
  const quarter = n / 4, unit = 10 ** Math.floor(Math.log10(quarter));
  return 4 * [1, 2, 2.5, 3, 4, 5, 6, 8, 10].map((f) => f * unit).find((step) => step >= quarter);
}
function formatShort(n) {
  const trim = (x) => String(Number(x.toFixed(1)));
  return n >= 1e6 ? trim(n / 1e6) + "M" : n >= 1e3 ? trim(n / 1e3) + "k" : trim(n);
}

// --- pages -------------------------------------------------------------------------------

// Run fn now and every ms while the page is on screen; a failed round shows its error once.
function poll(fn, ms = POLL_MS) {
  let failing = false;
  const round = () => Promise.resolve().then(fn).then(() => { failing = false; }, (e) => {
    if (!failing && me) toast(e.message, true);
    failing = true;
  });
  round();
  timers.push(setInterval(round, ms));
}

const page = (title, ...children) => main().replaceChildren(h("div", { class: "page-head" }, h("h1", {}, title)), ...children);
const card = (title, ...children) => h("section", { class: "card" }, title ? h("h2", {}, title) : null, ...children);
const yesNo = (b) => (b ? "yes" : "no");
const queueLink = (r) => h("a", { href: `#/queues/${enc(r.vhost)}/${enc(r.name)}` }, r.name);
const exchangeLink = (r) => h("a", { href: `#/exchanges/${enc(r.vhost)}/${enc(r.name || "amq.default")}` }, r.name || "(AMQP default)");
const dangerButton = (label, question, what, fn) => h("button", { class: "danger small", onclick: () => {
  if (confirm(question)) act(what, fn);
} }, label);

async function overviewPage() {
  const tiles = h("div", { class: "tiles" });
  const rates = new Chart("chart-rates", [
    { label: "publish", color: "#3b6cf6", unit: "/s" }, { label: "deliver / get", color: "#1f9d55", unit: "/s" },
    { label: "ack", color: "#e08a1e", unit: "/s", dash: true }]);
  const queued = new Chart("chart-queued", [
    { label: "ready", color: "#3b6cf6" }, { label: "unacked", color: "#e08a1e" }]);
  const node = h("dl", { class: "props" });
  page("Overview", tiles, h("div", { class: "grid" },
    card("Message rates", rates.el), card("Queued messages", queued.el)), card("Node", node));
  poll(async () => {
    const o = await get("/overview");
    const t = o.object_totals || {}, q = o.queue_totals || {}, s = o.message_stats || {};
    tiles.replaceChildren(...[
      ["Connections", t.connections, "#/connections"], ["Channels", t.channels, "#/channels"],
      ["Exchanges", t.exchanges, "#/exchanges"], ["Queues", t.queues, "#/queues"],
      ["Consumers", t.consumers, "#/queues"], ["Messages", q.messages, "#/queues"],
    ].map(([label, n, href]) => h("a", { class: "tile", href }, h("b", {}, num(n || 0)), h("span", {}, label))));
    rates.push([rate(s, "publish"), rate(s, "deliver_get"), rate(s, "ack")]);
    queued.push([q.messages_ready, q.messages_unacknowledged]);
    node.replaceChildren(...props({
      product: `${o.product_name || "Leveret"} ${o.product_version || ""}`, node: o.node, cluster: o.cluster_name,
      "speaks as": `RabbitMQ ${o.rabbitmq_version}`,
      listeners: (o.listeners || []).map((l) => `${l.protocol} ${l.ip_address}:${l.port}`).join(" · "),
    }).children);
  });
}

function listPage(title, columns, path, extra) {
  const table = new Table(columns, () => get(path), { id: "list" });
  page(title, card(null, table.el), ...(extra ? [extra(table)] : []));
  poll(() => table.refresh(), 5000);
  return table;
}

function connectionsPage() {
  listPage("Connections", [
    { key: "name", label: "Name" }, { key: "user", label: "User" }, { key: "vhost", label: "Vhost" },
    { key: "client_properties.product", label: "Client" },
    { key: "channels", label: "Channels", num: true },
    { key: "recv_oct_details.rate", label: "In B/s", num: true },
    { key: "send_oct_details.rate", label: "Out B/s", num: true },
    { key: "worker", label: "Worker", num: true, optional: true },
    { key: "close", label: "", render: (r) => dangerButton("Close", `Close connection ${r.name}?`, "Connection closed",
      () => api("DELETE", `/connections/${enc(r.name)}`)) },
  ], "/connections");
}

function channelsPage() {
  listPage("Channels", [
    { key: "name", label: "Channel" }, { key: "user", label: "User" }, { key: "vhost", label: "Vhost" },
    { key: "mode", label: "Mode", render: (c) => (c.confirm ? "confirm" : c.transactional ? "tx" : "") },
    { key: "consumer_count", label: "Consumers", num: true },
    { key: "prefetch_count", label: "Prefetch", num: true },
    { key: "messages_unacknowledged", label: "Unacked", num: true },
    { key: "message_stats.publish_details.rate", label: "Publish /s", num: true },
    { key: "message_stats.deliver_get_details.rate", label: "Deliver /s", num: true },
    { key: "message_stats.ack_details.rate", label: "Ack /s", num: true },
  ], "/channels");
}

function exchangesPage() {
  listPage("Exchanges", [
    { key: "name", label: "Name", render: exchangeLink }, { key: "vhost", label: "Vhost" },
    { key: "type", label: "Type" }, { key: "durable", label: "Durable", render: (x) => yesNo(x.durable) },
    { key: "message_stats.publish_in_details.rate", label: "In /s", num: true },
    { key: "message_stats.publish_out_details.rate", label: "Out /s", num: true },
  ], "/exchanges", (table) => card("Add an exchange",
    h("form", { class: "inline", id: "add-exchange", onsubmit: (e) => { e.preventDefault();
      const v = formValues(e.target);
      act(`Exchange ${v.name} declared`, async () => {
        await api("PUT", `/exchanges/${enc(v.vhost)}/${enc(v.name)}`, { type: v.type, durable: v.durable === "true" });
        e.target.reset();
        await table.refresh();
      }); } },
    h("label", {}, "Vhost", vhostSelect()), h("label", {}, "Name", h("input", { name: "name", required: true })),
    h("label", {}, "Type", h("select", { name: "type" }, ["direct", "fanout", "topic", "headers"].map((t) => h("option", {}, t)))),
    h("label", {}, "Durable", h("select", { name: "durable" }, h("option", { value: "true" }, "yes"), h("option", { value: "false" }, "no"))),
    h("button", { type: "submit" }, "Add exchange"))));
}

function queuesPage() {
  listPage("Queues", [
    { key: "name", label: "Name", render: queueLink }, { key: "vhost", label: "Vhost" },
    { key: "type", label: "Type" },
    { key: "consumers", label: "Consumers", num: true },
    { key: "messages_ready", label: "Ready", num: true },
    { key: "messages_unacknowledged", label: "Unacked", num: true },
    { key: "message_stats.publish_details.rate", label: "In /s", num: true },
    { key: "message_stats.deliver_get_details.rate", label: "Out /s", num: true },
    { key: "message_stats.ack_details.rate", label: "Ack /s", num: true },
    { key: "worker", label: "Worker", num: true, optional: true },
  ], "/queues", (table) => card("Add a queue",
    h("form", { class: "inline", id: "add-queue", onsubmit: (e) => { e.preventDefault();
      const v = formValues(e.target);
      act(`Queue ${v.name} declared`, async () => {
        const body = { durable: v.durable === "true", arguments: {} };
        if (v.type !== "classic") body.arguments["x-queue-type"] = v.type;
        await api("PUT", `/queues/${enc(v.vhost)}/${enc(v.name)}`, body);
        e.target.reset();
        await table.refresh();
      }); } },
    h("label", {}, "Vhost", vhostSelect()), h("label", {}, "Name", h("input", { name: "name", required: true })),
    h("label", {}, "Type", h("select", { name: "type" }, h("option", {}, "classic"), h("option", {}, "stream"))),
    h("label", {}, "Durable", h("select", { name: "durable" }, h("option", { value: "true" }, "yes"), h("option", { value: "false" }, "no"))),
    h("button", { type: "submit" }, "Add queue"))));
}

// A <select name="vhost"> filled with the vhosts the user sees.
function vhostSelect() {
  const select = h("select", { name: "vhost" }, h("option", { value: "/" }, "/"));
  get("/vhosts").then((vs) => select.replaceChildren(...vs.map((v) => h("option", { value: v.name }, v.name))))
    .catch(() => {});  // the "/" already there is the best guess
  return select;
}

function props(obj) {
  return h("dl", { class: "props" }, Object.entries(obj).map(([k, v]) =>
    [h("dt", {}, k), h("dd", {}, typeof v === "boolean" ? yesNo(v) : v && typeof v === "object" ? JSON.stringify(v) : String(v ?? ""))]));
}

// The basic properties the publish API takes (RabbitMQ's names); the integer ones are
// sent as numbers, the others as strings.
const PROPERTY_NAMES = ["content_type", "content_encoding", "delivery_mode", "priority", "correlation_id",
  "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id", "cluster_id"];
const INT_PROPERTIES = ["delivery_mode", "priority", "timestamp"];

// "name = value" lines (blank lines skipped) as [name, value] pairs; a line without "="
// is an error naming it.
function keyValueLines(text, what) {
  return text.split("\n").map((line) => line.trim()).filter(Boolean).map((line) => {
    const at = line.indexOf("=");
    if (at < 1) throw new Error(`${what}: "${line}" is not name = value`);
    return [line.slice(0, at).trim(), line.slice(at + 1).trim()];
  });
}

// The form's properties and headers as the API's `properties` object. An unknown
// property name is refused here (the API would ignore it); an integer property that is
// not a whole number is sent as written, and the API names it in its answer.
function publishProperties(v) {
  const properties = v.persistent === "true" ? { delivery_mode: 2 } : {};
  for (const [name, value] of keyValueLines(v.properties || "", "Properties")) {
    if (!PROPERTY_NAMES.includes(name)) {
      throw new Error(`unknown property "${name}"; known: ${PROPERTY_NAMES.join(", ")}`);
    }
    properties[name] = INT_PROPERTIES.includes(name) && /^-?\d+$/.test(value) ? Number(value) : value;
  }
  const headers = keyValueLines(v.headers || "", "Headers");
  if (headers.length) {
    // A value that reads as JSON (a number, true, a list) is sent as that; else as text.
    properties.headers = Object.fromEntries(headers.map(([name, value]) => {
      try { return [name, JSON.parse(value)]; } catch { return [name, value]; }
    }));
  }
  return properties;
}

function publishForm(id, vhost, exchange, defaultKey) {
  return h("form", { class: "inline", id, onsubmit: (e) => { e.preventDefault();
    const v = formValues(e.target);
    act("Message published", async () => {
      const r = await api("POST", `/exchanges/${enc(vhost)}/${enc(exchange)}/publish`, {
        routing_key: v.routing_key, payload: v.payload, payload_encoding: "string",
        properties: publishProperties(v),
      });
      if (!r.routed) throw new Error("the message was not routed to any queue");
    }); } },
    h("label", {}, "Routing key", h("input", { name: "routing_key", value: defaultKey })),
    h("label", {}, "Persistent", h("select", { name: "persistent" }, h("option", { value: "false" }, "no"), h("option", { value: "true" }, "yes"))),
    h("label", { class: "wide" }, "Properties (name = value, one a line: " + PROPERTY_NAMES.join(", ") + ")",
      h("textarea", { name: "properties", rows: "2", placeholder: "content_type = text/plain" })),
    h("label", { class: "wide" }, "Headers (name = value, one a line)",
      h("textarea", { name: "headers", rows: "2", placeholder: "x-retries = 3" })),
    h("label", { class: "wide" }, "Payload", h("textarea", { name: "payload", rows: "3" })),
    h("button", { type: "submit" }, "Publish"));
}

// One message from /get: what it carried and how, then its body.
function messageView(m, i) {
  const p = m.properties || {};
  return h("div", { class: "message" },
    h("div", { class: "message-head" }, h("b", {}, `Message ${i + 1}`),
      h("span", { class: "muted" }, [`exchange ${m.exchange || "(AMQP default)"}`, `routing key ${m.routing_key}`,
        `${m.payload_bytes} bytes`, m.redelivered ? "redelivered" : null, `${m.message_count} left`]
        .filter(Boolean).join(" · "))),
    Object.keys(p).length ? h("div", { class: "muted small" }, "properties ", JSON.stringify(p)) : null,
    h("pre", { class: "payload" }, m.payload_encoding === "base64" ? `(base64) ${m.payload}` : m.payload));
}

async function queuePage(vhost, name) {
  const base = `/queues/${enc(vhost)}/${enc(name)}`;
  const details = h("div", { id: "queue-details" }), stats = h("div", { id: "queue-stats" });
  const bindings = new Table([{ key: "source", label: "From exchange", render: (b) => b.source || "(AMQP default)" },
    { key: "routing_key", label: "Routing key" }, { key: "arguments", label: "Arguments", render: (b) => JSON.stringify(b.arguments || {}) }],
  () => get(`${base}/bindings`), { pageSize: 10, id: "queue-bindings" });
  const consumers = new Table([{ key: "consumer_tag", label: "Consumer tag" },
    { key: "channel_details.name", label: "Channel" }, { key: "ack_required", label: "Ack", render: (c) => yesNo(c.ack_required) },
    { key: "exclusive", label: "Exclusive", render: (c) => yesNo(c.exclusive) },
    { key: "prefetch_count", label: "Prefetch", num: true }],
  async () => (await get(`/consumers/${enc(vhost)}`)).filter((c) => c.queue.name === name), { pageSize: 10, id: "queue-consumers" });
  const messages = h("div", { id: "messages" });
  page(h("span", {}, "Queue ", h("span", { class: "muted" }, name)),
    h("div", { class: "grid" }, card("Details", details), card("Messages", stats)),
    card("Consumers", consumers.el),
    card("Bindings", bindings.el),
    card("Get messages",
      h("p", { class: "muted" }, "Taking messages here is destructive unless they are put back: the first mode requeues them."),
      h("form", { class: "inline", id: "get-messages", onsubmit: async (e) => { e.preventDefault();
        const v = formValues(e.target);
        try {
          const got = await api("POST", `${base}/get`, { count: Number(v.count), ackmode: v.ackmode, encoding: "auto", truncate: 50000 });
          messages.replaceChildren(...(got.length ? got.map(messageView) : [h("p", { class: "muted" }, "The queue is empty.")]));
        } catch (err) { toast(err.message, true); }
      } },
      h("label", {}, "Ack mode", h("select", { name: "ackmode" },
        h("option", { value: "ack_requeue_true" }, "Nack, requeue"), h("option", { value: "ack_requeue_false" }, "Ack (remove)"),
        h("option", { value: "reject_requeue_true" }, "Reject, requeue"))),
      h("label", {}, "Messages", h("input", { name: "count", type: "number", value: "1", min: "1" })),
      h("button", { type: "submit" }, "Get messages")), messages),
    card("Publish to this queue", h("p", { class: "muted" }, "Sent through the default exchange, with the queue's name as routing key."),
      publishForm("publish", vhost, "amq.default", name)),
    card("Danger zone", h("div", { class: "actions" },
      h("button", { class: "secondary", id: "purge", onclick: () => {
        if (confirm(`Remove every ready message from ${name}?`)) act("Queue purged", () => api("DELETE", `${base}/contents`));
      } }, "Purge messages"),
      h("button", { class: "danger", id: "delete", onclick: () => {
        if (confirm(`Delete queue ${name}?`)) act("Queue deleted", async () => { await api("DELETE", base); location.hash = "#/queues"; });
      } }, "Delete queue"))));
  poll(async () => {
    const q = await get(base);
    details.replaceChildren(props({
      vhost: q.vhost, type: q.type, durable: q.durable, "auto delete": q.auto_delete, exclusive: q.exclusive,
      arguments: q.arguments, policy: q.policy || "—", state: q.state,
      ...(q.worker !== undefined ? { worker: q.worker } : {}),
      ...(q.type === "stream" ? { "first offset": q.stream_first_offset, "next offset": q.stream_next_offset } : {}),
    }));
    const s = q.message_stats || {};
    stats.replaceChildren(props({
      ready: num(q.messages_ready || 0), unacked: num(q.messages_unacknowledged || 0), consumers: num(q.consumers || 0),
      "publish /s": num(rate(s, "publish")), "deliver / get /s": num(rate(s, "deliver_get")), "ack /s": num(rate(s, "ack")),
    }));
    await Promise.all([bindings.refresh(), consumers.refresh()]);
  }, 5000);
}

async function exchangePage(vhost, name) {
  // The default exchange has an empty name; links and the API call it amq.default.
  if (name === "amq.default") name = "";
  const base = `/exchanges/${enc(vhost)}/${enc(name || "amq.default")}`;
  const details = h("div", { id: "exchange-details" });
  const bindings = new Table([{ key: "destination", label: "To" }, { key: "destination_type", label: "Kind" },
    { key: "routing_key", label: "Routing key" },
    { key: "unbind", label: "", render: (b) => h("button", { class: "secondary small", onclick: () => act("Binding removed", async () => {
      await api("DELETE", `/bindings/${enc(vhost)}/e/${enc(name)}/${b.destination_type[0]}/${enc(b.destination)}/${enc(b.properties_key)}`);
      await bindings.refresh(); }) }, "Unbind") }],
  () => get(`${base}/bindings/source`), { pageSize: 10, id: "exchange-bindings" });
  page(h("span", {}, "Exchange ", h("span", { class: "muted" }, name || "(AMQP default)")),
    card("Details", details),
    card("Bindings", bindings.el,
      name ? h("form", { class: "inline", id: "add-binding", onsubmit: (e) => { e.preventDefault();
        const v = formValues(e.target);
        act("Binding added", async () => {
          await api("POST", `/bindings/${enc(vhost)}/e/${enc(name)}/${v.kind}/${enc(v.destination)}`, { routing_key: v.routing_key, arguments: {} });
          await bindings.refresh();
        }); } },
      h("label", {}, "To", h("select", { name: "kind" }, h("option", { value: "q" }, "queue"), h("option", { value: "e" }, "exchange"))),
      h("label", {}, "Name", h("input", { name: "destination", required: true })),
      h("label", {}, "Routing key", h("input", { name: "routing_key" })),
      h("button", { type: "submit" }, "Bind"))
        : h("p", { class: "muted" }, "Every queue is bound to the default exchange by its name; no other bindings are allowed.")),
    card("Publish", publishForm("publish", vhost, name || "amq.default", "")));
  poll(async () => {
    const x = await get(base);
    const s = x.message_stats || {};
    details.replaceChildren(props({ vhost: x.vhost, type: x.type, durable: x.durable, "auto delete": x.auto_delete,
      internal: x.internal, arguments: x.arguments, policy: x.policy || "—",
      "in /s": num(rate(s, "publish_in")), "out /s": num(rate(s, "publish_out")) }));
    await bindings.refresh();
  }, 5000);
}

function vhostsPage() {
  // Buttons in the rows and the form refresh this table at once rather than at the next poll.
  const table = listPage("Virtual hosts", [
    { key: "name", label: "Name" }, { key: "description", label: "Description" },
    { key: "messages_ready", label: "Ready", num: true }, { key: "messages_unacknowledged", label: "Unacked", num: true },
    { key: "message_stats.publish_details.rate", label: "Publish /s", num: true },
    { key: "del", label: "", render: (v) => dangerButton("Delete", `Delete vhost ${v.name} and everything in it?`,
      `Vhost ${v.name} deleted`, async () => { await api("DELETE", `/vhosts/${enc(v.name)}`); await table.refresh(); }) },
  ], "/vhosts", () => card("Add a virtual host",
    h("form", { class: "inline", id: "add-vhost", onsubmit: (e) => { e.preventDefault();
      const v = formValues(e.target);
      act(`Vhost ${v.name} added`, async () => {
        await api("PUT", `/vhosts/${enc(v.name)}`, { description: v.description });
        e.target.reset();
        await table.refresh();
      }); } },
    h("label", {}, "Name", h("input", { name: "name", required: true })),
    h("label", { class: "wide" }, "Description", h("input", { name: "description" })),
    h("button", { type: "submit" }, "Add vhost"))));
}

function usersPage() {
  // Buttons in the rows and the form refresh this table at once rather than at the next poll.
  const table = listPage("Users", [
    { key: "name", label: "Name" }, { key: "tags", label: "Tags", render: (u) => [].concat(u.tags).filter(Boolean).join(", ") || "—" },
    { key: "del", label: "", render: (u) => dangerButton("Delete", `Delete user ${u.name}?`, `User ${u.name} deleted`,
      async () => { await api("DELETE", `/users/${enc(u.name)}`); await table.refresh(); }) },
  ], "/users", () => card("Add a user",
    h("p", { class: "muted" }, "Tags: administrator, monitoring, policymaker or management open this interface; a user without any can still use AMQP."),
    h("form", { class: "inline", id: "add-user", onsubmit: (e) => { e.preventDefault();
      const v = formValues(e.target);
      act(`User ${v.name} added`, async () => {
        await api("PUT", `/users/${enc(v.name)}`, { password: v.password, tags: v.tags });
        e.target.reset();
        await table.refresh();
      }); } },
    h("label", {}, "Name", h("input", { name: "name", required: true, autocomplete: "off" })),
    h("label", {}, "Password", h("input", { name: "password", type: "password", required: true, autocomplete: "new-password" })),
    h("label", { class: "wide" }, "Tags", h("input", { name: "tags", placeholder: "management, policymaker" })),
    h("button", { type: "submit" }, "Add user"))));
}

function permissionsPage() {
  // Buttons in the rows and the form refresh this table at once rather than at the next poll.
  const table = listPage("Permissions", [
    { key: "user", label: "User" }, { key: "vhost", label: "Vhost" },
    { key: "configure", label: "Configure" }, { key: "write", label: "Write" }, { key: "read", label: "Read" },
    { key: "del", label: "", render: (p) => dangerButton("Revoke", `Revoke ${p.user}'s permissions in ${p.vhost}?`, "Permissions revoked",
      async () => { await api("DELETE", `/permissions/${enc(p.vhost)}/${enc(p.user)}`); await table.refresh(); }) },
  ], "/permissions", () => card("Set permissions",
    h("p", { class: "muted" }, "Each is a regular expression over resource names; an empty one allows nothing."),
    h("form", { class: "inline", id: "set-permission", onsubmit: (e) => { e.preventDefault();
      const v = formValues(e.target);
      act("Permissions set", async () => {
        await api("PUT", `/permissions/${enc(v.vhost)}/${enc(v.user)}`, { configure: v.configure, write: v.write, read: v.read });
        await table.refresh();
      }); } },
    h("label", {}, "User", userSelect()), h("label", {}, "Vhost", vhostSelect()),
    ["configure", "write", "read"].map((k) => h("label", {}, k[0].toUpperCase() + k.slice(1), h("input", { name: k, value: ".*" }))),
    h("button", { type: "submit" }, "Set permissions"))));
}

// A <select name="user"> of the broker's users (only administrators get this page).
function userSelect() {
  const select = h("select", { name: "user", required: true });
  get("/users").then((us) => select.replaceChildren(...us.map((u) => h("option", { value: u.name }, u.name))))
    .catch((e) => toast(e.message, true));
  return select;
}

function policiesPage() {
  // Buttons in the rows and the form refresh this table at once rather than at the next poll.
  const table = listPage("Policies", [
    { key: "name", label: "Name" }, { key: "vhost", label: "Vhost" }, { key: "pattern", label: "Pattern" },
    { key: "apply-to", label: "Applies to" }, { key: "definition", label: "Definition", render: (p) => h("code", {}, JSON.stringify(p.definition)) },
    { key: "priority", label: "Priority", num: true },
    { key: "del", label: "", render: (p) => dangerButton("Delete", `Delete policy ${p.name}?`, `Policy ${p.name} deleted`,
      async () => { await api("DELETE", `/policies/${enc(p.vhost)}/${enc(p.name)}`); await table.refresh(); }) },
  ], "/policies", () => card("Add or replace a policy",
    h("form", { class: "inline", id: "add-policy", onsubmit: (e) => { e.preventDefault();
      const v = formValues(e.target);
      act(`Policy ${v.name} set`, async () => {
        let definition;
        try { definition = JSON.parse(v.definition); } catch { throw new Error("the definition is not JSON"); }
        await api("PUT", `/policies/${enc(v.vhost)}/${enc(v.name)}`, {
          pattern: v.pattern, definition, "apply-to": v.apply_to, priority: Number(v.priority || 0) });
        await table.refresh();
      }); } },
    h("label", {}, "Vhost", vhostSelect()), h("label", {}, "Name", h("input", { name: "name", required: true })),
    h("label", {}, "Pattern", h("input", { name: "pattern", value: ".*" })),
    h("label", {}, "Applies to", h("select", { name: "apply_to" }, ["all", "queues", "exchanges", "classic_queues", "streams"].map((a) => h("option", {}, a)))),
    h("label", {}, "Priority", h("input", { name: "priority", type: "number", value: "0" })),
    h("label", { class: "wide" }, "Definition (JSON)", h("textarea", { name: "definition", rows: "2" }, '{"max-length": 1000}')),
    h("button", { type: "submit" }, "Set policy"))));
}

function definitionsPage() {
  const result = h("p", { id: "import-result", class: "muted" });
  page("Definitions", h("div", { class: "grid" },
    card("Export",
      h("p", { class: "muted" }, "Users, vhosts, permissions, policies, queues, exchanges and bindings as one JSON file, in the format RabbitMQ uses."),
      h("button", { id: "export", onclick: () => act("Definitions exported", async () => {
        const defs = await get("/definitions");
        const a = h("a", { href: URL.createObjectURL(new Blob([JSON.stringify(defs, null, 2)], { type: "application/json" })),
          download: "leveret-definitions.json" });
        document.body.append(a); a.click(); a.remove();
      }) }, "Download definitions")),
    card("Import",
      h("p", { class: "muted" }, "Adds or replaces what the file defines; nothing else is removed."),
      h("form", { id: "import", class: "inline", onsubmit: (e) => { e.preventDefault();
        const file = e.target.elements.file.files[0];
        act("Definitions imported", async () => {
          if (!file) throw new Error("choose a file first");
          let defs;
          try { defs = JSON.parse(await file.text()); } catch { throw new Error("the file is not JSON"); }
          await api("POST", "/definitions", defs);
          const n = (k) => (defs[k] || []).length;
          result.textContent = `Imported ${file.name}: ${n("queues")} queues, ${n("exchanges")} exchanges, ${n("bindings")} bindings, ${n("users")} users, ${n("policies")} policies.`;
        }); } },
      h("label", { class: "wide" }, "A definitions file", h("input", { name: "file", type: "file", accept: ".json,application/json" })),
      h("button", { type: "submit" }, "Upload")), result)));
}

// --- shovels and federation links ------------------------------------------------------------

function linksPage() {
  // Both tables refresh together; the buttons refresh them at once rather than at the next poll.
  const stateCell = (state, reason) => h("span", { class: `state ${state}`, title: reason || null }, state);
  const endpoint = (uri, kind, name, key) => `${uri || ""} ${kind}${name ? ` ${name}` : ""}${key ? ` (${key})` : ""}`.trim();
  const shovels = new Table([
    { key: "name", label: "Name" }, { key: "vhost", label: "Vhost" }, { key: "type", label: "Type" },
    { key: "state", label: "State", render: (s) => stateCell(s.state, s.reason) },
    { key: "src_uri", label: "Source", render: (s) => s.src_queue !== undefined
      ? endpoint(s.src_uri, "queue", s.src_queue) : endpoint(s.src_uri, "exchange", s.src_exchange, s.src_exchange_key) },
    { key: "dest_uri", label: "Destination", render: (s) => s.dest_queue !== undefined
      ? endpoint(s.dest_uri, "queue", s.dest_queue) : endpoint(s.dest_uri, "exchange", s.dest_exchange, s.dest_exchange_key) },
    { key: "reason", label: "Reason" }, { key: "timestamp", label: "Since" },
    { key: "restart", label: "", render: (s) => h("button", { class: "secondary small", onclick: () =>
      act(`Shovel ${s.name} restarted`, async () => { await api("DELETE", `/shovels/vhost/${enc(s.vhost)}/${enc(s.name)}/restart`); await refresh(); }) }, "Restart") },
    { key: "del", label: "", render: (s) => s.type === "static" ? "" : dangerButton("Delete", `Delete shovel ${s.name}?`, `Shovel ${s.name} deleted`,
      async () => { await api("DELETE", `/shovels/vhost/${enc(s.vhost)}/${enc(s.name)}`); await refresh(); }) },
  ], () => get("/shovels"), { id: "shovels" });
  const links = new Table([
    { key: "type", label: "Type" },
    { key: "name", label: "Exchange or queue", render: (l) => l.exchange ?? l.queue },
    { key: "vhost", label: "Vhost" }, { key: "upstream", label: "Upstream" },
    { key: "upstream_name", label: "Upstream's", render: (l) => l.upstream_exchange ?? l.upstream_queue },
    { key: "uri", label: "URI" },
    { key: "status", label: "State", render: (l) => stateCell(l.status, l.error) },
    { key: "error", label: "Error" }, { key: "timestamp", label: "Since" },
    { key: "restart", label: "", render: (l) => h("button", { class: "secondary small", onclick: () =>
      act("Federation link restarted", async () => { await api("DELETE", `/federation-links/vhost/${enc(l.vhost)}/${enc(l.id)}/${enc(l.node)}/restart`); await refresh(); }) }, "Restart") },
  ], () => get("/federation-links"), { id: "federation-links" });
  const refresh = () => Promise.all([shovels.refresh(), links.refresh()]);
  const addShovel = card("Add a shovel",
    h("p", { class: "muted" }, "amqp:// with no host is this broker. The shovel acks each message at the source once the destination confirmed it."),
    h("form", { class: "inline", id: "add-shovel", onsubmit: (e) => { e.preventDefault();
      const v = formValues(e.target);
      act(`Shovel ${v.name} set`, async () => {
        await api("PUT", `/parameters/shovel/${enc(v.vhost)}/${enc(v.name)}`, { value: {
          "src-uri": v.src_uri, "src-queue": v.src_queue, "dest-uri": v.dest_uri, "dest-queue": v.dest_queue } });
        await refresh();
      }); } },
    h("label", {}, "Vhost", vhostSelect()), h("label", {}, "Name", h("input", { name: "name", required: true })),
    h("label", {}, "Source URI", h("input", { name: "src_uri", value: "amqp://", required: true })),
    h("label", {}, "Source queue", h("input", { name: "src_queue", required: true })),
    h("label", {}, "Destination URI", h("input", { name: "dest_uri", value: "amqp://", required: true })),
    h("label", {}, "Destination queue", h("input", { name: "dest_queue", required: true })),
    h("button", { type: "submit" }, "Add shovel")));
  page("Shovels & federation", card("Shovels", shovels.el), card("Federation links", links.el),
    ...(has("policymaker") ? [addShovel] : []));
  poll(refresh, 3000);
}

// --- routing and login -------------------------------------------------------------------

// [hash pattern, page, tag the page needs]; captured groups are the page's arguments.
const routes = [
  [/^#\/overview$/, overviewPage], [/^#\/connections$/, connectionsPage], [/^#\/channels$/, channelsPage],
  [/^#\/exchanges$/, exchangesPage], [/^#\/queues$/, queuesPage],
  [/^#\/queues\/([^/]+)\/(.+)$/, queuePage], [/^#\/exchanges\/([^/]+)\/(.*)$/, exchangePage],
  [/^#\/vhosts$/, vhostsPage, "administrator"], [/^#\/users$/, usersPage, "administrator"],
  [/^#\/permissions$/, permissionsPage, "administrator"], [/^#\/policies$/, policiesPage, "policymaker"],
  [/^#\/definitions$/, definitionsPage, "administrator"], [/^#\/links$/, linksPage, "monitoring"],
];

function route() {
  timers.forEach(clearInterval);
  timers = [];
  const hash = location.hash || "#/overview";
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", hash.startsWith(a.getAttribute("href")));
  for (const [pattern, view, tag] of routes) {
    const m = hash.match(pattern);
    if (!m) continue;
    if (tag && !has(tag)) {
      // Said here rather than left to the API's 401, which would read like a failure.
      page("Not available", card(null, h("p", { id: "forbidden" }, `This page needs the ${tag} tag; ${me.name} does not have it.`)));
      return;
    }
    Promise.resolve(view(...m.slice(1).map(decodeURIComponent))).catch((e) => toast(e.message, true));
    return;
  }
  location.hash = "#/overview";
}

// Show the login form or the application, depending on whether we know who the user is.
function show() {
  const signedIn = me !== null;
  document.getElementById("login").hidden = signedIn;
  document.getElementById("app").hidden = !signedIn;
  if (!signedIn) {
    document.querySelector("#login-form input[name=username]").focus();
    return;
  }
  document.getElementById("whoami").textContent = me.name;
  document.getElementById("whoami").title = "tags: " + (me.tags.join(", ") || "none");
  // Pages the user's tags do not allow are not offered (the API refuses them anyway).
  for (const a of document.querySelectorAll("#nav a[data-tag]")) a.hidden = !has(a.dataset.tag);
  route();
}

function signOut(message = "") {
  sessionStorage.removeItem(AUTH_KEY);
  me = null;
  timers.forEach(clearInterval);
  timers = [];
  main().replaceChildren();
  document.getElementById("login-form").reset();
  document.getElementById("login-error").textContent = message;
  show();
}

document.getElementById("login-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const v = formValues(e.target);
  // btoa takes bytes, not text: encode as UTF-8 first so non-ASCII passwords work.
  const bytes = new TextEncoder().encode(`${v.username}:${v.password}`);
  sessionStorage.setItem(AUTH_KEY, btoa(String.fromCharCode(...bytes)));
  const error = document.getElementById("login-error");
  try {
    me = await get("/whoami");
    error.textContent = "";
    show();
  } catch (err) {
    sessionStorage.removeItem(AUTH_KEY);
    error.textContent = err.status === 401 ? "Wrong username or password, or not a management user." : err.message;
  }
});
document.getElementById("logout").addEventListener("click", () => signOut());
window.addEventListener("hashchange", () => me && route());

// A reload keeps the session: the credentials are in sessionStorage until the tab closes.
(async () => {
  if (sessionStorage.getItem(AUTH_KEY)) {
    try {
      me = await get("/whoami");
    } catch {
      sessionStorage.removeItem(AUTH_KEY);
    }
  }
  show();
})();
