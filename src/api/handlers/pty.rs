//! `GET /v1/jobs/{id}/pty`: a terminal job over a WebSocket (RFC 6455). The session is the
//! supervisor's: this is one of its viewers, so a restart of the server ends no session.
//! - binary frames from the client: keystrokes (dropped with `?write=false`);
//! - text frames from the client: `{"type": "resize", "cols", "rows"}`;
//! - binary frames to the client: the terminal's raw output, every secret value masked,
//!   the recent output first (at least the last 64 KiB);
//! - a text frame to the client, last: `{"type": "exit", "status", "exitCode", "signal"}`.
//!
//! A client that stops reading gets at most [`MAX_BEHIND`] bytes queued, then is closed
//! with 1008 (policy): the job never waits for it.

use std::os::fd::AsFd;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use serde_json::{Value, json};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::protocol::{CloseFrame, Role, WebSocket, WebSocketConfig};
use tungstenite::{Message, error::Error as WsError};

use super::{Call, Failure, Reply};
use crate::api::app::App;
use crate::api::http::{Response, Upgrade, Upgraded};
use crate::job::control::{Frame, Viewer};
use crate::model::error::Error;
use crate::state::store::Store;

/// The most output queued for a client that does not read.
pub const MAX_BEHIND: usize = 1 << 20;
/// The largest message a client may send.
const MAX_MESSAGE: usize = 1 << 20;

/// `POST /v1/jobs/{id}/pty/tickets`: a single-use ticket (valid 60 s) that opens this
/// job's terminal as `?ticket=T` instead of the bearer header, for a browser.
pub fn ticket(app: &App, call: &Call<'_>) -> Reply {
    let id = call.job()?;
    crate::api::request::no_body(call.body)?;
    let rec = crate::job::settle::load(&app.store, &id)?;
    if rec.status.is_final() {
        return Err(Error::Conflict(format!("job {id} has ended")).into());
    }
    let (ticket, expires) = app.issue_ticket(format!("/v1/jobs/{id}/pty"), call.scoped)?;
    Ok(json!({"ticket": ticket, "expiresAt": crate::text::timefmt::rfc3339(expires)}).into())
}

/// The table's handler: only reached without an upgrade (see [`switch`]).
pub fn get(app: &App, call: &Call<'_>) -> Reply {
    open(app, call).map(|_| Value::Null.into())
}

/// The `101 Switching Protocols` that hands the connection to the job's terminal.
pub fn switch(app: &App, call: &Call<'_>) -> Result<Response, Failure> {
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

/// Checks the request and attaches to the job; returns the `Sec-WebSocket-Accept` value
/// and what takes the connection over after the 101.
pub fn open(app: &App, call: &Call<'_>) -> Result<(String, Upgrade), Failure> {
    let id = call.job()?;
    let rec = crate::job::settle::load(&app.store, &id)?;
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
    let key = head.header("sec-websocket-key").map(str::trim);
    let (true, true, true, Some(key)) = (
        has("upgrade", "websocket"),
        has("connection", "upgrade"),
        head.header("sec-websocket-version").map(str::trim) == Some("13"),
        key,
    ) else {
        return Err(Error::Invalid(
            "this route is a WebSocket: send Upgrade: websocket, Connection: Upgrade, \
             Sec-WebSocket-Version: 13 and a Sec-WebSocket-Key"
                .into(),
        )
        .into());
    };
    if rec.status.is_final() {
        return Err(Error::Conflict(format!("job {id} has ended")).into());
    }
    let viewer = crate::job::control::Viewer::attach(&app.store, &id, write)?;
    let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
    let store = app.store.clone();
    let up = Upgrade::new(Box::new(move |conn| {
        session(conn, viewer, write, store, id)
    }));
    Ok((accept, up))
}

/// The session: output to the client, keystrokes and resizes to the supervisor.
fn session(
    mut conn: Upgraded,
    mut viewer: Viewer,
    write: bool,
    store: Store,
    id: crate::model::JobId,
) {
    if conn.set_nonblocking().is_err() {
        return;
    }
    let read_ahead = std::mem::take(&mut conn.read_ahead);
    let cfg = WebSocketConfig::default()
        .write_buffer_size(0)
        .max_write_buffer_size(MAX_BEHIND)
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    let mut ws = WebSocket::from_partially_read(conn, read_ahead, Role::Server, Some(cfg));
    let mut want_out = false;
    // The replay may have come with the attach's answer, already read.
    let mut pending = true;
    loop {
        let (client, supervisor) = if std::mem::take(&mut pending) {
            (false, true)
        } else {
            let mut flags = PollFlags::POLLIN;
            if want_out {
                flags |= PollFlags::POLLOUT;
            }
            let mut fds = [
                PollFd::new(ws.get_ref().as_fd(), flags),
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
                        let sent = match f {
                            Frame::Out(b) => ws.write(Message::Binary(b.into())),
                            Frame::Exit(j) => {
                                let _ = ws.write(Message::Text(j.into()));
                                return finish(ws, CloseCode::Normal, "the job ended");
                            }
                        };
                        if sent.is_err() {
                            return finish(ws, CloseCode::Policy, "the client fell behind");
                        }
                    }
                }
                Ok(None) | Err(_) => {
                    // Closed without an exit frame: the job ended meanwhile (its
                    // supervisor is gone), or this viewer fell behind.
                    return match crate::job::settle::load(&store, &id) {
                        Ok(rec) if rec.status.is_final() => {
                            let _ = ws.write(Message::Text(exit_frame(&rec).to_string().into()));
                            finish(ws, CloseCode::Normal, "the job ended")
                        }
                        _ => finish(ws, CloseCode::Policy, "the client fell behind"),
                    };
                }
            }
        }
        if client {
            loop {
                match ws.read() {
                    Ok(Message::Binary(b)) => {
                        if write && viewer.stdin(&b).is_err() {
                            return finish(ws, CloseCode::Away, "the job's supervisor is gone");
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
                    Err(_) => return,
                }
            }
        }
        match ws.flush() {
            Ok(()) => want_out = false,
            Err(WsError::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => want_out = true,
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

/// Sends a close frame, and gives the client a moment to take what is queued.
fn finish(mut ws: WebSocket<Upgraded>, code: CloseCode, why: &str) {
    let _ = ws.close(Some(CloseFrame {
        code,
        reason: why.to_string().into(),
    }));
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < deadline {
        match ws.flush() {
            Ok(()) => break,
            Err(WsError::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let mut fds = [PollFd::new(ws.get_ref().as_fd(), PollFlags::POLLOUT)];
                let _ = poll(&mut fds, PollTimeout::from(100u16));
            }
            Err(_) => break,
        }
    }
}
