//! A small HTTP/1.1 server on std: one thread per connection (capped), keep-alive,
//! pipelining, `Content-Length` and chunked request bodies, and a bound on everything a
//! client controls: head size and header count, the time to send a head, the time to send a
//! body, the body's size (checked up front and while reading a chunked stream), the number
//! of connections, and the time a response may take to be read.
//!
//! Why not tiny_http 0.12 (the crate in Cargo.toml): its connection reader grows a header
//! line without any size limit, never sets a read timeout (a client trickling a head, or
//! sending an endless chunked body, holds a thread forever), spawns an unbounded thread per
//! connection, and funnels every request through one queue, so a handler thread cannot be
//! the connection's own. None of that can be configured from outside. This module is the
//! whole HTTP layer; routing and JSON live in [`super::routes`].

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What the server accepts from clients, and how long it waits for them.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body, in bytes.
    pub max_body: u64,
    /// Largest request head (request line and headers), in bytes.
    pub max_head: usize,
    /// Most header lines in one request.
    pub max_headers: usize,
    /// Most connections open at once; more are answered 429 and closed.
    pub max_connections: usize,
    /// How long a kept-alive connection may sit idle before the next request starts.
    pub idle_timeout: Duration,
    /// How long a client may take to send a whole head, from its first byte.
    pub head_timeout: Duration,
    /// How long a client may take to send a whole body, from the end of its head.
    pub body_timeout: Duration,
    /// How long writing one response may block on a client that does not read.
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

/// Bodies up to this size are read and dropped when a request is refused before its body,
/// so the connection can stay open.
const SKIPPABLE_BODY: u64 = 64 << 10;

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub method: String,
    /// The request target as sent, e.g. `/v1/jobs?limit=5`.
    pub target: String,
    /// The target before `?`.
    pub path: String,
    /// The target after `?` (empty when there is none).
    pub query: String,
    /// HTTP/1.x minor version.
    pub minor: u8,
    /// Header names (as sent) and values (trimmed), in order.
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// Every value of a header, in order (names compare case-insensitively).
    pub fn all<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a str> + use<'a> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(&name))
            .map(|(_, v)| v.as_str())
    }

    /// The first value of a header.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.all(name).next()
    }

    /// True if the client asked to close the connection after this request.
    pub fn wants_close(&self) -> bool {
        let has = |token: &str| {
            self.all("connection")
                .flat_map(|v| v.split(','))
                .any(|t| t.trim().eq_ignore_ascii_case(token))
        };
        if self.minor == 0 {
            !has("keep-alive")
        } else {
            has("close")
        }
    }
}

/// A request with its whole body.
#[derive(Debug)]
pub struct Request {
    pub head: Head,
    pub body: Vec<u8>,
}

/// A response; `route` and `job_id` are for the request log only.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
    /// Close the connection after this response.
    pub close: bool,
    /// The route template that answered, for the log.
    pub route: &'static str,
    /// The job the request was about, for the log.
    pub job_id: Option<String>,
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

/// The routing side of the server.
pub trait Handler: Send + Sync + 'static {
    /// Looks at a head before its body is read; a response here answers the request
    /// without reading the body (so an unauthenticated client never uploads 8 MiB).
    fn check(&self, head: &Head) -> Option<Response>;
    /// Answers a whole request.
    fn handle(&self, req: Request) -> Response;
    /// Renders an HTTP-level fault.
    fn fault(&self, fault: &Fault) -> Response;
    /// Called after each response was written (or failed to be), for the request log.
    fn done(&self, head: Option<&Head>, resp: &Response, elapsed: Duration);
}

