// The console's streams views (loaded after ops.js, whose helpers it uses): the streams
// list, one stream's state, credit, consumers, definition and records, a live tail over
// Server-Sent Events and, for tokens with streams:admin, close and legal hold.
// Payloads and every other text from the server are set as textContent only.
"use strict";

const STREAM_POLL_MS = 3000;
const TAIL_MAX_ROWS = 500;
const SPARK_SECONDS = 60;

const streams = {
  filters: { run_prefix: "", direction: "", closed: "" },
  pageTokens: [null],
  pageIndex: 0,
  nextPage: null,
  asked: 0,
  askedStream: 0,
  timer: null,
  current: null, // {run, stream} of the stream view
  view: null, // {definition, state} of the stream view
  recordsNext: null,
};

const tail = {
  key: null, // "run/stream" the tail belongs to
  wanted: false,
  controller: null,
  lastId: null, // the last sequence shown: resumes with Last-Event-ID
  arrivals: [], // appended_at (ms) of the records seen, for the sparkline
  sparkTimer: null,
  stateTimer: null,
  sparkAt: 0,
};

function streamPath(run, stream) {
  return `runs/${encodeURIComponent(run)}/streams/${encodeURIComponent(stream)}`;
}

function streamHash(run, stream) {
  return `#stream/${encodeURIComponent(run)}/${encodeURIComponent(stream)}`;
}

function parseStreamHash() {
  const parts = location.hash.slice("#stream/".length).split("/");
  if (parts.length !== 2) return null;
  try {
    return { run: decodeURIComponent(parts[0]), stream: decodeURIComponent(parts[1]) };
  } catch (_) {
    return null;
  }
}

function bytes(n) {
  if (n === null || n === undefined) return "";
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  if (n < 1024 ** 3) return `${(n / 1024 / 1024).toFixed(1)} MiB`;
  return `${(n / 1024 ** 3).toFixed(1)} GiB`;
}

function ofCeiling(value, ceiling, format) {
  const f = format || String;
  return ceiling === null || ceiling === undefined ? `${f(value)} (no ceiling)` : `${f(value)} / ${f(ceiling)}`;
}

function problemText(error) {
  if (!error.status) return `The server cannot be reached (${error.message}).`;
  const code = error.code ? ` [${error.code}]` : "";
  if (error.status === 401) return `The token was refused: ${error.message}${code}. Give another one.`;
  if (error.status === 403) return `Not allowed: ${error.message}${code}.`;
  if (error.status === 404) return `Not found: ${error.message}${code}.`;
  return `${error.message}${code}`;
}

function showStreamsError(error) {
  const box = $("error");
  if (!error) { box.hidden = true; box.textContent = ""; return; }
  box.textContent = problemText(error);
  box.hidden = false;
  if (error.status === 401) signOut(false);
}

// ---- the views ----------------------------------------------------------------------

// Called by ops.js's show() whenever the view or the token changes.
function showStreamsViews(view) {
  $("streams-view").hidden = view !== "streams";
  $("stream-view").hidden = view !== "stream";
  clearInterval(streams.timer);
  streams.timer = null;
  if (view !== "stream") stopTail();
  if (view === null) {
    // Signed out: nothing the last token could see stays on the page.
    streams.current = null;
    resetStreamView();
    $("streams").querySelector("tbody").replaceChildren();
    $("sv-state").replaceChildren();
    $("sv-credit").replaceChildren();
    $("sv-consumers").querySelector("tbody").replaceChildren();
    $("sv-definition").replaceChildren();
    $("sv-definition-json").textContent = "";
    return;
  }
  if (view === "streams") {
    loadStreams();
    streams.timer = setInterval(() => { if (!document.hidden) loadStreams(); }, STREAM_POLL_MS);
  } else if (view === "stream") {
    const key = parseStreamHash();
    if (!key) return;
    const changed = !streams.current || streams.current.run !== key.run || streams.current.stream !== key.stream;
    streams.current = key;
    if (changed) {
      resetStreamView();
      readRecords(0);
    }
    loadStream();
    streams.timer = setInterval(() => { if (!document.hidden) loadStream(); }, STREAM_POLL_MS);
  }
}

