//! Tickets and CORS, as a browser page, a page of another origin, and a caller with a
//! scoped token or a stolen ticket would use them: a ticket opens its one request once,
//! never another route or job, never with more than its minter's access, and a refusal for
//! its `Origin` leaves it for the page that was meant; CORS grants go to allowed origins
//! on the browser routes only; preflights are answered without a token.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use crate::util::*;

const PAGE: &str = "http://127.0.0.1:5173";
const EVIL: &str = "https://evil.example";
const SCOPED: &str = "scoped-token-0123456789abcdef";

/// A server that allows [`PAGE`], with a scoped token.
fn server() -> Server {
    let sb = Arc::new(Sandbox::new());
    let scoped = sb.dir().join("scoped.token");
    write_mode(&scoped, &format!("{SCOPED}\n"), 0o600);
    Server::start_in(
        sb,
        "127.0.0.1:0",
        &[
            "--allowed-origin",
            PAGE,
            "--scoped-token-file",
            scoped.to_str().unwrap(),
        ],
    )
}

/// A response read off its own connection, its body as far as it was read.
struct Stream {
    r: BufReader<TcpStream>,
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    chunked: bool,
    /// The body ended (its last chunk, its length, or the connection's close).
    ended: bool,
}

/// Sends one request on a new connection (no token unless a header gives one) and reads
/// the head of its answer, and the whole body unless it is chunked.
fn open(addr: &str, method: &str, target: &str, headers: &[(&str, &str)]) -> Stream {
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(PROMPT)).unwrap();
    let mut req = format!("{method} {target} HTTP/1.1\r\nHost: {addr}\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST" {
        req.push_str("Content-Length: 0\r\n");
    }
    req.push_str("\r\n");
    (&tcp).write_all(req.as_bytes()).unwrap();
    let mut r = BufReader::new(tcp);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap();
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let mut s = Stream {
        r,
        status,
        headers,
        body: Vec::new(),
        chunked: false,
        ended: false,
    };
    s.chunked = s
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    if !s.chunked && status != 101 {
        let len: usize = s.header("content-length").map_or(0, |v| v.parse().unwrap());
        s.body = vec![0; len];
        s.r.read_exact(&mut s.body).unwrap();
        s.ended = true;
    }
    s
}

impl Stream {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| panic!("{}: not JSON: {}", self.status, self.text()))
    }

    fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .into()
    }

    /// Reads one more chunk of a chunked body; false once the body has ended.
    fn chunk(&mut self) -> bool {
        if self.ended {
            return false;
        }
        let mut size = String::new();
        if self.r.read_line(&mut size).unwrap_or(0) == 0 {
            self.ended = true;
            return false;
        }
        let n = usize::from_str_radix(size.trim(), 16)
            .unwrap_or_else(|_| panic!("bad chunk size {size:?}"));
        let mut data = vec![0; n + 2];
        self.r.read_exact(&mut data).unwrap();
        if n == 0 {
            self.ended = true;
            return false;
        }
        self.body.extend_from_slice(&data[..n]);
        true
    }

    /// Reads chunks until `done` holds for what arrived (panics if the body ends first,
    /// or nothing comes within the read timeout).
    fn until(&mut self, what: &str, done: impl Fn(&Stream) -> bool) {
        while !done(self) {
            assert!(
                self.chunk(),
                "the body ended before {what}; it held {:?}",
                self.text()
            );
        }
    }

    /// The whole chunked body, to its last chunk.
    fn rest(&mut self) -> String {
        while self.chunk() {}
        self.text()
    }

    /// The Server-Sent Events received so far: (id, event, data).
    fn events(&self) -> Vec<(String, String, Value)> {
        let text = self.text();
        let mut out = Vec::new();
        for block in text.split("\n\n") {
            let (mut id, mut event, mut data) = (None, None, None);
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = Some(v.to_string());
                } else if let Some(v) = line.strip_prefix("event: ") {
                    event = Some(v.to_string());
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(v).ok();
                }
            }
            if let (Some(id), Some(event), Some(data)) = (id, event, data) {
                out.push((id, event, data));
            }
        }
        out
    }
}

