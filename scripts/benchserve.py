"""A `serve` for the benchmark scripts: started on a free loopback port in a fresh state
root under `top`, answering once it has logged its address."""
import json
import os
import socket
import subprocess
import sys
import time


def serve(exe, top, *args):
    """Starts `exe serve` with `args`; returns (process, address, token)."""
    root = os.path.join(top, "root")
    log = open(os.path.join(top, "serve.log"), "w+")
    p = subprocess.Popen([exe, "serve", "--listen", "127.0.0.1:0", *args],
                         env=dict(os.environ, GITTERM_HOME=root), stderr=log,
                         stdout=subprocess.DEVNULL)
    deadline = time.time() + 30
    while True:
        log.seek(0)
        line = log.readline()
        if line.endswith("\n"):
            break
        if time.time() > deadline or p.poll() is not None:
            p.terminate()
            sys.exit("serve did not start: see " + log.name)
        time.sleep(0.05)
    addr = json.loads(line)["address"]
    token = open(os.path.join(root, "agent.token")).read().strip()
    return p, addr, token


def read_reply(sock, buf):
    """Reads one response framed by Content-Length from `sock`, after what `buf` already
    holds; returns (status, body bytes, what was read past it)."""
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(65536)
    h, buf = buf.split(b"\r\n\r\n", 1)
    status = int(h.split(b" ", 2)[1])
    n = 0
    for line in h.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            n = int(v)
    while len(buf) < n:
        buf += sock.recv(65536)
    return status, buf[:n], buf[n:]


def read_to_close(sock):
    """Everything `sock` sends until the peer closes; then closes it."""
    raw = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        raw += chunk
    sock.close()
    return raw


def free_port():
    """A loopback port free a moment ago (for a listener the script has another start)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p
