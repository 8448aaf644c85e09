//! The accept loop and each connection's loop: keep-alive and pipelining, the connection
//! cap, and the order of a request's steps (head, handler check, body, handler, response).

use std::io::{self, BufReader, Read, Write};
use std::net::Shutdown;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::body::{Framing, framing, read_body};
use super::encode::encode;
use super::head::{Head, parse_head, read_head};
use super::net::{Listener, Stream};
use super::{Fault, Handler, Request, Response};

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

/// One in a counter for as long as it lives.
struct Count<'a>(&'a AtomicUsize);

impl<'a> Count<'a> {
    fn new(c: &'a AtomicUsize) -> Count<'a> {
        c.fetch_add(1, Ordering::SeqCst);
        Count(c)
    }

    /// Takes over one that was already added.
    fn counted(c: &'a AtomicUsize) -> Count<'a> {
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
                let _open = Count::counted(&s.open);
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
        let admitted = match handler.check(&head) {
            Ok(a) => a,
            Err(resp) => {
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
        };
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
        let resp = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            handler.handle(admitted, req)
        })) {
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
