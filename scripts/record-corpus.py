#!/usr/bin/env python3
"""Records the project's terminal corpus: real programs under a pseudo-terminal.

    scripts/record-corpus.py [NAME...]      record (all, or the named ones) again
    scripts/record-corpus.py --check        re-derive every .expected from its .raw, compare
    scripts/record-corpus.py --list         the recordings and their commands

Each recording is written as `NAME.raw` (the bytes the terminal received, byte for byte)
and `NAME.expected` (the text gitterm-agent must store for them) into tests/data/corpus/,
or tests/data/corpus-pending/ for the ones whose text depends on horizontal cursor moves
(`CSI n G`, `CSI n C`, `CSI n D`, `CSI n` + backquote).

The `.expected` text comes from `Terminal` below: an independent, deliberately plain model
of the contract's Output rules (escape sequences and controls removed, the line model of
cursor, `\\r`, backspace, erase-in-line and horizontal moves, `from_utf8_lossy` repair). It
does not use the project's code, so the two check each other.

Programs needed: ls, git, grep, cargo (offline, no registry crates), python3 with pip,
man-db and groff (with the `ls` manual page), pv, dd, top (procps), unshare (util-linux,
run as root for the PID namespace), vim, nano, npm. Every recording runs with
TERM=xterm-256color, a 120x40 terminal, LC_ALL=C.UTF-8, TZ=UTC, a throwaway HOME and fixtures
made from scratch under $RECORD_CORPUS_WORK (default /tmp/record-corpus, removed first), so
a re-recording differs only in timings, sizes and the like.
"""

import fcntl
import os
import select
import shutil
import struct
import subprocess
import sys
import termios
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN = os.path.join(ROOT, "tests", "data", "corpus")
PENDING = os.path.join(ROOT, "tests", "data", "corpus-pending")
WORK = os.environ.get("RECORD_CORPUS_WORK", "/tmp/record-corpus")
COLS, ROWS = 120, 40

# ---------------------------------------------------------------------------------------
# The contract's Output rules, as a plain model.
# ---------------------------------------------------------------------------------------

ERASED = None  # an erased (blank) cell; shown as a space only when text follows it


