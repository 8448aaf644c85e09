//! Starting a supervisor without an exec: a fork of a small single-threaded process.
//!
//! Exec'ing the agent's binary for every job costs a process image (~0.5 ms). A caller
//! that is single-threaded (the CLI) forks the entry directly; `serve`, whose threads make
//! a plain fork unsafe, starts a fork server before its first thread (as Python's
//! `forkserver` and Android's zygote do). The server keeps one supervisor forked ahead (a
//! spare) and hands it to the caller, which passes the job's lock, spec and stdin to the
//! spare as fds; when none is at hand, the caller asks the server to fork one now. Either
//! way the entry runs with the same fds as an exec'd
//! `supervise` would: the lock on [`LOCK`], the spec on [`SPEC`], stdin on 0, a pipe back
//! to the caller on 1, `/dev/null` on 2.

use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg,
    sendmsg, socketpair,
};

/// What runs in the new process: `main(root, id)`'s exit status ends it.
pub type Entry = fn(&Path, &str) -> i32;

/// The fds the lock and the spec are placed on (the supervisor's contract).
pub const LOCK: RawFd = 3;
pub const SPEC: RawFd = 4;

/// Runs `entry(root, id)` in a fork of this process, which must be single-threaded.
/// Returns the new process's pid and the read end of its stdout. The process is this
/// one's child: the fork server has the kernel reap it, the CLI exits with its job.
pub fn fork_entry(
    entry: Entry,
    root: &Path,
    id: &str,
    lock: BorrowedFd<'_>,
    spec: BorrowedFd<'_>,
    stdin: Option<BorrowedFd<'_>>,
) -> io::Result<(i32, File)> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let null = File::options().read(true).write(true).open("/dev/null")?;
    let fds = [
        (stdin.map_or(null.as_raw_fd(), |s| s.as_raw_fd()), 0),
        (w.as_raw_fd(), 1),
        (null.as_raw_fd(), 2),
        (lock.as_raw_fd(), LOCK),
        (spec.as_raw_fd(), SPEC),
    ];
    // Nothing buffered may be written twice, by the child too.
    let _ = io::Write::flush(&mut io::stdout());
    // SAFETY: the caller is single-threaded (checked by the callers: the CLI, or the fork
    // server's own loop), so the child may run ordinary Rust code; it ends in _exit.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => unsafe {
            // SAFETY (the whole block): fd juggling on fds we own in this new process,
            // then the entry; never returns.
            if super::spawn::place_fds(&fds).is_err() {
                libc::_exit(1);
            }
            // Its own session: a terminal's Ctrl-C or hangup never reaches it.
            libc::setsid();
            // The fork server ignores SIGCHLD (its children are reaped by the kernel); the
            // supervisor must see its own.
            libc::signal(libc::SIGCHLD, libc::SIG_DFL);
            // Named for `ps` and `top` (the command line stays the parent's).
            libc::prctl(libc::PR_SET_NAME, c"gitterm-superv".as_ptr(), 0, 0, 0);
            let code = entry(root, id);
            libc::_exit(code)
        },
        pid => {
            drop(w);
            Ok((pid, File::from(r)))
        }
    }
}

/// A fork server: a process forked while its parent was single-threaded, forking entries
/// on request.
pub struct ForkServer {
    line: Mutex<Line>,
    /// The server process: its pid and start time (which pin it against pid reuse).
    pid: i32,
    start: u64,
}

/// The caller's side: the socket to the server, and the spare it offered, once received.
struct Line {
    sock: OwnedFd,
    spare: Option<Spare>,
    /// The server was given up (found stopped, or it did not answer): later starts are
    /// refused at once, and take the caller's other way.
    retired: bool,
}

/// How long a start waits for the server's answer to a request it was sent, continuing
/// the server meanwhile if something stops it. A running server answers in about a
/// millisecond; past this bound it is given up.
pub const ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How often a waiting start looks whether the server was stopped.
const NUDGE_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// The reply that carries the pipe (an error is its message instead).
const OK: &[u8] = b"k";

