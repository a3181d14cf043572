// Summaries for run-conformance.sh.
//   node summarize.mjs report <vitest-json-report> [vitest-log]
//                                                    per-group pass/fail/skip table, the failed
//                                                    tests with their first error line (from the
//                                                    log where the report has none, e.g. for
//                                                    timeouts), then the final line
//                                                    "N passed, M failed"
//   node summarize.mjs list <vitest-json-report> [PATTERN]
//                                                    per-group test counts, from a collect-only
//                                                    run (every test skipped); PATTERN selects
//                                                    by full name as vitest's -t does
// Groups are the suite's top-level describe blocks; a second level is shown indented where
// the suite has one (Stream Closure, Property-Based Tests).
import { readFileSync } from "node:fs"

const [mode, file] = process.argv.slice(2)
const data = JSON.parse(readFileSync(file, "utf8"))

function table(rows, cols) {
  // rows: [{ name, depth, ...counts }]
  const w = Math.max(5, ...rows.map((r) => r.name.length + 2 * r.depth))
  const head = "group".padEnd(w) + cols.map((c) => c.padStart(6)).join("")
  console.log(head)
  console.log("-".repeat(head.length))
  for (const r of rows) {
    console.log(("  ".repeat(r.depth) + r.name).padEnd(w) + cols.map((c) => String(r[c] ?? 0).padStart(6)).join(""))
  }
}

function grouped(items, pathOf, statusOf, cols, hideIdle = false) {
  // Top-level groups in first-seen order; second-level subgroups listed under their parent.
  const top = new Map()
  for (const it of items) {
    const path = pathOf(it)
    const g = path[0] ?? "(top level)"
    if (!top.has(g)) top.set(g, { name: g, depth: 0, subs: new Map() })
    const t = top.get(g)
    const s = statusOf(it)
    t[s] = (t[s] ?? 0) + 1
    if (path.length > 2) {
      if (!t.subs.has(path[1])) t.subs.set(path[1], { name: path[1], depth: 1 })
      const u = t.subs.get(path[1])
      u[s] = (u[s] ?? 0) + 1
    }
  }
  const rows = []
  for (const t of top.values()) {
    if (hideIdle && !t.pass && !t.fail) continue
    rows.push(t)
    for (const u of t.subs.values()) rows.push(u)
  }
  table(rows, cols)
  return top
}

const allTests = (d) => (d.testResults ?? []).flatMap((f) => f.assertionResults ?? [])
const pathOf = (t) => [...(t.ancestorTitles ?? []), t.title]

if (mode === "list") {
  const re = process.argv[4] ? new RegExp(process.argv[4]) : null
  const tests = allTests(data).filter((t) => !re || re.test(pathOf(t).join(" ")))
  const top = grouped(tests, pathOf, () => "tests", ["tests"])
  const subs = tests.filter((t) => t.ancestorTitles?.[0] === "Reserved subscription APIs").length
  console.log(`${tests.length} tests in ${top.size} groups` + (subs ? `; the ${subs} "Reserved subscription APIs" tests run only with --subscriptions` : ""))
} else if (mode === "report") {
  const tests = allTests(data)
  const statusOf = (t) => (t.status === "passed" ? "pass" : t.status === "failed" ? "fail" : "skip")
  // Under --grep (DS_SUMMARY_HIDE_IDLE=1) groups with nothing run are left out of the table.
  grouped(tests, pathOf, statusOf, ["pass", "fail", "skip"], process.env.DS_SUMMARY_HIDE_IDLE === "1")
  const failed = tests.filter((t) => t.status === "failed")
  // The JSON report says only "STACK_TRACE_ERROR" for a timeout; the console log has the text.
  const fromLog = new Map()
  if (process.argv[4]) {
    const lines = readFileSync(process.argv[4], "utf8").replace(/\x1b\[[0-9;]*m/g, "").split("\n")
    lines.forEach((l, i) => {
      const m = l.match(/^ FAIL\s+\S+ > (.*)$/)
      if (m && !fromLog.has(m[1])) fromLog.set(m[1], (lines.slice(i + 1).find((x) => x.trim()) ?? "").trim())
    })
  }
  // DS_ALLOW_FAIL names a file of tests allowed to fail (full names "Group > Sub > test", one a
  // line, # comments): what the server under test refuses on purpose.
  const allowed = new Set()
  if (process.env.DS_ALLOW_FAIL) {
    for (const l of readFileSync(process.env.DS_ALLOW_FAIL, "utf8").split("\n")) if (l.trim() && !l.startsWith("#")) allowed.add(l.trim())
  }
  const unexpected = failed.filter((t) => !allowed.has(pathOf(t).join(" > ")))
  if (unexpected.length) {
    console.log(allowed.size ? `\nunexpected failures (not in the allowed list):` : `\nfailed tests:`)
    for (const t of unexpected) {
      const name = pathOf(t).join(" > ")
      let msg = String((t.failureMessages ?? [])[0] ?? "").replace(/\x1b\[[0-9;]*m/g, "").split("\n").find((l) => l.trim()) ?? ""
      if ((!msg || msg.includes("STACK_TRACE_ERROR")) && fromLog.get(name)) msg = fromLog.get(name)
      console.log(`  - ${name}\n      ${msg.trim().slice(0, 200)}`)
    }
  }
  if (allowed.size) {
    const passedAllowed = tests.filter((t) => t.status === "passed" && allowed.has(pathOf(t).join(" > "))).length
    console.log(`\nallowed list: ${allowed.size} tests; ${failed.length - unexpected.length} of them failed, ${passedAllowed} passed; unexpected failures: ${unexpected.length}`)
  }
  // A file that failed to load (syntax error, import failure) has no assertion results.
  for (const f of data.testResults ?? []) {
    if (f.status === "failed" && !(f.assertionResults ?? []).length) console.log(`\nthe test file failed to run: ${String(f.message ?? "").split("\n")[0]}`)
  }
  const passed = tests.filter((t) => t.status === "passed").length
  const skipped = tests.length - passed - failed.length
  console.log(`\n${skipped} skipped` + (process.env.DS_SUMMARY_HIDE_IDLE === "1" ? " or not selected" : ""))
  console.log(`${passed} passed, ${failed.length} failed`)
  process.exitCode = unexpected.length || (!passed && !failed.length) ? 1 : 0
} else {
  console.error("usage: node summarize.mjs report|list FILE")
  process.exit(2)
}
