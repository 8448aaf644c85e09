#!/usr/bin/env python3
"""The project's performance figures in one run, each beside its floor measured in the
same run on this machine, its goal, and (with --peers) the same figure for other
sandbox agents installed into a temporary folder for the run:

- `POST /v1/jobs` of `true`, waited, over one kept-alive HTTP/1.1 connection (p50, p95)
  against a bare posix_spawn of `/bin/sh -c true` + wait from a small C program;
- `exec -- true` (the CLI, start to exit), spawned and timed by the same C program,
  against the same floor, and the binary's own start (`--version`) beside it;
- capture through the API: `head -c 50000000 /dev/urandom | base64` (~67 MB) started,
  waited and read back whole, against the peers' one call returning the output and the
  same command into `| cat > file`;
- capture to a file through `exec` (16 secrets): 200 MB of plain text and 200 MB of
  colour-heavy text, against `CMD > file` and `CMD | cat > file`;
- idle `serve` memory, supervisor memory per running job (1,000 `sleep 30` jobs), and
  how late TERM lands after a 2 s timeout with 1,000 jobs started at once;
- starts beside sandbox-agent, interleaved round by round in one run (with --peers, or
  alone with --starts): `true` waited by one caller on a quiet machine, jobs/s of 8
  callers at once (every job of ours then checked recorded and succeeded, nothing left
  running), one caller while every core runs `yes > /dev/null`, and CPU per job of each
  server's own processes, not the shells' (ours: the cpu.stat of a cgroup of serve's own,
  less its jobs' cgroups; sandbox-agent's: utime+stime in /proc/PID/stat).

Usage: scripts/bench.py [--quick] [--peers | --starts [--rounds N]] [--json FILE] [BINARY]
(BINARY: default the static build from scripts/build-static.sh.) --quick runs fewer
iterations and smaller captures (well under a minute without peers). Figures depend on
the machine and its load (and, on ext4 without a journal, on the state folder's block
group: the run prints what a new file there costs): run it twice before believing a
ratio. SANDBOX_AGENT_BIN=PATH uses an installed sandbox-agent binary instead of
installing it with npm."""
import argparse
import concurrent.futures
import glob
import json
import math
import os
import random
import shlex
import shutil
import signal
import socket
import statistics
import string
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BIN = os.path.join(HERE, "..", "target", "x86_64-unknown-linux-musl", "release", "gitterm-agent")
CORPUS_DIRS = [os.environ.get("GITTERM_CORPUS", ""), os.path.join(HERE, "..", "tests", "data", "corpus"),
               os.path.join(HERE, "..", "..", "shared", "corpus")]
B64_CMD = "head -c {n} /dev/urandom | base64"
PLAIN_CMD = "yes 'some plain log line with words 0123456789' | head -c {n}"

SPAWN_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
extern char **environ;
static char *args[] = {"/bin/sh", "-c", "true", NULL};
static char **run_argv;

/* One `/bin/sh -c true`, waited. MODE spawn: posix_spawn; run: posix_spawn of the argv
   after DIR instead (the CLI, timed exactly as the floor is). In a fresh cgroup under DIR
   (made and removed each time, as a job's is): cgmove: fork, the child writes "0" to the
   cgroup's cgroup.procs, then execs; clone3: clone3(CLONE_INTO_CGROUP), then exec. */
