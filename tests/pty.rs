//! Interactive jobs: stdin written later through the job's supervisor, terminal jobs, their
//! size, and every refusal of the routes.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::util::*;

fn write(c: &mut Client, id: &str, data: &[u8], close: bool) -> Resp {
    let q = if close { "?close=true" } else { "" };
    c.send("POST", &format!("/v1/jobs/{id}/stdin{q}"), &[], Some(data))
}

fn output(s: &Server, id: &str) -> PathBuf {
    s.home.join("jobs").join(id).join("output.log")
}

/// Waits until the job's output.log holds `needle`.
fn wait_output(s: &Server, id: &str, needle: &str) -> String {
    eventually(PROMPT, &format!("{needle:?} in the output"), || {
        let t = std::fs::read_to_string(output(s, id)).unwrap_or_default();
        t.contains(needle).then_some(t)
    })
}

fn final_record(c: &mut Client, id: &str) -> Value {
    let v = c.get(&format!("/v1/jobs/{id}?waitSeconds=30")).json();
    assert_ne!(v["status"], "running", "{v}");
    v
}

#[test]
fn stdin_arrives_exact_and_closes() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let dest = s.dir().join("got.bin");
    let id = c.start_id(
        json!({"command": format!("cat > '{}'", dest.display()), "interactive": true,
               "background": true}),
    );
    let sock = s.home.join("jobs").join(&id).join("control.sock");
    assert_eq!(mode(&sock) & 0o777, 0o600);
    let all: Vec<u8> = (0..=255u8).collect();
    let r = write(&mut c, &id, &all[..100], false);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"ok": true}));
    let r = write(&mut c, &id, &all[100..], true);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = final_record(&mut c, &id);
    assert_eq!(v["status"], "succeeded", "{v}");
    assert_eq!(std::fs::read(&dest).unwrap(), all);
    assert!(!sock.exists(), "the socket outlives the job");
    // Ended: conflict.
    let r = write(&mut c, &id, b"late", false);
    assert_eq!(
        (r.status, r.code()),
        (409, "conflict".into()),
        "{}",
        r.text()
    );
}

