//! Path resolution that cannot be talked into the state root.
//!
//! Every path is resolved to a folder descriptor and one entry name in it, and every
//! check is made on those kernel objects (device and inode), never on the string: the
//! state root and everything under it is refused however it is spelled (`..`, symlinks,
//! `/proc/self/root`, a bind mount of it or of anything in it, a hard link to a file in
//! it, a symlink swapped in meanwhile), because the folder the operation then acts in is
//! the one that was checked, and its chain of `..` up to `/` must not pass through the
//! state root, nor through the root of a mount whose source lies inside it. The agent's
//! own process in `/proc` is refused too: the kernel lets any thread of a process look at
//! that process's descriptors and memory maps, whatever its credentials, so the files
//! thread would see there what its job user cannot.

use std::ffi::CString;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, AtFlags, OFlag, openat, readlinkat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat};

use super::sys;

/// Symlinks followed in one resolution, as the kernel's own limit.
const MAX_LINKS: usize = 40;

/// Folders between an object and `/` that a check follows; a deeper object is refused
/// (`ELOOP`). No path of at most [`super::MAX_PATH`] bytes reaches so deep without
/// symlinks.
const MAX_CHAIN: usize = 4096;

/// How deep the walk of the state root looking for a file goes; the agent's own layout
/// is a few levels deep, and anything deeper is taken to hold the file (a refusal).
const MAX_ROOT_DEPTH: usize = 32;

/// Identity of a file-system object.
pub type Id = (u64, u64);

/// The identity in a stat.
pub fn id_of(st: &FileStat) -> Id {
    (st.st_dev, st.st_ino)
}

/// A refusal to touch the state root.
#[derive(Debug)]
pub struct Forbidden(&'static str);

impl std::fmt::Display for Forbidden {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Forbidden {}

/// True if `e` is a [`Forbidden`] refusal.
pub fn is_forbidden(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<Forbidden>())
}

fn forbidden() -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        Forbidden("the path is inside the agent's state root, which is never served"),
    )
}

fn own_process() -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        Forbidden("the path is the agent's own process in /proc, which is never served"),
    )
}

/// A question for the agent's own thread: does the state root hold this object?
pub struct Ask {
    pub id: Id,
    pub reply: mpsc::Sender<bool>,
}

/// The state root and the folders above it, as kernel objects.
#[derive(Debug)]
pub struct Guard {
    root: Id,
    /// The root's ancestors up to `/`: these may be read, not moved or deleted.
    above: Vec<Id>,
    /// The roots of the mounts whose source lies inside the state root (a bind mount of
    /// `jobs/` or of `agent.token` elsewhere), as the mount table was when the guard was
    /// made.
    bound: Vec<Id>,
    path: PathBuf,
    /// This process, whose `/proc` entries are refused.
    me: i32,
    /// Where questions go that the agent answers with its own credentials; `None`:
    /// answered on the calling thread.
    ask: Option<mpsc::Sender<Ask>>,
}