// ---- the streams list -----------------------------------------------------------------

async function loadStreams() {
  if (!token()) return;
  // A poll started before the filters changed must not paint over the newer answer.
  const asked = ++streams.asked;
  try {
    const params = { ...streams.filters, page: streams.pageTokens[streams.pageIndex] };
    const page = await api(`streams${query(params)}`);
    if (asked !== streams.asked) return;
    renderStreams(page);
    showStreamsError(null);
  } catch (error) {
    showStreamsError(error);
  }
}

function creditCell(value, ceiling, format) {
  const td = el("td", { class: "credit-cell" }, ofCeiling(value, ceiling, format));
  if (ceiling) {
    const ratio = value / ceiling;
    if (ratio >= 1) td.classList.add("full");
    else if (ratio >= 0.8) td.classList.add("near");
  }
  return td;
}

function renderStreams(page) {
  const body = $("streams").querySelector("tbody");
  body.replaceChildren();
  if (page.streams.length === 0) {
    body.append(el("tr", {}, el("td", { colSpan: 9, class: "empty" }, "No streams match.")));
  }
  for (const s of page.streams) {
    const link = el("a", { href: streamHash(s.run_id, s.stream_id), class: "open" }, s.stream_id);
    body.append(el("tr", { "data-run": s.run_id, "data-stream": s.stream_id },
      el("td", { class: "mono" }, s.run_id),
      el("td", { class: "mono" }, link),
      el("td", {}, s.direction),
      el("td", { class: "num" }, s.latest_sequence),
      creditCell(s.unread_items, s.credit.max_unread_items),
      creditCell(s.unread_bytes, s.credit.max_unread_bytes, bytes),
      el("td", {}, s.closed ? badge("closed") : ""),
      el("td", {}, s.legal_hold ? badge("hold") : ""),
      el("td", { title: stamp(s.last_append_at) }, s.last_append_at ? `${ago(s.last_append_at)} ago` : "never"),
    ));
  }
  streams.nextPage = page.next_page;
  $("s-next-page").disabled = !page.next_page;
  $("s-first-page").disabled = streams.pageIndex === 0;
  $("s-page-info").textContent = `page ${streams.pageIndex + 1} · ${page.streams.length} shown`;
}

// ---- one stream -------------------------------------------------------------------------

function resetStreamView() {
  stopTail();
  tail.key = null;
  tail.lastId = null;
  tail.arrivals = [];
  streams.view = null;
  streams.recordsNext = null;
  $("tail").querySelector("tbody").replaceChildren();
  $("records").querySelector("tbody").replaceChildren();
  $("r-notice").hidden = true;
  $("r-cursor").value = "0";
  $("r-page-info").textContent = "";
  $("r-next").disabled = true;
  $("sv-actions").replaceChildren();
  delete $("sv-actions").dataset.shown;
  setConnection("idle", "not started");
  renderSpark();
}

async function loadStream() {
  const key = streams.current;
  if (!key || !token()) return;
  const asked = ++streams.askedStream; // as in loadStreams: the newest answer wins
  try {
    const view = await api(streamPath(key.run, key.stream));
    if (streams.current !== key || asked !== streams.askedStream) return;
    streams.view = view;
    renderStream(view);
    showStreamsError(null);
  } catch (error) {
    showStreamsError(error);
  }
}