static int once(const char *mode, const char *dir, int i) {
    pid_t pid;
    int st;
    char cg[4096];
    if (strcmp(mode, "spawn") == 0) {
        if (posix_spawn(&pid, "/bin/sh", NULL, NULL, args, environ) != 0) return -1;
    } else if (strcmp(mode, "run") == 0) {
        /* Its stdout goes to /dev/null: this program's own stdout carries the timings. */
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
        int r = posix_spawn(&pid, run_argv[0], &fa, NULL, run_argv, environ);
        posix_spawn_file_actions_destroy(&fa);
        if (r != 0) return -1;
    } else {
        snprintf(cg, sizeof cg, "%s/j%d", dir, i);
        if (mkdir(cg, 0755) != 0) return -1;
        if (strcmp(mode, "cgmove") == 0) {
            pid = fork();
            if (pid == 0) {
                char procs[4200];
                snprintf(procs, sizeof procs, "%s/cgroup.procs", cg);
                int fd = open(procs, O_WRONLY | O_CLOEXEC);
                if (fd < 0 || write(fd, "0", 1) != 1) _exit(126);
                execve("/bin/sh", args, environ);
                _exit(127);
            }
        } else {
            int cfd = open(cg, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (cfd < 0) return -1;
            struct clone_args ca;
            memset(&ca, 0, sizeof ca);
            ca.flags = CLONE_INTO_CGROUP;
            ca.exit_signal = SIGCHLD;
            ca.cgroup = (unsigned long long)cfd;
            pid = syscall(SYS_clone3, &ca, sizeof ca);
            if (pid == 0) {
                execve("/bin/sh", args, environ);
                _exit(127);
            }
            close(cfd);
        }
        if (pid < 0) return -1;
    }
    if (waitpid(pid, &st, 0) != pid || st != 0) return -1;
    if (strcmp(mode, "spawn") != 0 && strcmp(mode, "run") != 0 && rmdir(cg) != 0) return -1;
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "spawn";
    int n = argc > 2 ? atoi(argv[2]) : 100;
    const char *dir = argc > 3 ? argv[3] : ".";
    run_argv = argv + 4;
    if (strcmp(mode, "run") == 0 && argc < 5) return 2;
    for (int i = 0; i < n; i++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        if (once(mode, dir, i) != 0) return 1;
        clock_gettime(CLOCK_MONOTONIC, &b);
        printf("%lld\n", (long long)(b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec));
    }
    return 0;
}
"""


# ---------------------------------------------------------------------------------------
# small helpers


def pct(xs, p):
    """Nearest-rank percentile."""
    xs = sorted(xs)
    return xs[max(0, min(len(xs) - 1, math.ceil(len(xs) * p) - 1))]


def med(xs):
    return statistics.median(xs) if xs else None


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_field(pid, name, field):
    """A kB field of /proc/PID/status or smaps_rollup, 0 when the process is gone."""
    try:
        with open(f"/proc/{pid}/{name}") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_seconds(pid):
    """CPU time of process PID's live threads (not its children), in seconds: the sum of
    their schedstat run times, exact to the nanosecond where /proc/PID/stat counts ticks."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


def descendants(pid):
    """pid and every process below it (by /proc/*/stat's ppid)."""
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                kids.setdefault(ppid, []).append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def tree_kib(pid, name="status", field="VmRSS"):
    return sum(proc_field(p, name, field) for p in descendants(pid))


def b64_len(n):
    """Length of `base64` (GNU coreutils: 76 columns) of n bytes."""
    chars = 4 * ((n + 2) // 3)
    return chars + (chars + 75) // 76


def stop(proc, wait=5):
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(wait)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


class Http:
    """One HTTP/1.1 connection kept alive across requests; reopened only when the server
    closes it (counted in `opens`). Raw socket: the client adds as little as it can."""

    def __init__(self, host, port, headers=None):
        self.host, self.port, self.headers = host, port, dict(headers or {})
        self.sock = self.rf = None
        self.opens = 0

    def _open(self):
        s = socket.create_connection((self.host, self.port), timeout=600)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock, self.rf = s, s.makefile("rb", buffering=1 << 18)
        self.opens += 1

    def close(self):
        if self.sock is not None:
            self.rf.close()
            self.sock.close()
        self.sock = self.rf = None

    def request(self, method, path, body=None):
        data = b"" if body is None else json.dumps(body).encode()
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in self.headers.items())
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        msg = (head + "\r\n").encode() + data
        while True:
            fresh = self.sock is None
            if fresh:
                self._open()
            try:
                self.sock.sendall(msg)
                line = self.rf.readline()
            except (ConnectionResetError, BrokenPipeError):
                line = b""
            if line:
                break
            self.close()  # an idle kept-alive connection the server closed: once more, fresh
            if fresh:
                raise ConnectionError(f"{method} {path}: the server closed the connection without answering")
        parts = line.split(None, 2)
        version, status = parts[0], int(parts[1])
        hdrs = {}
        while True:
            h = self.rf.readline()
            if h in (b"\r\n", b"\n", b""):
                break
            k, _, v = h.decode("latin-1").partition(":")
            hdrs[k.strip().lower()] = v.strip()
        if "content-length" in hdrs:
            payload = self.rf.read(int(hdrs["content-length"]))
        elif "chunked" in hdrs.get("transfer-encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rf.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rf.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rf.read(size))
                self.rf.readline()
            payload = b"".join(chunks)
        else:
            payload = self.rf.read()
            hdrs["connection"] = "close"
        conn = hdrs.get("connection", "").lower()
        if conn == "close" or (version == b"HTTP/1.0" and conn != "keep-alive"):
            self.close()
        return status, hdrs, payload

    def json(self, method, path, body=None, ok=(200, 201, 202)):
        status, _, payload = self.request(method, path, body)
        if status not in ok:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {payload[:300]!r}")
        return json.loads(payload)


def wait_http(host, port, path, headers, proc, deadline_s=60):
    end = time.time() + deadline_s
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before answering")
        try:
            c = Http(host, port, headers)
            status, _, _ = c.request("GET", path)
            c.close()
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"no answer on GET {path} within {deadline_s} s")


def time_calls(conn, method, path, body, n, warm=5, check=None):
    for _ in range(warm):
        conn.request(method, path, body)
    opens0 = conn.opens
    ts = []
    for _ in range(n):
        t = time.perf_counter_ns()
        status, _, payload = conn.request(method, path, body)
        ts.append((time.perf_counter_ns() - t) / 1e6)
        if status != 200 or (check and not check(payload)):
            raise RuntimeError(f"{method} {path}: HTTP {status}: {payload[:300]!r}")
    return ts, conn.opens - opens0


# ---------------------------------------------------------------------------------------
# floors


def build_spawn_floor(top):
    if not shutil.which("gcc"):
        return None
    src, exe = os.path.join(top, "spawn.c"), os.path.join(top, "spawn")
    with open(src, "w") as f:
        f.write(SPAWN_C)
    r = subprocess.run(["gcc", "-O2", "-o", exe, src], capture_output=True, text=True)
    return exe if r.returncode == 0 else None


def c_spawn(exe, n, mode="spawn", folder=".", argv=(), env=None):
    out = subprocess.run([exe, mode, str(n), folder, *argv], capture_output=True, text=True, check=True,
                         env=env).stdout
    return [int(x) / 1e6 for x in out.split()]


def cgroup_probe_dir():
    """A fresh folder in this process's own cgroup v2 folder, where the C program can make
    a cgroup per spawn as a job's is made; None where cgroup v2 is not writable."""
    mount = None
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if parts[2] == "cgroup2":
                mount = parts[1]
                break
    own = None
    with open("/proc/self/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                own = line[3:].strip()
    if not mount or own is None:
        return None
    d = os.path.join(mount + own.rstrip("/"), f"gitterm-bench-{os.getpid()}")
    try:
        os.mkdir(d)
    except OSError:
        return None
    return d


def cgroup_refs(spawn_c, n):
    """Spawn into a fresh cgroup: moved in by a cgroup.procs write (as the supervisor does
    today) and born in it (clone3 CLONE_INTO_CGROUP). References, not floors."""
    d = cgroup_probe_dir()
    if d is None or not spawn_c:
        return {}
    out = {}
    try:
        for mode, key in (("cgmove", "cgroupMoveMs"), ("clone3", "cgroupClone3Ms")):
            try:
                out[key] = c_spawn(spawn_c, n, mode, d)
            except subprocess.CalledProcessError:
                pass
    finally:
        for sub in glob.glob(os.path.join(d, "j*")):
            try:
                os.rmdir(sub)
            except OSError:
                pass
        try:
            os.rmdir(d)
        except OSError:
            pass
    return out


def py_spawn(n):
    ts = []
    for _ in range(n):
        t = time.perf_counter_ns()
        pid = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", "true"], os.environ)
        os.waitpid(pid, 0)
        ts.append((time.perf_counter_ns() - t) / 1e6)
    return ts


def create_probe(folder, n, start):
    """New empty files in the serve's state folder, kept: what one of a start's four new
    files costs here right now. On ext4 without a journal this swings from ~15 us to
    ~1 ms with how many inodes the folder's block group freed lately (the allocator
    skips those), so it is printed beside the figures it moves."""
    d = os.path.join(folder, "create-probe")
    os.makedirs(d, exist_ok=True)
    ts = []
    for i in range(start, start + n):
        t = time.perf_counter_ns()
        os.close(os.open(os.path.join(d, str(i)), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        ts.append((time.perf_counter_ns() - t) / 1e6)
    return ts


def fsync_probe(folder, n):
    """A small file written and fsynced, and its folder fsynced: what one durable record
    write costs on this disk right now (not a floor, a reference)."""
    ts = []
    path = os.path.join(folder, "fsync-probe")
    for _ in range(n):
        t = time.perf_counter_ns()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, b"x" * 600)
        os.fsync(fd)
        os.close(fd)
        dfd = os.open(folder, os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
        ts.append((time.perf_counter_ns() - t) / 1e6)
    os.remove(path)
    return ts


def run_timed(argv, env=None, n=1, stdout=subprocess.DEVNULL):
    ts = []
    for _ in range(n):
        t = time.perf_counter_ns()
        subprocess.run(argv, env=env, stdout=stdout, check=True)
        ts.append((time.perf_counter_ns() - t) / 1e6)
    return ts


# ---------------------------------------------------------------------------------------
# our server


class Ours:
    def __init__(self, exe, top, max_running, preexec=None):
        self.home = os.path.join(top, "serve-home")
        self.errlog = os.path.join(top, "serve.log")
        env = dict(os.environ, GITTERM_HOME=self.home)
        self.proc = subprocess.Popen([exe, "serve", "--listen", "127.0.0.1:0", "--max-running", str(max_running)],
                                     env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=open(self.errlog, "wb"), cwd=top, preexec_fn=preexec)
        end = time.time() + 20
        first = b""
        while time.time() < end and not first.endswith(b"\n"):
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}: {open(self.errlog).read()[:500]}")
            time.sleep(0.02)
            with open(self.errlog, "rb") as f:
                first = f.readline()
        host, port = json.loads(first)["address"].rsplit(":", 1)
        self.host, self.port = host, int(port)
        with open(os.path.join(self.home, "agent.token")) as f:
            self.auth = {"Authorization": "Bearer " + f.read().strip()}

    def conn(self):
        return Http(self.host, self.port, self.auth)

    def capture(self, conn, cmd, use_log, marks=None):
        """Start cmd waited, then read its whole stored output; returns (bytes read, record).
        `marks`, a list, gets the time the call returned (perf_counter_ns)."""
        rec = conn.json("POST", "/v1/jobs", {"command": cmd, "waitSeconds": 600})
        if marks is not None:
            marks.append(time.perf_counter_ns())
        if rec["status"] != "succeeded":
            raise RuntimeError(f"capture job ended {rec['status']}: {rec.get('reason')}")
        jid = rec["id"]
        if use_log:
            status, hdrs, payload = conn.request("GET", f"/v1/jobs/{jid}/log")
            if status != 200:
                raise RuntimeError(f"GET /v1/jobs/{jid}/log: HTTP {status}")
            if "json" in hdrs.get("content-type", ""):
                return len(json.loads(payload)["data"].encode()), rec
            return len(payload), rec
        off, total = 0, 0
        while True:
            page = conn.json("GET", f"/v1/jobs/{jid}/output?offset={off}&limit=65536")
            total += len(page["data"].encode())
            off = page["nextOffset"]
            if page["done"] or (page["eof"] and off >= rec["outputBytes"]):
                return total, rec

    def has_log_route(self, conn):
        rec = conn.json("POST", "/v1/jobs", {"command": "echo log", "waitSeconds": 30})
        status, _, _ = conn.request("GET", f"/v1/jobs/{rec['id']}/log")
        return status == 200


# ---------------------------------------------------------------------------------------
# peers: installed into a temporary folder for the run, never kept


class Peer:
    name = ""
    keepalive_note = ""

    def __init__(self, root):
        self.root = os.path.join(root, self.name)
        os.makedirs(self.root, exist_ok=True)
        self.token = "".join(random.choice(string.ascii_letters + string.digits) for _ in range(32))
        self.port = None
        self.proc = None
        self.command = None  # how it was started, for the notes
        self.preexec = None  # run in the server's process before its exec (its cgroup)

    def install(self):
        raise NotImplementedError

    def start(self):
        raise NotImplementedError

    def conn(self):
        return Http("127.0.0.1", self.port, self.headers())

    def setup(self, conn):
        pass

    def stop(self):
        stop(self.proc)


def pip_target(target, *pkgs):
    base = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-warn-conflicts",
            "--target", target, *pkgs]
    r = subprocess.run(base, capture_output=True, text=True)
    if r.returncode != 0:  # an alpha-only package
        r = subprocess.run(base + ["--pre"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("pip install failed: " + (r.stderr.strip().splitlines() or ["?"])[-1])


class SweRex(Peer):
    name = "swe-rex"
    label = "swe-rex"

    def install(self):
        pip_target(os.path.join(self.root, "lib"), "swe-rex", "aiohttp")

    def headers(self):
        return {"X-API-Key": self.token}

    def start(self):
        lib = os.path.join(self.root, "lib")
        self.port = free_port()
        argv = [sys.executable, os.path.join(lib, "bin", "swerex-remote"), "--host", "127.0.0.1", "--port",
                str(self.port), "--auth-token", self.token]
        self.command = f"PYTHONPATH={lib} " + shlex.join(argv).replace(self.token, "$TOKEN")
        self.proc = subprocess.Popen(argv, env=dict(os.environ, PYTHONPATH=lib), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.root)
        wait_http("127.0.0.1", self.port, "/is_alive", self.headers(), self.proc)

    def true_call(self):
        return "POST", "/execute", {"command": "true", "shell": True}

    def capture_call(self, cmd):
        return "POST", "/execute", {"command": cmd, "shell": True}

    def output(self, answer):
        return answer["stdout"]


class SweRexSession(SweRex):
    """The same server's bash session (`/run_in_session`), started by the SweRex peer."""
    label = "swe-rex session"
    capture_skip = "skipped: a session's output is read through pexpect (seconds per MB)"

    def __init__(self, server):
        self.server = server
        self.name, self.root, self.token = server.name, server.root, server.token
        self.port, self.proc, self.command = None, None, None

    def install(self):
        pass

    def start(self):
        self.port = self.server.port
        self.command = "the swe-rex server above, POST /create_session then /run_in_session"

    def setup(self, conn):
        conn.json("POST", "/create_session", {"session": "bench", "session_type": "bash"})

    def true_call(self):
        return "POST", "/run_in_session", {"command": "true", "session": "bench", "action_type": "bash",
                                           "check": "silent"}

    def stop(self):
        pass


class SandboxAgent(Peer):
    name = "sandbox-agent"
    label = "sandbox-agent"
    cap = 256 << 20

    def install(self):
        if os.environ.get("SANDBOX_AGENT_BIN"):  # an installed binary, for repeated runs
            self.bin = os.environ["SANDBOX_AGENT_BIN"]
            return
        npm = os.path.join(self.root, "npm")
        os.makedirs(npm, exist_ok=True)
        r = subprocess.run(["npm", "install", "--prefix", npm, "--no-audit", "--no-fund", "--loglevel=error",
                            "sandbox-agent"], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("npm install failed: " + (r.stderr.strip().splitlines() or ["?"])[-1])
        # The platform package's binary itself (the `.bin` wrapper is a node script that runs it).
        found = glob.glob(os.path.join(npm, "node_modules", "@sandbox-agent", "cli-linux-*", "bin", "sandbox-agent"))
        if not found:
            raise RuntimeError("no platform binary under node_modules/@sandbox-agent")
        self.bin = found[0]
        os.chmod(self.bin, 0o755)

    def headers(self):
        return {"Authorization": "Bearer " + self.token, "Accept": "application/json"}

    def start(self):
        self.port = free_port()
        home = os.path.join(self.root, "home")
        os.makedirs(home, exist_ok=True)
        argv = [self.bin, "server", "-H", "127.0.0.1", "-p", str(self.port), "-t", self.token, "--no-telemetry"]
        self.command = f"HOME={home} " + shlex.join(argv).replace(self.token, "$TOKEN")
        self.proc = subprocess.Popen(argv, env=dict(os.environ, HOME=home), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.root,
                                     preexec_fn=self.preexec)
        wait_http("127.0.0.1", self.port, "/v1/health", self.headers(), self.proc)

    def setup(self, conn):
        # The run answer is capped at maxOutputBytes (1 MiB by default); the config route raises it.
        cfg = conn.json("GET", "/v1/processes/config")
        cfg["maxOutputBytes"] = self.cap
        conn.json("POST", "/v1/processes/config", cfg)

    def true_call(self):
        return "POST", "/v1/processes/run", {"command": "sh", "args": ["-c", "true"]}

    def capture_call(self, cmd):
        return "POST", "/v1/processes/run", {"command": "sh", "args": ["-c", cmd], "maxOutputBytes": self.cap,
                                             "timeoutMs": 300000}

    def output(self, answer):
        if answer.get("stdoutTruncated"):
            raise RuntimeError("stdout truncated")
        return answer["stdout"]


class AgentSandboxServer(Peer):
    name = "agent-sandbox-server"
    label = "agent-sandbox-srv"

    def install(self):
        pip_target(os.path.join(self.root, "lib"), "agent-sandbox-server")

    def headers(self):
        return {"Authorization": "Bearer " + self.token}

    def start(self):
        lib = os.path.join(self.root, "lib")
        base = os.path.join(self.root, "base")
        os.makedirs(base, exist_ok=True)
        self.port = free_port()
        argv = [sys.executable, os.path.join(lib, "bin", "agent-sandbox-server"), "serve", "--host", "127.0.0.1",
                "--port", str(self.port), "--pty-port", str(free_port()), "--base-dir", base]
        self.command = f"ABX_SERVER_TOKEN=$TOKEN PYTHONPATH={lib} " + shlex.join(argv)
        self.proc = subprocess.Popen(argv, env=dict(os.environ, PYTHONPATH=lib, ABX_SERVER_TOKEN=self.token),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, cwd=self.root)
        wait_http("127.0.0.1", self.port, "/health", self.headers(), self.proc)

    def true_call(self):
        return "POST", "/shell", {"command": "sh -c true"}

    def capture_call(self, cmd):
        return "POST", "/shell", {"command": "sh -c " + shlex.quote(cmd)}

    def output(self, answer):
        if answer.get("truncated"):
            raise RuntimeError("stdout truncated")
        return answer["stdout"]


def bench_peer(peer, cfg, res):
    """Fills res[peer.label] with its `true` latencies, capture times and idle RSS."""
    r = res.setdefault(peer.label, {})
    try:
        t = time.time()
        peer.install()
        r["installSeconds"] = round(time.time() - t, 1)
        peer.start()
        r["command"] = peer.command.replace(cfg.top, "$TMP").replace(sys.executable, "python3")
        time.sleep(0.5)
        if peer.proc is not None:
            r["idleRssKiB"] = tree_kib(peer.proc.pid)
        conn = peer.conn()
        peer.setup(conn)
        method, path, body = peer.true_call()
        ts, opens = time_calls(conn, method, path, body, cfg.calls)
        r["trueMs"] = ts
        r["connectionsOpened"] = opens
        if getattr(peer, "capture_skip", None):
            r["captureNote"] = peer.capture_skip
        else:
            method, path, body = peer.capture_call(cfg.b64_cmd)
            caps = []
            for _ in range(cfg.capture_runs):
                t = time.perf_counter_ns()
                status, _, payload = conn.request(method, path, body)
                out = peer.output(json.loads(payload)) if status == 200 else None
                caps.append((time.perf_counter_ns() - t) / 1e6)
                if status != 200:
                    raise RuntimeError(f"capture: HTTP {status}: {payload[:200]!r}")
                if len(out) != cfg.b64_bytes:
                    raise RuntimeError(f"capture returned {len(out)} bytes, expected {cfg.b64_bytes}")
                del out, payload
            r["captureMs"] = caps
            if peer.proc is not None:
                r["rssAfterKiB"] = tree_kib(peer.proc.pid)
        conn.close()
    except Exception as e:  # a peer that cannot be installed or driven is skipped with the reason
        r["error"] = f"{type(e).__name__}: {e}"
        log(f"  {peer.label}: skipped: {r['error']}")


# ---------------------------------------------------------------------------------------
# the measurements


def bench_spawn(cfg, exe, ours, spawn_c, res):
    """`true` through the API and the CLI, and the floors, interleaved in rounds so the
    machine's load drifts over all of them alike."""
    cli_home = os.path.join(cfg.top, "cli-home")
    env = dict(os.environ, GITTERM_HOME=cli_home)
    conn = ours.conn()
    body = {"command": "true", "waitSeconds": 30}
    ok = lambda p: json.loads(p)["status"] == "succeeded"  # noqa: E731
    api, cli, bare, floor_c, floor_py, floor_sub, fsyncs, creates, cg, opens = [], [], [], [], [], [], [], [], {}, 0
    time_calls(conn, "POST", "/v1/jobs", body, 0, warm=10)
    run_timed([exe, "exec", "--", "true"], env, 5)
    per = max(1, cfg.calls // cfg.rounds)
    for _ in range(cfg.rounds):
        if spawn_c:
            floor_c += c_spawn(spawn_c, per)
        floor_py += py_spawn(per)
        ts, o = time_calls(conn, "POST", "/v1/jobs", body, per, warm=0, check=ok)
        api += ts
        opens += o
        floor_sub += run_timed(["/bin/sh", "-c", "true"], env, per)
        if spawn_c:
            # Spawned and timed by the same C program as the floor, so the ratio holds no
            # interpreter's spawn cost; `--version` is the binary's own start and exit.
            cli += c_spawn(spawn_c, per, "run", ".", [exe, "exec", "--", "true"], env)
            bare += c_spawn(spawn_c, per, "run", ".", [exe, "--version"], env)
        else:
            cli += run_timed([exe, "exec", "--", "true"], env, per)
        fsyncs += fsync_probe(cfg.top, 10)
        creates += create_probe(ours.home, 10, len(creates))
        for k, v in cgroup_refs(spawn_c, max(5, per // 4)).items():
            cg.setdefault(k, []).extend(v)
    # serve's own share of a call, over many back to back (the start-up's housekeeping
    # long done): what the request path and the server's threads cost, without the
    # supervisors and shells, which are other processes.
    cpu_calls = cfg.calls * 8
    cpu0 = cpu_seconds(ours.proc.pid)
    time_calls(conn, "POST", "/v1/jobs", body, cpu_calls, warm=0, check=ok)
    serve_cpu_us = 1e6 * (cpu_seconds(ours.proc.pid) - cpu0) / cpu_calls
    conn.close()
    res["floor"] = {"cSpawnMs": floor_c, "pySpawnMs": floor_py, "pySubprocessMs": floor_sub, "fsyncMs": fsyncs,
                    "createMs": creates, **cg}
    res["api"] = {"trueMs": api, "connectionsOpened": opens, "serveCpuUsPerCall": serve_cpu_us,
                  "serveCpuCalls": cpu_calls}
    res["cli"] = {"trueMs": cli, "versionMs": bare, "timedBy": "C spawn" if spawn_c else "py subprocess"}
    shutil.rmtree(cli_home, ignore_errors=True)


def bench_api_capture(cfg, ours, res):
    conn = ours.conn()
    use_log = ours.has_log_route(conn)
    ts, calls, own_reads = [], [], []
    for _ in range(cfg.capture_runs):
        t = time.perf_counter_ns()
        marks = []
        n, rec = ours.capture(conn, cfg.b64_cmd, use_log, marks)
        ts.append((time.perf_counter_ns() - t) / 1e6)
        calls.append((marks[0] - t) / 1e6)
        if n != cfg.b64_bytes or rec["outputBytes"] != cfg.b64_bytes:
            raise RuntimeError(f"capture read {n} bytes (record {rec['outputBytes']}), expected {cfg.b64_bytes}")
        # The read's floor: this client taking the same bytes into its memory straight from
        # the page cache, with no server and no socket in between.
        log = os.path.join(ours.home, "jobs", rec["id"], "output.log")
        t = time.perf_counter_ns()
        with open(log, "rb") as f:
            got = len(f.read())
        own_reads.append((time.perf_counter_ns() - t) / 1e6)
        if got != cfg.b64_bytes:
            raise RuntimeError(f"output.log holds {got} bytes, expected {cfg.b64_bytes}")
        shutil.rmtree(os.path.join(ours.home, "jobs", rec["id"]), ignore_errors=True)
    conn.close()
    # The floor of any capture: the same command into a pipe whose reader writes a file
    # (what the job's output pipe and the supervisor are at the least), interleaved.
    piped = []
    out = os.path.join(cfg.top, "capture-floor.out")
    for _ in range(cfg.capture_runs):
        piped += run_timed(["/bin/sh", "-c", f"{cfg.b64_cmd} | cat > {out}"])
    os.remove(out)
    res["apiCapture"] = {"ms": ts, "bytes": cfg.b64_bytes, "read": "GET /log" if use_log else "paged GET /output",
                         "pipeToFileMs": piped, "callMs": calls, "clientFileReadMs": own_reads}


def find_corpus():
    for d in CORPUS_DIRS:
        if d and all(os.path.isfile(os.path.join(d, f)) for f in ("git-log-color.raw", "ls-color.raw")):
            return d
    return None


def colour_chunk():
    """Real recordings (an SGR every ~18 bytes) where the corpus is at hand, else text
    made to look like them."""
    d = find_corpus()
    if d:
        return b"".join(open(os.path.join(d, f), "rb").read() for f in ("git-log-color.raw", "ls-color.raw")), d
    rnd = random.Random(3)
    cols = ["\x1b[33m", "\x1b[32m", "\x1b[01;34m", "\x1b[m", "\x1b[0m", "\x1b[31m", "\x1b[1;32m"]
    words = ["".join(rnd.choice(string.ascii_lowercase) for _ in range(rnd.randint(3, 9))) for _ in range(300)]
    lines = []
    for i in range(3000):
        parts = [f"{rnd.choice(cols)}{rnd.choice(words)}{rnd.choice(words)[:4]}\x1b[m" for _ in range(6)]
        lines.append(f"\x1b[33m{i:07x}\x1b[m " + " ".join(parts))
    return ("\n".join(lines) + "\n").encode(), "made up (corpus not found)"


def plain_chunk():
    """Log lines of words (words and numbers, as a service logs them)."""
    rnd = random.Random(1)
    words = ["".join(rnd.choice(string.ascii_lowercase) for _ in range(rnd.randint(2, 9))) for _ in range(500)]
    lines = [f"2026-11-29T12:00:{i % 60:02d}Z INFO worker[{i % 7}] " + " ".join(rnd.choice(words) for _ in range(10))
             for i in range(2000)]
    return ("\n".join(lines) + "\n").encode()


def write_file(path, chunk, size):
    with open(path, "wb") as f:
        written = 0
        while written < size:
            f.write(chunk[: size - written])
            written += min(len(chunk), size - written)
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)  # into the page cache


def bench_file_capture(cfg, exe, res):
    top = cfg.top
    home = os.path.join(top, "capture-home")
    env = dict(os.environ, GITTERM_HOME=home)
    secrets = os.path.join(top, "secrets.env")
    rnd = random.Random(2)
    with open(secrets, "w") as f:
        for i in range(16):
            f.write(f"S{i}=" + "".join(rnd.choice(string.ascii_letters) for _ in range(rnd.randint(16, 40))) + "\n")
    os.chmod(secrets, 0o600)
    size = cfg.file_mb * 1_000_000
    chunk, source = colour_chunk()
    colour, plain = os.path.join(top, "colour.raw"), os.path.join(top, "plain.txt")
    write_file(colour, chunk, size)
    write_file(plain, plain_chunk(), size)
    out = os.path.join(top, "out")
    # plain: made by a pipeline as it runs; plainFile and colour: read from a cached file.
    kinds = {"plain": PLAIN_CMD.format(n=size), "plainFile": f"cat {shlex.quote(plain)}",
             "colour": f"cat {shlex.quote(colour)}"}
    res["fileCapture"] = {"mb": cfg.file_mb, "secrets": 16, "colourSource": source}
    for kind, cmd in kinds.items():
        tf, tc, ta = [], [], []
        for i in range(cfg.file_runs + 1):  # the first round warms up and is not counted
            for target, argv in ((tf, ["sh", "-c", f"{cmd} > {out}"]), (tc, ["sh", "-c", f"{cmd} | cat > {out}"]),
                                 (ta, [exe, "exec", "--json", "--secret-file", secrets, "--", cmd])):
                if os.path.exists(out):
                    os.remove(out)
                shutil.rmtree(home, ignore_errors=True)
                t = run_timed(argv, env)[0]
                if i:
                    target.append(t)
        res["fileCapture"][kind] = {"redirectMs": tf, "catMs": tc, "execMs": ta}
    for p in (out, colour, plain):
        if os.path.exists(p):
            os.remove(p)
    shutil.rmtree(home, ignore_errors=True)


def start_jobs(ours, n, body_of, threads=4):
    recs = [None] * n

    def worker(k):
        c = ours.conn()
        try:
            for i in range(k, n, threads):
                recs[i] = c.json("POST", "/v1/jobs", body_of(i))
        finally:
            c.close()

    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        list(ex.map(worker, range(threads)))
    return recs


def cancel_jobs(ours, ids, threads=4):
    def worker(k):
        c = ours.conn()
        try:
            for i in range(k, len(ids), threads):
                c.request("POST", f"/v1/jobs/{ids[i]}/cancel", {})
        finally:
            c.close()

    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        list(ex.map(worker, range(threads)))


def wait_no_running(ours, timeout=90):
    running = os.path.join(ours.home, "running")
    end = time.time() + timeout
    while time.time() < end and os.path.isdir(running) and os.listdir(running):
        time.sleep(0.2)


def is_supervisor(pid):
    # An exec'd supervisor runs `gitterm-agent supervise`; a forked one (the usual case)
    # keeps its parent's command line and is named gitterm-superv.
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            if f.read().strip() == b"gitterm-superv":
                return True
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"supervise" in f.read()
    except OSError:
        return False


def bench_scale(cfg, ours, res):
    n = cfg.jobs
    # Memory: n jobs that all run while it is measured.
    recs = []
    try:
        t = time.time()
        recs = start_jobs(ours, n, lambda i: {"command": "sleep 30", "background": True, "timeoutSeconds": 120})
        started = time.time() - t
        time.sleep(0.5)
        sups = [r["supervisorPid"] for r in recs if r and r.get("supervisorPid")]
        alive = [p for p in sups if is_supervisor(p)]
        pss = sum(proc_field(p, "smaps_rollup", "Pss") for p in alive)
        rss = sum(proc_field(p, "smaps_rollup", "Rss") for p in alive)
        res["scaleMemory"] = {"jobs": n, "startSeconds": round(started, 2), "supervisorsAlive": len(alive),
                              "pssTotalKiB": pss, "rssTotalKiB": rss}
    finally:
        cancel_jobs(ours, [r["id"] for r in recs if r])
        wait_no_running(ours)
    # Timeouts: n jobs with a 2 s timeout started at once; bash stamps its start and the
    # TERM it gets ($EPOCHREALTIME needs no fork, so the stamping is not late itself).
    work = os.path.join(cfg.top, "term")
    os.makedirs(work)
    cmd = ("exec bash -c 's=$EPOCHREALTIME; trap \"echo \\$s \\$EPOCHREALTIME > \\$GITTERM_JOB_ID.term; "
           "exit 0\" TERM; sleep 30 & wait'")
    recs = []
    try:
        t = time.time()
        recs = start_jobs(ours, n, lambda i: {"command": cmd, "background": True, "timeoutSeconds": 2, "cwd": work})
        started = time.time() - t
        end = time.time() + 60
        while time.time() < end and len([f for f in os.listdir(work) if f.endswith(".term")]) < n:
            time.sleep(0.2)
        late, spans = [], []
        for f in os.listdir(work):
            if f.endswith(".term"):
                with open(os.path.join(work, f)) as fh:
                    s, e = (float(x) for x in fh.read().split())
                late.append((e - s) * 1000 - 2000)
                spans.append(s)
        spans.sort()
        peak, j = 0, 0  # most jobs inside their 2 s at once
        for i, s in enumerate(spans):
            while spans[j] < s - 2:
                j += 1
            peak = max(peak, i - j + 1)
        res["scaleTimeout"] = {"jobs": n, "startSeconds": round(started, 2), "termReceived": len(late),
                               "peakConcurrent": peak, "latenessMs": late}
    finally:
        left = [r["id"] for r in recs if r]
        wait_no_running(ours, 30)
        if os.path.isdir(os.path.join(ours.home, "running")) and os.listdir(os.path.join(ours.home, "running")):
            cancel_jobs(ours, left)
            wait_no_running(ours)


# ---------------------------------------------------------------------------------------
# the table


# ---------------------------------------------------------------------------------------
# starts: one caller, many callers at once, every core busy; CPU per job (--starts)


class CpuGroup:
    """A cgroup v2 folder of its own for one server: its cpu.stat counts the CPU of every
    process in it and below (exited ones included), to the microsecond."""

    def __init__(self, name):
        base = cgroup_probe_dir()
        if base is None:
            raise RuntimeError("cgroup v2 is not writable here: CPU per job cannot be measured")
        os.rmdir(base)
        self.path = base + f"-{name}"
        os.mkdir(self.path)

    def preexec(self):
        path = os.path.join(self.path, "cgroup.procs")
        return lambda: open(path, "w").write("0")

    def usage_us(self, sub=""):
        try:
            with open(os.path.join(self.path, sub, "cpu.stat")) as f:
                for line in f:
                    if line.startswith("usage_usec "):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    def remove(self):
        for d in sorted(glob.glob(os.path.join(self.path, "**", ""), recursive=True), key=len, reverse=True):
            try:
                os.rmdir(d)
            except OSError:
                pass


def stat_cpu_us(pid):
    """utime+stime of process pid (every thread it ever had) and cutime+cstime (its waited
    children), from /proc/pid/stat, in microseconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0, 0
    tick = 1e6 / os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) * tick, (int(fields[13]) + int(fields[14])) * tick


class StartTarget:
    """One server under test, with how to call `true` on it, how to tell that the answer
    says the job succeeded, and how to read the CPU it spent on its own (not the shells)."""

    def __init__(self, label, conn_fn, call, ok, cpu_fn):
        self.label, self.conn_fn, self.call, self.ok, self.cpu_fn = label, conn_fn, call, ok, cpu_fn
        self.conn = conn_fn()
        self.answered = 0

    def sequential(self, n):
        method, path, body = self.call
        ts, _ = time_calls(self.conn, method, path, body, n, warm=3, check=self.ok)
        self.answered += n + 3
        return ts

    def concurrent(self, callers, seconds):
        """`callers` threads, each on its own kept-alive connection, calling back to back for
        `seconds`: (jobs/s, latencies, errors, CPU of ours per job in us)."""
        method, path, body = self.call
        conns = [self.conn_fn() for _ in range(callers)]
        for c in conns:
            c.request(method, path, body)
        self.answered += callers
        lat, errors = [[] for _ in range(callers)], [0] * callers
        cpu0 = self.cpu_fn()
        t0 = time.perf_counter()
        end = t0 + seconds

        def worker(k):
            c = conns[k]
            while time.perf_counter() < end:
                t = time.perf_counter_ns()
                try:
                    status, _, payload = c.request(method, path, body)
                    good = status == 200 and self.ok(payload)
                except (OSError, ValueError, ConnectionError):
                    good = False
                    c.close()
                lat[k].append((time.perf_counter_ns() - t) / 1e6)
                if not good:
                    errors[k] += 1

        with concurrent.futures.ThreadPoolExecutor(callers) as pool:
            list(pool.map(worker, range(callers)))
        wall = time.perf_counter() - t0
        cpu1 = self.cpu_fn()
        for c in conns:
            c.close()
        n = sum(len(x) for x in lat)
        self.answered += n
        cpu = {k: (cpu1[k] - cpu0[k]) / max(1, n) for k in cpu1}
        return n / wall, [x for xs in lat for x in xs], sum(errors), cpu


def busy_cores():
    """One `yes > /dev/null` per core."""
    return [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(os.cpu_count() or 1)]


def bench_starts(cfg, exe, res):
    """Ours and sandbox-agent side by side, interleaved round by round (the order swapped
    each round): `true` waited by one caller on a quiet machine, by `cfg.callers` callers
    at once, and by one caller while every core runs `yes`; CPU per job of each server's
    own processes (not the shells). Then checks that every job of ours is recorded as
    succeeded and that nothing of either is left running."""
    r = res.setdefault("starts", {"rounds": []})
    ours_cg = CpuGroup("ours")
    peer = SandboxAgent(os.path.join(cfg.top, "peers"))
    peer_cg = CpuGroup("peer")
    ours = None
    try:
        peer.install()
        peer.preexec = peer_cg.preexec()
        peer.start()
        r["peerCommand"] = peer.command.replace(cfg.top, "$TMP")
        pconn = peer.conn()
        peer.setup(pconn)
        pconn.close()
        ours = Ours(exe, cfg.top, 1000, preexec=ours_cg.preexec())
        serve_pid = ours.proc.pid
        time.sleep(0.3)
        forks = [p for p in descendants(serve_pid) if p != serve_pid and proc_name(p) == "gitterm-forks"]

        def ours_cpu():
            # The jobs' cgroups are made below serve's own (gitterm/<id>): their sum is the
            # shells', which is not ours.
            total, shells = ours_cg.usage_us(), ours_cg.usage_us("gitterm")
            own = {"ours": total - shells, "shell": shells, "serve": stat_cpu_us(serve_pid)[0]}
            own["forkServer"] = sum(stat_cpu_us(p)[0] for p in forks)
            return own

        def peer_cpu():
            own, kids = stat_cpu_us(peer.proc.pid)
            return {"ours": own, "shell": kids, "cgroupTotal": peer_cg.usage_us()}

        body = {"command": "true", "waitSeconds": 30}
        t_ours = StartTarget("ours", ours.conn, ("POST", "/v1/jobs", body),
                             lambda p: json.loads(p)["status"] == "succeeded", ours_cpu)
        method, path, pbody = peer.true_call()
        t_peer = StartTarget(peer.label, peer.conn, (method, path, pbody),
                             lambda p: json.loads(p).get("exitCode") == 0, peer_cpu)
        for i in range(cfg.start_rounds):
            order = [t_ours, t_peer] if i % 2 == 0 else [t_peer, t_ours]
            rnd = {"loadAverage": os.getloadavg()[0]}
            log(f"  round {i + 1}/{cfg.start_rounds}: one caller, {cfg.callers} callers, busy cores "
                f"(load {rnd['loadAverage']:.2f})")
            for t in order:
                c0 = t.cpu_fn()
                ts = t.sequential(cfg.start_calls)
                c1 = t.cpu_fn()
                rnd.setdefault(t.label, {})["quietMs"] = ts
                rnd[t.label]["quietCpuUs"] = (c1["ours"] - c0["ours"]) / (cfg.start_calls + 3)
            for t in order:
                rate, lat, errs, cpu = t.concurrent(cfg.callers, cfg.start_seconds)
                rnd[t.label].update(jobsPerSecond=rate, concurrentMs=lat, errors=errs, cpuUs=cpu)
            hogs = busy_cores()
            try:
                time.sleep(0.2)
                for t in order:
                    rnd[t.label]["busyMs"] = t.sequential(cfg.start_calls)
            finally:
                for h in hogs:
                    h.kill()
                    h.wait()
            rnd["createUs"] = med(create_probe(ours.home, 20, 20 * i)) * 1e3
            r["rounds"].append(rnd)
        # Every job of ours is on disk, ended, succeeded; nothing of either is left running.
        time.sleep(0.5)
        jobs_dir = os.path.join(ours.home, "jobs")
        recorded, bad = 0, []
        for name in os.listdir(jobs_dir):
            if not name.startswith("job_"):
                continue
            try:
                with open(os.path.join(jobs_dir, name, "job.json")) as f:
                    st = json.load(f)["status"]
            except (OSError, ValueError, KeyError) as e:
                st = f"unreadable ({e})"
            recorded += 1
            if st != "succeeded":
                bad.append(f"{name}: {st}")
        r["oursAnswered"], r["oursRecorded"], r["oursNotSucceeded"] = t_ours.answered, recorded, bad[:5]
        r["oursRunningMarkers"] = len(os.listdir(os.path.join(ours.home, "running")))
        left = [p for p in descendants(serve_pid) if p != serve_pid and proc_name(p) not in
                ("gitterm-forks", "gitterm-spare")]
        r["oursLeft"] = [f"{p} {proc_name(p)}" for p in left]
        r["peerLeft"] = [f"{p} {proc_name(p)}" for p in descendants(peer.proc.pid) if p != peer.proc.pid]
        r["oursJobCgroups"] = len(glob.glob(os.path.join(ours_cg.path, "gitterm", "job_*")))
    finally:
        if ours:
            stop(ours.proc)
        peer.stop()
        time.sleep(0.2)
        ours_cg.remove()
        peer_cg.remove()


def proc_name(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def starts_report(res, cfg):
    r = res["starts"]
    rounds = r["rounds"]
    peer = "sandbox-agent"

    def per_round(fn):
        """(ours, peer, ours/peer) medians over the rounds; the ratio is each round's own."""
        o = [fn(x["ours"]) for x in rounds]
        p = [fn(x[peer]) for x in rounds]
        return med(o), med(p), med([a / b for a, b in zip(o, p)])

    rows = []
    q = per_round(lambda x: med(x["quietMs"]))
    rows.append(["one caller, quiet, p50", fmt_ms(q[0]), fmt_ms(q[1]), f"{q[2]:.2f}x", "< 1.0x",
                 verdict(q[2], 1.0, strict=True)])
    c = per_round(lambda x: x["jobsPerSecond"])
    rows.append([f"{cfg.callers} callers at once, jobs/s", f"{c[0]:.0f}", f"{c[1]:.0f}", f"{c[2]:.2f}x", ">= 1.0x",
                 "met" if c[2] >= 1.0 else "MISSED"])
    cl = per_round(lambda x: med(x["concurrentMs"]))
    rows.append([f"  their latency p50", fmt_ms(cl[0]), fmt_ms(cl[1]), f"{cl[2]:.2f}x", "", ""])
    cl95 = per_round(lambda x: pct(x["concurrentMs"], 0.95))
    rows.append([f"  their latency p95", fmt_ms(cl95[0]), fmt_ms(cl95[1]), f"{cl95[2]:.2f}x", "", ""])
    b = per_round(lambda x: med(x["busyMs"]))
    rows.append(["every core busy (yes), p50", fmt_ms(b[0]), fmt_ms(b[1]), f"{b[2]:.2f}x", "<= 1.2x",
                 verdict(b[2], 1.2)])
    cpu = per_round(lambda x: x["cpuUs"]["ours"])
    rows.append([f"CPU per job, {cfg.callers} callers", f"{cpu[0]:.0f} us", f"{cpu[1]:.0f} us", f"{cpu[2]:.2f}x", "",
                 ""])
    qc = per_round(lambda x: x["quietCpuUs"])
    rows.append(["CPU per job, one caller", f"{qc[0]:.0f} us", f"{qc[1]:.0f} us", f"{qc[2]:.2f}x", "", ""])
    sh = per_round(lambda x: x["cpuUs"]["shell"])
    rows.append(["  the shell's, not counted above", f"{sh[0]:.0f} us", f"{sh[1]:.0f} us", f"{sh[2]:.2f}x", "", ""])
    head = ["starts, `true` waited", "ours", peer, "ratio", "goal", ""]
    widths = [max(len(str(x[i])) for x in rows + [head]) for i in range(len(head))]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(head, widths)).rstrip(), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in rows]
    o = [x["ours"]["cpuUs"] for x in rounds]
    errs = sum(x[k]["errors"] for x in rounds for k in ("ours", peer))
    lines.append("")
    lines.append(f"ours' CPU per job ({cfg.callers} callers), medians: serve {med([x['serve'] for x in o]):.0f} us, "
                 f"fork server {med([x['forkServer'] for x in o]):.0f} us, supervisors "
                 f"{med([x['ours'] - x['serve'] - x['forkServer'] for x in o]):.0f} us "
                 "(cgroup cpu.stat of serve's own cgroup less its jobs' cgroups); "
                 f"{peer}'s: its /proc/PID/stat utime+stime (its shells: cutime+cstime)")
    lines.append(f"errors {errs}; ours answered {r['oursAnswered']} starts and recorded {r['oursRecorded']} jobs, "
                 f"not succeeded {len(r['oursNotSucceeded'])} {r['oursNotSucceeded']}; left running: ours "
                 f"{r['oursLeft'] or 0} (running markers {r['oursRunningMarkers']}, job cgroups "
                 f"{r['oursJobCgroups']}), {peer} {r['peerLeft'] or 0}")
    lines.append(f"{len(rounds)} rounds of {cfg.start_calls} one-caller calls, {cfg.start_seconds} s of {cfg.callers} "
                 f"callers, {cfg.start_calls} calls with {os.cpu_count()} x `yes`; load average per round "
                 + ", ".join(f"{x['loadAverage']:.2f}" for x in rounds) + "; a new empty file in our state folder "
                 "(a start makes four) p50 per round " + ", ".join(f"{x['createUs']:.0f}" for x in rounds)
                 + f" us; {peer}: {r['peerCommand']}")
    return "\n".join(lines)


def fmt_ms(x):
    if x is None:
        return "-"
    return f"{x:.2f} ms" if x < 100 else f"{x:.0f} ms"


def fmt_kib(x):
    if x is None:
        return "-"
    return f"{x / 1024:.1f} MiB" if x >= 1024 else f"{x:.0f} KiB"


def verdict(value, limit, strict=False):
    if value is None or limit is None:
        return "-"
    return "met" if (value < limit if strict else value <= limit) else "MISSED"


def report(res, peers):
    fl = res["floor"]
    c50 = med(fl["cSpawnMs"]) if fl["cSpawnMs"] else med(fl["pySpawnMs"])
    floor_name = "C spawn" if fl["cSpawnMs"] else "py spawn"
    api, cli = res["api"]["trueMs"], res["cli"]["trueMs"]
    c95 = pct(fl["cSpawnMs"] or fl["pySpawnMs"], 0.95)
    rows = []

    def peer_vals(key, fn):
        vals = []
        for p in peers:
            r = res.get("peers", {}).get(p, {})
            if "error" in r:
                vals.append("skipped")
            elif key in r:
                vals.append(fn(r[key]))
            elif key == "captureMs" and "captureNote" in r:
                vals.append("skipped")
            else:
                vals.append("-")
        return vals

    def fastest(key, f):
        xs = [(f(r[key]), name) for name, r in res.get("peers", {}).items() if key in r and "error" not in r]
        return min(xs) if xs else (None, None)

    a50, a95 = med(api), pct(api, 0.95)
    rows.append(["POST /v1/jobs true, p50", fmt_ms(a50), f"{fmt_ms(c50)} {floor_name}", f"{a50 / c50:.2f}x",
                 "<= 1.6x floor", verdict(a50 / c50, 1.6), *peer_vals("trueMs", lambda x: fmt_ms(med(x)))])
    rows.append(["POST /v1/jobs true, p95", fmt_ms(a95), f"{fmt_ms(c95)} {floor_name}", f"{a95 / c95:.2f}x", "", "",
                 *peer_vals("trueMs", lambda x: fmt_ms(pct(x, 0.95)))])
    fp, fpn = fastest("trueMs", med)
    if fp:
        rows.append(["  p50 vs fastest peer", "", f"{fmt_ms(fp)} {fpn}", f"{a50 / fp:.2f}x", "< 1.0x peer",
                     verdict(a50 / fp, 1.0, strict=True)] + [""] * len(peers))
    x50 = med(cli)
    by_c = res["cli"].get("timedBy") == "C spawn"
    xf, xfn = (c50, floor_name) if by_c else (med(fl["pySubprocessMs"]), "py subprocess")
    rows.append(["exec -- true (CLI), p50", fmt_ms(x50), f"{fmt_ms(xf)} {xfn}", f"{x50 / xf:.2f}x",
                 "<= 3.0x floor", verdict(x50 / xf, 3.0)] + [""] * len(peers))
    if res["cli"].get("versionMs"):
        v50 = med(res["cli"]["versionMs"])
        rows.append(["  of which the binary's start (--version)", fmt_ms(v50), "", f"{v50 / xf:.2f}x", "", ""]
                    + [""] * len(peers))
    cap = res["apiCapture"]
    mb = cap["bytes"] / 1e6
    k50 = med(cap["ms"])
    fpc, fpcn = fastest("captureMs", med)
    rows.append([f"capture {mb:.0f} MB via API, call+read", fmt_ms(k50), f"{fmt_ms(fpc)} {fpcn}" if fpc else "-",
                 f"{k50 / fpc:.2f}x" if fpc else "-", "<= 0.5x peer", verdict(k50 / fpc, 0.5) if fpc else "-",
                 *peer_vals("captureMs", lambda x: fmt_ms(med(x)))])
    if cap.get("pipeToFileMs"):
        p50 = med(cap["pipeToFileMs"])
        rows.append(["", "", f"{fmt_ms(p50)} cmd | cat > file", f"{k50 / p50:.2f}x", "", ""] + [""] * len(peers))
    if cap.get("callMs") and cap.get("pipeToFileMs"):
        call50, r50 = med(cap["callMs"]), med([a - b for a, b in zip(cap["ms"], cap["callMs"])])
        o50 = med(cap["clientFileReadMs"])
        rows.append(["  the call alone", fmt_ms(call50), f"{fmt_ms(p50)} cmd | cat > file", f"{call50 / p50:.2f}x",
                     "", ""]
                    + [""] * len(peers))
        rows.append(["  the read alone (GET /log)", fmt_ms(r50), f"{fmt_ms(o50)} client reads the file",
                     f"{r50 / o50:.2f}x", "", ""] + [""] * len(peers))
        # Neither floor can be beaten by a server: their sum against the peer says how close
        # the goal can come.
        if fpc:
            rows.append(["  floors' sum (| cat + client read)", fmt_ms(p50 + o50), f"{fmt_ms(fpc)} {fpcn}",
                         f"{(p50 + o50) / fpc:.2f}x", "", ""] + [""] * len(peers))
    fc = res["fileCapture"]
    for kind, name, goal in (("plain", "plain (yes|head)", 1.25), ("plainFile", "plain (cat file)", 1.25),
                             ("colour", "colour (cat file)", 1.6)):
        d = fc[kind]
        e, r_, c = med(d["execMs"]), med(d["redirectMs"]), med(d["catMs"])
        rows.append([f"{fc['mb']} MB {name} to file", fmt_ms(e), f"{fmt_ms(r_)} > file", f"{e / r_:.2f}x",
                     f"<= {goal}x > file", verdict(e / r_, goal)] + [""] * len(peers))
        rows.append(["", "", f"{fmt_ms(c)} | cat", f"{e / c:.2f}x", "", ""] + [""] * len(peers))
    idle = res["idle"]
    rows.append(["idle serve VmRSS", fmt_kib(idle["vmRssKiB"]), "", "", "<= 4 MiB",
                 verdict(idle["vmRssKiB"], 4096), *peer_vals("idleRssKiB", fmt_kib)])
    sm = res.get("scaleMemory")
    if sm:
        per = sm["pssTotalKiB"] / max(1, sm["jobs"])
        rows.append([f"supervisor Pss per job ({sm['jobs']})", fmt_kib(per), "", "", "<= 256 KiB",
                     verdict(per, 256)] + [""] * len(peers))
    st = res.get("scaleTimeout")
    if st and st["latenessMs"]:
        p95 = pct(st["latenessMs"], 0.95)
        rows.append([f"TERM lateness p95 ({st['jobs']}, 2 s)", fmt_ms(p95), "", "", "<= 25 ms",
                     verdict(p95, 25)] + [""] * len(peers))
    head = ["what", "ours", "floor / reference", "ratio", "goal", "", *peers]
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(head, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def notes(res, cfg, peers):
    fl = res["floor"]
    out = []
    if fl["cSpawnMs"]:
        out.append(f"floors ({len(fl['cSpawnMs'])} each): C posix_spawn+wait p50 {fmt_ms(med(fl['cSpawnMs']))} "
                   f"p95 {fmt_ms(pct(fl['cSpawnMs'], 0.95))}; "
                   f"python os.posix_spawn p50 {fmt_ms(med(fl['pySpawnMs']))}; "
                   f"python subprocess.run p50 {fmt_ms(med(fl['pySubprocessMs']))}; "
                   f"the CLI is spawned and timed by the {res['cli'].get('timedBy', 'py subprocess')}")
    else:
        out.append("floor: no C compiler, python os.posix_spawn used (it adds its own overhead)")
    out.append(f"disk: a small file written, fsynced, and its folder fsynced: p50 {fmt_ms(med(fl['fsyncMs']))}, "
               f"p95 {fmt_ms(pct(fl['fsyncMs'], 0.95))} (a job's durable record writes pay this several times)")
    if fl.get("createMs"):
        out.append(f"disk: an empty file created in the serve's state folder: p50 {med(fl['createMs']) * 1e3:.0f} us, "
                   f"p95 {pct(fl['createMs'], 0.95) * 1e3:.0f} us (a start creates four; ext4 without a journal "
                   "makes this slow where the folder's block group freed many inodes lately)")
    if fl.get("cgroupMoveMs") or fl.get("cgroupClone3Ms"):
        mv, cl = fl.get("cgroupMoveMs"), fl.get("cgroupClone3Ms")
        out.append("C sh -c true in a fresh cgroup (mkdir, spawn, wait, rmdir): moved in by a cgroup.procs write p50 "
                   f"{fmt_ms(med(mv)) if mv else 'n/a'}; born in it by clone3(CLONE_INTO_CGROUP) p50 "
                   f"{fmt_ms(med(cl)) if cl else 'n/a'}")
    out.append(f"ours: {len(res['api']['trueMs'])} API calls over {1 + res['api']['connectionsOpened']} connection(s), "
               f"serve's own CPU {res['api']['serveCpuUsPerCall']:.0f} us per call over "
               f"{res['api']['serveCpuCalls']} more (its threads' run time, supervisors not included); "
               f"capture read back by {res['apiCapture']['read']}; file capture with "
               f"{res['fileCapture']['secrets']} secrets, colour text: {res['fileCapture']['colourSource']}; "
               f"idle serve Pss {fmt_kib(res['idle']['pssKiB'])}")
    sm, st = res.get("scaleMemory"), res.get("scaleTimeout")
    if sm:
        out.append(f"scale: {sm['jobs']} sleep jobs started in {sm['startSeconds']} s, {sm['supervisorsAlive']} "
                   f"supervisors measured: Pss {fmt_kib(sm['pssTotalKiB'])} total, RSS "
                   f"{fmt_kib(sm['rssTotalKiB'] / max(1, sm['supervisorsAlive']))} each")
    if st and st["latenessMs"]:
        out.append(f"timeouts: {st['jobs']} jobs started in {st['startSeconds']} s ({st['peakConcurrent']} inside "
                   f"their 2 s at once); TERM received by {st['termReceived']}; lateness p50 "
                   f"{fmt_ms(pct(st['latenessMs'], 0.5))}, max {fmt_ms(max(st['latenessMs']))}")
    for p in peers:
        r = res.get("peers", {}).get(p, {})
        if "error" in r:
            out.append(f"{p}: skipped: {r['error']}")
            continue
        conns = r.get("connectionsOpened", 0)
        calls = len(r.get("trueMs", []))
        how = ("one kept-alive connection" if conns == 0 else
               f"{conns} connections for {calls} calls: it closes each after answering (HTTP/1.0)" if conns >= calls
               else f"{conns} connections for {calls} calls")
        extra = f"; capture: {r['captureNote']}" if "captureNote" in r else ""
        out.append(f"{p}: {r.get('command')} ({how}{extra})")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary", nargs="?", default=DEFAULT_BIN)
    ap.add_argument("--quick", action="store_true", help="fewer iterations, smaller captures")
    ap.add_argument("--peers", action="store_true", help="also install and measure the peers")
    ap.add_argument("--starts", action="store_true",
                    help="only the starts beside sandbox-agent: one caller, many callers, busy cores, CPU per job")
    ap.add_argument("--rounds", type=int, help="rounds of the starts comparison (default 5, --quick 1)")
    ap.add_argument("--json", metavar="FILE", help="save the raw numbers")
    args = ap.parse_args()
    exe = os.path.abspath(args.binary)
    if not os.access(exe, os.X_OK):
        sys.exit(f"error: {exe} is not an executable; build it with scripts/build-static.sh")

    class Cfg:
        pass

    cfg = Cfg()
    cfg.calls, cfg.rounds = (30, 2) if args.quick else (200, 4)
    cfg.b64_in = 12_500_000 if args.quick else 50_000_000
    cfg.b64_cmd, cfg.b64_bytes = B64_CMD.format(n=cfg.b64_in), b64_len(cfg.b64_in)
    cfg.capture_runs = 3 if args.quick else 5
    cfg.file_mb, cfg.file_runs = (50, 3) if args.quick else (200, 5)
    cfg.jobs = 200 if args.quick else 1000
    cfg.top = tempfile.mkdtemp(prefix="gitterm-bench-")
    cfg.callers = 8
    cfg.start_rounds = args.rounds or (1 if args.quick else 5)
    cfg.start_calls = 30 if args.quick else 100
    cfg.start_seconds = 2 if args.quick else 5
    res = {"binary": exe, "quick": args.quick, "startedAt": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "loadAverage": os.getloadavg(), "cpus": os.cpu_count()}
    ours = None
    peer_objs = []
    t0 = time.time()
    if args.starts:
        try:
            log(f"starts: ours and sandbox-agent, {cfg.start_rounds} rounds")
            bench_starts(cfg, exe, res)
        finally:
            shutil.rmtree(cfg.top, ignore_errors=True)
        res["seconds"] = round(time.time() - t0, 1)
        print(starts_report(res, cfg))
        print(f"({res['cpus']} CPUs, load average {res['loadAverage'][0]:.2f} at start, "
              f"{os.getloadavg()[0]:.2f} at the end; {res['seconds']} s)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
        return
    try:
        spawn_c = build_spawn_floor(cfg.top)
        ours = Ours(exe, cfg.top, cfg.jobs + 64)
        time.sleep(0.5)
        res["idle"] = {"vmRssKiB": proc_field(ours.proc.pid, "status", "VmRSS"),
                       "pssKiB": proc_field(ours.proc.pid, "smaps_rollup", "Pss")}
        log(f"spawn: {cfg.calls} API calls, {cfg.calls} CLI runs, floors")
        bench_spawn(cfg, exe, ours, spawn_c, res)
        log(f"capture: {cfg.b64_bytes / 1e6:.0f} MB through the API, x{cfg.capture_runs}")
        bench_api_capture(cfg, ours, res)
        log(f"capture: {cfg.file_mb} MB to a file, plain and colour, x{cfg.file_runs}")
        bench_file_capture(cfg, exe, res)
        log(f"scale: {cfg.jobs} running jobs, then {cfg.jobs} with a 2 s timeout")
        bench_scale(cfg, ours, res)
        stop(ours.proc)
        if args.peers:
            peers_root = os.path.join(cfg.top, "peers")
            sr = SweRex(peers_root)
            peer_objs = [sr, SweRexSession(sr), SandboxAgent(peers_root), AgentSandboxServer(peers_root)]
            res["peers"] = {}
            for p in peer_objs:
                log(f"peer: {p.label}")
                bench_peer(p, cfg, res["peers"])
                if p is not sr:  # the session peer that follows it uses its server
                    p.stop()
                if isinstance(p, SweRexSession):
                    sr.stop()
            log(f"starts: ours and sandbox-agent, {cfg.start_rounds} rounds")
            try:
                bench_starts(cfg, exe, res)
            except Exception as e:  # noqa: BLE001 (reported, the rest of the run stands)
                res["startsError"] = f"{type(e).__name__}: {e}"
    finally:
        if ours:
            stop(ours.proc)
        for p in peer_objs:
            p.stop()
        shutil.rmtree(cfg.top, ignore_errors=True)
    res["seconds"] = round(time.time() - t0, 1)
    labels = [p.label for p in peer_objs]
    print(report(res, labels))
    print()
    print(notes(res, cfg, labels))
    if res.get("starts", {}).get("rounds"):
        print()
        print(starts_report(res, cfg))
    elif res.get("startsError"):
        print(f"starts: skipped: {res['startsError']}")
    print(f"({res['cpus']} CPUs, load average {res['loadAverage'][0]:.2f} at start; {res['seconds']} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
