//! An interactive job's control socket (`control.sock` in its folder, 0600): the
//! supervisor keeps the writing end of the job's stdin (a pipe, or the terminal's master)
//! and serves requests from the server and the CLI on it, without ever blocking the job.
//!
//! The protocol ([`crate::job::control`] is its client): a request is one line, a reply
//! one line, `ok` or `err CODE MESSAGE` (CODE: `conflict`, `busy`, `invalid`).
//! - `stdin N` then N raw bytes: appended to the job's input (at most [`MAX_PENDING`]
//!   bytes wait at any time; beyond that the reply is `busy` and nothing is taken);
//! - `close`: closes the job's stdin once what waits is written (on a terminal: sends
//!   the end-of-file character, ^D);
//! - `resize COLS ROWS`: sets the terminal's size.
//! - `attach rw` or `attach ro` (a terminal job only): the connection becomes a viewer.
//!   After `ok`, the supervisor sends `out N` + N bytes frames, first the recent output
//!   (the last [`REPLAY`] bytes at least, from a point between two escape sequences), then
//!   the terminal's output as it comes (raw, escapes kept, every secret that a terminal
//!   would draw masked cell by cell: [`crate::text::wire`]), and last `exit
//!   JSON` (`{"type":"exit","status","exitCode","signal"}`) before it closes. A viewer's
//!   requests (`stdin`, `resize`; `stdin` ignored for `ro`) get no reply. A viewer that
//!   falls [`MAX_VIEWER_BEHIND`] bytes behind is closed: the job never waits for one.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use nix::poll::{PollFd, PollFlags};

use crate::job::control::{MAX_CHUNK, MAX_LINE};

/// The most input waiting for the job to read it.
pub(super) const MAX_PENDING: usize = 1 << 20;
/// The most control connections at once; more are closed at once.
const MAX_CONNS: usize = 512;
/// The most viewers at once: the rest of [`MAX_CONNS`] stays free for requests, so that
/// viewers never lock the owner's input or resizing out.
const MAX_VIEWERS: usize = MAX_CONNS - 32;
/// The recent terminal output kept for a viewer that attaches (at least this much).
pub(super) const REPLAY: usize = 64 * 1024;
/// How far a viewer may fall behind before it is closed.
pub(super) const MAX_VIEWER_BEHIND: usize = 1 << 20;

/// A viewer's rights.
#[derive(Clone, Copy, PartialEq, Eq)]
enum View {
    None,
    ReadOnly,
    ReadWrite,
}

struct Conn {
    s: UnixStream,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    eof: bool,
    view: View,
}

pub(super) struct Control {
    listener: UnixListener,
    path: PathBuf,
    conns: Vec<Conn>,
    /// Where input goes: the pipe's write end, or a copy of the terminal's master.
    stdin: Option<OwnedFd>,
    pending: Vec<u8>,
    /// Closing was asked: stdin closes once `pending` is written.
    closing: bool,
    /// The job runs on a terminal (whose master `stdin` is).
    pub(super) tty: bool,
    /// The terminal's output as viewers get it: raw, secrets masked. Only while a viewer
    /// is attached (or the masker still holds bytes): nobody else reads the wire, and
    /// following the screen costs far more than storing the output.
    wire: Option<crate::text::wire::WireMasker>,
    /// What the wire masks, and the terminal's size, for a masker made when a viewer comes.
    values: Vec<Vec<u8>>,
    size: (u16, u16),
    /// The last output, for a viewer that attaches (between [`REPLAY`] and twice that):
    /// masked while `wire` is there, raw otherwise (masked when a viewer comes).
    replay: Vec<u8>,
    /// Offsets in `replay` between two escape sequences, where a replay may begin.
    cuts: std::collections::VecDeque<usize>,
}

impl Control {
    /// Listens on `path` (replacing a stale socket) for requests about the job whose
    /// input is `stdin`.
    pub(super) fn bind(
        path: &Path,
        stdin: OwnedFd,
        size: Option<(u16, u16)>,
        secrets: &[&[u8]],
    ) -> io::Result<Control> {
        let tty = size.is_some();
        let (cols, rows) = size.unwrap_or((80, 24));
        let _ = std::fs::remove_file(path);
        std::fs::write(path.with_file_name(crate::job::control::MARK), b"")?;
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        crate::os::spawn::set_nonblocking(&stdin)?;
        Ok(Control {
            listener,
            path: path.to_path_buf(),
            conns: Vec::new(),
            stdin: Some(stdin),
            pending: Vec::new(),
            closing: false,
            tty,
            wire: None,
            values: secrets.iter().map(|v| v.to_vec()).collect(),
            size: (cols, rows),
            replay: Vec::new(),
            cuts: std::collections::VecDeque::new(),
        })
    }