/// Mints a ticket at `route` with `c`'s token and checks its expiry: within 60 s.
fn mint(c: &mut Client, route: &str) -> String {
    let before = now_ms();
    let r = c.post(route, &json!({}));
    let after = now_ms();
    assert_eq!(r.status, 200, "POST {route}: {}", r.text());
    let v = r.json();
    let expires = epoch_ms(text(&v, "expiresAt")).unwrap();
    assert!(
        expires > before && expires <= after + 60_000,
        "{route}: minted in {before}..{after}, expires at {expires}: {v}"
    );
    let t = text(&v, "ticket").to_string();
    assert_eq!(t.len(), 64, "{v}");
    t
}

/// A job that ran to its end, so the journal holds its two events.
fn run_job(c: &mut Client, command: &str) -> String {
    let r = c.post("/v1/jobs", &json!({"command": command, "waitSeconds": 60}));
    assert_eq!(r.json()["status"], "succeeded", "{}", r.text());
    text(&r.json(), "id").to_string()
}

/// The headers of an `EventSource`'s request, and `extra`.
fn sse<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut h = vec![("Accept", "text/event-stream")];
    h.extend_from_slice(extra);
    h
}

/// A WebSocket handshake by hand: the answer's status (101 when it upgrades).
fn ws_status(addr: &str, target: &str, origin: Option<&str>) -> u16 {
    let mut h = vec![
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Version", "13"),
        ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ];
    if let Some(o) = origin {
        h.push(("Origin", o));
    }
    open(addr, "GET", target, &h).status
}

fn terminal_job(c: &mut Client) -> String {
    let r = c.post(
        "/v1/jobs",
        &json!({"command": "sleep 60", "pty": {"cols": 80, "rows": 24}, "background": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    text(&r.json(), "id").to_string()
}

#[test]
fn an_events_ticket_opens_one_stream_once() {
    let s = server();
    let mut c = s.client();
    let job = run_job(&mut c, "true");
    let t = mint(&mut c, "/v1/events/tickets");
    let target = format!("/v1/events?ticket={t}");
    let mut st = open(&s.addr, "GET", &target, &sse(&[]));
    assert_eq!(st.status, 200, "{}", st.text());
    assert_eq!(st.header("content-type"), Some("text/event-stream"));
    st.until("the job's two events", |st| st.events().len() >= 2);
    let ev = st.events();
    assert_eq!(
        ev.iter()
            .map(|(_, e, d)| (e.as_str(), text(d, "jobId")))
            .collect::<Vec<_>>(),
        [("job.started", job.as_str()), ("job.ended", job.as_str())]
    );
    // Used: refused while the first stream is still open, and after it closed.
    let again = open(&s.addr, "GET", &target, &sse(&[]));
    assert_eq!((again.status, again.code()), (401, "auth".into()));
    assert!(
        again.text().contains("unknown, used or expired"),
        "{}",
        again.text()
    );
    drop(st);
    let again = open(&s.addr, "GET", &target, &sse(&[]));
    assert_eq!(again.status, 401);
    // A made-up ticket, and one a letter off, are refused the same way.
    for fake in ["0".repeat(64), format!("{}0", &t[..63])] {
        let r = open(
            &s.addr,
            "GET",
            &format!("/v1/events?ticket={fake}"),
            &sse(&[]),
        );
        assert_eq!(r.status, 401, "{}", r.text());
    }
}

#[test]
fn racing_requests_share_one_ticket_once() {
    let s = server();
    let mut c = s.client();
    let job = run_job(&mut c, "echo raced");
    for _ in 0..5 {
        let t = mint(&mut c, &format!("/v1/jobs/{job}/log/tickets"));
        let target = format!("/v1/jobs/{job}/log?follow=true&ticket={t}");
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (addr, target, barrier) =
                    (s.addr.clone(), target.clone(), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    let mut st = open(&addr, "GET", &target, &[]);
                    let body = if st.chunked { st.rest() } else { st.text() };
                    (st.status, body)
                })
            })
            .collect();
        let answers: Vec<(u16, String)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let ok: Vec<_> = answers.iter().filter(|(s, _)| *s == 200).collect();
        assert_eq!(ok.len(), 1, "{answers:?}");
        assert_eq!(ok[0].1, "raced\n");
        assert!(
            answers.iter().all(|(s, _)| [200, 401].contains(s)),
            "{answers:?}"
        );
    }
}