function renderStream(view) {
  const { definition: d, state: s } = view;
  const key = streams.current;
  $("sv-title").textContent = `${key.run} / ${key.stream}`;
  const badges = $("sv-badges");
  badges.replaceChildren(el("span", { class: "state state-pending" }, d.direction));
  if (s.closed) badges.append(badge("closed"));
  if (s.legal_hold) badges.append(el("span", { class: "state state-hold", title: s.legal_hold_reason || "" }, "legal hold"));

  const fields = [
    ["latest sequence", s.latest_sequence],
    ["earliest retained", s.earliest_sequence],
    ["total items", s.total_items],
    ["total bytes", bytes(s.total_bytes)],
    ["unread items", s.unread_items],
    ["unread bytes", bytes(s.unread_bytes)],
    ["closed", s.closed ? "yes" : "no"],
    ["legal hold", s.legal_hold ? `on: ${s.legal_hold_reason || "(no reason given)"}` : "off"],
  ];
  const dl = $("sv-state");
  dl.replaceChildren();
  for (const [name, value] of fields) dl.append(el("dt", {}, name), el("dd", { "data-field": name }, value));

  const credit = $("sv-credit");
  credit.replaceChildren(
    bar("unread-items", "Unread items", s.unread_items, d.credit.max_unread_items, String),
    bar("unread-bytes", "Unread bytes", s.unread_bytes, d.credit.max_unread_bytes, bytes),
    bar("total-items", "Total items (quota)", s.total_items, d.credit.max_total_items, String),
    bar("total-bytes", "Total bytes (quota)", s.total_bytes, d.credit.max_total_bytes, bytes),
    el("p", { class: "muted" }, `When unread credit is full: ${d.credit.on_unread_full}` +
      (d.credit.on_unread_full === "block" ? ` (waits up to ${d.credit.block_timeout_ms} ms)` : " (429)")),
  );

  const consumers = $("sv-consumers").querySelector("tbody");
  consumers.replaceChildren();
  if (s.consumers.length === 0) {
    consumers.append(el("tr", {}, el("td", { colSpan: 3, class: "empty" }, "No consumers: nothing holds credit.")));
  }
  for (const c of s.consumers) {
    const lag = s.latest_sequence - c.acked_sequence;
    consumers.append(el("tr", { "data-consumer": c.consumer_id, class: lag > 0 ? "behind" : "" },
      el("td", { class: "mono" }, c.consumer_id),
      el("td", { class: "num" }, c.acked_sequence),
      el("td", { class: "num lag" }, lag),
    ));
  }

  renderDefinition(d);
  renderActions(s);
  // Input streams: their deliveries, in the input delivery view (streams:ops).
  $("sv-deliveries").hidden = d.direction !== "input" || !hasScope("streams:ops");
}

function bar(name, label, value, ceiling, format) {
  const fill = el("span", { class: "fill" });
  const track = el("div", { class: "track" }, fill);
  const box = el("div", { class: `bar bar-${name}`, "data-value": String(value), "data-max": ceiling === null ? "" : String(ceiling) },
    el("div", { class: "bar-label" }, el("span", {}, label), el("span", { class: "bar-text" }, ofCeiling(value, ceiling, format))),
    track);
  if (ceiling === null || ceiling === undefined) {
    box.classList.add("unbounded");
  } else {
    const ratio = ceiling === 0 ? 1 : Math.min(1, value / ceiling);
    fill.style.width = `${(ratio * 100).toFixed(1)}%`; // CSSOM: allowed by the page's CSP
    if (ratio >= 1) box.classList.add("full");
    else if (ratio >= 0.8) box.classList.add("near");
  }
  return box;
}

function list(values, empty) {
  return values && values.length ? values.join(", ") : empty;
}