/// A bound listening socket.
pub enum Listener {
    Tcp(TcpListener),
    /// The listener and its socket file, removed when the server stops.
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Where it listens, as `--listen` would name it (with the real port for `:0`).
    pub fn describe(&self) -> String {
        match self {
            Listener::Tcp(l) => l
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "?".into()),
            Listener::Unix(_, p) => format!("unix:{}", p.display()),
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Listener::Tcp(l) => l.as_fd(),
            Listener::Unix(l, _) => l.as_fd(),
        }
    }

    fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Listener::Tcp(l) => l.set_nonblocking(true),
            Listener::Unix(l, _) => l.set_nonblocking(true),
        }
    }

    fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                s.set_nonblocking(false)?;
                // One write per response already; this keeps small responses from waiting
                // on a delayed ACK.
                let _ = s.set_nodelay(true);
                Ok(Stream::Tcp(s))
            }
            Listener::Unix(l, _) => {
                let (s, _) = l.accept()?;
                s.set_nonblocking(false)?;
                Ok(Stream::Unix(s))
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A client connection.
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn set_read_timeout(&self, d: Duration) -> io::Result<()> {
        // std refuses a zero timeout; the smallest real one ends the wait just as well.
        let d = Some(d.max(Duration::from_millis(1)));
        match self {
            Stream::Tcp(s) => s.set_read_timeout(d),
            Stream::Unix(s) => s.set_read_timeout(d),
        }
    }

    fn set_write_timeout(&self, d: Duration) -> io::Result<()> {
        let d = Some(d.max(Duration::from_millis(1)));
        match self {
            Stream::Tcp(s) => s.set_write_timeout(d),
            Stream::Unix(s) => s.set_write_timeout(d),
        }
    }

    fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_nonblocking(true),
            Stream::Unix(s) => s.set_nonblocking(true),
        }
    }

    fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Shared state between the accept loop and connection threads.
#[derive(Default)]
pub struct State {
    /// Set once the server stops accepting: connections close after their current response.
    pub stopping: AtomicBool,
    /// Open connections.
    pub open: AtomicUsize,
    /// Connections in the middle of a request.
    pub busy: AtomicUsize,
}

struct Count<'a>(&'a AtomicUsize);

impl<'a> Count<'a> {
    fn new(c: &'a AtomicUsize) -> Count<'a> {
        c.fetch_add(1, Ordering::SeqCst);
        Count(c)
    }
}

impl Drop for Count<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Accepts connections until `stop` becomes readable, then calls `on_stop` and waits up to
/// `grace` for requests in progress to finish. Idle keep-alive connections are simply
/// dropped with the process.
pub fn run<H: Handler>(
    listener: Listener,
    limits: Limits,
    handler: Arc<H>,
    state: Arc<State>,
    stop: BorrowedFd<'_>,
    grace: Duration,
    on_stop: impl FnOnce(),
) -> io::Result<()> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    listener.set_nonblocking()?;
    let limits = Arc::new(limits);
    loop {
        let mut fds = [
            PollFd::new(listener.fd(), PollFlags::POLLIN),
            PollFd::new(stop, PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
        if fds[1].any().unwrap_or(false) {
            break;
        }
        let stream = match listener.accept() {
            Ok(s) => s,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(e) if is_transient_accept_error(&e) => {
                // Out of fds or memory, or the peer gave up: back off instead of spinning.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            Err(e) => return Err(e),
        };
        if state.open.load(Ordering::SeqCst) >= limits.max_connections {
            refuse(
                stream,
                &*handler,
                Fault::Busy(format!(
                    "too many connections ({} open, the limit); retry shortly",
                    limits.max_connections
                )),
            );
            continue;
        }
        let (h, l, s) = (
            Arc::clone(&handler),
            Arc::clone(&limits),
            Arc::clone(&state),
        );
        // Counted before the thread starts so a burst cannot overshoot the cap.
        state.open.fetch_add(1, Ordering::SeqCst);
        let spawned = std::thread::Builder::new()
            .name("conn".into())
            .stack_size(limits.stack_size)
            .spawn(move || {
                let _open = OpenGuard(&s.open);
                connection(stream, &*h, &l, &s);
            });
        if let Err(e) = spawned {
            state.open.fetch_sub(1, Ordering::SeqCst);
            let _ = writeln!(
                io::stderr().lock(),
                "{}",
                serde_json::json!({"event": "error", "error": format!("cannot start a connection thread: {e}")})
            );
        }
    }
    state.stopping.store(true, Ordering::SeqCst);
    drop(listener);
    on_stop();
    let deadline = Instant::now() + grace;
    while state.busy.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

struct OpenGuard<'a>(&'a AtomicUsize);

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn is_transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EMFILE
                | libc::ENFILE
                | libc::ENOBUFS
                | libc::ENOMEM
                | libc::ECONNABORTED
                | libc::EPROTO
                | libc::EPERM
        )
    )
}

