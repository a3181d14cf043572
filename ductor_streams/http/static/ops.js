// The console's shell and its input delivery view: plain JS, no build step. Holds no
// data until the person gives a bearer token (kept in sessionStorage for this tab only,
// never in a URL) and then calls the JSON endpoints with it. Text from the server is only
// ever set as textContent. The streams views are in console.js; the view is chosen by
// the URL's fragment (#streams, #stream/<run>/<stream>, #deliveries).
"use strict";

const TOKEN_KEY = "ductor-streams.ops.token";
const POLL_MS = 3000;

const state = {
  filters: { state: "", run: "", stream: "", older_than: "" },
  pageTokens: [null], // page tokens of the pages seen, for "first page"
  pageIndex: 0,
  nextPage: null,
  busy: false,
  timer: null,
};

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

class ApiError extends Error {
  constructor(status, problem) {
    super(problem && problem.detail ? problem.detail : `HTTP ${status}`);
    this.status = status;
    this.code = problem && problem.code;
    this.problem = problem || {};
  }
}

async function api(path, options) {
  const headers = { Authorization: `Bearer ${token()}`, Accept: "application/json" };
  if (options && options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    ...options,
    headers,
    cache: "no-store",
  });
  const text = await response.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (_) { body = null; }
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== "" && value !== null && value !== undefined) search.set(key, value);
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

// ---- formatting -------------------------------------------------------------------

function ago(iso) {
  if (!iso) return "";
  return duration((Date.now() - Date.parse(iso)) / 1000);
}

