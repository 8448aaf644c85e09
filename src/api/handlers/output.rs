//! `GET /v1/jobs/{id}/output`: a page of a job's stored output, long-polling for more on
//! request.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{Call, Reply};
use crate::api::app::App;
use crate::api::request;
use crate::api::waits::Kind;
use crate::state::layout::MAX_PAGE;

pub fn page(app: &App, call: &Call<'_>) -> Reply {
    let id = call.job()?;
    let q = call.query;
    let offset = q.uint("offset", 0, u64::MAX)?.unwrap_or(0);
    let limit = q
        .uint("limit", 1, MAX_PAGE as u64)?
        .map_or(MAX_PAGE, |n| n as usize);
    let wait = q
        .seconds("waitSeconds", request::MAX_WAIT_SECONDS)?
        .unwrap_or(0.0);
    let deadline = Instant::now() + Duration::from_secs_f64(wait);
    let w = (wait > 0.0).then(|| app.hub.watch(&app.store.job_dir(&id), &id));
    // Taken only once there is something to wait for.
    let mut slot = None;
    loop {
        let seen = w.as_ref().map(|w| w.marks());
        // The record first: once it says "ended", all output is already on disk.
        let rec = crate::job::settle::settle_and_load(&app.store, &id)?;
        let page = app
            .store
            .read_page_of(&id, stream_file(q, &rec)?, offset, limit)?;
        let done = rec.status.is_final() && page.eof;
        let stop = !page.data.is_empty()
            || rec.status.is_final()
            || Instant::now() >= deadline
            || app.hub.stopping();
        if let (false, Some(w), Some(seen)) = (stop, &w, seen) {
            if slot.is_none() {
                slot = Some(app.wait_slot("read the page without waitSeconds")?);
            }
            w.wait(seen, Kind::Any, deadline);
            continue;
        }
        let mut answer = json!({
            "offset": page.offset,
            "nextOffset": page.next_offset,
            "data": page.data,
            "eof": page.eof,
            "done": done,
        });
        // Once a reader is at the end, the line being written is what comes next.
        if page.eof {
            let pending = if rec.status.is_final() {
                String::new()
            } else {
                app.store.pending(&id)
            };
            answer["pending"] = pending.into();
        }
        return Ok(answer);
    }
}

/// The file `?stream=` names: `output` (the default: output.log, both streams) or
/// `stderr` (stderr.log, for a job started with `separateStderr`).
pub(super) fn stream_file(
    q: &request::Query,
    rec: &crate::model::JobRecord,
) -> crate::model::error::Result<&'static str> {
    use crate::model::error::Error;
    match q.get("stream") {
        None | Some("output") => Ok(crate::state::layout::OUTPUT),
        Some("stderr") if rec.stderr_bytes.is_some() => Ok(crate::state::layout::STDERR),
        Some("stderr") => Err(Error::Invalid(format!(
            "job {} keeps no stderr apart: start it with separateStderr: true to read \
             stream=stderr",
            rec.id
        ))),
        Some(other) => Err(Error::Invalid(format!(
            "stream must be \"output\" (both streams, the default) or \"stderr\", got {other:?}"
        ))),
    }
}
