//! `GET /v1/jobs/{id}/log`: the whole stored output as plain text, streamed from the file
//! (the server's memory stays flat), byte ranges, and `?follow=true` streaming a running
//! job's output as it comes, chunked, until the job ends.

use std::io::Read;
use std::time::{Duration, Instant};

use crate::util::http::header;
use crate::util::*;

const TEXT: &str = "text/plain; charset=utf-8";

/// Starts a job in the background and returns its id.
fn start(c: &mut Client, command: &str) -> String {
    c.start_id(json!({"command": command, "background": true}))
}

/// Runs a job to its end and returns its id.
fn run(c: &mut Client, command: &str) -> String {
    let v = c
        .post("/v1/jobs", &json!({"command": command, "waitSeconds": 120}))
        .json();
    assert_eq!(v["status"], "succeeded", "{v:#}");
    text(&v, "id").to_string()
}

/// The job's output.log, as stored.
fn stored(s: &Server, id: &str) -> Vec<u8> {
    std::fs::read(s.home.join("jobs").join(id).join("output.log")).unwrap()
}

/// Sends `GET target` with extra headers on `c`'s connection and reads the status line and
/// headers only, leaving the body to be read.
fn request_head(
    c: &mut Client,
    target: &str,
    headers: &[(&str, &str)],
) -> (u16, Vec<(String, String)>) {
    let mut req = format!(
        "GET {target} HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {}\r\n",
        c.token.as_deref().unwrap()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    c.write_raw(req.as_bytes()).unwrap();
    c.read_head()
}

/// A followed log: each chunk with when it arrived (from `since`), until the last chunk.
fn follow_all(c: &mut Client, since: Instant) -> Vec<(Duration, Vec<u8>)> {
    let mut chunks = Vec::new();
    while let Some(data) = c.read_chunk() {
        chunks.push((since.elapsed(), data));
    }
    chunks
}

#[test]
fn the_whole_log_is_the_stored_output_and_is_never_held_in_memory() {
    let s = Server::start(&[]);
    let mut c = s.client();
    // About 20 MB of base64 lines.
    let id = run(&mut c, "head -c 15000000 /dev/urandom | base64");
    let want = stored(&s, &id);
    assert!(want.len() > 20_000_000, "{}", want.len());
    let before = rss_bytes(s.pid());
    let (status, headers) = request_head(&mut c, &format!("/v1/jobs/{id}/log"), &[]);
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "content-type"), Some(TEXT));
    assert_eq!(header(&headers, "accept-ranges"), Some("bytes"));
    assert_eq!(
        header(&headers, "content-length"),
        Some(want.len().to_string().as_str())
    );
    // Read it slowly, a MiB at a time, looking at the server's memory after each.
    let mut got = Vec::with_capacity(want.len());
    let mut most = before;
    let mut buf = vec![0u8; 1 << 20];
    while got.len() < want.len() {
        let n = (want.len() - got.len()).min(buf.len());
        c.r.read_exact(&mut buf[..n]).unwrap();
        got.extend_from_slice(&buf[..n]);
        most = most.max(rss_bytes(s.pid()));
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(got == want, "the log differs from output.log");
    let grew = most.saturating_sub(before);
    assert!(
        grew < 16 << 20,
        "the server grew by {} MiB while sending a {} MB log",
        grew >> 20,
        want.len() / 1_000_000
    );
    // The same as the CLI prints, and the connection goes on.
    let cli = s.sb.run(&["logs", &id]);
    assert!(cli.success(), "{cli:#?}");
    assert!(
        cli.stdout.as_bytes() == want,
        "the log differs from `logs ID`"
    );
    assert_eq!(c.get("/v1/health").status, 200);
}

