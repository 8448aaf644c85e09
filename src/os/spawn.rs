//! What runs between fork and exec, and the process-level steps around it: each a small
//! function so that the callers above this layer need no `unsafe`.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};

/// Places each `(fd, target)` pair's fd on its target (inherited across an exec), going
/// through copies above every target first so that no source is clobbered. Only
/// async-signal-safe calls: it runs between fork and exec.
pub fn place_fds<const N: usize>(pairs: &[(RawFd, RawFd); N]) -> io::Result<()> {
    let mut high = [0; N];
    for (i, (fd, _)) in pairs.iter().enumerate() {
        // SAFETY: fcntl on an fd number; a closed one fails with EBADF.
        high[i] = unsafe { libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 10) };
        if high[i] < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    for (i, (_, target)) in pairs.iter().enumerate() {
        // SAFETY: dup2 between fd numbers; the copies above are ours.
        if unsafe { libc::dup2(high[i], *target) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Makes `cmd` start the supervisor: each `(fd, target)` becomes `target` (inherited
/// across exec) and the child gets its own session, so a terminal's Ctrl-C or hangup
/// never reaches it.
pub fn as_supervisor(cmd: &mut Command, fds: [(RawFd, RawFd); 2]) {
    // SAFETY: place_fds and setsid are async-signal-safe and touch no Rust state.
    unsafe {
        cmd.pre_exec(move || {
            place_fds(&fds)?;
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
}

/// Everything a job's shell is started with, prepared before the fork so that the child
/// only makes async-signal-safe calls.
pub struct JobStart {
    /// The program and its arguments (`/bin/sh -c COMMAND`).
    pub argv: Vec<CString>,
    /// `NAME=value` strings: the whole environment.
    pub envp: Vec<CString>,
    /// Entered as the job's user, so the kernel checks it may.
    pub cwd: CString,
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// The job's cgroup folder, opened: the shell is created inside it.
    pub cgroup: Option<OwnedFd>,
    /// The `cgroup.procs` files of the job's cgroup v1 folders, opened for writing: the
    /// shell joins each while still privileged.
    pub v1_procs: Vec<OwnedFd>,
    pub creds: Option<Credentials>,
    /// stdin is a terminal's slave: make it the new session's controlling terminal.
    pub controlling_tty: bool,
}

/// The most cgroup v1 folders a job joins (memory, cpu, pids).
pub const MAX_V1: usize = 4;

/// clone3's flag to create the child in the cgroup `cgroup` names (Linux 5.7).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// The kernel's `struct sigaction` for rt_sigaction(2); all zero is SIG_DFL, no flags.
#[repr(C)]
#[derive(Default)]
struct KernelSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// `struct clone_args` of clone3(2), as far as used here.
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// How long [`Started::exec_done`] waits for the shell's exec.
pub const EXEC_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// How often it looks whether the child was stopped meanwhile.
const EXEC_CHECK: std::time::Duration = std::time::Duration::from_millis(20);

/// A job's shell forked and on its way to exec: its pid is known, whether the exec
/// happened is not yet (see [`Started::exec_done`]).
pub struct Started {
    /// The shell's pid.
    pub pid: i32,
    /// Closed by the exec (close-on-exec); before it, the child's failure report.
    report: OwnedFd,
}

impl Started {
    /// Waits until the child has exec'd the shell (`Ok(pid)`), or reports the step that
    /// failed before (the child is then reaped).
    ///
    /// Bounded: once the child has switched to the job's user, any process of that user
    /// (another job's) may stop it before its exec. A stopped child is continued while we
    /// wait, and one still not exec'd after [`EXEC_WAIT`] is killed and reported.
    pub fn exec_done(self) -> io::Result<i32> {
        let mut buf = [0u8; 8];
        let mut got = 0;
        let deadline = std::time::Instant::now() + EXEC_WAIT;
        let mut start = None;
        while got < 8 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                // Our own child, not reaped yet: the pid is still its own.
                let pid = nix::unistd::Pid::from_raw(self.pid);
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                let _ = nix::sys::wait::waitpid(pid, None);
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the shell did not start within {} s: it was held stopped before \
                         its exec (by another process of the job's user?)",
                        EXEC_WAIT.as_secs()
                    ),
                ));
            }
            if !crate::os::poll::readable(&self.report, left.min(EXEC_CHECK))? {
                if start.is_none() {
                    start = crate::os::proc::stat(self.pid).map(|st| st.start);
                }
                if let Some(start) = start {
                    crate::os::pidfd::continue_if_stopped(self.pid, start);
                }
                continue;
            }
            match nix::unistd::read(&self.report, &mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if got == 8 {
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(self.pid), None);
            let step = i32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
            let errno = i32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]);
            return Err(SpawnError {
                step: Step::from(step),
                error: io::Error::from_raw_os_error(errno),
            }
            .into());
        }
        Ok(self.pid)
    }
}

/// Starts a job's shell: clones it, and the caller gets its pid (once it has exec'd where
/// the clone shares our memory, else while it execs), so the record can be written while
/// the shell starts, then learns from [`Started::exec_done`] whether the exec happened.
/// The shell starts with no signal blocked, in its own session, in the job's cgroup
/// (created there by `clone3(CLONE_INTO_CGROUP)`: joining one by writing `cgroup.procs`
/// takes a lock that waits for an RCU grace period, milliseconds per job; where clone3 is
/// refused, a fork joins it the old way), then with the user's groups, gid and uid, killed
/// if its supervisor dies. A failure in the child before exec comes back as
/// [`Started::exec_done`]'s error.
pub fn start_job(job: JobStart) -> io::Result<Started> {
    let parent = std::process::id() as i32;
    let argv: Vec<*const libc::c_char> = job
        .argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp: Vec<*const libc::c_char> = job
        .envp
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    // The child reports a failure before exec as an errno on this pipe (closed on exec).
    let (err_r, err_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let procs = match &job.cgroup {
        Some(dir) => nix::fcntl::openat(
            dir,
            "cgroup.procs",
            OFlag::O_WRONLY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .ok(),
        None => None,
    };
    let raw = |f: &OwnedFd| f.as_raw_fd();
    if job.v1_procs.len() > MAX_V1 {
        return Err(io::Error::other(format!(
            "a job joins at most {MAX_V1} cgroup v1 groups, not {}",
            job.v1_procs.len()
        )));
    }
    let mut v1 = [-1; MAX_V1];
    for (slot, f) in v1.iter_mut().zip(&job.v1_procs) {
        *slot = f.as_raw_fd();
    }
    let child = Child {
        v1,
        argv: &argv,
        envp: &envp,
        cwd: &job.cwd,
        fds: [raw(&job.stdin), raw(&job.stdout), raw(&job.stderr)],
        procs: None,
        creds: job.creds.as_ref(),
        tty: job.controlling_tty,
        parent,
        err: err_w.as_raw_fd(),
    };
    let mut pid = -1;
    if let Some(dir) = &job.cgroup {
        // ENOSYS (seccomp), EINVAL, EBUSY…: fall back to a fork below.
        pid = clone_into_cgroup(dir.as_raw_fd(), &child).unwrap_or(-1);
    }
    if pid < 0 {
        let child = Child {
            procs: procs.as_ref().map(|f| f.as_raw_fd()),
            ..child
        };
        // SAFETY: a plain fork; the child only runs `child.run`, which makes
        // async-signal-safe calls on memory prepared above and never returns, and the
        // supervisor is single-threaded when it starts the shell.
        match unsafe { libc::fork() } {
            0 => child.run(),
            n if n > 0 => pid = n,
            _ => return Err(io::Error::last_os_error()),
        }
    }
    drop(err_w);
    // The child has its own copies of everything it uses: the parent's go now.
    drop(job);
    // EOF on `report`: the exec happened. Eight bytes: the step that failed before it, and
    // its errno.
    Ok(Started { pid, report: err_r })
}

/// Starts `child` in the cgroup whose folder `cgroup` is open on, by clone3 with
/// `CLONE_INTO_CGROUP`; `None` where clone3 refuses.
fn clone_into_cgroup(cgroup: RawFd, child: &Child) -> Option<i32> {
    // A child that switches to the job's user can be stopped by that user's processes
    // before its exec, and a parent that waits for the exec inside clone could not stop
    // waiting: such a child is forked, and its exec waited for with a bound. So is one
    // that joins cgroup v1 groups: its first write to a `cgroup.procs` waits for an RCU
    // grace period, which a forked child spends while its parent writes the record.
    #[cfg(target_arch = "x86_64")]
    if child.creds.is_none() && child.v1[0] < 0 {
        return clone_vfork_into_cgroup(cgroup, child);
    }
    clone_fork_into_cgroup(cgroup, child)
}

/// [`clone_into_cgroup`] sharing our memory until the child's exec.
#[cfg(target_arch = "x86_64")]
fn clone_vfork_into_cgroup(cgroup: RawFd, child: &Child) -> Option<i32> {
    // Like posix_spawn: the child shares our memory and we wait until it has exec'd (or
    // failed), so no page table is copied and nothing of ours is copied on write later.
    // It runs on a stack of its own; the signals are blocked meanwhile so that no handler
    // of ours runs in it before it has put every disposition back to the default.
    const STACK: usize = 64 << 10;
    let mut stack: Vec<u8> = Vec::with_capacity(STACK + 16);
    let base = stack.as_mut_ptr() as usize;
    let low = base.next_multiple_of(16);
    let mut args = CloneArgs {
        flags: (libc::CLONE_VM | libc::CLONE_VFORK) as u64 | CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        stack: low as u64,
        stack_size: STACK as u64,
        cgroup: cgroup as u64,
        ..Default::default()
    };
    let mut old = nix::sys::signal::SigSet::empty();
    let _ = nix::sys::signal::pthread_sigmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(&nix::sys::signal::SigSet::all()),
        Some(&mut old),
    );
    let ret: isize;
    // SAFETY: clone3 with CLONE_VM | CLONE_VFORK returns here in the parent only once the
    // child has exec'd or exited, so the child's use of our memory (the `Child` and the
    // stack, both alive until then) is over. The child starts on its own stack (the
    // kernel points rsp at its top, 16-byte aligned) and calls `vfork_child`, which never
    // returns, so it never unwinds into this frame. rax, rcx and r11 are what the
    // syscall clobbers.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "mov rdi, r12",
            "call r13",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone3 as isize => ret,
            in("rdi") &mut args as *mut CloneArgs,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") child as *const Child,
            in("r13") vfork_child as extern "C" fn(*const Child) -> !,
            lateout("rcx") _,
            lateout("r11") _,
        );
    }
    let _ = nix::sys::signal::pthread_sigmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(&old),
        None,
    );
    drop(stack);
    (ret > 0).then_some(ret as i32)
}

