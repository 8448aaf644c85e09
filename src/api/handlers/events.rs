//! `GET /v1/events`: the journal of job events, as a long-poll (JSON) or, with
//! `Accept: text/event-stream`, as Server-Sent Events. Each request reads the journal at
//! its own offset, so a slow reader holds up nobody. `POST /v1/events/tickets` mints the
//! ticket a browser's `EventSource` opens a stream with (it cannot send the bearer header);
//! it resumes with `Last-Event-ID`, or, on a new ticket's URL, with `after`.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Answer, Call, Reply};
use crate::api::answer::json_response;
use crate::api::app::App;
use crate::api::request;
use crate::http::{Response, Streamed};
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

/// `GET /v1/events`: the event stream if the client asks for one, else the long-poll.
pub fn get(app: &App, call: &Call<'_>) -> Answer {
    if wants_stream(call) {
        return stream(app, call);
    }
    poll(app, call).map(|v| json_response(200, &v))
}

/// The long-poll: `{"events": [...], "next"}`.
fn poll(app: &App, call: &Call<'_>) -> Reply {
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
fn wants_stream(call: &Call<'_>) -> bool {
    accepts_stream(call.head)
}

/// True if a request's `Accept` names Server-Sent Events.
pub fn accepts_stream(head: &crate::http::Head) -> bool {
    head.all("accept")
        .any(|a| a.to_ascii_lowercase().contains("text/event-stream"))
}

/// `POST /v1/events/tickets`: a single-use ticket (valid 60 s) that opens one event
/// stream as `GET /v1/events?ticket=T`, for a browser's `EventSource`.
pub fn ticket(app: &App, call: &Call<'_>) -> Reply {
    request::no_body(call.body)?;
    let (ticket, expires) = app.issue_ticket("/v1/events".into(), call.scoped)?;
    Ok(json!({"ticket": ticket, "expiresAt": crate::text::timefmt::rfc3339(expires)}))
}

/// The stream: `retry:`, then each event as `id: CURSOR`, `event: TYPE`, `data: JSON`,
/// and a comment every [`HEARTBEAT`] when nothing happens. `Last-Event-ID` (else
/// `after`) says where to resume.
fn stream(app: &App, call: &Call<'_>) -> Answer {
    let journal = app.feed.journal.clone();
    let job = job_filter(call)?;
    let resume = call
        .head
        .header("last-event-id")
        .or_else(|| call.query.get("after"));
    let start = from(&journal, resume)?;
    let slot = app.wait_slot("read the events as a long-poll with waitSeconds")?;
    let source = Sse {
        _slot: slot,
        feed: std::sync::Arc::clone(&app.feed),
        hub: std::sync::Arc::clone(&app.hub),
        journal,
        job,
        at: start,
    };
    let mut resp = Response::new(
        200,
        vec![
            ("Content-Type", "text/event-stream".into()),
            ("Cache-Control", "no-store".into()),
        ],
        Vec::new(),
    );
    resp.stream = Some(Streamed::Chunks(Box::new(source)));
    Ok(resp)
}

/// The event stream's source: holds its place among the waiting requests while it runs.
struct Sse {
    _slot: crate::api::app::WaitSlot,
    feed: std::sync::Arc<crate::api::journal::Feed>,
    hub: std::sync::Arc<crate::api::waits::Hub>,
    journal: crate::state::events::Journal,
    job: Option<String>,
    at: u64,
}

impl crate::http::Source for Sse {
    fn send(&mut self, out: &mut crate::http::BodyOut<'_>) -> std::io::Result<()> {
        let began = Instant::now();
        let mut beat = Instant::now();
        out.bytes(format!("retry: {RETRY_MS}\n\n").as_bytes())?;
        while !self.hub.stopping() && began.elapsed() < MAX_STREAM && !out.hung_up() {
            let seen = self.feed.seq();
            let page = match self.journal.read(self.at, 100, self.job.as_deref()) {
                Ok(p) => p,
                Err(e) => {
                    return out
                        .bytes(format!("event: error\ndata: {}\n\n", e.to_json()).as_bytes());
                }
            };
            self.at = page.next;
            if !page.events.is_empty() {
                let mut text = String::new();
                for e in &page.events {
                    text.push_str(&format!(
                        "id: {}\nevent: {}\ndata: {}\n\n",
                        e.cursor,
                        e.event.kind,
                        e.to_json()
                    ));
                }
                out.bytes(text.as_bytes())?;
                beat = Instant::now();
                continue;
            }
            if beat.elapsed() >= HEARTBEAT {
                out.bytes(b": heartbeat\n\n")?;
                beat = Instant::now();
            }
            // Short waits, so a client that hung up is noticed.
            self.feed.wait(
                seen,
                (beat + HEARTBEAT).min(Instant::now() + Duration::from_secs(1)),
            );
        }
        Ok(())
    }
}
