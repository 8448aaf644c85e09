//! The events journal, `GET /v1/events` (long-poll and Server-Sent Events), the `events`
//! command and `GET /v1/metrics`, over a real server and real jobs.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::util::*;

/// Every event after `after` (all pages), and the last `next`.
fn drain(c: &mut Client, after: &str) -> (Vec<Value>, String) {
    let mut all = Vec::new();
    let mut at = after.to_string();
    loop {
        let r = c.get(&format!("/v1/events?after={at}&limit=1000"));
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let evs = v["events"].as_array().unwrap().clone();
        at = v["next"].as_str().unwrap().to_string();
        if evs.is_empty() {
            return (all, at);
        }
        all.extend(evs);
    }
}

fn start_bg(c: &mut Client, cmd: &str, timeout: f64) -> String {
    c.start_id(json!({"command": cmd, "background": true, "timeoutSeconds": timeout}))
}

/// Each job's events: one `job.started`, then one end, equal to its final record.
fn check_each_once(c: &mut Client, events: &[Value], ids: &[String]) {
    let mut by: HashMap<&str, Vec<&Value>> = HashMap::new();
    for e in events {
        by.entry(e["jobId"].as_str().unwrap()).or_default().push(e);
    }
    for id in ids {
        let evs = by
            .get(id.as_str())
            .unwrap_or_else(|| panic!("no events of {id}"));
        assert_eq!(evs.len(), 2, "{id}: {evs:?}");
        assert_eq!(evs[0]["type"], "job.started", "{id}");
        assert_eq!(evs[0]["status"], "running", "{id}");
        assert!(matches!(
            evs[1]["type"].as_str(),
            Some("job.ended" | "job.lost")
        ));
        let rec = c.get(&format!("/v1/jobs/{id}")).json();
        for f in ["status", "exitCode", "signal"] {
            assert_eq!(evs[1][f], rec[f], "{id} {f}");
        }
        assert_eq!(evs[1]["at"], rec["endedAt"], "{id}");
    }
}

#[test]
fn every_job_is_told_once_in_order_across_a_killed_server() {
    let sb = Arc::new(Sandbox::new());
    let mut s = Server::start_in(Arc::clone(&sb), "127.0.0.1:0", &["--max-running", "300"]);
    let mut c = s.client();
    let (_, start) = drain(&mut c, "");
    let kinds = [
        ("true", 30.0),
        ("exit 3", 30.0),
        ("echo out; false", 30.0),
        ("kill -9 $$", 30.0),
        ("sleep 30", 0.5),
    ];
    let mut ids = Vec::new();
    for i in 0..150 {
        let (cmd, t) = kinds[i % kinds.len()];
        ids.push(start_bg(&mut c, cmd, t));
    }
    // A long-poll taken now wakes at the next event.
    let (first, mid) = drain(&mut c, &start);
    assert!(!first.is_empty());
    s.kill9();
    // Meanwhile the CLI starts jobs.
    for i in 0..50 {
        let (cmd, _) = kinds[i % 4];
        let (out, v) = sb.exec_json(&["--", cmd]);
        assert!(out.code.is_some(), "{out:?}");
        ids.push(v["id"].as_str().unwrap().to_string());
    }
    let s = Server::start_in(Arc::clone(&sb), "127.0.0.1:0", &["--max-running", "300"]);
    let mut c = s.client();
    for id in &ids {
        let r = c.get(&format!("/v1/jobs/{id}?waitSeconds=30"));
        assert_ne!(r.json()["status"], "running", "{id}");
    }
    let (rest, _) = drain(&mut c, &mid);
    let mut all = first.clone();
    all.extend(rest);
    // No gap, no repeat: cursors strictly increase, and the pieces equal one whole read.
    let (whole, _) = drain(&mut c, &start);
    assert_eq!(all, whole);
    let cursors: Vec<&str> = all.iter().map(|e| e["cursor"].as_str().unwrap()).collect();
    let mut sorted = cursors.clone();
    sorted.dedup();
    assert_eq!(sorted.len(), cursors.len());
    check_each_once(&mut c, &all, &ids);
    // The CLI reads the same journal without the server.
    let out = sb.run(&["events", "--json"]);
    let lines: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines, whole);
}