function renderDefinition(d) {
  const r = d.retention;
  const p = d.placement;
  const groups = [
    ["Content", [
      ["content class", d.content_class], ["media type", d.media_type],
      ["schema", d.schema || "none"], ["consumers", list(d.consumers, "none")],
    ]],
    ["Retention", [
      ["max age", r.max_age_seconds === null ? "no limit" : duration(r.max_age_seconds)],
      ["max records", r.max_records === null ? "no limit" : r.max_records],
    ]],
    ["Redaction", [["redacted fields", list(d.redaction.json_pointers, "none")]]],
    ["Credit", [
      ["max unread items", d.credit.max_unread_items ?? "no ceiling"],
      ["max unread bytes", d.credit.max_unread_bytes === null ? "no ceiling" : bytes(d.credit.max_unread_bytes)],
      ["max total items", d.credit.max_total_items ?? "no ceiling"],
      ["max total bytes", d.credit.max_total_bytes === null ? "no ceiling" : bytes(d.credit.max_total_bytes)],
    ]],
    ["Placement", [
      ["metadata home", p.metadata_home || "this deployment"],
      ["metadata replicas", list(p.metadata_replicas, "none")],
      ["object regions", list(p.object_regions, "none")],
      ["client egress regions", list(p.client_egress_regions, "none")],
      ["log region", p.log_region || "default"],
    ]],
    ["Authorization", [
      ["readers", list(d.authorization.readers, "nobody")],
      ["writers", list(d.authorization.writers, "nobody")],
    ]],
  ];
  const box = $("sv-definition");
  box.replaceChildren();
  for (const [title, rows] of groups) {
    const dl = el("dl", {});
    for (const [name, value] of rows) dl.append(el("dt", {}, name), el("dd", { "data-def": name }, value));
    box.append(el("div", { class: `def-group def-${title.toLowerCase()}` }, el("h3", {}, title), dl));
  }
  $("sv-definition-json").textContent = JSON.stringify(d, null, 2);
}

// ---- actions (streams:admin) ---------------------------------------------------------

function renderActions(s) {
  const box = $("sv-actions");
  const wanted = hasScope("streams:admin") ? (s.closed ? "c" : "o") + (s.legal_hold ? "h" : "n") : "-";
  if (box.dataset.shown === wanted) return; // keep focus on a button across polls
  box.dataset.shown = wanted;
  box.replaceChildren();
  if (wanted === "-") return;
  if (!s.closed) {
    box.append(el("button", { id: "act-close", type: "button", class: "danger", onclick: confirmClose }, "Close stream…"));
  }
  if (s.legal_hold) {
    box.append(el("button", { id: "act-hold-clear", type: "button", onclick: () => confirmHold(false) }, "Clear legal hold…"));
  } else {
    box.append(el("button", { id: "act-hold-set", type: "button", onclick: () => confirmHold(true) }, "Set legal hold…"));
  }
}

let confirmAction = null;

function openConfirm(title, text, withReason, action) {
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  $("confirm-reason-label").hidden = !withReason;
  $("confirm-reason").value = "";
  $("confirm-error").hidden = true;
  $("confirm-error").textContent = "";
  $("confirm-ok").disabled = false;
  confirmAction = action;
  $("confirm").showModal();
  (withReason ? $("confirm-reason") : $("confirm-cancel")).focus();
}

function confirmClose() {
  const key = streams.current;
  openConfirm(
    "Close this stream?",
    `Close ${key.run} / ${key.stream}: appends will be refused from now on and subscribers end once they have everything. It cannot be reopened.`,
    false,
    () => api(`${streamPath(key.run, key.stream)}/close`, { method: "POST" }),
  );
}

function confirmHold(enabled) {
  const key = streams.current;
  openConfirm(
    enabled ? "Set legal hold?" : "Clear legal hold?",
    enabled
      ? `While on, retention prunes nothing of ${key.run} / ${key.stream}. Say why.`
      : `Retention applies to ${key.run} / ${key.stream} again.`,
    enabled,
    () => {
      const reason = $("confirm-reason").value.trim();
      return api(`${streamPath(key.run, key.stream)}/legal-hold`, {
        method: "PUT",
        body: JSON.stringify({ enabled, reason: enabled && reason ? reason : null }),
      });
    },
  );
}