#[test]
fn a_ticket_opens_only_its_own_route_and_job() {
    let s = server();
    let mut c = s.client();
    let a = run_job(&mut c, "echo from-a");
    let b = run_job(&mut c, "echo from-b");
    let term = terminal_job(&mut c);
    let log = |job: &str, t: &str| format!("/v1/jobs/{job}/log?follow=true&ticket={t}");
    let events = |t: &str| format!("/v1/events?ticket={t}");
    let pty = |t: &str| format!("/v1/jobs/{term}/pty?ticket={t}");
    let refused = |st: Stream, status: u16, needle: &str| {
        assert_eq!(st.status, status, "{}", st.text());
        assert!(st.text().contains(needle), "{}", st.text());
    };

    // An events ticket opens neither a log nor a terminal, nor another method, nor the
    // long-poll; after all of that it still opens its stream.
    let t = mint(&mut c, "/v1/events/tickets");
    refused(
        open(&s.addr, "GET", &log(&a, &t), &[]),
        401,
        "opens GET /v1/events only",
    );
    assert_eq!(ws_status(&s.addr, &pty(&t), None), 401);
    refused(
        open(&s.addr, "POST", &events(&t), &[]),
        401,
        "opens GET /v1/events only",
    );
    refused(
        open(&s.addr, "GET", &format!("/v1/jobs?ticket={t}"), &[]),
        401,
        "opens GET /v1/events only",
    );
    refused(
        open(&s.addr, "GET", &events(&t), &[]),
        400,
        "Accept: text/event-stream",
    );
    refused(
        open(
            &s.addr,
            "GET",
            &format!("{}&bogus=1", events(&t)),
            &sse(&[]),
        ),
        400,
        "bogus",
    );
    let mut st = open(&s.addr, "GET", &events(&t), &sse(&[]));
    assert_eq!(st.status, 200, "{}", st.text());
    st.until("an event", |st| !st.events().is_empty());

    // A log ticket: only its job's log, only followed, never a terminal or the events.
    let t = mint(&mut c, &format!("/v1/jobs/{a}/log/tickets"));
    refused(
        open(&s.addr, "GET", &log(&b, &t), &[]),
        401,
        &format!("opens GET /v1/jobs/{a}/log only"),
    );
    refused(
        open(&s.addr, "GET", &events(&t), &sse(&[])),
        401,
        "opens GET",
    );
    refused(
        open(&s.addr, "GET", &format!("/v1/jobs/{a}/log?ticket={t}"), &[]),
        400,
        "add follow=true",
    );
    let mut st = open(&s.addr, "GET", &log(&a, &t), &[]);
    assert_eq!(st.status, 200, "{}", st.text());
    assert_eq!(st.rest(), "from-a\n");
    assert_eq!(open(&s.addr, "GET", &log(&a, &t), &[]).status, 401);

    // A terminal ticket opens neither a log nor the events.
    let t = mint(&mut c, &format!("/v1/jobs/{term}/pty/tickets"));
    assert_eq!(open(&s.addr, "GET", &log(&term, &t), &[]).status, 401);
    assert_eq!(open(&s.addr, "GET", &events(&t), &sse(&[])).status, 401);
    assert_eq!(ws_status(&s.addr, &pty(&t), None), 101);

    // A log ticket for an unknown job is not minted.
    let r = c.post("/v1/jobs/job_00000000000000000000/log/tickets", &json!({}));
    assert_eq!(r.status, 404, "{}", r.text());
    c.post(&format!("/v1/jobs/{term}/cancel"), &json!({}));
}