#[test]
fn stdin_refusals() {
    let s = Server::start(&[]);
    let mut c = s.client();
    // Not interactive.
    let plain = c.start_id(json!({"command": "sleep 30", "background": true}));
    let r = write(&mut c, &plain, b"x", false);
    assert_eq!(
        (r.status, r.code()),
        (409, "conflict".into()),
        "{}",
        r.text()
    );
    assert!(r.text().contains("not interactive"), "{}", r.text());
    let r = c.post(
        &format!("/v1/jobs/{plain}/resize"),
        &json!({"cols": 10, "rows": 10}),
    );
    assert_eq!(r.status, 409, "{}", r.text());
    // Closed.
    let id = c.start_id(json!({"command": "sleep 30", "interactive": true, "background": true}));
    assert_eq!(write(&mut c, &id, b"", true).status, 200);
    let r = write(&mut c, &id, b"x", false);
    assert_eq!(
        (r.status, r.code()),
        (409, "conflict".into()),
        "{}",
        r.text()
    );
    assert!(r.text().contains("closed"), "{}", r.text());
    assert_eq!(write(&mut c, &id, b"", true).status, 409);
    // Not a terminal.
    let r = c.post(
        &format!("/v1/jobs/{id}/resize"),
        &json!({"cols": 10, "rows": 10}),
    );
    assert_eq!(r.status, 409, "{}", r.text());
    // Bad requests.
    let r = c.send(
        "POST",
        &format!("/v1/jobs/{id}/stdin?close=yes"),
        &[],
        Some(b"x"),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    for body in [
        json!({"cols": 0, "rows": 10}),
        json!({"cols": 1001, "rows": 10}),
        json!({"cols": 10}),
        json!({"cols": 10, "rows": 10, "depth": 1}),
        json!({"cols": "10", "rows": 10}),
    ] {
        let r = c.post(&format!("/v1/jobs/{id}/resize"), &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
    }
    for body in [
        json!({"command": "cat", "interactive": true, "stdin": "x"}),
        json!({"command": "cat", "pty": {"cols": 0, "rows": 24}}),
        json!({"command": "cat", "pty": {"cols": 80, "rows": 1001}}),
        json!({"command": "cat", "pty": {"cols": 80}}),
        json!({"command": "cat", "pty": {"cols": 80, "rows": 24, "x": 1}}),
        json!({"command": "cat", "pty": [80, 24]}),
        json!({"command": "cat", "interactive": "yes"}),
    ] {
        let r = c.post("/v1/jobs", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
    }
    // Unknown job.
    let r = write(&mut c, "job_00000000000000000000", b"x", false);
    assert_eq!(r.status, 404, "{}", r.text());
    for id in [plain, id] {
        c.post(&format!("/v1/jobs/{id}/cancel"), &json!({}));
    }
}

#[test]
fn a_job_that_does_not_read_never_blocks_and_the_writer_is_told() {
    let s = Server::start(&["--max-body", "4194304"]);
    let mut c = s.client();
    let id = c.start_id(
        json!({"command": "i=0; while [ $i -lt 400 ]; do echo tick$i; i=$((i+1)); sleep 0.05; done",
               "interactive": true, "background": true}),
    );
    // More than the pipe and the supervisor's bound take: the request waits, then is
    // refused, while the job's output goes on.
    let big = vec![b'a'; 3 << 20];
    let t = Instant::now();
    let r = write(&mut c, &id, &big, false);
    assert_eq!(
        (r.status, r.code()),
        (429, "rate_limited".into()),
        "{}",
        r.text()
    );
    assert!(t.elapsed() < Duration::from_secs(30));
    wait_output(&s, &id, "tick100\n");
    // Refused part-way through its body, the request's connection closed.
    s.client()
        .post(&format!("/v1/jobs/{id}/cancel"), &json!({}));
}

#[test]
fn terminal_size_resize_term_and_exit_status() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let id = c.start_id(json!({"command": "stty size; echo \"term=$TERM\"; read a; stty size; echo \"got=$a\"; read b; exit 3",
               "pty": {"cols": 80, "rows": 24}, "background": true}),
    );
    wait_output(&s, &id, "24 80");
    wait_output(&s, &id, "term=xterm-256color");
    let r = c.post(
        &format!("/v1/jobs/{id}/resize"),
        &json!({"cols": 100, "rows": 30}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(write(&mut c, &id, b"line one\n", false).status, 200);
    wait_output(&s, &id, "30 100");
    wait_output(&s, &id, "got=line one");
    assert_eq!(write(&mut c, &id, b"\n", false).status, 200);
    let v = final_record(&mut c, &id);
    assert_eq!(
        (v["status"].as_str(), v["exitCode"].as_i64()),
        (Some("failed"), Some(3)),
        "{v}"
    );
    // The job's own TERM wins.
    let v = c
        .post(
            "/v1/jobs",
            &json!({"command": "echo \"term=$TERM\"; tty >/dev/null && echo on-a-tty",
                    "env": {"TERM": "dumb"}, "pty": {"cols": 20, "rows": 5}}),
        )
        .json();
    assert_eq!(v["status"], "succeeded", "{v}");
    let out = v["output"].as_str().unwrap();
    assert!(
        out.contains("term=dumb") && out.contains("on-a-tty"),
        "{out:?}"
    );
}

#[test]
fn ctrl_c_interrupts_the_foreground_job() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let id = c.start_id(json!({"command": "echo ready; sleep 30; echo after",
               "pty": {"cols": 80, "rows": 24}, "background": true}));
    wait_output(&s, &id, "ready");
    // The signal must find sleep in the foreground, not the shell about to start it.
    eventually(PROMPT, "sleep to run", || {
        job_processes(&id)
            .iter()
            .any(|p| p.cmdline.starts_with("sleep"))
            .then_some(())
    });
    let t = Instant::now();
    assert_eq!(write(&mut c, &id, b"\x03", false).status, 200);
    let v = final_record(&mut c, &id);
    assert!(t.elapsed() < Duration::from_secs(20), "{v}");
    assert_ne!(v["status"], "succeeded", "{v}");
    assert!(!v["output"].as_str().unwrap().contains("after"), "{v}");
}

#[test]
fn a_terminal_job_ends_when_its_terminal_closes_and_secrets_stay_masked() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let v = c
        .post(
            "/v1/jobs",
            &json!({"command": "printf 'x-sec'; sleep 0.3; printf 'ret-value-y\\n'",
                    "secretEnv": {"S": "sec-ret-value"}, "pty": {"cols": 80, "rows": 24}}),
        )
        .json();
    assert_eq!(v["status"], "succeeded", "{v}");
    let id = text(&v, "id").to_string();
    let log = std::fs::read(output(&s, &id)).unwrap();
    let log = String::from_utf8_lossy(&log);
    assert!(!log.contains("sec-ret-value"), "{log:?}");
    assert!(log.contains("x-") && log.contains("-y"), "{log:?}");
}

// The WebSocket.

type Ws = tungstenite::WebSocket<std::net::TcpStream>;

/// Opens `GET /v1/jobs/{id}/pty{query}` as a WebSocket with the server's token.
fn ws(s: &Server, id: &str, query: &str) -> Ws {
    use tungstenite::client::IntoClientRequest;
    let mut req = format!("ws://{}/v1/jobs/{id}/pty{query}", s.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "Authorization",
        format!("Bearer {}", s.token).parse().unwrap(),
    );
    let tcp = std::net::TcpStream::connect(&s.addr).unwrap();
    tcp.set_read_timeout(Some(PROMPT)).unwrap();
    let (ws, resp) = tungstenite::client::client(req, tcp).expect("the upgrade");
    assert_eq!(resp.status(), 101);
    ws
}

/// What a viewer saw: the output (binary frames, in order) and the exit frame.
#[derive(Default)]
struct Seen {
    out: Vec<u8>,
    frames: Vec<Vec<u8>>,
    exit: Option<Value>,
    close: Option<u16>,
}

/// Reads frames until `done` holds of what was seen (or the connection ends).
fn read_until(w: &mut Ws, seen: &mut Seen, what: &str, done: impl Fn(&Seen) -> bool) {
    let deadline = Instant::now() + PROMPT;
    while !done(seen) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: saw {:?}",
            String::from_utf8_lossy(&seen.out)
        );
        match w.read() {
            Ok(tungstenite::Message::Binary(b)) => {
                seen.out.extend_from_slice(&b);
                seen.frames.push(b.to_vec());
            }
            Ok(tungstenite::Message::Text(t)) => {
                assert!(seen.exit.is_none(), "a frame after the exit frame: {t}");
                seen.exit = Some(serde_json::from_str(t.as_str()).unwrap());
            }
            Ok(tungstenite::Message::Close(c)) => {
                seen.close = Some(c.map_or(1005, |c| u16::from(c.code)));
                return;
            }
            Ok(_) => {}
            Err(e) => panic!("{what}: {e}; saw {:?}", String::from_utf8_lossy(&seen.out)),
        }
    }
}

