//! What runs between fork and exec, and the process-level steps around it: each a small
//! function so that the callers above this layer need no `unsafe`.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, FromRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};

/// Makes `cmd` start the supervisor: `lock_fd` becomes `target_fd` (inherited across exec)
/// and the child gets its own session, so a terminal's Ctrl-C or hangup never reaches it.
pub fn as_supervisor(cmd: &mut Command, lock_fd: RawFd, target_fd: RawFd) {
    // SAFETY: dup2, fcntl and setsid are async-signal-safe and touch no Rust state.
    unsafe {
        cmd.pre_exec(move || {
            // dup2 onto itself keeps close-on-exec, so clear it by hand in that case.
            let r = if lock_fd == target_fd {
                libc::fcntl(target_fd, libc::F_SETFD, 0)
            } else {
                libc::dup2(lock_fd, target_fd)
            };
            if r < 0 {
                return Err(io::Error::last_os_error());
            }
            libc::setsid();
            Ok(())
        });
    }
}

/// Who a job's shell becomes before it runs anything of the job's.
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    /// Primary and supplementary groups.
    pub groups: Vec<u32>,
    /// Entered again once the ids are dropped, so the kernel checks the user may.
    pub cwd: std::ffi::CString,
}

/// Makes `cmd` start a job's shell: no signal blocked, its own session, moved into the
/// cgroup whose `cgroup.procs` is open on `cgroup_procs`, then (with `creds`) the user's
/// groups, gid and uid, and killed if its supervisor (`parent`) dies.
pub fn as_job(
    cmd: &mut Command,
    parent: i32,
    cgroup_procs: Option<RawFd>,
    creds: Option<Credentials>,
) {
    // SAFETY: only async-signal-safe calls (sigprocmask, setsid, write, setgroups, setgid,
    // setuid, chdir, prctl, getppid, kill) run between fork and exec; everything they read
    // was allocated before the fork and is only borrowed here.
    unsafe {
        cmd.pre_exec(move || {
            // The supervisor blocks the signals it reads through its signalfd; the job
            // must start with none blocked.
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            // Joined while still privileged: the user may not write any cgroup.procs.
            if let Some(fd) = cgroup_procs {
                libc::write(fd, b"0".as_ptr().cast(), 1);
            }
            if let Some(c) = &creds {
                if libc::setgroups(c.groups.len(), c.groups.as_ptr()) < 0
                    || libc::setgid(c.gid) < 0
                    || libc::setuid(c.uid) < 0
                {
                    return Err(io::Error::last_os_error());
                }
                // Dropped for good: a set-uid-root program is the only way back.
                if libc::setuid(0) == 0 && c.uid != 0 {
                    return Err(io::Error::from_raw_os_error(libc::EPERM));
                }
                if libc::chdir(c.cwd.as_ptr()) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            // The shell must not outlive its supervisor (set after the uid change, which
            // clears it).
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            if libc::getppid() != parent {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            Ok(())
        });
    }
}

/// Takes ownership of the fd a parent placed at `fd` for us, after closing every fd above
/// it (whatever a caller leaked must not stay open for a job's whole life).
pub fn adopt_inherited_fd(fd: RawFd) -> io::Result<File> {
    // SAFETY: close_range takes two fd bounds and flags; nothing above `fd` is ours yet.
    unsafe { libc::syscall(libc::SYS_close_range, fd as u32 + 1, u32::MAX, 0u32) };
    // Fails with EBADF when nothing was placed there, before we claim ownership.
    fcntl(
        // SAFETY: borrowed only for this call; checked to be open before we own it.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
        FcntlArg::F_GETFD,
    )?;
    // SAFETY: the parent placed this fd for us alone, it is open, and we take it once.
    let file = unsafe { File::from_raw_fd(fd) };
    fcntl(&file, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    Ok(file)
}

/// Forks; returns true in the child. The parent's caller should exit at once.
pub fn fork_detached() -> io::Result<bool> {
    // SAFETY: called while the process is single-threaded; the child only continues
    // ordinary Rust code.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Parent { .. } => Ok(false),
        nix::unistd::ForkResult::Child => Ok(true),
    }
}

/// A file in memory (never on disk) holding `data`, positioned at its start.
pub fn memory_file(data: &[u8]) -> io::Result<File> {
    use nix::sys::memfd::{MFdFlags, memfd_create};
    use std::io::{Seek, Write};
    let mut f = File::from(memfd_create(c"gitterm-stdin", MFdFlags::MFD_CLOEXEC)?);
    f.write_all(data)?;
    f.rewind()?;
    Ok(f)
}

/// Restores SIGPIPE's default action, so that `status | head` ends quietly.
pub fn default_sigpipe() {
    // SAFETY: resetting one signal's disposition before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

/// Grows a pipe (fewer wake-ups when a job floods its output) and makes it non-blocking.
pub fn tune_pipe_reader(fd: impl AsFd) -> io::Result<()> {
    let _ = fcntl(fd.as_fd(), FcntlArg::F_SETPIPE_SZ(1 << 20));
    let fl = OFlag::from_bits_retain(fcntl(fd.as_fd(), FcntlArg::F_GETFL)?);
    fcntl(fd.as_fd(), FcntlArg::F_SETFL(fl | OFlag::O_NONBLOCK))?;
    Ok(())
}
