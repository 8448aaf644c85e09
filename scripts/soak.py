#!/usr/bin/env python3
"""Soak test: drives a live `gitterm-agent serve` with many jobs of every kind (quick ones,
output floods, secret printers, timed-out, cancelled, idle-timed-out, escaping daemons,
previews), up to 64 at once, then checks and prints:
  - every record final and consistent with what its job did;
  - no secret value anywhere under the state root;
  - zero processes of any job still alive;
  - the server's open fds and RSS back to their level after warm-up (no leak);
  - throughput in jobs/s.
Exits non-zero on any violation.

Usage: scripts/soak.py [--jobs N] [--concurrency C] [BINARY]
(default: 10000 jobs, 64 at once, target/release/gitterm-agent)"""
import argparse
import base64
import concurrent.futures
import json
import os
import random
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import threading
import time
import http.client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchserve import free_port  # noqa: E402

failures = []
lock = threading.Lock()
# Tampering attempts by kind, all of which the agent must have survived.
tampering = {}


def fail(msg):
    with lock:
        failures.append(msg)
        if len(failures) <= 20:
            print("FAIL:", msg, flush=True)


class Client:
    def __init__(self, port, token):
        self.port, self.token = port, token
        self.local = threading.local()

    def conn(self):
        c = getattr(self.local, "c", None)
        if c is None:
            c = self.local.c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        return c

    def call(self, method, path, body=None):
        for attempt in range(3):
            try:
                c = self.conn()
                headers = {"Authorization": f"Bearer {self.token}"}
                data = None
                if body is not None:
                    data = json.dumps(body).encode()
                    headers["Content-Type"] = "application/json"
                c.request(method, path, body=data, headers=headers)
                r = c.getresponse()
                raw = r.read()
                return r.status, json.loads(raw) if raw else {}
            except (OSError, http.client.HTTPException):
                self.local.c = None
                if attempt == 2:
                    raise
                time.sleep(0.1)


def secret():
    return "sk-" + "".join(random.choice(string.ascii_letters + string.digits) for _ in range(24))


