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
  const data = text ? JSON.parse(text) : null;
  if (!res.ok) {
    const reason = data && data.reason !== undefined ? data.reason : res.statusText;
    const err = new Error(typeof reason === "string" ? reason : JSON.stringify(reason));
    err.status = res.status;
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

const num = (n) => (n === undefined || n === null ? "" : Number(n).toLocaleString());
const rate = (stats, key) => (stats && stats[key + "_details"] ? stats[key + "_details"].rate : 0);
const has = (tag) => me && (me.tags.includes(tag) || me.tags.includes("administrator"));

// --- a table that sorts, filters and pages, on the client ---------------------------------

class Table {
  // columns: [{key, label, num?, render?(row)}]; rows come from load(), again on refresh().
  constructor(columns, load, { pageSize = 20, rowId } = {}) {
    Object.assign(this, { columns, load, pageSize, rowId });
    this.rows = [];
    this.sortKey = columns[0].key;
    this.desc = false;
    this.filter = "";
    this.page = 0;
    this.filterInput = h("input", {
      type: "search", placeholder: "Filter by name…", "aria-label": "filter",
      oninput: (e) => { this.filter = e.target.value.toLowerCase(); this.page = 0; this.draw(); },
    });
    this.body = h("tbody");
    this.head = h("tr", {}, columns.map((c) => h("th", {
      class: c.num ? "num" : "", "data-key": c.key,
      onclick: () => { this.desc = this.sortKey === c.key ? !this.desc : false; this.sortKey = c.key; this.draw(); },
    }, c.label)));
    this.pager = h("span", { class: "pager" });
    this.el = h("div", {},
      h("div", { class: "table-tools" }, this.filterInput, this.pager),
      h("table", {}, h("thead", {}, this.head), this.body));
  }
  async refresh() {
    this.rows = await this.load();
    this.draw();
  }
  value(row, key) {
    return key.split(".").reduce((v, k) => (v && typeof v === "object" ? v[k] : undefined), row);
  }
  draw() {
    const { sortKey, desc } = this;
    let rows = this.rows.filter((r) => !this.filter || String(r.name || "").toLowerCase().includes(this.filter));
    rows = rows.slice().sort((a, b) => {
      const x = this.value(a, sortKey), y = this.value(b, sortKey);
      const c = typeof x === "number" && typeof y === "number" ? x - y : String(x ?? "").localeCompare(String(y ?? ""));
      return desc ? -c : c;
    });
    const pages = Math.max(1, Math.ceil(rows.length / this.pageSize));
    this.page = Math.min(this.page, pages - 1);
    const shown = rows.slice(this.page * this.pageSize, (this.page + 1) * this.pageSize);
    for (const th of this.head.children) {
      th.classList.toggle("sorted", th.dataset.key === sortKey);
      th.classList.toggle("desc", th.dataset.key === sortKey && desc);
    }
    this.body.replaceChildren(...(shown.length ? shown.map((r) => h("tr", {},
      this.columns.map((c) => h("td", { class: c.num ? "num" : "" },
        c.render ? c.render(r) : (c.num ? num(this.value(r, c.key)) : this.value(r, c.key) ?? "")))))
      : [h("tr", {}, h("td", { colspan: this.columns.length, class: "muted" }, "Nothing here."))]));
    this.pager.replaceChildren(
      h("button", { class: "secondary", disabled: this.page === 0, onclick: () => { this.page--; this.draw(); } }, "‹"),
      h("span", { "data-role": "page" }, `${rows.length ? this.page + 1 : 0} / ${rows.length ? pages : 0} · ${rows.length} items`),
      h("button", { class: "secondary", disabled: this.page >= pages - 1, onclick: () => { this.page++; this.draw(); } }, "›"));
  }
}

// --- a line chart on a canvas ------------------------------------------------------------

class Chart {
  // series: [{label, color}]; push() adds one sample per series and redraws.
  constructor(id, series, capacity = 60) {
    Object.assign(this, { series, capacity });
    this.data = series.map(() => []);
    this.canvas = h("canvas", { class: "chart", id, "data-samples": "0" });
    this.el = h("div", {}, this.canvas, h("div", { class: "legend" },
      series.map((s) => h("span", {}, h("i", { style: `background:${s.color}` }), s.label))));
  }
  push(values) {
    values.forEach((v, i) => {
      this.data[i].push(v);
      if (this.data[i].length > this.capacity) this.data[i].shift();
    });
    // The tests read these to see the chart move without timing anything.
    this.canvas.dataset.samples = String(Number(this.canvas.dataset.samples) + 1);
    this.canvas.dataset.last = values.join(",");
    this.draw();
  }
  draw() {
    const c = this.canvas, ratio = window.devicePixelRatio || 1;
    const w = c.clientWidth || 400, hgt = c.clientHeight || 200;
    c.width = w * ratio; c.height = hgt * ratio;
    const g = c.getContext("2d");
    g.scale(ratio, ratio);
    g.clearRect(0, 0, w, hgt);
    const max = Math.max(1, ...this.data.flat());
    const left = 44, bottom = hgt - 18, top = 8;
    g.strokeStyle = "#e3e6ec"; g.fillStyle = "#6b7385"; g.font = "11px system-ui";
    for (let i = 0; i <= 4; i++) {
      const y = bottom - (bottom - top) * i / 4;
      g.beginPath(); g.moveTo(left, y); g.lineTo(w, y); g.stroke();
      g.fillText(formatShort(max * i / 4), 2, y + 4);
    }
    this.data.forEach((points, i) => {
      if (!points.length) return;
      g.strokeStyle = this.series[i].color; g.lineWidth = 2; g.beginPath();
      points.forEach((v, j) => {
        const x = left + (w - left) * (j + this.capacity - points.length) / (this.capacity - 1);
        const y = bottom - (bottom - top) * v / max;
        j ? g.lineTo(x, y) : g.moveTo(x, y);
      });
      g.stroke();
    });
  }
}
function formatShort(n) {
  return n >= 1e6 ? (n / 1e6).toFixed(1) + "M" : n >= 1e3 ? (n / 1e3).toFixed(1) + "k" : n.toFixed(n < 10 ? 1 : 0);
}

// --- pages -------------------------------------------------------------------------------

function poll(fn, ms = POLL_MS) {
  fn();
  timers.push(setInterval(fn, ms));
}

async function overviewPage() {
  const tiles = h("div", { class: "tiles" });
  const rates = new Chart("chart-rates", [
    { label: "publish /s", color: "#3b6cf6" }, { label: "deliver / get /s", color: "#1f9d55" },
    { label: "ack /s", color: "#e08a1e" }]);
  const queued = new Chart("chart-queued", [
    { label: "ready", color: "#3b6cf6" }, { label: "unacked", color: "#e08a1e" }]);
  main().replaceChildren(h("h1", {}, "Overview"), tiles, h("div", { class: "grid" },
    h("div", { class: "card" }, h("h2", {}, "Message rates"), rates.el),
    h("div", { class: "card" }, h("h2", {}, "Queued messages"), queued.el)));
  poll(async () => {
    const o = await get("/overview");
    const t = o.object_totals, q = o.queue_totals, s = o.message_stats || {};
    tiles.replaceChildren(...[
      ["Connections", t.connections], ["Channels", t.channels], ["Exchanges", t.exchanges],
      ["Queues", t.queues], ["Consumers", t.consumers], ["Messages", q.messages],
    ].map(([label, n]) => h("div", { class: "tile" }, h("b", {}, num(n)), h("span", {}, label))));
    rates.push([rate(s, "publish"), rate(s, "deliver_get"), rate(s, "ack")]);
    queued.push([q.messages_ready, q.messages_unacknowledged]);
  });
}

const vhostOf = () => "";  // all vhosts; the API filters by what the user may see
const queueLink = (r) => h("a", { href: `#/queues/${enc(r.vhost)}/${enc(r.name)}` }, r.name);
const exchangeLink = (r) => h("a", { href: `#/exchanges/${enc(r.vhost)}/${enc(r.name)}` }, r.name || "(AMQP default)");

function listPage(title, columns, path, extra) {
  const table = new Table(columns, () => get(path + vhostOf()));
  main().replaceChildren(h("h1", {}, title), h("div", { class: "card" }, table.el), ...(extra ? [extra(table)] : []));
  poll(() => table.refresh().catch((e) => toast(e.message, true)), 5000);
  return table;
}

function connectionsPage() {
  listPage("Connections", [
    { key: "name", label: "Name" }, { key: "user", label: "User" }, { key: "vhost", label: "Vhost" },
    { key: "channels", label: "Channels", num: true },
    { key: "client_properties.product", label: "Client" },
    { key: "recv_oct_details.rate", label: "In B/s", num: true },
    { key: "send_oct_details.rate", label: "Out B/s", num: true },
    { key: "close", label: "", render: (r) => h("button", { class: "danger", onclick: () => act("Connection closed",
      () => api("DELETE", `/connections/${enc(r.name)}`)) }, "Close") },
  ], "/connections");
}

function channelsPage() {
  listPage("Channels", [
    { key: "name", label: "Channel" }, { key: "user", label: "User" }, { key: "vhost", label: "Vhost" },
    { key: "consumer_count", label: "Consumers", num: true },
    { key: "prefetch_count", label: "Prefetch", num: true },
    { key: "messages_unacknowledged", label: "Unacked", num: true },
    { key: "message_stats.publish_details.rate", label: "Publish /s", num: true },
    { key: "message_stats.deliver_get_details.rate", label: "Deliver /s", num: true },
  ], "/channels");
}

function exchangesPage() {
  listPage("Exchanges", [
    { key: "name", label: "Name", render: exchangeLink }, { key: "vhost", label: "Vhost" },
    { key: "type", label: "Type" }, { key: "durable", label: "Durable" },
    { key: "message_stats.publish_in_details.rate", label: "In /s", num: true },
    { key: "message_stats.publish_out_details.rate", label: "Out /s", num: true },
  ], "/exchanges", (table) => h("div", { class: "card" }, h("h2", {}, "Add an exchange"),
    h("form", { class: "inline", id: "add-exchange", onsubmit: (e) => { e.preventDefault();
      const v = formValues(e.target);
      act(`Exchange ${v.name} declared`, async () => {
        await api("PUT", `/exchanges/${enc(v.vhost)}/${enc(v.name)}`, { type: v.type, durable: v.durable === "true" });
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
  ], "/queues", (table) => h("div", { class: "card" }, h("h2", {}, "Add a queue"),
    h("form", { class: "inline", id: "add-queue", onsubmit: (e) => { e.preventDefault();
      const v = formValues(e.target);
      act(`Queue ${v.name} declared`, async () => {
        const body = { durable: v.durable === "true", arguments: {} };
        if (v.type !== "classic") body.arguments["x-queue-type"] = v.type;
        await api("PUT", `/queues/${enc(v.vhost)}/${enc(v.name)}`, body);
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
    .catch(() => {});
  return select;
}

function props(obj) {
  return h("dl", { class: "props" }, Object.entries(obj).map(([k, v]) =>
    [h("dt", {}, k), h("dd", {}, typeof v === "object" ? JSON.stringify(v) : String(v))]));
}

function publishForm(id, vhost, exchange, defaultKey) {
  return h("form", { class: "inline", id, onsubmit: (e) => { e.preventDefault();
    const v = formValues(e.target);
    act("Message published", async () => {
      const r = await api("POST", `/exchanges/${enc(vhost)}/${enc(exchange)}/publish`, {
        routing_key: v.routing_key, payload: v.payload, payload_encoding: "string",
        properties: v.persistent === "true" ? { delivery_mode: 2 } : {},
      });
      if (!r.routed) throw new Error("the message was not routed to any queue");
    }); } },
    h("label", {}, "Routing key", h("input", { name: "routing_key", value: defaultKey })),
    h("label", { style: "flex:1" }, "Payload", h("textarea", { name: "payload" })),
    h("label", {}, "Persistent", h("select", { name: "persistent" }, h("option", { value: "false" }, "no"), h("option", { value: "true" }, "yes"))),
    h("button", { type: "submit" }, "Publish"));
}

async function queuePage(vhost, name) {
  const base = `/queues/${enc(vhost)}/${enc(name)}`;
  const details = h("div");
  const bindings = new Table([{ key: "source", label: "From exchange", render: (b) => b.source || "(AMQP default)" },
    { key: "routing_key", label: "Routing key" }],
    () => get(`${base}/bindings`), { pageSize: 10 });
  const consumers = new Table([{ key: "consumer_tag", label: "Consumer tag" },
    { key: "channel_details.name", label: "Channel" }, { key: "ack_required", label: "Ack required" },
    { key: "prefetch_count", label: "Prefetch", num: true }],
  async () => (await get(`/consumers/${enc(vhost)}`)).filter((c) => c.queue.name === name), { pageSize: 10 });
  const messages = h("div", { id: "messages" });
  main().replaceChildren(
    h("h1", {}, "Queue ", h("span", { class: "muted" }, name)),
    h("div", { class: "grid" }, h("div", { class: "card" }, h("h2", {}, "Details"), details),
      h("div", { class: "card" }, h("h2", {}, "Consumers"), consumers.el)),
    h("div", { class: "card" }, h("h2", {}, "Bindings"), bindings.el),
    h("div", { class: "card" }, h("h2", {}, "Get messages"),
      h("form", { class: "inline", id: "get-messages", onsubmit: async (e) => { e.preventDefault();
        const v = formValues(e.target);
        try {
          const got = await api("POST", `${base}/get`, { count: Number(v.count), ackmode: v.ackmode, encoding: "auto" });
          messages.replaceChildren(...(got.length ? got.map((m, i) => h("div", { class: "message" },
            h("b", {}, `Message ${i + 1}`), h("span", { class: "muted" }, ` · ${m.payload_bytes} bytes · routing key ${m.routing_key}${m.redelivered ? " · redelivered" : ""}`),
            h("pre", { class: "payload" }, m.payload))) : [h("p", { class: "muted" }, "The queue is empty.")]));
        } catch (err) { toast(err.message, true); }
      } },
      h("label", {}, "Ack mode", h("select", { name: "ackmode" },
        h("option", { value: "ack_requeue_true" }, "Nack, requeue"), h("option", { value: "ack_requeue_false" }, "Ack (remove)"),
        h("option", { value: "reject_requeue_true" }, "Reject, requeue"))),
      h("label", {}, "Messages", h("input", { name: "count", type: "number", value: "1", min: "1" })),
      h("button", { type: "submit" }, "Get messages")), messages),
    h("div", { class: "card" }, h("h2", {}, "Publish to this queue"), publishForm("publish", vhost, "amq.default", name)),
    h("div", { class: "card actions" },
      h("button", { class: "secondary", id: "purge", onclick: () => act("Queue purged", () => api("DELETE", `${base}/contents`)) }, "Purge"),
      h("button", { class: "danger", id: "delete", onclick: () => {
        if (confirm(`Delete queue ${name}?`)) act("Queue deleted", async () => { await api("DELETE", base); location.hash = "#/queues"; });
      } }, "Delete queue")));
  poll(async () => {
    try {
      const q = await get(base);
      details.replaceChildren(props({
        vhost: q.vhost, type: q.type, durable: q.durable, auto_delete: q.auto_delete, exclusive: q.exclusive,
        arguments: q.arguments, policy: q.policy || "", consumers: q.consumers, ready: q.messages_ready,
        unacked: q.messages_unacknowledged, ...(q.type === "stream" ? { "first offset": q.stream_first_offset, "next offset": q.stream_next_offset } : {}),
      }));
      await Promise.all([bindings.refresh(), consumers.refresh()]);
    } catch (e) { details.replaceChildren(h("p", { class: "error" }, e.message)); }
  }, 5000);
}

async function exchangePage(vhost, name) {
  const base = `/exchanges/${enc(vhost)}/${enc(name)}`;
  const details = h("div");
  const bindings = new Table([{ key: "destination", label: "To" }, { key: "destination_type", label: "Kind" },
    { key: "routing_key", label: "Routing key" },
    { key: "unbind", label: "", render: (b) => h("button", { class: "secondary", onclick: () => act("Binding removed", async () => {
      await api("DELETE", `/bindings/${enc(vhost)}/e/${enc(name)}/${b.destination_type[0]}/${enc(b.destination)}/${enc(b.properties_key)}`);
      await bindings.refresh(); }) }, "Unbind") }],
  () => get(`${base}/bindings/source`), { pageSize: 10 });
  main().replaceChildren(
    h("h1", {}, "Exchange ", h("span", { class: "muted" }, name || "(AMQP default)")),
    h("div", { class: "card" }, h("h2", {}, "Details"), details),
    h("div", { class: "card" }, h("h2", {}, "Bindings"), bindings.el,
      h("form", { class: "inline", id: "add-binding", onsubmit: (e) => { e.preventDefault();
        const v = formValues(e.target);
        act("Binding added", async () => {
          await api("POST", `/bindings/${enc(vhost)}/e/${enc(name)}/${v.kind}/${enc(v.destination)}`, { routing_key: v.routing_key, arguments: {} });
          await bindings.refresh();
        }); } },
      h("label", {}, "To", h("select", { name: "kind" }, h("option", { value: "q" }, "queue"), h("option", { value: "e" }, "exchange"))),
      h("label", {}, "Name", h("input", { name: "destination", required: true })),
      h("label", {}, "Routing key", h("input", { name: "routing_key" })),
      h("button", { type: "submit" }, "Bind"))),
    h("div", { class: "card" }, h("h2", {}, "Publish"), publishForm("publish", vhost, name || "amq.default", "")));
  const x = await get(base);
  details.replaceChildren(props({ vhost: x.vhost, type: x.type, durable: x.durable, auto_delete: x.auto_delete,
    internal: x.internal, arguments: x.arguments, in: x.message_stats ? x.message_stats.publish_in : 0 }));
  await bindings.refresh();
}

function vhostsPage() {
  listPage("Virtual hosts", [
    { key: "name", label: "Name" }, { key: "description", label: "Description" },
    { key: "messages", label: "Messages", num: true },
    { key: "del", label: "", render: (v) => h("button", { class: "danger", onclick: () => {
      if (confirm(`Delete vhost ${v.name} and everything in it?`)) act(`Vhost ${v.name} deleted`, () => api("DELETE", `/vhosts/${enc(v.name)}`));
    } }, "Delete") },
  ], "/vhosts", () => h("div", { class: "card" }, h("h2", {}, "Add a virtual host"),
    h("form", { class: "inline", id: "add-vhost", onsubmit: (e) => { e.preventDefault();
      const v = formValues(e.target);
      act(`Vhost ${v.name} added`, () => api("PUT", `/vhosts/${enc(v.name)}`, { description: v.description })); } },
    h("label", {}, "Name", h("input", { name: "name", required: true })),
    h("label", {}, "Description", h("input", { name: "description" })),
    h("button", { type: "submit" }, "Add vhost"))));
}

function usersPage() {
  listPage("Users", [
    { key: "name", label: "Name" }, { key: "tags", label: "Tags", render: (u) => [].concat(u.tags).join(", ") },
    { key: "del", label: "", render: (u) => h("button", { class: "danger", onclick: () =>
      act(`User ${u.name} deleted`, () => api("DELETE", `/users/${enc(u.name)}`)) }, "Delete") },
  ], "/users", () => {
    const perms = new Table([{ key: "user", label: "User" }, { key: "vhost", label: "Vhost" },
      { key: "configure", label: "Configure" }, { key: "write", label: "Write" }, { key: "read", label: "Read" }],
    () => get("/permissions"));
    perms.refresh().catch((e) => toast(e.message, true));
    return h("div", {},
      h("div", { class: "card" }, h("h2", {}, "Add a user"),
        h("form", { class: "inline", id: "add-user", onsubmit: (e) => { e.preventDefault();
          const v = formValues(e.target);
          act(`User ${v.name} added`, () => api("PUT", `/users/${enc(v.name)}`, { password: v.password, tags: v.tags })); } },
        h("label", {}, "Name", h("input", { name: "name", required: true })),
        h("label", {}, "Password", h("input", { name: "password", type: "password", required: true })),
        h("label", {}, "Tags", h("input", { name: "tags", placeholder: "management, policymaker" })),
        h("button", { type: "submit" }, "Add user"))),
      h("div", { class: "card" }, h("h2", {}, "Permissions"), perms.el,
        h("form", { class: "inline", id: "set-permission", onsubmit: (e) => { e.preventDefault();
          const v = formValues(e.target);
          act("Permissions set", async () => {
            await api("PUT", `/permissions/${enc(v.vhost)}/${enc(v.user)}`, { configure: v.configure, write: v.write, read: v.read });
            await perms.refresh();
          }); } },
        h("label", {}, "User", h("input", { name: "user", required: true })), h("label", {}, "Vhost", vhostSelect()),
        ["configure", "write", "read"].map((k) => h("label", {}, k, h("input", { name: k, value: ".*" }))),
        h("button", { type: "submit" }, "Set permissions"))));
  });
}

function policiesPage() {
  listPage("Policies", [
    { key: "name", label: "Name" }, { key: "vhost", label: "Vhost" }, { key: "pattern", label: "Pattern" },
    { key: "apply-to", label: "Applies to" }, { key: "definition", label: "Definition", render: (p) => JSON.stringify(p.definition) },
    { key: "priority", label: "Priority", num: true },
    { key: "del", label: "", render: (p) => h("button", { class: "danger", onclick: () =>
      act(`Policy ${p.name} deleted`, () => api("DELETE", `/policies/${enc(p.vhost)}/${enc(p.name)}`)) }, "Delete") },
  ], "/policies", () => h("div", { class: "card" }, h("h2", {}, "Add a policy"),
    h("form", { class: "inline", id: "add-policy", onsubmit: (e) => { e.preventDefault();
      const v = formValues(e.target);
      act(`Policy ${v.name} set`, async () => {
        let definition;
        try { definition = JSON.parse(v.definition); } catch { throw new Error("the definition is not JSON"); }
        await api("PUT", `/policies/${enc(v.vhost)}/${enc(v.name)}`, {
          pattern: v.pattern, definition, "apply-to": v.apply_to, priority: Number(v.priority || 0) });
      }); } },
    h("label", {}, "Vhost", vhostSelect()), h("label", {}, "Name", h("input", { name: "name", required: true })),
    h("label", {}, "Pattern", h("input", { name: "pattern", value: ".*" })),
    h("label", {}, "Applies to", h("select", { name: "apply_to" }, ["all", "queues", "exchanges", "classic_queues", "streams"].map((a) => h("option", {}, a)))),
    h("label", {}, "Priority", h("input", { name: "priority", type: "number", value: "0" })),
    h("label", { style: "flex:1" }, "Definition (JSON)", h("textarea", { name: "definition" }, '{"max-length": 1000}')),
    h("button", { type: "submit" }, "Set policy"))));
}

function definitionsPage() {
  main().replaceChildren(h("h1", {}, "Definitions"), h("div", { class: "grid" },
    h("div", { class: "card" }, h("h2", {}, "Export"),
      h("p", { class: "muted" }, "Users, vhosts, permissions, policies, queues, exchanges and bindings, in RabbitMQ's format."),
      h("button", { id: "export", onclick: () => act("Definitions exported", async () => {
        const defs = await get("/definitions");
        const a = h("a", { href: URL.createObjectURL(new Blob([JSON.stringify(defs, null, 2)], { type: "application/json" })),
          download: "leveret-definitions.json" });
        document.body.append(a); a.click(); a.remove();
      }) }, "Download definitions")),
    h("div", { class: "card" }, h("h2", {}, "Import"),
      h("form", { id: "import", onsubmit: (e) => { e.preventDefault();
        const file = e.target.elements.file.files[0];
        act("Definitions imported", async () => {
          if (!file) throw new Error("choose a file first");
          let defs;
          try { defs = JSON.parse(await file.text()); } catch { throw new Error("the file is not JSON"); }
          await api("POST", "/definitions", defs);
        }); } },
      h("label", {}, "A definitions file", h("input", { name: "file", type: "file", accept: ".json,application/json" })),
      h("p"), h("button", { type: "submit" }, "Upload")))));
}

// --- routing and login -------------------------------------------------------------------

const routes = [
  [/^#\/overview$/, overviewPage], [/^#\/connections$/, connectionsPage], [/^#\/channels$/, channelsPage],
  [/^#\/exchanges$/, exchangesPage], [/^#\/queues$/, queuesPage],
  [/^#\/queues\/([^/]+)\/(.+)$/, queuePage], [/^#\/exchanges\/([^/]+)\/(.*)$/, exchangePage],
  [/^#\/vhosts$/, vhostsPage], [/^#\/users$/, usersPage], [/^#\/policies$/, policiesPage],
  [/^#\/definitions$/, definitionsPage],
];

function route() {
  timers.forEach(clearInterval);
  timers = [];
  const hash = location.hash || "#/overview";
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", hash.startsWith(a.getAttribute("href")));
  for (const [pattern, page] of routes) {
    const m = hash.match(pattern);
    if (m) {
      Promise.resolve(page(...m.slice(1).map(decodeURIComponent))).catch((e) => toast(e.message, true));
      return;
    }
  }
  location.hash = "#/overview";
}

async function start() {
  const login = document.getElementById("login"), app = document.getElementById("app");
  if (sessionStorage.getItem(AUTH_KEY)) {
    try {
      me = await get("/whoami");
    } catch {
      sessionStorage.removeItem(AUTH_KEY);
    }
  }
  if (!me) {
    app.hidden = true;
    login.hidden = false;
    return;
  }
  login.hidden = true;
  app.hidden = false;
  document.getElementById("whoami").textContent = me.name;
  // Pages the user's tags do not allow are not offered (the API refuses them anyway).
  for (const a of document.querySelectorAll("#nav a[data-tag]")) a.hidden = !has(a.dataset.tag);
  route();
}

document.getElementById("login-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const v = formValues(e.target);
  sessionStorage.setItem(AUTH_KEY, btoa(unescape(encodeURIComponent(`${v.username}:${v.password}`))));
  const error = document.getElementById("login-error");
  try {
    me = await get("/whoami");
    error.textContent = "";
    start();
  } catch (err) {
    sessionStorage.removeItem(AUTH_KEY);
    error.textContent = err.status === 401 ? "Wrong username or password, or not a management user." : err.message;
  }
});
document.getElementById("logout").addEventListener("click", () => {
  sessionStorage.removeItem(AUTH_KEY);
  me = null;
  timers.forEach(clearInterval);
  start();
});
window.addEventListener("hashchange", () => me && route());
start();