/// Answers a connection over the cap without a thread: one non-blocking write of a small
/// response into an empty send buffer, then close.
fn refuse<H: Handler>(stream: Stream, handler: &H, fault: Fault) {
    let mut resp = handler.fault(&fault);
    resp.close = true;
    let _ = stream.set_nonblocking();
    let mut stream = stream;
    let _ = stream.write(&encode(&resp, 1));
    stream.shutdown(Shutdown::Both);
    handler.done(None, &resp, Duration::ZERO);
}

fn connection<H: Handler>(stream: Stream, handler: &H, limits: &Limits, state: &State) {
    let _ = stream.set_write_timeout(limits.write_timeout);
    let mut r = BufReader::with_capacity(16 << 10, stream);
    loop {
        let raw = match read_head(&mut r, limits) {
            Ok(Some(raw)) => raw,
            Ok(None) => return,
            Err(fault) => {
                let _ = respond_fault(&mut r, handler, None, fault, Instant::now());
                return;
            }
        };
        let started = Instant::now();
        let _busy = Count::new(&state.busy);
        let head = match parse_head(&raw, limits.max_headers) {
            Ok(h) => h,
            Err(fault) => {
                let _ = respond_fault(&mut r, handler, None, fault, started);
                return;
            }
        };
        let framing = match framing(&head, limits.max_body) {
            Ok(f) => f,
            Err(fault) => {
                let _ = respond_fault(&mut r, handler, Some(&head), fault, started);
                return;
            }
        };
        let close = head.wants_close() || state.stopping.load(Ordering::SeqCst);
        let expects_continue = head
            .header("expect")
            .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
        if let Some(resp) = handler.check(&head) {
            // A small body is skipped to keep the connection; a larger one is left unread
            // (that is the point of checking first), and an unread body would be taken for
            // the next request, so the connection closes. A client waiting for
            // `100 Continue` may never send its body: do not wait for it.
            let unread = match framing {
                Framing::None => false,
                Framing::Length(n) if n <= SKIPPABLE_BODY && !expects_continue => {
                    read_body(&mut r, framing, limits).is_err()
                }
                _ => true,
            };
            if !finish(
                &mut r,
                handler,
                &head,
                resp,
                close || unread,
                unread,
                started,
            ) {
                return;
            }
            continue;
        }
        if expects_continue && framing != Framing::None {
            let _ = r.get_mut().write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        let body = match read_body(&mut r, framing, limits) {
            Ok(b) => b,
            Err(fault) => {
                let _ = respond_fault(&mut r, handler, Some(&head), fault, started);
                return;
            }
        };
        let req = Request {
            head: head.clone(),
            body,
        };
        let resp =
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler.handle(req))) {
                Ok(resp) => resp,
                Err(_) => {
                    let mut resp = handler.fault(&Fault::Panic);
                    resp.close = true;
                    resp
                }
            };
        let close = close || resp.close || state.stopping.load(Ordering::SeqCst);
        if !finish(&mut r, handler, &head, resp, close, false, started) {
            return;
        }
    }
}

/// Writes a response and logs it; false when the connection is done.
fn finish<H: Handler>(
    r: &mut BufReader<Stream>,
    handler: &H,
    head: &Head,
    mut resp: Response,
    close: bool,
    unread_body: bool,
    started: Instant,
) -> bool {
    resp.close = close;
    let ok = r.get_mut().write_all(&encode(&resp, head.minor)).is_ok();
    handler.done(Some(head), &resp, started.elapsed());
    if !ok || close {
        linger_close(r, unread_body);
        return false;
    }
    true
}

