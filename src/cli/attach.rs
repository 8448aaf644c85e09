//! `attach`: the terminal of a terminal job, on this terminal, straight through the job's
//! supervisor (no server needed). Ctrl-] then d detaches; the job runs on.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::job::control::{Frame, Viewer};
use crate::model::JobId;
use crate::model::error::{Error, Result};
use crate::state::store::Store;

/// The first key of the detach sequence (Ctrl-]); `d` must follow.
pub const DETACH_KEY: u8 = 0x1d;

/// Flags of `attach`.
#[derive(clap::Args)]
pub struct Args {
    /// The job id (a job started with a pty, e.g. by `exec --tty`)
    id: String,
    /// Watch only: keys are not sent
    #[arg(long)]
    read_only: bool,
}

pub fn run(a: Args) -> Result<i32> {
    let store = super::open_store()?;
    let id = Store::parse_id(&a.id)?;
    let rec = crate::job::settle::settle_and_load(&store, &id).map_err(|e| match e {
        Error::NotFound(m) => Error::NotFound(format!(
            "{m} in {}: `gitterm-agent status` lists the jobs there",
            store.root().display()
        )),
        e => e,
    })?;
    if rec.status.is_final() {
        return Err(has_ended(&rec));
    }
    // Answered at once: only `exec --tty` (whose job may end before it attaches) waits
    // for a final record.
    let viewer = Viewer::attach(&store, &id, !a.read_only).map_err(|e| {
        match crate::job::settle::settle_and_load(&store, &id) {
            Ok(rec) if rec.status.is_final() => has_ended(&rec),
            Ok(_) if is_not_a_terminal(&store, &id, &e) => Error::Conflict(format!(
                "job {id} is not a terminal job (it has no pty to attach to); start one with \
                 `gitterm-agent exec --tty -- COMMAND`, or follow this one's output with \
                 `gitterm-agent logs --follow {id}`"
            )),
            _ => e,
        }
    })?;
    attached(&store, &id, viewer, !a.read_only)
}

/// The refusal to attach to a job that has ended, with where its output is.
fn has_ended(rec: &crate::model::JobRecord) -> Error {
    let how = match (rec.exit_code, rec.signal.as_deref()) {
        (Some(c), _) => format!(", exit code {c}"),
        (None, Some(s)) => format!(", {s}"),
        _ => String::new(),
    };
    Error::Conflict(format!(
        "job {id} has ended ({}{how}); print its output with `gitterm-agent logs {id}`",
        rec.status.as_str(),
        id = rec.id
    ))
}

/// Whether attaching failed because the running job has no terminal: it has no control
/// socket (not interactive), or its supervisor said so (interactive on a pipe).
fn is_not_a_terminal(store: &Store, id: &JobId, e: &Error) -> bool {
    let socket = crate::job::control::socket_path(store, id);
    let interactive = store.job_dir(id).join(crate::job::control::MARK).exists();
    !interactive || (socket.exists() && matches!(e, Error::Conflict(m) if m.contains("terminal")))
}

/// Attaches this process's stdin and stdout to the job's terminal until the job ends
/// (its exit status, as `exec` gives it) or the user detaches (0). For `exec --tty`: a job
/// that ended before the viewer got there has its stored output printed instead.
pub fn session(store: &Store, id: &JobId, write: bool) -> Result<i32> {
    let viewer = match Viewer::attach(store, id, write) {
        Ok(v) => v,
        Err(e) => {
            // Ended before we could attach (a short `exec --tty`): its stored output, and
            // its status.
            let mut rec = crate::job::settle::settle_and_load(store, id)?;
            for _ in 0..250 {
                if rec.status.is_final() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
                rec = crate::job::settle::settle_and_load(store, id)?;
            }
            if !rec.status.is_final() {
                return Err(e);
            }
            let log = store.job_dir(id).join(crate::state::layout::OUTPUT);
            if let Ok(data) = std::fs::read(log) {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(&data);
                let _ = out.flush();
            }
            return Ok(super::exit::exit_status(&rec));
        }
    };
    attached(store, id, viewer, write)
}

/// The session itself, on an attached viewer.
fn attached(store: &Store, id: &JobId, mut viewer: Viewer, write: bool) -> Result<i32> {
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let winch = Arc::new(AtomicBool::new(true));
    let stop = Arc::new(AtomicBool::new(false));
    let _ = signal_hook::flag::register(signal_hook::consts::SIGWINCH, Arc::clone(&winch));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
        let _ = signal_hook::flag::register(sig, Arc::clone(&stop));
    }
    // Restored when this function returns, whichever way (and on a panic's unwind).
    let raw = crate::os::term::RawMode::enter(stdin.as_fd());
    let mut keys_open = true;
    let mut held = false;
    let mut buf = [0u8; 16 * 1024];
    // The recent output came with the handshake's answer: drawn now, not when the job
    // next prints (a quiet job would show a blank screen until then).
    let mut frames = viewer.parse();
    loop {
        if !frames.is_empty() {
            let mut out = stdout.lock();
            for f in frames.drain(..) {
                match f {
                    Frame::Out(b) => {
                        let _ = out.write_all(&b);
                    }
                    Frame::Exit(_) => {
                        let _ = out.flush();
                        drop(raw);
                        return ended(store, id);
                    }
                }
            }
            let _ = out.flush();
        }
        if stop.load(Ordering::SeqCst) {
            return Ok(129);
        }
        if write
            && winch.swap(false, Ordering::SeqCst)
            && let Some((cols, rows)) = crate::os::term::size(stdout.as_fd())
        {
            let _ = viewer.resize(cols, rows);
        }
        let (keys, output) = {
            let mut fds = vec![PollFd::new(viewer.fd(), PollFlags::POLLIN)];
            if keys_open {
                fds.push(PollFd::new(stdin.as_fd(), PollFlags::POLLIN));
            }
            let _ = poll(&mut fds, PollTimeout::from(200u16));
            let r = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
            (fds.get(1).is_some_and(r), r(&fds[0]))
        };
        if output {
            match viewer.frames() {
                Ok(Some(f)) => frames = f,
                Ok(None) | Err(_) => return ended(store, id),
            }
        }
        if keys {
            let n = match stdin.lock().read(&mut buf) {
                Ok(0) | Err(_) => {
                    keys_open = false;
                    continue;
                }
                Ok(n) => n,
            };
            let mut send = Vec::with_capacity(n + 1);
            for &b in &buf[..n] {
                if held {
                    held = false;
                    if b == b'd' {
                        drop(raw);
                        eprintln!(
                            "\r\n[detached from {id}; `gitterm-agent attach {id}` to return]"
                        );
                        return Ok(0);
                    }
                    send.push(DETACH_KEY);
                }
                if b == DETACH_KEY {
                    held = true;
                } else {
                    send.push(b);
                }
            }
            if write && !send.is_empty() && viewer.stdin(&send).is_err() {
                return ended(store, id);
            }
        }
    }
}

/// The job's exit status once it ended (as `exec` gives it).
fn ended(store: &Store, id: &JobId) -> Result<i32> {
    for _ in 0..100 {
        let rec = crate::job::settle::settle_and_load(store, id)?;
        if rec.status.is_final() {
            return Ok(super::exit::exit_status(&rec));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Err(Error::Conflict(format!(
        "the terminal of job {id} closed while the job runs on (this viewer fell behind)"
    )))
}
