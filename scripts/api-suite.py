#!/usr/bin/env python3
"""Hostile-API suite: drives a live `gitterm-agent serve` from its own OpenAPI description
with schemathesis (property-based: generated valid and invalid requests to every route),
then with raw-socket attacks (slowloris, endless chunked body, header flood, a 1 MB
header, duplicate Authorization headers, pipelined requests), while a prober checks that
`GET /v1/health` keeps answering. Passes when there is no 5xx but a documented
`internal`, no crash, no hang, and health answered throughout.

The server runs in its own PID namespace (as PID 1, via `unshare`, when available) with an
empty PATH and a 2 s job cap, because generated requests start generated shell commands.

Usage: scripts/api-suite.py [--examples N] [BINARY]   (default 50 examples per operation)"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchserve import read_to_close  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def http(addr, raw, timeout=5.0):
    s = socket.create_connection(addr, timeout=timeout)
    try:
        s.sendall(raw)
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            data += chunk
            if b"\r\n\r\n" in data and not raw.startswith(b"POST"):
                break
        return data
    finally:
        s.close()


class Prober(threading.Thread):
    """Checks health every 100 ms; records the worst answer time and any failure."""

    def __init__(self, base):
        super().__init__(daemon=True)
        self.base, self.stop, self.worst, self.failures, self.count = base, False, 0.0, [], 0

    def run(self):
        while not self.stop:
            t = time.time()
            try:
                with urllib.request.urlopen(self.base + "/v1/health", timeout=5) as r:
                    ok = r.status == 200 and json.loads(r.read()).get("ok") is True
            except Exception as e:  # noqa: BLE001 - any failure is a finding
                ok = False
                self.failures.append(repr(e))
            if not ok and not self.failures:
                self.failures.append("health answered but not ok")
            self.worst = max(self.worst, time.time() - t)
            self.count += 1
            time.sleep(0.1)


def attacks(host, port, token):
    addr = (host, port)
    results = []

    def check(name, cond):
        results.append((name, bool(cond)))
        print(f"  raw {name}: {'ok' if cond else 'FAILED'}", flush=True)

    # Slowloris: 50 connections trickling a header byte every 0.5 s.
    slow = []
    for _ in range(50):
        s = socket.create_connection(addr)
        s.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n")
        slow.append(s)
    t = time.time()
    ok = urllib.request.urlopen(f"http://{host}:{port}/v1/health", timeout=5).status == 200
    check("slowloris: health still answers", ok and time.time() - t < 2)

    def trickle():
        for _ in range(6):
            for s in slow:
                try:
                    s.sendall(b"X")
                except OSError:
                    pass
            time.sleep(0.5)
        for s in slow:
            s.close()

    threading.Thread(target=trickle, daemon=True).start()

    # Endless chunked body: the server must cut it at --max-body.
    s = socket.create_connection(addr, timeout=10)
    s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token.encode() +
              b"\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n")
    cut = False
    chunk = b"10000\r\n" + b"a" * 0x10000 + b"\r\n"
    try:
        for _ in range(400):  # up to 25 MiB, well past the 8 MiB default
            s.sendall(chunk)
    except OSError:
        cut = True
    try:
        resp = s.recv(4096)
        cut = cut or b" 413 " in resp
    except OSError:
        cut = True
    s.close()
    check("endless chunked body is cut", cut)

    # Header flood: 10,000 header lines.
    resp = http(addr, b"GET /v1/health HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 10000 + b"\r\n")
    check("header flood refused", resp.startswith(b"HTTP/1.1 4"))
    # One 1 MB header.
    resp = http(addr, b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
    check("1 MB header refused", resp.startswith(b"HTTP/1.1 4") or resp == b"")
    # Duplicate Authorization headers.
    auth = b"Authorization: Bearer " + token.encode() + b"\r\n"
    resp = http(addr, b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n" + auth + auth + b"Connection: close\r\n\r\n")
    check("duplicate Authorization is 401", resp.startswith(b"HTTP/1.1 401"))
    # Token in the query string.
    resp = http(addr, b"GET /v1/jobs?token=" + token.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    check("token in the query is 401", resp.startswith(b"HTTP/1.1 401"))
    # Pipelined requests answered in order.
    req = b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n"
    s = socket.create_connection(addr, timeout=5)
    s.sendall(req * 20 + b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = read_to_close(s)
    check("21 pipelined requests answered", data.count(b"HTTP/1.1 200") == 21)
    # Garbage request line.
    resp = http(addr, b"\x00\x01\x02 garbage\r\n\r\n")
    check("garbage request line refused", resp.startswith(b"HTTP/1.1 4") or resp == b"")
    # Files: the state root (the token's folder) is refused however it is spelled.
    auth = f"Authorization: Bearer {token}\r\n".encode()
    for spelling in [b"/proc/self/root/proc/self/cwd", b"..%2f..%2f..%2fetc%2f..%2fproc%2fself%2froot",
                     b"%2e%2e", b"a%00b", b""]:
        resp = http(addr, b"GET /v1/files/stat?path=" + spelling + b" HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n")
        check(f"files: stat {spelling.decode()!r} answered, not a crash",
              resp.startswith(b"HTTP/1.1 2") or resp.startswith(b"HTTP/1.1 4"))
    resp = http(addr, b"PUT /v1/files/content?path=/tmp/x HTTP/1.1\r\nHost: x\r\n" + auth
                + b"Content-Length: 99999999999999\r\n\r\n")
    check("files: an upload over --max-file-bytes is 413", resp.startswith(b"HTTP/1.1 413"))
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=50)
    ap.add_argument("binary", nargs="?", default=os.path.join(HERE, "..", "target", "release", "gitterm-agent"))
    a = ap.parse_args()
    exe = os.path.abspath(a.binary)
    top = tempfile.mkdtemp(prefix="gitterm-api-suite-")
    root = os.path.join(top, "root")
    emptybin = os.path.join(top, "bin")
    os.mkdir(emptybin)
    env = dict(os.environ, GITTERM_HOME=root, PATH=emptybin, HOME=top)
    argv = [exe, "serve", "--listen", "127.0.0.1:0", "--max-job-seconds", "2", "--grace", "1"]
    if os.geteuid() == 0 and shutil.which("unshare"):
        argv = [shutil.which("unshare"), "--pid", "--fork", "--mount-proc"] + argv
    log_path = os.path.join(top, "serve.log")
    srv = subprocess.Popen(argv, env=env, cwd=top, stdout=subprocess.DEVNULL, stderr=open(log_path, "wb"),
                           start_new_session=True)
    failed = []
    try:
        deadline = time.time() + 20
        addr = None
        while time.time() < deadline and addr is None:
            try:
                for line in open(log_path):
                    ev = json.loads(line)
                    if ev.get("event") == "listening":
                        addr = ev["address"]
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        if addr is None:
            print(open(log_path).read())
            sys.exit("the server did not start")
        host, port = addr.rsplit(":", 1)
        port = int(port)
        base = f"http://{host}:{port}"
        token = open(os.path.join(root, "agent.token")).read().strip()
        prober = Prober(base)
        prober.start()

        print(f"schemathesis: {a.examples} examples per operation against {base}", flush=True)
        st = subprocess.run(
            ["schemathesis", "run", os.path.join(HERE, "..", "docs", "openapi.json"), "--url", base,
             "-H", f"Authorization: Bearer {token}", "--checks", "no_undocumented_server_error",
             # Previews wait up to 60 s for a port nobody opens; tests/api.rs covers them.
             "--exclude-path", "/v1/previews",
             "--max-examples", str(a.examples), "--request-timeout", "90",
             "--suppress-health-check", "all", "--continue-on-failure"],
            env=dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=HERE, SCHEMATHESIS_HOOKS="api_suite_hooks"),
            capture_output=True, text=True)
        out = st.stdout + st.stderr
        summary = [l for l in out.splitlines() if any(w in l for w in ("passed", "failed", "Test cases", "operations", "error"))]
        print("\n".join("  " + l.strip() for l in summary[-8:]))
        if st.returncode != 0:
            print(out[-6000:])
            failed.append("schemathesis")

        print("raw-socket attacks:", flush=True)
        for name, ok in attacks(host, port, token):
            if not ok:
                failed.append(name)
        time.sleep(3.5)  # let the slowloris connections finish trickling
        prober.stop = True
        prober.join()
        alive = srv.poll() is None
        print(f"health probes: {prober.count}, failures {len(prober.failures)}, worst {prober.worst * 1000:.0f} ms; "
              f"server alive: {alive}")
        if prober.failures:
            failed.append("health: " + prober.failures[0])
        if not alive:
            failed.append("the server died")
        internal = sum(1 for l in open(log_path) if '"status":500' in l)
        print(f"documented 500 internal answers: {internal}")
    finally:
        try:
            os.killpg(srv.pid, signal.SIGTERM)
            srv.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(srv.pid, signal.SIGKILL)
        shutil.rmtree(top, ignore_errors=True)
    print(f"api suite: {'FAILED: ' + ', '.join(failed) if failed else 'ok'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