/// The child side of [`clone_vfork_into_cgroup`].
#[cfg(target_arch = "x86_64")]
extern "C" fn vfork_child(child: *const Child) -> ! {
    // SAFETY: the parent's `Child`, alive while the parent waits for our exec.
    unsafe { *child }.run()
}

/// [`clone_into_cgroup`] as a fork.
fn clone_fork_into_cgroup(cgroup: RawFd, child: &Child) -> Option<i32> {
    let mut args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup as u64,
        ..Default::default()
    };
    // SAFETY: clone3 without CLONE_VM is a fork; the child only runs `child.run`,
    // which makes async-signal-safe calls on memory prepared above and never returns.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match r {
        0 => child.run(),
        n if n > 0 => Some(n as i32),
        _ => None,
    }
}

/// Where the child of [`start_job`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Step {
    Stdio = 1,
    Session = 2,
    User = 3,
    Cwd = 4,
    Exec = 5,
    Cgroup = 6,
}

impl From<i32> for Step {
    fn from(n: i32) -> Step {
        match n {
            1 => Step::Stdio,
            2 => Step::Session,
            3 => Step::User,
            4 => Step::Cwd,
            6 => Step::Cgroup,
            _ => Step::Exec,
        }
    }
}

/// A job's shell that could not be started, and the step that failed.
#[derive(Debug)]
pub struct SpawnError {
    pub step: Step,
    pub error: io::Error,
}

