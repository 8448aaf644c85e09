//! HTTP/1.1 and WebSocket conformance, as a strict client sees it: `HEAD`, `Date`, `Host`,
//! absolute-form targets, HTTP/1.0 framing, `If-None-Match`; the terminal WebSocket's
//! handshake, its close codes, a viewer that never reads, and upgrades under the
//! connection cap. Every request here is written byte by byte, so that nothing a client
//! library would smooth over is hidden.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

use crate::util::*;

/// One raw connection: requests as bytes, answers read head first, bodies only as told.
struct Raw {
    r: BufReader<TcpStream>,
}

/// A response head.
#[derive(Debug)]
struct Head {
    status: u16,
    headers: Vec<(String, String)>,
}

impl Head {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn all(&self, name: &str) -> usize {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .count()
    }

    fn len(&self) -> Option<usize> {
        self.header("content-length").map(|v| v.parse().unwrap())
    }
}

impl Raw {
    fn open(addr: &str) -> Raw {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(PROMPT)).unwrap();
        Raw {
            r: BufReader::new(s),
        }
    }

    fn send(&mut self, req: &str) {
        self.r.get_mut().write_all(req.as_bytes()).unwrap();
    }

    /// Reads a response head (`None` on EOF or reset).
    fn head(&mut self) -> Option<Head> {
        let mut line = String::new();
        if self.r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        assert!(line.starts_with("HTTP/1.1 "), "{line:?}");
        let status = line[9..12].parse().unwrap();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            self.r.read_line(&mut h).ok()?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap();
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
        Some(Head { status, headers })
    }

    /// A whole response with a `Content-Length` body.
    fn response(&mut self) -> (Head, Vec<u8>) {
        let h = self.head().expect("a response");
        let mut body = vec![0; h.len().unwrap_or(0)];
        self.r.read_exact(&mut body).unwrap();
        (h, body)
    }

    /// True once the server has closed the connection (EOF or reset, nothing more read).
    fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.r.read(&mut b), Ok(0) | Err(_))
    }
}

fn auth(s: &Server) -> String {
    format!("Authorization: Bearer {}\r\n", s.token)
}

/// Seconds since the epoch of an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
fn imf_secs(d: &str) -> Option<i64> {
    let p: Vec<&str> = d.split(' ').collect();
    let [wd, day, mon, year, time, "GMT"] = p[..] else {
        return None;
    };
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let m = months.iter().position(|&x| x == mon)? + 1;
    if wd.len() != 4 || !wd.ends_with(',') || day.len() != 2 || time.len() != 8 {
        return None;
    }
    let iso = format!("{year}-{m:02}-{day}T{time}Z");
    Some(epoch_ms(&iso)? / 1000)
}

