//! The client side of an interactive job's control socket (see the supervisor's
//! `control` module for the protocol): what the server's stdin and resize routes and the
//! CLI use. Talking to the supervisor directly, it needs no server.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::model::JobId;
use crate::model::error::{Error, Result};
use crate::state::store::Store;

/// The socket's name in the job's folder.
pub const SOCKET: &str = crate::state::layout::CONTROL_SOCKET;
/// An empty file beside it, kept after the job ends: the job was interactive.
pub const MARK: &str = crate::state::layout::INTERACTIVE_MARK;
/// The longest request line.
pub const MAX_LINE: usize = 256;
/// The most input bytes in one request; more is sent as several.
pub const MAX_CHUNK: usize = 64 * 1024;
/// How long a request waits for a job that does not read its input before giving up.
pub const BUSY_WAIT: Duration = Duration::from_secs(10);
/// How long the supervisor may take to answer one request.
const REPLY_WAIT: Duration = Duration::from_secs(10);

/// Where the job's control socket is.
pub fn socket_path(store: &Store, id: &JobId) -> PathBuf {
    store.job_dir(id).join(SOCKET)
}

/// A connection to a running interactive job's supervisor.
pub struct Control {
    r: BufReader<UnixStream>,
}

impl Control {
    /// Connects; a job that ended, or is not interactive, is `conflict`.
    pub fn connect(store: &Store, id: &JobId) -> Result<Control> {
        let rec = crate::job::settle::settle_and_load(store, id)?;
        if rec.status.is_final() {
            return Err(ended(id));
        }
        let path = socket_path(store, id);
        match UnixStream::connect(&path) {
            Ok(s) => {
                s.set_read_timeout(Some(REPLY_WAIT))
                    .and_then(|()| s.set_write_timeout(Some(REPLY_WAIT)))
                    .map_err(|e| Error::io("control socket", e))?;
                Ok(Control {
                    r: BufReader::new(s),
                })
            }
            Err(_) if !path.exists() => {
                let rec = crate::job::settle::settle_and_load(store, id)?;
                // An interactive job that is ending has removed its socket already.
                if rec.status.is_final() || store.job_dir(id).join(MARK).exists() {
                    Err(ended(id))
                } else {
                    Err(Error::Conflict(format!(
                        "job {id} is not interactive: start it with \"interactive\": true \
                         (or a \"pty\") to write to it"
                    )))
                }
            }
            // The socket is there but nobody listens: the supervisor is gone.
            Err(_) => {
                let _ = crate::job::settle::settle_and_load(store, id);
                Err(ended(id))
            }
        }
    }

    /// Appends `data` to the job's stdin, then closes it if `close`. Each chunk waits up to
    /// [`BUSY_WAIT`] for the job to make room; an error leaves the chunks before it
    /// delivered (a caller that must know how many sends with [`Control::stdin_chunk`]).
    pub fn stdin(&mut self, data: &[u8], close: bool) -> Result<()> {
        for chunk in data.chunks(MAX_CHUNK) {
            self.stdin_chunk(chunk, Instant::now() + BUSY_WAIT)?;
        }
        if close {
            self.close()?;
        }
        Ok(())
    }

    /// Appends one chunk of at most [`MAX_CHUNK`] bytes to the job's stdin, whole or not
    /// at all: while the supervisor holds as much unread input as it keeps, waits for the
    /// job to read some, until `deadline` (then `rate_limited`, nothing of it taken).
    pub fn stdin_chunk(&mut self, chunk: &[u8], deadline: Instant) -> Result<()> {
        if chunk.len() > MAX_CHUNK {
            return Err(Error::Internal(format!(
                "a stdin chunk of {} bytes is over {MAX_CHUNK}",
                chunk.len()
            )));
        }
        let mut req = Vec::with_capacity(chunk.len() + 16);
        req.extend_from_slice(format!("stdin {}\n", chunk.len()).as_bytes());
        req.extend_from_slice(chunk);
        // The supervisor makes room as fast as the job reads: look often at first, then
        // every 10 ms.
        let mut nap = Duration::from_millis(1);
        loop {
            match self.call(&req) {
                Err(Error::RateLimited(_)) if Instant::now() < deadline => {
                    std::thread::sleep(nap.min(deadline.saturating_duration_since(Instant::now())));
                    nap = (nap * 2).min(Duration::from_millis(10));
                }
                other => return other,
            }
        }
    }

    /// Closes the job's stdin once what it was sent is written (on a terminal: sends ^D).
    pub fn close(&mut self) -> Result<()> {
        match self.call_raw(b"close\n") {
            Ok(reply) => reply,
            // The supervisor went away between the input and the close: the job ended, and
            // its stdin with it, which is what was asked.
            Err(_) => Ok(()),
        }
    }

    /// Resizes the job's terminal.
    pub fn resize(&mut self, cols: u16, rows: u16) -> Result<()> {
        self.call(format!("resize {cols} {rows}\n").as_bytes())
    }

    /// Sends one request and reads its reply.
    fn call(&mut self, req: &[u8]) -> Result<()> {
        self.call_raw(req).unwrap_or_else(|e| {
            Err(Error::Conflict(format!(
                "the job's supervisor did not answer: {e}"
            )))
        })
    }