#[test]
fn a_scoped_token_mints_only_scoped_tickets() {
    let s = server();
    let mut c = s.client();
    let mut sc = Client::connect(&s.addr).token(SCOPED);
    let r = sc.post(
        "/v1/jobs",
        &json!({"command": "echo scoped-log", "waitSeconds": 60}),
    );
    let job = text(&r.json(), "id").to_string();
    let term = terminal_job(&mut c);
    // What the scoped token may not use itself, it may not mint a ticket for.
    for route in [
        "/v1/events/tickets".to_string(),
        format!("/v1/jobs/{term}/pty/tickets"),
    ] {
        let r = sc.post(&route, &json!({}));
        assert_eq!(
            (r.status, r.code()),
            (403, "forbidden".into()),
            "{route}: {}",
            r.text()
        );
    }
    // A log ticket it may: the log follows, and the ticket is its own (single use).
    let t = mint(&mut sc, &format!("/v1/jobs/{job}/log/tickets"));
    let target = format!("/v1/jobs/{job}/log?follow=true&ticket={t}");
    let mut st = open(&s.addr, "GET", &target, &[("Origin", PAGE)]);
    assert_eq!(st.status, 200, "{}", st.text());
    assert_eq!(st.rest(), "scoped-log\n");
    assert_eq!(open(&s.addr, "GET", &target, &[]).status, 401);
    // And the scoped ticket opens nothing of the full token's, even at the path it names.
    let t = mint(&mut sc, &format!("/v1/jobs/{job}/log/tickets"));
    for target in [
        format!("/v1/jobs/{job}/cancel?ticket={t}"),
        format!("/v1/events?ticket={t}"),
    ] {
        let r = open(&s.addr, "GET", &target, &[("Accept", "text/event-stream")]);
        assert_eq!(r.status, 401, "{target}: {}", r.text());
    }
    c.post(&format!("/v1/jobs/{term}/cancel"), &json!({}));
}

#[test]
fn a_ticket_refused_for_its_origin_is_not_used_up() {
    let s = server();
    let mut c = s.client();
    let job = run_job(&mut c, "echo origin-log");
    let term = terminal_job(&mut c);
    // Each kind: another origin is refused (403, saying what to do), then the allowed
    // page opens it with the very same ticket.
    let t = mint(&mut c, &format!("/v1/jobs/{term}/pty/tickets"));
    let pty = format!("/v1/jobs/{term}/pty?ticket={t}");
    assert_eq!(ws_status(&s.addr, &pty, Some(EVIL)), 403);
    assert_eq!(ws_status(&s.addr, &pty, Some(PAGE)), 101);
    assert_eq!(ws_status(&s.addr, &pty, Some(PAGE)), 401);

    let t = mint(&mut c, "/v1/events/tickets");
    let ev = format!("/v1/events?ticket={t}");
    let r = open(&s.addr, "GET", &ev, &sse(&[("Origin", EVIL)]));
    assert_eq!((r.status, r.code()), (403, "forbidden".into()));
    assert!(
        r.text().contains("--allowed-origin https://evil.example"),
        "{}",
        r.text()
    );
    assert!(r.header("access-control-allow-origin").is_none());
    for evil in [
        "null",
        "http://127.0.0.1:5174",
        "http://127.0.0.1:5173.evil.example",
    ] {
        let r = open(&s.addr, "GET", &ev, &sse(&[("Origin", evil)]));
        assert_eq!(r.status, 403, "{evil}");
    }
    let mut st = open(&s.addr, "GET", &ev, &sse(&[("Origin", PAGE)]));
    assert_eq!(st.status, 200, "{}", st.text());
    st.until("an event", |st| !st.events().is_empty());

    let t = mint(&mut c, &format!("/v1/jobs/{job}/log/tickets"));
    let lg = format!("/v1/jobs/{job}/log?follow=true&ticket={t}");
    assert_eq!(open(&s.addr, "GET", &lg, &[("Origin", EVIL)]).status, 403);
    let mut st = open(&s.addr, "GET", &lg, &[("Origin", PAGE)]);
    assert_eq!(st.status, 200);
    assert_eq!(st.rest(), "origin-log\n");

    // Without --allowed-origin no page may use a ticket; a client that is no browser may.
    let bare = Server::start(&[]);
    let mut bc = bare.client();
    let t = mint(&mut bc, "/v1/events/tickets");
    let ev = format!("/v1/events?ticket={t}");
    assert_eq!(
        open(&bare.addr, "GET", &ev, &sse(&[("Origin", PAGE)])).status,
        403
    );
    assert_eq!(open(&bare.addr, "GET", &ev, &sse(&[])).status, 200);
    c.post(&format!("/v1/jobs/{term}/cancel"), &json!({}));
}

