#!/usr/bin/env python3
"""How late `pending` shows a prompt: a benchmark, not a test.

Usage: scripts/bench-pending.py [BINARY] [ROUNDS]   (default: target/release/gitterm-agent, 50)

Starts `serve` on a fresh state root and an interactive job that, each round, writes the
time into a file and then prints a prompt without a newline (`round N> `), and waits for a
line. A client polls `GET /v1/jobs/{id}` on a kept-alive connection until `pending` is that
prompt, and answers it. The delay of a round is the time the answer showed the prompt
minus the time the job wrote it. Printed: p50, p95 and max, once without secrets and once
with four configured (the floor and the case that matters), and their ratio; with prompts
answered at once (each prompt then follows the last within the file's 5 ms rate bound) and
answered after 50 ms. The polling
itself adds up to one request's time (printed as the floor of a round trip).
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
        self.s = socket.create_connection((host, int(port)), timeout=30)
        self.token = token
        self.buf = b""

    def call(self, method, path, body=None):
        data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        head = (f"{method} {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {self.token}\r\n"
                f"Content-Length: {len(data)}\r\n")
        if body is not None and not isinstance(body, bytes):
            head += "Content-Type: application/json\r\n"
        self.s.sendall(head.encode() + b"\r\n" + data)
        _, out, self.buf = read_reply(self.s, self.buf)
        return json.loads(out) if out else None


def run(exe, rounds, secrets, pause):
    top = tempfile.mkdtemp(prefix="gitterm-bench-pending-")
    stamp = os.path.join(top, "stamp")
    p, addr, token = serve(exe, top)
    try:
        c = Conn(addr, token)
        rtt = []
        for _ in range(50):
            t = time.perf_counter()
            c.call("GET", "/v1/health")
            rtt.append((time.perf_counter() - t) * 1000)
        # bash for $EPOCHREALTIME: the stamp and the prompt are both builtins, so nothing
        # but the shell's own two writes lies between them.
        cmd = ("bash -c 'for ((i=0; i<%d; i++)); do printf %%s \"$EPOCHREALTIME\" > %s; "
               "printf \"\\nround %%d> \" $i; read x; done'" % (rounds, stamp))
        body = {"command": cmd, "interactive": True, "background": True}
        if secrets:
            body["secretEnv"] = {f"S{i}": f"sk-live-{i}-4f9a2b7c0d1e" for i in range(4)}
        job = c.call("POST", "/v1/jobs", body)
        jid = job["id"]
        delays = []
        for i in range(rounds):
            want = f"round {i}> "
            while True:
                v = c.call("GET", f"/v1/jobs/{jid}")
                if v.get("pending") == want:
                    seen = time.time()
                    break
            wrote = float(open(stamp).read())
            delays.append((seen - wrote) * 1000)
            time.sleep(pause)
            c.call("POST", f"/v1/jobs/{jid}/stdin", b"y\n")
        c.call("POST", f"/v1/jobs/{jid}/cancel", {})
        return delays, statistics.median(rtt)
    finally:
        p.terminate()
        p.wait()


def main():
    exe = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/gitterm-agent")
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    for pause, what in ((0.0, "answered at once (prompts back to back)"),
                        (0.05, "answered after 50 ms (someone reading it)")):
        print(what)
        res = {}
        for secrets in (False, True):
            d, rtt = run(exe, rounds, secrets, pause)
            d.sort()
            res[secrets] = d
            name = "4 secrets" if secrets else "no secrets (floor)"
            print(f"  pending delay, {name:>18}: p50 {statistics.median(d):6.2f} ms  "
                  f"p95 {d[int(len(d) * 0.95) - 1]:6.2f} ms  max {d[-1]:6.2f} ms  "
                  f"(a round trip of health: {rtt:.2f} ms)")
        ratio = statistics.median(res[True]) / max(statistics.median(res[False]), 1e-9)
        print(f"  ratio (secrets / floor), p50: {ratio:.2f}")

if __name__ == "__main__":
    main()
