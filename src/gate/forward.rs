//! One admitted request to the dev server and its answer back. The request's body is
//! pumped to the dev server on a thread of its own while the answer streams back on this
//! one, so neither side waits for the other to finish (an echo of 50 MB never deadlocks)
//! and each read is written on at once (Server-Sent Events arrive event by event).
//!
//! An upgrade is spliced only once the dev server answered `101`; any other answer is
//! relayed and the connection closed, so nothing is ever tunnelled raw after a refused
//! upgrade.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use super::Gate;
use super::answer::{self, Outcome};
use crate::http::client::{self, ResponseBody, ResponseHead};
use crate::http::{BodyReader, Framing, Head, Stream};
use crate::model::preview;
use crate::state::grants::Counted;

/// Largest response head the dev server may send.
const MAX_RESPONSE_HEAD: usize = 64 << 10;
/// How long connecting to the dev server may take: the 503 comes within it.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(1500);

/// A connection to the dev server, kept between the requests of one browser connection.
pub(super) struct Upstream {
    port: u16,
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Upstream {
    /// Another handle on its socket (for the connection registry).
    pub(super) fn socket(&self) -> Option<TcpStream> {
        self.w.try_clone().ok()
    }

    /// True if the dev server closed it while it sat idle (or sent what nobody asked).
    fn stale(&self) -> bool {
        if !self.r.buffer().is_empty() {
            return true;
        }
        use nix::sys::socket::{MsgFlags, recv};
        use std::os::fd::AsRawFd;
        let mut b = [0u8; 1];
        // One peek that does not wait: nothing to read (EAGAIN) is the one healthy answer.
        !matches!(
            recv(
                self.w.as_raw_fd(),
                &mut b,
                MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT
            ),
            Err(nix::errno::Errno::EAGAIN)
        )
    }
}

/// Answers 502 (the dev server gave no usable answer) and ends the exchange there.
fn bad_gateway(mut w: &TcpStream, msg: &str, head_only: bool) -> Forwarded {
    let _ = w.write_all(&answer::text(502, msg, true, head_only));
    Forwarded {
        status: 502,
        outcome: Outcome::Unavailable,
        keep: false,
    }
}

fn connect(port: u16) -> io::Result<Upstream> {
    let v4 = SocketAddr::from(([127, 0, 0, 1], port));
    let s = match TcpStream::connect_timeout(&v4, CONNECT_TIMEOUT) {
        Ok(s) => s,
        // A dev server that resolved `localhost` to `::1` (Node does, where IPv6 comes
        // first) listens there only; it is loopback all the same.
        // A dev server bound to another loopback address (`127.0.0.2`, which E2B's envd
        // does not re-expose) is found where it listens.
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            let v6 = SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
            match TcpStream::connect_timeout(&v6, CONNECT_TIMEOUT) {
                Ok(s) => s,
                Err(_) => other_loopback(port).ok_or(e)?,
            }
        }
        Err(e) => return Err(e),
    };
    let _ = s.set_nodelay(true);
    let w = s.try_clone()?;
    Ok(Upstream {
        port,
        r: BufReader::with_capacity(super::STREAM_BUFFER, s),
        w,
    })
}

/// A connection to `port` on whichever other loopback address a socket listens there.
fn other_loopback(port: u16) -> Option<TcpStream> {
    crate::os::ports::listening()
        .into_iter()
        .filter(|l| l.port == port)
        .filter_map(|l| l.address.parse::<std::net::IpAddr>().ok())
        .filter(|a| a.is_loopback())
        .find_map(|a| TcpStream::connect_timeout(&SocketAddr::new(a, port), CONNECT_TIMEOUT).ok())
}