#[test]
fn one_byte_range_is_answered_with_206_and_others_with_416() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let id = run(&mut c, "printf 'abcdefghij\\nklmnopqrs'");
    let path = format!("/v1/jobs/{id}/log");
    let log = "abcdefghij\nklmnopqrs";
    assert_eq!(stored(&s, &id), log.as_bytes());
    let whole = c.get(&path);
    assert_eq!(whole.status, 200);
    assert_eq!(whole.text(), log);
    assert_eq!(whole.header("content-type"), Some(TEXT));
    assert_eq!(whole.header("accept-ranges"), Some("bytes"));
    assert_eq!(whole.header("content-length"), Some("20"));
    assert_eq!(whole.header("content-range"), None);
    for (range, body, content_range) in [
        ("bytes=0-4", "abcde", "bytes 0-4/20"),
        ("bytes=3-3", "d", "bytes 3-3/20"),
        ("bytes=11-", "klmnopqrs", "bytes 11-19/20"),
        ("bytes=-3", "qrs", "bytes 17-19/20"),
        ("bytes=15-1000", "opqrs", "bytes 15-19/20"),
        ("bytes=-500", log, "bytes 0-19/20"),
        ("bytes=0-", log, "bytes 0-19/20"),
    ] {
        let r = c.send("GET", &path, &[("Range", range)], None);
        assert_eq!(r.status, 206, "{range}: {}", r.text());
        assert_eq!(r.text(), body, "{range}");
        assert_eq!(r.header("content-range"), Some(content_range), "{range}");
        assert_eq!(
            r.header("content-length"),
            Some(body.len().to_string().as_str()),
            "{range}"
        );
        assert_eq!(r.header("content-type"), Some(TEXT), "{range}");
        assert_eq!(r.header("accept-ranges"), Some("bytes"), "{range}");
    }
    // Past the end, malformed, or more than one range: 416 with the length. (Its JSON is
    // checked against docs/openapi.json.)
    for range in [
        "bytes=20-",
        "bytes=25-30",
        "bytes=-0",
        "bytes=5-2",
        "bytes=x-",
        "bytes=0-1,4-5",
    ] {
        let r = c.send("GET", &path, &[("Range", range)], None);
        assert_eq!(r.status, 416, "{range}: {}", r.text());
        assert_eq!(r.header("content-range"), Some("bytes */20"), "{range}");
        assert_eq!(r.code(), "invalid", "{range}");
        assert_eq!(
            r.checked.as_deref(),
            Some("GET /v1/jobs/{id}/log 416"),
            "{range}"
        );
    }
    let several = c.send("GET", &path, &[("Range", "bytes=0-1,4-5")], None);
    assert!(
        several.text().contains("one range at a time"),
        "{}",
        several.text()
    );
    // Another unit, or an If-Range (there are no validators to match): the whole log.
    for headers in [
        &[("Range", "lines=1-2")][..],
        &[("Range", "bytes=0-1"), ("If-Range", "\"x\"")],
    ] {
        let r = c.send("GET", &path, headers, None);
        assert_eq!(r.status, 200, "{headers:?}");
        assert_eq!(r.text(), log, "{headers:?}");
    }
    // A log with nothing stored: empty, and every range of it is unsatisfiable.
    let empty = run(&mut c, "true");
    let r = c.get(&format!("/v1/jobs/{empty}/log"));
    assert_eq!((r.status, r.body.len()), (200, 0));
    assert_eq!(r.header("content-length"), Some("0"));
    let r = c.send(
        "GET",
        &format!("/v1/jobs/{empty}/log"),
        &[("Range", "bytes=-1")],
        None,
    );
    assert_eq!(r.status, 416);
    assert_eq!(r.header("content-range"), Some("bytes */0"));
}

