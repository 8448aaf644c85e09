//! `GET /v1/jobs/{id}/pty`: a terminal job over a WebSocket (RFC 6455). The session is the
//! supervisor's: this is one of its viewers, so a restart of the server ends no session.
//! - binary frames from the client: keystrokes (dropped with `?write=false`);
//! - text frames from the client: `{"type": "resize", "cols", "rows"}`;
//! - binary frames to the client: the terminal's raw output, every secret value masked,
//!   the recent output first (at least the last 64 KiB);
//! - a text frame to the client, last: `{"type": "exit", "status", "exitCode", "signal"}`.
//!
//! A client that stops reading gets at most [`MAX_BEHIND`] bytes queued (the WebSocket's
//! buffer and the socket's send buffer together), then is closed with 1008 (policy): the
//! job never waits for it. A frame that breaks RFC 6455 is answered with its close code
//! (1002, 1007 or 1009), never with a bare close of the connection.

use std::os::fd::AsFd;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use serde_json::{Value, json};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::protocol::{CloseFrame, Role, WebSocket, WebSocketConfig};
use tungstenite::{Message, error::Error as WsError};

use super::{Call, Failure, Reply};
use crate::api::app::App;
use crate::http::{Response, Upgrade, Upgraded};
use crate::job::control::{Frame, Viewer};
use crate::model::error::Error;
use crate::state::store::Store;

/// The most output queued for a client that does not read, the socket's share included.
pub const MAX_BEHIND: usize = 1 << 20;
/// The largest message a client may send.
const MAX_MESSAGE: usize = 1 << 20;

/// `POST /v1/jobs/{id}/pty/tickets`: a single-use ticket (valid 60 s) that opens this
/// job's terminal as `?ticket=T` instead of the bearer header, for a browser.
pub fn ticket(app: &App, call: &Call<'_>) -> Reply {
    let id = call.job()?;
    crate::api::request::no_body(call.body)?;
    let rec = crate::job::settle::settle_and_load(&app.store, &id)?;
    if rec.status.is_final() {
        return Err(Error::Conflict(format!("job {id} has ended")).into());
    }
    let (ticket, expires) = app.issue_ticket(format!("/v1/jobs/{id}/pty"), call.scoped)?;
    Ok(json!({"ticket": ticket, "expiresAt": crate::text::timefmt::rfc3339(expires)}))
}

/// The `101 Switching Protocols` that hands the connection to the job's terminal; a
/// version other than 13 is `426 Upgrade Required` naming the one spoken (RFC 6455 §4.4).
pub fn switch(app: &App, call: &Call<'_>) -> Result<Response, Failure> {
    let versions: Vec<&str> = call.head.all("sec-websocket-version").collect();
    if let [v] = versions[..]
        && v.trim() != "13"
    {
        let mut r = crate::api::answer::error_response(
            Error::Invalid(format!(
                "WebSocket version {:?} is not spoken here: send Sec-WebSocket-Version: 13",
                v.chars().take(16).collect::<String>()
            ))
            .into(),
        );
        r.status = 426;
        r.headers.push(("Sec-WebSocket-Version", "13".into()));
        return Ok(r);
    }
    let (accept, up) = open(app, call)?;
    let mut resp = Response::new(
        101,
        vec![
            ("Upgrade", "websocket".into()),
            ("Connection", "Upgrade".into()),
            ("Sec-WebSocket-Accept", accept),
        ],
        Vec::new(),
    );
    resp.upgrade = Some(up);
    Ok(resp)
}

/// True for a `Sec-WebSocket-Key` that is base64 of 16 bytes, as RFC 6455 §4.1 has it:
/// 22 characters, the last carrying two bits and four zeros, then `==`.
fn valid_key(k: &str) -> bool {
    let b = k.as_bytes();
    b.len() == 24
        && b[22..] == *b"=="
        && b[..22]
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'+' || c == b'/')
        && b"AQgw".contains(&b[21])
}

