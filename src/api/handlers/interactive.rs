//! Interactive jobs: their stdin and their terminal's size, through the job's supervisor.

use std::io::Read;
use std::time::Instant;

use serde_json::json;

use super::{Call, Failure, Reply};
use crate::api::app::App;
use crate::api::request;
use crate::http::{Fault, fault_of};
use crate::job::control::{BUSY_WAIT, Control, MAX_CHUNK};
use crate::model::error::Error;

/// `POST /v1/jobs/{id}/stdin[?close=true]`: the raw body, appended to the job's stdin as
/// it arrives, at most [`MAX_CHUNK`] at a time (never held whole). Each is taken whole or not at
/// all, and waits up to [`BUSY_WAIT`] for the job to read what waits before it; so an
/// answer is `ok` (all of it delivered), or an error that says how many of the body's
/// first bytes were (`delivered`): a client resends from there, and nothing is doubled.
pub fn stdin(app: &App, call: &Call<'_>, body: &mut (dyn Read + Send)) -> Reply {
    let mut delivered = 0u64;
    write_stdin(app, call, body, &mut delivered).map_err(|err| {
        let mut f = Failure::from(err);
        f.extra.insert("delivered".into(), delivered.into());
        // The rest of the body is not read: the connection cannot carry another request.
        f.close = delivered > 0;
        f
    })?;
    Ok(json!({"ok": true}))
}

/// The most a job's input may be in one request: `--max-body`, as for other bodies.
pub fn max_input(app: &App) -> u64 {
    app.max_body
}

fn write_stdin(
    app: &App,
    call: &Call<'_>,
    body: &mut (dyn Read + Send),
    delivered: &mut u64,
) -> Result<(), Error> {
    let id = call.job()?;
    let close = match call.query.get("close") {
        None | Some("false") => false,
        Some("true") => true,
        Some(v) => {
            return Err(Error::Invalid(format!(
                "close must be true or false, got {v:?}"
            )));
        }
    };
    let mut c = Control::connect(&app.store, &id)?;
    let mut buf = vec![0u8; MAX_CHUNK];
    loop {
        let n = fill(body, &mut buf).map_err(|e| body_error(&e, *delivered))?;
        if n == 0 {
            break;
        }
        c.stdin_chunk(&buf[..n], Instant::now() + BUSY_WAIT)
            .map_err(|e| partly(e, *delivered))?;
        *delivered += n as u64;
    }
    if close {
        c.close().map_err(|e| partly(e, *delivered))?;
    }
    Ok(())
}

/// Reads what the body has now (waiting for at least a byte), 0 at its end: input goes to
/// the job as it arrives, not once a whole chunk has.
fn fill(body: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match body.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            r => return r,
        }
    }
}

/// What the delivery so far was, for a message.
fn so_far(delivered: u64) -> String {
    match delivered {
        0 => "nothing of the body was delivered".into(),
        n => format!(
            "the first {n} bytes of the body were delivered (\"delivered\"), the rest was not: \
             send the rest, from byte {n}, again"
        ),
    }
}

/// An error of the job's side, worded with what was delivered before it.
fn partly(e: Error, delivered: u64) -> Error {
    match e {
        Error::RateLimited(_) => Error::RateLimited(format!(
            "the job has not read its input for {} s (its supervisor holds 1 MiB of it \
             unread); {}; retry once the job reads",
            BUSY_WAIT.as_secs(),
            so_far(delivered)
        )),
        Error::Conflict(m) if delivered > 0 => {
            Error::Conflict(format!("{m}; {}", so_far(delivered)))
        }
        e => e,
    }
}

/// The error of a body that could not be read to its end.
fn body_error(e: &std::io::Error, delivered: u64) -> Error {
    let tail = so_far(delivered);
    match fault_of(e) {
        Some(Fault::TooLarge(m)) => Error::TooLarge(format!("{m}; {tail}")),
        Some(Fault::TooSlow(m)) => Error::Timeout(format!("{m}; {tail}")),
        _ => Error::Invalid(format!("reading the body: {e}; {tail}")),
    }
}

/// `POST /v1/jobs/{id}/resize` `{"cols", "rows"}`.
pub fn resize(app: &App, call: &Call<'_>) -> Reply {
    let id = call.job()?;
    crate::job::settle::settle_and_load(&app.store, &id)?;
    let size = request::resize_body(call.body)?;
    let mut c = Control::connect(&app.store, &id)?;
    c.resize(size.cols, size.rows)?;
    Ok(json!({"ok": true}))
}
