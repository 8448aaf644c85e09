//! The accept loop and each connection's loop: keep-alive and pipelining, the connection
//! cap (and whom to close to stay under it), and the order of a request's steps (head,
//! handler check, body, handler, response).

use std::collections::HashMap;
use std::io::{self, BufReader, Read, Write};
use std::net::Shutdown;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::body::{BodyReader, Framing, framing, read_body};
use super::encode::{encode, write_response, write_streamed};
use super::head::{Head, check_host, parse_head, read_head};
use super::net::{Listener, Stream};
use super::{Fault, Handler, Limits, Request, Response, Upgraded};

/// Bodies up to this size are read and dropped when a request is refused before its body,
/// so the connection can stay open.
const SKIPPABLE_BODY: u64 = 64 << 10;

/// A kept-alive connection is not closed to admit another until it has been idle this
/// long: a client usually sends its next request right after an answer.
const KEEP_ALIVE_GRACE: Duration = Duration::from_secs(1);

/// Shared state between the accept loop and connection threads.
#[derive(Default)]
pub struct State {
    /// Set once the server stops accepting: connections close after their current response.
    pub stopping: AtomicBool,
    /// Connections in the middle of a request.
    pub busy: AtomicUsize,
    /// Every open connection.
    table: Mutex<Table>,
}