/// Checks the request and attaches to the job; returns the `Sec-WebSocket-Accept` value
/// and what takes the connection over after the 101.
pub fn open(app: &App, call: &Call<'_>) -> Result<(String, Upgrade), Failure> {
    let id = call.job()?;
    let rec = crate::job::settle::settle_and_load(&app.store, &id)?;
    let write = match call.query.get("write") {
        None | Some("true") => true,
        Some("false") => false,
        Some(v) => {
            return Err(Error::Invalid(format!("write must be true or false, got {v:?}")).into());
        }
    };
    let head = call.head;
    let has = |name: &str, token: &str| {
        head.all(name)
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    let keys: Vec<&str> = head.all("sec-websocket-key").map(str::trim).collect();
    let versions: Vec<&str> = head.all("sec-websocket-version").map(str::trim).collect();
    // A HEAD is answered as a GET that did not ask for the upgrade.
    let (true, true, true, true, true, &[key]) = (
        head.method == "GET",
        head.minor >= 1,
        has("upgrade", "websocket"),
        has("connection", "upgrade"),
        versions == ["13"],
        keys.as_slice(),
    ) else {
        return Err(Error::Invalid(
            "this route is a WebSocket: send an HTTP/1.1 GET with Upgrade: websocket, \
             Connection: Upgrade, Sec-WebSocket-Version: 13 and one Sec-WebSocket-Key"
                .into(),
        )
        .into());
    };
    if !valid_key(key) {
        return Err(Error::Invalid(
            "Sec-WebSocket-Key must be 16 random bytes in base64 (24 characters ending in ==)"
                .into(),
        )
        .into());
    }
    if rec.status.is_final() {
        return Err(Error::Conflict(format!("job {id} has ended")).into());
    }
    // A terminal holds its connection for as long as it is open: it counts among the
    // requests that wait, so that short requests always find a connection.
    let slot = app.wait_slot("close another terminal WebSocket first")?;
    let viewer = crate::job::control::Viewer::attach(&app.store, &id, write)?;
    let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
    let store = app.store.clone();
    let up = Upgrade::new(Box::new(move |conn| {
        let _slot = slot;
        session(conn, viewer, write, store, id)
    }));
    Ok((accept, up))
}

/// The connection under the WebSocket, counting what was written to the socket so that
/// what still waits in tungstenite's buffer is known.
struct Counted {
    conn: Upgraded,
    written: u64,
}

impl std::io::Read for Counted {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.conn.read(buf)
    }
}

impl std::io::Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.conn.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

type Ws = WebSocket<Counted>;

/// The output queue of a viewer: what was handed to the WebSocket and not yet to the
/// socket, which with the socket's own send buffer stays within [`MAX_BEHIND`].
struct Queue {
    handed: u64,
    /// What may wait in the WebSocket's buffer: [`MAX_BEHIND`] less the socket's.
    budget: u64,
}

impl Queue {
    /// Hands `msg` to `ws` (its frame counted against the budget); false when it does not
    /// fit, or the connection broke.
    fn send(&mut self, ws: &mut Ws, msg: Message) -> bool {
        let n = msg.len() as u64;
        // A server's frame: 2 bytes, and 2 or 8 more for a length over 125 or 65,535.
        let frame = n + match n {
            0..126 => 2,
            126..65_536 => 4,
            _ => 10,
        };
        let queued = self.handed.saturating_sub(ws.get_ref().written);
        if queued + frame > self.budget {
            return false;
        }
        self.handed += frame;
        match ws.write(msg) {
            Ok(()) => true,
            Err(WsError::Io(e)) => e.kind() == std::io::ErrorKind::WouldBlock,
            Err(_) => false,
        }
    }
}