def run_one(cl, kind, i, secrets_seen):
    """Runs one job of `kind` and checks its final record. Returns the job id."""
    if kind == "quick":
        st, r = cl.call("POST", "/v1/jobs", {"command": f"echo quick-{i}", "waitSeconds": 60})
        ok = r.get("status") == "succeeded" and r.get("output") == f"quick-{i}\n" and r.get("exitCode") == 0
        want = "succeeded"
    elif kind == "fail":
        st, r = cl.call("POST", "/v1/jobs", {"command": "echo oops >&2; exit 3", "waitSeconds": 60})
        ok = r.get("status") == "failed" and r.get("exitCode") == 3 and r.get("output") == "oops\n"
        want = "failed"
    elif kind == "flood":
        st, r = cl.call("POST", "/v1/jobs", {
            "command": "head -c 2000000 /dev/zero | tr '\\0' x | fold -w 99", "waitSeconds": 120})
        # fold ends each full 99-byte line with \n; the last 2 bytes have none.
        ok = r.get("status") == "succeeded" and r.get("outputBytes") == 2_000_000 + 2_000_000 // 99
        want = "succeeded"
    elif kind == "secret":
        s = secret()
        with lock:
            secrets_seen.append(s)
        cmd = 'echo "v=$SOAK_S"; printf %s "$SOAK_S" | base64; printf "%s\\n" "$SOAK_S" | cut -c1-5; echo "${SOAK_S}${SOAK_S}"'
        st, r = cl.call("POST", "/v1/jobs", {"command": cmd, "secretEnv": {"SOAK_S": s}, "waitSeconds": 60})
        out = r.get("output", "")
        b64 = base64.b64encode(s.encode()).decode()
        ok = (r.get("status") == "succeeded" and s not in out and b64[:len(b64) - 4] not in out
              and out.startswith("v=[redacted]\n"))
        want = "succeeded"
    elif kind == "timeout":
        st, r = cl.call("POST", "/v1/jobs", {"command": "sleep 30", "timeoutSeconds": 1, "waitSeconds": 60})
        ok = r.get("status") == "timed_out"
        want = "timed_out"
    elif kind == "idle":
        st, r = cl.call("POST", "/v1/jobs", {"command": "echo a; sleep 30", "idleTimeoutSeconds": 1, "waitSeconds": 60})
        ok = r.get("status") == "timed_out" and r.get("output") == "a\n"
        want = "timed_out"
    elif kind == "cancel":
        st, r = cl.call("POST", "/v1/jobs", {"command": "sleep 30", "background": True})
        jid = r.get("id", "")
        st, r = cl.call("POST", f"/v1/jobs/{jid}/cancel")
        ok = r.get("status") == "cancelled"
        want = "cancelled"
    elif kind == "escape":
        st, r = cl.call("POST", "/v1/jobs", {
            "command": "setsid sleep 300 & (setsid sh -c 'sleep 300' &); sleep 300 & echo started", "waitSeconds": 60})
        ok = r.get("status") == "succeeded" and r.get("output") == "started\n"
        want = "succeeded"
    elif kind == "stop-supervisor":
        # Tampering (possible when jobs run as the agent's user): stop the supervisor,
        # then outlive the timeout. The agent must continue it and end the job on time.
        t = time.time()
        st, r = cl.call("POST", "/v1/jobs", {
            "command": "kill -STOP $PPID; sleep 10", "timeoutSeconds": 1, "waitSeconds": 60})
        ok = r.get("status") == "timed_out" and time.time() - t < 8
        want = "timed_out"
        with lock:
            tampering[kind] = tampering.get(kind, 0) + 1
    elif kind == "kill-supervisor":
        # Tampering: hold the job's lock and kill the supervisor. Readers must not block,
        # and the job must end up lost, its processes swept.
        st, r = cl.call("POST", "/v1/jobs", {
            "command": "L=$GITTERM_HOME/jobs/$GITTERM_JOB_ID; "
                       "(setsid sh -c 'sleep 0.3; exec flock -n \"$0\" sleep 3' \"$L\" &); "
                       "sleep 0.1; kill -9 $PPID; sleep 5",
            "waitSeconds": 60})
        jid = r.get("id", "")
        deadline = time.time() + 30
        while time.time() < deadline:
            st, r = cl.call("GET", f"/v1/jobs/{jid}")
            if r.get("status") == "lost":
                break
            time.sleep(0.2)
        ok = r.get("status") == "lost"
        want = "lost"
        with lock:
            tampering[kind] = tampering.get(kind, 0) + 1
    elif kind == "forge-marker":
        st, r = cl.call("POST", "/v1/jobs", {
            "command": "true", "env": {"GITTERM_JOB_ID": "job_00000000000000000000"}})
        ok = st == 400 and r.get("error", {}).get("code") == "invalid"
        with lock:
            tampering[kind] = tampering.get(kind, 0) + 1
        if not ok:
            fail(f"{kind} #{i}: {st} {json.dumps(r)[:300]}")
        return None, None
    elif kind == "preview":
        port = free_port()
        st, r = cl.call("POST", "/v1/previews", {
            "port": port, "command": f"exec python3 -m http.server {port} --bind 127.0.0.1",
            "probe": "http", "path": "/", "waitSeconds": 30})
        jid = r.get("jobId")
        ok = st == 200 and r.get("ready") is True and jid
        if jid:
            cl.call("POST", f"/v1/jobs/{jid}/cancel")
            st, r = cl.call("GET", f"/v1/jobs/{jid}?waitSeconds=30")
        want = "cancelled"
    else:
        raise ValueError(kind)
    if not ok:
        fail(f"{kind} #{i}: {st} {json.dumps(r)[:300]}")
    return r.get("id") or r.get("jobId"), want


def mem(pid):
    rss = fds = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        pass
    return rss, fds