    /// The fds to poll, in the order [`Control::ready`] takes their events.
    pub(super) fn fds(&self) -> Vec<PollFd<'_>> {
        let mut v = vec![PollFd::new(self.listener.as_fd(), PollFlags::POLLIN)];
        if let Some(s) = &self.stdin
            && !self.pending.is_empty()
        {
            v.push(PollFd::new(s.as_fd(), PollFlags::POLLOUT));
        }
        for c in &self.conns {
            let mut f = PollFlags::empty();
            if !c.eof {
                f |= PollFlags::POLLIN;
            }
            if !c.out.is_empty() {
                f |= PollFlags::POLLOUT;
            }
            v.push(PollFd::new(c.s.as_fd(), f));
        }
        v
    }

    /// Acts on the events of [`Control::fds`] (same order, same state).
    pub(super) fn ready(&mut self, revents: &[PollFlags]) {
        let mut ev = revents.iter().copied();
        let listener = ev.next().unwrap_or(PollFlags::empty());
        if self.stdin.is_some() && !self.pending.is_empty() {
            let _ = ev.next();
            self.flush();
        }
        for i in 0..self.conns.len() {
            let e = ev.next().unwrap_or(PollFlags::empty());
            if e.is_empty() {
                continue;
            }
            self.serve(i);
        }
        self.conns.retain(|c| !(c.eof && c.out.is_empty()));
        if !listener.is_empty() {
            while let Ok((s, _)) = self.listener.accept() {
                if self.conns.len() >= MAX_CONNS || s.set_nonblocking(true).is_err() {
                    continue;
                }
                self.conns.push(Conn {
                    s,
                    inbuf: Vec::new(),
                    out: Vec::new(),
                    eof: false,
                    view: View::None,
                });
            }
        }
    }

    /// Reads, answers and writes for connection `i`.
    fn serve(&mut self, i: usize) {
        let mut buf = [0u8; 16 * 1024];
        loop {
            let c = &mut self.conns[i];
            if c.eof || c.inbuf.len() > MAX_LINE + MAX_CHUNK {
                break;
            }
            match c.s.read(&mut buf) {
                Ok(0) => c.eof = true,
                Ok(n) => c.inbuf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    c.eof = true;
                    c.out.clear();
                }
            }
        }
        while let Some(reply) = self.request(i) {
            let c = &mut self.conns[i];
            if c.view == View::None {
                c.out.extend_from_slice(reply.as_bytes());
            }
        }
        self.write_out(i);
    }

    /// Writes what connection `i` has waiting, as far as it takes it now.
    fn write_out(&mut self, i: usize) {
        let c = &mut self.conns[i];
        while !c.out.is_empty() {
            match c.s.write(&c.out) {
                Ok(n) => {
                    c.out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    c.out.clear();
                    c.eof = true;
                }
            }
        }
    }

    /// Takes one complete request from connection `i`'s input, and returns its reply.
    fn request(&mut self, i: usize) -> Option<String> {
        let c = &mut self.conns[i];
        let Some(nl) = c.inbuf.iter().position(|&b| b == b'\n') else {
            if c.inbuf.len() > MAX_LINE {
                c.inbuf.clear();
                c.eof = true;
                return Some("err invalid request line too long\n".into());
            }
            return None;
        };
        let line = String::from_utf8_lossy(&c.inbuf[..nl]).into_owned();
        let mut words = line.split(' ');
        let verb = words.next().unwrap_or("");
        let reply = match verb {
            "stdin" => {
                let n = match words.next().and_then(|w| w.parse::<usize>().ok()) {
                    Some(n) if n <= MAX_CHUNK => n,
                    _ => {
                        c.inbuf.clear();
                        c.eof = true;
                        return Some("err invalid bad stdin length\n".into());
                    }
                };
                if c.inbuf.len() < nl + 1 + n {
                    return None;
                }
                let data: Vec<u8> = c.inbuf.drain(..nl + 1 + n).skip(nl + 1).collect();
                if c.view == View::ReadOnly {
                    Ok(())
                } else {
                    self.input(&data)
                }
            }
            "attach" => {
                c.inbuf.drain(..=nl);
                let view = match words.next() {
                    Some("rw") => View::ReadWrite,
                    Some("ro") => View::ReadOnly,
                    _ => return Some("err invalid attach takes rw or ro\n".into()),
                };
                if !self.tty {
                    return Some("err conflict the job does not run on a terminal\n".into());
                }
                let viewers = self.conns.iter().filter(|c| c.view != View::None).count();
                if viewers >= MAX_VIEWERS {
                    return Some(format!(
                        "err busy {viewers} viewers are attached already, the most a terminal takes\n"
                    ));
                }
                self.start_masking();
                let c = &mut self.conns[i];
                c.view = view;
                c.out.extend_from_slice(b"ok\n");
                frame(&mut c.out, &self.replay);
                return Some(String::new());
            }
            "close" => {
                c.inbuf.drain(..=nl);
                self.close()
            }
            "resize" => {
                c.inbuf.drain(..=nl);
                let mut side = || words.next().and_then(|w| w.parse::<u16>().ok());
                match (side(), side()) {
                    (Some(cols), Some(rows)) => self.resize(cols, rows),
                    _ => Err("invalid resize takes COLS ROWS".to_string()),
                }
            }
            _ => {
                c.inbuf.clear();
                c.eof = true;
                Err("invalid unknown request".to_string())
            }
        };
        Some(match reply {
            Ok(()) => "ok\n".into(),
            Err(m) => format!("err {m}\n"),
        })
    }

    fn input(&mut self, data: &[u8]) -> Result<(), String> {
        if self.stdin.is_none() || self.closing {
            return Err("conflict the job's stdin is closed".into());
        }
        if self.pending.len() + data.len() > MAX_PENDING {
            return Err("busy the job has not read its earlier input yet".into());
        }
        self.pending.extend_from_slice(data);
        self.flush();
        Ok(())
    }

    fn close(&mut self) -> Result<(), String> {
        if self.stdin.is_none() || self.closing {
            return Err("conflict the job's stdin is closed".into());
        }
        if self.tty {
            // A terminal has no end: its end-of-file character ends a read instead.
            self.pending.push(0x04);
        }
        self.closing = true;
        self.flush();
        Ok(())
    }

    fn resize(&mut self, cols: u16, rows: u16) -> Result<(), String> {
        let max = crate::model::spec::MAX_PTY_SIDE;
        if !(1..=max).contains(&cols) || !(1..=max).contains(&rows) {
            return Err(format!("invalid cols and rows must be 1 to {max}"));
        }
        match (&self.stdin, self.tty) {
            (Some(m), true) => {
                crate::os::pty::resize(m, cols, rows)
                    .map_err(|e| format!("conflict the terminal could not be resized: {e}"))?;
                self.size = (cols, rows);
                if let Some(w) = &mut self.wire {
                    w.resize(cols, rows);
                }
                Ok(())
            }
            (None, true) => Err("conflict the terminal is closed".into()),
            (_, false) => Err("conflict the job does not run on a terminal".into()),
        }
    }

    /// Writes what waits, as far as the job takes it now.
    fn flush(&mut self) {
        let Some(fd) = &self.stdin else {
            self.pending.clear();
            return;
        };
        while !self.pending.is_empty() {
            match nix::unistd::write(fd, &self.pending) {
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::EAGAIN) => return,
                // The reader is gone (EPIPE), or the terminal hung up (EIO).
                Err(_) => {
                    self.pending.clear();
                    self.stdin = None;
                    return;
                }
            }
        }
        if self.closing && !self.tty {
            self.stdin = None;
        }
    }

    /// Masks these values too on the terminal wire from now on.
    pub(super) fn add_secrets(&mut self, values: &[&[u8]]) {
        self.values.extend(values.iter().map(|v| v.to_vec()));
        if let Some(w) = &mut self.wire {
            w.add_secrets(values);
        }
    }

    /// A viewer comes: the masker starts from the replay's first byte, which is where the
    /// viewer's terminal starts drawing too, and the replay becomes what it sends.
    fn start_masking(&mut self) {
        if self.wire.is_some() {
            return;
        }
        let values: Vec<&[u8]> = self.values.iter().map(Vec::as_slice).collect();
        let mut w = crate::text::wire::WireMasker::new(&values, self.size.0, self.size.1);
        let mut masked = Vec::with_capacity(self.replay.len());
        w.feed(&self.replay, &mut masked);
        self.replay = masked;
        self.cuts.clear();
        self.wire = Some(w);
    }

    /// The terminal's raw output: masked, kept for replay, and sent to every viewer.
    pub(super) fn output(&mut self, raw: &[u8], last: bool) {
        let Some(wire) = &mut self.wire else {
            // Nobody watches: kept raw for a viewer to come, from a line's start.
            self.replay.extend_from_slice(raw);
            if self.replay.len() > 2 * REPLAY {
                let want = self.replay.len() - REPLAY;
                let cut =
                    memchr::memchr(b'\n', &self.replay[want..]).map_or(want, |p| want + p + 1);
                self.replay.drain(..cut);
            }
            return;
        };
        let mut masked = Vec::with_capacity(raw.len());
        wire.feed(raw, &mut masked);
        if last {
            wire.finish(&mut masked);
        }
        let idle = wire.holding() == 0;
        let rest = wire.at_rest();
        if idle && !self.conns.iter().any(|c| c.view != View::None && !c.eof) {
            // The last viewer left: the masker stops until the next one.
            self.wire = None;
            self.cuts.clear();
        }
        if masked.is_empty() {
            return;
        }
        self.replay.extend_from_slice(&masked);
        if rest {
            self.cuts.push_back(self.replay.len());
        }
        if self.replay.len() > 2 * REPLAY {
            // From the last place between two sequences that keeps REPLAY bytes, so that a
            // reattach does not begin inside an escape (or, failing one, at a byte count).
            let want = self.replay.len() - REPLAY;
            let mut cut = want;
            while let Some(&c) = self.cuts.front() {
                if c > want {
                    break;
                }
                cut = c;
                self.cuts.pop_front();
            }
            self.replay.drain(..cut);
            for c in &mut self.cuts {
                *c -= cut;
            }
        }
        for i in 0..self.conns.len() {
            let c = &mut self.conns[i];
            if c.view == View::None || c.eof {
                continue;
            }
            if c.out.len() + masked.len() > MAX_VIEWER_BEHIND {
                // Fallen behind: closed, so that the job never waits for it.
                c.out.clear();
                c.eof = true;
                let _ = c.s.shutdown(std::net::Shutdown::Both);
                continue;
            }
            frame(&mut c.out, &masked);
            self.write_out(i);
        }
        self.conns.retain(|c| !(c.eof && c.out.is_empty()));
    }

    /// Tells every viewer how the job ended, gives them up to a second to take what is
    /// left, and removes the socket: from now on nobody can reach the job.
    pub(super) fn end(mut self, rec: &crate::model::JobRecord) {
        let _ = std::fs::remove_file(&self.path);
        let exit = serde_json::json!({
            "type": "exit",
            "status": rec.status,
            "exitCode": rec.exit_code,
            "signal": rec.signal,
        });
        let line = format!("exit {exit}\n");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        self.conns.retain(|c| c.view != View::None && !c.eof);
        for i in 0..self.conns.len() {
            self.conns[i].out.extend_from_slice(line.as_bytes());
            let _ = self.conns[i].s.set_nonblocking(false);
        }
        for c in &mut self.conns {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() || c.s.set_write_timeout(Some(left)).is_err() {
                break;
            }
            let _ = c.s.write_all(&c.out);
        }
    }

    /// The job's folder was renamed into place (the socket was bound in the staging
    /// folder, before the shell started): the socket's name is now in `dir`.
    pub(super) fn moved_to(&mut self, dir: &Path) {
        if let Some(name) = self.path.file_name() {
            self.path = dir.join(name);
        }
    }

    /// Removes the socket: from now on nobody can connect.
    pub(super) fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Appends an output frame for a viewer.
fn frame(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    out.extend_from_slice(format!("out {}\n", data.len()).as_bytes());
    out.extend_from_slice(data);
}
