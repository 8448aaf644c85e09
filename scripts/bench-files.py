#!/usr/bin/env python3
"""Figures of file watches and archives on a live `serve` (a benchmark, never a test).

  scripts/bench-files.py [BINARY] [--quick] [--burst-only]

- watch latency: a long-poll waits on a watch, a file is made, and the time from just
  before the write to the answer is taken, N times: p50 and max;
- events per second in a burst: N empty files made by `xargs touch`, and the time until
  the journal holds the last one (or a rescan covering it);
- archive MB/s both ways against GNU tar on the same tree (`tar -c | cat`, `tar -x`),
  plain and gzip (ours at level 1, so tar with `gzip -1` beside the default);
- memory: serve's resident set, sampled every 20 ms, while a 1 GiB archive goes out
  and comes back in.

`--burst-only[=N]` runs the burst (N files, 20,000 unless told) five times and nothing
else, with the watch reader thread's CPU time (to compare builds of the reader).

BINARY defaults to target/release/gitterm-agent. Everything happens in a temporary
folder (TMPDIR: on a busy disk, TMPDIR=/dev/shm keeps the burst at the speed of the
kernel, not of the disk's journal), removed at the end.
"""
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchserve import serve  # noqa: E402


class Api:
    def __init__(self, addr, token):
        host, port = addr.rsplit(":", 1)
        self.host, self.port, self.token = host, int(port), token
        self.c = http.client.HTTPConnection(host, int(port), timeout=120)

    def call(self, method, path, body=None):
        h = {"Authorization": "Bearer " + self.token}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        self.c.request(method, path, body=data, headers=h)
        r = self.c.getresponse()
        out = r.read()
        if r.status != 200:
            raise SystemExit(f"{method} {path}: {r.status} {out[:300]!r}")
        return json.loads(out)


def q(s):
    return urllib.parse.quote(s, safe="/")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Sampler(threading.Thread):
    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0, False

    def run(self):
        while not self.stop:
            self.peak = max(self.peak, rss_kib(self.pid))
            time.sleep(0.02)


def watch_latency(api, top, n):
    d = os.path.join(top, "lat")
    os.makedirs(d)
    w = api.call("POST", "/v1/files/watches", {"path": d, "recursive": True})
    cursor = w["cursor"]
    lat = []
    for i in range(n):
        t0 = [0.0]

        def write():
            time.sleep(0.02)
            t0[0] = time.perf_counter()
            open(os.path.join(d, f"f{i}"), "w").close()

        t = threading.Thread(target=write)
        t.start()
        page = api.call("GET", f"/v1/files/watches/{w['id']}/events?after={q(cursor)}"
                               "&waitSeconds=30")
        t1 = time.perf_counter()
        t.join()
        assert page["events"], page
        lat.append((t1 - t0[0]) * 1000)
        cursor = page["next"]
        # Drain what else the write made (its close), so the next poll waits.
        page = api.call("GET", f"/v1/files/watches/{w['id']}/events?after={q(cursor)}")
        cursor = page["next"]
    api.call("DELETE", f"/v1/files/watches/{w['id']}")
    lat.sort()
    return statistics.median(lat), lat[-1]


def thread_cpu(pid, name):
    """CPU seconds (user + system) of the process's threads called `name`."""
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                st = f.read()
        except OSError:
            continue
        comm = st[st.index("(") + 1:st.rindex(")")]
        if comm == name:
            fields = st[st.rindex(")") + 2:].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def burst(api, top, n):
    d = os.path.join(top, "burst")
    os.makedirs(d)
    w = api.call("POST", "/v1/files/watches", {"path": d, "recursive": True})
    names = "\n".join(f"b{i:06d}" for i in range(n)).encode()
    # One `touch` per few thousand names (xargs): files made at the speed of the system
    # calls, not of a Python loop. Read while they are made, as a client keeping up
    # would (read only afterwards, a burst over the 10,000 events a watch keeps is a
    # `limit` rescan, which says nothing of the kernel's queue).
    t0 = time.perf_counter()
    maker = subprocess.Popen(["xargs", "touch"], stdin=subprocess.PIPE, cwd=d)
    threading.Thread(target=lambda: maker.communicate(names), daemon=True).start()
    cursor, seen, reasons = w["cursor"], 0, []
    last = f"b{n - 1:06d}"
    made = None
    while True:
        page = api.call("GET", f"/v1/files/watches/{w['id']}/events?after={q(cursor)}"
                               "&limit=1000&waitSeconds=2")
        if made is None and maker.poll() is not None:
            made = time.perf_counter() - t0
        cursor = page["next"]
        seen += len(page["events"])
        reasons += [e.get("reason") for e in page["events"] if e["type"] == "rescan"]
        if any(e["path"].endswith(last) for e in page["events"]):
            break
        if not page["events"] and made is not None:
            break
    took = time.perf_counter() - t0
    maker.wait()
    if made is None:
        made = took
    api.call("DELETE", f"/v1/files/watches/{w['id']}")
    burst.reasons = reasons
    return made, took, seen, len(reasons)