/// What the kernel is asked to hold unsent for a viewer; the rest of [`MAX_BEHIND`] may
/// wait in the WebSocket's buffer.
const SOCKET_SEND_BUFFER: usize = 128 << 10;
/// Room for the close frame (and a pong) behind a full queue.
const CLOSE_ROOM: usize = 256;
/// How long a closing session waits for the client to take what is queued and the close
/// frame (a viewer that reads late still learns why it was closed).
const DRAIN: Duration = Duration::from_secs(30);
/// How long it then waits for the client's own close, reading what it sends meanwhile.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// How a session ends: the close code and reason sent, `None` when the client is gone.
type Ending = Option<(CloseCode, String)>;

fn session(conn: Upgraded, viewer: Viewer, write: bool, store: Store, id: crate::model::JobId) {
    if conn.set_nonblocking().is_err() {
        return;
    }
    // The kernel's share of the bound is its whole send buffer, overhead included.
    let kernel = conn
        .limit_send_buffer(SOCKET_SEND_BUFFER)
        .unwrap_or(SOCKET_SEND_BUFFER * 2);
    let budget = MAX_BEHIND.saturating_sub(kernel).max(64 << 10);
    let mut conn = conn;
    let read_ahead = std::mem::take(&mut conn.read_ahead);
    let cfg = WebSocketConfig::default()
        .write_buffer_size(0)
        .max_write_buffer_size(budget + CLOSE_ROOM)
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    let counted = Counted { conn, written: 0 };
    let mut ws = WebSocket::from_partially_read(counted, read_ahead, Role::Server, Some(cfg));
    let mut queue = Queue {
        handed: 0,
        budget: budget as u64,
    };
    let ending = serve(&mut ws, &mut queue, viewer, write, &store, &id);
    if let Some((code, why)) = ending {
        finish(ws, code, &why);
    }
}

