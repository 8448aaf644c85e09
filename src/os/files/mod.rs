//! Files on behalf of API clients: path resolution that cannot be talked into the state
//! root ([`guard`]), file-system credentials per thread ([`creds`]), atomic uploads
//! ([`upload`]), and walks that no tree is too deep or too wide for ([`tree`]).

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, readlinkat};
use nix::sys::stat::{FileStat, Mode, fstat, fstatat};

pub mod archive;
mod creds;
mod guard;
mod sys;
mod tree;
mod upload;
pub mod watch;

pub use creds::as_user;
pub use guard::{FinalLink, Forbidden, Guard, Id, Intent, Place, is_forbidden, resolve};
pub use tree::{Smallest, page, remove};
pub use upload::{WriteError, WriteOpts, write_atomic};

use guard::{DIR_FLAGS, cstr, id_of};

/// The longest path accepted, in bytes.
pub const MAX_PATH: usize = 4096;

/// The prefix of an upload's temporary name, beside its target.
pub const TEMP_PREFIX: &str = ".gitterm-upload-";

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

/// False for a file whose size the kernel makes up (procfs, sysfs and their kind say 0
/// or 4096, whatever is in them): such a file is read to its end, not to its size.
pub fn size_is_known(f: &File) -> bool {
    const PSEUDO: [i64; 8] = [
        libc::PROC_SUPER_MAGIC,
        libc::SYSFS_MAGIC,
        libc::CGROUP_SUPER_MAGIC,
        libc::CGROUP2_SUPER_MAGIC,
        libc::DEBUGFS_MAGIC,
        libc::TRACEFS_MAGIC,
        libc::SECURITYFS_MAGIC,
        libc::BPF_FS_MAGIC,
    ];
    sys::fs_type(f.as_fd()).is_none_or(|t| !PSEUDO.contains(&t))
}

/// How a folder is opened to be read: a symlink in its place is refused, not followed.
const READ_DIR: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// The folder at place `p`, opened readable; a symlink there is refused, not followed.
pub(crate) fn open_folder(p: &Place) -> io::Result<OwnedFd> {
    Ok(openat(&p.dir, p.name.as_c_str(), READ_DIR, Mode::empty())?)
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
pub(crate) fn random_hex() -> String {
    let mut b = [0u8; 8];
    let _ = super::proc::random_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
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
    let how = if overwrite {
        sys::Rename::Replace
    } else {
        sys::Rename::NoReplace
    };
    sys::renameat2(from.dir.as_fd(), &from.name, to.dir.as_fd(), &to.name, how)?;
    sync_dir(to.dir.as_fd());
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
    fn temp_names_are_recognised() {
        assert!(is_temp_name(OsStr::new(".gitterm-upload-0123456789abcdef")));
        assert!(!is_temp_name(OsStr::new(".gitterm-upload-x")));
        assert!(!is_temp_name(OsStr::new("file")));
    }
}
