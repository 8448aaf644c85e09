#!/usr/bin/env python3
"""End-to-end capture: a job that prints 200 MB, through `gitterm-agent exec` (sanitize,
redact with 64 secrets, store) against the same command with `> file`, in the same run;
on plain text and on colour-heavy text (an SGR every ~18 bytes, from the real recordings).

Usage: scripts/bench-capture.py [BINARY] [MB]  (default: the static build, 200)"""
import os
import random
import shutil
import string
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "..", "shared", "corpus")


def build_input(path, mb, colour):
    size = mb * 1_000_000
    if colour:
        chunk = b"".join(open(os.path.join(CORPUS, f), "rb").read() for f in ("git-log-color.raw", "ls-color.raw"))
    else:
        rnd = random.Random(1)
        words = ["".join(rnd.choice(string.ascii_lowercase) for _ in range(rnd.randint(2, 9))) for _ in range(500)]
        lines = [f"2026-11-29T12:00:{i % 60:02d}Z INFO worker[{i % 7}] " + " ".join(rnd.choice(words) for _ in range(10))
                 for i in range(2000)]
        chunk = ("\n".join(lines) + "\n").encode()
    with open(path, "wb") as f:
        written = 0
        while written < size:
            f.write(chunk)
            written += len(chunk)


def timed(argv, env, shell_redirect=None):
    t = time.perf_counter()
    if shell_redirect:
        subprocess.run(["sh", "-c", argv], env=env, check=True)
    else:
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main():
    exe = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "target", "x86_64-unknown-linux-musl",
                                                             "release", "gitterm-agent")
    mb = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    top = tempfile.mkdtemp(prefix="gitterm-capture-")
    try:
        env = dict(os.environ, GITTERM_HOME=os.path.join(top, "root"))
        secrets = os.path.join(top, "secrets.env")
        rnd = random.Random(2)
        with open(secrets, "w") as f:
            for i in range(64):
                f.write(f"S{i}=" + "".join(rnd.choice(string.ascii_letters) for _ in range(rnd.randint(16, 40))) + "\n")
        os.chmod(secrets, 0o600)
        for kind in ("plain", "colour"):
            src = os.path.join(top, kind)
            build_input(src, mb, kind == "colour")
            subprocess.run(["cat", src], stdout=subprocess.DEVNULL)  # warm the page cache
            best_file = min(timed(f"cat {src} > {top}/out", env, True) for _ in range(3))
            best_agent = min(timed([exe, "exec", "--json", "--secret-file", secrets, "--", f"cat {src}"], env)
                             for _ in range(3))
            print(f"capture {kind} {mb} MB: cmd > file {best_file * 1000:.0f} ms, exec {best_agent * 1000:.0f} ms "
                  f"({mb / best_agent:.0f} MB/s), ratio {best_agent / best_file:.2f}x")
            shutil.rmtree(os.path.join(top, "root"), ignore_errors=True)
            os.remove(src)
    finally:
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
