#!/usr/bin/env python3
"""Sessions: what a session command costs over a plain job, and whether state carries
exactly. A benchmark, not a test (never run by cargo test).

Usage: scripts/bench-sessions.py [BINARY] [ROUNDS]   (default: target/release/gitterm-agent, 200)

Starts `serve` on a fresh state root. Speed: ROUNDS times, alternating, a plain
`POST /v1/jobs {"command": "true"}` and a `POST /v1/sessions/{id}/jobs` of `true`, each
waited for its end, on one kept-alive connection; prints their medians and p95s, and the
ratio of the medians (the goal: at most 1.2). Once for an empty sh session, once for a
bash session carrying 40 variables and a few functions (a venv-sized state).
Carry: for each awkward value (spaces, quotes, newlines, `$`, backslashes, `=`, non-ASCII,
control characters, empty, not UTF-8), one command sets it as a plain and an exported
variable and a later command reads both back as hex; prints how many came back exactly,
for sh and bash (the goal: all).
"""
import json
import os
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchserve import read_reply, serve  # noqa: E402


class Conn:
    def __init__(self, addr, token):
        host, port = addr.rsplit(":", 1)
        self.s = socket.create_connection((host, int(port)), timeout=120)
        self.token = token
        self.buf = b""

    def call(self, method, path, body=None):
        data = b"" if body is None else json.dumps(body).encode()
        head = (f"{method} {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {self.token}\r\n"
                f"Content-Length: {len(data)}\r\nContent-Type: application/json\r\n\r\n")
        self.s.sendall(head.encode() + data)
        status, out, self.buf = read_reply(self.s, self.buf)
        v = json.loads(out) if out else None
        if status != 200:
            sys.exit(f"{method} {path}: {status} {v}")
        return v


AWKWARD = [
    "", "two words", "  lead and trail  ", "it's", '"double"', "'", "''''",
    "line1\nline2\n", "\n", "$HOME $(id) `id` ${x}", "back\\slash\\\\ \\n \\'", "a=b=c",
    "café € 😀", "tab\there\r\x01\x1b[31m", "*?[a-z] ~ & ; | < > ( ) { } # !", "-n", "--",
    "=", "==leading", "x" * 5000, "多字节 ☃", "\\", "$'ansi'", "%s %d", "\x7f",
]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def speed(c, sid, rounds):
    plain, ses = [], []
    for i in range(rounds + 10):
        for kind in (0, 1):
            t = time.perf_counter()
            if kind == 0:
                v = c.call("POST", "/v1/jobs", {"command": "true"})
            else:
                v = c.call("POST", f"/v1/sessions/{sid}/jobs", {"command": "true"})
            dt = time.perf_counter() - t
            if v["status"] != "succeeded":
                sys.exit(f"not succeeded: {v}")
            if i >= 10:
                (plain if kind == 0 else ses).append(dt * 1000)
    return plain, ses


def carry(c, shell):
    sid = c.call("POST", "/v1/sessions", {"shell": shell})["id"]
    right = 0
    values = [(v.encode(), v) for v in AWKWARD] + [(b"\xff\xfe not utf-8", None)]
    for raw, text in values:
        if text is None:
            setv = "P=$(printf '\\377\\376 not utf-8'); export X=\"$P\""
            c.call("POST", f"/v1/sessions/{sid}/jobs", {"command": setv})
            want, env = "WANT=$(printf '\\377\\376 not utf-8'); export WANT; ", {}
        else:
            c.call("POST", f"/v1/sessions/{sid}/jobs",
                   {"command": 'P=$IN; export X="$IN"', "env": {"IN": text}})
            want, env = "", {"WANT": text}
        # Compared in the shell, byte for byte: the exported one in a child process.
        read = (want + '[ "${P-UNSET}" = "$WANT" ] && echo plain; '
                "sh -c '[ \"${X-UNSET}\" = \"$WANT\" ] && echo exported'")
        out = c.call("POST", f"/v1/sessions/{sid}/jobs", {"command": read, "env": env})["output"]
        if out == "plain\nexported\n":
            right += 1
        else:
            print(f"  {shell}: {raw[:40]!r} did not carry: {out[:120]!r}")
    return right, len(values)


def main():
    exe = sys.argv[1] if len(sys.argv) > 1 else "target/release/gitterm-agent"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    top = tempfile.mkdtemp(prefix="gitterm-bench-sessions-")
    p, addr, token = serve(exe, top)
    try:
        c = Conn(addr, token)
        empty = c.call("POST", "/v1/sessions", {})["id"]
        venvish = c.call("POST", "/v1/sessions", {"shell": "bash"})["id"]
        setup = "; ".join(f"export V{i}='value number {i} with some length'" for i in range(40))
        setup += "; f1() { echo one; }; f2() { local x=$1; echo \"$x\"; }; alias ll='ls -l'"
        c.call("POST", f"/v1/sessions/{venvish}/jobs", {"command": setup})
        for name, sid in (("sh, empty", empty), ("bash, 40 vars + functions", venvish)):
            plain, ses = speed(c, sid, rounds)
            mp, ms = statistics.median(plain), statistics.median(ses)
            print(f"{name}: plain job `true` p50 {mp:.2f} ms p95 {pct(plain, .95):.2f} ms; "
                  f"session command p50 {ms:.2f} ms p95 {pct(ses, .95):.2f} ms; "
                  f"ratio {ms / mp:.2f}x (goal <= 1.2x), +{ms - mp:.2f} ms")
        # What bash itself costs over dash, which every plain job runs: the floor of a
        # bash session's ratio.
        bash = []
        for i in range(rounds // 2 + 5):
            t = time.perf_counter()
            c.call("POST", "/v1/jobs", {"command": "exec /bin/bash -c true"})
            if i >= 5:
                bash.append((time.perf_counter() - t) * 1000)
        print(f"plain job `exec /bin/bash -c true` (bash's own start, for scale): "
              f"p50 {statistics.median(bash):.2f} ms")
        for shell in ("sh", "bash"):
            right, n = carry(c, shell)
            print(f"carry, {shell}: {right}/{n} awkward values exact ({100 * right / n:.0f}%, goal 100%)")
    finally:
        p.terminate()
        p.wait()


if __name__ == "__main__":
    main()