class Terminal:
    """Bytes in, stored text out. One line is a list of cells (characters) and a cursor.

    Where a sequence ends follows the VT500 parser as vte implements it: C0 controls act
    inside CSI and plain ESC sequences, are ignored inside DCS/OSC/SOS/PM/APC strings; ESC
    starts a new sequence anywhere (so it ends a string sequence); CAN and SUB abort any
    sequence; bytes >= 0x80 inside a sequence belong to it; 0x9C ends a DCS payload (and
    only that).
    """

    def __init__(self, moves=True):
        self.moves = moves  # False: horizontal cursor moves are dropped without effect
        self.state = "ground"
        self.line = []
        self.cursor = 0
        self.out = []
        self.held = 0  # UTF-8 bytes of the held line (an erased cell counts as one)
        self.longest = 0  # the most bytes one line held

    # -- the line ----------------------------------------------------------------------

    def write(self, ch):
        if self.cursor < len(self.line):
            self.held -= cell_bytes(self.line[self.cursor])
            self.line[self.cursor] = ch
        else:
            self.held += self.cursor - len(self.line)
            self.line.extend([ERASED] * (self.cursor - len(self.line)))
            self.line.append(ch)
        self.held += cell_bytes(ch)
        self.cursor += 1
        self.longest = max(self.longest, self.held)

    def text(self):
        cells = list(self.line)
        while cells and cells[-1] is ERASED:
            cells.pop()
        return "".join(" " if c is ERASED else c for c in cells)

    def store(self, newline=True):
        self.out.append(self.text() + ("\n" if newline else ""))
        self.line, self.cursor, self.held = [], 0, 0

    def erase(self, mode):
        n = len(self.line)
        if mode == 0:  # cursor to end
            for i in range(self.cursor, n):
                self.line[i] = ERASED
        elif mode == 1:  # start through the cursor
            for i in range(0, min(self.cursor + 1, n)):
                self.line[i] = ERASED
        elif mode == 2:  # the whole line; the cursor stays
            self.line = [ERASED] * n
        self.held = sum(cell_bytes(c) for c in self.line)

    def execute(self, b):
        if b == 0x0A:
            self.store()
        elif b == 0x0D:
            self.cursor = 0
        elif b == 0x08:
            self.cursor = max(0, self.cursor - 1)
        elif b == 0x09:
            self.write("\t")
        # every other C0 control (and CAN, SUB) shows nothing

    # -- CSI ---------------------------------------------------------------------------

    def csi_start(self):
        self.params, self.cur, self.marked = [], None, False

    def csi_param(self, b):
        if 0x30 <= b <= 0x39:
            self.cur = min(65535, (self.cur or 0) * 10 + b - 0x30)
        else:  # ';' or ':' ends a parameter or subparameter
            self.params.append(self.cur or 0)
            self.cur = None

    def csi_dispatch(self, final):
        params = self.params + [self.cur or 0]
        if self.marked or len(params) > 32:
            return  # private marker, intermediate, or more than vte keeps: no effect
        n = params[0]
        if final == ord("K"):
            self.erase(n)
        elif not self.moves:
            return
        elif final in (ord("G"), ord("`")):
            self.cursor = max(n, 1) - 1
        elif final == ord("C"):
            self.cursor += max(n, 1)
        elif final == ord("D"):
            self.cursor = max(0, self.cursor - max(n, 1))

    # -- the parser --------------------------------------------------------------------

    def feed(self, data):
        i, n = 0, len(data)
        while i < n:
            b = data[i]
            if self.state == "ground" and b >= 0x80:
                ch, used = utf8_char(data, i)
                if not ("\x80" <= ch <= "\x9f"):  # C1 controls are removed
                    self.write(ch)
                i += used
                continue
            self.step(b)
            i += 1
        return self

    def step(self, b):
        s = self.state
        if b in (0x18, 0x1A):  # CAN, SUB: abort
            self.state = "ground"
            return
        if b == 0x1B:
            self.state = "escape"
            return
        if s == "ground":
            if 0x20 <= b <= 0x7E:
                self.write(chr(b))
            elif b < 0x20:
                self.execute(b)
            return  # DEL
        if s in ("escape", "esc_inter", "csi_entry", "csi_param", "csi_inter", "csi_ignore"):
            if b < 0x20:
                self.execute(b)
                return
            if b >= 0x7F:
                return
        if s == "escape":
            if b <= 0x2F:
                self.state = "esc_inter"
            elif b == ord("["):
                self.csi_start()
                self.state = "csi_entry"
            elif b == ord("]"):
                self.state = "osc"
            elif b == ord("P"):
                self.state = "dcs_entry"
            elif b in (ord("X"), ord("^"), ord("_")):
                self.state = "sos_pm_apc"
            else:
                self.state = "ground"  # a complete ESC sequence: no effect
        elif s == "esc_inter":
            if b >= 0x30:
                self.state = "ground"
        elif s in ("csi_entry", "csi_param"):
            if 0x30 <= b <= 0x3B:
                self.csi_param(b)
                self.state = "csi_param"
            elif 0x3C <= b <= 0x3F:
                if s == "csi_entry":
                    self.marked = True
                    self.state = "csi_param"
                else:
                    self.state = "csi_ignore"
            elif b <= 0x2F:
                self.marked = True
                self.state = "csi_inter"
            else:
                self.state = "ground"
                self.csi_dispatch(b)
        elif s == "csi_inter":
            if 0x30 <= b <= 0x3F:
                self.state = "csi_ignore"
            elif b >= 0x40:
                self.state = "ground"
                self.csi_dispatch(b)
        elif s == "csi_ignore":
            if b >= 0x40:
                self.state = "ground"
        elif s in ("dcs_entry", "dcs_param", "dcs_inter"):
            if b < 0x20 or b >= 0x7F:
                return
            if b >= 0x40:
                self.state = "dcs_pass"
            elif b <= 0x2F:
                self.state = "dcs_inter"
            elif s == "dcs_inter" or (s == "dcs_param" and b >= 0x3C):
                self.state = "dcs_ignore"
            else:
                self.state = "dcs_param"
        elif s == "dcs_pass":
            if b == 0x9C:  # the 8-bit string terminator
                self.state = "ground"
        elif s == "osc":
            if b == 0x07:
                self.state = "ground"
        # sos_pm_apc: only ESC, CAN and SUB end it

    def finish(self):
        if self.line:
            self.store(newline=False)
        return "".join(self.out).encode()


