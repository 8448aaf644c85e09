//! A small HTTP/1.1 server on std: one thread per connection (capped), keep-alive,
//! pipelining, `Content-Length` and chunked request bodies, and a bound on everything a
//! client controls: head size and header count, the time to send a head, the time to send a
//! body, the body's size (checked up front and while reading a chunked stream), the number
//! of connections, and the time a response may take to be read. At the connection cap, an
//! idle connection (silent since its accept, or kept alive with nothing to say) gives its
//! place to a new one, so that idle sockets alone can never shut clients out.
//!
//! Our own, not tiny_http: that crate cannot bound head size, read times or connections.
//! It knows nothing of routes or JSON (those live in the front ends that use it, such as `crate::api`), and is laid out as
//! hyper's `proto/h1`:
//! - `conn.rs`: the accept loop and each connection's loop (keep-alive, limits, timeouts);
//! - `head.rs`: reading and parsing the request line and headers;
//! - `body.rs`: the body's framing (`Content-Length` or chunked) and reading it;
//! - `encode.rs`: writing responses, and bodies streamed from their source ([`Streamed`]);
//! - `net.rs`: the TCP and Unix sockets under all of it.

pub mod auth;
mod body;
pub mod client;
mod conn;
mod encode;
mod head;
mod lines;
mod net;

use std::fs::File;
use std::time::Duration;

pub use body::{BodyReader, Framing, framing, parse_chunk_size};
pub use conn::{State, run};
pub use encode::{BodyOut, encode, reason};
pub use head::{Head, check_host, parse_head, read_head};
pub use net::{Listener, Stream};

/// What the server accepts from clients, and how long it waits for them.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body, in bytes.
    pub max_body: u64,
    /// Largest request head (request line and headers), in bytes.
    pub max_head: usize,
    /// Most header lines in one request.
    pub max_headers: usize,
    /// Most connections open at once. At the cap, a new connection takes the place of an
    /// idle one (see `Table::victim`); when none is idle it is answered 429 and closed.
    pub max_connections: usize,
    /// How long a kept-alive connection may sit idle before the next request starts.
    pub idle_timeout: Duration,
    /// How long a client may take to send a whole head: the first one from the accept,
    /// later ones from their first byte.
    pub head_timeout: Duration,
    /// How long a client may take to send a whole body, from the end of its head.
    pub body_timeout: Duration,
    /// How long writing one response may take in all, however slowly the client reads. A
    /// streamed body ([`Streamed`]: a file, or chunks as they come, such as a
    /// followed log) may last as long as its source has more; each block of it (at most
    /// 1 MiB) and each chunk must then leave within this time of its start, so a client
    /// that stops reading is still cut off.
    pub write_timeout: Duration,
    /// Stack size of connection threads.
    pub stack_size: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body: 8 << 20,
            max_head: 64 << 10,
            max_headers: 100,
            max_connections: 1024,
            idle_timeout: Duration::from_secs(60),
            head_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(30),
            // serde_json stops at 128 levels of nesting; this leaves room for that in
            // debug builds. Untouched stack pages cost no memory.
            stack_size: 512 << 10,
        }
    }
}

/// A connection handed to a handler after its `101 Switching Protocols` response: the
/// socket, and whatever the client sent after the request that was already read.
pub struct Upgraded {
    pub stream: Stream,
    pub read_ahead: Vec<u8>,
}

impl Upgraded {
    /// Makes reads and writes return `WouldBlock` instead of waiting.
    pub fn set_nonblocking(&self) -> std::io::Result<()> {
        self.stream.set_nonblocking()
    }

    /// Bounds what the kernel holds unsent for this connection to about `bytes`; returns
    /// the bound it set (at least what it holds: see [`Stream`]).
    pub fn limit_send_buffer(&self, bytes: usize) -> std::io::Result<usize> {
        self.stream.limit_send_buffer(bytes)
    }

    /// Ends the sending side: what was written still leaves, then the client reads EOF.
    pub fn shutdown_write(&self) {
        self.stream.shutdown(std::net::Shutdown::Write)
    }
}

impl std::io::Read for Upgraded {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.stream.read(buf)
    }
}

impl std::io::Write for Upgraded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl std::os::fd::AsFd for Upgraded {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

/// What takes over a connection after a 101 response (run on the connection's thread).
pub type UpgradeFn = Box<dyn FnOnce(Upgraded) + Send>;

/// A response's hand-over of its connection (see [`Upgraded`]).
#[derive(Clone)]
pub struct Upgrade(std::sync::Arc<std::sync::Mutex<Option<UpgradeFn>>>);

impl Upgrade {
    pub fn new(f: UpgradeFn) -> Upgrade {
        Upgrade(std::sync::Arc::new(std::sync::Mutex::new(Some(f))))
    }

    fn take(&self) -> Option<UpgradeFn> {
        self.0.lock().ok()?.take()
    }
}

impl std::fmt::Debug for Upgrade {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Upgrade")
    }
}

