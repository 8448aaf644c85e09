#!/usr/bin/env python3
"""Cost of one `gitterm-agent exec -- true` (start, supervise, record, wait, exit) against a
bare `sh -c true` spawn, measured in the same run. Prints median and p95 in ms.

Usage: scripts/bench-exec.py [BINARY] [RUNS]   (default: the release build, 200 runs)"""
import os
import statistics
import subprocess
import sys
import tempfile
import time


def measure(argv, env, runs):
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.95) - 1]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    exe = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "target", "release", "gitterm-agent")
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, GITTERM_HOME=home)
        measure(["sh", "-c", "true"], env, 10)  # warm caches
        measure([exe, "exec", "--", "true"], env, 10)
        sh = measure(["sh", "-c", "true"], env, runs)
        ex = measure([exe, "exec", "--", "true"], env, runs)
    print(f"bare sh -c true:          median {sh[0]:.2f} ms  p95 {sh[1]:.2f} ms  ({runs} runs)")
    print(f"gitterm-agent exec true:  median {ex[0]:.2f} ms  p95 {ex[1]:.2f} ms  ({runs} runs)")
    print(f"ratio (median):           {ex[0] / sh[0]:.2f}x")


if __name__ == "__main__":
    main()