/// True if the request asks to switch protocols (`Connection: upgrade` and `Upgrade`).
pub(super) fn is_upgrade(head: &Head) -> bool {
    head.header("upgrade").is_some()
        && head
            .all("connection")
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// The request head as the dev server gets it: the gate's cookie, `preview_token` and
/// hop-by-hop headers out, `Host: localhost:<port>`, `Origin` (checked before) rewritten
/// to the dev server's own, and the `X-Forwarded-*` headers that say where it came from.
fn upstream_head(
    head: &Head,
    framing: Framing,
    port: u16,
    peer: SocketAddr,
    upgrade: bool,
) -> Vec<u8> {
    let connection: Vec<&str> = head.all("connection").collect();
    let mut hs: Vec<(String, String)> = vec![("Host".into(), format!("localhost:{port}"))];
    let mut xff: Vec<&str> = Vec::new();
    let mut proto = "http";
    for (n, v) in &head.headers {
        if client::is_hop_by_hop(n, connection.iter().copied()) {
            continue;
        }
        match n.to_ascii_lowercase().as_str() {
            "host" | "content-length" | "x-forwarded-host" | "forwarded" => {}
            "x-forwarded-for" => xff.push(v),
            "x-forwarded-proto" => {
                if v.eq_ignore_ascii_case("https") {
                    proto = "https";
                }
            }
            "origin" => hs.push(("Origin".into(), format!("http://localhost:{port}"))),
            "cookie" => {
                if let Some(kept) = preview::strip_gate_cookies(v) {
                    hs.push((n.clone(), kept));
                }
            }
            _ => hs.push((n.clone(), v.clone())),
        }
    }
    if let Some(h) = head.header("host") {
        hs.push(("X-Forwarded-Host".into(), h.to_string()));
    }
    hs.push(("X-Forwarded-Proto".into(), proto.into()));
    let ip = peer.ip().to_string();
    xff.push(&ip);
    hs.push(("X-Forwarded-For".into(), xff.join(", ")));
    match framing {
        Framing::Length(n) => hs.push(("Content-Length".into(), n.to_string())),
        Framing::Chunked => hs.push(("Transfer-Encoding".into(), "chunked".into())),
        Framing::None => {}
    }
    if upgrade {
        hs.push(("Connection".into(), "Upgrade".into()));
        hs.push((
            "Upgrade".into(),
            head.header("upgrade").unwrap_or("").into(),
        ));
    }
    let q = preview::query_without_token(&head.query);
    let target = if q.is_empty() {
        head.path.clone()
    } else {
        format!("{}?{q}", head.path)
    };
    client::request_head(&head.method, &target, &hs)
}

/// The dev server's response head as the browser gets it: hop-by-hop headers out, and the
/// framing of this hop.
fn downstream_head(
    minor: u8,
    rh: &ResponseHead,
    body: ResponseBody,
    chunked: bool,
    close: bool,
) -> Vec<u8> {
    let connection: Vec<&str> = rh.all("connection").collect();
    let mut hs: Vec<(String, String)> = Vec::new();
    for (n, v) in &rh.headers {
        if client::is_hop_by_hop(n, connection.iter().copied()) {
            continue;
        }
        // A length is sent as the body's own (a HEAD's or a 304's is the GET's, kept).
        if n.eq_ignore_ascii_case("content-length") && body != ResponseBody::None {
            continue;
        }
        hs.push((n.clone(), v.clone()));
    }
    match body {
        ResponseBody::Length(n) => hs.push(("Content-Length".into(), n.to_string())),
        _ if chunked => hs.push(("Transfer-Encoding".into(), "chunked".into())),
        _ => {}
    }
    if rh.status == 101 {
        hs.push(("Connection".into(), "Upgrade".into()));
        if let Some(u) = rh.header("upgrade") {
            hs.push(("Upgrade".into(), u.into()));
        }
    } else if close {
        hs.push(("Connection".into(), "close".into()));
    }
    client::response_head(minor, rh.status, &rh.reason, &hs)
}

/// What became of a forwarded request.
pub(super) struct Forwarded {
    pub status: u16,
    pub outcome: Outcome,
    /// The browser's connection may carry another request.
    pub keep: bool,
}

/// Everything a forward needs from its connection.
pub(super) struct Request<'a> {
    pub head: &'a Head,
    pub framing: Framing,
    pub port: u16,
    pub peer: SocketAddr,
    pub close: bool,
}