/// The session's loop, until it ends; the viewer is detached when it returns, before the
/// close is sent (a slow client then holds no place among the job's viewers).
fn serve(
    ws: &mut Ws,
    queue: &mut Queue,
    mut viewer: Viewer,
    write: bool,
    store: &Store,
    id: &crate::model::JobId,
) -> Ending {
    let behind = || Some((CloseCode::Policy, "the client fell behind".to_string()));
    let ended = || Some((CloseCode::Normal, "the job ended".to_string()));
    let mut want_out = false;
    // The replay may have come with the attach's answer, and frames with the handshake:
    // both are read already, so both are looked at before any wait.
    let mut first = true;
    loop {
        let (client, supervisor) = if std::mem::take(&mut first) {
            (true, true)
        } else {
            let mut flags = PollFlags::POLLIN;
            if want_out {
                flags |= PollFlags::POLLOUT;
            }
            let mut fds = [
                PollFd::new(ws.get_ref().conn.as_fd(), flags),
                PollFd::new(viewer.fd(), PollFlags::POLLIN),
            ];
            if poll(&mut fds, PollTimeout::from(30_000u16)).is_err() {
                continue;
            }
            let r = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
            (r(&fds[0]), r(&fds[1]))
        };
        if supervisor {
            match viewer.frames() {
                Ok(Some(frames)) => {
                    for f in frames {
                        match f {
                            Frame::Out(b) => {
                                if !queue.send(ws, Message::Binary(b.into())) {
                                    return behind();
                                }
                            }
                            Frame::Exit(j) => {
                                if !queue.send(ws, Message::Text(j.into())) {
                                    return behind();
                                }
                                return ended();
                            }
                        }
                    }
                }
                Ok(None) | Err(_) => {
                    // Closed without an exit frame: the job ended meanwhile (its
                    // supervisor is gone), or this viewer fell behind.
                    return match crate::job::settle::settle_and_load(store, id) {
                        Ok(rec) if rec.status.is_final() => {
                            let exit = exit_frame(&rec).to_string();
                            if queue.send(ws, Message::Text(exit.into())) {
                                ended()
                            } else {
                                behind()
                            }
                        }
                        _ => behind(),
                    };
                }
            }
        }
        if client {
            loop {
                match ws.read() {
                    Ok(Message::Binary(b)) => {
                        if write && viewer.stdin(&b).is_err() {
                            return Some((CloseCode::Away, "the job's supervisor is gone".into()));
                        }
                    }
                    Ok(Message::Text(t)) => {
                        if let Some((cols, rows)) = resize_message(t.as_str())
                            && write
                        {
                            let _ = viewer.resize(cols, rows);
                        }
                    }
                    Ok(_) => {}
                    Err(WsError::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => return failed(&e),
                }
            }
        }
        match ws.flush() {
            Ok(()) => want_out = false,
            Err(WsError::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => want_out = true,
            Err(_) => return None,
        }
    }
}

/// The close owed to a client whose frames could not be read (RFC 6455 §7.4.1): 1002 for
/// a broken frame, 1007 for a text that is not UTF-8, 1009 for a message over the limit;
/// `None` when it closed or is gone (its close was answered as it was read).
fn failed(e: &WsError) -> Ending {
    let why = |s: String| s.chars().take(100).collect::<String>();
    match e {
        WsError::Protocol(tungstenite::error::ProtocolError::ResetWithoutClosingHandshake) => None,
        WsError::Protocol(p) => Some((CloseCode::Protocol, why(format!("protocol error: {p}")))),
        WsError::Utf8(_) => Some((
            CloseCode::Invalid,
            "a text frame that is not UTF-8".to_string(),
        )),
        WsError::Capacity(_) => Some((
            CloseCode::Size,
            format!("a message over {MAX_MESSAGE} bytes"),
        )),
        _ => None,
    }
}

/// Closes the WebSocket: the close frame after whatever is queued (within [`DRAIN`], so a
/// viewer that reads late still learns why), then the end of our side, then a moment for
/// the client's close (closing with its bytes unread could reset the connection and lose
/// our close frame).
fn finish(mut ws: Ws, code: CloseCode, why: &str) {
    let _ = ws.close(Some(CloseFrame {
        code,
        reason: why.to_string().into(),
    }));
    let wait = |ws: &Ws, flags: PollFlags, until: std::time::Instant| {
        let left = until.saturating_duration_since(std::time::Instant::now());
        let ms = left.as_millis().clamp(1, 100) as u16;
        let mut fds = [PollFd::new(ws.get_ref().conn.as_fd(), flags)];
        let _ = poll(&mut fds, PollTimeout::from(ms));
    };
    let deadline = std::time::Instant::now() + DRAIN;
    loop {
        match ws.flush() {
            Ok(()) | Err(WsError::ConnectionClosed) => break,
            Err(WsError::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if std::time::Instant::now() >= deadline {
                    return;
                }
                wait(&ws, PollFlags::POLLOUT, deadline);
            }
            Err(_) => return,
        }
    }
    let conn = &mut ws.get_mut().conn;
    conn.shutdown_write();
    let deadline = std::time::Instant::now() + CLOSE_WAIT;
    let mut buf = [0u8; 16 << 10];
    let mut budget: usize = 1 << 20;
    while std::time::Instant::now() < deadline && budget > 0 {
        match std::io::Read::read(conn, &mut buf) {
            Ok(0) => return,
            Ok(n) => budget = budget.saturating_sub(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                let ms = left.as_millis().clamp(1, 100) as u16;
                let mut fds = [PollFd::new(conn.as_fd(), PollFlags::POLLIN)];
                let _ = poll(&mut fds, PollTimeout::from(ms));
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// `{"type":"resize","cols","rows"}` with sides of 1 to 1000.
fn resize_message(t: &str) -> Option<(u16, u16)> {
    let v: Value = serde_json::from_str(t).ok()?;
    if v["type"] != "resize" {
        return None;
    }
    let side = |k: &str| {
        v[k].as_u64()
            .filter(|n| (1..=crate::model::spec::MAX_PTY_SIDE as u64).contains(n))
            .map(|n| n as u16)
    };
    Some((side("cols")?, side("rows")?))
}

fn exit_frame(rec: &crate::model::JobRecord) -> Value {
    json!({"type": "exit", "status": rec.status, "exitCode": rec.exit_code, "signal": rec.signal})
}
