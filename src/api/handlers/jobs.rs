//! Jobs: start one (`POST /v1/jobs`), list them, read one (long-polling for its end on
//! request), cancel one.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Call, Reply};
use crate::api::app::App;
use crate::api::request::{self, Place, Wait};
use crate::api::waits::{Kind, RECHECK};
use crate::job::launch;
use crate::model::error::{Error, Result};
use crate::model::{JobId, JobRecord, Status};

pub fn start(app: &App, call: &Call<'_>) -> Reply {
    let key = call.idempotency_key()?;
    let body = request::start_body(call.body, key)?;
    let mut start = body.req;
    if call.scoped && start.user.is_some() {
        return Err(Error::Forbidden(
            "the scoped token may not choose the user a job runs as".into(),
        )
        .into());
    }
    // A secrets file must be the agent's own (0600 or 0400), so none is one the job user
    // could read: naming one, a scoped caller would have the agent read it for its job.
    if call.scoped && !body.secret_files.is_empty() {
        return Err(Error::Forbidden(
            "the scoped token may not name secretFiles: the agent would read files for it \
             that its jobs' user cannot; pass the values in secretEnv, or start the job \
             with the full token"
                .into(),
        )
        .into());
    }
    // Files first, then secretEnv: a name in both takes the secretEnv value.
    start.secrets = crate::job::secrets::gather(&body.secret_files, start.secrets)?;
    // A start that waits holds its connection as a long-poll does: it needs a place among
    // the waiting before anything starts, so that a refusal leaves nothing behind.
    let _slot = match body.wait {
        Wait::Seconds(s) if s > 0.0 => Some(app.wait_slot("start the job with background: true")?),
        _ => None,
    };
    let rec = match body.wait {
        Wait::Seconds(s) if s > 0.0 => match launch::start_to_wait(&app.store, &app.cfg, start)? {
            launch::Begun::Started(id, _, ev) => wait_end_events(app, &id, ev, s)?,
            launch::Begun::Earlier(rec) => wait_end(app, &rec.id.clone(), s)?,
        },
        _ => launch::start_watched(&app.store, &app.cfg, start)?.0,
    };
    Ok(app.store.view(&rec))
}

/// A page of the job records: at most `limit` (default [`request::DEFAULT_LIST_LIMIT`]) and
/// about [`request::LIST_PAGE_BYTES`] of them, after `cursor` if given, with `next` (the
/// cursor of the page's last entry) when more follow. The store is read one record at a
/// time and only each entry's place is kept, so a listing costs the server memory for one
/// page, however many records there are and however long their commands.
pub fn list(app: &App, call: &Call<'_>) -> Reply {
    let q = call.query;
    let status = q
        .get("status")
        .map(|s| {
            Status::parse(s).ok_or_else(|| {
                Error::Invalid(format!(
                    "status must be one of {}, got {s:?}",
                    Status::ALL.map(|s| s.as_str()).join(", ")
                ))
            })
        })
        .transpose()?;
    let limit = q
        .uint("limit", 1, request::MAX_LIST_LIMIT as u64)?
        .map_or(request::DEFAULT_LIST_LIMIT, |n| n as usize);
    let after = q.get("cursor").map(Place::parse).transpose()?;
    let wanted = |r: &JobRecord| status.is_none_or(|s| r.status == s);
    // Read before the listing: watching from it misses nothing that changed during it.
    let events_cursor = app.feed.journal.cursor(app.feed.journal.end());
    let mut places: Vec<(Place, Option<String>)> = Vec::new();
    scan(app, |id, loaded| {
        let entry = match loaded {
            Ok(r) if wanted(&r) => (Place::job(&r.created_at, id), None),
            Ok(_) => return,
            // A status filter leaves corrupt records out.
            Err(_) if status.is_some() => return,
            Err(e) => (Place::Corrupt(id), Some(e.to_string())),
        };
        if after.as_ref().is_none_or(|a| entry.0 > *a) {
            places.push(entry);
        }
    });
    places.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut jobs: Vec<Value> = Vec::new();
    let mut bytes = 0;
    let mut last: Option<Place> = None;
    let mut next = None;
    for (place, error) in places {
        if jobs.len() >= limit || bytes >= request::LIST_PAGE_BYTES {
            next = last.as_ref().map(Place::cursor);
            break;
        }
        let entry = match (&place, error) {
            (Place::Corrupt(id), error) => json!({"id": id, "corrupt": true, "error": error}),
            // Read again: only the page's records are ever held whole. One that is gone or
            // changed meanwhile is left out.
            (Place::Job(_, id), _) => match crate::job::settle::load_listed(&app.store, id) {
                Ok(mut r) if wanted(&r) => {
                    crate::state::store::live_usage(&mut r);
                    serde_json::to_value(&r).unwrap_or_default()
                }
                _ => continue,
            },
        };
        let n = crate::api::answer::json_len(&entry);
        if !jobs.is_empty() && bytes + n > request::LIST_PAGE_BYTES {
            next = last.as_ref().map(Place::cursor);
            break;
        }
        bytes += n;
        jobs.push(entry);
        last = Some(place);
    }
    Ok(json!({ "jobs": jobs, "next": next, "eventsCursor": events_cursor }))
}