/// The server's offer of a spare: its request socket and the read end of its stdout, and
/// as text after this byte the spare's pid and start time. The caller hands a start to the
/// spare itself, so a start's path crosses one process, not two (the server's relay cost
/// some 60 us of wake-ups and copies).
const OFFER: &[u8] = b"s";

/// The caller's word that it took the spare offered: the server forks the next one.
const TAKEN: &[u8] = b"u";

/// The largest request: a state root path and a job id.
const MAX_REQUEST: usize = 8192;

impl ForkServer {
    /// Starts the server. Call it before this process starts any thread; the server dies
    /// with its parent.
    pub fn start(entry: Entry) -> io::Result<ForkServer> {
        let (ours, theirs) = seqpacket_pair()?;
        let parent = std::process::id() as i32;
        // SAFETY: single-threaded by the caller's promise; the child runs `serve` and
        // ends in _exit.
        match unsafe { libc::fork() } {
            -1 => Err(io::Error::last_os_error()),
            0 => {
                drop(ours);
                // SAFETY: plain syscalls on this new process.
                unsafe {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
                    if libc::getppid() != parent {
                        libc::_exit(0);
                    }
                    // Out of the terminal's reach: a Ctrl-C meant for `serve` (which
                    // leaves jobs running) must not end the server that starts them.
                    libc::setsid();
                    libc::prctl(libc::PR_SET_NAME, c"gitterm-forks".as_ptr(), 0, 0, 0);
                    // The supervisors it forks are its children for their whole life: the
                    // kernel reaps them as they exit, so none lingers as a zombie while
                    // the server waits for the next request.
                    libc::signal(libc::SIGCHLD, libc::SIG_IGN);
                }
                serve(entry, theirs);
                // SAFETY: ends the server process without running the parent's atexit.
                unsafe { libc::_exit(0) }
            }
            pid => {
                drop(theirs);
                // Our own child, not reaped while we live: its pid is its own.
                let start = super::proc::stat(pid).map_or(0, |s| s.start);
                Ok(ForkServer {
                    line: Mutex::new(Line {
                        sock: ours,
                        spare: None,
                        retired: false,
                    }),
                    pid,
                    start,
                })
            }
        }
    }

