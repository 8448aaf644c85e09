#!/usr/bin/env bash
# The browser tests: `run.sh BINARY`. It installs Debian's chromium when /usr/bin/chromium
# is missing, installs playwright-core and @xterm/xterm (package.json) into a temporary
# folder with npm, then runs terminal-test.js (the terminal WebSocket) and events-test.js
# (EventSource, a restart of serve, a followed log, CORS) against `BINARY serve`, then
# installs Vite into a folder of its own and runs preview-test.js (the preview gate in front
# of a real Vite dev server: the exchange, the cookie, HMR, revoke).
# Where chromium or the packages cannot be installed, it says so and skips (exit 0); under
# CI (CI=true, where it runs as root with apt) a failed install fails instead.
# $ARTIFACTS names the screenshots' folder (default /tmp/gitterm-browser-test).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:?usage: run.sh BINARY}"
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
start=$(date +%s%N)
# Skips where the tools cannot be had; in CI, where they can, that is a failure.
skip() {
    if [ "${CI:-}" = true ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "browser-test: FAILED: $1 (CI, as root with apt-get: the browser tests must run)"
        exit 1
    fi
    echo "browser-test: skipped: $1"
    exit 0
}
if ! command -v node >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        { timeout 600 apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq nodejs npm; } >/dev/null 2>&1 || true
    fi
    command -v node >/dev/null 2>&1 || skip "no node (apt-get install -y nodejs npm)"
fi
export CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$CHROMIUM" ]; then
    if command -v apt-get >/dev/null 2>&1; then
        { timeout 600 apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq chromium; } >/dev/null 2>&1 || true
    fi
    if [ ! -x "$CHROMIUM" ]; then
        skip "chromium could not be installed (apt-get install -y chromium)"
    fi
fi
modules="$(mktemp -d)"
cleanup() {
    # Each test cancels its job and stops its server itself, and removes its state file
    # once the job has ended; a state file left means it could not (it was killed): it
    # holds the server's pid and address, the job's id and process group, and its folder.
    for state_file in "$modules"/state-*; do
        if [ -s "$state_file" ]; then
            read -r pid addr job pgid work <"$state_file" || true
            if [ "${job:--}" != - ] && [ -r "${work:-}/home/agent.token" ] && command -v curl >/dev/null 2>&1; then
                curl -s -m 15 -o /dev/null -X POST -H "Authorization: Bearer $(cat "$work/home/agent.token")" \
                    "http://$addr/v1/jobs/$job/cancel" || true
            fi
            case "${pgid:--}" in -|0|1) ;; *) kill -KILL -- "-$pgid" 2>/dev/null || true ;; esac
            if [ "${pid:--}" != - ]; then kill "$pid" 2>/dev/null || true; fi
            case "${work:-}" in */gitterm-browser-*) rm -rf "$work" ;; esac
        fi
    done
    rm -rf "$modules"
}
trap cleanup EXIT
cp "$here/package.json" "$modules/"
if ! command -v npm >/dev/null 2>&1 ||
    ! timeout 300 npm install --prefix "$modules" --no-audit --no-fund --silent >/dev/null 2>&1; then
    skip "npm could not install playwright-core and @xterm/xterm"
fi
export NODE_PATH="$modules/node_modules${NODE_PATH:+:$NODE_PATH}"
# Vite in a folder of its own: the preview test runs a real dev server behind the gate.
if ! timeout 300 npm install --prefix "$modules/vite" --no-audit --no-fund --silent vite >/dev/null 2>&1; then
    skip "npm could not install vite"
fi
export VITE="$modules/vite/node_modules/vite/bin/vite.js"
status=0
passed=0
failed=0
for test in terminal events preview; do
    set +e
    STATE_FILE="$modules/state-$test" timeout 240 node "$here/$test-test.js" "$bin"
    s=$?
    set -e
    if [ "$s" = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); status=$s; fi
done
ms=$((($(date +%s%N) - start) / 1000000))
printf 'browser-test: took %d.%03d s, installs included\n' $((ms / 1000)) $((ms % 1000))
echo "browser-test: $passed passed, $failed failed"
exit "$status"