/// Calls `f` with every job folder's id and its record as
/// [`crate::job::settle::load_listed`] reads it (so a job whose supervisor is gone is
/// settled, and no job holds the scan up for long), one at a time; folders removed
/// meanwhile are skipped.
pub(super) fn scan(app: &App, mut f: impl FnMut(JobId, Result<JobRecord>)) {
    for id in app.store.ids() {
        match crate::job::settle::load_listed(&app.store, &id) {
            Err(Error::NotFound(_)) => {}
            loaded => f(id, loaded),
        }
    }
}

pub fn get(app: &App, call: &Call<'_>) -> Reply {
    let id = call.job()?;
    let wait = call
        .query
        .seconds("waitSeconds", request::MAX_WAIT_SECONDS)?
        .unwrap_or(0.0);
    let rec = crate::job::settle::settle_and_load(&app.store, &id)?;
    if wait <= 0.0 || rec.status.is_final() {
        return Ok(app.store.view(&rec));
    }
    let _slot = app.wait_slot("read the job without waitSeconds")?;
    let rec = wait_end(app, &id, wait)?;
    Ok(app.store.view(&rec))
}

pub fn cancel(app: &App, call: &Call<'_>) -> Reply {
    let id = call.job()?;
    request::no_body(call.body)?;
    // The grace period, plus a margin for the supervisor to write the final record.
    let wait = Duration::from_secs_f64(app.cfg.grace_seconds + 5.0);
    let rec = launch::cancel(&app.store, &id, wait)?;
    Ok(app.store.view(&rec))
}

/// [`wait_end`] for a job this request started, over the supervisor's own change channel:
/// it tells of the end at once, with no folder watch to set up and tear down, and what it
/// says of stored output is read past without a look at the record.
pub(super) fn wait_end_events(
    app: &App,
    id: &JobId,
    mut ev: launch::JobEvents,
    seconds: f64,
) -> Result<JobRecord> {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut instant_wakes = 0;
    // The start read (and settled) the record a moment ago: each look follows a wait.
    loop {
        let now = Instant::now();
        // A closed channel wakes at once every time; should that happen before the record
        // is final, the folder watch takes over rather than spinning.
        if instant_wakes >= 3 {
            return wait_end(app, id, (deadline - now).as_secs_f64());
        }
        ev.wait_end((deadline - now).min(RECHECK));
        if now.elapsed() < Duration::from_millis(1) {
            instant_wakes += 1;
        } else {
            instant_wakes = 0;
        }
        let rec = crate::job::settle::settle_and_load(&app.store, id)?;
        if rec.status.is_final() || Instant::now() >= deadline || app.hub.stopping() {
            return Ok(rec);
        }
    }
}

/// The latest record, after waiting up to `seconds` for the job to end.
pub(super) fn wait_end(app: &App, id: &JobId, seconds: f64) -> Result<JobRecord> {
    if seconds <= 0.0 {
        return crate::job::settle::settle_and_load(&app.store, id);
    }
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let w = app.hub.watch(&app.store.job_dir(id), id);
    loop {
        let seen = w.marks();
        let rec = crate::job::settle::settle_and_load(&app.store, id)?;
        if rec.status.is_final() || Instant::now() >= deadline || app.hub.stopping() {
            return Ok(rec);
        }
        w.wait(seen, Kind::Record, deadline);
    }
}
