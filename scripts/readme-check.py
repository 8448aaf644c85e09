#!/usr/bin/env python3
"""Runs the README's shell snippets as a reader would type them, against a scratch agent.

Usage: python3 scripts/readme-check.py BINARY [--readme README.md] [--keep] [--verbose]

Every fenced ```sh block of the README runs, in order, in one scratch session: a temporary
HOME (the state root is $HOME/.gitterm, also given as GITTERM_HOME), a scratch work folder
as the current directory, and a `serve` of BINARY that this script starts on a free
loopback port. Before a block runs:
  - `127.0.0.1:7433` becomes the scratch server's address;
  - `cargo run --release --` becomes BINARY, and `gitterm-agent` on PATH is BINARY;
  - the shell variables the earlier blocks set are set again (a reader types the blocks
    into one terminal), so `$A` and `$U` from the curl flows reach the later ones.
A block runs under `bash -e -o pipefail`, and fails when it exits non-zero, when it does not
end within its time (120 s unless marked), or when the agent answered it with an error
object (`"error": {`), which curl alone does not make an exit status of. A failure prints
the block's README line, its first line and its output; the script exits non-zero.

A block runs unless an HTML comment right before it (blank lines between allowed) says:
  <!-- readme-check: skip (WHY) -->          never run here (an image engine, a build, ...)
  <!-- readme-check: interrupt 3 (WHY) -->   runs until interrupted: after 3 s it gets
                                             SIGINT, as Ctrl-C sends, and passes if it was
                                             still running by then without an error
  <!-- readme-check: errors (WHY) -->        its answers may be error objects
  <!-- readme-check: serve ARGS -->          the scratch `serve` is started with ARGS too
                                             (collected from the whole README)
so a new block runs by default. Needs bash, curl and jq (the README's flows use them).
"""
import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

DEFAULT_TIMEOUT = 120
MARKER = re.compile(r"<!--\s*readme-check:\s*(.*?)\s*-->", re.S)
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
# Variables bash sets itself: never carried from one block to the next.
BASH_OWN = re.compile(
    r"^(BASH\w*|PIPESTATUS|FUNCNAME|GROUPS|LINENO|RANDOM|SECONDS|SRANDOM|EPOCH\w*|"
    r"HISTCMD|OLDPWD|PWD|SHLVL|_|COMP\w*|DIRSTACK|PPID|UID|EUID|SHELLOPTS|OPTIND|OPTERR|IFS|"
    r"PS\d|HOSTNAME|HOSTTYPE|MACHTYPE|OSTYPE|LINES|COLUMNS)$"
)


class Block:
    def __init__(self, line, text, marks):
        self.line, self.text, self.marks = line, text, marks

    def first_line(self):
        for l in self.text.splitlines():
            if l.strip():
                return l.strip()
        return "(empty block)"

    def mark(self, word):
        """The rest of the first marker that starts with WORD, else None."""
        for m in self.marks:
            if m == word or m.startswith(word + " "):
                return m[len(word):].strip()
        return None


def blocks(readme):
    """The README's ```sh blocks, each with the readme-check markers right before it."""
    lines = readme.splitlines()
    out, i, pending = [], 0, []
    while i < len(lines):
        line = lines[i]
        m = FENCE.match(line)
        if m:
            lang, start = m.group(2), i
            i += 1
            body = []
            while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
                body.append(lines[i])
                i += 1
            if lang == "sh":
                out.append(Block(start + 1, "\n".join(body) + "\n", pending))
            pending = []
        elif line.strip() == "":
            pass
        else:
            found = MARKER.findall(line)
            # A marker is an HTML comment on its own line; any other text between a
            # marker and its block cancels it.
            pending = pending + found if found and line.strip().startswith("<!--") else []
        i += 1
    return out


