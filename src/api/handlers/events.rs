//! `GET /v1/events`: the journal of job events, as a long-poll (JSON) or, with
//! `Accept: text/event-stream`, as Server-Sent Events. Each request reads the journal at
//! its own offset, so a slow reader holds up nobody.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Call, Failure, Reply};
use crate::api::app::App;
use crate::api::http::{Response, Streamed};
use crate::api::request;
use crate::model::error::{Error, Result};
use crate::state::events::Journal;

/// Events in one answer, by default and at most.
const DEFAULT_LIMIT: u64 = 100;
const MAX_LIMIT: u64 = 1000;
/// A comment line this often keeps a quiet stream (and its proxies) alive, and finds out
/// a client that is gone.
const HEARTBEAT: Duration = Duration::from_secs(15);
/// A stream ends after this long; the client reconnects with `Last-Event-ID`.
const MAX_STREAM: Duration = Duration::from_secs(3600);
/// The reconnection delay suggested to clients, in milliseconds.
const RETRY_MS: u64 = 1000;

/// Where to read from: after the cursor given, else from the oldest event kept.
fn from(journal: &Journal, after: Option<&str>) -> Result<u64> {
    match after.filter(|a| !a.is_empty()) {
        Some(c) => journal.parse_cursor(c),
        None => Ok(journal.start()),
    }
}

fn job_filter(call: &Call<'_>) -> Result<Option<String>> {
    call.query
        .get("jobId")
        .filter(|j| !j.is_empty())
        .map(|j| {
            crate::model::JobId::parse(j)
                .map(|id| id.to_string())
                .ok_or_else(|| Error::Invalid(format!("jobId {j:?} is not a job id")))
        })
        .transpose()
}

/// The long-poll: `{"events": [...], "next"}`.
pub fn get(app: &App, call: &Call<'_>) -> Reply {
    let q = call.query;
    let journal = &app.feed.journal;
    let limit = q.uint("limit", 1, MAX_LIMIT)?.unwrap_or(DEFAULT_LIMIT) as usize;
    let wait = q
        .seconds("waitSeconds", request::MAX_WAIT_SECONDS)?
        .unwrap_or(0.0);
    let job = job_filter(call)?;
    let mut at = from(journal, q.get("after"))?;
    let mut seen = app.feed.seq();
    let mut page = journal.read(at, limit, job.as_deref())?;
    if page.events.is_empty() && wait > 0.0 {
        let _slot = app.wait_slot("read the events without waitSeconds")?;
        let deadline = Instant::now() + Duration::from_secs_f64(wait);
        while page.events.is_empty() && Instant::now() < deadline && !app.hub.stopping() {
            app.feed.wait(seen, deadline);
            seen = app.feed.seq();
            at = page.next;
            page = journal.read(at, limit, job.as_deref())?;
        }
    }
    let events: Vec<Value> = page.events.iter().map(|e| e.to_json()).collect();
    Ok(json!({"events": events, "next": journal.cursor(page.next)}))
}

/// True if the client asks for Server-Sent Events.
pub fn wants_stream(call: &Call<'_>) -> bool {
    call.head
        .all("accept")
        .any(|a| a.to_ascii_lowercase().contains("text/event-stream"))
}

/// The stream: `retry:`, then each event as `id: CURSOR`, `event: TYPE`, `data: JSON`,
/// and a comment every [`HEARTBEAT`] when nothing happens. `Last-Event-ID` (else
/// `after`) says where to resume.
pub fn stream(app: &App, call: &Call<'_>) -> std::result::Result<Response, Failure> {
    let journal = app.feed.journal.clone();
    let job = job_filter(call)?;
    let resume = call
        .head
        .header("last-event-id")
        .or_else(|| call.query.get("after"));
    let start = from(&journal, resume)?;
    let slot = app.owned_slot("read the events as a long-poll with waitSeconds")?;
    let feed = std::sync::Arc::clone(&app.feed);
    let hub = std::sync::Arc::clone(&app.hub);
    let body = move |write: &mut dyn FnMut(&[u8]) -> std::io::Result<()>| {
        let _slot = slot;
        let began = Instant::now();
        let mut at = start;
        let mut beat = Instant::now();
        if write(format!("retry: {RETRY_MS}\n\n").as_bytes()).is_err() {
            return;
        }
        while !hub.stopping() && began.elapsed() < MAX_STREAM {
            let seen = feed.seq();
            let page = match journal.read(at, 100, job.as_deref()) {
                Ok(p) => p,
                Err(e) => {
                    let _ = write(format!("event: error\ndata: {}\n\n", e.to_json()).as_bytes());
                    return;
                }
            };
            at = page.next;
            if !page.events.is_empty() {
                let mut out = String::new();
                for e in &page.events {
                    out.push_str(&format!(
                        "id: {}\nevent: {}\ndata: {}\n\n",
                        e.cursor,
                        e.event.kind,
                        e.to_json()
                    ));
                }
                if write(out.as_bytes()).is_err() {
                    return;
                }
                beat = Instant::now();
                continue;
            }
            if beat.elapsed() >= HEARTBEAT {
                if write(b": heartbeat\n\n").is_err() {
                    return;
                }
                beat = Instant::now();
            }
            feed.wait(seen, beat + HEARTBEAT);
        }
    };
    Ok(Response {
        status: 200,
        headers: vec![
            ("Content-Type", "text/event-stream".into()),
            ("Cache-Control", "no-store".into()),
        ],
        body: Vec::new(),
        close: true,
        route: "",
        job_id: None,
        stream: Some(Streamed::new(Box::new(body))),
    })
}
