//! Floods over real sockets on loopback: connections that never send a byte or trickle a
//! refused request, long-polls by the hundred and clients that never read a big listing
//! must not shut out a health check or an authenticated client, nor make the server hold
//! memory without bound.

use std::io::{Read, Write};

use crate::util;
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The harness's `serve` (its sandbox's guard ends the jobs and checks nothing is left),
/// with the raw one-connection-per-request calls these floods need.
struct Server {
    srv: util::Server,
    addr: String,
    token: String,
}

impl Server {
    /// Starts a server with `flags`, after `prepare` has filled its state root.
    fn start_with(flags: &[&str], prepare: impl FnOnce(&Path)) -> Server {
        let sb = util::Sandbox::new();
        prepare(sb.home());
        let srv = util::Server::start_in(std::sync::Arc::new(sb), "127.0.0.1:0", flags);
        Server {
            addr: srv.addr.clone(),
            token: srv.token.clone(),
            srv,
        }
    }

    fn start(flags: &[&str]) -> Server {
        Server::start_with(flags, |_| {})
    }

    /// One request on a new connection (`Connection: close`): the status, the JSON body
    /// and how long the answer took. `None` when the connection closed (or the read timed
    /// out) before a whole answer.
    fn call(
        &self,
        method: &str,
        target: &str,
        auth: bool,
        body: Option<&Value>,
    ) -> Option<(u16, Value, Duration)> {
        let t = Instant::now();
        let mut s = TcpStream::connect(&self.addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let auth = if auth {
            format!("Authorization: Bearer {}\r\n", self.token)
        } else {
            String::new()
        };
        write!(
            s,
            "{method} {target} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        )
        .ok()?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).ok()?;
        let raw = String::from_utf8_lossy(&raw);
        let (head, body) = raw.split_once("\r\n\r\n")?;
        let status = head.split(' ').nth(1)?.parse().ok()?;
        Some((
            status,
            serde_json::from_str(body).unwrap_or(Value::Null),
            t.elapsed(),
        ))
    }

    fn get(&self, target: &str) -> (u16, Value, Duration) {
        self.call("GET", target, true, None)
            .unwrap_or_else(|| panic!("no answer to GET {target}"))
    }

    /// `GET /v1/health`, unauthenticated.
    fn health(&self) -> (u16, Duration) {
        let (status, _, took) = self
            .call("GET", "/v1/health", false, None)
            .expect("an answer to a health check");
        (status, took)
    }

    /// Opens `n` connections that never send a byte.
    fn silent(&self, n: usize) -> Vec<TcpStream> {
        (0..n)
            .map(|_| TcpStream::connect(&self.addr).unwrap())
            .collect()
    }

    /// Threads of the server: one a connection, plus a few of its own.
    fn threads(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/task", self.srv.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// The server's resident memory, in bytes.
    fn rss(&self) -> u64 {
        util::rss_bytes(self.srv.pid())
    }

    /// Waits until the server runs at least `n` threads (it has taken the connections);
    /// fails with the count it last saw if it does not.
    fn wait_threads(&self, n: usize) {
        util::eventually_ok(
            util::PROMPT,
            &format!("serve to run at least {n} threads"),
            || match self.threads() {
                now if now >= n => Ok(()),
                now => Err(format!("{now} threads")),
            },
        );
    }

    /// Waits until the server has accepted every connection made so far (its listening
    /// socket's accept queue is empty); fails with the queue it last saw if it does not.
    fn wait_accepted(&self) {
        util::eventually_ok(
            util::PROMPT,
            "serve to accept every connection made",
            || match util::accept_queue(&self.addr) {
                Some(0) => Ok(()),
                other => Err(format!("accept queue {other:?}")),
            },
        );
    }
}

/// Health answers 200 within a second, and an authenticated listing 200; returns the
/// health check's latency.
fn still_served(s: &Server, when: &str) -> Duration {
    let (status, took) = s.health();
    assert_eq!(status, 200, "health {when}");
    assert!(took < Duration::from_secs(1), "health took {took:?} {when}");
    let (status, v, _) = s.get("/v1/jobs");
    assert_eq!(status, 200, "GET /v1/jobs {when}: {v}");
    took
}

#[test]
fn silent_connections_do_not_shut_out_health_or_clients() {
    let s = Server::start(&["--max-connections", "64"]);
    let base = s.threads();
    let mut held = s.silent(64);
    s.wait_threads(base + 64);
    let mut worst = still_served(&s, "with 64 silent connections open");
    // The flood goes on: each round opens as many again, and the server keeps answering.
    for round in 0..3 {
        held.extend(s.silent(64));
        s.wait_accepted();
        worst = worst.max(still_served(&s, &format!("in flood round {round}")));
    }
    // Unauthenticated clients that trickle a refused body are no better placed.
    let mut trickling: Vec<TcpStream> = s.silent(64);
    for c in &mut trickling {
        let _ = c.write_all(b"POST /v1/jobs HTTP/1.1\r\nHost: t\r\nContent-Length: 60000\r\n\r\n{");
    }
    std::thread::sleep(Duration::from_millis(1500));
    for c in &mut trickling {
        let _ = c.write_all(b" ");
    }
    worst = worst.max(still_served(&s, "with 64 trickled bodies"));
    eprintln!("health under a silent flood: at most {worst:?}");
    drop(held);
}

#[test]
fn a_silent_connection_is_closed_after_the_header_timeout() {
    let s = Server::start(&["--header-timeout", "1"]);
    let t = Instant::now();
    let mut c = util::http::Conn::Tcp(TcpStream::connect(&s.addr).unwrap());
    assert!(
        c.closed_within(Duration::from_secs(2)),
        "a connection that sent nothing was still open after {:?}",
        t.elapsed()
    );
    eprintln!("silent connection closed after {:?}", t.elapsed());
    // A head begun but never finished is answered `timeout`, on the same clock.
    let t = Instant::now();
    let mut c = TcpStream::connect(&s.addr).unwrap();
    c.write_all(b"GET /v1/health HTTP/1.1\r\nHost: t\r\n")
        .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut raw = String::new();
    let _ = c.read_to_string(&mut raw);
    assert!(raw.starts_with("HTTP/1.1 504"), "{raw:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(s.health().0, 200);
}

#[test]
fn long_polls_are_capped_and_do_not_shut_out_health_or_clients() {
    let s = std::sync::Arc::new(Server::start(&["--max-connections", "64"]));
    let (status, job, _) = s
        .call(
            "POST",
            "/v1/jobs",
            true,
            Some(&json!({"command": "sleep 60", "background": true})),
        )
        .unwrap();
    assert_eq!(status, 200, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    let base = s.threads();
    let polls: Vec<_> = (0..64)
        .map(|_| {
            let (s, id) = (std::sync::Arc::clone(&s), id.clone());
            std::thread::spawn(move || {
                s.call("GET", &format!("/v1/jobs/{id}?waitSeconds=60"), true, None)
                    .map(|(status, v, took)| (status, v["status"].clone(), took))
            })
        })
        .collect();
    s.wait_threads(base + 32);
    // `--max-connections 64` lets half that many wait: every other long-poll is refused at
    // once, so once that many are answered the rest are all waiting.
    util::eventually_ok(
        util::PROMPT,
        "the long-polls over the cap to be refused",
        || match polls.iter().filter(|p| p.is_finished()).count() {
            n if n >= 32 => Ok(()),
            n => Err(format!("{n} long-polls answered")),
        },
    );
    let mut worst = still_served(&s, "with 64 long-polls");
    let held = s.silent(64);
    s.wait_accepted();
    worst = worst.max(still_served(
        &s,
        "with 64 long-polls and 64 silent connections",
    ));
    eprintln!("health under a long-poll flood: at most {worst:?}");
    // Those over the cap were told at once; the others wait until the job ends.
    let (status, v, _) = s
        .call(
            "POST",
            &format!("/v1/jobs/{id}/cancel"),
            true,
            Some(&json!({})),
        )
        .unwrap();
    assert_eq!((status, &v["status"]), (200, &json!("cancelled")), "{v}");
    let (mut waited, mut refused) = (0, 0);
    for p in polls {
        match p.join().unwrap() {
            Some((200, status, _)) => {
                assert_eq!(status, "cancelled");
                waited += 1;
            }
            Some((429, _, took)) => {
                assert!(took < Duration::from_secs(1), "a refusal took {took:?}");
                refused += 1;
            }
            other => panic!("a long-poll got {other:?}"),
        }
    }
    eprintln!("long-polls: {waited} waited, {refused} refused");
    assert!(waited >= 16, "only {waited} long-polls were let wait");
    assert!(refused >= 1, "no long-poll was refused");
    drop(held);
}

/// A finished job's record, written straight into the state root.
fn plant_record(root: &Path, i: usize, command: &str) -> String {
    let id = format!("job_{i:020x}");
    let at = format!("2026-01-01T00:{:02}:{:02}.000Z", i / 60, i % 60);
    util::plant(
        root,
        &util::record(&id, command, "succeeded", &at, "boot-before"),
    );
    id
}

#[test]
fn slow_readers_of_a_big_listing_hold_little_memory_and_pages_cover_every_job() {
    const JOBS: usize = 300;
    let command = format!("echo {}", "x".repeat(50_000));
    let mut planted = Vec::new();
    let s = Server::start_with(&["--keep-days", "100000"], |root| {
        for i in 0..JOBS {
            planted.push(plant_record(root, i, &command));
        }
    });
    assert_eq!(s.health().0, 200);
    let before = s.rss();
    // Twenty clients ask for the listing and never read a byte of it.
    let slow: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut c = TcpStream::connect(&s.addr).unwrap();
            write!(
                c,
                "GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n",
                s.token
            )
            .unwrap();
            c
        })
        .collect();
    let mut peak = 0;
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        peak = peak.max(s.rss());
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "RSS: {} MiB before, peak {} MiB with 20 slow readers",
        before >> 20,
        peak >> 20
    );
    assert!(
        peak < 64 << 20,
        "the server grew to {} MiB for 20 clients that do not read",
        peak >> 20
    );
    assert!(still_served(&s, "with 20 slow readers") < Duration::from_secs(1));
    drop(slow);
    // Page by page, following `next`: every job exactly once, newest first.
    let mut seen: Vec<String> = Vec::new();
    let mut target = "/v1/jobs".to_string();
    let mut pages = 0;
    loop {
        let (status, v, _) = s.get(&target);
        assert_eq!(status, 200, "{target}: {v}");
        let jobs = v["jobs"].as_array().expect("a jobs array");
        assert!(
            !jobs.is_empty() || v["next"].is_null(),
            "{target}: an empty page"
        );
        seen.extend(jobs.iter().map(|j| j["id"].as_str().unwrap().to_string()));
        pages += 1;
        match v["next"].as_str() {
            Some(next) => target = format!("/v1/jobs?cursor={next}"),
            None => break,
        }
        assert!(pages <= JOBS, "the pages never end");
    }
    planted.reverse();
    assert_eq!(seen, planted, "every job once, newest first");
    // `limit` pages as well, and a small page says where the next one starts.
    let (_, v, _) = s.get("/v1/jobs?limit=2");
    assert_eq!(v["jobs"].as_array().unwrap().len(), 2);
    let next = v["next"].as_str().expect("a next cursor").to_string();
    let (_, v, _) = s.get(&format!("/v1/jobs?limit=2&cursor={next}"));
    assert_eq!(v["jobs"][0]["id"], planted[2].as_str());
    let (status, v, _) = s.get("/v1/jobs?limit=1001");
    assert_eq!((status, &v["error"]["code"]), (400, &json!("invalid")));
    let (status, v, _) = s.get("/v1/jobs?cursor=bogus");
    assert_eq!((status, &v["error"]["code"]), (400, &json!("invalid")));
    eprintln!("{JOBS} jobs in {pages} pages");
}
