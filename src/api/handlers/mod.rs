//! The handlers, one file per resource. Each is a [`Handle`] of the route table: the
//! server, and a request already authenticated, routed and scope-checked (see
//! [`super::dispatch`]), in; JSON, or a response of its own (text, a stream, a switch of
//! protocols), or a [`Failure`] out.

pub mod archive;
pub mod env;
pub mod events;
pub mod files;
pub mod grants;
pub mod health;
pub mod interactive;
pub mod jobs;
pub mod log;
pub mod metrics;
pub mod output;
pub mod ports;
pub mod previews;
pub mod pty;
pub mod sandbox;
pub mod sessions;
pub mod signal;
pub mod sse;
pub mod watches;

use std::io::Read;

use serde_json::Value;

pub use super::answer::Failure;
use super::app::App;
use super::request::Query;
use crate::http::{Head, Response};
use crate::model::JobId;
use crate::model::error::{Error, Result};
use crate::state::store::Store;

/// What a handler gets of a request.
pub struct Call<'a> {
    /// Whether the caller used the scoped token (which may not choose a job's user).
    pub scoped: bool,
    pub head: &'a Head,
    pub body: &'a [u8],
    pub query: &'a Query,
    /// The route's `{id}` segment, as sent.
    pub id: Option<&'a str>,
}

impl Call<'_> {
    /// The job the path names: a malformed id is `not_found`, as an unknown one.
    pub fn job(&self) -> Result<JobId> {
        self.id.map_or(
            Err(Error::Internal("route without an id".into())),
            Store::parse_id,
        )
    }

    /// The `Idempotency-Key` header, if sent (once at most).
    pub fn idempotency_key(&self) -> Result<Option<&str>> {
        let mut keys = self.head.all("idempotency-key");
        let first = keys.next();
        if keys.next().is_some() {
            return Err(Error::Invalid(
                "the Idempotency-Key header is given more than once".into(),
            ));
        }
        Ok(first)
    }
}

/// A route's handler, by what it takes and what it answers: the route table holds one
/// per route, and dispatch calls it and nothing else.
#[derive(Clone, Copy)]
pub enum Handle {
    /// The whole body (JSON, or none) in; a JSON value out, sent with status 200.
    Json(fn(&App, &Call<'_>) -> Reply),
    /// A plain-text answer it makes itself (the metrics).
    Text(fn(&App, &Call<'_>) -> Answer),
    /// An answer whose body it streams from a source (a file, a followed log, an event
    /// stream), or a JSON one, as the request asks.
    Stream(fn(&App, &Call<'_>) -> Answer),
    /// The request body as it arrives, never held whole: at most the second function's
    /// bytes for this server. A JSON value out.
    Upload(
        fn(&App, &Call<'_>, &mut (dyn Read + Send)) -> Reply,
        fn(&App) -> u64,
    ),
    /// A switch of protocols: `101` hands the connection over (a WebSocket).
    Upgrade(fn(&App, &Call<'_>) -> Answer),
}

/// What a JSON handler returns.
pub type Reply = std::result::Result<Value, Failure>;

/// What a handler that makes its own response returns.
pub type Answer = std::result::Result<Response, Failure>;