/// Forwards one request and relays its answer; `upstream` is the dev server connection
/// kept from the previous request, and is left for the next one when it can be reused.
pub(super) fn forward(
    gate: &Gate,
    r: &mut BufReader<Stream>,
    w: &mut TcpStream,
    req: &Request<'_>,
    counted: &Counted,
    upstream: &mut Option<Upstream>,
) -> Forwarded {
    let head = req.head;
    let upgrade = is_upgrade(head);
    let has_body = req.framing != Framing::None;
    let unavailable = |w: &mut TcpStream, body: String| {
        let _ = w.write_all(&answer::text(503, &body, has_body, head.method == "HEAD"));
        Forwarded {
            status: 503,
            outcome: Outcome::Unavailable,
            keep: !has_body && !req.close,
        }
    };
    // A kept connection may have been closed by the dev server meanwhile: one fresh try
    // for a request without a body, where resending cannot do anything twice.
    let mut reused = false;
    let mut up = match upstream.take().filter(|u| u.port == req.port && !u.stale()) {
        Some(u) => {
            reused = true;
            u
        }
        None => {
            counted.clear_upstream();
            match connect(req.port) {
                Ok(u) => {
                    if let Some(s) = u.socket() {
                        counted.add(s);
                    }
                    u
                }
                Err(_) => return unavailable(w, answer::nothing_listening(req.port)),
            }
        }
    };
    let up_head = upstream_head(head, req.framing, req.port, req.peer, upgrade);
    if !reused {
        timeouts(gate, &up);
    }
    let limits = &gate.cfg.http;
    // Set by the pump once it has read the browser's body to its end.
    let read_all = &std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        let mut first = up.w.write_all(&up_head);
        if first.is_err() && reused && !has_body {
            counted.clear_upstream();
            match connect(req.port) {
                Ok(u) => {
                    up = u;
                    timeouts(gate, &up);
                    if let Some(s) = up.socket() {
                        counted.add(s);
                    }
                    first = up.w.write_all(&up_head);
                }
                Err(_) => return unavailable(w, answer::nothing_listening(req.port)),
            }
        }
        if first.is_err() {
            return unavailable(w, answer::nothing_listening(req.port));
        }
        let mut pump_to = match up.w.try_clone() {
            Ok(s) => s,
            Err(_) => return unavailable(w, answer::nothing_listening(req.port)),
        };
        let framing = req.framing;
        // The browser's side is read by the pump (a body) or by the splice (an upgrade,
        // which has none), never both.
        let (pump_r, splice_r) = if has_body {
            (Some(r), None)
        } else {
            (None, Some(r))
        };
        let pump = pump_r.map(|r| {
            let browser = w.try_clone().ok();
            sc.spawn(move || {
                if let (Framing::Length(n), Some(b)) = (framing, &browser)
                    && n > client::BULK as u64
                {
                    return pump_bulk(r, b, n, limits, &mut pump_to, read_all);
                }
                pump_body(r, framing, limits, &mut pump_to, read_all)
            })
        });
        // Cuts what is left of the request: the browser's side (the pump reads it) and the
        // dev server's (the pump writes it), then waits for the pump.
        let abandon = |pump: Option<std::thread::ScopedJoinHandle<'_, io::Result<bool>>>,
                       w: &TcpStream,
                       up: &Upstream| {
            if let Some(p) = pump {
                if !p.is_finished() {
                    let _ = w.shutdown(Shutdown::Both);
                    let _ = up.w.shutdown(Shutdown::Both);
                }
                let _ = p.join();
            }
        };
        let rh = loop {
            let rh = match client::read_response_head(&mut up.r, MAX_RESPONSE_HEAD) {
                Ok(Some(rh)) => rh,
                Ok(None) | Err(_) => {
                    abandon(pump, w, &up);
                    return bad_gateway(
                        w,
                        &format!(
                            "PreviewUnavailable: the dev server on port {} closed the connection without an answer",
                            req.port
                        ),
                        head.method == "HEAD",
                    );
                }
            };
            if (100..200).contains(&rh.status) && rh.status != 101 {
                let _ = w.write_all(&downstream_head(
                    head.minor,
                    &rh,
                    ResponseBody::None,
                    false,
                    false,
                ));
                continue;
            }
            break rh;
        };
        if rh.status == 101 {
            let Some(r) = splice_r.filter(|_| upgrade) else {
                abandon(pump, w, &up);
                return bad_gateway(
                    w,
                    "the dev server switched protocols where none was asked for\n",
                    false,
                );
            };
            if w.write_all(&downstream_head(
                head.minor,
                &rh,
                ResponseBody::None,
                false,
                false,
            ))
            .is_ok()
            {
                splice(r, w, &mut up, gate.cfg.stream_idle_timeout);
            }
            return Forwarded {
                status: 101,
                outcome: Outcome::Forwarded,
                keep: false,
            };
        }
        let body = match client::response_body(&head.method, &rh) {
            Ok(b) => b,
            Err(e) => {
                abandon(pump, w, &up);
                return bad_gateway(
                    w,
                    &format!("the dev server's answer was malformed: {e}\n"),
                    false,
                );
            }
        };
        let streams = matches!(body, ResponseBody::Chunked | ResponseBody::UntilClose);
        let chunked = streams && head.minor >= 1;
        // After a refused upgrade the connection closes: what the browser sends next was
        // meant for another protocol, and must not be read as HTTP.
        let close = req.close || upgrade || (streams && !chunked);
        let mut out = downstream_head(head.minor, &rh, body, chunked, close);
        let relayed = match body {
            // A small body already read goes out with its head, in one write.
            ResponseBody::Length(n) if n <= 64 << 10 && up.r.buffer().len() as u64 >= n => {
                out.extend_from_slice(&up.r.buffer()[..n as usize]);
                up.r.consume(n as usize);
                w.write_all(&out).map(|()| n)
            }
            // A stream may be silent for long between events; a sized body may not.
            _ if streams => {
                let _ =
                    up.r.get_ref()
                        .set_read_timeout(Some(gate.cfg.stream_idle_timeout));
                let relayed = w
                    .write_all(&out)
                    .and_then(|()| client::relay_body(&mut up.r, body, w, chunked));
                let _ =
                    up.r.get_ref()
                        .set_read_timeout(Some(gate.cfg.upstream_head_timeout));
                relayed
            }
            _ => w
                .write_all(&out)
                .and_then(|()| client::relay_body(&mut up.r, body, w, chunked)),
        };
        let mut keep = !close && relayed.is_ok();
        if let Some(p) = pump {
            // Once the browser's body was read whole, what is left of the pump is its last
            // write to the dev server: wait for it. Else the body is still coming after
            // the answer, and the connection cannot carry another request.
            if p.is_finished() || read_all.load(std::sync::atomic::Ordering::SeqCst) {
                keep &= matches!(p.join(), Ok(Ok(true)));
            } else {
                keep = false;
                abandon(Some(p), w, &up);
            }
        }
        if relayed.is_err() {
            // A body cut short is cut here too: the browser must not take it for whole.
            let _ = w.shutdown(Shutdown::Both);
        }
        if keep && !rh.closes() && body != ResponseBody::UntilClose {
            *upstream = Some(up);
        } else {
            counted.clear_upstream();
        }
        Forwarded {
            status: rh.status,
            outcome: Outcome::Forwarded,
            keep,
        }
    })
}

