//! `/v1/files/watches`: watches of folders (inotify, as the job user) whose changes are
//! kept in a journal per watch and read as job events are, by cursor, as a long-poll or
//! Server-Sent Events (see [`crate::state::watches`] and [`crate::os::files::watch`]).

use std::time::{Duration, Instant};

use serde_json::json;

use super::files::{fs_error, full_path, run, who};
use super::sse::{self, Step};
use super::{Answer, Call, Reply};
use crate::api::answer::json_response;
use crate::api::app::App;
use crate::api::request;
use crate::model::error::{Error, Result};
use crate::os::files::watch::AddError;
use crate::os::files::{self as fs, FinalLink, Intent};
use crate::state::watches::{Watches, valid_id};

const DEFAULT_LIMIT: u64 = 100;
const MAX_LIMIT: u64 = 1000;

fn watch_id<'a>(call: &Call<'a>) -> Result<&'a str> {
    call.id
        .filter(|id| valid_id(id))
        .ok_or_else(|| Error::NotFound("no such file watch (ids are fw_ and 20 hex digits)".into()))
}

/// Watches a folder for the watch `key`, as the job user: all or nothing.
fn add(app: &App, key: u64, path: &str, recursive: bool) -> Result<()> {
    let w = who(app)?;
    let engine = app.watches.engine(w.creds.clone())?;
    run(app, |g, _| {
        let p = fs::resolve(g, path.as_bytes(), FinalLink::Follow, Intent::Use)
            .map_err(|e| fs_error(e, path))?;
        match &p.st {
            None => return Err(Error::NotFound(format!("{path}: no such file or folder"))),
            Some(st) if !fs::is_dir(st) => {
                return Err(Error::Invalid(format!(
                    "{path}: not a folder; a watch watches a folder (watch the one that holds it)"
                )));
            }
            Some(_) => {}
        }
        // Opened as the job user: a folder it may not list is refused here.
        let top = fs::open_folder(&p).map_err(|e| fs_error(e, path))?;
        engine
            .add(g, key, path.as_bytes(), top, recursive)
            .map_err(|e| match e {
                AddError::Exhausted(n) => Error::TooLarge(format!(
                    "{path}: the kernel's limit on inotify watches (fs.inotify.max_user_watches) \
                     was reached with {n} folders watched; nothing of this watch was kept: watch \
                     a smaller tree, delete other watches, or raise the limit"
                )),
                AddError::Io(e) => fs_error(e, path),
            })
    })
}

/// `POST /v1/files/watches {"path", "recursive"}` → `{"id", "path", "recursive", ...}`.
pub fn create(app: &App, call: &Call<'_>) -> Reply {
    let b = request::watch_body(call.body)?;
    let home = who(app)?.home;
    let path = full_path(Some(&b.path), "path", &home)?;
    let (id, key) = app.watches.reserve(&path, b.recursive)?;
    if let Err(e) = add(app, key, &path, b.recursive) {
        let _ = app.watches.delete(&id);
        return Err(e.into());
    }
    let mut v = app.watches.describe(&id)?;
    // Where reading begins for this watch: every change after this answer is in it.
    v["cursor"] = app.watches.first_cursor(&id)?.into();
    Ok(v)
}

/// `GET /v1/files/watches` → `{"watches": [...]}`.
pub fn list(app: &App, _call: &Call<'_>) -> Reply {
    Ok(json!({"watches": app.watches.list()}))
}

/// `DELETE /v1/files/watches/{id}`.
pub fn delete(app: &App, call: &Call<'_>) -> Reply {
    let id = watch_id(call)?;
    app.watches.delete(id)?;
    Ok(json!({"id": id, "deleted": true}))
}

/// `GET /v1/files/watches/{id}/events?after=C&waitSeconds=N&limit=L`, or with
/// `Accept: text/event-stream` the same as Server-Sent Events.
pub fn events(app: &App, call: &Call<'_>) -> Answer {
    let id = watch_id(call)?.to_string();
    if super::events::accepts_stream(call.head) {
        return stream(app, call, id);
    }
    let q = call.query;
    let limit = q.uint("limit", 1, MAX_LIMIT)?.unwrap_or(DEFAULT_LIMIT) as usize;
    let wait = q
        .seconds("waitSeconds", request::MAX_WAIT_SECONDS)?
        .unwrap_or(0.0);
    let mut seen = app.watches.seq();
    let mut page = app.watches.page(&id, q.get("after"), limit)?;
    if page.events.is_empty() && page.error.is_none() && wait > 0.0 {
        let _slot = app.wait_slot("read the watch's events without waitSeconds")?;
        let deadline = Instant::now() + Duration::from_secs_f64(wait);
        while page.events.is_empty()
            && page.error.is_none()
            && Instant::now() < deadline
            && !app.hub.stopping()
        {
            app.watches.wait(seen, deadline);
            seen = app.watches.seq();
            page = app.watches.page(&id, Some(&page.next), limit)?;
        }
    }
    if page.events.is_empty()
        && let Some(e) = page.error
    {
        return Err(Error::Conflict(format!(
            "the watch {id} stopped: {e}; delete it and create it again"
        ))
        .into());
    }
    Ok(json_response(
        200,
        &json!({"events": page.events, "next": page.next}),
    ))
}

fn stream(app: &App, call: &Call<'_>, id: String) -> Answer {
    let resume = call
        .head
        .header("last-event-id")
        .or_else(|| call.query.get("after"))
        .map(str::to_string);
    // A bad cursor is refused before the stream starts.
    let first = app.watches.page(&id, resume.as_deref(), 1)?;
    drop(first);
    let slot = app.wait_slot("read the watch's events as a long-poll with waitSeconds")?;
    let feed = WatchFeed {
        watches: std::sync::Arc::clone(&app.watches),
        id,
        at: resume,
    };
    Ok(sse::response(slot, std::sync::Arc::clone(&app.hub), feed))
}

/// The changes a stream reads, from its own place in one watch's journal.
struct WatchFeed {
    watches: std::sync::Arc<Watches>,
    id: String,
    at: Option<String>,
}

impl sse::Feed for WatchFeed {
    fn seq(&self) -> u64 {
        self.watches.seq()
    }

    fn next(&mut self) -> Step {
        let page = match self.watches.page(&self.id, self.at.as_deref(), 100) {
            Ok(p) => p,
            Err(e) => return Step::End(e.to_json()),
        };
        self.at = Some(page.next.clone());
        if !page.events.is_empty() {
            let mut text = String::new();
            for e in &page.events {
                text.push_str(&format!(
                    "id: {}\nevent: {}\ndata: {e}\n\n",
                    e["cursor"].as_str().unwrap_or_default(),
                    e["type"].as_str().unwrap_or_default(),
                ));
            }
            return Step::Frames(text);
        }
        match page.error {
            Some(e) => {
                Step::End(Error::Conflict(format!("the watch {} stopped: {e}", self.id)).to_json())
            }
            None => Step::Idle,
        }
    }

    fn wait(&self, seen: u64, deadline: Instant) {
        self.watches.wait(seen, deadline);
    }
}

/// Watches again, at the server's start, what earlier servers watched (each journal got
/// a `rescan` first); a folder that cannot be watched any more leaves its watch stopped,
/// saying why.
pub fn resume(app: &App) -> usize {
    let kept = app.watches.resume();
    let n = kept.len();
    for (id, key, path, recursive) in kept {
        if let Err(e) = add(app, key, &path, recursive) {
            app.watches.fail(
                &id,
                &format!("it could not be watched again at the server's start: {e}"),
            );
        }
    }
    n
}
