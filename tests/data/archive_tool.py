#!/usr/bin/env python3
"""Python's tarfile as the archives tests' independent judge (tests/archives.rs).

  list ARCHIVE          the archive's entries, as JSON lines, as tarfile reads them
  tree DIR              a folder's entries in the same form, from lstat
  pack DIR OUT [gz]     DIR packed by tarfile itself (symlinks kept), members named ./...
  hostile KIND OUT      one hostile archive (see hostile())
  bomb OUT N SIZE       N files of SIZE zero bytes, gzipped

An entry is {"name", "type", "mode", "size", "sha256", "link", "mtime"}; names have no
"./" and no trailing "/", mode is the permission bits, sha256 is for files only.
"""
import hashlib
import io
import json
import os
import stat
import sys
import tarfile


def digest(f):
    h = hashlib.sha256()
    while True:
        b = f.read(1 << 20)
        if not b:
            return h.hexdigest()
        h.update(b)


def clean(name):
    while name.startswith("./"):
        name = name[2:]
    return name.rstrip("/")


def list_archive(path):
    out = []
    with tarfile.open(path, "r:*") as t:
        for m in t:
            name = clean(m.name)
            if name in ("", "."):
                continue
            e = {"name": name, "mode": m.mode & 0o7777, "mtime": int(m.mtime), "link": None,
                 "size": 0, "sha256": None}
            if m.isdir():
                e["type"] = "dir"
            elif m.issym():
                e["type"] = "symlink"
                e["link"] = m.linkname
            elif m.isfile():
                e["type"] = "file"
                e["size"] = m.size
                e["sha256"] = digest(t.extractfile(m))
            else:
                e["type"] = "other"
            out.append(e)
    return out


def list_tree(top):
    out = []
    for root, dirs, files in os.walk(top):
        dirs.sort()
        for n in sorted(dirs + files):
            p = os.path.join(root, n)
            st = os.lstat(p)
            name = os.path.relpath(p, top)
            e = {"name": name, "mode": st.st_mode & 0o7777, "mtime": int(st.st_mtime),
                 "link": None, "size": 0, "sha256": None}
            if stat.S_ISDIR(st.st_mode):
                e["type"] = "dir"
            elif stat.S_ISLNK(st.st_mode):
                e["type"] = "symlink"
                e["link"] = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                e["type"] = "file"
                e["size"] = st.st_size
                with open(p, "rb") as f:
                    e["sha256"] = digest(f)
            else:
                e["type"] = "other"
            out.append(e)
    out.sort(key=lambda e: e["name"])
    return out


def member(name, kind=tarfile.REGTYPE, data=b"", link="", mode=0o644, size=None):
    m = tarfile.TarInfo(name)
    m.type = kind
    m.mode = mode
    m.linkname = link
    m.size = len(data) if size is None else size
    return m, (io.BytesIO(data) if data else None)


def hostile(kind):
    """The members of a hostile archive (each must be refused whole)."""
    ok = member("fine.txt", data=b"this one alone would be fine\n")
    if kind == "dotdot":
        return [ok, member("sub/../../escape.txt", data=b"x")]
    if kind == "absolute":
        return [ok, member("/tmp/gitterm-absolute-escape.txt", data=b"x")]
    if kind == "through-own-symlink":
        return [ok, member("out", tarfile.SYMTYPE, link="/tmp"),
                member("out/gitterm-through-link.txt", data=b"x")]
    if kind == "through-own-symlink-dotdot":
        return [ok, member("up", tarfile.SYMTYPE, link=".."),
                member("up/escape.txt", data=b"x")]
    if kind == "through-found-symlink":
        # The target already holds `there`, a symlink out of it (made by the test).
        return [ok, member("there/gitterm-found-link.txt", data=b"x")]
    if kind == "hardlink-absolute":
        return [ok, member("h", tarfile.LNKTYPE, link="/etc/passwd")]
    if kind == "hardlink-dotdot":
        return [ok, member("h", tarfile.LNKTYPE, link="../outside.txt")]
    if kind == "hardlink-missing":
        return [ok, member("h", tarfile.LNKTYPE, link="not-in-the-archive.txt")]
    if kind == "hardlink-through-symlink":
        return [ok, member("l", tarfile.SYMTYPE, link="/etc"),
                member("h", tarfile.LNKTYPE, link="l/passwd")]
    if kind == "chardev":
        m, _ = member("null", tarfile.CHRTYPE)
        m.devmajor, m.devminor = 1, 3
        return [ok, (m, None)]
    if kind == "blockdev":
        m, _ = member("disk", tarfile.BLKTYPE)
        m.devmajor, m.devminor = 8, 0
        return [ok, (m, None)]
    if kind == "fifo":
        return [ok, member("pipe", tarfile.FIFOTYPE)]
    if kind == "long-name":
        return [ok, member("a" * 200 + "/" + "b" * 5000, data=b"x")]
    if kind == "long-part":
        return [ok, member("c" * 300, data=b"x")]
    if kind == "state-root":
        # Unpacked into the state root's parent: `root` is the state root there.
        return [ok, member("root/planted.txt", data=b"x")]
    if kind == "file-over-folder":
        # The target already holds the folder `dir` (made by the test).
        return [ok, member("dir", data=b"x")]
    raise SystemExit(f"unknown hostile kind {kind}")


def write(members, out, mode="w", fmt=tarfile.PAX_FORMAT):
    with tarfile.open(out, mode, format=fmt) as t:
        for m, data in members:
            t.addfile(m, data)


def main():
    cmd = sys.argv[1]
    if cmd == "list":
        for e in list_archive(sys.argv[2]):
            print(json.dumps(e))
    elif cmd == "tree":
        for e in list_tree(sys.argv[2]):
            print(json.dumps(e))
    elif cmd == "pack":
        mode = "w:gz" if len(sys.argv) > 4 and sys.argv[4] == "gz" else "w"
        with tarfile.open(sys.argv[3], mode, format=tarfile.PAX_FORMAT) as t:
            t.add(sys.argv[2], arcname=".", recursive=True)
    elif cmd == "hostile":
        kind, out = sys.argv[2], sys.argv[3]
        fmt = tarfile.GNU_FORMAT if kind == "long-name-gnu" else tarfile.PAX_FORMAT
        write(hostile(kind if kind != "long-name-gnu" else "long-name"), out, fmt=fmt)
    elif cmd == "bomb":
        # BOMB OUT N SIZE: N files of SIZE zero bytes, gzipped (megabytes of zeros
        # compress to a thousandth of themselves).
        out, n, size = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

        class Zeros(io.RawIOBase):
            def __init__(self, n):
                self.left = n

            def readable(self):
                return True

            def readinto(self, b):
                k = min(len(b), self.left)
                b[:k] = bytes(k)
                self.left -= k
                return k

        with tarfile.open(out, "w:gz", compresslevel=1) as t:
            for i in range(n):
                m = tarfile.TarInfo(f"zeros-{i}.bin")
                m.size = size
                t.addfile(m, io.BufferedReader(Zeros(size)))
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