#[test]
fn follow_streams_output_as_it_comes_and_ends_with_the_job() {
    let s = Server::start(&[]);
    let mut c = s.client();
    // A line every 100 ms, for 3 s.
    let id = start(
        &mut c,
        "for i in $(seq 1 30); do echo line $i; sleep 0.1; done",
    );
    let asked = Instant::now();
    let (status, headers) = request_head(&mut c, &format!("/v1/jobs/{id}/log?follow=true"), &[]);
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "transfer-encoding"), Some("chunked"));
    assert_eq!(header(&headers, "content-type"), Some(TEXT));
    assert_eq!(header(&headers, "content-length"), None);
    let chunks = follow_all(&mut c, asked);
    let ended = asked.elapsed();
    let got: Vec<u8> = chunks.iter().flat_map(|(_, d)| d.clone()).collect();
    let want: String = (1..=30).map(|i| format!("line {i}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&got), want);
    assert_eq!(got, stored(&s, &id));
    // The stream ends with the job: its record says so by then.
    let rec = c.get(&format!("/v1/jobs/{id}")).json();
    assert_eq!(rec["status"], "succeeded", "{rec:#}");
    // The first line came at once (1 s: the job prints one every 100 ms and runs for 3 s),
    // and lines kept coming as they were printed, not all at the end.
    let (first, _) = &chunks[0];
    assert!(
        *first < Duration::from_secs(1),
        "the first line took {first:?}"
    );
    assert!(chunks.len() >= 10, "{} chunks", chunks.len());
    let fifth = chunks
        .iter()
        .scan(0, |n, (t, d)| {
            *n += d.iter().filter(|&&b| b == b'\n').count();
            Some((*n, *t))
        })
        .find(|(n, _)| *n >= 5)
        .unwrap()
        .1;
    assert!(
        ended - fifth > Duration::from_secs(1),
        "line 5 came at {fifth:?}, the end at {ended:?}"
    );
    // The connection is kept alive after the last chunk.
    assert_eq!(c.get("/v1/health").status, 200);
}

#[test]
fn follow_of_an_ended_job_sends_the_whole_log_and_ends() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let id = run(&mut c, "seq 1 300000");
    let t = Instant::now();
    let (status, headers) = request_head(&mut c, &format!("/v1/jobs/{id}/log?follow=1"), &[]);
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "transfer-encoding"), Some("chunked"));
    let got: Vec<u8> = follow_all(&mut c, t)
        .into_iter()
        .flat_map(|(_, d)| d)
        .collect();
    assert!(got == stored(&s, &id));
    assert!(got.starts_with(b"1\n2\n") && got.ends_with(b"299999\n300000\n"));
    assert!(t.elapsed() < PROMPT, "{:?}", t.elapsed());
    // follow=false is the plain log.
    let r = c.get(&format!("/v1/jobs/{id}/log?follow=false"));
    assert_eq!((r.status, r.body.len()), (200, got.len()));
}

#[test]
fn a_follower_that_never_reads_delays_neither_the_job_nor_other_clients() {
    let s = Server::start(&[]);
    let mut c = s.client();
    // About 20 MB/s of output, far more than socket buffers hold.
    let id = start(
        &mut c,
        "while :; do head -c 1000000 /dev/zero | tr '\\0' x; echo; sleep 0.05; done",
    );
    let mut stuck = s.client();
    let (status, _) = request_head(&mut stuck, &format!("/v1/jobs/{id}/log?follow=true"), &[]);
    assert_eq!(status, 200);
    // It reads nothing more. The job goes on storing output...
    let first = stored_len(&mut c, &id);
    eventually(PROMPT, "the job to store 40 MB more", || {
        (stored_len(&mut c, &id) > first + 40_000_000).then_some(())
    });
    // ...and others are answered at once. (5 s: well below the 30 s write deadline, the
    // only thing that would free a server blocked on the silent follower.)
    let mut other = s.client();
    for target in ["/v1/health", &format!("/v1/jobs/{id}")] {
        let t = Instant::now();
        assert_eq!(other.get(target).status, 200, "{target}");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{target}: {:?}",
            t.elapsed()
        );
    }
    // Another follower of the same job is sent its output.
    let mut second = s.client();
    let t = Instant::now();
    let (status, _) = request_head(&mut second, &format!("/v1/jobs/{id}/log?follow=true"), &[]);
    assert_eq!(status, 200);
    let chunk = second.read_chunk().unwrap();
    assert!(chunk.starts_with(b"xxxx"));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let cancelled = c.post(&format!("/v1/jobs/{id}/cancel"), &json!({})).json();
    assert_eq!(cancelled["status"], "cancelled");
    drop(stuck);
}

