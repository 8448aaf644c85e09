//! The preview gate as its attackers and its users meet it, over raw sockets: the token
//! exchange and its redirect, the cookie (tampered, moved to another port or grant),
//! smuggling and oversized heads, bodies and events streamed both ways, upgrades, the
//! dev server gone, restarts and boot changes, the scoped token, revocation, and no
//! credential in a file or the log. The dev server is a small one of the test's own on
//! loopback, so the test sees exactly what the gate forwarded.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::util::http::{Conn, header};
use crate::util::*;

// ---------------------------------------------------------------- the dev server

/// A dev server on 127.0.0.1: it records every request it gets, and answers by path.
struct Dev {
    port: u16,
    /// Every request head it got, as sent.
    seen: Arc<Mutex<Vec<String>>>,
    /// How many SSE events `/sse` may send past the first.
    sse: Arc<AtomicU32>,
}

fn read_req(r: &mut BufReader<TcpStream>) -> Option<(String, HashMap<String, String>, String)> {
    let mut head = String::new();
    loop {
        let mut l = String::new();
        if r.read_line(&mut l).ok()? == 0 {
            return None;
        }
        head.push_str(&l);
        if l == "\r\n" || l == "\n" {
            break;
        }
    }
    let mut hs = HashMap::new();
    for l in head.lines().skip(1) {
        if let Some((k, v)) = l.split_once(':') {
            hs.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let line = head.lines().next()?.to_string();
    Some((line, hs, head))
}

/// Reads a request body (chunked or by length), handing each piece to `f` as it comes.
fn read_body(r: &mut BufReader<TcpStream>, hs: &HashMap<String, String>, mut f: impl FnMut(&[u8])) {
    let mut buf = vec![0u8; 64 << 10];
    if hs
        .get("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        loop {
            let mut l = String::new();
            r.read_line(&mut l).unwrap();
            let n = usize::from_str_radix(l.trim(), 16).unwrap();
            if n == 0 {
                let mut end = String::new();
                r.read_line(&mut end).unwrap();
                return;
            }
            let mut left = n;
            while left > 0 {
                let k = r.read(&mut buf[..left.min(64 << 10)]).unwrap();
                assert!(k > 0);
                f(&buf[..k]);
                left -= k;
            }
            let mut crlf = [0u8; 2];
            r.read_exact(&mut crlf).unwrap();
        }
    } else if let Some(n) = hs.get("content-length") {
        let mut left: usize = n.parse().unwrap();
        while left > 0 {
            let k = r.read(&mut buf[..left.min(64 << 10)]).unwrap();
            assert!(k > 0);
            f(&buf[..k]);
            left -= k;
        }
    }
}

fn chunk(w: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    w.write_all(format!("{:x}\r\n", data.len()).as_bytes())?;
    w.write_all(data)?;
    w.write_all(b"\r\n")
}

impl Dev {
    fn start() -> Dev {
        Dev::start_on("127.0.0.1")
    }

    /// A dev server listening on `addr` only.
    fn start_on(addr: &str) -> Dev {
        let l = TcpListener::bind((addr, 0)).unwrap();
        let port = l.local_addr().unwrap().port();
        let dev = Dev {
            port,
            seen: Arc::default(),
            sse: Arc::default(),
        };
        let (seen, sse) = (Arc::clone(&dev.seen), Arc::clone(&dev.sse));
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let (seen, sse) = (Arc::clone(&seen), Arc::clone(&sse));
                std::thread::spawn(move || Dev::serve(s, &seen, &sse));
            }
        });
        dev
    }

    fn serve(s: TcpStream, seen: &Mutex<Vec<String>>, sse: &AtomicU32) {
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        while let Some((line, hs, head)) = read_req(&mut r) {
            seen.lock().unwrap().push(head.clone());
            let path = line.split(' ').nth(1).unwrap_or("/").to_string();
            let path = path.split('?').next().unwrap().to_string();
            let ok = match path.as_str() {
                "/headers" => {
                    read_body(&mut r, &hs, |_| {});
                    w.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{head}", head.len()).as_bytes())
                }
                "/echo" => {
                    let _ = w.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
                    let mut w2 = w.try_clone().unwrap();
                    read_body(&mut r, &hs, |b| {
                        let _ = chunk(&mut w2, b);
                    });
                    w.write_all(b"0\r\n\r\n")
                }
                "/sse" => {
                    let _ = w.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n");
                    let mut res = chunk(&mut w, b"data: 1\n\n");
                    for n in 1..=2u32 {
                        let deadline = Instant::now() + LONG;
                        while sse.load(Ordering::SeqCst) < n && Instant::now() < deadline {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        res = res.and_then(|()| chunk(&mut w, format!("data: {}\n\n", n + 1).as_bytes()));
                    }
                    res.and_then(|()| w.write_all(b"0\r\n\r\n"))
                }
                "/long" => {
                    let _ = w.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
                    let deadline = Instant::now() + LONG;
                    while Instant::now() < deadline && chunk(&mut w, b"tick\n").is_ok() {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    return;
                }
                "/ws" if hs.contains_key("upgrade") => {
                    let _ = w.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n");
                    let mut buf = [0u8; 4096];
                    loop {
                        match r.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if w.write_all(&buf[..n]).is_err() {
                                    return;
                                }
                            }
                        }
                    }
                }
                "/ws-refused" => {
                    // Refuses, then (as a careless server might) treats the rest as raw.
                    let _ = w.write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 4\r\n\r\nnope");
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = r.read(&mut buf) {
                        if n == 0 || w.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    return;
                }
                "/both" => {
                    // An answer framed two ways, as a response-smuggling server would send.
                    let _ = w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged");
                    return;
                }
                "/big" => {
                    let body: Vec<u8> = (0..3usize << 20).map(|i| (i % 251) as u8).collect();
                    w.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes())
                        .and_then(|()| w.write_all(&body))
                }
                "/204" => w.write_all(b"HTTP/1.1 204 No Content\r\n\r\n"),
                "/304" => w.write_all(b"HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n"),
                "/103" => w.write_all(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
                _ => {
                    read_body(&mut r, &hs, |_| {});
                    let body = if line.starts_with("HEAD ") { "" } else { "hello" };
                    w.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Dev: yes\r\n\r\n{body}").as_bytes())
                }
            };
            if ok.is_err() {
                return;
            }
        }
    }

    /// The request heads it got for `path`.
    fn got(&self, path: &str) -> Vec<String> {
        let prefix = format!(" {path}");
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|h| h.lines().next().unwrap_or("").contains(&prefix))
            .cloned()
            .collect()
    }
}