def free_and_listening(log_path, proc, deadline):
    """The address `serve` logs in its first line (`"event":"listening"`)."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with open(log_path) as f:
                for line in f:
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        continue
                    if ev.get("event") == "listening":
                        return ev.get("address") or ev.get("listen") or ev.get("addr")
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    with open(log_path) as f:
        sys.exit(f"readme-check: `serve` did not start:\n{f.read()}")


def rewrite(text, addr, binary):
    text = text.replace("127.0.0.1:7433", addr)
    text = re.sub(r"cargo run --release --(?=\s)", shlex.quote(binary), text)
    return text


def run_block(block, script, env, cwd, timeout, interrupt):
    proc = subprocess.Popen(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    limit = interrupt if interrupt is not None else timeout
    try:
        out, _ = proc.communicate(timeout=limit)
        return proc.returncode, out.decode("utf-8", "replace"), False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        return None, out.decode("utf-8", "replace"), True


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary")
    ap.add_argument("--readme", default=os.path.join(os.path.dirname(__file__), "..", "README.md"))
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    ap.add_argument("--verbose", action="store_true", help="print every block's output")
    args = ap.parse_args()
    binary = os.path.abspath(args.binary)
    if not os.access(binary, os.X_OK):
        sys.exit(f"readme-check: {args.binary} is not an executable (build it first)")
    for tool in ("bash", "curl", "jq"):
        if shutil.which(tool) is None:
            sys.exit(f"readme-check: `{tool}` is not installed; the README's snippets need it")
    name = os.path.basename(args.readme)
    with open(args.readme, encoding="utf-8") as f:
        all_blocks = blocks(f.read())

    scratch = tempfile.mkdtemp(prefix="readme-check-")
    home = os.path.join(scratch, "home")
    work = os.path.join(scratch, "work")
    bindir = os.path.join(scratch, "bin")
    for d in (home, work, bindir):
        os.makedirs(d)
    os.symlink(binary, os.path.join(bindir, "gitterm-agent"))
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("GITTERM_") and k != "CDPATH"
    }
    env.update(
        HOME=home,
        GITTERM_HOME=os.path.join(home, ".gitterm"),
        PATH=bindir + os.pathsep + env.get("PATH", "/usr/bin:/bin"),
    )
    serve_args = []
    for b in all_blocks:
        for m in b.marks:
            if m.startswith("serve "):
                serve_args += shlex.split(m[len("serve "):])
    log_path = os.path.join(scratch, "serve.log")
    log = open(log_path, "w")
    serve = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", *serve_args],
        env=env,
        cwd=work,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    failed, ran, skipped, addr = 0, 0, 0, None
    try:
        addr = free_and_listening(log_path, serve, time.monotonic() + 30)
        if not addr:
            sys.exit("readme-check: `serve` logged no address in its listening line")
        vars_path = os.path.join(scratch, "vars.sh")
        open(vars_path, "w").close()
        # What bash itself defines, so that only the blocks' own variables are carried.
        base = set(
            subprocess.run(
                ["bash", "-c", "compgen -v"], env=env, capture_output=True, text=True
            ).stdout.split()
        )
        save = f"trap 'declare -p > {shlex.quote(vars_path)}.all' EXIT\n"
        for b in all_blocks:
            why = b.mark("skip")
            if why is not None:
                skipped += 1
                print(f"skip  {name}:{b.line}: {b.first_line()}  {why}")
                continue
            interrupt = b.mark("interrupt")
            secs = None
            if interrupt is not None:
                secs = float(interrupt.split()[0]) if interrupt.split() else 3.0
            script = f"source {shlex.quote(vars_path)}\n{save}" + rewrite(b.text, addr, binary)
            ran += 1
            began = time.monotonic()
            rc, out, interrupted = run_block(b, script, env, work, DEFAULT_TIMEOUT, secs)
            took = time.monotonic() - began
            carry(vars_path, base)
            problem = None
            if interrupted and secs is None:
                problem = f"did not end within {DEFAULT_TIMEOUT} s"
            elif not interrupted and rc != 0:
                problem = f"exited {rc}"
            elif b.mark("errors") is None and re.search(r'"error"\s*:\s*\{', out):
                problem = "the agent answered with an error"
            if problem:
                failed += 1
                print(f"FAIL  {name}:{b.line}: {b.first_line()}  ({problem})")
                print("      " + "\n      ".join(out.rstrip().splitlines() or ["(no output)"]))
            else:
                note = ", interrupted as planned" if interrupted else ""
                print(f"ok    {name}:{b.line}: {b.first_line()}  ({took:.1f} s{note})")
                if args.verbose:
                    print("      " + "\n      ".join(out.rstrip().splitlines() or ["(no output)"]))
    finally:
        cleanup(serve, addr, env)
        log.close()
        if failed and os.path.exists(log_path):
            with open(log_path) as f:
                tail = f.read().splitlines()[-20:]
            print("serve's last log lines:\n  " + "\n  ".join(tail))
        if args.keep:
            print(f"scratch kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"readme-check: {ran} blocks ran, {failed} failed, {skipped} skipped by a marker")
    sys.exit(1 if failed else 0)


def carry(vars_path, base):
    """Keeps, of what `declare -p` showed at a block's end, the variables it set itself."""
    try:
        with open(vars_path + ".all") as f:
            text = f.read()
    except FileNotFoundError:
        return
    kept, keep = [], False
    for line in text.splitlines():
        m = re.match(r"^declare -(\S+) ([A-Za-z_][A-Za-z0-9_]*)", line)
        if m:
            flags, name = m.groups()
            keep = name not in base and not BASH_OWN.match(name) and "r" not in flags
        if keep:
            kept.append(line)
    with open(vars_path, "w") as f:
        f.write("\n".join(kept) + "\n")
    os.unlink(vars_path + ".all")


def cleanup(serve, addr, env):
    """Cancels every job the snippets left running (jobs outlive `serve`), then stops it."""
    if addr and serve.poll() is None:
        try:
            token = open(os.path.join(env["GITTERM_HOME"], "agent.token")).read().strip()
            auth = {"Authorization": f"Bearer {token}"}
            url = f"http://{addr}/v1/jobs?status=running&limit=1000"
            with urllib.request.urlopen(urllib.request.Request(url, headers=auth), timeout=30) as r:
                running = json.load(r)["jobs"]
            for j in running:
                req = urllib.request.Request(
                    f"http://{addr}/v1/jobs/{j['id']}/cancel", data=b"", headers=auth, method="POST"
                )
                urllib.request.urlopen(req, timeout=60).read()
        except (OSError, ValueError, KeyError) as e:
            print(f"readme-check: could not cancel the jobs left running: {e}")
    if serve.poll() is None:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=20)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()


if __name__ == "__main__":
    main()