def cell_bytes(cell):
    return 1 if cell is ERASED else len(cell.encode())


def utf8_char(data, i):
    """The character at data[i] (a byte >= 0x80) and how many bytes it used; U+FFFD for a
    maximal invalid subpart, as Rust's from_utf8_lossy and Python's 'replace' decode."""
    b = data[i]
    if 0xC2 <= b <= 0xDF:
        need, lo, hi = 1, 0x80, 0xBF
    elif b == 0xE0:
        need, lo, hi = 2, 0xA0, 0xBF
    elif b == 0xED:
        need, lo, hi = 2, 0x80, 0x9F
    elif 0xE1 <= b <= 0xEF:
        need, lo, hi = 2, 0x80, 0xBF
    elif b == 0xF0:
        need, lo, hi = 3, 0x90, 0xBF
    elif 0xF1 <= b <= 0xF3:
        need, lo, hi = 3, 0x80, 0xBF
    elif b == 0xF4:
        need, lo, hi = 3, 0x80, 0x8F
    else:
        return "\ufffd", 1
    j = i + 1
    for k in range(need):
        if j >= len(data) or not (lo <= data[j] <= hi if k == 0 else 0x80 <= data[j] <= 0xBF):
            return "\ufffd", j - i
        j += 1
    return data[i:j].decode("utf-8"), j - i


def stored(raw, moves=True):
    t = Terminal(moves).feed(raw)
    return t.finish(), t.longest


def check_text(name, text):
    """What every .expected must be: valid UTF-8, no ESC, no C0 but \\n and \\t, no C1."""
    s = text.decode("utf-8")  # raises on invalid UTF-8
    bad = sorted({hex(ord(c)) for c in s if (ord(c) < 0x20 and c not in "\n\t")
                  or 0x7F <= ord(c) <= 0x9F})
    if bad:
        raise SystemExit(f"{name}: forbidden characters {bad}")


# ---------------------------------------------------------------------------------------
# Running a program on a pseudo-terminal.
# ---------------------------------------------------------------------------------------