#[test]
fn head_is_get_without_the_body_on_every_kind_of_route() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let r = c.post(
        "/v1/jobs",
        &json!({"command": "printf 'line one\\nline two\\n'"}),
    );
    let id = text(&r.json(), "id").to_string();
    let a = auth(&s);
    let mut raw = Raw::open(&s.addr);
    // Each HEAD is followed on the same connection by its GET: a body after a HEAD's head
    // would be read as the next answer, and the GET's own would then be misread.
    for (path, status) in [
        ("/v1/health".to_string(), 200),
        ("/v1/jobs".to_string(), 200),
        (format!("/v1/jobs/{id}"), 200),
        (format!("/v1/jobs/{id}/log"), 200),
        ("/v1/jobs/job_00000000000000000000".to_string(), 404),
        ("/v1/nothing".to_string(), 404),
        ("/v1/files/content?path=/nonexistent-file".to_string(), 404),
        ("/v1/files/content?path=/etc/hostname".to_string(), 200),
    ] {
        raw.send(&format!("HEAD {path} HTTP/1.1\r\nHost: t\r\n{a}\r\n"));
        let h = raw.head().expect("an answer to HEAD");
        raw.send(&format!("GET {path} HTTP/1.1\r\nHost: t\r\n{a}\r\n"));
        let (g, body) = raw.response();
        assert_eq!((h.status, g.status), (status, status), "{path}: {h:?}");
        assert_eq!(h.len(), Some(body.len()), "{path}: {h:?}");
        assert_eq!(h.header("content-type"), g.header("content-type"), "{path}");
        assert_eq!(h.header("etag"), g.header("etag"), "{path}");
    }
    // A route that only POSTs: what a GET gets, without the body; HEAD is allowed where GET is.
    raw.send(&format!(
        "HEAD /v1/jobs/{id}/cancel HTTP/1.1\r\nHost: t\r\n{a}\r\n"
    ));
    let h = raw.head().unwrap();
    assert_eq!((h.status, h.header("allow")), (400, Some("POST")), "{h:?}");
    raw.send(&format!(
        "DELETE /v1/jobs/{id} HTTP/1.1\r\nHost: t\r\n{a}\r\n"
    ));
    let (h, _) = raw.response();
    assert_eq!((h.status, h.header("allow")), (400, Some("GET, HEAD")));
    // A followed log: the head of a chunked stream, and the connection goes on at once.
    raw.send(&format!(
        "HEAD /v1/jobs/{id}/log?follow=true HTTP/1.1\r\nHost: t\r\n{a}\r\n"
    ));
    let h = raw.head().unwrap();
    assert_eq!(h.status, 200, "{h:?}");
    assert_eq!(h.header("transfer-encoding"), Some("chunked"));
    raw.send("GET /v1/health HTTP/1.1\r\nHost: t\r\n\r\n");
    let (g, body) = raw.response();
    assert_eq!(g.status, 200);
    assert!(String::from_utf8_lossy(&body).contains("\"ok\":true"));
    // HEAD never upgrades.
    let sh = c.post(
        "/v1/jobs",
        &json!({"command": "sleep 30", "pty": {"cols": 80, "rows": 24}, "background": true}),
    );
    let pty = text(&sh.json(), "id").to_string();
    raw.send(&format!(
        "HEAD /v1/jobs/{pty}/pty HTTP/1.1\r\nHost: t\r\n{a}Upgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    ));
    let h = raw.head().unwrap();
    assert_eq!(h.status, 400, "{h:?}");
    raw.send("GET /v1/health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    assert_eq!(raw.response().0.status, 200);
    c.post(&format!("/v1/jobs/{pty}/cancel"), &json!({}));
}

#[test]
fn every_answer_carries_a_date() {
    let s = Server::start(&[]);
    let now = now_ms() / 1000;
    for req in [
        "GET /v1/health HTTP/1.1\r\nHost: t\r\n\r\n".to_string(),
        "GET /v1/jobs HTTP/1.1\r\nHost: t\r\n\r\n".to_string(),
        format!("GET /v1/nothing HTTP/1.1\r\nHost: t\r\n{}\r\n", auth(&s)),
        "GET /v1/health HTTP/1.1\r\nBad Header\r\n\r\n".to_string(),
        "GET /v1/health HTTP/1.0\r\n\r\n".to_string(),
    ] {
        let mut raw = Raw::open(&s.addr);
        raw.send(&req);
        let h = raw.head().unwrap();
        assert_eq!(h.all("date"), 1, "{req:?}: {h:?}");
        let d = h.header("date").unwrap();
        let secs = imf_secs(d).unwrap_or_else(|| panic!("not an IMF-fixdate: {d:?}"));
        // The clock of this machine, as read by the test, within the test's own bound.
        assert!(
            (secs - now).abs() <= PROMPT.as_secs() as i64,
            "{d} vs {now}"
        );
    }
}

#[test]
fn host_must_be_there_once_in_http_1_1() {
    let s = Server::start(&[]);
    for (req, status) in [
        ("GET /v1/health HTTP/1.1\r\n\r\n", 400),
        ("GET /v1/health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        ("GET /v1/health HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n", 400),
        ("GET /v1/health HTTP/1.1\r\nHost: a b\r\n\r\n", 400),
        ("GET /v1/health HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        ("GET /v1/health HTTP/1.0\r\n\r\n", 200),
        ("GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1:1\r\n\r\n", 200),
    ] {
        let mut raw = Raw::open(&s.addr);
        raw.send(req);
        let (h, body) = raw.response();
        assert_eq!(h.status, status, "{req:?}");
        if status == 400 {
            let v: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["error"]["code"], "invalid", "{v}");
            assert!(text(&v["error"], "message").contains("Host"), "{v}");
            assert!(raw.closed(), "{req:?}: the connection stays open");
        }
    }
}

#[test]
fn an_absolute_form_target_is_served_as_its_path() {
    let s = Server::start(&[]);
    let mut raw = Raw::open(&s.addr);
    let a = auth(&s);
    let host = s.addr.clone();
    raw.send(&format!(
        "GET http://{host}/v1/health HTTP/1.1\r\nHost: {host}\r\n\r\n"
    ));
    let (h, body) = raw.response();
    assert_eq!(h.status, 200, "{}", String::from_utf8_lossy(&body));
    raw.send(&format!(
        "GET HTTP://{host}/v1/jobs?limit=1 HTTP/1.1\r\nHost: {host}\r\n{a}\r\n"
    ));
    let (h, body) = raw.response();
    assert_eq!(h.status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("\"jobs\""));
}

#[test]
fn transfer_encoding_in_http_1_0_is_refused_and_the_connection_closed() {
    let s = Server::start(&[]);
    let mut raw = Raw::open(&s.addr);
    // Keep-alive asked for, and a second request behind the body: a server that read the
    // body as chunked would answer both on one connection.
    raw.send(&format!(
        "POST /v1/env HTTP/1.0\r\nConnection: keep-alive\r\n{}Transfer-Encoding: chunked\r\n\r\n\
         2\r\n{{}}\r\n0\r\n\r\nGET /v1/health HTTP/1.0\r\n\r\n",
        auth(&s)
    ));
    let (h, body) = raw.response();
    assert_eq!(h.status, 400, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("HTTP/1.0"));
    assert!(raw.closed(), "the connection stays open");
}

#[test]
fn if_none_match_with_the_current_etag_is_304_without_a_body() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let f = s.dir().join("cached.txt");
    std::fs::write(&f, b"cached content\n").unwrap();
    let path = format!("/v1/files/content?path={}", f.display());
    let r = c.get(&path);
    assert_eq!(r.status, 200);
    let etag = r.header("etag").unwrap().to_string();
    let a = auth(&s);
    let mut raw = Raw::open(&s.addr);
    for (method, tag, status) in [
        ("GET", etag.clone(), 304),
        ("GET", format!("W/{etag}"), 304),
        ("GET", format!("\"other\", {etag}"), 304),
        ("GET", "*".into(), 304),
        ("HEAD", etag.clone(), 304),
        ("GET", "\"other\"".into(), 200),
    ] {
        raw.send(&format!(
            "{method} {path} HTTP/1.1\r\nHost: t\r\n{a}If-None-Match: {tag}\r\n\r\n"
        ));
        let h = raw.head().unwrap();
        assert_eq!(h.status, status, "{method} {tag}: {h:?}");
        assert_eq!(h.header("etag"), Some(etag.as_str()));
        if status == 304 {
            assert_eq!(h.len(), None, "{h:?}");
        } else {
            let mut body = vec![0; h.len().unwrap()];
            raw.r.read_exact(&mut body).unwrap();
            assert_eq!(body, b"cached content\n");
        }
    }
    // Changed: the old tag no longer matches.
    std::fs::write(&f, b"new content, longer\n").unwrap();
    raw.send(&format!(
        "GET {path} HTTP/1.1\r\nHost: t\r\n{a}If-None-Match: {etag}\r\n\r\n"
    ));
    let (h, body) = raw.response();
    assert_eq!(h.status, 200);
    assert_eq!(body, b"new content, longer\n");
}