/// Bytes stored so far, from the record (which counts a running job's output.log).
fn stored_len(c: &mut Client, id: &str) -> u64 {
    c.get(&format!("/v1/jobs/{id}")).json()["outputBytes"]
        .as_u64()
        .unwrap()
}

#[test]
fn a_follow_waits_among_the_capped_waiting_requests() {
    // --max-connections 4: at most 2 requests wait at once.
    let s = Server::start(&["--max-connections", "4"]);
    let mut c = s.client();
    let id = start(&mut c, "echo started; sleep 30");
    let target = format!("/v1/jobs/{id}/log?follow=true");
    let mut followers: Vec<Client> = (0..2)
        .map(|_| {
            let mut f = s.client();
            let (status, _) = request_head(&mut f, &target, &[]);
            assert_eq!(status, 200);
            assert_eq!(f.read_chunk().unwrap(), b"started\n");
            f
        })
        .collect();
    let mut third = s.client();
    let r = third.get(&target);
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.code(), "rate_limited");
    // Once a follower hangs up, its place is free again.
    drop(followers.pop());
    let mut again = s.client();
    eventually_ok(PROMPT, "a follow to be admitted", || {
        let (status, _) = request_head(&mut again, &target, &[]);
        if status == 200 {
            return Ok(());
        }
        again = s.client();
        Err(status)
    });
    // An ended job's log needs no place: followed while both places are taken.
    // (Started in the background: a start that waits would need a place too.)
    let done = start(&mut c, "echo done");
    eventually(PROMPT, "the job to end", || {
        (c.get(&format!("/v1/jobs/{done}")).json()["status"] == "succeeded").then_some(())
    });
    let mut f = s.client();
    let (status, _) = request_head(&mut f, &format!("/v1/jobs/{done}/log?follow=true"), &[]);
    assert_eq!(status, 200);
    assert_eq!(f.read_chunk().unwrap(), b"done\n");
    assert_eq!(f.read_chunk(), None);
    c.post(&format!("/v1/jobs/{id}/cancel"), &json!({}));
}

#[test]
fn bad_ids_are_404_and_bad_queries_400() {
    let s = Server::start(&[]);
    let mut c = s.client();
    for id in [
        "job_00000000000000000000",
        "job_nope",
        "..",
        "job_0123456789ABCDEF0123",
    ] {
        let r = c.get(&format!("/v1/jobs/{id}/log"));
        assert_eq!(r.status, 404, "{id}: {}", r.text());
        assert_eq!(r.code(), "not_found", "{id}");
        let r = c.get(&format!("/v1/jobs/{id}/log?follow=true"));
        assert_eq!(r.code(), "not_found", "{id}");
    }
    let id = run(&mut c, "echo hi");
    let r = c.get(&format!("/v1/jobs/{id}/log?offset=0"));
    assert_eq!(r.status, 400);
    assert!(
        r.text().contains("unknown query parameter `offset`"),
        "{}",
        r.text()
    );
    let r = c.get(&format!("/v1/jobs/{id}/log?follow=yes"));
    assert_eq!(r.status, 400);
    assert!(
        r.text().contains("follow must be true or false"),
        "{}",
        r.text()
    );
    let r = c.send(
        "GET",
        &format!("/v1/jobs/{id}/log?follow=true"),
        &[("Range", "bytes=0-1")],
        None,
    );
    assert_eq!(r.status, 400);
    assert!(r.text().contains("takes no Range"), "{}", r.text());
    // Other methods are refused as on any route.
    let r = c.send("POST", &format!("/v1/jobs/{id}/log"), &[], Some(b"{}"));
    assert_eq!((r.status, r.header("allow")), (400, Some("GET, HEAD")));
    // And it needs the token.
    let r = s.anon().get(&format!("/v1/jobs/{id}/log"));
    assert_eq!(r.status, 401);
}
