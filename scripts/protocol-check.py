#!/usr/bin/env python3
"""HTTP/1.1 and WebSocket conformance of a live `gitterm-agent serve`, judged by clients
this project did not write: Python's `h11` (a strict HTTP/1.1 state machine), `websockets`
(an RFC 6455 client) and curl.

Usage: scripts/protocol-check.py [BINARY]   (default: target/debug/gitterm-agent)

It installs `h11` and `websockets` into a private virtualenv under the system's temporary
folder when they are missing, starts `serve` on an ephemeral port with a fresh state root,
and prints one line per check; it exits non-zero if any fails.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

VENV = os.path.join(tempfile.gettempdir(), "gitterm-protocol-check-venv")


def ensure_modules():
    """Re-runs this script under a virtualenv holding h11 and websockets, if needed."""
    try:
        import h11  # noqa: F401
        import websockets  # noqa: F401
        return
    except ImportError:
        pass
    if os.environ.get("GITTERM_PROTOCOL_VENV"):
        sys.exit("h11 and websockets could not be imported, even from the virtualenv")
    py = os.path.join(VENV, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    subprocess.run([py, "-m", "pip", "install", "--quiet", "h11", "websockets"], check=True)
    os.environ["GITTERM_PROTOCOL_VENV"] = "1"
    os.execv(py, [py] + sys.argv)


ensure_modules()

import h11  # noqa: E402
from websockets.sync.client import connect as ws_connect  # noqa: E402
from websockets.exceptions import InvalidStatus  # noqa: E402

results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name}{'' if ok else ': ' + str(detail)}")


def start(exe, top):
    root = os.path.join(top, "root")
    env = dict(os.environ, GITTERM_HOME=root)
    log = open(os.path.join(top, "serve.log"), "w+")
    p = subprocess.Popen([exe, "serve", "--listen", "127.0.0.1:0", "--grace", "1",
                          "--max-connections", "16"], env=env, stderr=log,
                         stdout=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline:
        log.seek(0)
        line = log.readline()
        if line.endswith("\n"):
            ev = json.loads(line)
            token = open(os.path.join(root, "agent.token")).read().strip()
            return p, ev["address"], token
        time.sleep(0.05)
    p.kill()
    sys.exit("the server did not start")


class H11Conn:
    """One kept-alive connection, every byte of it through h11's client state machine."""

    def __init__(self, addr):
        host, port = addr.rsplit(":", 1)
        self.addr = addr
        self.sock = socket.create_connection((host, int(port)), timeout=15)
        self.conn = h11.Connection(our_role=h11.CLIENT)

    def request(self, method, target, headers=(), body=b""):
        hs = [("Host", self.addr)] + list(headers)
        if body:
            hs.append(("Content-Length", str(len(body))))
        self.sock.sendall(self.conn.send(h11.Request(method=method, target=target, headers=hs)))
        if body:
            self.sock.sendall(self.conn.send(h11.Data(data=body)))
        self.sock.sendall(self.conn.send(h11.EndOfMessage()))
        resp, data = None, b""
        while True:
            ev = self.conn.next_event()
            if ev is h11.NEED_DATA:
                self.conn.receive_data(self.sock.recv(65536))
                continue
            if isinstance(ev, h11.Response):
                resp = ev
            elif isinstance(ev, h11.Data):
                data += ev.data
            elif isinstance(ev, h11.EndOfMessage):
                break
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        return resp, data


def header(resp, name):
    for k, v in resp.headers:
        if k.decode().lower() == name.lower():
            return v.decode()
    return None


def http_checks(addr, token):
    auth = [("Authorization", f"Bearer {token}")]
    c = H11Conn(addr)
    # HEAD and GET alternating on one connection: h11 fails on any body after a HEAD.
    try:
        for path in ["/v1/health", "/v1/jobs", "/v1/nothing", "/v1/jobs/job_00000000000000000000"]:
            h, body = c.request("HEAD", path, auth)
            g, gbody = c.request("GET", path, auth)
            same = (h.status_code == g.status_code and body == b""
                    and header(h, "content-length") == str(len(gbody)))
            check(f"h11: HEAD {path} is its GET without the body", same,
                  f"{h.status_code} {header(h, 'content-length')} vs {g.status_code} {len(gbody)}")
        r, _ = c.request("GET", "/v1/health")
        date = header(r, "date")
        ok = date is not None
        if ok:
            import email.utils
            ok = abs(email.utils.parsedate_to_datetime(date).timestamp() - time.time()) < 60
        check("h11: a Date header, IMF-fixdate, now", ok, date)
    except h11.RemoteProtocolError as e:
        check("h11: the server's answers parse", False, e)
    # Host: h11 itself insists on one, so these are written raw.
    for name, raw, want in [
        ("no Host in HTTP/1.1 is 400", b"GET /v1/health HTTP/1.1\r\n\r\n", b" 400 "),
        ("two Host lines are 400", b"GET /v1/health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", b" 400 "),
        ("an absolute-form target is served",
         b"GET http://" + addr.encode() + b"/v1/health HTTP/1.1\r\nHost: " + addr.encode() + b"\r\n\r\n",
         b" 200 "),
    ]:
        host, port = addr.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=10)
        s.sendall(raw)
        got = s.recv(4096)
        s.close()
        check(name, want in got.split(b"\r\n")[0] + b" ", got[:60])
    # curl: a HEAD, then a GET on the same connection (curl warns of "Excess found" when a
    # HEAD answer carries a body), and If-None-Match on a file.
    if shutil.which("curl"):
        base = f"http://{addr}"
        p = subprocess.run(["curl", "-sS", "-v", "-I", f"{base}/v1/health", "--next",
                            f"{base}/v1/health"], capture_output=True, text=True, timeout=30)
        check("curl: HEAD then GET on one connection, nothing in excess",
              p.returncode == 0 and "Excess" not in p.stderr and "Re-using" in p.stderr
              and '"ok":true' in p.stdout, p.stderr[-400:])
        f = os.path.join(tempfile.gettempdir(), f"protocol-check-{os.getpid()}.txt")
        with open(f, "w") as fh:
            fh.write("cached\n")
        try:
            url = f"{base}/v1/files/content?path={f}"
            a = ["-H", f"Authorization: Bearer {token}"]
            p = subprocess.run(["curl", "-sS", "-D", "-", "-o", "/dev/null", *a, url],
                               capture_output=True, text=True, timeout=30)
            etag = next((l.split(":", 1)[1].strip() for l in p.stdout.splitlines()
                         if l.lower().startswith("etag:")), None)
            p = subprocess.run(["curl", "-sS", "-w", "%{http_code} %{size_download}", "-o",
                                "/dev/null", *a, "-H", f"If-None-Match: {etag}", url],
                               capture_output=True, text=True, timeout=30)
            check("curl: If-None-Match with the ETag is 304, no body", p.stdout == "304 0",
                  p.stdout + p.stderr)
        finally:
            os.unlink(f)
    else:
        print("skip curl checks: curl is not installed")