impl State {
    /// Open connections, those being closed included.
    pub fn open(&self) -> usize {
        self.table().conns.len()
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The open connections, so that the accept loop can choose one to close at the cap.
#[derive(Default)]
struct Table {
    next: u64,
    conns: HashMap<u64, Slot>,
    /// How many of `conns` were shed and are closing.
    shed: usize,
}

struct Slot {
    /// A second handle on the connection's socket, to shut it down from outside.
    stream: Stream,
    phase: Phase,
    /// When `phase` began.
    since: Instant,
    /// Some request on it carried valid credentials.
    trusted: bool,
    /// Closed to admit another; its thread stops at its next step.
    shed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Accepted; its first head is not complete yet.
    New,
    /// Between requests (kept alive).
    Idle,
    /// A request is being read, handled or answered: before its head is checked, or after
    /// it proved valid credentials.
    Busy,
    /// A request without valid credentials (refused, or to a public route) is being
    /// answered: its body skipped, its answer written. Only a client that trickles or does
    /// not read makes this last.
    Public,
}

impl Table {
    fn live(&self) -> usize {
        self.conns.len() - self.shed
    }

    fn add(&mut self, stream: Stream, now: Instant) -> u64 {
        self.next += 1;
        self.conns.insert(
            self.next,
            Slot {
                stream,
                phase: Phase::New,
                since: now,
                trusted: false,
                shed: false,
            },
        );
        self.next
    }

    fn remove(&mut self, id: u64) {
        if self.conns.remove(&id).is_some_and(|s| s.shed) {
            self.shed -= 1;
        }
    }

    /// Moves a connection to `phase`; false if it was shed (its thread should stop).
    fn set(&mut self, id: u64, phase: Phase) -> bool {
        match self.conns.get_mut(&id) {
            Some(s) if !s.shed => {
                s.phase = phase;
                s.since = Instant::now();
                true
            }
            _ => false,
        }
    }

    /// Records what a checked request proved: valid credentials mark the connection
    /// trusted; without them it is [`Phase::Public`] until answered. False if it was shed.
    fn checked(&mut self, id: u64, trusted: bool) -> bool {
        if !trusted {
            return self.set(id, Phase::Public);
        }
        match self.conns.get_mut(&id) {
            Some(s) if !s.shed => {
                s.trusted = true;
                true
            }
            _ => false,
        }
    }

    /// The connection to close so that a new one may open. First one that has not sent a
    /// whole head since it was accepted (silent, or trickling one), or that has taken over
    /// [`KEEP_ALIVE_GRACE`] to be answered without valid credentials (trickling a refused
    /// body, or not reading), the longest waiting first; else one kept alive and idle for
    /// [`KEEP_ALIVE_GRACE`], one that never authenticated before one that did, the longest
    /// idle first. Never one in the middle of an authenticated request, nor one whose next
    /// bytes have arrived but are not read yet.
    fn victim(&self, now: Instant) -> Option<u64> {
        let mut idle: Vec<(bool, bool, Instant, u64)> = self
            .conns
            .iter()
            .filter(|(_, s)| {
                let waited = now.duration_since(s.since) >= KEEP_ALIVE_GRACE;
                !s.shed
                    && match s.phase {
                        Phase::New => true,
                        Phase::Idle | Phase::Public => waited,
                        Phase::Busy => false,
                    }
            })
            .map(|(&id, s)| (s.phase == Phase::Idle, s.trusted, s.since, id))
            .collect();
        idle.sort_unstable();
        idle.into_iter()
            .map(|(.., id)| id)
            .find(|id| !self.conns[id].stream.has_input())
    }

    /// Closes a connection to admit another: a 429 (it may be about to send a request),
    /// then a shutdown, which wakes its thread from its read. Returns the answer, to be
    /// logged once the table is unlocked.
    fn shed<H: Handler>(&mut self, id: u64, handler: &H) -> Option<Response> {
        let s = self.conns.get_mut(&id)?;
        s.shed = true;
        self.shed += 1;
        let mut resp = handler.fault(&Fault::Busy(
            "the server is at its connection limit and closed this idle connection to admit another; retry shortly".into(),
        ));
        resp.close = true;
        // Non-blocking: the answer fits an empty send buffer, or is dropped.
        let _ = s.stream.set_nonblocking();
        let _ = (&s.stream).write(&encode(&resp, 1));
        s.stream.shutdown(Shutdown::Both);
        Some(resp)
    }
}

/// Takes a connection out of the table when its thread ends.
struct Listed<'a> {
    state: &'a State,
    id: u64,
}

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        self.state.table().remove(self.id);
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
        let now = Instant::now();
        let mut table = state.table();
        let full = table.live() >= limits.max_connections;
        let victim = if full { table.victim(now) } else { None };
        // Connections being shed still hold their sockets for a moment: bound those too.
        let closing_room = table.conns.len() < limits.max_connections + 64;
        if full && (victim.is_none() || !closing_room) {
            drop(table);
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
        let shed = victim.and_then(|v| table.shed(v, &*handler));
        // Listed before the thread starts so a burst cannot overshoot the cap.
        let id = table.add(stream.clone(), now);
        drop(table);
        if let Some(resp) = shed {
            handler.done(None, &resp, Duration::ZERO);
        }
        let (h, l, s) = (
            Arc::clone(&handler),
            Arc::clone(&limits),
            Arc::clone(&state),
        );
        let spawned = std::thread::Builder::new()
            .name("conn".into())
            .stack_size(limits.stack_size)
            .spawn(move || {
                let listed = Listed { state: &s, id };
                connection(stream, listed, now, &*h, &l);
            });
        if let Err(e) = spawned {
            state.table().remove(id);
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

/// One in a counter for as long as it lives.
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

fn connection<H: Handler>(
    stream: Stream,
    listed: Listed<'_>,
    accepted: Instant,
    handler: &H,
    limits: &Limits,
) {
    let state = listed.state;
    let mut r = BufReader::with_capacity(16 << 10, stream);
    // The first head is due `head_timeout` after the accept, not after its first byte.
    let mut head_by = Some(accepted + limits.head_timeout);
    loop {
        let read = read_head(&mut r, limits, head_by.take());
        let started = Instant::now();
        // A connection shed meanwhile drops what it read: the table has given its place away.
        if !state.table().set(listed.id, Phase::Busy) {
            return;
        }
        let raw = match read {
            Ok(Some(raw)) => raw,
            Ok(None) => return,
            Err(fault) => {
                let _ = respond_fault(&mut r, handler, None, fault, started, limits);
                return;
            }
        };
        let _busy = Count::new(&state.busy);
        let head = match parse_head(&raw, limits.max_headers) {
            Ok(h) => h,
            Err(fault) => {
                let _ = respond_fault(&mut r, handler, None, fault, started, limits);
                return;
            }
        };
        if let Err(fault) = check_host(&head) {
            let _ = respond_fault(&mut r, handler, Some(&head), fault, started, limits);
            return;
        }
        let streamed = handler.streamed_body(&head);
        let framing = match framing(&head, streamed.unwrap_or(limits.max_body)) {
            Ok(f) => f,
            Err(fault) => {
                let _ = respond_fault(&mut r, handler, Some(&head), fault, started, limits);
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
                if !state.table().checked(listed.id, false) {
                    return;
                }
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
                let out = Out {
                    handler,
                    limits,
                    started,
                };
                if !out.finish(&mut r, &head, *resp, close || unread, unread)
                    || !state.table().set(listed.id, Phase::Idle)
                {
                    return;
                }
                continue;
            }
        };
        if !state.table().checked(listed.id, handler.trusted(&admitted)) {
            return;
        }
        if expects_continue && framing != Framing::None {
            let _ = r.get_ref().write_all_by(
                b"HTTP/1.1 100 Continue\r\n\r\n",
                Instant::now() + limits.write_timeout,
            );
        }
        let mut unread = false;
        let answered = if let Some(max) = streamed {
            let mut body = BodyReader::new(&mut r, framing, limits, max);
            let answered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                handler.handle_stream(admitted, &head, &mut body)
            }));
            // A small body the handler did not read (it refused the request) is skipped,
            // so that the connection can stay open.
            if answered.as_ref().is_ok_and(|r| !r.close) {
                body.skip(SKIPPABLE_BODY);
            }
            unread = !body.complete();
            answered
        } else {
            let body = match read_body(&mut r, framing, limits) {
                Ok(b) => b,
                Err(fault) => {
                    let _ = respond_fault(&mut r, handler, Some(&head), fault, started, limits);
                    return;
                }
            };
            let req = Request {
                head: head.clone(),
                body,
            };
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                handler.handle(admitted, req)
            }))
        };
        let mut resp = match answered {
            Ok(resp) => resp,
            Err(_) => {
                let mut resp = handler.fault(&Fault::Panic);
                resp.close = true;
                resp
            }
        };
        // A HEAD never upgrades: its answer is a head, then the next request.
        if resp.status == 101
            && head.method != "HEAD"
            && let Some(take_over) = resp.upgrade.as_ref().and_then(|u| u.take())
        {
            let ok = send(&r, &mut resp, &head, limits).is_ok();
            handler.done(Some(&head), &resp, started.elapsed());
            // The connection is the handler's now: it no longer counts as a request.
            drop(_busy);
            if ok {
                let read_ahead = r.buffer().to_vec();
                take_over(Upgraded {
                    stream: r.into_inner(),
                    read_ahead,
                });
            }
            return;
        }
        let close = close || unread || resp.close || state.stopping.load(Ordering::SeqCst);
        let out = Out {
            handler,
            limits,
            started,
        };
        if !out.finish(&mut r, &head, resp, close, unread)
            || !state.table().set(listed.id, Phase::Idle)
        {
            return;
        }
    }
}