fn respond_fault<H: Handler>(
    r: &mut BufReader<Stream>,
    handler: &H,
    head: Option<&Head>,
    fault: Fault,
    started: Instant,
) -> io::Result<()> {
    let mut resp = handler.fault(&fault);
    resp.close = true;
    let res = r
        .get_mut()
        .write_all(&encode(&resp, head.map_or(1, |h| h.minor)));
    handler.done(head, &resp, started.elapsed());
    linger_close(r, !matches!(fault, Fault::TooSlow(_)));
    res
}

/// Closes after an error response. When the client may still be sending (a refused body),
/// closing at once could reset the connection before it reads our answer, so first stop
/// writing and drain a bounded amount for a moment.
fn linger_close(r: &mut BufReader<Stream>, drain: bool) {
    let s = r.get_mut();
    s.shutdown(Shutdown::Write);
    if drain && s.set_read_timeout(Duration::from_millis(500)).is_ok() {
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut budget: usize = 16 << 20;
        let mut buf = [0u8; 16 << 10];
        while budget > 0 && Instant::now() < deadline {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => budget = budget.saturating_sub(n),
            }
        }
    }
    s.shutdown(Shutdown::Both);
}

/// Reads one request head (up to and including the blank line). `None` when the client
/// closed or stayed idle between requests, which ends the connection quietly.
fn read_head(r: &mut BufReader<Stream>, limits: &Limits) -> Result<Option<Vec<u8>>, Fault> {
    let mut buf: Vec<u8> = Vec::new();
    let mut deadline: Option<Instant> = None;
    loop {
        let wait = match deadline {
            None => limits.idle_timeout,
            Some(d) => d.saturating_duration_since(Instant::now()),
        };
        if wait.is_zero() {
            return Err(slow_head(limits));
        }
        if r.buffer().is_empty() {
            let _ = r.get_ref().set_read_timeout(wait);
        }
        let avail = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if is_timeout(&e) => {
                return match deadline {
                    None => Ok(None),
                    Some(_) => Err(slow_head(limits)),
                };
            }
            Err(_) => return Ok(None),
        };
        if avail.is_empty() {
            return Ok(None); // EOF: a partial head has no one left to answer
        }
        let mut avail = avail;
        if buf.is_empty() {
            // Stray line breaks between requests are tolerated (RFC 9112 §2.2).
            let skip = avail
                .iter()
                .take_while(|&&b| b == b'\r' || b == b'\n')
                .count();
            if skip > 0 {
                r.consume(skip);
                continue;
            }
            deadline.get_or_insert_with(|| Instant::now() + limits.head_timeout);
            avail = r.buffer();
        }
        let old = buf.len();
        let take = avail.len().min(limits.max_head + 1 - old);
        buf.extend_from_slice(&avail[..take]);
        if let Some(end) = head_end(&buf, old.saturating_sub(3)) {
            r.consume(end - old);
            buf.truncate(end);
            return Ok(Some(buf));
        }
        r.consume(take);
        if buf.len() > limits.max_head {
            return Err(Fault::TooLarge(format!(
                "the request head is over {} bytes",
                limits.max_head
            )));
        }
    }
}

fn slow_head(limits: &Limits) -> Fault {
    Fault::TooSlow(format!(
        "the request head did not arrive within {} s",
        limits.head_timeout.as_secs_f64()
    ))
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// The index just past the blank line ending a head, searching from `from`.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(p) = memchr::memchr(b'\n', &buf[i..]) {
        let nl = i + p;
        let rest = &buf[nl + 1..];
        if rest.first() == Some(&b'\n') {
            return Some(nl + 2);
        }
        if rest.starts_with(b"\r\n") {
            return Some(nl + 3);
        }
        i = nl + 1;
    }
    None
}

