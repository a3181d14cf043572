// The vitest entry of the Durable Streams conformance suite, copied by run-conformance.sh
// next to the installed packages so that they resolve. It calls the suite's documented
// programmatic API, runConformanceTests({ baseUrl }): the package's own CLI finds no test
// file when it is installed under node_modules (durable-streams/durable-streams#284).
//
// Environment (run-conformance.sh sets it):
//   DS_BASE_URL                the base URL; the suite appends /v1/stream/<name>
//   DS_HEADERS                 a JSON object of headers (a bearer token) added to every
//                              request to DS_BASE_URL's origin
//   DS_LONG_POLL_TIMEOUT_MS    the server's long-poll timeout (the suite assumes 20000)
//   DS_SUBSCRIPTIONS           "1" also runs the opt-in subscription tests
import { Agent, setGlobalDispatcher } from "undici"
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

const baseUrl = (process.env.DS_BASE_URL || "").replace(/\/+$/, "")
if (!baseUrl) throw new Error("DS_BASE_URL is not set (run through run-conformance.sh)")

const extra = JSON.parse(process.env.DS_HEADERS || "{}")
if (Object.keys(extra).length > 0) {
  // The suite calls the global fetch() and the @durable-streams/client (also fetch); both go
  // through the global undici dispatcher, so one wrapper adds the headers everywhere. Only
  // requests to the server under test get them (not the suite's local webhook receiver).
  const origin = new URL(baseUrl).origin
  const lower = Object.keys(extra).map((k) => k.toLowerCase())
  const withExtra = (headers) => {
    if (headers == null) return { ...extra }
    if (Array.isArray(headers)) {
      // flat [name, value, name, value, ...] or [[name, value], ...]
      const flat = headers.length && Array.isArray(headers[0]) ? headers.flat() : [...headers]
      const out = []
      for (let i = 0; i < flat.length; i += 2) {
        if (!lower.includes(String(flat[i]).toLowerCase())) out.push(flat[i], flat[i + 1])
      }
      for (const [k, v] of Object.entries(extra)) out.push(k, v)
      return out
    }
    const out = {}
    for (const [k, v] of Object.entries(headers)) if (!lower.includes(k.toLowerCase())) out[k] = v
    return { ...out, ...extra }
  }
  class HeaderAgent extends Agent {
    dispatch(opts, handler) {
      let o = opts.origin
      try { o = new URL(String(opts.origin)).origin } catch { /* leave as is */ }
      if (o === origin) opts = { ...opts, headers: withExtra(opts.headers) }
      return super.dispatch(opts, handler)
    }
  }
  setGlobalDispatcher(new HeaderAgent())
}

const options = { baseUrl }
if (process.env.DS_LONG_POLL_TIMEOUT_MS) options.longPollTimeoutMs = Number(process.env.DS_LONG_POLL_TIMEOUT_MS)
if (process.env.DS_SUBSCRIPTIONS === "1") options.subscriptions = true
runConformanceTests(options)