fn contains(h: &[u8], n: &str) -> bool {
    h.windows(n.len()).any(|w| w == n.as_bytes())
}

fn send(w: &mut Ws, b: &[u8]) {
    w.send(tungstenite::Message::Binary(b.to_vec().into()))
        .unwrap();
}

fn shell(c: &mut Client) -> String {
    c.start_id(json!({"command": "PS1='$ ' exec sh -i", "pty": {"cols": 80, "rows": 24}, "background": true}),
    )
}

#[test]
fn websocket_keystrokes_output_resize_and_exit() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let id = shell(&mut c);
    let mut w = ws(&s, &id, "");
    let mut seen = Seen::default();
    send(&mut w, b"echo hi-$((1+2))\n");
    read_until(&mut w, &mut seen, "the echo", |s| contains(&s.out, "hi-3"));
    w.send(tungstenite::Message::Text(
        json!({"type": "resize", "cols": 50, "rows": 20})
            .to_string()
            .into(),
    ))
    .unwrap();
    send(&mut w, b"stty size\n");
    read_until(&mut w, &mut seen, "the new size", |s| {
        contains(&s.out, "20 50")
    });
    // Keystroke echo, round trip: one byte out, its echo back.
    let mut rtt = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        send(&mut w, b"a");
        let before = seen.out.len();
        read_until(&mut w, &mut seen, "the echo of a key", |s| {
            s.out[before..].contains(&b'a')
        });
        rtt.push(t.elapsed());
    }
    rtt.sort();
    eprintln!(
        "keystroke echo over the WebSocket: median {:?}, p95 {:?}",
        rtt[rtt.len() / 2],
        rtt[rtt.len() * 95 / 100]
    );
    send(&mut w, b"\x15exit 3\n");
    read_until(&mut w, &mut seen, "the end", |s| s.close.is_some());
    let exit = seen.exit.expect("an exit frame");
    assert_eq!(
        exit,
        json!({"type": "exit", "status": "failed", "exitCode": 3, "signal": null})
    );
    assert_eq!(seen.close, Some(1000));
    // output.log has the terminal's output too.
    wait_output(&s, &id, "hi-3");
}