/// Sets a new dev server connection's timeouts: writes as the browser's, reads (the wait
/// for an answer) as `upstream_head_timeout`.
fn timeouts(gate: &Gate, up: &Upstream) {
    let _ = up.w.set_write_timeout(Some(gate.cfg.http.write_timeout));
    let _ =
        up.r.get_ref()
            .set_read_timeout(Some(gate.cfg.upstream_head_timeout));
}

/// [`pump_body`] for a large body of known length: read in large pieces straight off the
/// socket (past the 64 KiB buffer, once that is drained), each read within the body
/// timeout.
fn pump_bulk(
    r: &mut BufReader<Stream>,
    browser: &TcpStream,
    mut n: u64,
    limits: &crate::http::Limits,
    up: &mut TcpStream,
    read_all: &std::sync::atomic::AtomicBool,
) -> io::Result<bool> {
    let res = (|| {
        browser.set_read_timeout(Some(limits.body_timeout))?;
        let take = r.buffer().len().min(n.min(usize::MAX as u64) as usize);
        up.write_all(&r.buffer()[..take])?;
        r.consume(take);
        n -= take as u64;
        let mut big = vec![0u8; client::BULK];
        while n > 0 {
            let want = big.len().min(n.min(usize::MAX as u64) as usize);
            let got = match r.read(&mut big[..want]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the connection closed in the middle of the body",
                    ));
                }
                Ok(k) => k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            n -= got as u64;
            // Told before the last write: the dev server may answer as soon as it has it.
            if n == 0 {
                read_all.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            up.write_all(&big[..got])?;
        }
        read_all.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(true)
    })();
    if res.is_err() {
        let _ = up.shutdown(Shutdown::Both);
    }
    res
}