def ws_checks(addr, token):
    host, port = addr.rsplit(":", 1)
    r = json.loads(subprocess.run(
        ["curl", "-sS", "-H", f"Authorization: Bearer {token}", "-H", "Content-Type: application/json",
         "-d", json.dumps({"command": "PS1='$ ' exec sh -i", "pty": {"cols": 80, "rows": 24},
                           "background": True}), f"http://{addr}/v1/jobs"],
        capture_output=True, text=True, timeout=60).stdout)
    jid = r["id"]
    url = f"ws://{addr}/v1/jobs/{jid}/pty"
    hdr = {"Authorization": f"Bearer {token}"}
    # A session: keystrokes, the echo, a clean close.
    with ws_connect(url, additional_headers=hdr, open_timeout=15) as w:
        w.send(b"echo via-websockets-$((6*7))\n")
        seen = b""
        deadline = time.time() + 15
        while b"via-websockets-42" not in seen and time.time() < deadline:
            m = w.recv(timeout=15)
            if isinstance(m, bytes):
                seen += m
        check("websockets: keystrokes in, output out", b"via-websockets-42" in seen, seen[-200:])
    # A text frame that is not UTF-8: websockets will not send one, so it is framed by hand
    # and the answer read with websockets' own frame parser.
    from websockets.frames import Frame, Opcode, Close
    from websockets.streams import StreamReader
    s = socket.create_connection((host, int(port)), timeout=15)
    s.sendall((f"GET /v1/jobs/{jid}/pty HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n"
               "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n").encode()
              + bytes([0x81, 0x82, 1, 2, 3, 4, 0xff ^ 1, 0xfe ^ 2]))
    reader = StreamReader()
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(65536)
    reader.feed_data(buf.split(b"\r\n\r\n", 1)[1])
    code = None
    deadline = time.time() + 15
    while code is None and time.time() < deadline:
        parser = Frame.parse(reader.read_exact, mask=False)
        try:
            while True:
                try:
                    next(parser)
                except StopIteration as done:
                    f = done.value
                    break
                data = s.recv(65536)
                if not data:
                    raise EOFError
                reader.feed_data(data)
        except (EOFError, OSError):
            break
        if f.opcode is Opcode.CLOSE:
            code = Close.parse(f.data).code
    s.close()
    check("websockets frames: invalid UTF-8 is closed with 1007", code == 1007, code)
    # Another version: 426 naming 13.
    s = socket.create_connection((host, int(port)), timeout=15)
    s.sendall((f"GET /v1/jobs/{jid}/pty HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n"
               "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 8\r\n"
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n").encode())
    got = s.recv(4096)
    s.close()
    check("version 8 is 426 with Sec-WebSocket-Version: 13",
          got.startswith(b"HTTP/1.1 426") and b"Sec-WebSocket-Version: 13" in got, got[:200])
    # Upgrades count among the waiting: 16 connections, 8 may wait.
    import contextlib
    with contextlib.ExitStack() as stack:
        opened, refused = 0, 0
        for _ in range(10):
            try:
                stack.enter_context(ws_connect(url, additional_headers=hdr, open_timeout=15))
                opened += 1
            except InvalidStatus as e:
                refused += e.response.status_code == 429
        c = H11Conn(addr)
        h, _ = c.request("GET", "/v1/health")
        check("8 terminals open, 2 more refused 429, health answers",
              (opened, refused, h.status_code) == (8, 2, 200), (opened, refused, h.status_code))
    subprocess.run(["curl", "-sS", "-o", "/dev/null", "-X", "POST", "-H", f"Authorization: Bearer {token}",
                    "-H", "Content-Type: application/json", "-d", "{}",
                    f"http://{addr}/v1/jobs/{jid}/cancel"], timeout=60)


def main():
    exe = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/debug/gitterm-agent")
    top = tempfile.mkdtemp(prefix="gitterm-protocol-")
    p, addr, token = start(exe, top)
    try:
        http_checks(addr, token)
        ws_checks(addr, token)
    finally:
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
        shutil.rmtree(top, ignore_errors=True)
    failed = results.count(False)
    print(f"{len(results) - failed} of {len(results)} protocol checks passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
