#!/usr/bin/env bash
# The test command: unit and integration tests, then the contract's conformance check
# against the freshly built binary, where the contract's shared folder sits beside the
# repository (../shared). Honours CARGO_TARGET_DIR (and any other place cargo builds to):
# the binary's path is taken from cargo's own report of what it built.
set -euo pipefail
cd "$(dirname "$0")/.."
# The contract's shared corpus, where it sits beside the repository, is checked too.
if [ -d ../shared/corpus ] && [ -z "${GITTERM_EXTRA_CORPUS:-}" ]; then
    GITTERM_EXTRA_CORPUS=$(cd ../shared/corpus && pwd)
    export GITTERM_EXTRA_CORPUS
fi
# Every skipped test appends a "SKIPPED <test>: <reason>" line here (tests/util/skip.rs);
# they are printed and counted at the end, also when a test fails. GITTERM_REQUIRE_ALL=1
# (CI) makes a skip of a root-only test a failure instead.
GITTERM_SKIP_LOG=$(mktemp "${TMPDIR:-/tmp}/gitterm-skips.XXXXXX")
export GITTERM_SKIP_LOG
report_skips() {
    local n
    n=$(grep -c '^SKIPPED ' "$GITTERM_SKIP_LOG" || true)
    if [ "$n" -gt 0 ]; then
        echo "test.sh: tests that skipped (all or part of themselves):"
        sort "$GITTERM_SKIP_LOG"
    fi
    echo "test.sh: ${n} skipped"
    rm -f "$GITTERM_SKIP_LOG"
}
trap report_skips EXIT
cargo test --locked --all-targets "$@"
bin=$(
    cargo build --locked --message-format=json-render-diagnostics |
        grep '"reason":"compiler-artifact"' |
        grep '"kind":\["bin"\]' |
        grep '"name":"gitterm-agent"' |
        grep -o '"executable":"[^"]*"' |
        cut -d'"' -f4 |
        tail -n 1
)
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    echo "test.sh: cargo built no gitterm-agent binary (got '${bin}')" >&2
    exit 1
fi
conformance=../shared/conformance/run.py
if [ -f "$conformance" ]; then
    python3 "$conformance" "$bin"
else
    echo "test.sh: skipped the conformance check: no $conformance beside the repository"
fi