/// Parses a head (request line and header lines, each ended by LF or CRLF).
pub fn parse_head(raw: &[u8], max_headers: usize) -> Result<Head, Fault> {
    let bad = |m: &str| Fault::Malformed(m.to_string());
    let mut lines = raw
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let line = lines.next().ok_or_else(|| bad("empty request"))?;
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad(
            "malformed request line: expected METHOD TARGET HTTP/1.1",
        ));
    };
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return Err(bad("malformed request line: bad method"));
    }
    let minor = match version {
        "HTTP/1.1" => 1,
        "HTTP/1.0" => 0,
        _ => return Err(bad("unsupported HTTP version: use HTTP/1.1")),
    };
    if target.is_empty() {
        return Err(bad("malformed request line: empty target"));
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, q),
        None => (target, ""),
    };
    let mut headers = Vec::new();
    for l in lines {
        if l.is_empty() {
            break;
        }
        if l[0] == b' ' || l[0] == b'\t' {
            return Err(bad("folded header lines are not supported"));
        }
        let colon = memchr::memchr(b':', l).ok_or_else(|| bad("a header line without ':'"))?;
        let name = &l[..colon];
        // No whitespace before the colon: proxies disagree on such names (RFC 9112 §5.1).
        if name.is_empty() || !name.iter().copied().all(is_tchar) {
            return Err(bad("malformed header name"));
        }
        let value = String::from_utf8_lossy(&l[colon + 1..])
            .trim_matches([' ', '\t'])
            .to_string();
        if value.bytes().any(|b| b == 0 || b == b'\r') {
            return Err(bad("a header value holds a control character"));
        }
        headers.push((String::from_utf8_lossy(name).into_owned(), value));
        if headers.len() > max_headers {
            return Err(Fault::TooLarge(format!(
                "more than {max_headers} header lines"
            )));
        }
    }
    Ok(Head {
        method: method.to_string(),
        target: target.to_string(),
        path: path.to_string(),
        query: query.to_string(),
        minor,
        headers,
    })
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// How a request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    None,
    Length(u64),
    Chunked,
}

/// Works out a request's body framing, refusing ambiguous or oversized ones up front.
pub fn framing(head: &Head, max_body: u64) -> Result<Framing, Fault> {
    let bad = |m: &str| Fault::Malformed(m.to_string());
    let te: Vec<&str> = head.all("transfer-encoding").collect();
    let cl: Vec<&str> = head.all("content-length").collect();
    if !te.is_empty() {
        if !cl.is_empty() {
            // The classic request-smuggling shape: refuse rather than pick one.
            return Err(bad("both Transfer-Encoding and Content-Length are set"));
        }
        if te.len() != 1 || !te[0].eq_ignore_ascii_case("chunked") {
            return Err(bad("the only Transfer-Encoding supported is chunked"));
        }
        return Ok(Framing::Chunked);
    }
    match cl.as_slice() {
        [] => Ok(Framing::None),
        [v] => {
            if v.is_empty() || v.len() > 19 || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad("Content-Length is not a number"));
            }
            let n: u64 = v
                .parse()
                .map_err(|_| bad("Content-Length is not a number"))?;
            if n > max_body {
                return Err(too_large_body(max_body));
            }
            Ok(if n == 0 {
                Framing::None
            } else {
                Framing::Length(n)
            })
        }
        _ => Err(bad("Content-Length is given more than once")),
    }
}

fn too_large_body(max: u64) -> Fault {
    Fault::TooLarge(format!(
        "the request body is over the limit of {max} bytes (--max-body)"
    ))
}

/// A reader that gives up at a deadline.
struct Timed<'a> {
    r: &'a mut BufReader<Stream>,
    deadline: Instant,
    what: Duration,
}

