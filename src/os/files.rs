//! Files on behalf of API clients: path resolution that cannot be talked into the state
//! root, file-system credentials per thread, and atomic writes.
//!
//! Every path is resolved to a folder descriptor and one entry name in it, and every
//! check is made on those kernel objects (device and inode), never on the string: the
//! state root and everything under it is refused however it is spelled (`..`, symlinks,
//! `/proc/self/root`, a bind mount of it, a symlink swapped in meanwhile), because the
//! folder the operation then acts in is the one that was checked, and its chain of `..`
//! up to `/` must not pass through the state root.

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, AtFlags, OFlag, openat, readlinkat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat};

/// The longest path accepted, in bytes.
pub const MAX_PATH: usize = 4096;

/// The prefix of an upload's temporary name, beside its target.
pub const TEMP_PREFIX: &str = ".gitterm-upload-";

/// Symlinks followed in one resolution, as the kernel's own limit.
const MAX_LINKS: usize = 40;

/// The raw system calls that neither std nor nix offers in every build (musl included).
mod sys {
    use super::*;

    /// `openat2(2)`; `Err(ENOSYS)` (or `EPERM` under some seccomp filters) where the kernel
    /// lacks it.
    pub fn openat2(
        dir: BorrowedFd<'_>,
        path: &CStr,
        flags: i32,
        resolve: u64,
    ) -> io::Result<OwnedFd> {
        // SAFETY: open_how is plain integers, for which all zeroes is valid.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = flags as u64;
        how.resolve = resolve;
        // SAFETY: `path` is NUL-terminated and `how` a valid open_how of the size passed;
        // the kernel only reads both for the length of the call.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                path.as_ptr(),
                &mut how as *mut libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a non-negative return of openat2 is a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }

    /// `renameat2(2)` with `RENAME_NOREPLACE` when `noreplace`.
    pub fn renameat2(
        od: BorrowedFd<'_>,
        old: &CStr,
        nd: BorrowedFd<'_>,
        new: &CStr,
        noreplace: bool,
    ) -> io::Result<()> {
        let flags = if noreplace { libc::RENAME_NOREPLACE } else { 0 };
        // SAFETY: both names are NUL-terminated and live for the call; the descriptors
        // are borrowed, so open.
        let r = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                od.as_raw_fd(),
                old.as_ptr(),
                nd.as_raw_fd(),
                new.as_ptr(),
                flags,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Gives the calling thread, and it alone, these file-system credentials: the raw
    /// system calls change one thread's credentials, where the libc wrappers of
    /// `setgroups` broadcast the change to every thread of the process.
    pub fn thread_fs_creds(uid: u32, gid: u32, groups: &[u32]) -> io::Result<()> {
        let groups: Vec<libc::gid_t> = groups.to_vec();
        // SAFETY: the pointer and length describe `groups`, which outlives the call.
        let r = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: setfsgid/setfsuid take a plain id and cannot fail in a way that harms
        // memory; they return the previous id, so success is checked by asking again.
        let ok = unsafe {
            libc::syscall(libc::SYS_setfsgid, gid);
            libc::syscall(libc::SYS_setfsuid, uid);
            libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32 == gid
                && libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32 == uid
        };
        if !ok {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        Ok(())
    }

    /// True if the folder is on procfs (whose symlinks are magic: they jump anywhere).
    pub fn on_procfs(fd: BorrowedFd<'_>) -> bool {
        nix::sys::statfs::fstatfs(fd)
            .map(|s| s.filesystem_type() == nix::sys::statfs::PROC_SUPER_MAGIC)
            .unwrap_or(false)
    }
}

/// Runs `f` on a thread of its own that has the job user's file-system credentials (its
/// files are created owned by that user, and the kernel decides every permission), or
/// the agent's own when `user` is `None`.
///
/// Why a thread per call: `setfsuid`/`setfsgid` and the raw `setgroups` system call change
/// only the calling thread, so no other request ever runs with these credentials, and the
/// thread exits after the call, so none is ever reused with them. A helper process per
/// request would be as safe, but forking a large multi-threaded server costs more and
/// the child may not allocate. Moving from fsuid 0 to another drops the file capabilities
/// (CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_CHOWN...) from that thread.
pub fn as_user<R: Send>(
    user: Option<(u32, u32, &[u32])>,
    f: impl FnOnce() -> io::Result<R> + Send,
) -> io::Result<R> {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("files".into())
            .stack_size(256 << 10)
            .spawn_scoped(s, move || {
                if let Some((uid, gid, groups)) = user {
                    sys::thread_fs_creds(uid, gid, groups)?;
                }
                f()
            })?
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Identity of a file-system object.
pub type Id = (u64, u64);

fn id_of(st: &FileStat) -> Id {
    (st.st_dev, st.st_ino)
}

/// A refusal to touch the state root.
#[derive(Debug)]
pub struct Forbidden;

impl std::fmt::Display for Forbidden {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the path is inside the agent's state root, which is never served")
    }
}

impl std::error::Error for Forbidden {}

/// True if `e` is a [`Forbidden`] refusal.
pub fn is_forbidden(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<Forbidden>())
}

fn forbidden() -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, Forbidden)
}