def job_processes(ids):
    alive = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        for kv in env:
            if kv.startswith(b"GITTERM_JOB_ID=") and kv[15:].decode() in ids:
                alive.append(int(p))
    return alive


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("binary", nargs="?", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                             "..", "target", "release", "gitterm-agent"))
    a = ap.parse_args()
    top = tempfile.mkdtemp(prefix="gitterm-soak-")
    root = os.path.join(top, "root")
    port = free_port()
    env = dict(os.environ, GITTERM_HOME=root)
    log = open(os.path.join(top, "serve.log"), "wb")
    srv = subprocess.Popen([a.binary, "serve", "--listen", f"127.0.0.1:{port}", "--grace", "1"],
                           env=env, stdout=subprocess.DEVNULL, stderr=log)
    ids, secrets_seen = {}, []
    try:
        deadline = time.time() + 20
        while not os.path.exists(os.path.join(root, "agent.token")) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        token = open(os.path.join(root, "agent.token")).read().strip()
        cl = Client(port, token)
        kinds = (["quick"] * 40 + ["fail"] * 10 + ["flood"] * 3 + ["secret"] * 20 + ["timeout"] * 5 +
                 ["idle"] * 5 + ["cancel"] * 10 + ["escape"] * 5 + ["preview"] * 2 +
                 ["stop-supervisor"] * 2 + ["kill-supervisor"] * 2 + ["forge-marker"] * 2)
        plan = [kinds[i % len(kinds)] for i in range(a.jobs)]
        random.Random(7).shuffle(plan)
        # Warm up at full concurrency (thread stacks, allocator arenas), then measure: growth
        # after that which scales with the job count is a leak.
        warm = min(500, max(a.concurrency * 2, a.jobs // 4))
        with concurrent.futures.ThreadPoolExecutor(a.concurrency) as ex:
            list(ex.map(lambda ik: run_one(cl, ik[1], ik[0], secrets_seen), enumerate(plan[:warm])))
        base_rss, base_fds = mem(srv.pid)
        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(a.concurrency) as ex:
            for jid, want in ex.map(lambda ik: run_one(cl, ik[1], ik[0], secrets_seen), enumerate(plan[warm:], warm)):
                if jid:
                    ids[jid] = want
        elapsed = time.time() - t0
        cl.local.c = None
        time.sleep(1.5)
        end_rss, end_fds = mem(srv.pid)

        # Every record final and consistent.
        # The listing is paged: follow `next` to the end.
        by_id, cursor = {}, None
        while True:
            q = "/v1/jobs?limit=1000" + (f"&cursor={cursor}" if cursor else "")
            st, listing = cl.call("GET", q)
            by_id.update({j.get("id"): j for j in listing.get("jobs", [])})
            cursor = listing.get("next")
            if not cursor:
                break
        for jid, want in ids.items():
            j = by_id.get(jid)
            if not j or j.get("status") != want:
                fail(f"record {jid}: want {want}, got {j and j.get('status')}")
            elif j.get("endedAt") is None:
                fail(f"record {jid} ended without endedAt")
        # No secret anywhere under the state root.
        # Every secret starts with "sk-" and has a fixed length: find each "sk-" once and
        # look the candidate up, so the scan is linear in the bytes stored.
        leaked = 0
        wanted = {s.encode() for s in secrets_seen}
        slen = len(secrets_seen[0]) if secrets_seen else 0
        for d, _, files in os.walk(root):
            for f in files:
                with open(os.path.join(d, f), "rb") as fh:
                    data = fh.read()
                at = data.find(b"sk-")
                while at != -1:
                    if data[at:at + slen] in wanted:
                        leaked += 1
                        fail(f"secret found in {os.path.join(d, f)}")
                        break
                    at = data.find(b"sk-", at + 1)
        alive = job_processes(set(ids) | set(by_id))
        if alive:
            fail(f"{len(alive)} job processes still alive: {alive[:10]}")
        fd_leak = end_fds - base_fds
        rss_growth = end_rss - base_rss
        if fd_leak > 2:
            fail(f"server fds grew from {base_fds} to {end_fds}")
        if rss_growth > 4096:
            fail(f"server RSS grew from {base_rss} KiB to {end_rss} KiB")
        print(f"soak: {len(ids)} jobs in {elapsed:.1f} s = {len(ids) / elapsed:.1f} jobs/s at concurrency {a.concurrency}")
        print(f"soak: secrets checked {len(secrets_seen)}, leaked {leaked}; job processes alive {len(alive)}")
        print(f"soak: server fds {base_fds} -> {end_fds}, RSS {base_rss} -> {end_rss} KiB")
        print("soak: tampering attempts survived: " +
              (", ".join(f"{k} {v}" for k, v in sorted(tampering.items())) or "none"))
    finally:
        srv.send_signal(signal.SIGTERM)
        try:
            srv.wait(10)
        except subprocess.TimeoutExpired:
            srv.kill()
        for p in job_processes(set(ids)):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(top, ignore_errors=True)
    print(f"soak: {'FAILED' if failures else 'ok'} ({len(failures)} violations)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