impl Timed<'_> {
    fn slow(&self) -> Fault {
        Fault::TooSlow(format!(
            "the request body did not arrive within {} s",
            self.what.as_secs_f64()
        ))
    }

    /// Buffered bytes, reading more if there are none; errors on EOF or the deadline.
    fn fill(&mut self) -> Result<&[u8], Fault> {
        loop {
            if self.r.buffer().is_empty() {
                let left = self.deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(self.slow());
                }
                let _ = self.r.get_ref().set_read_timeout(left);
            }
            match self.r.fill_buf() {
                Ok([]) => {
                    return Err(Fault::Malformed(
                        "the connection closed in the middle of the body".into(),
                    ));
                }
                Ok(_) => return Ok(self.r.buffer()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if is_timeout(&e) => return Err(self.slow()),
                Err(e) => return Err(Fault::Malformed(format!("reading the body: {e}"))),
            }
        }
    }

    fn read_into(&mut self, out: &mut Vec<u8>, mut n: u64) -> Result<(), Fault> {
        while n > 0 {
            let avail = self.fill()?;
            let take = avail.len().min(n.min(usize::MAX as u64) as usize);
            out.extend_from_slice(&avail[..take]);
            self.r.consume(take);
            n -= take as u64;
        }
        Ok(())
    }

    /// One line without its line end, at most `max` bytes.
    fn line(&mut self, max: usize) -> Result<Vec<u8>, Fault> {
        let mut line = Vec::new();
        loop {
            let avail = self.fill()?;
            if let Some(p) = memchr::memchr(b'\n', avail) {
                line.extend_from_slice(&avail[..p]);
                self.r.consume(p + 1);
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Ok(line);
            }
            let n = avail.len();
            line.extend_from_slice(avail);
            self.r.consume(n);
            if line.len() > max {
                return Err(Fault::Malformed("a chunk line is too long".into()));
            }
        }
    }
}

fn read_body(
    r: &mut BufReader<Stream>,
    framing: Framing,
    limits: &Limits,
) -> Result<Vec<u8>, Fault> {
    let mut t = Timed {
        r,
        deadline: Instant::now() + limits.body_timeout,
        what: limits.body_timeout,
    };
    let mut body = Vec::new();
    match framing {
        Framing::None => {}
        Framing::Length(n) => {
            body.reserve(n.min(1 << 20) as usize);
            t.read_into(&mut body, n)?;
        }
        Framing::Chunked => {
            loop {
                let line = t.line(1024)?;
                let size = parse_chunk_size(&line)?;
                if size == 0 {
                    break;
                }
                if body.len() as u64 + size > limits.max_body {
                    return Err(too_large_body(limits.max_body));
                }
                t.read_into(&mut body, size)?;
                if !t.line(2)?.is_empty() {
                    return Err(Fault::Malformed("a chunk is longer than its size".into()));
                }
            }
            // Trailers are read and dropped, within the same bounds as headers.
            let mut trailer_bytes = 0;
            loop {
                let line = t.line(limits.max_head)?;
                if line.is_empty() {
                    break;
                }
                trailer_bytes += line.len();
                if trailer_bytes > limits.max_head {
                    return Err(Fault::TooLarge("the chunked trailers are too long".into()));
                }
            }
        }
    }
    Ok(body)
}

/// Parses a chunk-size line: hex digits, then optional `;extensions`.
pub fn parse_chunk_size(line: &[u8]) -> Result<u64, Fault> {
    let bad = || Fault::Malformed("malformed chunk size".into());
    let end = line.iter().position(|&b| b == b';').unwrap_or(line.len());
    let hex = std::str::from_utf8(&line[..end])
        .map_err(|_| bad())?
        .trim_matches([' ', '\t']);
    if hex.is_empty() || hex.len() > 15 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    u64::from_str_radix(hex, 16).map_err(|_| bad())
}

/// The reason phrase of a status.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