/// A request with its whole body.
#[derive(Debug)]
pub struct Request {
    pub head: Head,
    pub body: Vec<u8>,
}

/// A response; `route` and `job_id` are for the request log only.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
    /// A body sent from its source after the head, in place of `body` (then empty).
    pub stream: Option<Streamed>,
    /// Close the connection after this response.
    pub close: bool,
    /// The route template that answered, for the log.
    pub route: &'static str,
    /// The job the request was about, for the log.
    pub job_id: Option<String>,
    /// With status 101: what takes the connection over once the response is out.
    pub upgrade: Option<Upgrade>,
}

impl Response {
    /// A response with `body` and nothing else set.
    pub fn new(status: u16, headers: Vec<(&'static str, String)>, body: Vec<u8>) -> Response {
        Response {
            status,
            headers,
            body,
            stream: None,
            close: false,
            route: "",
            job_id: None,
            upgrade: None,
        }
    }
}

/// A body that is never held whole: the connection sends it from its source, after the
/// head, in blocks each bounded by the write timeout (see [`Limits::write_timeout`]),
/// instead of the whole response being bounded by it.
pub enum Streamed {
    /// `len` bytes of `file` from `offset`, sent with `Content-Length: len` straight from
    /// the file (sendfile where the socket allows). Should the file yield fewer bytes, the
    /// connection is cut, so a client never takes a short body for a whole one.
    File { file: File, offset: u64, len: u64 },
    /// A body of unknown length, produced as it comes: sent chunked (to an HTTP/1.0 client,
    /// as it comes until the connection closes). The source's error cuts the connection
    /// before the last chunk, so the client knows the body is incomplete.
    Chunks(Box<dyn Source>),
}

impl std::fmt::Debug for Streamed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Streamed::File { offset, len, .. } => f
                .debug_struct("File")
                .field("offset", offset)
                .field("len", len)
                .finish_non_exhaustive(),
            Streamed::Chunks(_) => f.write_str("Chunks"),
        }
    }
}

/// What produces a [`Streamed::Chunks`] body.
pub trait Source: Send {
    /// Sends the whole body through `out`, waiting for each part as long as it likes (it
    /// should look at [`BodyOut::hung_up`] while it waits); returning ends the body.
    fn send(&mut self, out: &mut BodyOut<'_>) -> std::io::Result<()>;
}

/// Something wrong at the HTTP level, before a handler could see the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Malformed request line, headers or body framing.
    Malformed(String),
    /// Head or body over its limit.
    TooLarge(String),
    /// The client was too slow to send its request.
    TooSlow(String),
    /// Too many connections are open.
    Busy(String),
    /// The handler panicked.
    Panic,
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Malformed(m) | Fault::TooLarge(m) | Fault::TooSlow(m) | Fault::Busy(m) => {
                f.write_str(m)
            }
            Fault::Panic => f.write_str("the handler panicked"),
        }
    }
}

impl std::error::Error for Fault {}

/// The HTTP-level fault behind an error of a [`BodyReader`], if it is one.
pub fn fault_of(e: &std::io::Error) -> Option<&Fault> {
    e.get_ref().and_then(|i| i.downcast_ref::<Fault>())
}

/// The routing side of the server.
pub trait Handler: Send + Sync + 'static {
    /// What [`Handler::check`] found out about a request (its route, say), handed on to
    /// [`Handler::handle`] so that nothing is checked twice.
    type Admitted: Send;
    /// Looks at a head before its body is read; `Err` answers the request without reading
    /// the body (so an unauthenticated client never uploads 8 MiB). Boxed: a refusal is
    /// the rare case, and a [`Response`] is large.
    fn check(&self, head: &Head) -> Result<Self::Admitted, Box<Response>>;
    /// True if an admitted request carried valid credentials: at the connection cap, the
    /// connections of such clients are closed last.
    fn trusted(&self, admitted: &Self::Admitted) -> bool;
    /// Answers a whole request that [`Handler::check`] admitted.
    fn handle(&self, admitted: Self::Admitted, req: Request) -> Response;
    /// Renders an HTTP-level fault.
    fn fault(&self, fault: &Fault) -> Response;
    /// `Some(max)` if the handler reads this request's body itself, as it arrives, in
    /// [`Handler::handle_stream`] (up to `max` bytes instead of the server's `max_body`).
    fn streamed_body(&self, _head: &Head) -> Option<u64> {
        None
    }
    /// Answers an admitted request whose body [`Handler::streamed_body`] asked to stream.
    /// The connection closes after the answer unless the body was read to its end.
    fn handle_stream(
        &self,
        admitted: Self::Admitted,
        head: &Head,
        body: &mut BodyReader<'_>,
    ) -> Response {
        let mut b = Vec::new();
        let _ = std::io::Read::read_to_end(body, &mut b);
        let head = head.clone();
        self.handle(admitted, Request { head, body: b })
    }
    /// Called after each response was written (or failed to be), for the request log.
    fn done(&self, head: Option<&Head>, resp: &Response, elapsed: Duration);
}