    /// [`Control::call`], telling a supervisor that is gone (`Err`) from its reply.
    fn call_raw(&mut self, req: &[u8]) -> std::io::Result<Result<()>> {
        self.r.get_mut().write_all(req)?;
        let mut line = String::new();
        if self.r.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let line = line.trim_end();
        if line == "ok" {
            return Ok(Ok(()));
        }
        let rest = line
            .strip_prefix("err ")
            .unwrap_or("conflict the job ended");
        let (code, msg) = rest.split_once(' ').unwrap_or((rest, ""));
        let msg = msg.to_string();
        Ok(Err(match code {
            "busy" => Error::RateLimited(msg),
            "invalid" => Error::Invalid(msg),
            _ => Error::Conflict(msg),
        }))
    }
}

fn ended(id: &JobId) -> Error {
    Error::Conflict(format!("job {id} has ended: its input is closed"))
}

/// What a viewer gets from the supervisor.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// Terminal output: raw, every secret value masked.
    Out(Vec<u8>),
    /// The job ended: `{"type":"exit","status","exitCode","signal"}`.
    Exit(String),
}

/// A terminal job's viewer: output frames in, keystrokes and resizes out.
pub struct Viewer {
    s: UnixStream,
    inbuf: Vec<u8>,
}

impl Viewer {
    /// Attaches to a running terminal job (`write`: keystrokes are taken). The first
    /// frames are the recent output.
    pub fn attach(store: &Store, id: &JobId, write: bool) -> Result<Viewer> {
        let c = Control::connect(store, id)?;
        let mut r = c.r;
        r.get_mut()
            .write_all(if write {
                b"attach rw\n"
            } else {
                b"attach ro\n"
            })
            .map_err(|e| Error::Conflict(format!("the job's supervisor did not answer: {e}")))?;
        let mut line = String::new();
        r.read_line(&mut line)
            .map_err(|e| Error::Conflict(format!("the job's supervisor did not answer: {e}")))?;
        if line.trim_end() != "ok" {
            let rest = line
                .trim_end()
                .strip_prefix("err ")
                .unwrap_or("conflict the job ended");
            let (code, msg) = rest.split_once(' ').unwrap_or((rest, ""));
            return Err(match code {
                "invalid" => Error::Invalid(msg.to_string()),
                _ => Error::Conflict(msg.to_string()),
            });
        }
        let inbuf = r.buffer().to_vec();
        let s = r.into_inner();
        s.set_nonblocking(true)
            .map_err(|e| Error::io("control socket", e))?;
        Ok(Viewer { s, inbuf })
    }

    /// The socket, to poll for input.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.s.as_fd()
    }

    /// Reads what is there and returns the complete frames; `Ok(None)` once the supervisor
    /// closed the connection (after an exit frame: the job ended; without one: this viewer
    /// fell too far behind, or the supervisor is gone).
    pub fn frames(&mut self) -> std::io::Result<Option<Vec<Frame>>> {
        let mut closed = false;
        let mut buf = [0u8; 64 * 1024];
        loop {
            match std::io::Read::read(&mut self.s, &mut buf) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => {
                    self.inbuf.extend_from_slice(&buf[..n]);
                    if self.inbuf.len() > 4 * MAX_CHUNK + (1 << 20) {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        let frames = self.parse();
        if closed && frames.is_empty() {
            return Ok(None);
        }
        Ok(Some(frames))
    }

    /// The complete frames at the front of the input.
    pub fn parse(&mut self) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Some(nl) = self.inbuf.iter().position(|&b| b == b'\n') {
            let line = String::from_utf8_lossy(&self.inbuf[..nl]).into_owned();
            if let Some(n) = line.strip_prefix("out ") {
                let Ok(n) = n.parse::<usize>() else {
                    self.inbuf.clear();
                    break;
                };
                if self.inbuf.len() < nl + 1 + n {
                    break;
                }
                let data: Vec<u8> = self.inbuf.drain(..nl + 1 + n).skip(nl + 1).collect();
                frames.push(Frame::Out(data));
            } else {
                self.inbuf.drain(..=nl);
                if let Some(j) = line.strip_prefix("exit ") {
                    frames.push(Frame::Exit(j.to_string()));
                }
            }
        }
        frames
    }

    /// Sends keystrokes (ignored for a read-only viewer).
    pub fn stdin(&mut self, data: &[u8]) -> std::io::Result<()> {
        for chunk in data.chunks(MAX_CHUNK) {
            let mut req = format!("stdin {}\n", chunk.len()).into_bytes();
            req.extend_from_slice(chunk);
            self.send(&req)?;
        }
        Ok(())
    }

    /// Resizes the terminal.
    pub fn resize(&mut self, cols: u16, rows: u16) -> std::io::Result<()> {
        self.send(format!("resize {cols} {rows}\n").as_bytes())
    }

    /// Writes a whole request, waiting for room up to [`REPLY_WAIT`].
    fn send(&mut self, mut req: &[u8]) -> std::io::Result<()> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let deadline = Instant::now() + REPLY_WAIT;
        while !req.is_empty() {
            match self.s.write(req) {
                Ok(n) => req = &req[n..],
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(std::io::ErrorKind::TimedOut.into());
                    }
                    let ms = PollTimeout::try_from(left.as_millis().min(1000) as i32)
                        .unwrap_or(PollTimeout::MAX);
                    let mut fds = [PollFd::new(self.fd(), PollFlags::POLLOUT)];
                    let _ = poll(&mut fds, ms);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}