impl Guard {
    /// Looks at the state root (as the agent, before any credentials change).
    pub fn new(root: &Path, ask: Option<mpsc::Sender<Ask>>) -> io::Result<Guard> {
        let fd = openat(
            AT_FDCWD,
            root,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let bound = bound_mounts(fd.as_fd(), root);
        let mut chain = chain(fd)?;
        let root_id = chain.remove(0);
        Ok(Guard {
            root: root_id,
            above: chain,
            bound,
            path: root.to_path_buf(),
            me: std::process::id() as i32,
            ask,
        })
    }

    /// What answers [`Ask`]s: the state root opened for reading, with the credentials of
    /// the calling thread.
    pub fn answerer(&self) -> io::Result<Answerer> {
        let fd = openat(
            AT_FDCWD,
            &self.path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        if id_of(&fstat(&fd)?) != self.root {
            return Err(Errno::ESTALE.into());
        }
        Ok(Answerer { root: fd })
    }

    /// Whether the state root holds the object; an unanswered question is a yes.
    fn holds(&self, id: Id) -> bool {
        if id.0 != self.root.0 {
            return false;
        }
        match &self.ask {
            Some(tx) => {
                let (reply, answer) = mpsc::channel();
                tx.send(Ask { id, reply }).is_err() || answer.recv().unwrap_or(true)
            }
            None => self.answerer().map_or(true, |a| a.holds(id)),
        }
    }

    /// Refuses an entry that is the state root, the root of a mount of something in it, a
    /// second name of a file in it, one of the agent's own `/proc` folders, or (for
    /// [`Intent::MoveOrRemove`]) one of the root's ancestors.
    pub(super) fn check_entry(
        &self,
        dir: BorrowedFd<'_>,
        name: &CString,
        st: &FileStat,
        intent: Intent,
    ) -> io::Result<()> {
        let id = id_of(st);
        let changes = intent == Intent::MoveOrRemove;
        if id == self.root || self.bound.contains(&id) || (changes && self.above.contains(&id)) {
            return Err(forbidden());
        }
        let fmt = st.st_mode & libc::S_IFMT;
        // A hard link made elsewhere to a file under the root (by root: a job user may
        // not link files it does not own) is the same file under a second name.
        if fmt == libc::S_IFREG && st.st_nlink > 1 && self.holds(id) {
            return Err(forbidden());
        }
        if fmt == libc::S_IFDIR && sys::on_procfs(dir) {
            let fd = openat(
                dir,
                name.as_c_str(),
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )?;
            if self.is_own_process(fd.as_fd()) {
                return Err(own_process());
            }
        }
        Ok(())
    }

    /// Refuses a folder (and so every entry in it) inside the state root, and an entry
    /// that [`Guard::check_entry`] refuses.
    fn check(
        &self,
        dir: BorrowedFd<'_>,
        name: &CString,
        entry: Option<&FileStat>,
        intent: Intent,
    ) -> io::Result<()> {
        if let Some(st) = entry {
            self.check_entry(dir, name, st, intent)?;
        }
        self.check_up(dir)
    }

    /// Walks from `dir` up to `/`, refusing if a folder on the way is the state root, the
    /// root of a mount of something inside it (where `..` leaves the mount, so the state
    /// root itself is never passed), or one of the agent's own folders in `/proc`.
    fn check_up(&self, dir: BorrowedFd<'_>) -> io::Result<()> {
        let mut cur = dir.try_clone_to_owned()?;
        let mut st = fstat(&cur)?;
        for _ in 0..MAX_CHAIN {
            let id = id_of(&st);
            if id == self.root || self.bound.contains(&id) {
                return Err(forbidden());
            }
            if sys::on_procfs(cur.as_fd()) && self.is_own_process(cur.as_fd()) {
                return Err(own_process());
            }
            let up = openat(
                &cur,
                "..",
                OFlag::from_bits_truncate(DIR_FLAGS),
                Mode::empty(),
            )?;
            let ust = fstat(&up)?;
            if id_of(&ust) == id {
                return Ok(());
            }
            cur = up;
            st = ust;
        }
        Err(Errno::ELOOP.into())
    }

    /// True if the procfs folder is this process's (`/proc/N`, `/proc/N/task/M`, by
    /// whatever name: `self`, `thread-self`, a thread's id): its `status` names our
    /// thread group.
    fn is_own_process(&self, dir: BorrowedFd<'_>) -> bool {
        let Ok(fd) = openat(
            dir,
            "status",
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            return false;
        };
        let mut buf = [0u8; 2048];
        let n = std::fs::File::from(fd).read(&mut buf).unwrap_or(0);
        let me = self.me.to_string();
        buf[..n].split(|&b| b == b'\n').any(|l| {
            l.strip_prefix(b"Tgid:")
                .is_some_and(|v| v.trim_ascii() == me.as_bytes())
        })
    }

    /// True if the object is the state root or the root of a mount of something in it:
    /// what a watch never enters, nor reports anything inside of.
    pub fn hides(&self, st: &FileStat) -> bool {
        let id = id_of(st);
        id == self.root || self.bound.contains(&id)
    }

    /// The state root's own place: the identity of the folder that holds it and its name
    /// there, so that a watch of that folder leaves the entry out.
    pub fn root_entry(&self) -> Option<(Id, Vec<u8>)> {
        let name = self.path.file_name()?.as_bytes().to_vec();
        self.above.first().map(|&up| (up, name))
    }

    /// Refuses an object met during a walk below a checked folder (a folder, or a file
    /// about to be changed): only its identity can bring the walk into the state root,
    /// so only that is looked at.
    pub(super) fn check_walked(&self, st: &FileStat) -> io::Result<()> {
        let id = id_of(st);
        if id == self.root || self.bound.contains(&id) || self.above.contains(&id) {
            return Err(forbidden());
        }
        Ok(())
    }
}

/// Answers whether the state root holds a file, by walking it.
pub struct Answerer {
    root: OwnedFd,
}

impl Answerer {
    /// True if an entry under the state root is the object `id` (or the walk could not
    /// be finished).
    pub fn holds(&self, id: Id) -> bool {
        let Ok(top) = self.root.try_clone() else {
            return true;
        };
        // One open folder per level, each with a second descriptor to open its children
        // from while it is being read.
        let mut stack: Vec<(OwnedFd, nix::dir::OwningIter)> = Vec::new();
        let open = |fd: OwnedFd| -> Option<(OwnedFd, nix::dir::OwningIter)> {
            let at = fd.try_clone().ok()?;
            Some((at, nix::dir::Dir::from_fd(fd).ok()?.into_iter()))
        };
        let Some(first) = open(top) else { return true };
        stack.push(first);
        while let Some((at, it)) = stack.last_mut() {
            let Some(e) = it.next() else {
                stack.pop();
                continue;
            };
            let Ok(e) = e else { return true };
            let name = e.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let dir = match e.file_type() {
                Some(nix::dir::Type::Directory) => true,
                Some(_) => false,
                None => fstatat(&*at, name, AtFlags::AT_SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR),
            };
            if !dir {
                if e.ino() == id.1
                    && fstatat(&*at, name, AtFlags::AT_SYMLINK_NOFOLLOW)
                        .map_or(true, |st| id_of(&st) == id)
                {
                    return true;
                }
                continue;
            }
            let Ok(fd) = openat(
                &*at,
                name,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            ) else {
                // Gone meanwhile (a job folder pruned): nothing of it to find.
                continue;
            };
            if stack.len() >= MAX_ROOT_DEPTH {
                return true;
            }
            let Some(next) = open(fd) else { return true };
            stack.push(next);
        }
        false
    }
}

/// The objects from `fd` up to `/` through `..`.
fn chain(fd: OwnedFd) -> io::Result<Vec<Id>> {
    let mut out = Vec::new();
    let mut cur = fd;
    let mut st = fstat(&cur)?;
    for _ in 0..MAX_CHAIN {
        let id = id_of(&st);
        out.push(id);
        let up = openat(
            &cur,
            "..",
            OFlag::from_bits_truncate(DIR_FLAGS),
            Mode::empty(),
        )?;
        let ust = fstat(&up)?;
        if id_of(&ust) == id {
            return Ok(out);
        }
        cur = up;
        st = ust;
    }
    Err(Errno::ELOOP.into())
}

/// One line of `/proc/self/mountinfo`: the mount's id, its device, the path within its
/// file system that it shows, and where.
struct MountLine {
    id: u64,
    dev: Vec<u8>,
    source: Vec<u8>,
    at: Vec<u8>,
}

/// mountinfo's escapes (`\040` for a space, `\134` for a backslash...) undone.
fn unescape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let oct = s
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (s[i], oct) {
            (b'\\', Some(d)) => {
                out.push(d.iter().fold(0u32, |a, c| a * 8 + u32::from(c - b'0')) as u8);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

fn mount_lines(text: &[u8]) -> Vec<MountLine> {
    text.split(|&b| b == b'\n')
        .filter_map(|l| {
            let mut f = l.split(|&b| b == b' ');
            let id = std::str::from_utf8(f.next()?).ok()?.parse().ok()?;
            let _parent = f.next()?;
            let dev = f.next()?.to_vec();
            let source = unescape(f.next()?);
            let at = unescape(f.next()?);
            Some(MountLine {
                id,
                dev,
                source,
                at,
            })
        })
        .collect()
}

/// True if `inner` is `outer` or below it, as paths.
fn within(inner: &[u8], outer: &[u8]) -> bool {
    let outer = outer.strip_suffix(b"/").unwrap_or(outer);
    inner
        .strip_prefix(outer)
        .is_some_and(|r| r.is_empty() || r.starts_with(b"/"))
}

/// The roots of the mounts whose source lies inside the state root (`root_fd`, at
/// `root`): a bind mount of the root, of `jobs/` or of `agent.token` elsewhere shows the
/// same inodes under other names, and `..` from inside it never passes the state root.
/// Found in the mount table: the state root's place in its file system is its mount's
/// source joined with its path below the mount point, and any mount of the same device
/// whose source is at or below that place is one.
fn bound_mounts(root_fd: BorrowedFd<'_>, root: &Path) -> Vec<Id> {
    let (Ok(table), Ok(fdinfo)) = (
        std::fs::read("/proc/self/mountinfo"),
        std::fs::read(format!(
            "/proc/self/fdinfo/{}",
            std::os::fd::AsRawFd::as_raw_fd(&root_fd)
        )),
    ) else {
        return Vec::new();
    };
    let mnt_id = fdinfo.split(|&b| b == b'\n').find_map(|l| {
        let v = l.strip_prefix(b"mnt_id:")?;
        std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok()
    });
    let lines = mount_lines(&table);
    let (Some(own), Ok(canon)) = (
        lines.iter().find(|m| Some(m.id) == mnt_id),
        std::fs::canonicalize(root),
    ) else {
        return Vec::new();
    };
    let canon = canon.as_os_str().as_bytes();
    let below = canon.strip_prefix(own.at.as_slice()).unwrap_or(canon);
    let mut place = own
        .source
        .strip_suffix(b"/")
        .unwrap_or(&own.source)
        .to_vec();
    if !below.is_empty() && !below.starts_with(b"/") {
        place.push(b'/');
    }
    place.extend_from_slice(below);
    lines
        .iter()
        .filter(|m| m.dev == own.dev && m.id != own.id && within(&m.source, &place))
        .filter_map(|m| {
            let at = CString::new(m.at.clone()).ok()?;
            fstatat(AT_FDCWD, at.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW).ok()
        })
        .map(|st| id_of(&st))
        .collect()
}

/// A resolved path: the folder that holds the object, and its name there.
#[derive(Debug)]
pub struct Place {
    pub dir: OwnedFd,
    /// The entry's name (`.` for `/` itself).
    pub name: CString,
    /// The entry, not followed if a symlink; `None` if missing.
    pub st: Option<FileStat>,
}

/// A name as a C string; a NUL in it is bad input.
pub fn cstr(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

pub(super) const DIR_FLAGS: i32 = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;

/// Opens a folder by path (relative to `at`), following symlinks but never a magic link:
/// `openat2(RESOLVE_NO_MAGICLINKS)`, or a walk component by component where the kernel
/// lacks it.
fn open_dir(at: BorrowedFd<'_>, path: &[u8], links: &mut usize) -> io::Result<OwnedFd> {
    let p = cstr(if path.is_empty() { b"." } else { path })?;
    match sys::openat2(at, &p, DIR_FLAGS, libc::RESOLVE_NO_MAGICLINKS) {
        Ok(fd) => Ok(fd),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOSYS | libc::EPERM | libc::E2BIG)
            ) =>
        {
            walk_dir(at, path, links)
        }
        Err(e) => Err(e),
    }
}

/// The root folder, opened as every folder of a walk is.
fn open_root() -> io::Result<OwnedFd> {
    Ok(openat(
        AT_FDCWD,
        "/",
        OFlag::from_bits_truncate(DIR_FLAGS),
        Mode::empty(),
    )?)
}

/// [`open_dir`] without openat2: each component opened with `O_NOFOLLOW`, symlinks read
/// and spliced in by hand, those on procfs refused. Iterative: the components still to
/// go are a list (at most [`MAX_LINKS`] targets of at most `PATH_MAX` bytes each).
fn walk_dir(at: BorrowedFd<'_>, path: &[u8], links: &mut usize) -> io::Result<OwnedFd> {
    let mut cur = at.try_clone_to_owned()?;
    let mut todo: Vec<Vec<u8>> = Vec::new();
    let push = |todo: &mut Vec<Vec<u8>>, p: &[u8]| {
        for c in p.split(|&b| b == b'/').rev() {
            todo.push(c.to_vec());
        }
    };
    if path.starts_with(b"/") {
        cur = open_root()?;
    }
    push(&mut todo, path);
    while let Some(c) = todo.pop() {
        if c.is_empty() || c == b"." {
            continue;
        }
        let name = cstr(&c)?;
        let st = fstatat(&cur, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)?;
        if SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT) == SFlag::S_IFLNK {
            *links += 1;
            if *links > MAX_LINKS || sys::on_procfs(cur.as_fd()) {
                return Err(Errno::ELOOP.into());
            }
            let target = readlinkat(&cur, name.as_c_str())?;
            let t = target.as_bytes();
            if t.starts_with(b"/") {
                cur = open_root()?;
            }
            push(&mut todo, t);
            continue;
        }
        cur = openat(
            &cur,
            name.as_c_str(),
            OFlag::from_bits_truncate(DIR_FLAGS) | OFlag::O_NOFOLLOW,
            Mode::empty(),
        )?;
    }
    Ok(cur)
}

/// Splits off the last component; `None` for `/` (or a path of slashes).
pub(super) fn split_last(path: &[u8]) -> Option<(&[u8], &[u8])> {
    let trimmed = {
        let mut end = path.len();
        while end > 0 && path[end - 1] == b'/' {
            end -= 1;
        }
        &path[..end]
    };
    if trimmed.is_empty() {
        return None;
    }
    Some(match trimmed.iter().rposition(|&b| b == b'/') {
        Some(i) => (
            if i == 0 { &b"/"[..] } else { &trimmed[..i] },
            &trimmed[i + 1..],
        ),
        None => (&b""[..], trimmed),
    })
}

/// What [`resolve`] does with a final symlink (links on the way are always followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalLink {
    /// Resolve to what the link names: reading a file, listing or writing into a folder.
    Follow,
    /// Resolve to the link itself, as `lstat` does: stat, mkdir, move, delete.
    Keep,
}

/// What the caller does to the object [`resolve`] finds; the guard refuses more for a
/// move or a removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    /// Read, create or write it.
    Use,
    /// Move or remove it: the state root's ancestors are refused too, as moving one
    /// would move the root.
    MoveOrRemove,
}