impl std::fmt::Display for SpawnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.step {
            Step::Stdio => "could not set up its output",
            Step::Session => "could not start its session",
            Step::User => "could not switch to the job's user",
            Step::Cwd => "could not enter its working folder (cwd) as the job's user",
            Step::Exec => "could not run /bin/sh",
            Step::Cgroup => "could not join the job's cgroup v1 groups (its limits)",
        };
        write!(f, "{what}: {}", self.error)
    }
}

impl std::error::Error for SpawnError {}

impl From<SpawnError> for io::Error {
    fn from(e: SpawnError) -> io::Error {
        io::Error::new(e.error.kind(), e.to_string())
    }
}

/// The child's side of [`start_job`]: plain data, borrowed from the parent's copy.
#[derive(Clone, Copy)]
struct Child<'a> {
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    cwd: &'a CString,
    fds: [RawFd; 3],
    procs: Option<RawFd>,
    /// cgroup v1 `cgroup.procs` files to join, -1 past the last.
    v1: [RawFd; MAX_V1],
    creds: Option<&'a Credentials>,
    tty: bool,
    parent: i32,
    err: RawFd,
}

impl Child<'_> {
    fn run(self) -> ! {
        // SAFETY: only async-signal-safe calls, on memory the parent prepared before the
        // fork; every path ends in execve or _exit.
        unsafe {
            // The step that failed and its errno, for the parent's message.
            let fail = |err: RawFd, step: Step| -> ! {
                let report = [step as i32, *libc::__errno_location()];
                libc::write(err, report.as_ptr().cast(), 8);
                libc::_exit(127)
            };
            // Every disposition back to its default, real-time signals included: the Rust
            // runtime ignores SIGPIPE (a job's `yes | head` must still end), the CLI that
            // may have forked us catches INT, TERM and HUP, and whoever started the agent
            // may have left any signal ignored (exec keeps an ignored signal ignored). The
            // raw call: libc's wrapper may take a lock or refuse the signals it reserves,
            // and this child may share the parent's memory.
            let default = KernelSigaction::default();
            for sig in 1..=64 {
                if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                    libc::syscall(
                        libc::SYS_rt_sigaction,
                        sig,
                        &default as *const KernelSigaction,
                        std::ptr::null_mut::<KernelSigaction>(),
                        8usize,
                    );
                }
            }
            // Only now: the supervisor blocks the signals it reads through its signalfd
            // (and the parent all of them around a shared-memory clone); the job must
            // start with none blocked.
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            for (target, &fd) in self.fds.iter().enumerate() {
                // dup2 onto itself would keep close-on-exec: clear it instead.
                let r = if fd == target as RawFd {
                    libc::fcntl(fd, libc::F_SETFD, 0)
                } else {
                    libc::dup2(fd, target as RawFd)
                };
                if r < 0 {
                    fail(self.err, Step::Stdio);
                }
            }
            if libc::setsid() < 0 {
                fail(self.err, Step::Session);
            }
            // The new session's controlling terminal: its foreground group gets ^C, ^Z
            // and SIGWINCH.
            if self.tty && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                fail(self.err, Step::Session);
            }
            // Joined while still privileged: the user may not write any cgroup.procs.
            if let Some(fd) = self.procs {
                libc::write(fd, b"0".as_ptr().cast(), 1);
            }
            // The v1 groups carry the job's limits: a shell that did not join one must
            // not run.
            for &fd in self.v1.iter().take_while(|&&fd| fd >= 0) {
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    fail(self.err, Step::Cgroup);
                }
            }
            if let Some(c) = self.creds {
                // Never in a clone that shares our memory (see `clone_into_cgroup`), so
                // libc's wrappers are safe here.
                if libc::setgroups(c.groups.len(), c.groups.as_ptr()) < 0
                    || libc::setgid(c.gid) < 0
                    || libc::setuid(c.uid) < 0
                {
                    fail(self.err, Step::User);
                }
                // Dropped for good: a set-uid-root program is the only way back.
                if c.uid != 0 && libc::setuid(0) == 0 {
                    *libc::__errno_location() = libc::EPERM;
                    fail(self.err, Step::User);
                }
            }
            if libc::chdir(self.cwd.as_ptr()) < 0 {
                fail(self.err, Step::Cwd);
            }
            // The shell must not outlive its supervisor (set after the uid change, which
            // clears it).
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            if libc::getppid() != self.parent {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            libc::execve(self.argv[0], self.argv.as_ptr(), self.envp.as_ptr());
            fail(self.err, Step::Exec)
        }
    }
}

