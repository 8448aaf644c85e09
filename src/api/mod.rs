//! The HTTP/JSON control endpoint (`gitterm-agent serve`).
//!
//! - [`routes`]: every route as one [`Route`] enum (method, template, scope, handler).
//! - [`dispatch`]: admission (auth, routing, scope, query), the call of the route's
//!   handler and the request log; [`handlers`]: one file per resource; [`app`]: the
//!   state they share; [`answer`]: the JSON and error answers.
//! - [`auth`]: tokens and tickets; [`cors`]: what pages of other origins may call;
//!   [`request`]: pure parsing of queries and bodies; [`waits`]: one
//!   shared inotify instance for long-polls.
//!
//! It runs on the shared HTTP layer ([`crate::http`]); `serve`'s flags, binding and
//! housekeeping live in [`crate::serve`], which starts it.
//!
//! The server keeps no state beyond the store: each job has its own supervisor process, so
//! stopping or killing the server never touches a running job, and a restart is a rescan.

pub mod answer;
pub mod app;
pub mod auth;
pub mod cors;
pub mod dispatch;
pub mod handlers;
pub mod journal;
pub mod request;
pub mod routes;
pub mod waits;

use std::io::Write;

pub use routes::{ROUTES, Route, Scope};

/// Writes one JSON line to stderr; a closed stderr is no reason to fail.
pub fn log(v: serde_json::Value) {
    // One write per line (stderr is unbuffered): lines from many threads never interleave,
    // and a request costs one syscall for its log line, not one per token.
    let mut line = v.to_string();
    line.push('\n');
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}