def run_pty(argv, env, cwd, keys=(), timeout=120):
    """Runs argv with a new pty as its controlling terminal (stdin, stdout and stderr);
    `keys` are (seconds after the previous key, bytes) typed into it. Returns the bytes."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))

    def session():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                            cwd=cwd, preexec_fn=session, close_fds=True)
    os.close(slave)
    out, keys = bytearray(), list(keys)
    start = last = time.monotonic()
    while True:
        now = time.monotonic()
        if keys and now - last >= keys[0][0]:
            os.write(master, keys.pop(0)[1])
            last = now
        if now - start > timeout:
            proc.kill()
        if select.select([master], [], [], 0.02)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal has gone
                break
            if not chunk:
                break
            out += chunk
    os.close(master)
    if proc.wait() != 0:
        print(f"  (exit status {proc.returncode})", file=sys.stderr)
    return bytes(out)


def base_env(**extra):
    tools = [os.path.dirname(os.path.realpath(sys.executable))]  # this python, with pip
    for prog in ("cargo", "git"):
        path = shutil.which(prog)
        if path and os.path.dirname(path) not in tools:
            tools.append(os.path.dirname(path))
    env = {
        "PATH": ":".join(tools + ["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"]),
        "TERM": "xterm-256color",
        "COLUMNS": str(COLS),
        "LINES": str(ROWS),
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "HOME": os.path.join(WORK, "home"),
        "TMPDIR": os.path.join(WORK, "tmp"),
    }
    # HOME is a throwaway folder: tell rustup and cargo where the toolchain is.
    for keep, default in (("CARGO_HOME", "~/.cargo"), ("RUSTUP_HOME", "~/.rustup")):
        path = os.environ.get(keep, os.path.expanduser(default))
        if os.path.isdir(path):
            env[keep] = path
    env.update(extra)
    return env


def write(path, text, mode=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(text.encode() if isinstance(text, str) else text)
    if mode is not None:
        os.chmod(path, mode)


FIXED_TIME = 1704189600  # 2024-01-02 10:00:00 UTC


def fix_times(top):
    for dirpath, dirnames, filenames in os.walk(top, topdown=False):
        for name in filenames + dirnames:
            os.utime(os.path.join(dirpath, name), (FIXED_TIME, FIXED_TIME), follow_symlinks=False)
    os.utime(top, (FIXED_TIME, FIXED_TIME))


# ---------------------------------------------------------------------------------------
# Fixtures.
# ---------------------------------------------------------------------------------------


def fixture_tree():
    """A folder with one entry of every kind ls colours, and enough names for columns."""
    top = os.path.join(WORK, "tree")
    write(f"{top}/README.md", "# demo\n")
    write(f"{top}/.hidden", "")
    write(f"{top}/build.sh", "#!/bin/sh\n", 0o755)
    write(f"{top}/setuid-tool", "", 0o4755)
    write(f"{top}/setgid-tool", "", 0o2755)
    for name in ("archive.tar.gz", "bundle.zip", "logo.png", "photo.jpg", "song.ogg",
                 "movie.mkv", "notes.txt", "Cargo.toml", "main.rs", "lib.rs"):
        write(f"{top}/{name}", "x\n")
    for i in range(1, 41):
        write(f"{top}/module_{i:02d}.rs", "\n")
    for d in ("src", "docs", "target"):
        os.makedirs(f"{top}/{d}", exist_ok=True)
    os.makedirs(f"{top}/shared-tmp", exist_ok=True)
    os.chmod(f"{top}/shared-tmp", 0o1777)
    os.makedirs(f"{top}/world-writable", exist_ok=True)
    os.chmod(f"{top}/world-writable", 0o777)
    os.symlink("README.md", f"{top}/link-to-readme")
    os.symlink("src", f"{top}/link-to-src")
    os.symlink("no-such-file", f"{top}/broken-link")
    os.mkfifo(f"{top}/pipe")
    fix_times(top)
    return top


def fixture_odd_names():
    """File names that carry controls and bytes that are not UTF-8 (ls prints them raw)."""
    top = os.path.join(WORK, "odd")
    os.makedirs(top)
    names = [
        b"plain.txt",
        b"caf\xc3\xa9 na\xc3\xafve \xe2\x82\xac.txt",  # valid UTF-8
        b"tab\there.txt",  # a tab is kept
        b"carriage\rCR.txt",  # \r: the rest overwrites the start
        b"back\x08\x08\x08\x08space.txt",  # backspaces: overwrite
        b"bell\x07and-del\x7f.txt",  # removed
        b"next-line\xc2\x85c1.txt",  # U+0085, a C1 control: removed
        b"latin1-caf\xe9.txt",  # a lone 0xE9: one U+FFFD
        b"cut-\xe2\x82-euro.txt",  # a truncated 3-byte character: one U+FFFD
        b"overlong-\xc0\xaf.txt",  # two U+FFFD
        b"surrogate-\xed\xa0\x80.txt",  # three U+FFFD
        b"byte-\xff\xfe.txt",  # two U+FFFD
        b"esc-\x1b[31mred\x1b[0m.txt",  # an escape sequence in a name
        b"new\nline.txt",  # a newline in a name
        b"wide-\xe6\x97\xa5\xe6\x9c\xac.txt",  # CJK
    ]
    for name in names:
        with open(os.path.join(top.encode(), name), "wb") as f:
            f.write(b"x\n")
    os.chmod(os.path.join(top.encode(), b"plain.txt"), 0o755)
    fix_times(top)
    return top


def git_env(author, when):
    name, email = author
    return base_env(GIT_AUTHOR_NAME=name, GIT_AUTHOR_EMAIL=email, GIT_COMMITTER_NAME=name,
                    GIT_COMMITTER_EMAIL=email, GIT_AUTHOR_DATE=when, GIT_COMMITTER_DATE=when,
                    GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null")


def fixture_repo():
    """A small repository with fixed authors and dates, two tags, a merged branch, a
    rename, and a line with trailing whitespace (which git log -p marks)."""
    top = os.path.join(WORK, "repo")
    os.makedirs(top)
    ada = ("Ada Lovelace", "ada@example.org")
    grace = ("Grace Hopper", "grace@example.org")
    zoe = ("Zoë Ünger", "zoe@example.org")
    clock = [FIXED_TIME]

    def git(args, author=ada):
        clock[0] += 3600 + 17 * 60
        when = f"@{clock[0]} +0000"
        subprocess.run(["git"] + args, check=True, cwd=top, env=git_env(author, when),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def commit(msg, author=ada, files=()):
        for path, text in dict(files).items():
            write(os.path.join(top, path), text)
        git(["add", "-A"], author)
        git(["commit", "-q", "-m", msg], author)

    git(["init", "-q", "-b", "main"])
    commit("Initial commit", files={"README.md": "# counter\n\nCounts lines.\n"})
    commit("Add the counting loop", grace, files={"src/main.c":
           '#include <stdio.h>\n\nint main(void) {\n    int c, n = 0;\n'
           '    while ((c = getchar()) != EOF)\n        if (c == \'\\n\')\n            n++;\n'
           '    printf("%d\\n", n);\n    return 0;\n}\n'})
    commit("Makefile with tab-indented rules", ada, files={"Makefile":
           "CFLAGS = -O2 -Wall\n\ncounter: src/main.c\n\t$(CC) $(CFLAGS) -o $@ $<\n\n"
           "clean:\n\trm -f counter\n"})
    git(["tag", "-a", "v0.1.0", "-m", "First release"])
    git(["checkout", "-q", "-b", "feature/words"], zoe)
    commit("Count words too", zoe, files={"src/main.c":
           '#include <ctype.h>\n#include <stdio.h>\n\nint main(void) {\n'
           '    int c, n = 0, w = 0, in = 0;\n    while ((c = getchar()) != EOF) {\n'
           '        if (c == \'\\n\')\n            n++;\n        if (isspace(c))\n'
           '            in = 0;\n        else if (!in) {\n            in = 1;\n'
           '            w++;\n        }\n    }\n    printf("%d %d\\n", n, w);\n'
           '    return 0;\n}\n'})
    commit("Document the word count (naïve definition)", zoe, files={"README.md":
           "# counter\n\nCounts lines and words.   \n\nA word is a run of non-space "
           "characters — “naïve”, but enough.\n"})
    git(["checkout", "-q", "main"], grace)
    commit("Build with warnings as errors", grace, files={"Makefile":
           "CFLAGS = -O2 -Wall -Werror\n\ncounter: src/main.c\n\t$(CC) $(CFLAGS) -o $@ $<\n\n"
           "clean:\n\trm -f counter\n"})
    git(["merge", "-q", "--no-ff", "-m", "Merge branch 'feature/words'", "feature/words"], grace)
    git(["mv", "README.md", "README"], ada)
    git(["commit", "-q", "-m", "Rename README"], ada)
    commit("Drop the -O2 flag", ada, files={"Makefile":
           "CFLAGS = -Wall -Werror\n\ncounter: src/main.c\n\t$(CC) $(CFLAGS) -o $@ $<\n\n"
           "clean:\n\trm -f counter\n"})
    git(["tag", "v0.2.0"], ada)
    git(["checkout", "-q", "-b", "wip"], ada)
    commit("WIP: count bytes", ada, files={"TODO": "- count bytes\n- count characters (UTF-8)\n"})
    git(["checkout", "-q", "main"], ada)
    return top


LOG_MESSAGES = [
    ("INFO", "accepted connection from 10.0.0.{n}"),
    ("INFO", "job job_{h} started: cargo test"),
    ("WARN", "slow request: GET /v1/jobs took {ms} ms"),
    ("INFO", "job job_{h} succeeded in {ms} ms"),
    ("ERROR", "job job_{h} failed: exit status 101"),
    ("INFO", "health check ok"),
    ("WARN", "retrying upload, attempt {n} of 5"),
    ("ERROR", "Error: connection reset by peer (os error 104)"),
    ("INFO", "job job_{h} timed out after {n} s"),
    ("DEBUG", "cache hit for key {h}"),
]


def fixture_logs():
    """Log files to grep through: deterministic, a few hundred lines."""
    top = os.path.join(WORK, "logs")
    for f in range(3):
        lines = []
        for i in range(120):
            k = (i * 7 + f * 3) % len(LOG_MESSAGES)
            level, msg = LOG_MESSAGES[k]
            h = f"{(i * 2654435761 + f) % 2**40:010x}"
            msg = msg.format(n=(i * 13 + f) % 250, h=h, ms=(i * 37 + f * 11) % 5000)
            lines.append(f"2024-01-0{f + 2}T{i // 60 + 10:02d}:{i % 60:02d}:00Z {level:<5} {msg}")
        write(f"{top}/agent-{f + 1}.log", "\n".join(lines) + "\n")
    fix_times(top)
    return top


def fixture_crate():
    """A crate with two local dependencies, build scripts that take a moment (so the
    progress bar has frames) and one warning. No registry crates: builds offline."""
    top = os.path.join(WORK, "crate")
    slow = "fn main() {{\n    std::thread::sleep(std::time::Duration::from_millis({}));\n}}\n"
    for dep, ms in (("alpha", 900), ("beta", 600)):
        write(f"{top}/{dep}/Cargo.toml",
              f'[package]\nname = "{dep}"\nversion = "0.1.0"\nedition = "2021"\n')
        write(f"{top}/{dep}/build.rs", slow.format(ms))
        write(f"{top}/{dep}/src/lib.rs", f'pub fn name() -> &\'static str {{\n    "{dep}"\n}}\n')
    write(f"{top}/app/Cargo.toml",
          '[package]\nname = "demo-app"\nversion = "0.1.0"\nedition = "2021"\n\n'
          '[dependencies]\nalpha = { path = "../alpha" }\nbeta = { path = "../beta" }\n')
    write(f"{top}/app/build.rs", slow.format(1500))
    write(f"{top}/app/src/main.rs",
          'fn main() {\n    let unused = 42;\n    println!("{} {}", alpha::name(), beta::name());\n}\n')
    return os.path.join(top, "app")


SLOW_BACKEND = '''"""A tiny PEP 517 build backend that takes its time, printing a line now and then."""
import base64, hashlib, os, time, zipfile

NAME, VERSION = "demo_slow", "1.0"
DIST = f"{NAME}-{VERSION}.dist-info"
METADATA = f"Metadata-Version: 2.1\\nName: demo-slow\\nVersion: {VERSION}\\n"
WHEEL = "Wheel-Version: 1.0\\nGenerator: slowbackend\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"


def _work(what, steps):
    for i in range(steps):
        print(f"{what}: step {i + 1} of {steps}", flush=True)
        time.sleep(0.15)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _work("metadata", 6)
    os.makedirs(os.path.join(metadata_directory, DIST))
    with open(os.path.join(metadata_directory, DIST, "METADATA"), "w") as f:
        f.write(METADATA)
    return DIST


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _work("wheel", 12)
    files = {f"{NAME}/__init__.py": "ANSWER = 42\\n", f"{DIST}/METADATA": METADATA,
             f"{DIST}/WHEEL": WHEEL}
    record = []
    for path, text in files.items():
        digest = hashlib.sha256(text.encode()).digest()
        b64 = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        record.append(f"{path},sha256={b64},{len(text.encode())}")
    record.append(f"{DIST}/RECORD,,")
    files[f"{DIST}/RECORD"] = "\\n".join(record) + "\\n"
    name = f"{NAME}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for path, text in files.items():
            z.writestr(zipfile.ZipInfo(path, (2024, 1, 2, 10, 0, 0)), text)
    return name
'''


def fixture_pypkg():
    """A local Python project whose in-tree build backend needs no other package."""
    top = os.path.join(WORK, "pypkg")
    write(f"{top}/pyproject.toml",
          '[build-system]\nrequires = []\nbuild-backend = "slowbackend"\nbackend-path = ["."]\n\n'
          '[project]\nname = "demo-slow"\nversion = "1.0"\n')
    write(f"{top}/slowbackend.py", SLOW_BACKEND)
    return WORK


def fixture_notes():
    write(f"{WORK}/notes/todo.txt", "first line\nsecond line\n\tindented with a tab\n")
    write(f"{WORK}/notes/plan.txt", "buy milk\ncall Ada\n")
    return f"{WORK}/notes"


def fixture_npm():
    """A package with one local dependency, installed offline; the dependency's install
    script takes two seconds, so npm's spinner turns for a while."""
    top = os.path.join(WORK, "npm-demo")
    write(f"{top}/dep/package.json",
          '{"name": "dep", "version": "1.0.0", "scripts": {"postinstall": "sleep 2"}}\n')
    write(f"{top}/dep/index.js", "module.exports = 42;\n")
    write(f"{top}/package.json",
          '{"name": "npm-demo", "version": "1.0.0", "dependencies": {"dep": "file:./dep"}}\n')
    return top


