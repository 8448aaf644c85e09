#!/usr/bin/env python3
"""The preview gate's overhead: `scripts/bench-gate.py [--quick] BINARY`.

Starts `BINARY serve` (gate ports on 127.0.0.1) and a small dev server of its own on
127.0.0.1 (threaded, raw sockets, fixed answers, so the dev server costs little and the
gate's share shows), mints a grant, exchanges a token for the cookie, and measures:

- small GETs, one after another on one kept-alive connection: p50 and p90 through the
  gate and straight to the dev server, and their ratio (goal: p50 at most 1.3x); with
  `--vite VITE_JS` (the `vite/bin/vite.js` of an installed Vite) the same against a real
  Vite dev server serving a small module, the dev server the gate is for;
- a 50 MB body down (GET) and up (POST, read and dropped by the dev server), best of
  three: throughput through the gate and straight, and their ratio (goal: at least 0.8x);
- revoke to close: an upgraded connection (101) held open through the gate, then the
  revoke; the time from sending the revoke to the client reading EOF (median and max);
- memory per open connection: serve's RSS and thread count before and after N kept-alive
  connections that each made one request through the gate.

A benchmark, not a test: it prints figures (and the goals), and fails only if something
does not work at all. Runs only on loopback.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchserve import free_port, read_to_close, serve  # noqa: E402

BIG = 50 << 20
BIG_BODY = bytes(range(256)) * (BIG // 256)


def dev_server():
    """A dev server on 127.0.0.1: `/` small, `/big` 50 MB, POST `/sink` reads and drops,
    `/ws` switches protocols and holds the connection."""
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(512)

    def conn(s):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        f = s.makefile("rb", buffering=65536)
        try:
            while True:
                line = f.readline()
                if not line:
                    return
                length = 0
                upgrade = False
                while True:
                    h = f.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.partition(b":")
                    k = k.strip().lower()
                    if k == b"content-length":
                        length = int(v.strip())
                    if k == b"upgrade":
                        upgrade = True
                path = line.split(b" ")[1]
                if path == b"/big":
                    s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % BIG)
                    s.sendall(BIG_BODY)
                elif path == b"/sink":
                    left = length
                    while left > 0:
                        chunk = f.read(min(left, 1 << 20))
                        if not chunk:
                            return
                        left -= len(chunk)
                    s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                elif path == b"/ws" and upgrade:
                    s.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
                    while s.recv(65536):
                        pass
                    return
                else:
                    s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello")
        except OSError:
            return
        finally:
            s.close()

    def accept():
        while True:
            s, _ = ls.accept()
            threading.Thread(target=conn, args=(s,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return ls.getsockname()[1]


class Conn:
    """One kept-alive HTTP/1.1 connection that reads answers by Content-Length."""

    def __init__(self, port, headers=b""):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.f = self.s.makefile("rb", buffering=1 << 20)
        self.headers = headers

    def request(self, method, path, body=None):
        head = b"%s %s HTTP/1.1\r\nHost: app.localhost\r\n%s" % (method, path, self.headers)
        if body is not None:
            head += b"Content-Length: %d\r\n" % len(body)
        self.s.sendall(head + b"\r\n")
        if body is not None:
            self.s.sendall(body)
        status = int(self.f.readline().split(b" ")[1])
        length = 0
        while True:
            h = self.f.readline()
            if h in (b"\r\n", b""):
                break
            k, _, v = h.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v.strip())
        got = 0
        while got < length:
            chunk = self.f.read1(min(length - got, 1 << 20))
            if not chunk:
                raise OSError("closed in the middle of a body")
            got += len(chunk)
        return status, got

    def close(self):
        self.s.close()


def api(addr, token, method, path, body=None):
    host, port = addr.split(":")
    c = socket.create_connection((host, int(port)), timeout=30)
    data = json.dumps(body).encode() if body is not None else b""
    c.sendall(b"%s %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (method.encode(), path.encode(), token.encode(), len(data), data))
    raw = read_to_close(c)
    head, _, rest = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    return status, json.loads(rest) if rest.startswith(b"{") else rest


def wait_listen(port):
    deadline = time.time() + 15
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.02)
    sys.exit(f"the gate does not listen on {port}")


def mint(addr, token, dev, gate, who=None):
    body = {"port": dev, "gatePort": gate}
    if who:
        body["identity"] = {"scope": "bench", "id": who}
    status, g = api(addr, token, "POST", "/v1/previews/grants", body)
    if status != 200:
        sys.exit(f"mint: HTTP {status} {g}")
    wait_listen(gate)
    s = socket.create_connection(("127.0.0.1", gate), timeout=10)
    s.sendall(b"GET /?preview_token=%s HTTP/1.1\r\nHost: app.localhost\r\nConnection: close\r\n\r\n" % g["token"].encode())
    raw = read_to_close(s)
    for line in raw.split(b"\r\n"):
        if line.lower().startswith(b"set-cookie:"):
            return g, b"Cookie: " + line.split(b":", 1)[1].strip().split(b";")[0] + b"\r\n"
    sys.exit(f"no cookie from the exchange: {raw[:200]!r}")


def rss_threads(pid):
    rss = threads = 0
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
        if line.startswith("Threads:"):
            threads = int(line.split()[1])
    return rss, threads


def latency(port, headers, n, path=b"/"):
    c = Conn(port, headers)
    for _ in range(min(200, n)):
        c.request(b"GET", path)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        status, _ = c.request(b"GET", path)
        times.append(time.perf_counter() - t)
        if status != 200:
            sys.exit(f"GET / answered {status}")
    c.close()
    times.sort()
    return times[len(times) // 2], times[int(len(times) * 0.9)]


def throughput(port, headers, up):
    best = 0.0
    for _ in range(3):
        c = Conn(port, headers)
        t = time.perf_counter()
        if up:
            status, _ = c.request(b"POST", b"/sink", BIG_BODY)
        else:
            status, got = c.request(b"GET", b"/big")
            if got != BIG:
                sys.exit(f"GET /big: {got} bytes")
        dt = time.perf_counter() - t
        c.close()
        if status != 200:
            sys.exit(f"{'POST /sink' if up else 'GET /big'} answered {status}")
        best = max(best, BIG / dt)
    return best


def revoke_to_close(addr, token, dev, rounds):
    out = []
    for i in range(rounds):
        gate = free_port()
        g, cookie = mint(addr, token, dev, gate, f"round-{i}")
        s = socket.create_connection(("127.0.0.1", gate), timeout=10)
        s.sendall(b"GET /ws HTTP/1.1\r\nHost: app.localhost\r\n%sConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n" % cookie)
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(4096)
        if b" 101 " not in head.split(b"\r\n")[0]:
            sys.exit(f"no 101 through the gate: {head[:100]!r}")
        t = time.perf_counter()
        status, _ = api(addr, token, "POST", f"/v1/previews/grants/{g['id']}/revoke", {})
        if status != 200:
            sys.exit(f"revoke: HTTP {status}")
        s.settimeout(10)
        try:
            while s.recv(4096):
                pass
        except OSError:
            pass
        out.append(time.perf_counter() - t)
        s.close()
    return out


def vite_latency(vite_js, addr, token, top, n):
    """p50/p90 of GET /msg.js (a small module, as a page's imports are) from Vite, direct
    and through the gate."""
    import subprocess
    app = os.path.join(top, "app")
    os.makedirs(app)
    with open(os.path.join(app, "index.html"), "w") as f:
        f.write('<!doctype html><script type="module" src="/msg.js"></script>\n')
    with open(os.path.join(app, "msg.js"), "w") as f:
        f.write("export const msg = 'hello';\n")
    port = free_port()
    v = subprocess.Popen(["node", vite_js, "--host", "127.0.0.1", "--port", str(port), "--strictPort"],
                         cwd=app, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=dict(os.environ, BROWSER="none", CI="true"))
    try:
        deadline = time.time() + 60
        while True:
            try:
                if Conn(port).request(b"GET", b"/msg.js")[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                sys.exit("Vite did not answer within 60 s")
            time.sleep(0.2)
        gate = free_port()
        _, cookie = mint(addr, token, port, gate, "vite")
        d50, d90 = latency(port, b"", n, b"/msg.js")
        g50, g90 = latency(gate, cookie, n, b"/msg.js")
        print(f"Vite, GET /msg.js, {n} in a row on one connection:")
        print(f"  direct   p50 {d50 * 1e6:7.1f} us   p90 {d90 * 1e6:7.1f} us")
        print(f"  gate     p50 {g50 * 1e6:7.1f} us   p90 {g90 * 1e6:7.1f} us")
        print(f"  ratio    p50 {g50 / d50:.2f}x (goal <= 1.3x)   p90 {g90 / d90:.2f}x")
    finally:
        v.terminate()
        v.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary")
    ap.add_argument("--quick", action="store_true", help="fewer requests and connections")
    ap.add_argument("--vite", metavar="VITE_JS", help="also measure against a real Vite dev server")
    a = ap.parse_args()
    n = 500 if a.quick else 3000
    conns = 50 if a.quick else 200
    with tempfile.TemporaryDirectory(prefix="gitterm-bench-gate-") as top:
        p, addr, token = serve(os.path.abspath(a.binary), top, "--preview-address", "127.0.0.1")
        try:
            dev = dev_server()
            gate = free_port()
            _, cookie = mint(addr, token, dev, gate)
            print(f"serve {addr}, dev server 127.0.0.1:{dev}, gate 127.0.0.1:{gate}")

            d50, d90 = latency(dev, b"", n)
            g50, g90 = latency(gate, cookie, n)
            print(f"small GET, {n} in a row on one connection:")
            print(f"  direct   p50 {d50 * 1e6:7.1f} us   p90 {d90 * 1e6:7.1f} us")
            print(f"  gate     p50 {g50 * 1e6:7.1f} us   p90 {g90 * 1e6:7.1f} us")
            print(f"  ratio    p50 {g50 / d50:.2f}x (goal <= 1.3x)   p90 {g90 / d90:.2f}x   "
                  f"added p50 {(g50 - d50) * 1e6:.1f} us")

            if a.vite:
                vite_latency(a.vite, addr, token, top, n // 3)

            for up in (False, True):
                what = "POST 50 MB up" if up else "GET 50 MB down"
                td = throughput(dev, b"", up)
                tg = throughput(gate, cookie, up)
                print(f"{what} (best of 3): direct {td / 1e6:7.1f} MB/s   gate {tg / 1e6:7.1f} MB/s   "
                      f"ratio {tg / td:.2f}x (goal >= 0.8x)")

            rounds = 3 if a.quick else 10
            rc = revoke_to_close(addr, token, dev, rounds)
            print(f"revoke to close of an open upgraded connection ({rounds} rounds): "
                  f"median {statistics.median(rc) * 1e3:.1f} ms   max {max(rc) * 1e3:.1f} ms (bound: 1 s)")

            time.sleep(0.5)
            rss0, th0 = rss_threads(p.pid)
            held = []
            for _ in range(conns):
                c = Conn(gate, cookie)
                c.request(b"GET", b"/")
                held.append(c)
            time.sleep(0.5)
            rss1, th1 = rss_threads(p.pid)
            print(f"{conns} open kept-alive connections through the gate: RSS +{(rss1 - rss0) / 1024:.0f} KiB "
                  f"({(rss1 - rss0) / conns / 1024:.1f} KiB each), threads {th0} -> {th1}")
            for c in held:
                c.close()
        finally:
            p.terminate()
            p.wait(timeout=30)


if __name__ == "__main__":
    main()
