#!/usr/bin/env python3
"""Health latency with 64 terminal WebSockets open: a benchmark, not a test.

Usage: scripts/bench-terminals.py [BINARY]   (default: target/debug/gitterm-agent)

Starts `serve --max-connections 128` (so 64 requests may wait, terminals included) on a
fresh state root, times 500 `GET /v1/health` on one kept-alive connection, then opens 64
terminal WebSockets on 8 jobs that each print 10 lines a second, tries a 65th (which must
be refused 429), and times health again. Needs Python's `websockets` (it reuses the
virtualenv of scripts/protocol-check.py when present).
"""
import contextlib
import json
import os
import socket
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchserve import serve  # noqa: E402

VENV_PY = os.path.join(tempfile.gettempdir(), "gitterm-protocol-check-venv", "bin", "python")
try:
    from websockets.sync.client import connect
except ImportError:
    if os.path.exists(VENV_PY) and sys.executable != VENV_PY:
        os.execv(VENV_PY, [VENV_PY] + sys.argv)
    sys.exit("needs websockets: run scripts/protocol-check.py once, or pip install websockets")


def main():
    exe = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/debug/gitterm-agent")
    top = tempfile.mkdtemp(prefix="gitterm-bench-terminals-")
    p, addr, token = serve(exe, top, "--max-connections", "128")
    try:
        auth = {"Authorization": f"Bearer {token}"}

        def post(path, body):
            r = urllib.request.Request(f"http://{addr}{path}", data=json.dumps(body).encode(),
                                       headers=dict(auth, **{"Content-Type": "application/json"}))
            return json.load(urllib.request.urlopen(r, timeout=60))

        def health(n=500):
            host, port = addr.rsplit(":", 1)
            s = socket.create_connection((host, int(port)), timeout=30)
            lat = []
            for _ in range(n):
                t = time.perf_counter()
                s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: bench\r\n\r\n")
                d = b""
                while not (b"\r\n\r\n" in d and d.endswith(b"}\n")):
                    d += s.recv(4096)
                lat.append((time.perf_counter() - t) * 1000)
            s.close()
            lat.sort()
            return f"p50 {lat[n // 2]:.2f} ms, p99 {lat[n * 99 // 100]:.2f} ms, max {lat[-1]:.2f} ms"

        print("health, no terminals:", health())
        jobs = [post("/v1/jobs", {"command": "while :; do echo tick; sleep 0.1; done",
                                  "pty": {"cols": 80, "rows": 24}, "background": True})["id"]
                for _ in range(8)]
        with contextlib.ExitStack() as st:
            for i in range(64):
                st.enter_context(connect(f"ws://{addr}/v1/jobs/{jobs[i % 8]}/pty",
                                         additional_headers=auth, open_timeout=30))
            try:
                with connect(f"ws://{addr}/v1/jobs/{jobs[0]}/pty", additional_headers=auth):
                    extra = "opened (the cap did not hold)"
            except Exception as e:  # websockets' InvalidStatus names the status
                extra = str(e)
            print("64 terminals open; the 65th:", extra)
            print("health, 64 terminals:", health())
        for j in jobs:
            post(f"/v1/jobs/{j}/cancel", {})
    finally:
        p.terminate()
        p.wait(timeout=30)


if __name__ == "__main__":
    main()