# ---------------------------------------------------------------------------------------
# The recordings: name, folder, fixture (returns the cwd), command, extra env, keys.
# ---------------------------------------------------------------------------------------

VIM_KEYS = [(1.0, b"jA appended\x1b"), (0.3, b"Gonew last line\x1b"), (0.3, b":wq\r")]
NANO_KEYS = [(1.0, b"\x1b[Bhello from nano "), (0.3, b"\x0f"), (0.3, b"\r"), (0.5, b"\x18")]

RECORDINGS = [
    ("ls-tree-columns", MAIN, fixture_tree,
     "eval \"$(dircolors -b)\"; ls --color=always -A -F", {}, []),
    ("ls-tree-long", MAIN, fixture_tree,
     "eval \"$(dircolors -b)\"; ls --color=always -l -A -n --time-style=long-iso", {}, []),
    ("ls-odd-names", MAIN, fixture_odd_names,
     "ls --color=always -1 -N --show-control-chars", {}, []),
    ("git-log-graph-patch", MAIN, fixture_repo,
     "git --no-pager log --color=always --graph --decorate --all -p --date=iso",
     {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}, []),
    ("grep-logs-context", MAIN, fixture_logs,
     "grep --color=always -n -i -C1 -e error -e 'timed out' agent-1.log agent-2.log agent-3.log",
     {}, []),
    ("cargo-build-progress", MAIN, fixture_crate,
     "cargo build --offline",
     {"CARGO_TERM_PROGRESS_WHEN": "always", "CARGO_TERM_PROGRESS_WIDTH": str(COLS),
      "CARGO_TERM_COLOR": "always", "CARGO_TARGET_DIR": os.path.join(WORK, "crate-target")},
     []),
    ("pip-install-spinner", MAIN, fixture_pypkg,
     "python3 -m pip install --no-index --no-build-isolation --no-deps --target pytarget ./pypkg",
     {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1",
      "PIP_ROOT_USER_ACTION": "ignore", "PYTHONDONTWRITEBYTECODE": "1"}, []),
    ("pv-progress", MAIN, lambda: WORK,
     "head -c 3000000 /dev/zero | pv -f -s 3000000 -L 1000000 -i 0.25 > /dev/null", {}, []),
    ("dd-progress", MAIN, lambda: WORK,
     "head -c 3000000 /dev/zero | pv -q -L 1000000 | dd of=/dev/null bs=4k status=progress",
     {}, []),
    ("man-ls-overstrike", MAIN, lambda: WORK,
     "man -P cat ls",
     {"MAN_KEEP_FORMATTING": "1", "GROFF_NO_SGR": "1", "MANWIDTH": "80"}, []),
    ("top-full-screen", MAIN, lambda: WORK,
     "unshare --pid --fork --mount-proc sh -c 'sleep 30 & sleep 30 & exec top -n 1'", {}, []),
    ("vim-edit-session", MAIN, fixture_notes,
     "vim -u NONE -i NONE -n -N todo.txt", {}, VIM_KEYS),
    ("nano-edit-session", PENDING, fixture_notes,
     "nano --ignorercfiles plan.txt", {}, NANO_KEYS),
    ("npm-spinner", PENDING, fixture_npm,
     "npm install --offline --no-audit --no-fund",
     {"npm_config_cache": os.path.join(WORK, "npm-cache"), "npm_config_update_notifier": "false"},
     []),
]