async function runConfirmed(event) {
  event.preventDefault();
  if (!confirmAction) return;
  $("confirm-ok").disabled = true;
  try {
    await confirmAction();
    $("confirm").close();
    confirmAction = null;
    await loadStream();
  } catch (error) {
    $("confirm-error").textContent = `Refused: ${problemText(error)}`;
    $("confirm-error").hidden = false;
    $("confirm-ok").disabled = false;
  }
}

// ---- records -------------------------------------------------------------------------

function payloadCell(record, compact) {
  const cell = el("td", { class: "payload" });
  // textContent only: a payload is never markup.
  const text = compact ? JSON.stringify(record.payload) : JSON.stringify(record.payload, null, 2);
  cell.append(el("pre", { class: compact ? "payload-text compact" : "payload-text", textContent: text }));
  if (record.object) {
    const o = record.object;
    cell.append(el("button", {
      type: "button", class: "quiet object-link",
      title: `object ${o.object_id}`,
      onclick: () => downloadObject(o),
    }, `Open object (${o.content_type || "bytes"}, ${bytes(o.size)})`));
  }
  return cell;
}

function recordRow(record, compact) {
  return el("tr", { "data-seq": String(record.sequence) },
    el("td", { class: "num" }, record.sequence),
    el("td", { title: stamp(record.appended_at) }, stamp(record.appended_at)),
    el("td", { class: "num" }, record.size),
    payloadCell(record, compact),
  );
}

async function downloadObject(o) {
  const key = streams.current;
  try {
    // With the Authorization header, so not a plain link: fetched, then handed over.
    const response = await fetch(`${streamPath(key.run, key.stream)}/objects/${encodeURIComponent(o.object_id)}/content`, {
      headers: { Authorization: `Bearer ${token()}` }, cache: "no-store",
    });
    if (!response.ok) {
      let problem = null;
      try { problem = await response.json(); } catch (_) { problem = null; }
      throw new ApiError(response.status, problem);
    }
    const url = URL.createObjectURL(await response.blob());
    const a = el("a", { href: url, download: o.object_id });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
  } catch (error) {
    showStreamsError(error);
  }
}

function prunedText(earliest) {
  return `History before ${earliest} was pruned; start from ${earliest}.`;
}

async function readRecords(cursor) {
  const key = streams.current;
  const limit = $("r-limit").value.trim() || "50";
  const notice = $("r-notice");
  notice.hidden = true;
  notice.replaceChildren();
  $("r-cursor").value = String(cursor);
  try {
    const page = await api(`${streamPath(key.run, key.stream)}/records${query({ cursor, limit })}`);
    const body = $("records").querySelector("tbody");
    body.replaceChildren();
    if (page.records.length === 0) {
      body.append(el("tr", {}, el("td", { colSpan: 4, class: "empty" }, `No records after ${cursor}.`)));
    }
    for (const record of page.records) body.append(recordRow(record));
    const more = page.next_cursor < page.latest_sequence;
    streams.recordsNext = more ? page.next_cursor : null;
    $("r-next").disabled = !more;
    $("r-page-info").textContent = page.records.length
      ? `sequences ${page.records[0].sequence}–${page.next_cursor} of ${page.earliest_sequence}–${page.latest_sequence}`
      : page.latest_sequence === 0 ? "no records yet" : `retained: ${page.earliest_sequence}–${page.latest_sequence}`;
    showStreamsError(null);
  } catch (error) {
    if (error.status === 410 && error.code === "cursor_expired") {
      const earliest = error.problem.earliest_sequence;
      notice.append(
        el("span", { class: "pruned" }, prunedText(earliest)), " ",
        el("button", { type: "button", id: "r-start-earliest", onclick: () => readRecords(earliest - 1) }, `Start from ${earliest}`),
      );
      notice.hidden = false;
      $("records").querySelector("tbody").replaceChildren();
    } else if (error.status === 400) {
      notice.textContent = problemText(error);
      notice.hidden = false;
    } else {
      showStreamsError(error);
    }
  }
}

// ---- the live tail (SSE over fetch, so that the token goes in a header) ----------------