function until(iso) {
  if (!iso) return "";
  const seconds = (Date.parse(iso) - Date.now()) / 1000;
  return seconds <= 0 ? "due" : `in ${duration(seconds)}`;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

function stamp(iso) {
  return iso ? new Date(iso).toLocaleString() : "";
}

function badge(value) {
  return el("span", { class: `state state-${value}` }, value);
}

// ---- rendering --------------------------------------------------------------------

function renderCounts(summary) {
  const box = $("counts");
  box.replaceChildren();
  for (const name of ["dead", "retrying", "pending", "delivered"]) {
    box.append(
      el("button", {
        type: "button",
        class: `count count-${name}`,
        title: `show ${name} deliveries`,
        "data-state": name,
        onclick: () => { $("f-state").value = name; applyFilters(); },
      },
      el("span", { class: "count-value" }, summary.counts[name] ?? 0),
      el("span", { class: "count-label" }, name)),
    );
  }
  const oldest = summary.oldest_pending_age_seconds;
  box.append(
    el("div", { class: "count count-age" },
      el("span", { class: "count-value" }, oldest === null ? "–" : duration(oldest)),
      el("span", { class: "count-label" }, "oldest owed")),
  );
}

function renderDeliveries(page) {
  const body = $("deliveries").querySelector("tbody");
  body.replaceChildren();
  if (page.deliveries.length === 0) {
    body.append(el("tr", {}, el("td", { colSpan: 12, class: "empty" }, "No deliveries match.")));
  }
  for (const d of page.deliveries) {
    const actions = el("td", { class: "actions" },
      el("button", { type: "button", class: "quiet details", onclick: () => showDetail(d.delivery_id) }, "Details"));
    if (d.state === "dead") {
      actions.prepend(el("button", {
        type: "button", class: "retry", title: "re-queue this delivery (dead → pending)",
        onclick: (event) => retry(d.delivery_id, event.currentTarget),
      }, "Retry"));
    }
    body.append(el("tr", { "data-delivery-id": String(d.delivery_id), "data-state": d.state, class: `row-${d.state}` },
      el("td", { class: "num" }, d.delivery_id),
      el("td", { class: "mono" }, d.run_id),
      el("td", { class: "mono" }, d.stream_id),
      el("td", { class: "num" }, d.sequence),
      el("td", {}, badge(d.state)),
      el("td", { class: "num" }, d.attempts),
      el("td", { class: "error-text", title: d.last_error || "" }, d.last_error || ""),
      el("td", { title: stamp(d.created_at) }, ago(d.created_at)),
      el("td", { title: stamp(d.next_attempt_at) },
        d.state === "pending" || d.state === "retrying" ? until(d.next_attempt_at) : ""),
      el("td", { title: stamp(d.delivered_at) }, d.delivered_at ? `${ago(d.delivered_at)} ago` : ""),
      el("td", { title: d.retried_at ? stamp(d.retried_at) : "" },
        d.retried_by ? `${d.retried_by}, ${ago(d.retried_at)} ago` : ""),
      actions,
    ));
  }
  state.nextPage = page.next_page;
  $("next-page").disabled = !page.next_page;
  $("first-page").disabled = state.pageIndex === 0;
  $("page-info").textContent = `page ${state.pageIndex + 1} · ${page.deliveries.length} shown`;
}

function renderLag(summary) {
  const body = $("lag").querySelector("tbody");
  body.replaceChildren();
  if (summary.streams.length === 0) {
    body.append(el("tr", {}, el("td", { colSpan: 10, class: "empty" }, "Every input record has reached its workflow.")));
  }
  for (const s of summary.streams) {
    body.append(el("tr", { class: s.dead > 0 ? "row-dead" : "" },
      el("td", { class: "mono" }, s.run_id),
      el("td", { class: "mono" }, s.stream_id),
      el("td", { class: "num" }, s.owed),
      el("td", { class: "num" }, s.pending),
      el("td", { class: "num" }, s.retrying),
      el("td", { class: "num" }, s.dead),
      el("td", { class: "num" }, s.first_undelivered_sequence),
      el("td", { class: "num" }, s.latest_sequence),
      el("td", {}, duration(s.lag_seconds)),
      el("td", { title: stamp(s.last_delivered_at) }, s.last_delivered_at ? `${ago(s.last_delivered_at)} ago` : "never"),
    ));
  }
}

function renderGaps(page) {
  const body = $("gaps").querySelector("tbody");
  body.replaceChildren();
  if (page.gaps.length === 0) {
    body.append(el("tr", {}, el("td", { colSpan: 8, class: "empty" }, "No gaps recorded.")));
  }
  for (const g of page.gaps) {
    body.append(el("tr", {},
      el("td", { class: "num" }, g.gap_id),
      el("td", { class: "mono" }, g.run_id),
      el("td", { class: "mono" }, g.stream_id),
      el("td", { class: "num" }, g.expected_sequence),
      el("td", { class: "num" }, g.received_sequence),
      el("td", { class: "num" }, g.repaired_records),
      el("td", { class: "mono" }, g.detected_by),
      el("td", { title: stamp(g.detected_at) }, `${ago(g.detected_at)} ago`),
    ));
  }
}

// ---- actions ----------------------------------------------------------------------

function showError(error) {
  const box = $("error");
  if (!error) { box.hidden = true; box.textContent = ""; return; }
  let text = error.message;
  if (error.status === 401) text = `The token was refused (${error.message}). Give another one.`;
  else if (error.status === 403) text = `Not allowed: ${error.message}. Operators need the streams:ops scope.`;
  else if (!error.status) text = `The server cannot be reached (${error.message}).`;
  box.textContent = text;
  box.hidden = false;
}

async function refresh() {
  if (state.busy || !token() || currentView() !== "deliveries") return;
  state.busy = true;
  $("live").classList.add("busy");
  try {
    const filters = { ...state.filters, page: state.pageTokens[state.pageIndex] };
    const [summary, page, gaps] = await Promise.all([
      api("ops/summary"),
      api(`ops/deliveries${query(filters)}`),
      api("ops/gaps?limit=50"),
    ]);
    renderCounts(summary);
    renderDeliveries(page);
    renderLag(summary);
    renderGaps(gaps);
    showError(null);
    $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    $("live").classList.remove("stale");
  } catch (error) {
    showError(error);
    $("live").classList.add("stale");
    if (error.status === 401) signOut(false);
  } finally {
    state.busy = false;
    $("live").classList.remove("busy");
  }
}

async function retry(deliveryId, button) {
  button.disabled = true;
  button.textContent = "Retrying…";
  try {
    const delivery = await api(`ops/deliveries/${deliveryId}/retry`, { method: "POST" });
    const row = document.querySelector(`tr[data-delivery-id="${delivery.delivery_id}"]`);
    if (row) {
      row.dataset.state = delivery.state;
      row.className = `row-${delivery.state}`;
      row.children[4].replaceChildren(badge(delivery.state));
      button.remove();
    }
    showError(null);
  } catch (error) {
    showError(error);
    button.disabled = false;
    button.textContent = "Retry";
  }
  await refresh();
}

async function showDetail(deliveryId) {
  try {
    const d = await api(`ops/deliveries/${deliveryId}`);
    $("detail-title").textContent = `Delivery ${d.delivery_id}`;
    const fields = $("detail-fields");
    fields.replaceChildren();
    const rows = [
      ["run", d.run_id], ["stream", d.stream_id], ["sequence", d.sequence], ["state", d.state],
      ["attempts", d.attempts], ["last error", d.last_error], ["created", stamp(d.created_at)],
      ["next attempt", stamp(d.next_attempt_at)], ["delivered", stamp(d.delivered_at)],
      ["retried by", d.retried_by], ["retried at", stamp(d.retried_at)],
      ["lease", d.lease_owner ? `${d.lease_owner} until ${stamp(d.lease_expires_at)}` : ""],
      ["record size", d.record.size === null ? "" : `${d.record.size} bytes`],
    ];
    for (const [name, value] of rows) {
      fields.append(el("dt", {}, name), el("dd", {}, value === null || value === undefined ? "" : value));
    }
    const pre = $("detail-payload");
    if (d.record.payload_visible) {
      pre.className = "";
      pre.textContent = JSON.stringify(d.record.payload, null, 2);
    } else {
      pre.className = "hidden-payload";
      pre.textContent = `Not shown: ${d.record.payload_hidden_reason}.`;
    }
    $("detail").showModal();
  } catch (error) {
    showError(error);
  }
}

function applyFilters() {
  state.filters = {
    state: $("f-state").value,
    run: $("f-run").value.trim(),
    stream: $("f-stream").value.trim(),
    older_than: $("f-age").value.trim(),
  };
  state.pageTokens = [null];
  state.pageIndex = 0;
  refresh();
}

function claimsOf(raw) {
  // Display only (the server verifies): the claims in the middle of the JWT.
  try {
    const part = raw.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(part));
  } catch (_) {
    return null;
  }
}