#[test]
fn cors_headers_go_to_allowed_origins_on_the_browser_routes_only() {
    let s = server();
    let mut c = s.client();
    let job = run_job(&mut c, "true");
    let bearer = format!("Bearer {}", s.token);
    let acao = |st: &Stream| st.header("access-control-allow-origin").map(str::to_string);
    let browser_routes = [
        ("POST", "/v1/events/tickets".to_string()),
        ("POST", format!("/v1/jobs/{job}/log/tickets")),
        ("GET", format!("/v1/jobs/{job}/log")),
        ("GET", "/v1/events".to_string()),
    ];
    for (m, route) in &browser_routes {
        let ok = open(
            &s.addr,
            m,
            route,
            &[("Authorization", &bearer), ("Origin", PAGE)],
        );
        assert_eq!(ok.status, 200, "{m} {route}: {}", ok.text());
        assert_eq!(acao(&ok).as_deref(), Some(PAGE), "{m} {route}");
        assert!(
            ok.header("vary").is_some_and(|v| v.contains("Origin")),
            "{m} {route}"
        );
        assert!(ok.header("access-control-allow-credentials").is_none());
        let evil = open(
            &s.addr,
            m,
            route,
            &[("Authorization", &bearer), ("Origin", EVIL)],
        );
        assert_eq!(acao(&evil), None, "{m} {route}");
        let none = open(&s.addr, m, route, &[("Authorization", &bearer)]);
        assert_eq!(acao(&none), None, "{m} {route}");
        // Errors too, so the page can read why (here: no token).
        let denied = open(&s.addr, m, route, &[("Origin", PAGE)]);
        assert_eq!(denied.status, 401, "{m} {route}");
        assert_eq!(acao(&denied).as_deref(), Some(PAGE), "{m} {route}");
    }
    // The terminal's ticket route too; the terminal itself needs none (no CORS on a
    // WebSocket), and no other route grants anything.
    let term = terminal_job(&mut c);
    let r = open(
        &s.addr,
        "POST",
        &format!("/v1/jobs/{term}/pty/tickets"),
        &[("Authorization", &bearer), ("Origin", PAGE)],
    );
    assert_eq!(acao(&r).as_deref(), Some(PAGE));
    for (m, route) in [
        ("GET", "/v1/jobs".to_string()),
        ("GET", format!("/v1/jobs/{job}")),
        ("GET", "/v1/sandbox".to_string()),
        ("GET", "/v1/health".to_string()),
        ("POST", format!("/v1/jobs/{term}/cancel")),
    ] {
        let r = open(
            &s.addr,
            m,
            &route,
            &[("Authorization", &bearer), ("Origin", PAGE)],
        );
        assert!(r.status < 300, "{m} {route}: {}", r.text());
        assert_eq!(acao(&r), None, "{m} {route}");
    }
}