/// Serializes a response: status line, headers and body in one buffer, so it leaves in one
/// write.
pub fn encode(resp: &Response, minor: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(160 + resp.body.len());
    let _ = write!(
        out,
        "HTTP/1.1 {} {}\r\nContent-Length: {}\r\n",
        resp.status,
        reason(resp.status),
        resp.body.len()
    );
    for (k, v) in &resp.headers {
        let _ = write!(out, "{k}: {v}\r\n");
    }
    if resp.close {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if minor == 0 {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&resp.body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str) -> Result<Head, Fault> {
        parse_head(raw.as_bytes(), 100)
    }

    #[test]
    fn parses_request_line_and_headers() {
        let h =
            head("GET /v1/jobs?limit=5 HTTP/1.1\r\nHost: x\r\nAuthorization:  Bearer t \r\n\r\n")
                .unwrap();
        assert_eq!(h.method, "GET");
        assert_eq!(h.path, "/v1/jobs");
        assert_eq!(h.query, "limit=5");
        assert_eq!(h.minor, 1);
        assert_eq!(h.header("authorization"), Some("Bearer t"));
        assert_eq!(h.header("HOST"), Some("x"));
        assert!(!h.wants_close());
        let h = head("GET / HTTP/1.0\n\n").unwrap();
        assert!(h.wants_close());
        let h = head("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").unwrap();
        assert!(!h.wants_close());
        let h = head("GET / HTTP/1.1\r\nConnection: foo, close\r\n\r\n").unwrap();
        assert!(h.wants_close());
    }

    #[test]
    fn refuses_malformed_heads() {
        for raw in [
            "GET /\r\n\r\n",
            "GET / HTTP/2.0\r\n\r\n",
            "GET  / HTTP/1.1\r\n\r\n",
            "G(T / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1 extra\r\n\r\n",
            "GET / HTTP/1.1\r\nNoColon\r\n\r\n",
            "GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
            "GET / HTTP/1.1\r\nName : x\r\n\r\n",
            "GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n",
            "GET / HTTP/1.1\r\n: x\r\n\r\n",
        ] {
            assert!(
                matches!(head(raw), Err(Fault::Malformed(_))),
                "{raw:?} -> {:?}",
                head(raw)
            );
        }
        let many: String = (0..101).map(|i| format!("X-{i}: y\r\n")).collect();
        assert!(matches!(
            head(&format!("GET / HTTP/1.1\r\n{many}\r\n")),
            Err(Fault::TooLarge(_))
        ));
    }

    #[test]
    fn finds_the_end_of_a_head() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nrest", 0), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\nrest", 0), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n", 0), None);
        // The blank line found when the search resumes three bytes back.
        let b = b"GET / HTTP/1.1\r\n\r\n";
        assert_eq!(head_end(b, b.len() - 4 - 3), Some(b.len()));
    }

    fn framed(headers: &str, max: u64) -> Result<Framing, Fault> {
        framing(
            &head(&format!("POST / HTTP/1.1\r\n{headers}\r\n")).unwrap(),
            max,
        )
    }

    #[test]
    fn body_framing_is_unambiguous() {
        assert_eq!(framed("", 10), Ok(Framing::None));
        assert_eq!(framed("Content-Length: 0\r\n", 10), Ok(Framing::None));
        assert_eq!(
            framed("Content-Length: 10\r\n", 10),
            Ok(Framing::Length(10))
        );
        assert!(matches!(
            framed("Content-Length: 11\r\n", 10),
            Err(Fault::TooLarge(_))
        ));
        assert!(matches!(
            framed("Content-Length: 99999999999999999999999\r\n", 10),
            Err(Fault::Malformed(_))
        ));
        for bad in [
            "Content-Length: -1\r\n",
            "Content-Length: 1e3\r\n",
            "Content-Length: +5\r\n",
            "Content-Length: 5\r\nContent-Length: 5\r\n",
            "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            "Transfer-Encoding: gzip\r\n",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
        ] {
            assert!(
                matches!(framed(bad, 10), Err(Fault::Malformed(_))),
                "{bad:?}"
            );
        }
        assert_eq!(
            framed("Transfer-Encoding: Chunked\r\n", 10),
            Ok(Framing::Chunked)
        );
    }

    #[test]
    fn chunk_sizes() {
        assert_eq!(parse_chunk_size(b"0").unwrap(), 0);
        assert_eq!(parse_chunk_size(b"1a").unwrap(), 26);
        assert_eq!(parse_chunk_size(b"FF;name=value").unwrap(), 255);
        for bad in [&b""[..], b"x", b"-1", b"1 2", b"fffffffffffffffff", b";a"] {
            assert!(parse_chunk_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn encodes_responses() {
        let resp = Response {
            status: 404,
            headers: vec![("Content-Type", "application/json".into())],
            body: b"{}".to_vec(),
            close: true,
            route: "",
            job_id: None,
        };
        assert_eq!(
            String::from_utf8(encode(&resp, 1)).unwrap(),
            "HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{}"
        );
    }
}