#[test]
fn fifty_parallel_appenders_leave_no_torn_line() {
    let sb = Sandbox::new();
    let kids: Vec<_> = (0..50)
        .map(|_| {
            let mut c = sb.cmd(&["exec", "--json", "--", "true"]);
            c.stdout(Stdio::piped()).stderr(Stdio::piped());
            sb.spawn(c)
        })
        .collect();
    for k in kids {
        let out = sb.finish(k, Duration::from_secs(60));
        assert_eq!(out.code, Some(0), "{out:?}");
    }
    let dir = sb.home().join("events");
    let mut lines = 0;
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "log") {
            let text = std::fs::read_to_string(e.path()).unwrap();
            assert!(text.ends_with('\n'));
            for l in text.lines() {
                let v: Value = serde_json::from_str(l).unwrap_or_else(|_| panic!("torn: {l}"));
                assert!(v["jobId"].is_string());
                lines += 1;
            }
        }
    }
    assert_eq!(lines, 100);
}

#[test]
fn old_or_other_boot_cursors_are_gone_and_a_listing_recovers() {
    let sb = Arc::new(Sandbox::new());
    let boot = sb.dir().join("boot_id");
    std::fs::write(&boot, "aaaaaaaa-1111\n").unwrap();
    let serve = |flags: &[&str]| {
        let mut all = vec!["--keep-events", "5"];
        all.extend_from_slice(flags);
        Server::start_in_env(
            Arc::clone(&sb),
            &all,
            &[
                ("GITTERM_BOOT_ID_FILE", boot.to_str().unwrap()),
                ("GITTERM_EVENTS_SEGMENT_BYTES", "400"),
            ],
        )
    };
    let mut s = serve(&[]);
    let mut c = s.client();
    let (_, zero) = drain(&mut c, "");
    for _ in 0..10 {
        let id = start_bg(&mut c, "true", 30.0);
        c.get(&format!("/v1/jobs/{id}?waitSeconds=30"));
    }
    // A job's end is appended just after its final record, which the wait above saw.
    let (evs, end) = eventually(PROMPT, "all 20 events", || {
        let (evs, end) = drain(&mut c, &zero);
        (evs.len() >= 20).then_some((evs, end))
    });
    assert_eq!(evs.len(), 20);
    s.kill9();
    // Compaction at the start removes old segments: the oldest cursor is gone.
    let mut s = serve(&[]);
    let mut c = s.client();
    // (the start's housekeeping compacts soon after the server answers)
    let r = eventually(Duration::from_secs(20), "compaction", || {
        let r = c.get(&format!("/v1/events?after={zero}"));
        (r.status != 200).then_some(r)
    });
    assert_eq!(r.status, 410, "{}", r.text());
    assert_eq!(r.code(), "gone");
    assert_eq!(drain(&mut c, &end).0, Vec::<Value>::new());
    s.kill9();
    // Another boot: every cursor of the last one is gone; list, then watch.
    std::fs::write(&boot, "bbbbbbbb-2222\n").unwrap();
    let s = serve(&[]);
    let mut c = s.client();
    let r = c.get(&format!("/v1/events?after={end}"));
    assert_eq!(r.status, 410, "{}", r.text());
    let list = c.get("/v1/jobs").json();
    let cursor = list["eventsCursor"].as_str().unwrap().to_string();
    let id = start_bg(&mut c, "true", 30.0);
    let r = c.get(&format!("/v1/events?after={cursor}&waitSeconds=30"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["events"][0]["jobId"], id.as_str());
}

/// An SSE client: `curl -N`, its lines as they come.
fn curl_sse(
    s: &Server,
    extra: &[&str],
) -> (
    std::process::Child,
    std::sync::mpsc::Receiver<(Instant, String)>,
) {
    let url = format!("http://{}/v1/events", s.addr);
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-sN", "-H", "Accept: text/event-stream"])
        .arg("-H")
        .arg(format!("Authorization: Bearer {}", s.token))
        .args(extra)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = s.sb.spawn(cmd);
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines() {
            let Ok(l) = l else { break };
            if tx.send((Instant::now(), l)).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

fn next_id(rx: &std::sync::mpsc::Receiver<(Instant, String)>) -> (Instant, String) {
    loop {
        let (t, l) = rx.recv_timeout(Duration::from_secs(10)).expect("an event");
        if let Some(id) = l.strip_prefix("id: ") {
            return (t, id.to_string());
        }
    }
}

#[test]
fn server_sent_events_arrive_at_once_resume_and_a_stalled_reader_delays_nobody() {
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        skip("no curl");
        return;
    }
    let s = Server::start(&[]);
    let mut c = s.client();
    // A client that never reads: its socket fills, it delays nobody.
    let mut stalled = Client::connect(&s.addr);
    stalled
        .write_raw(
            format!(
                "GET /v1/events HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\nAccept: text/event-stream\r\n\r\n",
                s.token
            )
            .as_bytes(),
        )
        .unwrap();
    let (mut curl, rx) = curl_sse(&s, &[]);
    let mut lags = Vec::new();
    let mut last = String::new();
    for _ in 0..20 {
        let t0 = Instant::now();
        // An echo job: its end reaches the client within 100 ms of its record.
        let r = c.post(
            "/v1/jobs",
            &json!({"command": "head -c 200000 /dev/zero", "timeoutSeconds": 30}),
        );
        assert_eq!(r.status, 200);
        let ended = r.json()["endedAt"].as_str().unwrap().to_string();
        let (_, a) = next_id(&rx);
        let (t, b) = next_id(&rx);
        let _ = (t0, a);
        let end_ms = epoch_ms(&ended).unwrap();
        let lag =
            Duration::from_millis((now_ms() - end_ms).max(0) as u64).saturating_sub(t.elapsed());
        lags.push(lag);
        last = b;
        assert_eq!(c.get("/v1/health").status, 200);
    }
    // Most within 100 ms of the job's end; a noisy shared machine may delay a few.
    lags.sort();
    assert!(
        lags[lags.len() / 2] < Duration::from_millis(100),
        "latencies {lags:?}"
    );
    assert!(
        lags[lags.len() - 1] < Duration::from_secs(1),
        "latencies {lags:?}"
    );
    let _ = curl.kill();
    let _ = curl.wait();
    // Resume: Last-Event-ID gives what came after, and only that.
    let id = {
        let r = c.post("/v1/jobs", &json!({"command": "true"}));
        r.json()["id"].as_str().unwrap().to_string()
    };
    let (mut curl, rx) = curl_sse(&s, &["-H", &format!("Last-Event-ID: {last}")]);
    let mut got = Vec::new();
    while got.len() < 2 {
        let (_, l) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("resumed events");
        if let Some(d) = l.strip_prefix("data: ") {
            got.push(serde_json::from_str::<Value>(d).unwrap());
        }
    }
    assert!(got.iter().all(|e| e["jobId"] == id.as_str()), "{got:?}");
    let _ = curl.kill();
    let _ = curl.wait();
    drop(stalled);
}

#[test]
fn metrics_parse_and_count_what_ran() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let scrape = |c: &mut Client| {
        let r = c.get("/v1/metrics");
        assert_eq!(r.status, 200);
        assert!(
            r.header("content-type")
                .unwrap()
                .starts_with("text/plain; version=0.0.4")
        );
        r.text()
    };
    let value = |text: &str, series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    };
    let before = scrape(&mut c);
    for cmd in ["true", "echo \"$S and $S\"", "exit 2"] {
        c.post(
            "/v1/jobs",
            &json!({"command": cmd, "secretEnv": {"S": "metric-secret-4711"}}),
        );
    }
    let after = eventually(Duration::from_secs(10), "the counters", || {
        let t = scrape(&mut c);
        (value(&t, "gitterm_jobs_ended_total{status=\"failed\"}") >= 1.0).then_some(t)
    });
    let d = |series: &str| value(&after, series) - value(&before, series);
    assert_eq!(d("gitterm_jobs_started_total"), 3.0);
    assert_eq!(d("gitterm_jobs_ended_total{status=\"succeeded\"}"), 2.0);
    assert_eq!(d("gitterm_jobs_ended_total{status=\"failed\"}"), 1.0);
    // "[redacted] and [redacted]": two occurrences, apart.
    assert_eq!(d("gitterm_redactions_total"), 2.0);
    assert_eq!(
        d("gitterm_http_requests_total{route=\"/v1/jobs\",code=\"200\"}"),
        3.0
    );
    assert!(value(&after, "process_resident_memory_bytes") > 0.0);
    assert!(value(&after, "process_open_fds") > 0.0);
    // The reference parser, where it can be installed.
    let venv = s.dir().join("venv");
    let ok = std::process::Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .is_ok_and(|st| st.success())
        && std::process::Command::new(venv.join("bin/pip"))
            .args(["install", "-q", "prometheus-client"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|st| st.success());
    if !ok {
        skip("the parser check: prometheus-client is unavailable");
        return;
    }
    let file = s.dir().join("scrape.txt");
    std::fs::write(&file, &after).unwrap();
    let out = std::process::Command::new(venv.join("bin/python"))
        .args([
            "-c",
            "import sys\nfrom prometheus_client.parser import text_string_to_metric_families as f\n\
             fams = list(f(open(sys.argv[1]).read()))\n\
             names = {x.name: x.type for x in fams}\n\
             assert names['gitterm_jobs_started'] == 'counter', names\n\
             assert names['gitterm_http_request_duration_seconds'] == 'histogram', names\n\
             assert names['process_open_fds'] == 'gauge', names\n\
             print(len(fams))",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
