//! The launcher ⇄ supervisor handshake, in one place:
//! - the launcher passes the job's (locked) lock on [`LOCK_FD`] and its spec, a memory
//!   file, on [`SPEC_FD`] (stdin, when the job has one, is another memory file on 0);
//! - the supervisor names itself first (`pid N`, right after it detached, so a launcher
//!   can continue it if the job stops it before it answers), then answers one line on its
//!   stdout, [`Ready::Ok`] once the shell runs or [`Ready::Err`] with the reason;
//! - the same pipe then stays open as the change channel ([`JobEvents`]): a byte per
//!   stored chunk of output, EOF once the final record is written, so the launcher learns
//!   of the end without watching files.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::time::Duration;

/// The fd on which the launcher hands the (already locked) job lock to the supervisor.
pub const LOCK_FD: i32 = 3;
/// The fd of the memory file holding the job's [`crate::model::spec::Spec`].
pub const SPEC_FD: i32 = 4;

/// How often a launcher waiting for the ready line looks after the supervisor.
pub const NUDGE_EVERY: Duration = Duration::from_millis(200);

/// How long a launcher waits for the ready line at most.
pub const READY_WAIT: Duration = Duration::from_secs(30);

/// The longest ready line read; anything longer is cut.
const MAX_LINE: usize = 4096;

/// The supervisor's answer to its launcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ready {
    /// The shell runs; the record names its pid.
    Ok,
    /// The job could not be started; the reason, for the caller.
    Err(String),
}

impl Ready {
    /// Sends the answer as one line (`ok`, or `err <reason>` with line breaks flattened).
    pub fn send(&self, out: &mut impl Write) -> io::Result<()> {
        match self {
            Ready::Ok => out.write_all(b"ok\n")?,
            Ready::Err(m) => writeln!(out, "err {}", m.replace(['\n', '\r'], " "))?,
        }
        out.flush()
    }

    /// Tells the launcher the detached supervisor's pid.
    pub fn send_pid(out: &mut impl Write, pid: u32) -> io::Result<()> {
        writeln!(out, "pid {pid}")?;
        out.flush()
    }

    /// Reads the answer (what follows its line belongs to the change channel: the second
    /// value says whether some of that was read with it); a channel that closes first is
    /// an error without a word. Gives up at `deadline`, calling `waiting` with the
    /// supervisor's pid (once it named itself) every [`NUDGE_EVERY`] meanwhile, to continue
    /// a supervisor that something stopped. Reads as much as is there at once: a byte at
    /// a time cost two syscalls per byte on every start's path.
    pub fn receive_within<R: Read + AsFd>(
        input: &mut R,
        deadline: std::time::Instant,
        waiting: &mut dyn FnMut(Option<i32>),
    ) -> (Ready, bool) {
        let mut line: Vec<u8> = Vec::new();
        let mut buf = [0u8; 256];
        let mut pid = None;
        loop {
            // Whole lines first: the pid line, then the answer.
            while let Some(end) = line.iter().position(|&b| b == b'\n') {
                let rest = line.split_off(end + 1);
                line.pop();
                match std::str::from_utf8(&line)
                    .ok()
                    .and_then(|l| l.strip_prefix("pid "))
                {
                    Some(p) => {
                        pid = p.parse().ok();
                        line = rest;
                    }
                    None => return (Self::from_line(&line), !rest.is_empty()),
                }
            }
            if line.len() >= MAX_LINE {
                line.truncate(MAX_LINE);
                break;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return (
                    Ready::Err("the supervisor did not answer in time (stopped or starved)".into()),
                    false,
                );
            }
            match crate::os::poll::readable(&*input, left.min(NUDGE_EVERY)) {
                Ok(true) => {}
                Ok(false) => {
                    waiting(pid);
                    continue;
                }
                Err(_) => break,
            }
            match input.read(&mut buf) {
                Ok(n) if n > 0 => line.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        (Self::from_line(&line), false)
    }

    fn from_line(line: &[u8]) -> Ready {
        let line = String::from_utf8_lossy(line);
        match line.as_ref() {
            "ok" => Ready::Ok,
            l => Ready::Err(
                l.strip_prefix("err ")
                    .unwrap_or("the supervisor exited without a word")
                    .to_string(),
            ),
        }
    }
}

/// The supervisor's side of the change channel: its stdout, duplicated and non-blocking,
/// so a launcher that stopped reading never blocks the job.
pub fn events_out() -> Option<File> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let file = File::from(io::stdout().as_fd().try_clone_to_owned().ok()?);
    fcntl(&file, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).ok()?;
    Some(file)
}

/// The launcher's side of the change channel for a job it started: readable when output
/// was stored, at EOF once the final record is written.
pub struct JobEvents {
    pipe: Option<File>,
    /// Bytes of the channel were read with the ready line: the first wait returns at once.
    pending: bool,
}

impl JobEvents {
    /// A channel on the supervisor's stdout (none: callers fall back to reading records).
    pub fn new(pipe: Option<File>) -> JobEvents {
        JobEvents {
            pipe,
            pending: false,
        }
    }