#[test]
fn websocket_refusals() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let plain = c.start_id(json!({"command": "sleep 30", "background": true}));
    let id = shell(&mut c);
    // Not an upgrade.
    let r = c.get(&format!("/v1/jobs/{id}/pty"));
    assert_eq!(r.status, 400, "{}", r.text());
    let up = [
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Version", "13"),
        ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ];
    let r = c.send("GET", &format!("/v1/jobs/{id}/pty?write=maybe"), &up, None);
    assert_eq!(r.status, 400, "{}", r.text());
    // Not a terminal job.
    let r = c.send("GET", &format!("/v1/jobs/{plain}/pty"), &up, None);
    assert_eq!(
        (r.status, r.code()),
        (409, "conflict".into()),
        "{}",
        r.text()
    );
    // No token.
    let r = s
        .anon()
        .send("GET", &format!("/v1/jobs/{id}/pty"), &up, None);
    assert_eq!(r.status, 401, "{}", r.text());
    // The handshake's answer (RFC 6455's own example key).
    let mut raw = Client::connect(&s.addr).token(&s.token).unchecked();
    raw.write_raw(
        format!(
            "GET /v1/jobs/{id}/pty HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\n\
             Upgrade: websocket\r\nConnection: keep-alive, Upgrade\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
            s.token
        )
        .as_bytes(),
    )
    .unwrap();
    let r = raw.read_response().unwrap();
    assert_eq!(r.status, 101);
    assert_eq!(
        r.header("sec-websocket-accept"),
        Some("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
    );
    drop(raw);
    // Ended.
    assert_eq!(write(&mut c, &id, b"exit\n", false).status, 200);
    final_record(&mut c, &id);
    let r = c.send("GET", &format!("/v1/jobs/{id}/pty"), &up, None);
    assert_eq!(
        (r.status, r.code()),
        (409, "conflict".into()),
        "{}",
        r.text()
    );
    c.post(&format!("/v1/jobs/{plain}/cancel"), &json!({}));
}

#[test]
fn a_session_survives_the_server_and_a_reattach_redraws() {
    let sb = std::sync::Arc::new(Sandbox::new());
    let mut s1 = Server::start_in(std::sync::Arc::clone(&sb), "127.0.0.1:0", &[]);
    let id = shell(&mut s1.client());
    let mut w = ws(&s1, &id, "");
    let mut seen = Seen::default();
    send(&mut w, b"echo before-$((6*7))\n");
    read_until(&mut w, &mut seen, "the echo", |s| {
        contains(&s.out, "before-42")
    });
    s1.kill9();
    let s2 = Server::start_in(std::sync::Arc::clone(&sb), "127.0.0.1:0", &[]);
    // A read-only viewer and a writing one; both get the replay first.
    let mut ro = ws(&s2, &id, "?write=false");
    let mut w = ws(&s2, &id, "");
    let mut seen_ro = Seen::default();
    let mut seen = Seen::default();
    read_until(&mut ro, &mut seen_ro, "the replay", |s| {
        contains(&s.out, "before-42")
    });
    read_until(&mut w, &mut seen, "the replay", |s| {
        contains(&s.out, "before-42")
    });
    send(&mut ro, b"exit 9\n");
    send(&mut w, b"echo after-$((2*3))\n");
    read_until(&mut w, &mut seen, "a live shell", |s| {
        contains(&s.out, "after-6")
    });
    read_until(&mut ro, &mut seen_ro, "the live output", |s| {
        contains(&s.out, "after-6")
    });
    assert!(
        !contains(&seen_ro.out, "exit 9"),
        "a read-only viewer typed"
    );
    send(&mut w, b"exit 4\n");
    read_until(&mut w, &mut seen, "the end", |s| s.close.is_some());
    read_until(&mut ro, &mut seen_ro, "the end", |s| s.close.is_some());
    for s in [&seen, &seen_ro] {
        assert_eq!(s.exit.as_ref().unwrap()["exitCode"], 4);
    }
}

