//! The handlers, one file per resource. Each is a [`Handle`]: the server, and a request
//! already authenticated, routed and scope-checked (see [`super::app`]), in; JSON (or a
//! response of its own, for a body that is not JSON) or a [`Failure`] out.

pub mod archive;
pub mod env;
pub mod events;
pub mod files;
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

use serde_json::Value;

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

/// A handler.
pub type Handle = fn(&App, &Call<'_>) -> Reply;

/// A handler's answer.
pub type Reply = std::result::Result<Answer, Failure>;

/// What a handler answers when it succeeds.
#[derive(Debug)]
pub enum Answer {
    /// A JSON body, sent with status 200.
    Json(Value),
    /// A response the handler made itself (a plain-text log, streamed from its file).
    Response(Response),
}

impl From<Value> for Answer {
    fn from(v: Value) -> Answer {
        Answer::Json(v)
    }
}

/// An error answer, optionally with more fields next to `code` and `message`.
#[derive(Debug)]
pub struct Failure {
    pub err: Error,
    pub extra: serde_json::Map<String, Value>,
    /// Close the connection after the answer (so that a refused client frees its place).
    pub close: bool,
}

impl From<Error> for Failure {
    fn from(err: Error) -> Failure {
        Failure {
            err,
            extra: Default::default(),
            close: false,
        }
    }
}