/// Resolves an absolute path to the folder holding it and its name there, following a
/// final symlink as `link` says, and checks the result against the state root for what
/// `intent` will do to it.
pub fn resolve(guard: &Guard, path: &[u8], link: FinalLink, intent: Intent) -> io::Result<Place> {
    let mut links = 0;
    let mut at = open_root()?;
    let mut path = path.to_vec();
    loop {
        let Some((parent, last)) = split_last(&path) else {
            let dir = open_root()?;
            let st = fstat(&dir)?;
            let name = CString::from(c".");
            guard.check(dir.as_fd(), &name, Some(&st), intent)?;
            return Ok(Place {
                dir,
                name,
                st: Some(st),
            });
        };
        if last == b"." || last == b".." {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a path may not end in . or ..; name the object itself",
            ));
        }
        let dir = open_dir(at.as_fd(), parent, &mut links)?;
        let name = cstr(last)?;
        let st = match fstatat(&dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Some(st),
            Err(Errno::ENOENT) => None,
            Err(e) => return Err(e.into()),
        };
        let is_link = st
            .as_ref()
            .is_some_and(|s| s.st_mode & libc::S_IFMT == libc::S_IFLNK);
        if link == FinalLink::Follow && is_link {
            links += 1;
            if links > MAX_LINKS || sys::on_procfs(dir.as_fd()) {
                return Err(Errno::ELOOP.into());
            }
            path = readlinkat(&dir, name.as_c_str())?.as_bytes().to_vec();
            at = dir;
            continue;
        }
        guard.check(dir.as_fd(), &name, st.as_ref(), intent)?;
        return Ok(Place { dir, name, st });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_folder_and_name() {
        assert_eq!(split_last(b"/"), None);
        assert_eq!(split_last(b"//"), None);
        assert_eq!(split_last(b"/a"), Some((&b"/"[..], &b"a"[..])));
        assert_eq!(split_last(b"/a/b/"), Some((&b"/a"[..], &b"b"[..])));
        assert_eq!(split_last(b"a"), Some((&b""[..], &b"a"[..])));
    }

    #[test]
    fn mount_table_lines_are_read_with_their_escapes() {
        let t = b"36 35 98:0 /mnt\\0401 /x\\134y rw - ext3 /dev/root rw\n\n";
        let l = mount_lines(t);
        assert_eq!(l.len(), 1);
        assert_eq!((l[0].id, l[0].dev.as_slice()), (36, &b"98:0"[..]));
        assert_eq!(l[0].source, b"/mnt 1");
        assert_eq!(l[0].at, b"/x\\y");
        assert!(within(b"/a/b", b"/a") && within(b"/a", b"/a/") && within(b"/a", b"/"));
        assert!(!within(b"/ab", b"/a") && !within(b"/", b"/a"));
    }

    #[test]
    fn the_state_root_is_refused_by_every_spelling() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("state");
        std::fs::create_dir_all(root.join("jobs")).unwrap();
        std::fs::write(root.join("agent.token"), "t").unwrap();
        std::os::unix::fs::symlink(root.join("agent.token"), d.path().join("link")).unwrap();
        std::os::unix::fs::symlink(&root, d.path().join("dirlink")).unwrap();
        std::fs::hard_link(root.join("agent.token"), d.path().join("hard")).unwrap();
        std::fs::write(d.path().join("mine"), "m").unwrap();
        std::fs::hard_link(d.path().join("mine"), d.path().join("mine2")).unwrap();
        let g = Guard::new(&root, None).unwrap();
        let b = |p: &Path| p.as_os_str().as_bytes().to_vec();
        let refused = |p: Vec<u8>, link: FinalLink| {
            let r = resolve(&g, &p, link, Intent::Use);
            assert!(
                r.as_ref().is_err_and(is_forbidden),
                "{:?}: {r:?}",
                String::from_utf8_lossy(&p)
            );
        };
        refused(b(&root), FinalLink::Keep);
        refused(b(&root.join("agent.token")), FinalLink::Keep);
        refused(b(&d.path().join("link")), FinalLink::Follow);
        refused(b(&d.path().join("dirlink/agent.token")), FinalLink::Keep);
        refused(b(&root.join("jobs/../agent.token")), FinalLink::Keep);
        refused(b(&d.path().join("hard")), FinalLink::Keep);
        let via_proc = format!("/proc/self/root{}", root.join("agent.token").display());
        let r = resolve(&g, via_proc.as_bytes(), FinalLink::Follow, Intent::Use);
        assert!(r.is_err(), "{r:?}");
        // A hard link between two files outside is nobody's business.
        assert!(
            resolve(
                &g,
                &b(&d.path().join("mine2")),
                FinalLink::Keep,
                Intent::Use
            )
            .is_ok()
        );
        // The link itself may be looked at; its folder is not the state root.
        assert!(resolve(&g, &b(&d.path().join("link")), FinalLink::Keep, Intent::Use).is_ok());
        // The root's parent may be read, never removed.
        assert!(resolve(&g, &b(d.path()), FinalLink::Keep, Intent::Use).is_ok());
        assert!(
            resolve(&g, &b(d.path()), FinalLink::Keep, Intent::MoveOrRemove)
                .is_err_and(|e| is_forbidden(&e))
        );
    }

    #[test]
    fn this_process_in_proc_is_refused_by_every_name() {
        let d = tempfile::tempdir().unwrap();
        let g = Guard::new(d.path(), None).unwrap();
        let me = std::process::id();
        let tid = nix::unistd::gettid();
        for p in [
            format!("/proc/{me}/fd"),
            format!("/proc/{me}/map_files"),
            format!("/proc/{me}/environ"),
            format!("/proc/{me}"),
            format!("/proc/{tid}/fd"),
            format!("/proc/{me}/task/{tid}/fd"),
            "/proc/self/fd".into(),
            "/proc/thread-self/environ".into(),
        ] {
            let r = resolve(&g, p.as_bytes(), FinalLink::Follow, Intent::Use);
            assert!(r.as_ref().is_err_and(is_forbidden), "{p}: {r:?}");
        }
        // A final symlink on procfs is never followed (it may be magic): refused too.
        assert!(resolve(&g, b"/proc/self", FinalLink::Follow, Intent::Use).is_err());
        // Other processes' folders are the kernel's call, and /proc itself may be read.
        assert!(resolve(&g, b"/proc/1/status", FinalLink::Follow, Intent::Use).is_ok());
        assert!(resolve(&g, b"/proc/cpuinfo", FinalLink::Follow, Intent::Use).is_ok());
        assert!(resolve(&g, b"/proc", FinalLink::Follow, Intent::Use).is_ok());
    }
}