#[test]
fn a_viewer_that_does_not_read_is_closed_and_the_job_runs_on() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let id = c.start_id(json!({"command": "read go; head -c 40000000 /dev/zero | tr '\\0' a; echo; sleep 1; echo done-marker",
               "pty": {"cols": 80, "rows": 24}, "background": true}),
    );
    let lazy = ws(&s, &id, "");
    lazy.get_ref()
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    // A small receive buffer, so the server feels the lazy client soon.
    assert_eq!(write(&mut c, &id, b"\n", false).status, 200);
    let v = final_record(&mut c, &id);
    assert_eq!(v["status"], "succeeded", "{v}");
    assert!(v["outputBytes"].as_u64().unwrap() >= 40_000_000, "{v}");
    assert!(v["output"].as_str().unwrap().contains("done-marker"), "{v}");
    // The lazy viewer was closed: what it can read ends without an exit frame.
    let mut lazy = lazy;
    lazy.get_ref().set_read_timeout(Some(PROMPT)).unwrap();
    let mut got = 0usize;
    let mut exit = false;
    loop {
        match lazy.read() {
            Ok(tungstenite::Message::Binary(b)) => got += b.len(),
            Ok(tungstenite::Message::Text(_)) => exit = true,
            Ok(tungstenite::Message::Close(c)) => {
                assert_eq!(c.map(|c| u16::from(c.code)), Some(1008));
                break;
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    assert!(!exit, "the lazy viewer got to the end");
    assert!(
        got < 40_000_000,
        "the lazy viewer got everything ({got} bytes)"
    );
}

#[test]
fn a_secret_split_across_writes_is_masked_in_every_frame_and_the_log() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let id = c.start_id(
        json!({"command": "read go; printf 'x-secr'; sleep 0.5; printf 'et-value-y\\n'; sleep 0.5",
               "secretEnv": {"S": "secret-value"}, "pty": {"cols": 80, "rows": 24},
               "background": true}),
    );
    let mut w = ws(&s, &id, "");
    send(&mut w, b"\n");
    let mut seen = Seen::default();
    read_until(&mut w, &mut seen, "the end", |s| s.close.is_some());
    assert!(seen.exit.is_some());
    for f in &seen.frames {
        assert!(
            !contains(f, "secret-value"),
            "{:?}",
            String::from_utf8_lossy(f)
        );
    }
    assert!(
        !contains(&seen.out, "secret-value"),
        "{:?}",
        String::from_utf8_lossy(&seen.out)
    );
    // On the wire each cell of the secret is one `*`, so a terminal's layout holds.
    assert!(
        contains(&seen.out, "x-************-y"),
        "{:?}",
        String::from_utf8_lossy(&seen.out)
    );
    let log = std::fs::read(output(&s, &id)).unwrap();
    assert!(
        !contains(&log, "secret-value") && contains(&log, "x-[redacted]-y"),
        "{:?}",
        String::from_utf8_lossy(&log)
    );
}

/// Opens the terminal WebSocket with these headers only (no token unless given).
fn ws_raw(
    addr: &str,
    path: &str,
    headers: &[(&'static str, &str)],
) -> Result<Ws, tungstenite::Error> {
    use tungstenite::client::IntoClientRequest;
    let mut req = format!("ws://{addr}{path}").into_client_request().unwrap();
    for (k, v) in headers {
        req.headers_mut().insert(*k, v.parse().unwrap());
    }
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(PROMPT)).unwrap();
    tungstenite::client::client(req, tcp)
        .map(|(w, _)| w)
        .map_err(|e| match e {
            tungstenite::HandshakeError::Failure(e) => e,
            tungstenite::HandshakeError::Interrupted(_) => panic!("interrupted"),
        })
}

fn refused_with(r: Result<Ws, tungstenite::Error>) -> u16 {
    match r {
        Err(tungstenite::Error::Http(resp)) => resp.status().as_u16(),
        Err(e) => panic!("{e}"),
        Ok(_) => 101,
    }
}

#[test]
fn tickets_open_a_terminal_once_and_only_from_allowed_origins() {
    let s = Server::start(&["--allowed-origin", "https://ok.example"]);
    let mut c = s.client();
    let id = shell(&mut c);
    let other = shell(&mut c);
    let ticket = |c: &mut Client, id: &str| {
        let r = c.post(&format!("/v1/jobs/{id}/pty/tickets"), &json!({}));
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let left = epoch_ms(text(&v, "expiresAt")).unwrap() - now_ms();
        assert!((50_000..=61_000).contains(&left), "{v}");
        text(&v, "ticket").to_string()
    };
    let path = format!("/v1/jobs/{id}/pty");
    // No origin (not a browser), then the same ticket again.
    let t = ticket(&mut c, &id);
    let mut w = ws_raw(&s.addr, &format!("{path}?ticket={t}"), &[]).expect("a ticket opens it");
    send(&mut w, b"echo via-ticket\n");
    let mut seen = Seen::default();
    read_until(&mut w, &mut seen, "the echo", |s| {
        contains(&s.out, "via-ticket")
    });
    assert_eq!(
        refused_with(ws_raw(&s.addr, &format!("{path}?ticket={t}"), &[])),
        401
    );
    // An allowed origin; one that is not; a ticket for another job; a made-up one.
    let t = ticket(&mut c, &id);
    let ok = ws_raw(
        &s.addr,
        &format!("{path}?ticket={t}"),
        &[("Origin", "https://ok.example")],
    );
    assert_eq!(refused_with(ok), 101);
    let t = ticket(&mut c, &id);
    let bad = ws_raw(
        &s.addr,
        &format!("{path}?ticket={t}"),
        &[("Origin", "https://evil.example")],
    );
    assert_eq!(refused_with(bad), 403);
    let t = ticket(&mut c, &other);
    assert_eq!(
        refused_with(ws_raw(&s.addr, &format!("{path}?ticket={t}"), &[])),
        401
    );
    let fake = "0".repeat(64);
    assert_eq!(
        refused_with(ws_raw(&s.addr, &format!("{path}?ticket={fake}"), &[])),
        401
    );
    // Without --allowed-origin, no browser page may use one.
    let s2 = Server::start(&[]);
    let mut c2 = s2.client();
    let id2 = shell(&mut c2);
    let t = ticket(&mut c2, &id2);
    let r = ws_raw(
        &s2.addr,
        &format!("/v1/jobs/{id2}/pty?ticket={t}"),
        &[("Origin", "http://localhost")],
    );
    assert_eq!(refused_with(r), 403);
    for id in [&id, &other] {
        c.post(&format!("/v1/jobs/{id}/cancel"), &json!({}));
    }
    c2.post(&format!("/v1/jobs/{id2}/cancel"), &json!({}));
}

#[test]
fn cli_attach_detach_and_exec_tty() {
    use std::io::Write;
    use std::process::Stdio;
    let s = Server::start(&[]);
    let mut c = s.client();
    let attach = |id: &str| {
        let mut cmd = s.sb.cmd(&["attach", id]);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        s.sb.spawn(cmd)
    };
    // Keys in, output out, the job's status as ours.
    let id = shell(&mut c);
    let mut child = attach(&id);
    let mut keys = child.stdin.take().unwrap();
    keys.write_all(b"echo from-$((40+2))\n").unwrap();
    wait_output(&s, &id, "from-42");
    keys.write_all(b"exit 5\n").unwrap();
    let out = s.sb.finish(child, PROMPT);
    assert_eq!(out.code, Some(5), "{out:?}");
    assert!(out.stdout.contains("from-42"), "{out:?}");
    // Ctrl-] d detaches; the job runs on, and a lone Ctrl-] is passed on.
    let id = shell(&mut c);
    let mut child = attach(&id);
    let mut keys = child.stdin.take().unwrap();
    keys.write_all(b"echo one\x1d\x1dd").unwrap();
    let out = s.sb.finish(child, PROMPT);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains("detached"), "{out:?}");
    assert_eq!(c.get(&format!("/v1/jobs/{id}")).json()["status"], "running");
    assert_eq!(write(&mut c, &id, b"\nexit\n", false).status, 200);
    final_record(&mut c, &id);
    // exec --tty: a terminal job, attached (the size defaults to 80x24 off a terminal).
    let out =
        s.sb.run(&["exec", "--tty", "--", "sleep 0.5; stty size; exit 2"]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stdout.contains("24 80"), "{out:?}");
    let out =
        s.sb.run(&["exec", "--tty", "--", "tty >/dev/null && echo on-a-tty"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("on-a-tty"), "{out:?}");
}

#[test]
fn a_terminal_job_of_another_user_owns_its_terminal() {
    if !nix::unistd::geteuid().is_root()
        || nix::unistd::User::from_name("nobody")
            .ok()
            .flatten()
            .is_none()
    {
        skip_root("needs root and the user nobody");
        return;
    }
    let sb = Sandbox::new();
    let out = sb.run(&[
        "exec",
        "--tty",
        "--job-user",
        "nobody",
        "--cwd",
        "/",
        "--",
        "stat -c %U $(tty); stty size; id -u; exit 4",
    ]);
    assert_eq!(out.code, Some(4), "{out:?}");
    // The device node stays the agent's (0600): no other job may open it; the job works
    // its terminal through what it inherited (see tests/isolation.rs).
    assert!(
        out.stdout.starts_with("root\r\n")
            && out.stdout.contains("24 80")
            && out.stdout.contains("65534"),
        "{out:?}"
    );
}

#[test]
fn with_secrets_configured_a_prompt_shows_at_once_and_a_coloured_secret_stays_masked() {
    let s = Server::start(&[]);
    let mut c = s.client();
    // A prompt without a newline after output, then a secret that grep-style colouring and
    // a cursor move back draw whole on the screen.
    let id = c.start_id(json!({"command": "printf 'ready> '; read x; echo \"hi $x\"; printf 'key=sk-\\033[01;31m\\033[Klive-4f9a\\033[m\\033[K2b7c\\r\\n'; printf 'xxxxxve-4f9a2b7c\\rsk-li\\r\\n'; printf 'next> '; read y",
               "secretEnv": {"S": "sk-live-4f9a2b7c"}, "pty": {"cols": 80, "rows": 24},
               "background": true}),
    );
    let mut w = ws(&s, &id, "");
    let mut seen = Seen::default();
    // Nothing more is written until the prompt is answered: it must arrive on its own.
    read_until(&mut w, &mut seen, "the first prompt", |s| {
        contains(&s.out, "ready> ")
    });
    send(&mut w, b"a\n");
    read_until(&mut w, &mut seen, "the second prompt", |s| {
        contains(&s.out, "next> ")
    });
    assert!(contains(&seen.out, "hi a"));
    for f in &seen.frames {
        assert!(
            !contains(f, "sk-live-4f9a2b7c"),
            "{:?}",
            String::from_utf8_lossy(f)
        );
    }
    send(&mut w, b"b\n");
    read_until(&mut w, &mut seen, "the end", |s| s.close.is_some());
    // Drawn, neither line shows the secret: the coloured one is masked cell by cell, and
    // the one completed by going back over it is repainted.
    let out = String::from_utf8_lossy(&seen.out);
    assert!(
        out.contains("key=***\x1b[01;31m\x1b[K*********\x1b[m\x1b[K****"),
        "{out:?}"
    );
    // The last character completing it is masked, and the cells shown a moment before are
    // repainted (relative moves there and back).
    assert!(out.contains("sk-l*"), "{out:?}");
    assert!(out.contains("****\x1b[1C***********"), "{out:?}");
    let log = std::fs::read(output(&s, &id)).unwrap();
    assert!(
        !contains(&log, "sk-live"),
        "{:?}",
        String::from_utf8_lossy(&log)
    );
}

#[test]
fn a_viewer_that_comes_later_gets_a_masked_replay() {
    let s = Server::start(&[]);
    let mut c = s.client();
    // Printed while nobody watches: the replay is masked when a viewer comes.
    let id = c.start_id(
        json!({"command": "printf 'key=sk-\\033[01;31mlive-4f9a\\033[m2b7c and xxxxxve-4f9a2b7c\\rsk-li\\r\\n'; echo ready; read x",
               "secretEnv": {"S": "sk-live-4f9a2b7c"}, "pty": {"cols": 80, "rows": 24},
               "background": true}),
    );
    // The supervisor has read the secrets' lines (one write) once some of it is stored.
    eventually(PROMPT, "the job to have printed", || {
        let v = c.get(&format!("/v1/jobs/{id}")).json();
        (v["outputBytes"].as_u64().unwrap_or(0) > 0).then_some(())
    });
    let mut w = ws(&s, &id, "");
    let mut seen = Seen::default();
    read_until(&mut w, &mut seen, "the replay", |s| {
        contains(&s.out, "ready")
    });
    let out = String::from_utf8_lossy(&seen.out).into_owned();
    assert!(!out.contains("sk-live-4f9a2b7c"), "{out:?}");
    assert!(
        out.contains("key=***\u{1b}[01;31m*********\u{1b}[m****"),
        "{out:?}"
    );
    send(&mut w, b"\n");
    read_until(&mut w, &mut seen, "the end", |s| s.close.is_some());
}