    /// Runs the entry for `id` in a new process, as [`fork_entry`] does; returns the read
    /// end of its stdout (the server waits for the process itself). The spare the server
    /// offered takes it when there is one; else the server forks one now.
    pub fn launch(
        &self,
        root: &Path,
        id: &str,
        lock: BorrowedFd<'_>,
        spec: BorrowedFd<'_>,
        stdin: Option<BorrowedFd<'_>>,
    ) -> io::Result<File> {
        use std::os::unix::ffi::OsStrExt;
        let mut req = root.as_os_str().as_bytes().to_vec();
        req.push(0);
        req.extend_from_slice(id.as_bytes());
        if req.len() > MAX_REQUEST {
            return Err(io::Error::other("state root path too long"));
        }
        let mut fds = vec![lock.as_raw_fd(), spec.as_raw_fd()];
        fds.extend(stdin.map(|s| s.as_raw_fd()));
        let mut line = self.line.lock().unwrap_or_else(|p| p.into_inner());
        if line.spare.is_none() && !line.retired {
            line.spare = take_offer(line.sock.as_fd());
        }
        // A spare that something stopped would hold the start until the launcher's own
        // bound: it holds nothing of any job yet, so it is ended and another way taken.
        if let Some(spare) = line.spare.take_if(|s| stopped(s.pid, s.start)) {
            super::pidfd::signal_verified(
                spare.pid,
                spare.start,
                nix::sys::signal::Signal::SIGKILL,
            );
            if !line.retired {
                send(line.sock.as_fd(), TAKEN, &[])?;
            }
        }
        if let Some(spare) = line.spare.take() {
            let handed = send(spare.sock.as_fd(), &req, &fds);
            // Taken or found dead, the server makes the next one. A spare outlives a
            // server that was killed: the start it took stands either way.
            let told = if line.retired {
                Ok(())
            } else {
                send(line.sock.as_fd(), TAKEN, &[])
            };
            if handed.is_ok() {
                return Ok(spare.out);
            }
            told?;
        }
        if line.retired {
            return Err(io::Error::other("the fork server was given up"));
        }
        // A server that something stopped (a job running as the agent's user can) would
        // hold this start, and every later one, until it is continued: it is given up
        // before it is sent anything, so the caller's other way is safe to take.
        if self.stopped() {
            self.retire(&mut line);
            return Err(io::Error::other(
                "the fork server was stopped: it is given up, and supervisors are exec'd",
            ));
        }
        // No spare at hand (a burst took it, or forking one failed): a fork now.
        send(line.sock.as_fd(), &req, &fds)?;
        let deadline = std::time::Instant::now() + ANSWER_WAIT;
        loop {
            // Bounded, continuing a server stopped after the look above: sent the request,
            // it may fork the job's supervisor at any time, so the caller must not start
            // another one; a server that never answers is killed.
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                self.retire(&mut line);
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the fork server did not answer within {} s (stopped or starved); \
                         it is given up",
                        ANSWER_WAIT.as_secs()
                    ),
                ));
            }
            if !super::poll::readable(&line.sock, left.min(NUDGE_EVERY))? {
                super::pidfd::continue_if_stopped(self.pid, self.start);
                continue;
            }
            let (data, got) = receive(line.sock.as_fd(), 2, MsgFlags::empty())?;
            if data.starts_with(OFFER) {
                // The next spare, made meanwhile: kept for the next start.
                line.spare = offered(&data, got);
                continue;
            }
            return match got.into_iter().next() {
                Some(f) if data == OK => Ok(File::from(f)),
                _ if data.is_empty() => Err(io::Error::other("the fork server has stopped")),
                _ => Err(io::Error::other(
                    String::from_utf8_lossy(&data).into_owned(),
                )),
            };
        }
    }

    /// True if the server is stopped (by a signal or a tracer), or gone.
    fn stopped(&self) -> bool {
        stopped(self.pid, self.start)
    }

    /// Gives the server up: kills it (a stopped process dies of SIGKILL too), so that a
    /// request it holds is never acted on later, and refuses later starts at once.
    fn retire(&self, line: &mut Line) {
        line.retired = true;
        if let Some(p) = super::pidfd::Pidfd::open(self.pid, self.start)
            && p.signal(nix::sys::signal::Signal::SIGKILL)
            && p.wait_exit(std::time::Duration::from_millis(500))
        {
            // Our child: reaped, so that it does not stay a zombie for serve's whole life.
            let _ = nix::sys::wait::waitpid(
                nix::unistd::Pid::from_raw(self.pid),
                Some(nix::sys::wait::WaitPidFlag::WNOHANG),
            );
        }
    }
}

/// True if the process that started at `start` is stopped (by a signal or a tracer), or
/// gone. Without its start time (no `/proc` when it was forked) it cannot be told apart
/// from another process, and the answer is no.
fn stopped(pid: i32, start: u64) -> bool {
    if start == 0 {
        return false;
    }
    match super::proc::stat(pid) {
        Some(s) if s.start == start => matches!(s.state, 'T' | 't' | 'Z' | 'X'),
        _ => true,
    }
}