KEY_NOTES = {
    "vim-edit-session": "typed: `j`, `A appended` Esc, `Go` `new last line` Esc, `:wq` Enter",
    "nano-edit-session": "typed: Down, `hello from nano `, ^O, Enter, ^X",
}


def record(entry):
    name, folder, fixture, command, extra, keys = entry
    shutil.rmtree(WORK, ignore_errors=True)
    for d in ("home", "tmp"):
        os.makedirs(os.path.join(WORK, d))
    cwd = fixture()
    print(f"{name}: {command}", file=sys.stderr)
    raw = run_pty(["/bin/sh", "-c", command], base_env(**extra), cwd, keys)
    os.makedirs(folder, exist_ok=True)
    write(os.path.join(folder, name + ".raw"), raw)
    write_expected(folder, name, raw)


def write_expected(folder, name, raw):
    text, longest = stored(raw)
    check_text(name, text)
    if longest >= 64 * 1024:
        raise SystemExit(f"{name}: a line holds {longest} bytes, over the 64 KiB line bound")
    if folder == MAIN and stored(raw, moves=False)[0] != text:
        raise SystemExit(f"{name}: its text depends on horizontal cursor moves; "
                         "it belongs in corpus-pending")
    write(os.path.join(folder, name + ".expected"), text)
    print(f"  {len(raw)} bytes raw, {len(text)} bytes stored", file=sys.stderr)


