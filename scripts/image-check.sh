#!/usr/bin/env bash
# Builds the image with scripts/image.sh, runs it with its default command (serve on
# 0.0.0.0:7433) and a port published on 127.0.0.1, and checks through that port that
# GET /v1/health answers without a token, that /v1/jobs refuses a request without one,
# and that it takes the token the agent generated inside the container.
#
#   scripts/image-check.sh [BINARY]
#
# BINARY defaults to the one scripts/build-static.sh builds. ENGINE may name podman or
# docker; by default the first that works here. Exits 0 with a message where none works
# (buildah alone builds the image but cannot run it with a published port).
# The container (and the image built for the check) is removed on every way out.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
# The image built for the check is removed after it, unless IMAGE names one to keep.
image=${IMAGE:-localhost/gitterm-agent:check}
keep_image=${IMAGE:+yes}
started=$SECONDS

die() {
  echo "image-check.sh: error: $*" >&2
  exit 1
}

works() {
  command -v "$1" >/dev/null 2>&1 && "$1" info >/dev/null 2>&1
}

if [ -n "${ENGINE:-}" ]; then
  case "$ENGINE" in podman | docker) ;; *) die "ENGINE must be podman or docker to run the image" ;; esac
  works "$ENGINE" || die "ENGINE=$ENGINE does not work here ('$ENGINE info' fails or it is missing)"
  engine=$ENGINE
else
  engine=
  for e in podman docker; do
    if works "$e"; then
      engine=$e
      break
    fi
  done
  if [ -z "$engine" ]; then
    echo "image-check.sh: skipped: no engine to run the image (podman, or docker with a daemon)" >&2
    exit 0
  fi
fi
command -v curl >/dev/null 2>&1 || die "curl not found"

name="gitterm-agent-check-$$"
tmp=$(mktemp -d)
ran=
cleanup() {
  local rc=$?
  if [ "$rc" -ne 0 ] && [ -n "$ran" ]; then
    echo "image-check.sh: the container's log:" >&2
    "$engine" logs "$name" >&2 2>&1 || true
  fi
  "$engine" rm -f "$name" >/dev/null 2>&1 || true
  [ -n "$keep_image" ] || "$engine" rmi "$image" >/dev/null 2>&1 || true
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ENGINE=$engine IMAGE=$image "$repo/scripts/image.sh" "$@" >/dev/null

run=("$engine" run -d --name "$name" -p 127.0.0.1::7433)
# The engine's default limits can be above what this host lets it set (podman asks for
# nofile 1048576 and a large nproc; without CAP_SYS_RESOURCE that fails), and the agent
# needs few of either here. Lowering a limit is always allowed.
nproc_hard=$(ulimit -Hu)
nproc=4096
if [ "$nproc_hard" != unlimited ] && [ "$nproc_hard" -lt "$nproc" ]; then nproc=$nproc_hard; fi
run+=(--ulimit nofile=1024:1024 --ulimit "nproc=$nproc:$nproc")
# podman: runc where installed, since crun refuses hosts with cgroups in hybrid mode.
if [ "$engine" = podman ] && command -v runc >/dev/null 2>&1; then
  run+=(--runtime "$(command -v runc)")
fi
ran=yes
"${run[@]}" "$image" >/dev/null

running() {
  [ "$("$engine" inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" = true ] ||
    die "the container stopped before answering"
}

# The host port the engine picked for 7433.
port=
for _ in $(seq 50); do
  mapping=$("$engine" port "$name" 7433/tcp 2>/dev/null | head -n 1) || true
  port=${mapping##*:}
  [ -n "$port" ] && break
  running
  sleep 0.1
done
[ -n "$port" ] || die "the engine published no port for 7433/tcp"
url="http://127.0.0.1:$port"

# Health, without a token, through the published port.
health=
for _ in $(seq 100); do
  health=$(curl -fsS --max-time 2 "$url/v1/health" 2>/dev/null) && break
  health=
  running
  sleep 0.1
done
[ -n "$health" ] || die "no answer from $url/v1/health"
grep -q '"ok":[[:space:]]*true' <<<"$health" || die "unexpected health answer: $health"
echo "image-check.sh: GET /v1/health through 127.0.0.1:$port -> $health" >&2

# The first log line says where it listens (0.0.0.0:7433, with the beyond-loopback warning).
logs=$("$engine" logs "$name" 2>&1)
grep -q '"event":"listening"' <<<"$logs" || die "no listening line in the log"
grep -q '"address":"0.0.0.0:7433"' <<<"$logs" || die "not listening on 0.0.0.0:7433: $logs"

# Everything else needs the token: refused without it, accepted with the generated one.
code=$(curl -sS -o /dev/null -w '%{http_code}' --max-time 5 "$url/v1/jobs")
[ "$code" = 401 ] || die "GET /v1/jobs without a token answered $code, not 401"
"$engine" cp "$name:/root/.gitterm/agent.token" "$tmp/token" ||
  die "could not copy the generated token out of the container"
code=$(curl -sS -o /dev/null -w '%{http_code}' --max-time 5 \
  -H "Authorization: Bearer $(cat "$tmp/token")" "$url/v1/jobs")
[ "$code" = 200 ] || die "GET /v1/jobs with the generated token answered $code, not 200"

echo "image-check.sh: ok: $image ($engine) serves through a published port; token enforced ($((SECONDS - started)) s)" >&2