function describeToken(raw) {
  const claims = claimsOf(raw);
  return claims ? `${claims.sub} · tenant ${claims.tenant}` : "token set";
}

// Whether the token claims a scope: only to leave out buttons that would be refused (the
// server decides).
function hasScope(scope) {
  const claims = claimsOf(token() || "");
  return Boolean(claims && Array.isArray(claims.scopes) && claims.scopes.includes(scope));
}

// The view the fragment names; without one, input delivery for an operator's token and
// the streams list for anyone else.
function currentView() {
  const hash = location.hash;
  if (hash.startsWith("#stream/")) return "stream";
  if (hash === "#streams") return "streams";
  if (hash === "#deliveries") return "deliveries";
  return hasScope("streams:ops") || !hasScope("streams:read") ? "deliveries" : "streams";
}

function signIn(raw) {
  sessionStorage.setItem(TOKEN_KEY, raw);
  show();
  refresh();
}

function signOut(clearError) {
  sessionStorage.removeItem(TOKEN_KEY);
  if (clearError) showError(null);
  show();
}

function show() {
  const signedIn = Boolean(token());
  const view = signedIn ? currentView() : null;
  $("login").hidden = signedIn;
  $("console").hidden = view !== "deliveries";
  $("session").hidden = !signedIn;
  $("nav").hidden = !signedIn;
  $("nav-streams").classList.toggle("current", view === "streams" || view === "stream");
  $("nav-deliveries").classList.toggle("current", view === "deliveries");
  if (signedIn) $("who").textContent = describeToken(token());
  clearInterval(state.timer);
  if (view === "deliveries") {
    state.timer = setInterval(() => { if (!document.hidden) refresh(); }, POLL_MS);
  }
  if (typeof showStreamsViews === "function") showStreamsViews(view);
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const raw = $("token").value.trim().replace(/^Bearer\s+/i, "");
    $("token").value = "";
    if (raw) signIn(raw);
  });
  $("forget").addEventListener("click", () => signOut(true));
  $("filters").addEventListener("submit", (event) => { event.preventDefault(); applyFilters(); });
  $("next-page").addEventListener("click", () => {
    if (!state.nextPage) return;
    state.pageTokens = state.pageTokens.slice(0, state.pageIndex + 1).concat([state.nextPage]);
    state.pageIndex += 1;
    refresh();
  });
  $("first-page").addEventListener("click", () => {
    state.pageTokens = [null];
    state.pageIndex = 0;
    refresh();
  });
  document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
  window.addEventListener("hashchange", () => { show(); refresh(); });
  show();
  refresh();
});