/// Takes ownership of the fds a parent placed at `fds` for us (consecutive from the
/// first), after closing every fd above them: whatever a caller leaked must not stay open
/// for a job's whole life.
pub fn adopt_inherited_fds<const N: usize>(fds: [RawFd; N]) -> io::Result<[File; N]> {
    let top = fds.iter().copied().max().unwrap_or(2);
    // SAFETY: close_range takes two fd bounds and flags; nothing above `top` is ours yet.
    unsafe { libc::syscall(libc::SYS_close_range, top as u32 + 1, u32::MAX, 0u32) };
    for fd in fds {
        // Fails with EBADF when nothing was placed there, before we claim ownership.
        fcntl(
            // SAFETY: borrowed only for this call; checked to be open before we own it.
            unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
            FcntlArg::F_GETFD,
        )?;
    }
    // SAFETY: the parent placed these fds for us alone, they are open, and we take each
    // once.
    let files = fds.map(|fd| unsafe { File::from_raw_fd(fd) });
    for f in &files {
        fcntl(f, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    }
    Ok(files)
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

/// [`memory_file`] under `name` (what `/proc/<pid>/fd/<n>` of it reads as `/memfd:NAME`).
pub fn named_memory_file(name: &std::ffi::CStr, data: &[u8]) -> io::Result<File> {
    use nix::sys::memfd::{MFdFlags, memfd_create};
    use std::io::{Seek, Write};
    let mut f = File::from(memfd_create(name, MFdFlags::MFD_CLOEXEC)?);
    f.write_all(data)?;
    f.rewind()?;
    Ok(f)
}

/// Ignores SIGPIPE, so a write to a reader that is gone fails with EPIPE instead.
pub fn ignore_sigpipe() {
    // SAFETY: setting one signal's disposition; no handler runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
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

/// Makes an fd non-blocking.
pub fn set_nonblocking(fd: impl AsFd) -> io::Result<()> {
    let fl = OFlag::from_bits_retain(fcntl(fd.as_fd(), FcntlArg::F_GETFL)?);
    fcntl(fd.as_fd(), FcntlArg::F_SETFL(fl | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// A copy of `fd` at exactly `at`, without close-on-exec, so the next job's shell inherits
/// it there (a session's state descriptors). Call it while no other thread starts a
/// process: until the copy is dropped, every exec of this process passes it on.
pub fn inheritable_copy(fd: std::os::fd::BorrowedFd<'_>, at: RawFd) -> io::Result<OwnedFd> {
    let got = fcntl(fd, FcntlArg::F_DUPFD(at))?;
    // SAFETY: F_DUPFD just made this fd for us alone; nothing else owns it.
    let copy = unsafe { OwnedFd::from_raw_fd(got) };
    if got != at {
        return Err(io::Error::other(format!(
            "descriptor {at} is taken (got {got}): cannot place the session's state there"
        )));
    }
    Ok(copy)
}
