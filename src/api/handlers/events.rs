//! `GET /v1/events`: the journal of job events, as a long-poll (JSON) or, with
//! `Accept: text/event-stream`, as Server-Sent Events. Each request reads the journal at
//! its own offset, so a slow reader holds up nobody. `POST /v1/events/tickets` mints the
//! ticket a browser's `EventSource` opens a stream with (it cannot send the bearer header);
//! it resumes with `Last-Event-ID`, or, on a new ticket's URL, with `after`.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::sse::{self, Step};
use super::{Answer, Call, Reply};
use crate::api::answer::json_response;
use crate::api::app::App;
use crate::api::request;
use crate::model::error::{Error, Result};
use crate::state::events::Journal;

/// Events in one answer, by default and at most.
const DEFAULT_LIMIT: u64 = 100;
const MAX_LIMIT: u64 = 1000;

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
/// and a comment every [`sse::HEARTBEAT`] when nothing happens. `Last-Event-ID` (else
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
    let feed = JournalFeed {
        feed: std::sync::Arc::clone(&app.feed),
        journal,
        job,
        at: start,
    };
    Ok(sse::response(slot, std::sync::Arc::clone(&app.hub), feed))
}

/// The job events a stream reads, from its own place in the journal.
struct JournalFeed {
    feed: std::sync::Arc<crate::api::journal::Feed>,
    journal: crate::state::events::Journal,
    job: Option<String>,
    at: u64,
}

impl sse::Feed for JournalFeed {
    fn seq(&self) -> u64 {
        self.feed.seq()
    }

    fn next(&mut self) -> Step {
        let page = match self.journal.read(self.at, 100, self.job.as_deref()) {
            Ok(p) => p,
            Err(e) => return Step::End(e.to_json()),
        };
        self.at = page.next;
        if page.events.is_empty() {
            return Step::Idle;
        }
        let mut text = String::new();
        for e in &page.events {
            text.push_str(&format!(
                "id: {}\nevent: {}\ndata: {}\n\n",
                e.cursor,
                e.event.kind,
                e.to_json()
            ));
        }
        Step::Frames(text)
    }

    fn wait(&self, seen: u64, deadline: Instant) {
        self.feed.wait(seen, deadline);
    }
}
