#!/usr/bin/env bash
# The differential test against xterm.js: `run.sh [CASES] [SEED]` (default 2000 cases, a
# fresh seed; CI runs the default, `run.sh 30000` is the long run). It installs
# @xterm/headless into a temporary folder with npm unless node already finds it, then runs
# the xterm tests of tests/corpus.rs. Where npm cannot install it, it says so and
# skips. Honours CARGO_TARGET_DIR.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
cases="${1:-2000}"
if ! command -v node >/dev/null 2>&1; then
    echo "xterm-diff: skipped: no node"
    exit 0
fi
if ! (cd "$here" && node -e "require.resolve('@xterm/headless')") >/dev/null 2>&1; then
    modules="$(mktemp -d)"
    trap 'rm -rf "$modules"' EXIT
    if ! command -v npm >/dev/null 2>&1 ||
        ! timeout 300 npm install --prefix "$modules" --no-audit --no-fund --silent @xterm/headless >/dev/null 2>&1; then
        echo "xterm-diff: skipped: npm could not install @xterm/headless"
        exit 0
    fi
    export NODE_PATH="$modules/node_modules${NODE_PATH:+:$NODE_PATH}"
fi
export XTERM_DIFF_CASES="$cases"
if [ -n "${2:-}" ]; then
    export XTERM_DIFF_SEED="$2"
fi
set +e
cargo test --locked --test tests xterm -- --nocapture 2>&1 |
    grep -E '^(xterm-diff|case |  ours|  xterm|  input|  masked|  clear|  shown|note|test |test result)|panicked|differ'
status="${PIPESTATUS[0]}"
exit "$status"
