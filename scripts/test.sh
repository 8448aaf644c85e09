#!/usr/bin/env bash
# The test command: unit and integration tests, then the contract's conformance check
# against the freshly built binary.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --locked --all-targets "$@"
cargo build --locked
python3 ../shared/conformance/run.py target/debug/gitterm-agent