#[test]
fn preflights_are_answered_without_a_token_for_allowed_origins_only() {
    let s = server();
    let pre = |route: &str, origin: &str, method: &str, headers: &str| {
        let mut h = vec![
            ("Origin", origin),
            ("Access-Control-Request-Method", method),
        ];
        if !headers.is_empty() {
            h.push(("Access-Control-Request-Headers", headers));
        }
        open(&s.addr, "OPTIONS", route, &h)
    };
    let job = "job_00000000000000000000";
    // What a page's fetch with the bearer header asks, and an EventSource reconnecting.
    for (route, method, headers) in [
        (
            "/v1/events/tickets".to_string(),
            "POST",
            "authorization, content-type",
        ),
        (
            format!("/v1/jobs/{job}/log/tickets"),
            "POST",
            "authorization",
        ),
        (
            format!("/v1/jobs/{job}/pty/tickets"),
            "POST",
            "Authorization",
        ),
        ("/v1/events?ticket=x".to_string(), "GET", "last-event-id"),
        (
            "/v1/events?after=x&waitSeconds=30".to_string(),
            "GET",
            "authorization",
        ),
        (format!("/v1/jobs/{job}/log?follow=true"), "GET", ""),
    ] {
        let r = pre(&route, PAGE, method, headers);
        assert_eq!(r.status, 200, "{method} {route}: {}", r.text());
        assert_eq!(r.header("access-control-allow-origin"), Some(PAGE));
        assert_eq!(r.header("access-control-allow-methods"), Some(method));
        let allowed = r
            .header("access-control-allow-headers")
            .unwrap()
            .to_lowercase();
        for h in headers.split(',').map(str::trim).filter(|h| !h.is_empty()) {
            assert!(allowed.contains(&h.to_lowercase()), "{h} in {allowed}");
        }
        assert!(r.header("access-control-max-age").is_some());
        assert!(r.header("vary").is_some_and(|v| v.contains("Origin")));
        assert!(r.body.is_empty());
    }
    // Refused, saying why, with nothing granted: another origin, another route, another
    // method, a header the routes do not read.
    for (route, origin, method, headers, needle) in [
        (
            "/v1/events/tickets",
            EVIL,
            "POST",
            "authorization",
            "--allowed-origin https://evil.example",
        ),
        ("/v1/events/tickets", "null", "POST", "", "opaque origin"),
        ("/v1/jobs", PAGE, "POST", "authorization", "may call only"),
        (
            "/v1/files/content?path=/etc/passwd",
            PAGE,
            "GET",
            "authorization",
            "may call only",
        ),
        ("/v1/events", PAGE, "DELETE", "", "may call only"),
        (
            "/v1/events/tickets",
            PAGE,
            "POST",
            "x-requested-with",
            "x-requested-with",
        ),
    ] {
        let r = pre(route, origin, method, headers);
        assert_eq!(
            (r.status, r.code()),
            (403, "forbidden".into()),
            "{method} {route}: {}",
            r.text()
        );
        assert!(r.text().contains(needle), "{}", r.text());
        assert!(r.header("access-control-allow-origin").is_none(), "{route}");
        assert!(
            r.header("access-control-allow-methods").is_none(),
            "{route}"
        );
    }
    // An OPTIONS that is no preflight is an ordinary request: authenticated first.
    let r = open(&s.addr, "OPTIONS", "/v1/events", &[("Origin", PAGE)]);
    assert_eq!(r.status, 401, "{}", r.text());
    // A preflight grants nothing by itself: the request after it still needs its token.
    let r = open(&s.addr, "POST", "/v1/events/tickets", &[("Origin", PAGE)]);
    assert_eq!(r.status, 401);
}