def check():
    failed = 0
    for folder in (MAIN, PENDING):
        if not os.path.isdir(folder):
            continue
        for f in sorted(os.listdir(folder)):
            if not f.endswith(".raw"):
                continue
            name = f[:-4]
            with open(os.path.join(folder, f), "rb") as fh:
                raw = fh.read()
            with open(os.path.join(folder, name + ".expected"), "rb") as fh:
                expected = fh.read()
            check_text(name, expected)
            ok = stored(raw)[0] == expected
            failed += not ok
            print(f"{'ok  ' if ok else 'DIFF'} {os.path.relpath(folder, ROOT)}/{name}")
    sys.exit(1 if failed else 0)


def main(args):
    if args == ["--check"]:
        check()
    if args == ["--list"]:
        for name, folder, _, command, extra, _ in RECORDINGS:
            env = " ".join(f"{k}={v}" for k, v in extra.items())
            print(f"{os.path.relpath(folder, ROOT)}/{name}: {env + ' ' if env else ''}{command}"
                  + (f"  ({KEY_NOTES[name]})" if name in KEY_NOTES else ""))
        return
    unknown = set(args) - {r[0] for r in RECORDINGS}
    if unknown:
        raise SystemExit(f"unknown recordings: {sorted(unknown)}")
    for entry in RECORDINGS:
        if not args or entry[0] in args:
            record(entry)
    shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
