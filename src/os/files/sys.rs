//! The raw system calls that neither std nor nix offers in every build (musl included).

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `openat2(2)`; `Err(ENOSYS)` (or `EPERM` under some seccomp filters) where the kernel
/// lacks it.
pub fn openat2(dir: BorrowedFd<'_>, path: &CStr, flags: i32, resolve: u64) -> io::Result<OwnedFd> {
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

/// How [`renameat2`] treats an existing target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rename {
    /// Replace it.
    Replace,
    /// Fail with `EEXIST` (`RENAME_NOREPLACE`).
    NoReplace,
    /// Swap the two names, both of which must exist (`RENAME_EXCHANGE`).
    Exchange,
}

/// `renameat2(2)`.
pub fn renameat2(
    od: BorrowedFd<'_>,
    old: &CStr,
    nd: BorrowedFd<'_>,
    new: &CStr,
    how: Rename,
) -> io::Result<()> {
    let flags = match how {
        Rename::Replace => 0,
        Rename::NoReplace => libc::RENAME_NOREPLACE,
        Rename::Exchange => libc::RENAME_EXCHANGE,
    };
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

/// The file-system type of the object behind `fd` (`statfs.f_type`), if it can be told.
// f_type is signed in glibc and unsigned in musl: the cast is needed in one of them.
#[allow(clippy::unnecessary_cast)]
pub fn fs_type(fd: BorrowedFd<'_>) -> Option<i64> {
    nix::sys::statfs::fstatfs(fd)
        .ok()
        .map(|s| s.filesystem_type().0 as i64)
}

/// True if the folder is on procfs (whose symlinks are magic: they jump anywhere).
pub fn on_procfs(fd: BorrowedFd<'_>) -> bool {
    fs_type(fd) == Some(libc::PROC_SUPER_MAGIC)
}
