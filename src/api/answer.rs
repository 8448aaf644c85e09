//! The answers every route shares: a JSON body, an error in the contract's form, and the
//! failure a handler returns to get one.

use serde_json::Value;

use crate::http::Response;
use crate::model::error::Error;

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

/// A JSON answer with `status`.
pub fn json_response(status: u16, v: &Value) -> Response {
    // Sized up front: a listing page's body is never held at twice its size.
    let mut body = Vec::with_capacity(json_len(v) + 1);
    let _ = serde_json::to_writer(&mut body, v);
    body.push(b'\n');
    Response::new(
        status,
        vec![
            ("Content-Type", "application/json".into()),
            ("Cache-Control", "no-store".into()),
        ],
        body,
    )
}

/// The length of a value's JSON text, without writing it anywhere.
pub fn json_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// The contract's error answer: `{"error": {"code", "message", ...}}` with its status.
pub fn error_response(f: Failure) -> Response {
    let mut v = f.err.to_json();
    if let Some(obj) = v.get_mut("error").and_then(Value::as_object_mut) {
        for (k, x) in f.extra {
            obj.entry(k).or_insert(x);
        }
    }
    let mut resp = json_response(f.err.http_status(), &v);
    match f.err {
        Error::Auth(_) => resp.headers.push(("WWW-Authenticate", "Bearer".into())),
        Error::RateLimited(_) => resp.headers.push(("Retry-After", "1".into())),
        _ => {}
    }
    resp
}
