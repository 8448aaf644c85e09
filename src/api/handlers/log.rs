//! `GET /v1/jobs/{id}/log`: the whole stored output as plain text, sent from output.log as
//! it is on disk (never held in memory); one byte range of it on request (`Range`); or,
//! with `?follow=true`, the log from its start and then each new piece as it is stored,
//! chunked, until the job ends. `POST /v1/jobs/{id}/log/tickets` mints the ticket a
//! browser page follows it with, without the bearer header.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::{Answer, Call, Reply};
use crate::api::answer::error_response;
use crate::api::app::{App, WaitSlot};
use crate::api::request::{Wanted, byte_range};
use crate::api::waits::{Hub, Kind, RECHECK, Watch};
use crate::http::{BodyOut, Response, Source, Streamed};
use crate::model::JobId;
use crate::model::error::{Error, Result};
use crate::state::store::Store;

const TEXT: &str = "text/plain; charset=utf-8";

/// `POST /v1/jobs/{id}/log/tickets`: a single-use ticket (valid 60 s) that opens this
/// job's followed log as `?follow=true&ticket=T`, for a browser page.
pub fn ticket(app: &App, call: &Call<'_>) -> Reply {
    let id = call.job()?;
    crate::api::request::no_body(call.body)?;
    // An unknown job is 404 now, not when the ticket is used.
    crate::job::settle::settle_and_load(&app.store, &id)?;
    let (ticket, expires) = app.issue_ticket(format!("/v1/jobs/{id}/log"), call.scoped)?;
    Ok(serde_json::json!({"ticket": ticket, "expiresAt": crate::text::timefmt::rfc3339(expires)}))
}

/// `GET /v1/jobs/{id}/log`: the whole stored output, one byte range of it, or the log
/// followed as it grows.
pub fn get(app: &App, call: &Call<'_>) -> Answer {
    let id = call.job()?;
    let follow = call.query.flag("follow")?.unwrap_or(false);
    let ranges: Vec<&str> = call.head.all("range").collect();
    // The record first: an unknown job is 404, and once it says "ended" all of the output
    // is on disk.
    let rec = crate::job::settle::settle_and_load(&app.store, &id)?;
    let path = app
        .store
        .job_dir(&id)
        .join(super::output::stream_file(call.query, &rec)?);
    let file = open(&path, &id)?;
    if follow {
        if !ranges.is_empty() {
            return Err(Error::Invalid(
                "follow=true sends the log from its start and takes no Range header; to \
                 follow from an offset, use GET /v1/jobs/{id}/output?offset=...&waitSeconds=..."
                    .into(),
            )
            .into());
        }
        // Only a running job has something to wait for.
        let waiting = if rec.status.is_final() {
            None
        } else {
            let slot = app.wait_slot("read the log without follow=true")?;
            Some((app.hub.watch(&app.store.job_dir(&id), &id), slot))
        };
        let source = Follow {
            store: app.store.clone(),
            hub: Arc::clone(&app.hub),
            id,
            path,
            file,
            sent: 0,
            waiting,
        };
        return Ok(text(200, vec![], Some(Streamed::Chunks(Box::new(source)))));
    }
    let len = match &file {
        Some(f) => f
            .metadata()
            .map_err(|e| Error::io(format!("reading the output of {id}"), e))?
            .len(),
        None => 0,
    };
    // Without validators to compare, an If-Range cannot hold: the whole log.
    let wanted = if call.head.header("if-range").is_some() {
        Wanted::Whole
    } else {
        byte_range(&ranges, len)
    };
    let ranges_ok = ("Accept-Ranges", "bytes".to_string());
    Ok(match (wanted, file) {
        (Wanted::Unsatisfiable(why), _) => {
            let mut resp = error_response(Error::Invalid(why).into());
            resp.status = 416;
            resp.headers.push(ranges_ok);
            resp.headers
                .push(("Content-Range", format!("bytes */{len}")));
            resp
        }
        (Wanted::Part { start, end }, Some(file)) => text(
            206,
            vec![
                ranges_ok,
                ("Content-Range", format!("bytes {start}-{end}/{len}")),
            ],
            Some(Streamed::File {
                file,
                offset: start,
                len: end - start + 1,
            }),
        ),
        (Wanted::Whole, Some(file)) if len > 0 => text(
            200,
            vec![ranges_ok],
            Some(Streamed::File {
                file,
                offset: 0,
                len,
            }),
        ),
        // No output yet (a range of nothing was refused above).
        _ => text(200, vec![ranges_ok], None),
    })
}

/// The output file, `None` while it does not exist yet (a job just starting).
fn open(path: &Path, id: &JobId) -> Result<Option<File>> {
    match File::open(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("reading the output of {id}"), e)),
    }
}

/// A plain-text answer with `body` streamed (or empty).
fn text(status: u16, mut headers: Vec<(&'static str, String)>, body: Option<Streamed>) -> Response {
    headers.insert(0, ("Content-Type", TEXT.into()));
    headers.push(("Cache-Control", "no-store".into()));
    headers.push(("X-Content-Type-Options", "nosniff".into()));
    let mut resp = Response::new(status, headers, Vec::new());
    resp.stream = body;
    resp
}

/// A followed log: what output.log holds, then each new piece as it is stored, until the
/// job has ended and all of its output was sent.
struct Follow {
    store: Store,
    hub: Arc<Hub>,
    id: JobId,
    path: PathBuf,
    file: Option<File>,
    /// Bytes of the file sent so far.
    sent: u64,
    /// While the job runs: its folder watched, and this request's place among those that
    /// wait (both given back when the stream ends). `None` for a job that had ended.
    waiting: Option<(Watch, WaitSlot)>,
}

impl Follow {
    /// Sends whatever the file holds past what was sent; true if there was some.
    fn send_new(&mut self, out: &mut BodyOut<'_>) -> io::Result<bool> {
        if self.file.is_none() {
            self.file = match File::open(&self.path) {
                Ok(f) => Some(f),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
                Err(e) => return Err(e),
            };
        }
        let Some(file) = &self.file else {
            return Ok(false);
        };
        let len = file.metadata()?.len();
        if len <= self.sent {
            return Ok(false);
        }
        out.file(file, self.sent, len - self.sent)?;
        self.sent = len;
        Ok(true)
    }
}

impl Source for Follow {
    fn send(&mut self, out: &mut BodyOut<'_>) -> io::Result<()> {
        loop {
            let seen = self.waiting.as_ref().map(|(w, _)| w.marks());
            if self.send_new(out)? {
                continue;
            }
            let Some(seen) = seen else {
                // The job had ended: its whole log is sent.
                return Ok(());
            };
            // Nothing new. The record, then the output once more: once the record says
            // "ended", all of the output is on disk.
            let rec = crate::job::settle::settle_and_load(&self.store, &self.id)
                .map_err(io::Error::other)?;
            if rec.status.is_final() {
                self.send_new(out)?;
                return Ok(());
            }
            // A stop, or a client gone, ends the stream without its last chunk: what was
            // sent is not the whole log.
            if self.hub.stopping() {
                return Err(io::Error::other("the server is stopping"));
            }
            if out.hung_up() {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            if let Some((w, _)) = &self.waiting {
                w.wait(seen, Kind::Any, Instant::now() + RECHECK);
            }
        }
    }
}
