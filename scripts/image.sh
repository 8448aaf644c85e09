#!/usr/bin/env bash
# Builds the image (the Dockerfile's `prebuilt` stage: FROM scratch plus the binary) from
# an already built static binary, with no network.
#
#   scripts/image.sh [BINARY]
#
# BINARY defaults to the one scripts/build-static.sh builds (and it is built then).
# Environment:
#   IMAGE   the tag to give it (default localhost/gitterm-agent:latest)
#   ENGINE  podman, buildah or docker; default: the first of them that works here
#           (docker counts only when it reaches a daemon)
# Progress goes to stderr; stdout is the image's name alone, on the last line.
# Exits 0 with a message and no image where no engine works (and ENGINE is unset).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
image=${IMAGE:-localhost/gitterm-agent:latest}

die() {
  echo "image.sh: error: $*" >&2
  exit 1
}

# Whether an engine can build here: installed, and (for docker) with a daemon.
works() {
  command -v "$1" >/dev/null 2>&1 || return 1
  case "$1" in
    podman | buildah | docker) "$1" info >/dev/null 2>&1 ;;
    *) return 1 ;;
  esac
}

if [ -n "${ENGINE:-}" ]; then
  works "$ENGINE" || die "ENGINE=$ENGINE does not work here ('$ENGINE info' fails or it is missing)"
  engine=$ENGINE
else
  engine=
  for e in podman buildah docker; do
    if works "$e"; then
      engine=$e
      break
    fi
  done
  if [ -z "$engine" ]; then
    echo "image.sh: skipped: no working container engine (podman, buildah, or docker with a daemon)" >&2
    exit 0
  fi
fi

if [ $# -ge 1 ]; then
  bin=$1
else
  bin=$("$repo/scripts/build-static.sh" | tail -n 1)
fi
[ -f "$bin" ] || die "no binary at $bin"

# The context holds the binary alone: nothing else of the tree goes into the image.
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
install -m 0755 "$bin" "$ctx/gitterm-agent"

case "$engine" in
  buildah) build=(buildah bud) ;;
  # No intermediate images kept for a build of four instructions.
  podman) build=(podman build --layers=false) ;;
  docker) build=(docker build) ;;
esac
echo "image.sh: building $image with $engine from $bin" >&2
"${build[@]}" --target prebuilt -f "$repo/Dockerfile" -t "$image" "$ctx" >&2
echo "$image"