// ---------------------------------------------------------------- a raw client

/// A connection to the gate that sends exactly what the test writes.
struct Raw {
    c: Client,
}

/// A response from the gate, read whole.
type Got = Resp;

impl Raw {
    fn open(port: u16) -> Raw {
        let c = Client::connect(&format!("127.0.0.1:{port}"));
        c.r.get_ref().set_timeout(LONG);
        Raw { c }
    }

    /// A second handle on the socket, to write while another thread reads.
    fn writer(&self) -> TcpStream {
        match self.c.r.get_ref() {
            Conn::Tcp(s) => s.try_clone().unwrap(),
            Conn::Unix(_) => unreachable!("the gate listens on TCP"),
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.c.write_raw(bytes).expect("send to the gate");
    }

    /// A GET (or `method`) with these extra header lines.
    fn request(&mut self, method: &str, target: &str, headers: &[&str]) {
        let mut req = format!("{method} {target} HTTP/1.1\r\nHost: app.localhost\r\n");
        for h in headers {
            req.push_str(h);
            req.push_str("\r\n");
        }
        req.push_str("\r\n");
        self.send(req.as_bytes());
    }

    fn head(&mut self) -> Option<(u16, Vec<(String, String)>)> {
        self.c.try_read_head()
    }

    fn chunk(&mut self) -> Option<Vec<u8>> {
        self.c.read_chunk()
    }

    /// One response; `head_only` for a HEAD (no body whatever the headers say).
    fn response_to(&mut self, head_only: bool) -> Option<Got> {
        let (status, headers) = self.head()?;
        let mut body = Vec::new();
        if !(head_only || status < 200 || status == 204 || status == 304) {
            if header(&headers, "transfer-encoding").is_some() {
                while let Some(c) = self.chunk() {
                    body.extend(c);
                }
            } else if let Some(n) = header(&headers, "content-length") {
                body = vec![0; n.parse().unwrap()];
                self.c.r.read_exact(&mut body).ok()?;
            } else {
                self.c.r.read_to_end(&mut body).ok()?;
            }
        }
        Some(Got {
            status,
            headers,
            body,
            checked: None,
        })
    }

    fn response(&mut self) -> Got {
        self.response_to(false).expect("a response from the gate")
    }

    fn get(&mut self, target: &str, headers: &[&str]) -> Got {
        self.request("GET", target, headers);
        self.response()
    }

    /// True once the gate closed the connection (EOF or a reset), within `within`.
    fn closed_within(&mut self, within: Duration) -> bool {
        self.c.closed_within(within)
    }
}

// ---------------------------------------------------------------- fixtures

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn serve_in(sb: &Arc<Sandbox>, env: &[(&str, &str)], flags: &[&str]) -> Server {
    let mut f = vec!["--preview-address", "127.0.0.1"];
    f.extend_from_slice(flags);
    Server::start_in_env(Arc::clone(sb), &f, env)
}

fn serve() -> Server {
    serve_in(&Arc::new(Sandbox::new()), &[], &[])
}

/// Mints a grant (full token) and returns its answer.
fn mint(s: &Server, body: Value) -> Value {
    let r = s.client().post("/v1/previews/grants", &body);
    assert_eq!(r.status, 200, "mint {body}: {}", r.text());
    r.json()
}

/// Waits until the gate answers on `gate`.
fn gate_up(gate: u16) {
    eventually(PROMPT, "the gate listens", || {
        TcpStream::connect(("127.0.0.1", gate)).ok()
    });
}

/// Exchanges `token` at the gate: the `Cookie` header line that the browser would send.
fn exchange(gate: u16, token: &str) -> String {
    gate_up(gate);
    let got = Raw::open(gate).get(&format!("/?preview_token={token}"), &[]);
    assert_eq!(got.status, 302, "{}", got.text());
    let set = got.header("set-cookie").expect("Set-Cookie");
    format!("Cookie: {}", set.split(';').next().unwrap())
}

/// A dev server, a server, a grant on a free gate port for it, and the `Cookie` line
/// its exchanged token gives.
fn previewed() -> (Dev, Server, u16, String) {
    let dev = Dev::start();
    let s = serve();
    let gate = free_port();
    let cookie = exchange(
        gate,
        &token(&mint(&s, json!({"port": dev.port, "gatePort": gate}))),
    );
    (dev, s, gate, cookie)
}

/// A WebSocket upgrade through the gate with `cookie`, answered 101: the spliced connection.
fn upgraded(gate: u16, cookie: &str) -> Raw {
    let mut ws = Raw::open(gate);
    ws.request(
        "GET",
        "/ws",
        &[cookie, "Connection: Upgrade", "Upgrade: websocket"],
    );
    assert_eq!(ws.head().unwrap().0, 101);
    ws
}

fn token(v: &Value) -> String {
    v["token"].as_str().unwrap().to_string()
}

fn id(v: &Value) -> String {
    v["id"].as_str().unwrap().to_string()
}

// ---------------------------------------------------------------- the tests

#[test]
fn the_exchange_sets_a_host_only_cookie_and_the_dev_server_never_sees_a_credential() {
    let dev = Dev::start();
    let s = serve();
    let gate = free_port();
    let g = mint(&s, json!({"port": dev.port, "gatePort": gate}));
    assert!(text(&g, "id").starts_with("pv_"));
    assert_eq!(g["connections"], 0);
    gate_up(gate);
    let t = token(&g);
    let mut c = Raw::open(gate);
    let got = c.get(&format!("/app/page?x=1&preview_token={t}&y=2"), &[]);
    assert_eq!(got.status, 302);
    assert_eq!(got.header("location"), Some("/app/page?x=1&y=2"));
    let set = got.header("set-cookie").unwrap();
    let (pair, attrs) = set.split_once("; ").unwrap();
    assert!(
        pair.starts_with(&format!("__Host-gitterm-preview-{gate}=")),
        "{set}"
    );
    assert_eq!(attrs, "Path=/; HttpOnly; Secure; SameSite=Lax");
    assert_eq!(got.header("cache-control"), Some("no-store"));
    assert_eq!(got.header("referrer-policy"), Some("no-referrer"));
    assert!(
        dev.got("/app/page").is_empty(),
        "the exchange itself is not forwarded"
    );

    // Used once: the same token again is a short 401 text, never a redirect.
    let again = c.get(&format!("/?preview_token={t}"), &[]);
    assert_eq!(again.status, 401);
    assert!(again.header("location").is_none());
    assert!(
        again
            .header("content-type")
            .unwrap()
            .starts_with("text/plain")
    );
    assert!(
        again.text().len() < 200 && again.text().contains("link"),
        "{}",
        again.text()
    );
    let none = c.get("/headers", &[]);
    assert_eq!(none.status, 401);
    assert!(none.header("location").is_none());

    let cookie = format!("Cookie: theme=dark; {pair}; lang=en");
    let fwd = c.get(
        "/headers?q=1&preview_token=leftover",
        &[
            &cookie,
            "Origin: http://app.localhost",
            "Connection: keep-alive, X-Hop",
            "X-Hop: secret",
            "Keep-Alive: timeout=5",
            "X-Forwarded-For: 203.0.113.9",
        ],
    );
    // A token on a request with a cookie is an exchange again: it fails (not a live
    // token), so nothing was forwarded.
    assert_eq!(fwd.status, 401);
    let fwd = c.get(
        "/headers?q=1",
        &[
            &cookie,
            "Origin: http://app.localhost",
            "Connection: keep-alive, X-Hop",
            "X-Hop: secret",
            "Keep-Alive: timeout=5",
            "X-Forwarded-For: 203.0.113.9",
        ],
    );
    assert_eq!(fwd.status, 200, "{}", fwd.text());
    let seen = fwd.text().to_ascii_lowercase();
    assert!(seen.starts_with("get /headers?q=1 http/1.1\r\n"), "{seen}");
    // Each of these header lines reached the dev server as written here.
    for line in [
        format!("host: localhost:{}", dev.port),
        "cookie: theme=dark; lang=en".to_string(),
        format!("origin: http://localhost:{}", dev.port),
        "x-forwarded-host: app.localhost".to_string(),
        "x-forwarded-proto: http".to_string(),
        "x-forwarded-for: 203.0.113.9, 127.0.0.1".to_string(),
    ] {
        assert!(seen.contains(&format!("\r\n{line}\r\n")), "{line}: {seen}");
    }
    assert!(!seen.contains("gitterm-preview"), "{seen}");
    assert!(!seen.contains("preview_token"), "{seen}");
    for hop in ["x-hop", "keep-alive"] {
        assert!(
            !seen.contains(&format!("\r\n{hop}:")),
            "{hop} forwarded: {seen}"
        );
    }

    // HEAD, 204, 304 and 1xx keep their framing on one kept-alive connection.
    c.request("HEAD", "/", &[&cookie]);
    let head = c.response_to(true).unwrap();
    assert_eq!(
        (head.status, head.header("content-length")),
        (200, Some("5"))
    );
    for (path, status) in [("/204", 204), ("/304", 304)] {
        let got = c.get(path, &[&cookie]);
        assert_eq!(got.status, status);
        assert!(got.body.is_empty());
    }
    c.request("GET", "/103", &[&cookie]);
    let early = c.response();
    assert_eq!(early.status, 103);
    assert_eq!(early.header("link"), Some("</a.css>; rel=preload"));
    let fin = c.response();
    assert_eq!((fin.status, fin.text().as_str()), (200, "ok"));
    let plain = c.get("/", &[&cookie]);
    assert_eq!(
        (plain.status, plain.text().as_str(), plain.header("x-dev")),
        (200, "hello", Some("yes"))
    );

    // Listed with its connection open; never a token.
    let list = s.client().get("/v1/previews/grants").json();
    assert_eq!(list["grants"][0]["id"], g["id"]);
    assert_eq!(list["grants"][0]["connections"], 1);
    assert!(!list.to_string().contains(&t));
}

#[test]
fn redirects_stay_on_the_host() {
    let dev = Dev::start();
    let s = serve();
    let gate = free_port();
    for (path, want) in [
        ("//evil.example/x", "/evil.example/x"),
        ("/\\evil.example", "/evil.example"),
        ("/%2F%2fevil.example", "/evil.example"),
        ("///\\\\evil.example?a=1", "/evil.example?a=1"),
    ] {
        let t = token(&mint(&s, json!({"port": dev.port, "gatePort": gate})));
        gate_up(gate);
        let sep = if path.contains('?') { '&' } else { '?' };
        let got = Raw::open(gate).get(&format!("{path}{sep}preview_token={t}"), &[]);
        assert_eq!(got.status, 302, "{path}");
        assert_eq!(got.header("location"), Some(want), "{path}");
    }
}

#[test]
fn a_tampered_cookie_or_one_of_another_port_or_grant_is_refused() {
    let dev = Dev::start();
    let s = serve();
    let (gate_a, gate_b) = (free_port(), free_port());
    let alice = mint(
        &s,
        json!({"port": dev.port, "gatePort": gate_a, "identity": {"scope": "user", "id": "alice"}}),
    );
    let bob = mint(
        &s,
        json!({"port": dev.port, "gatePort": gate_a, "identity": {"scope": "user", "id": "bob"}}),
    );
    let other = mint(&s, json!({"port": dev.port + 1, "gatePort": gate_b}));
    let ca = exchange(gate_a, &token(&alice));
    let cb = exchange(gate_a, &token(&bob));
    let co = exchange(gate_b, &token(&other));
    let mut c = Raw::open(gate_a);
    assert_eq!(c.get("/", &[&ca]).status, 200);
    assert_eq!(c.get("/", &[&cb]).status, 200);
    // Every byte of the value matters.
    let value = ca.split_once('=').unwrap().1.to_string();
    for i in [0, 5, value.len() / 2, value.len() - 1] {
        let mut b = value.clone().into_bytes();
        b[i] = if b[i] == b'a' { b'b' } else { b'a' };
        let tampered = format!(
            "Cookie: __Host-gitterm-preview-{gate_a}={}",
            String::from_utf8(b).unwrap()
        );
        assert_eq!(c.get("/", &[&tampered]).status, 401, "byte {i}");
    }
    // Bob's grant id in front of Alice's MAC: refused.
    let bob_id = id(&bob);
    let moved = ca.replacen(&id(&alice), &bob_id, 1);
    assert_eq!(c.get("/", &[&moved]).status, 401);
    // A cookie stolen from another gate port, under this port's name: refused.
    let stolen = co.replacen(
        &format!("preview-{gate_b}="),
        &format!("preview-{gate_a}="),
        1,
    );
    assert_eq!(c.get("/", &[&stolen]).status, 401);
    // Revoking Bob leaves Alice in.
    assert_eq!(
        s.client()
            .post(&format!("/v1/previews/grants/{bob_id}/revoke"), &json!({}))
            .status,
        200
    );
    let mut c = Raw::open(gate_a);
    assert_eq!(c.get("/", &[&cb]).status, 401);
    assert_eq!(c.get("/", &[&ca]).status, 200);
    assert!(dev.got("/").len() >= 3);
}

#[test]
fn a_page_of_another_origin_cannot_drive_the_preview() {
    let (dev, _s, gate, cookie) = previewed();
    let mut c = Raw::open(gate);
    for (method, origin, want) in [
        ("POST", "https://evil.example", 403),
        ("DELETE", "null", 403),
        ("POST", "http://app.localhost.evil.example", 403),
        ("POST", "http://app.localhost", 200),
        ("POST", "https://app.localhost", 200),
        ("GET", "https://evil.example", 200),
    ] {
        c.send(format!("{method} /headers HTTP/1.1\r\nHost: app.localhost\r\n{cookie}\r\nOrigin: {origin}\r\nContent-Length: 2\r\n\r\nhi").as_bytes());
        let got = c.response();
        assert_eq!(got.status, want, "{method} from {origin}: {}", got.text());
        if want == 403 {
            c = Raw::open(gate);
        }
    }
    // An upgrade from another origin is refused before it reaches the dev server.
    let mut c = Raw::open(gate);
    c.request(
        "GET",
        "/ws",
        &[
            &cookie,
            "Origin: https://evil.example",
            "Connection: Upgrade",
            "Upgrade: websocket",
        ],
    );
    assert_eq!(c.response().status, 403);
    assert!(dev.got("/ws").is_empty());
    assert_eq!(dev.got("/headers").len(), 3);
}

#[test]
fn smuggling_both_ways_and_oversized_heads_are_refused() {
    let (dev, _s, gate, cookie) = previewed();
    for framing in [
        "Content-Length: 5\r\nTransfer-Encoding: chunked",
        "Transfer-Encoding: chunked\r\nContent-Length: 5",
        "Content-Length: 5\r\nContent-Length: 6",
        "Transfer-Encoding: gzip, chunked",
    ] {
        let mut c = Raw::open(gate);
        c.send(format!("POST /headers HTTP/1.1\r\nHost: app.localhost\r\n{cookie}\r\n{framing}\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes());
        assert_eq!(c.response().status, 400, "{framing}");
        assert!(c.closed_within(PROMPT), "{framing}");
    }
    assert!(dev.got("/headers").is_empty() && dev.got("/smuggled").is_empty());
    let mut c = Raw::open(gate);
    c.request(
        "GET",
        "/",
        &[&cookie, &format!("X-Big: {}", "a".repeat(20 << 10))],
    );
    assert_eq!(c.response().status, 431);
    // A dev server's answer framed two ways is not relayed: 502, and the connection closes.
    let mut c = Raw::open(gate);
    let got = c.get("/both", &[&cookie]);
    assert_eq!(got.status, 502, "{}", got.text());
    assert!(c.closed_within(PROMPT));
    // Two Host headers: which one is it for?
    let mut c = Raw::open(gate);
    c.request("GET", "/", &[&cookie, "Host: other"]);
    assert_eq!(c.response().status, 400);
}

#[test]
fn bodies_and_events_stream_both_ways() {
    let (dev, _s, gate, cookie) = previewed();

    // 50 MB up, chunked, echoed back as it arrives: exact, and no side waits for the other.
    const TOTAL: usize = 50 << 20;
    let byte = |i: usize| ((i * 7) ^ (i >> 16)) as u8;
    let mut c = Raw::open(gate);
    c.send(format!("POST /echo HTTP/1.1\r\nHost: app.localhost\r\n{cookie}\r\nTransfer-Encoding: chunked\r\n\r\n").as_bytes());
    let mut w = c.writer();
    let writer = std::thread::spawn(move || {
        let mut sent = 0;
        while sent < TOTAL {
            let n = (TOTAL - sent).min(61_440);
            let data: Vec<u8> = (sent..sent + n).map(byte).collect();
            w.write_all(format!("{n:x}\r\n").as_bytes()).unwrap();
            w.write_all(&data).unwrap();
            w.write_all(b"\r\n").unwrap();
            sent += n;
        }
        w.write_all(b"0\r\n\r\n").unwrap();
    });
    let (status, headers) = c.head().unwrap();
    assert_eq!(status, 200);
    assert!(header(&headers, "transfer-encoding").is_some());
    let mut got = 0usize;
    while let Some(part) = c.chunk() {
        for (k, b) in part.iter().enumerate() {
            assert_eq!(*b, byte(got + k), "byte {}", got + k);
        }
        got += part.len();
    }
    writer.join().unwrap();
    assert_eq!(got, TOTAL);
    // The connection carries on, and a large body of known length (read past the
    // connection's buffer in large pieces) arrives exact too.
    assert_eq!(c.get("/", &[&cookie]).text(), "hello");
    let sized: Vec<u8> = (0..3 << 20).map(|i| byte(i * 3)).collect();
    c.send(
        format!(
            "POST /echo HTTP/1.1\r\nHost: app.localhost\r\n{cookie}\r\nContent-Length: {}\r\n\r\n",
            sized.len()
        )
        .as_bytes(),
    );
    let mut w = c.writer();
    let up = sized.clone();
    let writer = std::thread::spawn(move || w.write_all(&up).unwrap());
    let echoed = c.response();
    writer.join().unwrap();
    assert_eq!(echoed.status, 200);
    assert!(
        echoed.body == sized,
        "the sized echo differs ({} bytes back)",
        echoed.body.len()
    );
    let big = c.get("/big", &[&cookie]);
    assert_eq!(big.header("content-length"), Some("3145728"));
    assert!(
        big.body
            .iter()
            .enumerate()
            .all(|(i, b)| *b == (i % 251) as u8)
    );
    assert_eq!(c.get("/", &[&cookie]).text(), "hello");

    // Server-Sent Events: each event arrives while the next is not even written yet.
    let mut c = Raw::open(gate);
    c.request("GET", "/sse", &[&cookie, "Accept: text/event-stream"]);
    let (status, headers) = c.head().unwrap();
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "content-type"), Some("text/event-stream"));
    assert_eq!(c.chunk().unwrap(), b"data: 1\n\n");
    dev.sse.store(1, Ordering::SeqCst);
    assert_eq!(c.chunk().unwrap(), b"data: 2\n\n");
    dev.sse.store(2, Ordering::SeqCst);
    assert_eq!(c.chunk().unwrap(), b"data: 3\n\n");
    assert!(c.chunk().is_none());
}

#[test]
fn upgrades_are_spliced_only_after_a_101() {
    let (dev, _s, gate, cookie) = previewed();
    let up = |path: &str| {
        let mut c = Raw::open(gate);
        c.request(
            "GET",
            path,
            &[
                &cookie,
                "Origin: http://app.localhost",
                "Connection: keep-alive, Upgrade",
                "Upgrade: websocket",
            ],
        );
        c
    };
    let mut c = up("/ws?token=vite-own");
    let (status, headers) = c.head().unwrap();
    assert_eq!(status, 101);
    assert_eq!(header(&headers, "upgrade"), Some("websocket"));
    c.send(b"\x81\x05hello");
    let mut echo = [0u8; 7];
    c.c.r.read_exact(&mut echo).unwrap();
    assert_eq!(&echo, b"\x81\x05hello");
    let seen = dev.got("/ws").join("").to_ascii_lowercase();
    assert!(seen.contains("get /ws?token=vite-own "), "{seen}");
    assert!(
        seen.contains(&format!("origin: http://localhost:{}", dev.port)),
        "{seen}"
    );

    // Refused by the dev server: relayed, then closed; what follows is never tunnelled.
    let mut c = up("/ws-refused");
    let got = c.response();
    assert_eq!((got.status, got.text().as_str()), (403, "nope"));
    c.send(b"GET /headers HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(c.closed_within(PROMPT));
    assert!(dev.got("/headers").is_empty());
}

#[test]
fn nothing_listening_is_a_503_at_once() {
    let s = serve();
    let (gate, port) = (free_port(), free_port());
    let cookie = exchange(
        gate,
        &token(&mint(&s, json!({"port": port, "gatePort": gate}))),
    );
    let mut c = Raw::open(gate);
    let t = Instant::now();
    let got = c.get("/", &[&cookie]);
    // The contract's bound: a refused connect answers at once, a silent one within 2 s.
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(got.status, 503);
    assert_eq!(
        got.text(),
        format!("PreviewUnavailable: nothing is listening on port {port}")
    );
    // Counted once the answer is out, so shortly after the client has it.
    let m = eventually(PROMPT, "the 503 counted", || {
        let m = s.client().get("/v1/metrics").text();
        m.contains("gitterm_gate_requests_total{outcome=\"unavailable\"} 1")
            .then_some(m)
    });
    assert!(
        m.contains("gitterm_gate_requests_total{outcome=\"exchanged\"} 1"),
        "{m}"
    );
    assert!(!m.contains("pv_"), "no grant id as a label: {m}");
}

#[test]
fn cookies_survive_a_kill_9_of_serve_and_no_credential_is_kept_or_logged() {
    let dev = Dev::start();
    let sb = Arc::new(Sandbox::new());
    let mut s = serve_in(&sb, &[], &[]);
    let gate = free_port();
    let g = mint(&s, json!({"port": dev.port, "gatePort": gate}));
    let spare = token(
        &s.client()
            .post(
                &format!("/v1/previews/grants/{}/tokens", id(&g)),
                &json!({}),
            )
            .json(),
    );
    let cookie = exchange(gate, &token(&g));
    let value = cookie.split_once('=').unwrap().1.to_string();
    s.kill9();
    let s2 = serve_in(&sb, &[], &[]);
    gate_up(gate);
    assert_eq!(Raw::open(gate).get("/", &[&cookie]).status, 200);
    // The spare token still works once, after the restart.
    let again = exchange(gate, &spare);
    assert!(again.starts_with(&format!("Cookie: __Host-gitterm-preview-{gate}=")));
    for secret in [token(&g), spare, value] {
        assert!(
            files_holding(&s2.home, &secret).is_empty(),
            "{secret} is kept under the state root"
        );
        assert!(
            !s.log_text().contains(&secret) && !s2.log_text().contains(&secret),
            "{secret} is logged"
        );
    }
    let mode = |f: &str| {
        std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(s2.home.join("previews").join(f))
                .unwrap()
                .permissions(),
        ) & 0o777
    };
    assert_eq!((mode("grants.json"), mode("key")), (0o600, 0o600));
}

#[test]
fn a_boot_change_suspends_grants_until_a_mint_reopens_them_with_the_same_id() {
    let dev = Dev::start();
    let sb = Arc::new(Sandbox::new());
    let boot = sb.file("boot_id");
    std::fs::write(&boot, "boot-a\n").unwrap();
    let env = [("GITTERM_BOOT_ID_FILE", boot.to_str().unwrap())];
    let mut s = serve_in(&sb, &env, &[]);
    let gate = free_port();
    let key =
        json!({"port": dev.port, "gatePort": gate, "identity": {"scope": "user", "id": "u_412"}});
    let g = mint(&s, key.clone());
    let cookie = exchange(gate, &token(&g));
    s.kill9();
    std::fs::write(&boot, "boot-b\n").unwrap();
    let s = serve_in(&sb, &env, &[]);
    gate_up(gate);
    let got = Raw::open(gate).get("/", &[&cookie]);
    assert_eq!(got.status, 503);
    assert_eq!(
        got.text(),
        "PreviewUnavailable: this sandbox was restored from a snapshot; the preview comes back when its port is exposed again"
    );
    let listed = s.client().get("/v1/previews/grants").json();
    assert_eq!(listed["grants"][0]["suspended"], true);
    let again = mint(&s, key);
    assert_eq!(again["id"], g["id"]);
    assert_eq!(again["suspended"], false);
    assert_eq!(Raw::open(gate).get("/", &[&cookie]).status, 200);
}

#[test]
fn the_scoped_token_mints_but_cannot_revoke() {
    let dev = Dev::start();
    let sb = Arc::new(Sandbox::new());
    let scoped = sb.file("scoped.token");
    write_mode(&scoped, "scoped-token-0123456789abcdef\n", 0o600);
    let s = serve_in(&sb, &[], &["--scoped-token-file", scoped.to_str().unwrap()]);
    let gate = free_port();
    let mut c = Client::connect(&s.addr).token("scoped-token-0123456789abcdef");
    let g = c.post(
        "/v1/previews/grants",
        &json!({"port": dev.port, "gatePort": gate}),
    );
    assert_eq!(g.status, 200, "{}", g.text());
    let gid = id(&g.json());
    assert_eq!(
        c.post(&format!("/v1/previews/grants/{gid}/tokens"), &json!({}))
            .status,
        200
    );
    assert_eq!(c.get("/v1/previews/grants").status, 200);
    let r = c.post(&format!("/v1/previews/grants/{gid}/revoke"), &json!({}));
    assert_eq!((r.status, r.code()), (403, "forbidden".to_string()));
    let cookie = exchange(gate, &token(&g.json()));
    assert_eq!(Raw::open(gate).get("/", &[&cookie]).status, 200);
}

#[test]
fn a_revoke_closes_open_websockets_and_long_responses_within_a_second() {
    let dev = Dev::start();
    let s = serve();
    let gate = free_port();
    let g = mint(&s, json!({"port": dev.port, "gatePort": gate}));
    let cookie = exchange(gate, &token(&g));
    let mut ws = upgraded(gate, &cookie);
    let mut long = Raw::open(gate);
    long.request("GET", "/long", &[&cookie]);
    assert_eq!(long.head().unwrap().0, 200);
    assert_eq!(long.chunk().unwrap(), b"tick\n");
    let mut idle = Raw::open(gate);
    assert_eq!(idle.get("/", &[&cookie]).status, 200);
    eventually(PROMPT, "three connections counted", || {
        (s.client().get("/v1/previews/grants").json()["grants"][0]["connections"] == 3)
            .then_some(())
    });
    let r = s.client().post(
        &format!("/v1/previews/grants/{}/revoke", id(&g)),
        &json!({}),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["revoked"], true);
    // The contract's bound, checked as the browser sees it.
    for (what, c) in [
        ("websocket", &mut ws),
        ("long response", &mut long),
        ("kept-alive", &mut idle),
    ] {
        assert!(c.closed_within(Duration::from_secs(1)), "{what} still open");
    }
    assert_eq!(Raw::open(gate).get("/", &[&cookie]).status, 401);
    // A later mint for the same key is a new grant; the old cookie stays dead.
    let fresh = mint(&s, json!({"port": dev.port, "gatePort": gate}));
    assert_ne!(fresh["id"], g["id"]);
    assert_eq!(Raw::open(gate).get("/", &[&cookie]).status, 401);
}

#[test]
fn the_cli_lists_and_revokes_and_a_running_serve_follows() {
    let dev = Dev::start();
    let sb = Arc::new(Sandbox::new());
    let s = serve_in(&sb, &[], &[]);
    let gate = free_port();
    let g = mint(
        &s,
        json!({"port": dev.port, "gatePort": gate, "identity": {"scope": "user", "id": "u_1"}}),
    );
    let cookie = exchange(gate, &token(&g));
    let out = sb.run(&["previews"]);
    assert!(out.success(), "{}", out.stderr);
    assert!(
        out.stdout.contains(&id(&g))
            && out.stdout.contains("live")
            && out.stdout.contains("user:u_1"),
        "{}",
        out.stdout
    );
    let mut ws = upgraded(gate, &cookie);
    let out = sb.run(&["previews", "revoke", &id(&g)]);
    assert!(out.success(), "{}", out.stderr);
    assert!(ws.closed_within(PROMPT));
    let v = sb.json(&["previews", "--json"]);
    assert_eq!(v["grants"][0]["revoked"], true);
    assert!(!v.to_string().contains(&token(&g)));
    let bad = sb.run(&["previews", "revoke", "pv_nope"]);
    assert!(
        !bad.success() && bad.stderr.contains("not a grant id"),
        "{}",
        bad.stderr
    );
}

#[test]
fn failed_exchanges_are_rate_limited() {
    let s = serve();
    let gate = free_port();
    let port = free_port();
    mint(&s, json!({"port": port, "gatePort": gate}));
    gate_up(gate);
    let mut c = Raw::open(gate);
    let mut statuses = Vec::new();
    for i in 0..32 {
        let got = c.get(&format!("/?preview_token=pvt_guess{i}"), &[]);
        statuses.push(got.status);
        if got.status == 429 {
            break;
        }
    }
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    assert!(statuses[..statuses.len() - 1].iter().all(|&s| s == 401));
    // A guesser on the same address (behind a provider's proxy every browser may share
    // one) does not hold a real link off, and stays refused itself.
    let g = mint(&s, json!({"port": port, "gatePort": gate}));
    let got = Raw::open(gate).get(&format!("/?preview_token={}", token(&g)), &[]);
    assert_eq!(got.status, 302, "{}", got.text());
    let got = Raw::open(gate).get("/?preview_token=pvt_guess99", &[]);
    assert_eq!(got.status, 429, "{}", got.text());
}

#[test]
fn a_dev_server_on_another_loopback_address_is_reached_and_one_beyond_it_is_bypassable() {
    let s = serve();
    // 127.0.0.2: loopback, but not an address that E2B's envd re-exposes.
    let private = Dev::start_on("127.0.0.2");
    let gate = free_port();
    let g = mint(&s, json!({"port": private.port, "gatePort": gate}));
    assert_eq!(g["bypassable"], false);
    let cookie = exchange(gate, &token(&g));
    assert_eq!(Raw::open(gate).get("/", &[&cookie]).text(), "hello");
    let open = Dev::start_on("0.0.0.0");
    let g = mint(&s, json!({"port": open.port, "gatePort": free_port()}));
    assert_eq!(g["bypassable"], true);
}

#[test]
fn a_public_grant_needs_no_cookie_until_it_is_revoked() {
    let dev = Dev::start();
    let s = serve();
    let gate = free_port();
    let g = mint(
        &s,
        json!({"port": dev.port, "gatePort": gate, "public": true}),
    );
    assert_eq!(g["public"], true);
    gate_up(gate);
    let got = Raw::open(gate).get("/headers", &[]);
    assert_eq!(got.status, 200);
    assert!(!got.text().contains("gitterm-preview"));
    let r = s.client().post(
        &format!("/v1/previews/grants/{}/revoke", id(&g)),
        &json!({}),
    );
    assert_eq!(r.status, 200);
    assert_eq!(Raw::open(gate).get("/", &[]).status, 401);
}

#[test]
fn mints_are_checked() {
    let s = serve();
    let mut c = s.client();
    let gate = free_port();
    for (body, code) in [
        (json!({"port": 1}), "invalid"),
        (json!({"port": 5, "gatePort": 5}), "invalid"),
        (
            json!({"port": 1, "gatePort": gate, "ttlSeconds": 86401}),
            "invalid",
        ),
        (
            json!({"port": 1, "gatePort": gate, "identity": {"scope": "user"}}),
            "invalid",
        ),
    ] {
        let r = c.post("/v1/previews/grants", &body);
        assert_eq!(r.code(), code, "{body}: {}", r.text());
    }
    assert_eq!(
        mint(&s, json!({"port": 1, "gatePort": gate}))["gatePort"],
        gate
    );
    // The gate port fronts port 1 now; port 2 needs another.
    assert_eq!(
        c.post("/v1/previews/grants", &json!({"port": 2, "gatePort": gate}))
            .code(),
        "conflict"
    );
    // The API's own port is taken: the gate cannot listen there.
    let api_port: u16 = s.addr.rsplit(':').next().unwrap().parse().unwrap();
    let r = c.post(
        "/v1/previews/grants",
        &json!({"port": 3, "gatePort": api_port}),
    );
    assert_eq!(r.code(), "conflict", "{}", r.text());
    let r = c.post(
        "/v1/previews/grants/pv_aaaaaaaaaaaaaaaaaaaaaaaaaa/tokens",
        &json!({}),
    );
    assert_eq!(r.code(), "not_found");
}
