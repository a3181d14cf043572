// The test page of tests/browser/test_ds_client_browser.py, bundled with the pinned
// @durable-streams/client at test time. It runs on an origin of its own and reaches a
// run's Durable Streams endpoint cross-origin, with a bearer token:
// - follows the run's "output" stream live from the start, one <li> per JSON item;
// - window.appendInput(value) appends one JSON value to the run's "input" stream.
// The hash carries the settings (#base=<run's DS base URL>&token=<JWT>): a fragment is
// never sent to the page's own server.
import { DurableStream, stream } from "@durable-streams/client"

const settings = new URLSearchParams(location.hash.slice(1))
const base = settings.get("base")
// As the README shows: a function, called for every request (a fresh token each time).
const headers = { Authorization: () => `Bearer ${settings.get("token")}` }
const status = document.getElementById("status")
const records = document.getElementById("records")

function show(state, text) {
  status.dataset.state = state
  status.textContent = text ?? state
}

window.appendInput = async (value) => {
  const input = new DurableStream({
    url: `${base}/v1/stream/input`,
    headers,
    contentType: "application/json",
  })
  await input.append(JSON.stringify(value))
}

async function follow() {
  const response = await stream({
    url: `${base}/v1/stream/output`,
    headers,
    offset: "-1",
    live: "sse",
    warnOnHttp: false,
    // Any error ends the page's following: the test wants to see it, not a retry.
    onError: (error) => {
      show("error", `error: ${error}`)
    },
  })
  response.subscribeJson((batch) => {
    for (const item of batch.items) {
      const li = document.createElement("li")
      li.textContent = JSON.stringify(item)
      records.append(li)
    }
    records.dataset.offset = batch.offset
    if (batch.streamClosed) {
      show("closed")
    } else if (batch.upToDate) {
      show("following")
    }
  })
}

follow().catch((error) => show("error", `error: ${error}`))
