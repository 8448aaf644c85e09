#!/usr/bin/env python3
"""Scale figures: `status` over 10,000 job records, and 1,000 concurrent `sleep` jobs
with a 2 s timeout: how late after the deadline TERM lands (p50, p95, max) and the total
RSS of their supervisors.

Usage: scripts/bench-scale.py [BINARY] [RECORDS] [JOBS]
(default: the static build from scripts/build-static.sh, 10000, 1000)"""
import concurrent.futures
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from bench import proc_field  # the script's own folder is on the path when it runs


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def make_records(root, n):
    jobs = os.path.join(root, "jobs")
    os.makedirs(jobs, mode=0o700)
    for i in range(n):
        jid = "job_%020x" % (i + 1)
        d = os.path.join(jobs, jid)
        os.mkdir(d, 0o700)
        rec = {"formatVersion": 1, "id": jid, "command": f"echo {i}", "cwd": "/", "status": "succeeded",
               "exitCode": 0, "signal": None, "createdAt": "2026-11-01T00:00:%02d.%03dZ" % (i % 60, i % 1000),
               "startedAt": "2026-11-01T00:00:00.000Z", "endedAt": "2026-11-01T00:00:01.000Z",
               "timeoutSeconds": 60, "pid": 100, "pgid": 100, "outputBytes": 4}
        with open(os.path.join(d, "job.json"), "w") as f:
            json.dump(rec, f)
        with open(os.path.join(d, "output.log"), "w") as f:
            f.write(f"{i}\n")


def time_cmd(argv, env, runs=5):
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
        ts.append((time.perf_counter() - t) * 1000)
    return statistics.median(ts)


def mem_kib(pid, field):
    """A field of /proc/PID/smaps_rollup: Rss counts shared pages in every process, Pss
    splits them between the processes that share them (the honest per-process cost)."""
    return proc_field(pid, "smaps_rollup", field)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    exe = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "target", "x86_64-unknown-linux-musl", "release", "gitterm-agent")
    nrec = int(sys.argv[2]) if len(sys.argv) > 2 else 10000
    njobs = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    top = tempfile.mkdtemp(prefix="gitterm-scale-")
    try:
        root = os.path.join(top, "records")
        make_records(root, nrec)
        env = dict(os.environ, GITTERM_HOME=root)
        print(f"status over {nrec} records:        {time_cmd([exe, 'status'], env):.0f} ms (median of 5)")
        print(f"status --json over {nrec} records: {time_cmd([exe, 'status', '--json'], env):.0f} ms (median of 5)")

        srv = subprocess.Popen([exe, "serve", "--listen", "127.0.0.1:0"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            addr = json.loads(srv.stderr.readline())["address"]
            token = open(os.path.join(root, "agent.token")).read().strip()
            ts, firsts = [], []
            for _ in range(5):
                # Paged: the first page alone, and every page by following `next`.
                n, cursor, t = 0, None, time.perf_counter()
                while True:
                    q = f"http://{addr}/v1/jobs?limit=1000" + (f"&cursor={cursor}" if cursor else "")
                    req = urllib.request.Request(q, headers={"Authorization": f"Bearer {token}"})
                    with urllib.request.urlopen(req, timeout=60) as r:
                        page = json.loads(r.read())
                    if cursor is None:
                        firsts.append((time.perf_counter() - t) * 1000)
                    n += len(page["jobs"])
                    cursor = page.get("next")
                    if not cursor:
                        break
                ts.append((time.perf_counter() - t) * 1000)
            print(f"GET /v1/jobs over {nrec} records: first page of 1000 {statistics.median(firsts):.0f} ms, "
                  f"all {n} by cursor {statistics.median(ts):.0f} ms (median of 5)")
        finally:
            srv.terminate()
            srv.wait(10)

        root = os.path.join(top, "jobs")
        env = dict(os.environ, GITTERM_HOME=root)
        work = os.path.join(top, "work")
        os.makedirs(work)
        # bash's $EPOCHREALTIME needs no fork, so the measurement itself is not late.
        cmd = ("exec bash -c 's=$EPOCHREALTIME; trap \"echo \\$s \\$EPOCHREALTIME > \\$GITTERM_JOB_ID.term; "
               "exit 0\" TERM; sleep 30 & wait'")

        def start(_):
            out = subprocess.run([exe, "exec", "--wait", "0", "--json", "--timeout", "2", "--max-running",
                                  str(njobs + 10), "--cwd", work, "--", cmd], env=env, capture_output=True, check=True)
            return json.loads(out.stdout)

        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            recs = list(ex.map(start, range(njobs)))
        started = time.time() - t0
        time.sleep(0.5)
        running_sup = [r["supervisorPid"] for r in recs if r.get("supervisorPid")]
        total_rss = sum(mem_kib(p, "Rss") for p in running_sup)
        total_pss = sum(mem_kib(p, "Pss") for p in running_sup)
        deadline = time.time() + 60
        while time.time() < deadline and len([f for f in os.listdir(work) if f.endswith(".term")]) < njobs:
            time.sleep(0.2)
        late = []
        for f in os.listdir(work):
            if f.endswith(".term"):
                with open(os.path.join(work, f)) as fh:
                    s, t = fh.read().split()
                late.append((float(t) - float(s)) * 1000 - 2000)
        print(f"{njobs} sleep jobs started in {started:.1f} s; TERM received by {len(late)}")
        if late:
            print(f"TERM lateness after the 2 s deadline: p50 {pct(late, 0.5):.1f} ms, "
                  f"p95 {pct(late, 0.95):.1f} ms, max {max(late):.1f} ms")
        n = max(1, len(running_sup))
        print(f"supervisors ({len(running_sup)}): RSS {total_rss / 1024:.1f} MiB total ({total_rss / n:.0f} KiB each), "
              f"PSS {total_pss / 1024:.1f} MiB total ({total_pss / n:.0f} KiB each)")
        deadline = time.time() + 60
        while time.time() < deadline and os.listdir(os.path.join(root, "running")):
            time.sleep(0.2)
    finally:
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