/// The state root and the folders above it, as kernel objects.
#[derive(Debug, Clone)]
pub struct Guard {
    root: Id,
    /// The root's ancestors up to `/`: these may be read, not moved or deleted.
    above: Vec<Id>,
}

impl Guard {
    /// Looks at the state root (as the agent, before any credentials change).
    pub fn new(root: &Path) -> io::Result<Guard> {
        let fd = openat(
            AT_FDCWD,
            root,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let mut chain = chain(fd, None)?;
        let root = chain.remove(0);
        Ok(Guard { root, above: chain })
    }

    /// Refuses a folder (and so every entry in it) inside the state root, and an entry
    /// that is the state root (or, for a change, one of its ancestors).
    fn check(
        &self,
        dir: BorrowedFd<'_>,
        entry: Option<&FileStat>,
        changes: bool,
    ) -> io::Result<()> {
        if let Some(st) = entry {
            let id = id_of(st);
            if id == self.root || (changes && self.above.contains(&id)) {
                return Err(forbidden());
            }
        }
        chain(dir.try_clone_to_owned()?, Some(self.root)).map(|_| ())
    }
}

/// The objects from `fd` up to `/` through `..`; `Err(Forbidden)` if `stop` is among them.
fn chain(fd: OwnedFd, stop: Option<Id>) -> io::Result<Vec<Id>> {
    let mut out = Vec::new();
    let mut cur = fd;
    let mut st = fstat(&cur)?;
    for _ in 0..4096 {
        let id = id_of(&st);
        if Some(id) == stop {
            return Err(forbidden());
        }
        out.push(id);
        let up = openat(
            &cur,
            "..",
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
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

/// A resolved path: the folder that holds the object, and its name there.
#[derive(Debug)]
pub struct Place {
    pub dir: OwnedFd,
    /// The entry's name (`.` for `/` itself).
    pub name: CString,
    /// The entry, not followed if a symlink; `None` if missing.
    pub st: Option<FileStat>,
}

fn cstr(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

const DIR_FLAGS: i32 = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;

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

/// [`open_dir`] without openat2: each component opened with `O_NOFOLLOW`, symlinks read
/// and spliced in by hand, those on procfs refused.
/// The root folder, opened as every folder of a walk is.
fn open_root() -> io::Result<OwnedFd> {
    Ok(openat(
        AT_FDCWD,
        "/",
        OFlag::from_bits_truncate(DIR_FLAGS),
        Mode::empty(),
    )?)
}

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
fn split_last(path: &[u8]) -> Option<(&[u8], &[u8])> {
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

/// Resolves an absolute path to the folder holding it and its name there, following a
/// final symlink if `follow`, and checks the result against the state root (`changes`:
/// the operation moves or removes the object).
pub fn resolve(guard: &Guard, path: &[u8], follow: bool, changes: bool) -> io::Result<Place> {
    let mut links = 0;
    let mut at = open_root()?;
    let mut path = path.to_vec();
    loop {
        let Some((parent, last)) = split_last(&path) else {
            let dir = open_root()?;
            let st = fstat(&dir)?;
            guard.check(dir.as_fd(), Some(&st), changes)?;
            return Ok(Place {
                dir,
                name: c".".into(),
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
        if follow && is_link {
            links += 1;
            if links > MAX_LINKS || sys::on_procfs(dir.as_fd()) {
                return Err(Errno::ELOOP.into());
            }
            path = readlinkat(&dir, name.as_c_str())?.as_bytes().to_vec();
            at = dir;
            continue;
        }
        guard.check(dir.as_fd(), st.as_ref(), changes)?;
        return Ok(Place { dir, name, st });
    }
}

/// The kind of an entry, as the contract names it.
pub fn kind(st: &FileStat) -> &'static str {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => "file",
        libc::S_IFDIR => "dir",
        libc::S_IFLNK => "symlink",
        _ => "other",
    }
}

pub fn is_dir(st: &FileStat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// A strong validator: device, inode, size and modification time in nanoseconds.
pub fn etag(st: &FileStat) -> String {
    format!(
        "\"{:x}-{:x}-{:x}-{:x}\"",
        st.st_dev,
        st.st_ino,
        st.st_size,
        (st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128) as u128
    )
}

/// The target of a symlink entry.
pub fn link_target(p: &Place) -> Option<Vec<u8>> {
    readlinkat(&p.dir, p.name.as_c_str())
        .ok()
        .map(|t| t.as_bytes().to_vec())
}

/// Opens a place's regular file for reading; it must still be the object resolved.
pub fn open_read(p: &Place) -> io::Result<(File, FileStat)> {
    let fd = openat(
        &p.dir,
        p.name.as_c_str(),
        OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_CLOEXEC
            | OFlag::O_NOCTTY
            | OFlag::O_NONBLOCK,
        Mode::empty(),
    )?;
    let st = fstat(&fd)?;
    if p.st.as_ref().map(id_of) != Some(id_of(&st)) {
        return Err(Errno::ESTALE.into());
    }
    Ok((File::from(fd), st))
}

/// The folder at place `p`, opened readable; a symlink there is refused, not followed.
fn open_folder(p: &Place) -> io::Result<OwnedFd> {
    Ok(openat(
        &p.dir,
        p.name.as_c_str(),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?)
}

/// The names in a folder place, sorted bytewise.
pub fn names(p: &Place) -> io::Result<Vec<Vec<u8>>> {
    let fd = open_folder(p)?;
    let mut dir = nix::dir::Dir::from_fd(fd)?;
    let mut out = Vec::new();
    for e in dir.iter() {
        let n = e?.file_name().to_bytes().to_vec();
        if n != b"." && n != b".." {
            out.push(n);
        }
    }
    out.sort();
    Ok(out)
}

/// lstat of `name` in the folder place `p`.
pub fn stat_in(p: &Place, name: &[u8]) -> io::Result<(Place, FileStat)> {
    let dir = openat(
        &p.dir,
        p.name.as_c_str(),
        OFlag::from_bits_truncate(DIR_FLAGS) | OFlag::O_NOFOLLOW,
        Mode::empty(),
    )?;
    let name = cstr(name)?;
    let st = fstatat(&dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)?;
    Ok((
        Place {
            dir,
            name,
            st: Some(st),
        },
        st,
    ))
}

/// A fresh random hex string.
fn random_hex() -> String {
    let mut b = [0u8; 8];
    let _ = super::proc::random_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// How an upload replaces its target.
pub struct WriteOpts<'a> {
    pub mode: Option<u32>,
    pub overwrite: bool,
    /// The ETag the target must still have.
    pub if_match: Option<&'a str>,
    /// Most bytes the body may have.
    pub max_bytes: u64,
}

/// Why an upload failed.
#[derive(Debug)]
pub enum WriteError {
    /// Reading the body failed (the client's side: disconnect, timeout, malformed, too big).
    Body(io::Error),
    /// Over `max_bytes`.
    TooLarge,
    /// `overwrite=false` on an existing target, or a stale `If-Match`.
    Conflict(&'static str),
    /// The target is a folder or not a regular file.
    NotAFile,
    Io(io::Error),
}

impl From<Errno> for WriteError {
    fn from(e: Errno) -> WriteError {
        WriteError::Io(e.into())
    }
}

impl From<io::Error> for WriteError {
    fn from(e: io::Error) -> WriteError {
        WriteError::Io(e)
    }
}

/// Removes a temporary file unless disarmed.
struct Temp<'a> {
    dir: BorrowedFd<'a>,
    name: Option<CString>,
}

impl Drop for Temp<'_> {
    fn drop(&mut self) {
        if let Some(n) = self.name.take() {
            let _ = nix::unistd::unlinkat(
                self.dir,
                n.as_c_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        }
    }
}

/// Writes `body` to the place atomically: into a new file beside it, synced, given its
/// mode, then renamed over the target, and the folder synced. On any failure the
/// temporary file is removed and the target is as it was. Readers see the old content or
/// the new, never a part. The new file is unnamed while it fills (`O_TMPFILE`) where the
/// file system allows, so even a crash leaves nothing behind; elsewhere it is named
/// [`TEMP_PREFIX`]`<random>` (see [`sweep`]).
pub fn write_atomic(
    p: &Place,
    body: &mut dyn Read,
    o: &WriteOpts<'_>,
) -> Result<FileStat, WriteError> {
    let old = match &p.st {
        Some(st) if st.st_mode & libc::S_IFMT != libc::S_IFREG => return Err(WriteError::NotAFile),
        Some(_) if !o.overwrite => {
            return Err(WriteError::Conflict("the file exists and overwrite=false"));
        }
        st => st,
    };
    let still = |o: &WriteOpts<'_>| -> Result<(), WriteError> {
        let Some(want) = o.if_match else {
            return Ok(());
        };
        let now = fstatat(&p.dir, p.name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW).ok();
        match now {
            Some(st) if want == "*" || etag(&st) == want => Ok(()),
            _ => Err(WriteError::Conflict(
                "If-Match does not match the file's current ETag",
            )),
        }
    };
    still(o)?;
    let mode = o
        .mode
        .unwrap_or_else(|| old.as_ref().map_or(0o644, |s| s.st_mode & 0o7777));
    let tmpname = cstr(format!("{TEMP_PREFIX}{}", random_hex()).as_bytes())?;
    // An unnamed file first; a named one where the file system has no O_TMPFILE.
    let (fd, mut temp) = match openat(
        &p.dir,
        ".",
        OFlag::O_TMPFILE | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    ) {
        Ok(fd) => (
            fd,
            Temp {
                dir: p.dir.as_fd(),
                name: None,
            },
        ),
        Err(Errno::EOPNOTSUPP | Errno::EISDIR | Errno::EINVAL | Errno::ENOENT) => {
            let fd = openat(
                &p.dir,
                tmpname.as_c_str(),
                OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_WRONLY
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o600),
            )?;
            (
                fd,
                Temp {
                    dir: p.dir.as_fd(),
                    name: Some(tmpname.clone()),
                },
            )
        }
        Err(e) => return Err(WriteError::Io(e.into())),
    };
    let mut file = File::from(fd);
    let mut buf = vec![0u8; 256 << 10];
    let mut total: u64 = 0;
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(WriteError::Body(e)),
        };
        total += n as u64;
        if total > o.max_bytes {
            return Err(WriteError::TooLarge);
        }
        file.write_all(&buf[..n])?;
    }
    nix::sys::stat::fchmod(&file, Mode::from_bits_truncate(mode))?;
    file.sync_all()?;
    still(o)?;
    if temp.name.is_none() {
        // Give the unnamed file a temporary name (linkat cannot replace a file).
        let from = cstr(format!("/proc/self/fd/{}", file.as_raw_fd()).as_bytes())?;
        nix::unistd::linkat(
            AT_FDCWD,
            from.as_c_str(),
            &p.dir,
            tmpname.as_c_str(),
            AtFlags::AT_SYMLINK_FOLLOW,
        )?;
        temp.name = Some(tmpname.clone());
    }
    match sys::renameat2(
        p.dir.as_fd(),
        &tmpname,
        p.dir.as_fd(),
        &p.name,
        !o.overwrite,
    ) {
        Ok(()) => temp.name = None,
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            return Err(WriteError::Conflict("the file exists and overwrite=false"));
        }
        Err(e) => return Err(e.into()),
    }
    sync_dir(p.dir.as_fd());
    Ok(fstat(&file)?)
}

/// fsyncs a folder (opened for reading: an O_PATH descriptor cannot be synced); a folder
/// the user may not read is left to the file system's own ordering.
fn sync_dir(dir: BorrowedFd<'_>) {
    if let Ok(fd) = openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        let _ = nix::unistd::fsync(&fd);
    }
}

/// Creates the folder at `p` with `mode` exactly (not masked by the umask).
pub fn mkdir(p: &Place, mode: u32) -> io::Result<()> {
    nix::sys::stat::mkdirat(&p.dir, p.name.as_c_str(), Mode::from_bits_truncate(mode))?;
    let fd = open_folder(p)?;
    nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(mode))?;
    sync_dir(p.dir.as_fd());
    Ok(())
}

/// Renames `from` to `to`, refusing to replace unless `overwrite`.
pub fn rename(from: &Place, to: &Place, overwrite: bool) -> io::Result<()> {
    sys::renameat2(
        from.dir.as_fd(),
        &from.name,
        to.dir.as_fd(),
        &to.name,
        !overwrite,
    )?;
    sync_dir(to.dir.as_fd());
    Ok(())
}

/// Removes the entry at `p`; a folder's content too if `recursive` (never crossing into
/// the state root).
pub fn remove(guard: &Guard, p: &Place, recursive: bool) -> io::Result<()> {
    use nix::unistd::{UnlinkatFlags, unlinkat};
    let Some(st) = &p.st else {
        return Err(Errno::ENOENT.into());
    };
    if !is_dir(st) {
        unlinkat(&p.dir, p.name.as_c_str(), UnlinkatFlags::NoRemoveDir)?;
        return Ok(());
    }
    if recursive {
        for n in names(p)? {
            let (child, _) = stat_in(p, &n)?;
            guard.check(child.dir.as_fd(), child.st.as_ref(), true)?;
            remove(guard, &child, true)?;
        }
    }
    unlinkat(&p.dir, p.name.as_c_str(), UnlinkatFlags::RemoveDir)?;
    Ok(())
}

/// Whether `name` is one of our temporary upload names.
pub fn is_temp_name(name: &OsStr) -> bool {
    name.as_bytes()
        .strip_prefix(TEMP_PREFIX.as_bytes())
        .is_some_and(|r| r.len() == 16 && r.iter().all(u8::is_ascii_hexdigit))
}

/// Removes our temporary upload files older than `age` in `dir` (not recursive): what a
/// crash between naming and renaming one can leave. Returns how many.
pub fn sweep(dir: &Path, age: std::time::Duration) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut n = 0;
    for e in rd.flatten() {
        if !is_temp_name(&e.file_name()) {
            continue;
        }
        let Ok(m) = e.path().symlink_metadata() else {
            continue;
        };
        let old = m
            .modified()
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|a| a >= age);
        if m.is_file() && old && std::fs::remove_file(e.path()).is_ok() {
            n += 1;
        }
    }
    n
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
    fn the_state_root_is_refused_by_every_spelling() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("state");
        std::fs::create_dir_all(root.join("jobs")).unwrap();
        std::fs::write(root.join("agent.token"), "t").unwrap();
        std::os::unix::fs::symlink(root.join("agent.token"), d.path().join("link")).unwrap();
        std::os::unix::fs::symlink(&root, d.path().join("dirlink")).unwrap();
        let g = Guard::new(&root).unwrap();
        let b = |p: &Path| p.as_os_str().as_bytes().to_vec();
        let refused = |p: Vec<u8>, follow: bool| {
            let r = resolve(&g, &p, follow, false);
            assert!(
                r.as_ref().is_err_and(is_forbidden),
                "{:?}: {r:?}",
                String::from_utf8_lossy(&p)
            );
        };
        refused(b(&root), false);
        refused(b(&root.join("agent.token")), false);
        refused(b(&d.path().join("link")), true);
        refused(b(&d.path().join("dirlink/agent.token")), false);
        refused(b(&root.join("jobs/../agent.token")), false);
        let via_proc = format!("/proc/self/root{}", root.join("agent.token").display());
        let r = resolve(&g, via_proc.as_bytes(), true, false);
        assert!(r.is_err(), "{r:?}");
        // The link itself may be looked at; its folder is not the state root.
        assert!(resolve(&g, &b(&d.path().join("link")), false, false).is_ok());
        // The root's parent may be read, never removed.
        assert!(resolve(&g, &b(d.path()), false, false).is_ok());
        assert!(resolve(&g, &b(d.path()), false, true).is_err_and(|e| is_forbidden(&e)));
    }

    #[test]
    fn temp_names_are_recognised() {
        assert!(is_temp_name(OsStr::new(".gitterm-upload-0123456789abcdef")));
        assert!(!is_temp_name(OsStr::new(".gitterm-upload-x")));
        assert!(!is_temp_name(OsStr::new("file")));
    }
}