/// Sends the browser's request body on as it arrives: true once it was read to its end.
fn pump_body(
    r: &mut BufReader<Stream>,
    framing: Framing,
    limits: &crate::http::Limits,
    up: &mut TcpStream,
    read_all: &std::sync::atomic::AtomicBool,
) -> io::Result<bool> {
    let mut body = BodyReader::new(r, framing, limits, u64::MAX);
    let mut buf = vec![0u8; super::STREAM_BUFFER];
    let chunked = framing == Framing::Chunked;
    let res = (|| {
        loop {
            let n = body.read(&mut buf)?;
            // Told before the last write: the dev server may answer as soon as it has it,
            // and the answer must not find the pump still busy and cut the connection.
            if body.complete() {
                read_all.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            if n == 0 {
                read_all.store(body.complete(), std::sync::atomic::Ordering::SeqCst);
                break;
            }
            if chunked {
                client::write_chunk(up, &buf[..n])?;
            } else {
                up.write_all(&buf[..n])?;
            }
        }
        if chunked {
            up.write_all(b"0\r\n\r\n")?;
        }
        Ok(body.complete())
    })();
    if res.is_err() {
        // A body the browser broke off is broken off for the dev server too, never ended
        // as if it were whole.
        let _ = up.shutdown(Shutdown::Both);
    }
    res
}

/// Copies both ways between the browser and the dev server until either side closes,
/// errs, or is silent for `idle`; then both are closed.
fn splice(r: &mut BufReader<Stream>, w: &TcpStream, up: &mut Upstream, idle: Duration) {
    let _ = w.set_read_timeout(Some(idle));
    let _ = up.r.get_ref().set_read_timeout(Some(idle));
    let (Ok(up_w), Ok(down_w)) = (up.w.try_clone(), w.try_clone()) else {
        return;
    };
    let pending_up = r.buffer().to_vec();
    r.consume(pending_up.len());
    let pending_down = up.r.buffer().to_vec();
    up.r.consume(pending_down.len());
    let end = |a: &TcpStream, b: &TcpStream| {
        let _ = a.shutdown(Shutdown::Both);
        let _ = b.shutdown(Shutdown::Both);
    };
    std::thread::scope(|sc| {
        let client = r.get_mut();
        let (up_w2, down_w2) = (&up_w, &down_w);
        sc.spawn(move || {
            let _ = copy(&pending_up, client, up_w2);
            end(up_w2, down_w2);
        });
        let _ = copy(&pending_down, up.r.get_mut(), &down_w);
        end(&up_w, &down_w);
    });
}

/// Writes `first`, then every read of `from` to `to` as it comes, until EOF or an error.
fn copy(first: &[u8], from: &mut impl Read, mut to: &TcpStream) -> io::Result<()> {
    to.write_all(first)?;
    let mut buf = vec![0u8; 32 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
    }
}