/// Sends one message with `fds`.
fn send(sock: BorrowedFd<'_>, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &cmsg };
    sendmsg::<()>(
        sock.as_raw_fd(),
        &[IoSlice::new(data)],
        cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    Ok(())
}

/// The spare of an offer's fds.
fn offered(data: &[u8], fds: Vec<OwnedFd>) -> Option<Spare> {
    let mut fds = fds.into_iter();
    let text = std::str::from_utf8(data.get(OFFER.len()..)?).ok()?;
    let mut nums = text.split(' ').map(|n| n.parse::<u64>().ok());
    let (pid, start) = (nums.next()??, nums.next()??);
    match (fds.next(), fds.next()) {
        (Some(sock), Some(out)) => Some(Spare {
            sock,
            out: File::from(out),
            pid: i32::try_from(pid).ok()?,
            start,
        }),
        _ => None,
    }
}

/// An offer waiting on the caller's socket, if one is there (none is not waited for).
fn take_offer(sock: BorrowedFd<'_>) -> Option<Spare> {
    match receive(sock, 2, MsgFlags::MSG_DONTWAIT) {
        Ok((data, fds)) if data.starts_with(OFFER) => offered(&data, fds),
        _ => None,
    }
}

/// One message and the fds it carried (at most `max_fds`; more are closed).
fn receive(
    sock: BorrowedFd<'_>,
    max_fds: usize,
    flags: MsgFlags,
) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; MAX_REQUEST];
    let mut cmsg = nix::cmsg_space!([RawFd; 4]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC | flags,
    )?;
    let n = msg.bytes;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            for fd in raw {
                // SAFETY: the kernel just installed these fds for us.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                if fds.len() < max_fds {
                    fds.push(owned);
                }
            }
        }
    }
    buf.truncate(n);
    Ok((buf, fds))
}

/// A request's state root and job id.
fn parse_request(req: &[u8]) -> Result<(PathBuf, &str), &'static str> {
    use std::os::unix::ffi::OsStrExt;
    let sep = req
        .iter()
        .position(|&b| b == 0)
        .ok_or("malformed request")?;
    let root = PathBuf::from(std::ffi::OsStr::from_bytes(&req[..sep]));
    let id = std::str::from_utf8(&req[sep + 1..]).map_err(|_| "malformed id")?;
    Ok((root, id))
}

/// A supervisor forked ahead of demand: a process waiting for one request, so that a
/// start's path holds no fork (as a warm zygote does). It holds nothing of any job while
/// it waits.
struct Spare {
    /// Where its request goes.
    sock: OwnedFd,
    /// The read end of its stdout, the launcher's channel.
    out: File,
    /// The spare process, which becomes the supervisor: its pid and start time.
    pid: i32,
    start: u64,
}

/// A connected pair of Unix sequenced-packet sockets (one request, one message), closed
/// on exec: the server's line to `serve`, and each spare's line to whoever holds its
/// offer.
fn seqpacket_pair() -> nix::Result<(OwnedFd, OwnedFd)> {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
}

/// The fd a spare waits for its request on.
const SPARE_REQUEST: RawFd = 3;

/// Forks a [`Spare`]. Called from the server's single-threaded loop.
fn fork_spare(entry: Entry) -> io::Result<Spare> {
    let (ours, theirs) = seqpacket_pair()?;
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // The server's stdin and stderr (serve's log) are not held while the spare waits.
    let null = File::options().read(true).write(true).open("/dev/null")?;
    // SAFETY: the server is single-threaded; the child runs ordinary Rust code and ends
    // in _exit.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => unsafe {
            // SAFETY (the whole block): fd juggling on fds this new process owns, then
            // the entry; never returns.
            // Only its stdout and its request socket stay open: whatever the server held
            // (its socket to `serve`, a job's fds) must not be held by a waiting spare.
            if super::spawn::place_fds(&[
                (null.as_raw_fd(), 0),
                (w.as_raw_fd(), 1),
                (null.as_raw_fd(), 2),
                (theirs.as_raw_fd(), SPARE_REQUEST),
            ])
            .is_err()
            {
                libc::_exit(1);
            }
            libc::syscall(
                libc::SYS_close_range,
                SPARE_REQUEST as u32 + 1,
                u32::MAX,
                0u32,
            );
            std::mem::forget((ours, theirs, r, w, null));
            libc::setsid();
            libc::signal(libc::SIGCHLD, libc::SIG_DFL);
            libc::prctl(libc::PR_SET_NAME, c"gitterm-spare".as_ptr(), 0, 0, 0);
            // Named first on the launcher's channel (as the supervisor names itself), so
            // that a launcher waiting for its start can continue it if something stops it.
            let named = format!("pid {}\n", std::process::id());
            let _ = nix::unistd::write(BorrowedFd::borrow_raw(1), named.as_bytes());
            // Read now, while nothing waits for it: the record names it.
            let _ = super::proc::own_start();
            let request = BorrowedFd::borrow_raw(SPARE_REQUEST);
            // EOF: the server is gone, and so is this spare's reason to be.
            let code = match receive(request, 3, MsgFlags::empty()) {
                Ok((req, fds)) if !req.is_empty() => run_spare(entry, &req, &fds),
                _ => 0,
            };
            libc::_exit(code)
        },
        pid => {
            drop(theirs);
            drop(w);
            Ok(Spare {
                sock: ours,
                out: File::from(r),
                pid,
                // Our child, reaped only once it exits: its pid is its own meanwhile.
                start: super::proc::stat(pid).map_or(0, |s| s.start),
            })
        }
    }
}

