//! Atomic uploads: a new file filled beside its target and renamed over it, with
//! `If-Match` checked against the file actually replaced.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::{Condvar, Mutex};

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, AtFlags, OFlag, openat};
use nix::sys::stat::{FileStat, Mode, fstat, fstatat};

use super::guard::{Id, Place, cstr, id_of};
use super::sys::{self, Rename};
use super::{TEMP_PREFIX, etag, sync_dir};

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

const STALE: WriteError = WriteError::Conflict("If-Match does not match the file's current ETag");

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

/// The targets whose uploads are being committed in this process, by folder and name.
static COMMITTING: Mutex<Vec<(Id, CString)>> = Mutex::new(Vec::new());
static COMMITTED: Condvar = Condvar::new();

/// The right to commit an upload to one target: uploads of the same file (however its
/// path is spelled: the key is the folder's identity and the name) check and replace it
/// one after another.
struct Commit((Id, CString));

impl Commit {
    fn take(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Commit> {
        let key = (id_of(&fstat(dir)?), name.to_owned());
        let mut held = COMMITTING.lock().unwrap_or_else(|e| e.into_inner());
        while held.contains(&key) {
            held = COMMITTED.wait(held).unwrap_or_else(|e| e.into_inner());
        }
        held.push(key.clone());
        Ok(Commit(key))
    }
}

impl Drop for Commit {
    fn drop(&mut self) {
        let mut held = COMMITTING.lock().unwrap_or_else(|e| e.into_inner());
        held.retain(|k| *k != self.0);
        COMMITTED.notify_all();
    }
}

/// True if `st` (the target, or what was replaced) is what `If-Match` asks for.
fn matches(want: &str, st: Option<&FileStat>) -> bool {
    st.is_some_and(|st| {
        st.st_mode & libc::S_IFMT == libc::S_IFREG && (want == "*" || etag(st) == want)
    })
}

/// Writes `body` to the place atomically: into a new file beside it, synced, given its
/// mode, then renamed over the target, and the folder synced. On any failure the
/// temporary file is removed and the target is as it was. Readers see the old content or
/// the new, never a part. The new file is unnamed while it fills (`O_TMPFILE`) where the
/// file system allows, so even a crash leaves nothing behind; elsewhere it is named
/// [`TEMP_PREFIX`]`<random>` (see [`super::sweep`]).
///
/// `If-Match` holds exactly among uploads through this process: the last check and the
/// replacement are made under the target's [`Commit`], so of uploads racing with one
/// ETag one replaces the file and the others find a new ETag (409). Against a program
/// that replaces or rewrites the file by itself, the target is swapped with the new file
/// (`RENAME_EXCHANGE`) and the file so taken out is the one compared: if it is not the
/// one the ETag names, the swap is undone and the upload is refused. What no file system
/// offers is a compare-and-swap of a file's content: a write into the old file through a
/// descriptor opened before (and not yet ended when) the swap is a write to a file no
/// longer named there, as with every rename-based replacement.
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
    let now = || fstatat(&p.dir, p.name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW).ok();
    let still = || match o.if_match {
        Some(want) if !matches(want, now().as_ref()) => Err(STALE),
        _ => Ok(()),
    };
    still()?;
    let mode = o
        .mode
        .unwrap_or_else(|| old.as_ref().map_or(0o644, |s| s.st_mode & 0o7777));
    let tmpname = cstr(format!("{TEMP_PREFIX}{}", super::random_hex()).as_bytes())?;
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
    let _commit = Commit::take(p.dir.as_fd(), &p.name)?;
    still()?;
    let dir = p.dir.as_fd();
    if let Some(want) = o.if_match {
        match sys::renameat2(dir, &tmpname, dir, &p.name, Rename::Exchange) {
            Ok(()) => {
                // The temporary name now holds the file taken out: the guard removes it,
                // or, if it is not the one the ETag names, it goes back.
                let out = fstatat(dir, tmpname.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW).ok();
                if !matches(want, out.as_ref()) {
                    sys::renameat2(dir, &tmpname, dir, &p.name, Rename::Exchange)?;
                    return Err(STALE);
                }
                // The old file's name goes before the folder is synced, with the rest.
                drop(temp);
                sync_dir(dir);
                return Ok(fstat(&file)?);
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Err(STALE),
            // A file system without the swap: the check just made, under the commit, is
            // the last word.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let how = if o.overwrite {
        Rename::Replace
    } else {
        Rename::NoReplace
    };
    match sys::renameat2(dir, &tmpname, dir, &p.name, how) {
        Ok(()) => temp.name = None,
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            return Err(WriteError::Conflict("the file exists and overwrite=false"));
        }
        Err(e) => return Err(e.into()),
    }
    sync_dir(dir);
    Ok(fstat(&file)?)
}
