#!/usr/bin/env bash
# Builds the static musl binary, checks that it is static, and prints its size.
# Honours CARGO_TARGET_DIR (and any other cargo setting of the target directory).
# Progress goes to stderr; stdout is a single line, the binary's absolute path, so
# callers can take it with `bin=$(scripts/build-static.sh | tail -n 1)`.
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-unknown-linux-musl

die() {
  echo "error: $*" >&2
  exit 1
}

# The checks need readelf (binutils); without it nothing could be said about the binary.
command -v readelf >/dev/null 2>&1 ||
  die "readelf not found: install binutils (apt-get install binutils) to check the binary"

rustup target list --installed 2>/dev/null | grep -qx "$target" || rustup target add "$target" >&2
cargo build --release --locked --target "$target" >&2

# Where cargo put it: ask cargo rather than assume target/.
metadata=$(cargo metadata --format-version 1 --no-deps)
target_dir=$(printf '%s\n' "$metadata" | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$target_dir" ] || die "could not read target_directory from cargo metadata"
bin="$target_dir/$target/release/gitterm-agent"
[ -f "$bin" ] || die "$bin is missing after the build"
[ -x "$bin" ] || die "$bin is not executable"

# readelf's output is taken whole before it is searched: a `readelf | grep -q` pipeline
# can fail with SIGPIPE and read as "not found".
headers=$(readelf -h "$bin" 2>&1) || die "$bin is not an ELF file: $headers"
grep -q 'Type:[[:space:]]*\(EXEC\|DYN\)' <<<"$headers" || die "$bin is not an ELF executable"
grep -q 'Machine:[[:space:]]*Advanced Micro Devices X86-64' <<<"$headers" ||
  die "$bin is not an x86-64 binary"
program=$(readelf -lW "$bin" 2>&1) || die "readelf could not read $bin's program headers: $program"
grep -q 'LOAD' <<<"$program" || die "readelf found no loadable segment in $bin"
if grep -q 'INTERP' <<<"$program"; then
  die "$bin asks for a program interpreter (not static)"
fi
dynamic=$(readelf -dW "$bin" 2>&1) || die "readelf could not read $bin's dynamic section: $dynamic"
if grep -q '(NEEDED)' <<<"$dynamic"; then
  die "$bin needs shared libraries: $(grep '(NEEDED)' <<<"$dynamic" | tr -s ' ' | tr '\n' ';')"
fi
# file(1) is a second opinion where it is installed; the readelf checks above decide.
if command -v file >/dev/null 2>&1; then
  kind=$(file -b "$bin")
  case "$kind" in
    *"dynamically linked"*) die "$bin: file(1) says $kind" ;;
  esac
fi

size=$(stat -c %s "$bin")
echo "static binary: $size bytes ($((size / 1024)) KiB), no interpreter, no shared libraries" >&2
echo "$bin"
