//! The Server-Sent Events stream the event journal and the folder watches share: `retry:`,
//! then frames as a [`Feed`] yields them, a comment every [`HEARTBEAT`] when nothing
//! happens, and an end after [`MAX_STREAM`] (the client reconnects with `Last-Event-ID`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::api::app::WaitSlot;
use crate::api::waits::Hub;
use crate::http::{BodyOut, Response, Source, Streamed};

/// A comment line this often keeps a quiet stream (and its proxies) alive, and finds out
/// a client that is gone.
pub const HEARTBEAT: Duration = Duration::from_secs(15);
/// A stream ends after this long; the client reconnects with `Last-Event-ID`.
pub const MAX_STREAM: Duration = Duration::from_secs(3600);
/// The reconnection delay suggested to clients, in milliseconds.
const RETRY_MS: u64 = 1000;

/// What one read of a feed found.
pub enum Step {
    /// Frames to send (`id:`, `event:`, `data:` each), at least one.
    Frames(String),
    /// Nothing new: wait for a change.
    Idle,
    /// The stream ends with an `error` event carrying this error body.
    End(Value),
}

/// What a stream reads from: a change counter to wait on, and pages read at its place.
pub trait Feed: Send {
    /// The change counter, read before each page so no change between is missed.
    fn seq(&self) -> u64;
    /// Reads the next page and moves past it.
    fn next(&mut self) -> Step;
    /// Waits until the counter moves past `seen` or until `deadline`.
    fn wait(&self, seen: u64, deadline: Instant);
}

/// The `200 text/event-stream` response streaming `feed`; `slot` holds the stream's place
/// among the waiting requests while it runs.
pub fn response(slot: WaitSlot, hub: Arc<Hub>, feed: impl Feed + 'static) -> Response {
    let mut resp = Response::new(
        200,
        vec![
            ("Content-Type", "text/event-stream".into()),
            ("Cache-Control", "no-store".into()),
        ],
        Vec::new(),
    );
    resp.stream = Some(Streamed::Chunks(Box::new(Sse {
        _slot: slot,
        hub,
        feed,
    })));
    resp
}

struct Sse<F> {
    _slot: WaitSlot,
    hub: Arc<Hub>,
    feed: F,
}

impl<F: Feed> Source for Sse<F> {
    fn send(&mut self, out: &mut BodyOut<'_>) -> std::io::Result<()> {
        let began = Instant::now();
        let mut beat = Instant::now();
        out.bytes(format!("retry: {RETRY_MS}\n\n").as_bytes())?;
        while !self.hub.stopping() && began.elapsed() < MAX_STREAM && !out.hung_up() {
            let seen = self.feed.seq();
            match self.feed.next() {
                Step::Frames(text) => {
                    out.bytes(text.as_bytes())?;
                    beat = Instant::now();
                    continue;
                }
                Step::End(err) => {
                    return out.bytes(format!("event: error\ndata: {err}\n\n").as_bytes());
                }
                Step::Idle => {}
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
