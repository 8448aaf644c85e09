#!/usr/bin/env bash
# Builds the static musl binary, checks that it is static, and prints its size.
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-unknown-linux-musl
rustup target list --installed 2>/dev/null | grep -qx "$target" || rustup target add "$target"
cargo build --release --locked --target "$target"
bin="target/$target/release/gitterm-agent"
if file "$bin" 2>/dev/null | grep -q "dynamically linked"; then
  echo "error: $bin is dynamically linked" >&2
  exit 1
fi
if readelf -l "$bin" 2>/dev/null | grep -q "INTERP"; then
  echo "error: $bin asks for a program interpreter (not static)" >&2
  exit 1
fi
size=$(stat -c %s "$bin")
echo "static binary: $bin ($size bytes, $((size / 1024)) KiB)"
