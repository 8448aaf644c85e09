#!/usr/bin/env python3
"""What limits and usage cost, against a live `serve` of BINARY:

1. The start of a job with limits {memoryBytes, cpus, pids} against one without (the
   goal: at most 1.1 times), and against a server whose jobs get no cgroup at all
   (GITTERM_NO_CGROUP: the floor, which is what every job's cgroups cost).
   A start is `POST /v1/jobs` with `background: true` of `true`, timed from the request to
   the answer (the shell runs by then), one at a time, median and p90 of N.
2. The cost of `usage` on `GET /v1/jobs/{id}`: a running job's record read N times from
   a server whose jobs have cgroups (usage read live from them on every answer) and from
   one whose jobs have none (nothing to read): the difference is the usage.

3. With `--baseline OTHER` (a build without job resources, e.g. of the commit before):
   plain starts on OTHER's server too, interleaved with this one's, for what the job's
   resource groups cost every start.

Usage: scripts/bench-limits.py [--n N] [--baseline OTHER] BINARY   (never run by cargo test)
"""
import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchserve import serve  # noqa: E402


def client(addr, token):
    host, port = addr.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=60)
    return c, {"Authorization": "Bearer " + token, "Content-Type": "application/json"}


def call(c, h, method, path, body=None):
    c.request(method, path, body=None if body is None else json.dumps(body), headers=h)
    r = c.getresponse()
    data = r.read()
    if r.status != 200:
        sys.exit(f"{method} {path}: {r.status} {data[:300]!r}")
    return json.loads(data)


def starts(c, h, n, limits):
    times = []
    body = {"command": "true", "background": True}
    if limits:
        body["limits"] = limits
    for _ in range(n):
        t = time.perf_counter()
        v = call(c, h, "POST", "/v1/jobs", body)
        times.append(time.perf_counter() - t)
        # Let it end before the next, so that ends do not overlap starts.
        call(c, h, "GET", f"/v1/jobs/{v['id']}?waitSeconds=30")
    return times


def gets(c, h, n, job):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        v = call(c, h, "GET", f"/v1/jobs/{job}")
        times.append(time.perf_counter() - t)
    return times, v["usage"]


def summary(name, ts):
    ts = sorted(ts)
    med = statistics.median(ts) * 1e3
    p90 = ts[int(len(ts) * 0.9) - 1] * 1e3
    print(f"  {name:<34} median {med:7.3f} ms   p90 {p90:7.3f} ms   (n={len(ts)})")
    return med


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--baseline", help="a binary without job resources, to compare starts with")
    a = ap.parse_args()
    exe = os.path.abspath(a.binary)
    limits = {"memoryBytes": 256 << 20, "cpus": 1.5, "pids": 200}
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    results = {}
    for label, env in [("cgroups", {}), ("no cgroup", {"GITTERM_NO_CGROUP": "1"})]:
        old = dict(os.environ)
        os.environ.update(env)
        try:
            with tempfile.TemporaryDirectory(prefix="bench-limits-") as top:
                p, addr, token = serve(exe, top)
                try:
                    c, h = client(addr, token)
                    caps = call(c, h, "GET", "/v1/sandbox")["limits"]
                    print(f"server with {label}: can enforce {caps}")
                    starts(c, h, 10, None)  # warm up
                    # Interleaved rounds, so that the machine's load falls on both alike.
                    plain, limited = [], []
                    for _ in range(max(1, a.n // 20)):
                        plain += starts(c, h, 10, None)
                        if all(caps.values()):
                            limited += starts(c, h, 10, limits)
                    results[(label, "plain")] = summary("start, no limits", plain)
                    if limited:
                        results[(label, "limited")] = summary("start, memory+cpus+pids", limited)
                    job = call(c, h, "POST", "/v1/jobs",
                               {"command": "sleep 600", "background": True})["id"]
                    gets(c, h, 20, job)
                    ts, usage = gets(c, h, a.n, job)
                    results[(label, "get")] = summary("GET /v1/jobs/{id} (running)", ts)
                    print(f"  usage in that answer: {usage}")
                    call(c, h, "POST", f"/v1/jobs/{job}/cancel", {})
                finally:
                    p.terminate()
                    p.wait()
        finally:
            os.environ.clear()
            os.environ.update(old)
    if a.baseline:
        base = os.path.abspath(a.baseline)
        with tempfile.TemporaryDirectory(prefix="bench-limits-") as t1, \
                tempfile.TemporaryDirectory(prefix="bench-limits-") as t2:
            p1, addr1, tok1 = serve(exe, t1)
            p2, addr2, tok2 = serve(base, t2)
            try:
                c1, h1 = client(addr1, tok1)
                c2, h2 = client(addr2, tok2)
                starts(c1, h1, 10, None)
                starts(c2, h2, 10, None)
                mine, theirs = [], []
                for _ in range(max(1, a.n // 20)):
                    mine += starts(c1, h1, 10, None)
                    theirs += starts(c2, h2, 10, None)
                print("this binary against the baseline, plain starts interleaved:")
                results["mine"] = summary("start, this binary", mine)
                results["base"] = summary("start, baseline", theirs)
            finally:
                for p in (p1, p2):
                    p.terminate()
                    p.wait()
    print()
    if "base" in results:
        print(f"plain start, this binary / baseline: {results['mine'] / results['base']:.2f}x")
    if ("cgroups", "limited") in results:
        r = results[("cgroups", "limited")] / results[("cgroups", "plain")]
        print(f"start with limits / without: {r:.2f}x (goal <= 1.1x)")
    r = results[("cgroups", "plain")] / results[("no cgroup", "plain")]
    print(f"start with the job's cgroups / with none: {r:.2f}x")
    d = results[("cgroups", "get")] - results[("no cgroup", "get")]
    print(f"usage on GET /v1/jobs/{{id}}: {d * 1e3:+.0f} us per answer (median difference)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
