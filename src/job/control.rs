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
pub const SOCKET: &str = "control.sock";
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
        let rec = crate::job::settle::load(store, id)?;
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
                let rec = crate::job::settle::load(store, id)?;
                if rec.status.is_final() {
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
                let _ = crate::job::settle::load(store, id);
                Err(ended(id))
            }
        }
    }

    /// Appends `data` to the job's stdin, then closes it if `close`.
    pub fn stdin(&mut self, data: &[u8], close: bool) -> Result<()> {
        for chunk in data.chunks(MAX_CHUNK) {
            let deadline = Instant::now() + BUSY_WAIT;
            loop {
                let mut req = format!("stdin {}\n", chunk.len()).into_bytes();
                req.extend_from_slice(chunk);
                match self.call(&req) {
                    Err(Error::RateLimited(m)) if Instant::now() < deadline => {
                        let _ = m;
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    other => {
                        other?;
                        break;
                    }
                }
            }
        }
        if close {
            self.call(b"close\n")?;
        }
        Ok(())
    }

    /// Resizes the job's terminal.
    pub fn resize(&mut self, cols: u16, rows: u16) -> Result<()> {
        self.call(format!("resize {cols} {rows}\n").as_bytes())
    }

    /// Sends one request and reads its reply.
    fn call(&mut self, req: &[u8]) -> Result<()> {
        let lost = |e: std::io::Error| {
            Error::Conflict(format!("the job's supervisor did not answer: {e}"))
        };
        self.r.get_mut().write_all(req).map_err(lost)?;
        let mut line = String::new();
        self.r.read_line(&mut line).map_err(lost)?;
        let line = line.trim_end();
        if line == "ok" {
            return Ok(());
        }
        let rest = line
            .strip_prefix("err ")
            .unwrap_or("conflict the job ended");
        let (code, msg) = rest.split_once(' ').unwrap_or((rest, ""));
        let msg = msg.to_string();
        Err(match code {
            "busy" => Error::RateLimited(msg),
            "invalid" => Error::Invalid(msg),
            _ => Error::Conflict(msg),
        })
    }
}

fn ended(id: &JobId) -> Error {
    Error::Conflict(format!("job {id} has ended: its input is closed"))
}