/// Where a response goes out: the handler (for the log), the limits, the request's start.
struct Out<'a, H> {
    handler: &'a H,
    limits: &'a Limits,
    started: Instant,
}

impl<H: Handler> Out<'_, H> {
    /// Writes a response (within the write timeout) and logs it; false when the connection
    /// is done.
    fn finish(
        &self,
        r: &mut BufReader<Stream>,
        head: &Head,
        mut resp: Response,
        close: bool,
        unread_body: bool,
    ) -> bool {
        resp.close = close;
        let ok = send(r, &mut resp, head, self.limits).is_ok();
        self.handler.done(Some(head), &resp, self.started.elapsed());
        if !ok || resp.close {
            linger_close(r, unread_body);
            return false;
        }
        true
    }
}

fn respond_fault<H: Handler>(
    r: &mut BufReader<Stream>,
    handler: &H,
    head: Option<&Head>,
    fault: Fault,
    started: Instant,
    limits: &Limits,
) -> io::Result<()> {
    let mut resp = handler.fault(&fault);
    resp.close = true;
    let res = match head {
        Some(h) => send(r, &mut resp, h, limits),
        None => {
            let by = Instant::now() + limits.write_timeout;
            write_response(&resp, 1, false, |b| r.get_ref().write_all_by(b, by))
        }
    };
    handler.done(head, &resp, started.elapsed());
    linger_close(r, !matches!(fault, Fault::TooSlow(_)));
    res
}

