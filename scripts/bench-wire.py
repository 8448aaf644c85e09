#!/usr/bin/env python3
"""The terminal wire with secrets configured: a benchmark, not a test.

Usage: scripts/bench-wire.py [BINARY] [--lines N] [--no-throughput]
       (default BINARY: target/release/gitterm-agent; build it with cargo build --release)

1. Throughput: runs `cargo bench --bench wire` (the wire masker on `ls --color`, progress
   bar and log-line streams with 4 secrets, next to the byte redactor and a plain copy).
2. Delay: starts `serve` on a fresh state root and runs a terminal job (`pty` 200x50) that
   prints `tick I T` every 20 ms, T being the time it writes the line (and, every 25th
   line, one of its secrets, which the wire masks); a WebSocket viewer attaches and takes
   receive time - T for every other line. Once with 4 secrets in `secretEnv`, once with
   none (the floor); prints p50, p99 and max of each and the ratios.

Needs Python's `websockets`: it reuses the virtualenv of scripts/protocol-check.py when
present, or makes its own in the temp folder with pip.
"""
import argparse
import json
import os
import random
import string
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchserve import serve  # noqa: E402

VENVS = [os.path.join(tempfile.gettempdir(), n, "bin", "python")
         for n in ("gitterm-protocol-check-venv", "gitterm-bench-wire-venv")]
try:
    from websockets.sync.client import connect
except ImportError:
    for py in VENVS:
        if os.path.exists(py) and sys.executable != py:
            os.execv(py, [py] + sys.argv)
    venv = os.path.dirname(os.path.dirname(VENVS[1]))
    if sys.executable == VENVS[1] or subprocess.call([sys.executable, "-m", "venv", venv]) or \
            subprocess.call([VENVS[1], "-m", "pip", "install", "-q", "websockets"]):
        sys.exit("needs websockets: pip install websockets")
    os.execv(VENVS[1], [VENVS[1]] + sys.argv)

# The job: a line every 20 ms with the time it was written; every 25th line a secret.
JOB = r"""python3 -c '
import os, sys, time
n = int(sys.argv[1])
secret = os.environ.get("BENCH_SECRET_0", "")
for i in range(n):
    if secret and i % 25 == 24:
        sys.stdout.write("key " + secret + "\n")
    sys.stdout.write("tick %d %.6f\n" % (i, time.time()))
    sys.stdout.flush()
    time.sleep(0.02)
' """


def delays(addr, token, lines, secrets):
    auth = {"Authorization": f"Bearer {token}"}
    body = {"command": JOB + str(lines), "pty": {"cols": 200, "rows": 50},
            "background": True}
    if secrets:
        body["secretEnv"] = {f"BENCH_SECRET_{i}": s for i, s in enumerate(secrets)}
    r = urllib.request.Request(f"http://{addr}/v1/jobs", data=json.dumps(body).encode(),
                               headers=dict(auth, **{"Content-Type": "application/json"}))
    job = json.load(urllib.request.urlopen(r, timeout=60))["id"]
    got, buf, seen_secret = [], b"", 0
    with connect(f"ws://{addr}/v1/jobs/{job}/pty?write=false", additional_headers=auth,
                 open_timeout=30, max_size=None) as ws:
        for msg in ws:
            now = time.time()
            if isinstance(msg, str):
                if json.loads(msg).get("type") == "exit":
                    break
                continue
            buf += msg
            *done, buf = buf.split(b"\n")
            for line in done:
                words = line.strip(b"\r").split()
                if len(words) == 3 and words[0] == b"tick":
                    i = int(words[1])
                    # The first lines may come in the replay, sent before the viewer was.
                    if i >= 25:
                        got.append((now - float(words[2])) * 1000)
                elif words[:1] == [b"key"]:
                    seen_secret += 1
                    if secrets and secrets[0].encode() in line:
                        sys.exit("the wire sent a secret in clear: " + repr(line))
    if len(got) < lines - 30:
        sys.exit(f"only {len(got)} of {lines} lines arrived")
    got.sort()
    return {"p50": got[len(got) // 2], "p99": got[len(got) * 99 // 100], "max": got[-1],
            "n": len(got), "secret_lines": seen_secret}


def main():
    ap = argparse.ArgumentParser(description="The terminal wire with secrets: a benchmark.")
    ap.add_argument("binary", nargs="?", default="target/release/gitterm-agent")
    ap.add_argument("--lines", type=int, default=500, help="lines the job prints")
    ap.add_argument("--no-throughput", action="store_true", help="skip cargo bench")
    opts = ap.parse_args()
    lines = opts.lines
    exe = os.path.abspath(opts.binary)
    if not os.path.exists(exe):
        sys.exit(f"no {exe}: build it with cargo build --release, or name a binary")
    if not opts.no_throughput:
        print("throughput (cargo bench --bench wire):", flush=True)
        subprocess.check_call(["cargo", "bench", "--locked", "--bench", "wire"])
    rng = random.Random(20)
    abc = string.ascii_letters + string.digits
    secrets = ["sk-" + "".join(rng.choice(abc) for _ in range(rng.randint(17, 37)))
               for _ in range(4)]
    top = tempfile.mkdtemp(prefix="gitterm-bench-wire-")
    p, addr, token = serve(exe, top)
    try:
        print(f"delay of non-secret lines through a terminal job ({lines} lines, one every "
              "20 ms, a viewer attached over the WebSocket):", flush=True)
        floor = delays(addr, token, lines, [])
        with_secrets = delays(addr, token, lines, secrets)
        for name, d in (("no secrets (floor)", floor), ("4 secrets", with_secrets)):
            print(f"  {name:<19} p50 {d['p50']:6.2f} ms  p99 {d['p99']:6.2f} ms  "
                  f"max {d['max']:6.2f} ms  ({d['n']} lines)")
        print(f"  ratio to the floor: p50 {with_secrets['p50'] / floor['p50']:.2f}x  "
              f"p99 {with_secrets['p99'] / floor['p99']:.2f}x  "
              f"max {with_secrets['max'] / floor['max']:.2f}x  "
              f"({with_secrets['secret_lines']} masked secret lines seen)")
    finally:
        p.terminate()
        p.wait(timeout=30)


if __name__ == "__main__":
    main()
