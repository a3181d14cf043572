#!/usr/bin/env bash
# Runs the Durable Streams server conformance suite (npm package
# @durable-streams/server-conformance-tests, pinned by package-lock.json in this folder)
# against a server, and prints pass/fail/skip per test group, the unexpected failures, and
# a last line "N passed, M failed". tests/ds/test_conformance.py runs it against a real
# `ductor-streams serve`; docs/durable-streams.md says how to run it by hand.
#
# Usage:
#   run-conformance.sh BASE_URL [--grep PATTERN] [--header 'Name: value']...
#                      [--long-poll-timeout-ms MS] [--subscriptions] [--allow-fail FILE]
#                      [--json FILE] [--verbose]
#   run-conformance.sh --list [--grep PATTERN]        test groups and their sizes; no server
#
#   BASE_URL   the suite requests BASE_URL/v1/stream/<name>; for ductor-streams that is a
#              run's DS base, {server}/api/workflow-streams/runs/{run}/ds
#   --grep     only tests whose full name ("Group Subgroup test name") matches the regular
#              expression (vitest --testNamePattern), e.g. --grep '^SSE Mode'
#   --header   a header added to every request to BASE_URL's origin (repeatable), e.g.
#              --header "Authorization: Bearer $TOKEN": the suite sends no credentials
#   --long-poll-timeout-ms  the server's long-poll timeout when it is not the suite's 20000
#   --subscriptions         also run the suite's opt-in __ds/subscriptions tests
#   --allow-fail FILE       tests that may fail (full names, one a line, # comments), e.g.
#                           allowed-failures-tier1.txt: the exit status then counts only
#                           the failures outside it
#   --json FILE             keep a copy of vitest's JSON report there
#   --verbose               show vitest's per-test output instead of the summary only
#
# Environment:
#   DS_CONFORMANCE_DIR      where the packages are installed and runs keep their logs
#                           (default /tmp/ds-conformance); `npm ci --ignore-scripts` runs
#                           again only when package.json or package-lock.json change
#   DS_CONFORMANCE_TIMEOUT  a limit for the whole run in seconds (default 1800)
#
# Exit status: 0 when every selected test passed, or failed only as allowed; 1 when some
# failed (or none ran); 2 bad usage, a failed install or an unreachable server; 3 when the
# suite wrote no report.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="${DS_CONFORMANCE_DIR:-/tmp/ds-conformance}"
LIMIT="${DS_CONFORMANCE_TIMEOUT:-1800}"

usage() { sed -n '2,36p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }
die() { echo "run-conformance: $*" >&2; exit 2; }

BASE_URL="" GREP="" LIST=0 JSON_OUT="" VERBOSE=0 LP_TIMEOUT="" SUBS=0 ALLOW=""
HEADERS_JSON="{}"
while [ $# -gt 0 ]; do
  case "$1" in
    --grep) [ $# -ge 2 ] || die "--grep needs a pattern"; GREP="$2"; shift 2 ;;
    --grep=*) GREP="${1#--grep=}"; shift ;;
    --header)
      [ $# -ge 2 ] || die "--header needs 'Name: value'"
      case "$2" in *:*) ;; *) die "--header needs 'Name: value', got: $2" ;; esac
      HEADERS_JSON=$(node -e 'const [j, h] = process.argv.slice(1); const o = JSON.parse(j)
        const i = h.indexOf(":"); o[h.slice(0, i).trim()] = h.slice(i + 1).trim(); console.log(JSON.stringify(o))' "$HEADERS_JSON" "$2")
      shift 2 ;;
    --long-poll-timeout-ms) [ $# -ge 2 ] || die "--long-poll-timeout-ms needs a number"; LP_TIMEOUT="$2"; shift 2 ;;
    --subscriptions) SUBS=1; shift ;;
    --allow-fail) [ $# -ge 2 ] && [ -f "$2" ] || die "--allow-fail needs an existing file"; ALLOW="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"; shift 2 ;;
    --json) [ $# -ge 2 ] || die "--json needs a file"; JSON_OUT="$2"; shift 2 ;;
    --list) LIST=1; shift ;;
    --verbose) VERBOSE=1; shift ;;
    -h|--help) usage ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) [ -z "$BASE_URL" ] || die "more than one BASE_URL"; BASE_URL="${1%/}"; shift ;;
  esac