/// A spare's request: the fds on their places (as [`fork_entry`] puts them), then the
/// entry. Runs in the spare only.
fn run_spare(entry: Entry, req: &[u8], fds: &[OwnedFd]) -> i32 {
    let Ok((root, id)) = parse_request(req) else {
        return 1;
    };
    let (Some(lock), Some(spec)) = (fds.first(), fds.get(1)) else {
        return 1;
    };
    let Ok(null) = File::options().read(true).write(true).open("/dev/null") else {
        return 1;
    };
    let stdin = fds.get(2).map_or(null.as_raw_fd(), |f| f.as_raw_fd());
    let places = [
        (stdin, 0),
        (null.as_raw_fd(), 2),
        (lock.as_raw_fd(), LOCK),
        (spec.as_raw_fd(), SPEC),
    ];
    if super::spawn::place_fds(&places).is_err() {
        return 1;
    }
    // SAFETY: naming this process; no memory is handed over.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"gitterm-superv".as_ptr(), 0, 0, 0) };
    entry(&root, id)
}

/// The server's loop, until the socket closes: a spare forked and offered to the caller,
/// then the caller's word that it took it (and the next spare), or a request to fork one
/// now, answered with its pipe (when the caller had no spare at hand).
fn serve(entry: Entry, sock: OwnedFd) {
    let mut offered = false;
    loop {
        if !offered && let Ok(spare) = fork_spare(entry) {
            // The server keeps no copy: the spare sees EOF once the caller is gone.
            let fds = [spare.sock.as_raw_fd(), spare.out.as_raw_fd()];
            let mut offer = OFFER.to_vec();
            offer.extend_from_slice(format!("{} {}", spare.pid, spare.start).as_bytes());
            offered = send(sock.as_fd(), &offer, &fds).is_ok();
        }
        let Ok((req, fds)) = receive(sock.as_fd(), 3, MsgFlags::empty()) else {
            return;
        };
        if req.is_empty() && fds.is_empty() {
            return; // the parent is gone
        }
        if req == TAKEN {
            offered = false;
            continue;
        }
        let reply = (|| {
            let (root, id) = parse_request(&req)?;
            let (Some(lock), Some(spec)) = (fds.first(), fds.get(1)) else {
                return Err("no lock or spec passed");
            };
            fork_entry(
                entry,
                &root,
                id,
                lock.as_fd(),
                spec.as_fd(),
                fds.get(2).map(|f| f.as_fd()),
            )
            .map(|(_, r)| r)
            .map_err(|_| "fork failed")
        })();
        let _ = match &reply {
            Ok(r) => send(sock.as_fd(), OK, &[r.as_raw_fd()]),
            Err(e) => send(sock.as_fd(), e.as_bytes(), &[]),
        };
        // The job's fds (its lock above all) are closed before the next spare is forked:
        // a spare holding a job's lock would pass for its supervisor.
        drop(reply);
        drop(fds);
    }
}
