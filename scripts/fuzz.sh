#!/usr/bin/env bash
# Runs every fuzz target for a bounded time (default 60 s each) with cargo-fuzz on the
# nightly toolchain, and prints the executions per target. A crash leaves its input under
# fuzz/artifacts/<target>/: turn it into a regression test.
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
rustup toolchain list | grep -q nightly || { echo "fuzzing needs a nightly toolchain" >&2; exit 2; }
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
for t in $(cd fuzz && cargo +nightly fuzz list); do
  log=$(mktemp)
  cargo +nightly fuzz run "$t" -- -max_total_time="$secs" -max_len=4096 -rss_limit_mb=1024 -print_final_stats=1 >"$log" 2>&1 || {
    tail -40 "$log"; echo "fuzz target $t FAILED (see fuzz/artifacts/$t)" >&2; exit 1; }
  execs=$(grep -oE 'stat::number_of_executed_runs: *[0-9]+' "$log" | grep -oE '[0-9]+$' || true)
  [ -n "$execs" ] || execs=$(grep -oE '#[0-9]+' "$log" | tail -1 | tr -d '#')
  echo "fuzz $t: ${execs:-?} executions in ${secs}s, no failure"
  rm -f "$log"
done