/// Writes the response to `head` within the write timeout, counted for the whole response;
/// or, for a streamed body, for its head and then each block of the body (which may set
/// `resp.close`: see [`write_streamed`]). A `HEAD` is answered as its `GET` was, without
/// the body.
fn send(
    r: &BufReader<Stream>,
    resp: &mut Response,
    head: &Head,
    limits: &Limits,
) -> io::Result<()> {
    let stream = r.get_ref();
    let head_only = head.method == "HEAD";
    if let Some(body) = resp.stream.take() {
        return write_streamed(
            resp,
            body,
            head.minor,
            head_only,
            stream,
            limits.write_timeout,
        );
    }
    let by = Instant::now() + limits.write_timeout;
    write_response(resp, head.minor, head_only, |b| stream.write_all_by(b, by))
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    /// A table entry over one end of a socket pair (the other end is returned, to write to).
    fn add(t: &mut Table, phase: Phase, since: Instant, trusted: bool) -> (u64, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        let id = t.add(Stream::from_unix(a), since);
        let s = t.conns.get_mut(&id).unwrap();
        s.phase = phase;
        s.trusted = trusted;
        (id, b)
    }

    #[test]
    fn at_the_cap_idle_connections_give_way_in_order() {
        let now = Instant::now();
        let ago = |ms: u64| now - Duration::from_millis(ms);
        let mut t = Table::default();
        let (_busy, _b0) = add(&mut t, Phase::Busy, ago(60_000), true);
        let (_answering, _b6) = add(&mut t, Phase::Public, ago(100), false);
        let (stuck, _b7) = add(&mut t, Phase::Public, ago(3_000), false);
        let (_fresh_idle, _b1) = add(&mut t, Phase::Idle, ago(100), false);
        let (trusted_idle, _b2) = add(&mut t, Phase::Idle, ago(5_000), true);
        let (idle, _b3) = add(&mut t, Phase::Idle, ago(2_000), false);
        let (new, _b4) = add(&mut t, Phase::New, ago(10), false);
        let (older_new, mut b5) = add(&mut t, Phase::New, ago(500), false);
        // Not sent a whole head since the accept, or stuck being refused, the longest
        // waiting first; but not one whose bytes have arrived and wait to be read.
        b5.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!(t.victim(now), Some(stuck));
        t.conns.remove(&stuck);
        assert_eq!(t.victim(now), Some(new));
        t.conns.remove(&new);
        // Once read, its head is no excuse (it may trickle it).
        let mut buf = [0u8; 64];
        let _ = t.conns[&older_new].stream.clone().read(&mut buf).unwrap();
        assert_eq!(t.victim(now), Some(older_new));
        t.conns.remove(&older_new);
        // Then kept-alive ones idle past the grace, those that never authenticated first.
        assert_eq!(t.victim(now), Some(idle));
        t.conns.remove(&idle);
        assert_eq!(t.victim(now), Some(trusted_idle));
        t.conns.remove(&trusted_idle);
        // Never one in the middle of an authenticated request, nor one just answered or
        // being answered.
        assert_eq!(t.victim(now), None);
    }

    #[test]
    fn a_shed_connection_is_told_and_closed_and_its_thread_stops() {
        struct H;
        impl Handler for H {
            type Admitted = ();
            fn check(&self, _: &Head) -> Result<(), Box<Response>> {
                Ok(())
            }
            fn trusted(&self, _: &()) -> bool {
                false
            }
            fn handle(&self, _: (), _: Request) -> Response {
                unreachable!()
            }
            fn fault(&self, _: &Fault) -> Response {
                Response::new(429, vec![], b"busy".to_vec())
            }
            fn done(&self, _: Option<&Head>, _: &Response, _: Duration) {}
        }
        let mut t = Table::default();
        let (id, mut peer) = add(&mut t, Phase::New, Instant::now(), false);
        assert_eq!(t.live(), 1);
        assert_eq!(t.shed(id, &H).unwrap().status, 429);
        assert_eq!((t.live(), t.conns.len()), (0, 1));
        let mut got = String::new();
        peer.read_to_string(&mut got).unwrap();
        assert!(got.starts_with("HTTP/1.1 429 ") && got.contains("Connection: close"));
        // Its thread learns it at its next step, and leaves the table.
        assert!(!t.set(id, Phase::Busy));
        t.remove(id);
        assert_eq!((t.live(), t.conns.len(), t.shed), (0, 0, 0));
    }
}