#[test]
fn last_event_id_or_after_resumes_a_ticketed_stream_exactly_across_a_restart() {
    let sb = Arc::new(Sandbox::new());
    let mut s = Server::start_in(Arc::clone(&sb), "127.0.0.1:0", &["--allowed-origin", PAGE]);
    let mut c = s.client();
    let jobs = [run_job(&mut c, "true"), run_job(&mut c, "true")];
    let t = mint(&mut c, "/v1/events/tickets");
    let mut st = open(&s.addr, "GET", &format!("/v1/events?ticket={t}"), &sse(&[]));
    st.until("four events", |st| st.events().len() >= 4);
    let first = st.events();
    assert_eq!(first.len(), 4, "{first:?}");
    drop(st);
    // A restart of serve: tickets are forgotten, cursors are not.
    s.terminate();
    let unused = t.clone();
    s = Server::start_in(Arc::clone(&sb), "127.0.0.1:0", &["--allowed-origin", PAGE]);
    let mut c = s.client();
    let r = open(
        &s.addr,
        "GET",
        &format!("/v1/events?ticket={unused}"),
        &sse(&[]),
    );
    assert_eq!(r.status, 401, "{}", r.text());
    let later = run_job(&mut c, "true");
    let want = |from: usize| -> Vec<String> {
        let mut ids: Vec<String> = first[from..]
            .iter()
            .map(|(_, _, d)| text(d, "jobId").into())
            .collect();
        ids.extend([later.clone(), later.clone()]);
        ids
    };
    // Last-Event-ID on a fresh ticket's stream, as an EventSource would send it; `after`
    // on a new URL, as a page that opens a new EventSource does; Last-Event-ID wins.
    for (query, last, from) in [
        ("".to_string(), Some(first[1].0.clone()), 2),
        (format!("&after={}", first[3].0), None, 4),
        (
            format!("&after={}", first[3].0),
            Some(first[0].0.clone()),
            1,
        ),
    ] {
        let t = mint(&mut c, "/v1/events/tickets");
        let mut h = sse(&[("Origin", PAGE)]);
        if let Some(l) = &last {
            h.push(("Last-Event-ID", l));
        }
        let mut st = open(&s.addr, "GET", &format!("/v1/events?ticket={t}{query}"), &h);
        assert_eq!(st.status, 200, "{}", st.text());
        let n = want(from).len();
        st.until("the events after the cursor", |st| st.events().len() >= n);
        let got: Vec<String> = st
            .events()
            .iter()
            .map(|(_, _, d)| text(d, "jobId").into())
            .collect();
        assert_eq!(got, want(from), "{query} {last:?}");
        let kinds: Vec<String> = st.events().iter().map(|(_, e, _)| e.clone()).collect();
        assert_eq!(kinds[kinds.len() - 2..], ["job.started", "job.ended"]);
        // Each id is the cursor that resumes after it: the ids are those of the first read.
        for (i, (id, _, _)) in st.events().iter().enumerate() {
            if from + i < 4 {
                assert_eq!(id, &first[from + i].0);
            }
        }
    }
    assert!(
        jobs.iter()
            .all(|j| first.iter().any(|(_, _, d)| d["jobId"] == j.as_str()))
    );
}

#[test]
fn a_log_ticket_follows_a_running_job_to_its_end() {
    let s = server();
    let mut c = s.client();
    let r = c.post(
        "/v1/jobs",
        &json!({"command": "echo one; read x; echo two", "interactive": true, "background": true}),
    );
    let job = text(&r.json(), "id").to_string();
    let t = mint(&mut c, &format!("/v1/jobs/{job}/log/tickets"));
    let mut st = open(
        &s.addr,
        "GET",
        &format!("/v1/jobs/{job}/log?follow=true&ticket={t}"),
        &[("Origin", PAGE)],
    );
    assert_eq!(st.status, 200, "{}", st.text());
    assert_eq!(st.header("access-control-allow-origin"), Some(PAGE));
    st.until("the first line", |st| st.text() == "one\n");
    let r = c.send(
        "POST",
        &format!("/v1/jobs/{job}/stdin?close=true"),
        &[],
        Some(b"go\n"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(st.rest(), "one\ntwo\n");
}