def make_tree(top, files, size, big):
    src = os.path.join(top, "tree")
    block = os.urandom(size)
    for i in range(files):
        sub = os.path.join(src, f"d{i % 50:02d}", f"e{i % 7}")
        os.makedirs(sub, exist_ok=True)
        with open(os.path.join(sub, f"f{i}.bin"), "wb") as f:
            f.write(block)
    if big:
        with open(os.path.join(src, "big.bin"), "wb") as f:
            chunk = os.urandom(1 << 20)
            for _ in range(big):
                f.write(chunk)
    total = 0
    for root, _, names in os.walk(src):
        for n in names:
            total += os.path.getsize(os.path.join(root, n))
    return src, total


def timed(cmd, **kw):
    t0 = time.perf_counter()
    subprocess.run(cmd, shell=True, check=True, **kw)
    return time.perf_counter() - t0


def archives(addr, token, top, src, total, pid):
    base = f"http://{addr}/v1/files/archive"
    auth = f"-H 'Authorization: Bearer {token}'"
    rows = []
    for fmt, tar_flag, ours_note in [("tar", "", ""), ("tar.gz", "-z", " (level 1)")]:
        out = os.path.join(top, f"out.{fmt}")
        s = Sampler(pid)
        s.start()
        t_get = timed(f"curl -sSf {auth} '{base}?path={q(src)}&format={fmt}' -o {out}")
        s.stop = True
        s.join()
        size = os.path.getsize(out)
        t_tar = timed(f"tar {tar_flag} -cf - -C {src} . | cat > /dev/null")
        gz1 = ""
        if fmt == "tar.gz":
            t1 = timed(f"tar -I 'gzip -1' -cf - -C {src} . | cat > /dev/null")
            gz1 = f", tar with gzip -1 {total / t1 / 1e6:.0f} MB/s"
        dst = os.path.join(top, f"in-{fmt}")
        s2 = Sampler(pid)
        s2.start()
        t_put = timed(f"curl -sSf {auth} -T {out} '{base}?path={q(dst)}&format={fmt}' -o /dev/null")
        s2.stop = True
        s2.join()
        dst2 = os.path.join(top, f"tar-in-{fmt}")
        os.makedirs(dst2)
        t_tarx = timed(f"tar {tar_flag} -xf {out} -C {dst2}")
        rows.append(
            f"{fmt}: out {total / t_get / 1e6:.0f} MB/s{ours_note} vs tar {total / t_tar / 1e6:.0f} MB/s{gz1}; "
            f"in {total / t_put / 1e6:.0f} MB/s vs tar -x {total / t_tarx / 1e6:.0f} MB/s "
            f"({total / 1e6:.0f} MB of files, archive {size / 1e6:.0f} MB; serve's peak RSS "
            f"{s.peak / 1024:.1f} MiB out, {s2.peak / 1024:.1f} MiB in)")
        shutil.rmtree(dst, ignore_errors=True)
        shutil.rmtree(dst2, ignore_errors=True)
        os.remove(out)
    return rows


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    quick = "--quick" in sys.argv
    exe = args[0] if args else "target/release/gitterm-agent"
    top = tempfile.mkdtemp(prefix="bench-files-")
    p = None
    try:
        p, addr, token = serve(os.path.abspath(exe), top)
        api = Api(addr, token)
        only = [a for a in sys.argv if a.startswith("--burst-only")]
        if only:
            n = int(only[0].partition("=")[2] or 20000)
            for i in range(5):
                cpu0 = thread_cpu(p.pid, "fswatch")
                made, took, seen, rescans = burst(api, os.path.join(top, f"r{i}"), n)
                cpu = thread_cpu(p.pid, "fswatch") - cpu0
                print(f"burst of {n} files: made in {made:.2f} s; after {took:.2f} s: "
                      f"{seen} events, rescans {burst.reasons}; the reader thread's CPU "
                      f"{cpu:.2f} s")
            return
        idle = rss_kib(p.pid)
        print(f"serve idle: {idle / 1024:.1f} MiB resident")
        p50, mx = watch_latency(api, top, 50 if quick else 200)
        print(f"watch latency (write to long-poll answer): p50 {p50:.2f} ms, max {mx:.2f} ms")
        n = 2000 if quick else 20000
        made, took, seen, rescans = burst(api, top, n)
        print(f"burst of {n} files: made in {made:.2f} s ({n / made:.0f}/s); all journaled "
              f"after {took:.2f} s: {seen / took:.0f} events/s, {seen} events, {rescans} rescans")
        src, total = make_tree(top, 200 if quick else 2000, 64 << 10, 16 if quick else 256)
        for row in archives(addr, token, top, src, total, p.pid):
            print(row)
        shutil.rmtree(src)
        # 1 GiB in one archive, out and in: memory stays flat.
        big, total = make_tree(top, 10, 1 << 10, 64 if quick else 1024)
        s = Sampler(p.pid)
        s.start()
        out = os.path.join(top, "gig.tar")
        t = timed(f"curl -sSf -H 'Authorization: Bearer {token}' "
                  f"'http://{addr}/v1/files/archive?path={q(big)}' -o {out}")
        t2 = timed(f"curl -sSf -H 'Authorization: Bearer {token}' -T {out} "
                   f"'http://{addr}/v1/files/archive?path={q(os.path.join(top, 'gig-in'))}' -o /dev/null")
        s.stop = True
        s.join()
        print(f"{total / 2**30:.2f} GiB archive: out {t:.1f} s, in {t2:.1f} s; serve's peak RSS "
              f"{s.peak / 1024:.1f} MiB (idle {idle / 1024:.1f} MiB)")
    finally:
        if p:
            p.terminate()
            p.wait()
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