    /// [`JobEvents::new`], for a channel of which something was already read.
    pub fn with_pending(pipe: Option<File>, pending: bool) -> JobEvents {
        JobEvents { pipe, pending }
    }

    /// Waits up to `timeout` for the end (the channel's EOF), reading past what tells of
    /// stored output; false if the time ran out first. After the end (or if the channel
    /// broke) it returns true at once, so callers re-read the record. For a waiter that
    /// prints nothing: a flood of output would otherwise wake it for every chunk stored.
    pub fn wait_end(&mut self, timeout: Duration) -> bool {
        self.pending = false;
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let Some(pipe) = &mut self.pipe else {
                return true;
            };
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match crate::os::poll::readable(&*pipe, left) {
                Ok(false) => return false,
                Ok(true) => {
                    let mut buf = [0u8; 4096];
                    match pipe.read(&mut buf) {
                        Ok(n) if n > 0 => {}
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        _ => self.pipe = None,
                    }
                }
                Err(_) => self.pipe = None,
            }
        }
    }

    /// Waits up to `timeout` for something to happen; false if nothing did. After the end
    /// (or if the channel broke) it returns true at once, so callers re-read the record.
    pub fn wait(&mut self, timeout: Duration) -> bool {
        if std::mem::take(&mut self.pending) {
            return true;
        }
        let Some(pipe) = &mut self.pipe else {
            return true;
        };
        match crate::os::poll::readable(&*pipe, timeout) {
            Ok(false) => false,
            Ok(true) => {
                let mut buf = [0u8; 4096];
                if !matches!(pipe.read(&mut buf), Ok(n) if n > 0) {
                    self.pipe = None;
                }
                true
            }
            Err(_) => {
                self.pipe = None;
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a launcher reads from a pipe holding `bytes`, then closed.
    fn received(bytes: &[u8]) -> Ready {
        let (mut r, mut w) = std::io::pipe().unwrap();
        w.write_all(bytes).unwrap();
        drop(w);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        Ready::receive_within(&mut r, deadline, &mut |_| {}).0
    }

    #[test]
    fn ready_lines_round_trip() {
        for r in [Ready::Ok, Ready::Err("cwd /x: gone\nreally".into())] {
            let mut buf = b"pid 42\n".to_vec();
            r.send(&mut buf).unwrap();
            assert_eq!(buf.iter().filter(|&&b| b == b'\n').count(), 2);
            buf.extend_from_slice(b"trailing channel bytes");
            let got = received(&buf);
            match (&r, &got) {
                (Ready::Ok, Ready::Ok) => {}
                (Ready::Err(_), Ready::Err(m)) => assert_eq!(m, "cwd /x: gone really"),
                _ => panic!("{r:?} came back as {got:?}"),
            }
        }
        assert_eq!(
            received(b""),
            Ready::Err("the supervisor exited without a word".into())
        );
        assert_eq!(received(b"pid 7\npid 8\nok\n"), Ready::Ok);
        assert_eq!(
            received(b"pid 7\n"),
            Ready::Err("the supervisor exited without a word".into())
        );
    }

    #[test]
    fn channel_bytes_read_with_the_answer_are_not_lost() {
        let (mut r, mut w) = std::io::pipe().unwrap();
        w.write_all(b"pid 42\nok\nx").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let (ready, extra) = Ready::receive_within(&mut r, deadline, &mut |_| {});
        assert_eq!((ready, extra), (Ready::Ok, true));
        let mut ev =
            JobEvents::with_pending(Some(File::from(std::os::fd::OwnedFd::from(r))), extra);
        // Returns at once for the byte already read, then waits for more.
        assert!(ev.wait(Duration::from_secs(5)));
        assert!(!ev.wait(Duration::from_millis(50)));
        drop(w);
        assert!(ev.wait(Duration::from_secs(5)));
    }

    #[test]
    fn waiting_for_the_end_reads_past_stored_output() {
        let (r, mut w) = std::io::pipe().unwrap();
        let mut ev = JobEvents::with_pending(Some(File::from(std::os::fd::OwnedFd::from(r))), true);
        // A flood of "output stored" bytes, more than one read takes: not the end.
        w.write_all(&[b'.'; 10_000]).unwrap();
        let t = std::time::Instant::now();
        assert!(!ev.wait_end(Duration::from_millis(100)));
        assert!(t.elapsed() >= Duration::from_millis(100));
        // The writer goes on while the waiter waits; the end is its close, and only that.
        let closed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&closed);
        let writer = std::thread::spawn(move || {
            for _ in 0..20 {
                w.write_all(b".").unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            drop(w);
        });
        assert!(ev.wait_end(Duration::from_secs(10)));
        assert!(closed.load(std::sync::atomic::Ordering::SeqCst));
        writer.join().unwrap();
        // Once ended, at once.
        assert!(ev.wait_end(Duration::from_secs(10)));
    }
}