function setConnection(name, text) {
  const box = $("tail-state");
  box.dataset.state = name;
  box.textContent = text;
  $("tail-toggle").textContent = tail.wanted ? "Pause" : tail.lastId === null ? "Start tail" : "Resume";
}

function stopTail() {
  tail.wanted = false;
  if (tail.controller) tail.controller.abort();
  tail.controller = null;
  clearInterval(tail.sparkTimer);
  tail.sparkTimer = null;
}

function toggleTail() {
  if (tail.wanted) {
    stopTail();
    setConnection("paused", `paused after ${tail.lastId ?? "nothing"}`);
    return;
  }
  const key = streams.current;
  const keyText = `${key.run}/${key.stream}`;
  if (tail.key !== keyText) {
    tail.key = keyText;
    tail.lastId = null;
  }
  tail.wanted = true;
  clearInterval(tail.sparkTimer);
  tail.sparkTimer = setInterval(renderSpark, 1000);
  runTail(key);
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// One SSE event block -> {event, data, id}.
function parseEvent(block) {
  const event = { event: "message", data: [], id: null };
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") event.event = value;
    else if (field === "data") event.data.push(value);
    else if (field === "id") event.id = value;
  }
  return { event: event.event, data: event.data.join("\n"), id: event.id };
}

async function runTail(key) {
  let backoff = 250;
  while (tail.wanted && streams.current === key) {
    const controller = new AbortController();
    tail.controller = controller;
    const resuming = tail.lastId !== null;
    setConnection("connecting", resuming ? `reconnecting after ${tail.lastId}…` : "connecting…");
    const headers = { Authorization: `Bearer ${token()}`, Accept: "text/event-stream" };
    let url = `${streamPath(key.run, key.stream)}/subscribe`;
    if (resuming) headers["Last-Event-ID"] = String(tail.lastId);
    else url += `?cursor=${streams.view ? streams.view.state.latest_sequence : 0}`;
    let ended = false;
    try {
      const response = await fetch(url, { headers, signal: controller.signal, cache: "no-store" });
      if (!response.ok) {
        let problem = null;
        try { problem = await response.json(); } catch (_) { problem = null; }
        const error = new ApiError(response.status, problem);
        if (response.status === 410 && error.code === "cursor_expired") {
          tail.wanted = false;
          setConnection("error", prunedText(error.problem.earliest_sequence));
          return;
        }
        if (response.status < 500) {
          tail.wanted = false;
          setConnection("error", problemText(error));
          return;
        }
        throw error;
      }
      setConnection("live", resuming ? `live (resumed after ${tail.lastId})` : `live from sequence ${streams.view ? streams.view.state.latest_sequence + 1 : 1}`);
      backoff = 250;
      if (resuming) stateSoon(); // the server is back: refresh what the poll showed stale
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value.replace(/\r\n?/g, "\n");
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          const message = parseEvent(block);
          if (message.event === "record") {
            onTailRecord(JSON.parse(message.data));
          } else if (message.event === "end") {
            ended = true;
            setConnection("ended", `ended: the stream is closed (last sequence ${JSON.parse(message.data).last_sequence})`);
          } else if (message.event === "error") {
            const problem = JSON.parse(message.data);
            ended = true;
            setConnection("error", problem.code === "cursor_expired" ? prunedText(problem.earliest_sequence) : `${problem.detail} [${problem.code}]`);
          } else if (message.event === "reconnect") {
            setConnection("connecting", `server asked to reconnect (${JSON.parse(message.data).reason})`);
          }
        }
        if (ended) break;
      }
    } catch (error) {
      if (controller.signal.aborted) return; // paused or left
      setConnection("down", `connection lost (${error.message}); retrying`);
    }
    if (ended) {
      tail.wanted = false;
      $("tail-toggle").textContent = "Resume";
      return;
    }
    if (!tail.wanted) return;
    await sleep(backoff);
    backoff = Math.min(backoff * 2, 4000);
  }
}

