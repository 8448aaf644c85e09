#!/bin/sh
# Benchmarks the HTTP endpoint: builds with the release profile, starts `serve` on a free
# loopback port with a scratch state root, and prints latencies and memory figures.
# Not a timed test: figures depend on the machine and its load.
set -eu
cd "$(dirname "$0")/.."
exec cargo bench --bench api "$@"