done
[ "$LIST" = 1 ] || [ -n "$BASE_URL" ] || usage
[ -z "$BASE_URL" ] || [[ "$BASE_URL" =~ ^https?://[^/]+ ]] || die "BASE_URL must be an http(s) URL, got: $BASE_URL"
[ -z "$LP_TIMEOUT" ] || [[ "$LP_TIMEOUT" =~ ^[0-9]+$ ]] || die "--long-poll-timeout-ms must be an integer"

command -v node >/dev/null && command -v npm >/dev/null || die "node and npm are needed (Node 20 or newer)"
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' \
  || die "Node $(node --version) is too old: vitest 4 needs Node 20 or newer"

# ------------------------------------------------------------------ install (idempotent, pinned)
mkdir -p "$DIR"
install() {
  local want
  want=$(cat "$HERE/package.json" "$HERE/package-lock.json" | sha256sum | cut -d' ' -f1)
  if [ -f "$DIR/.installed" ] && [ "$(cat "$DIR/.installed")" = "$want" ] \
     && [ -d "$DIR/node_modules/@durable-streams/server-conformance-tests" ]; then
    return 0
  fi
  echo "installing the pinned conformance suite into $DIR (npm ci) ..." >&2
  cp "$HERE/package.json" "$HERE/package-lock.json" "$DIR/"
  if ! (cd "$DIR" && npm ci --no-audit --no-fund --ignore-scripts) >"$DIR/npm-ci.log" 2>&1; then
    tail -20 "$DIR/npm-ci.log" >&2
    die "npm ci failed (full log: $DIR/npm-ci.log)"
  fi
  echo "$want" >"$DIR/.installed"
}
if command -v flock >/dev/null; then
  exec 9>"$DIR/.install.lock"; flock 9; install; flock -u 9
else
  install
fi
cp "$HERE/conformance.test.mjs" "$DIR/conformance.test.mjs"
VER=$(node -p 'require(process.argv[1]).version' "$DIR/node_modules/@durable-streams/server-conformance-tests/package.json")
VITEST_VER=$(node -p 'require(process.argv[1]).version' "$DIR/node_modules/vitest/package.json")

RUN_DIR=$(mktemp -d "$DIR/run.XXXXXX")
# keep the 20 newest run folders (logs and reports)
ls -dt "$DIR"/run.* 2>/dev/null | tail -n +21 | xargs -r rm -rf
GREP_ARGS=()
[ -z "$GREP" ] || GREP_ARGS=(-t "$GREP")

# ------------------------------------------------------------------ --list
# A collect-only run: a test-name pattern that matches nothing marks every test skipped, and
# the JSON report still carries each test's group path. No request leaves this machine.
if [ "$LIST" = 1 ]; then
  (cd "$DIR" && DS_BASE_URL="http://127.0.0.1:9" npx --no-install vitest run conformance.test.mjs \
      -t '^(?!)' --passWithNoTests --reporter=json --outputFile.json="$RUN_DIR/collect.json") \
      >"$RUN_DIR/collect.log" 2>&1 || { cat "$RUN_DIR/collect.log" >&2; die "collecting the suite failed"; }
  echo "@durable-streams/server-conformance-tests $VER (vitest $VITEST_VER)${GREP:+, --grep '$GREP'}"
  node "$HERE/summarize.mjs" list "$RUN_DIR/collect.json" "$GREP"
  exit 0
fi

# ------------------------------------------------------------------ reachability
node -e 'fetch(process.argv[1], { signal: AbortSignal.timeout(5000) }).then(() => process.exit(0),
  (e) => { console.error(String(e.cause?.message ?? e.message)); process.exit(1) })' "$BASE_URL/v1/stream/" \
  2>"$RUN_DIR/reach.err" || die "cannot reach $BASE_URL: $(cat "$RUN_DIR/reach.err")"

# ------------------------------------------------------------------ run
echo "@durable-streams/server-conformance-tests $VER (vitest $VITEST_VER) against $BASE_URL${GREP:+, --grep '$GREP'}"
echo "log and report: $RUN_DIR"
REPORT="$RUN_DIR/report.json"
run_suite() {
  cd "$DIR" && DS_BASE_URL="$BASE_URL" DS_HEADERS="$HEADERS_JSON" DS_LONG_POLL_TIMEOUT_MS="$LP_TIMEOUT" \
    DS_SUBSCRIPTIONS="$SUBS" timeout "$LIMIT" npx --no-install vitest run conformance.test.mjs \
    --reporter="$1" --reporter=json --outputFile.json="$REPORT" \
    --maxWorkers=1 --no-file-parallelism "${GREP_ARGS[@]}"
}
set +e
if [ "$VERBOSE" = 1 ]; then
  (run_suite verbose) 2>&1 | tee "$RUN_DIR/vitest.log"; rc=${PIPESTATUS[0]}
else
  (run_suite dot) >"$RUN_DIR/vitest.log" 2>&1; rc=$?
fi
set -e
[ "$rc" != 124 ] || echo "the suite ran past DS_CONFORMANCE_TIMEOUT=${LIMIT}s and was stopped" >&2
if [ ! -s "$REPORT" ]; then
  sed 's/\x1b\[[0-9;]*m//g' "$RUN_DIR/vitest.log" | tail -30 >&2
  echo "run-conformance: the suite produced no report (vitest exit $rc; log: $RUN_DIR/vitest.log)" >&2
  exit 3
fi
[ -z "$JSON_OUT" ] || cp "$REPORT" "$JSON_OUT"
echo
set +e
DS_SUMMARY_HIDE_IDLE=$([ -n "$GREP" ] && echo 1 || echo 0) DS_ALLOW_FAIL="$ALLOW" \
  node "$HERE/summarize.mjs" report "$REPORT" "$RUN_DIR/vitest.log" | tee "$RUN_DIR/summary.txt"
exit "${PIPESTATUS[0]}"