// While tailing, the state, credit and consumers follow the records shown (one read at
// most every half second), not only the 3 s poll.
function stateSoon() {
  if (tail.stateTimer) return;
  tail.stateTimer = setTimeout(() => { tail.stateTimer = null; loadStream(); }, 500);
}

function onTailRecord(record) {
  // Sequences come once and in order; a record at or below the last one shown would be
  // a duplicate and is not shown again.
  if (tail.lastId !== null && record.sequence <= tail.lastId) return;
  tail.lastId = record.sequence;
  stateSoon();
  const body = $("tail").querySelector("tbody");
  body.append(recordRow(record, true));
  while (body.rows.length > TAIL_MAX_ROWS) body.deleteRow(0);
  const wrap = body.closest(".tail-wrap");
  wrap.scrollTop = wrap.scrollHeight;
  tail.arrivals.push(Date.parse(record.appended_at) || Date.now());
  if (tail.arrivals.length > 10_000) tail.arrivals.splice(0, tail.arrivals.length - 10_000);
  if (Date.now() - tail.sparkAt > 250) renderSpark(); // else the 1 s tick draws it

}

function renderSpark() {
  const now = Date.now();
  tail.sparkAt = now;
  const counts = new Array(SPARK_SECONDS).fill(0);
  for (const at of tail.arrivals) {
    const age = Math.floor((now - at) / 1000);
    if (age >= 0 && age < SPARK_SECONDS) counts[SPARK_SECONDS - 1 - age] += 1;
  }
  const peak = Math.max(1, ...counts);
  const points = counts.map((n, i) => `${(i * 120) / (SPARK_SECONDS - 1)},${(22 - (n / peak) * 20).toFixed(1)}`);
  $("tail-spark").querySelector("polyline").setAttribute("points", points.join(" "));
  const last10 = counts.slice(-10).reduce((a, b) => a + b, 0) / 10;
  $("tail-rate").textContent = `${last10.toFixed(1)} appends/s (10 s) · peak ${peak}/s`;
}

// ---- wiring -------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("s-filters").addEventListener("submit", (event) => {
    event.preventDefault();
    streams.filters = {
      run_prefix: $("s-run").value.trim(),
      direction: $("s-direction").value,
      closed: $("s-closed").value,
    };
    streams.pageTokens = [null];
    streams.pageIndex = 0;
    loadStreams();
  });
  $("s-next-page").addEventListener("click", () => {
    if (!streams.nextPage) return;
    streams.pageTokens = streams.pageTokens.slice(0, streams.pageIndex + 1).concat([streams.nextPage]);
    streams.pageIndex += 1;
    loadStreams();
  });
  $("s-first-page").addEventListener("click", () => {
    streams.pageTokens = [null];
    streams.pageIndex = 0;
    loadStreams();
  });
  $("r-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const cursor = Number.parseInt($("r-cursor").value, 10);
    readRecords(Number.isFinite(cursor) && cursor >= 0 ? cursor : 0);
  });
  $("r-next").addEventListener("click", () => {
    if (streams.recordsNext !== null) readRecords(streams.recordsNext);
  });
  $("tail-toggle").addEventListener("click", toggleTail);
  $("tail-clear").addEventListener("click", () => {
    $("tail").querySelector("tbody").replaceChildren();
    tail.arrivals = [];
    renderSpark();
  });
  $("confirm-form").addEventListener("submit", runConfirmed);
  $("confirm-cancel").addEventListener("click", () => { confirmAction = null; $("confirm").close(); });
  $("sv-deliveries-link").addEventListener("click", (event) => {
    // The input delivery view, filtered to this stream.
    event.preventDefault();
    const key = streams.current;
    $("f-run").value = key.run;
    $("f-stream").value = key.stream;
    $("f-state").value = "";
    $("f-age").value = "";
    location.hash = "#deliveries";
    applyFilters();
  });
});
