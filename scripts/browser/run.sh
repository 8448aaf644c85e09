#!/usr/bin/env bash
# The browser test of the terminal WebSocket: `run.sh BINARY`. It installs Debian's chromium
# when /usr/bin/chromium is missing, installs playwright-core and @xterm/xterm (package.json)
# into a temporary folder with npm, then runs terminal-test.js against `BINARY serve`.
# Where chromium or the packages cannot be installed, it says so and skips (exit 0).
# $ARTIFACTS names the screenshot's folder (default /tmp/gitterm-browser-test).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:?usage: run.sh BINARY}"
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
start=$(date +%s%N)
if ! command -v node >/dev/null 2>&1; then
    echo "browser-test: skipped: no node"
    exit 0
fi
export CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$CHROMIUM" ]; then
    if command -v apt-get >/dev/null 2>&1; then
        { timeout 600 apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq chromium; } >/dev/null 2>&1 || true
    fi
    if [ ! -x "$CHROMIUM" ]; then
        echo "browser-test: skipped: chromium could not be installed (apt-get install -y chromium)"
        exit 0
    fi
fi
modules="$(mktemp -d)"
state_file="$modules/state"
cleanup() {
    # terminal-test.js cancels the job and stops the server itself, and removes the state
    # file once the job has ended; a state file left means it could not (it was killed):
    # it holds the server's pid and address, the job's id and process group, and its folder.
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
    rm -rf "$modules"
}
trap cleanup EXIT
cp "$here/package.json" "$modules/"
if ! command -v npm >/dev/null 2>&1 ||
    ! timeout 300 npm install --prefix "$modules" --no-audit --no-fund --silent >/dev/null 2>&1; then
    echo "browser-test: skipped: npm could not install playwright-core and @xterm/xterm"
    exit 0
fi
export NODE_PATH="$modules/node_modules${NODE_PATH:+:$NODE_PATH}"
export STATE_FILE="$state_file"
set +e
timeout 240 node "$here/terminal-test.js" "$bin"
status=$?
set -e
ms=$((($(date +%s%N) - start) / 1000000))
result=passed
[ "$status" = 0 ] || result="FAILED (exit $status)"
printf 'browser-test: %s in %d.%03d s, installs included\n' "$result" $((ms / 1000)) $((ms % 1000))
exit "$status"
