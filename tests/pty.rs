//! Interactive jobs: stdin written later through the job's supervisor, terminal jobs, their
//! size, and every refusal of the routes.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::util::*;

fn start(c: &mut Client, body: Value) -> String {
    let r = c.post("/v1/jobs", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    text(&r.json(), "id").to_string()
}

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
    let id = start(
        &mut c,
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
    let plain = start(&mut c, json!({"command": "sleep 30", "background": true}));
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
    let id = start(
        &mut c,
        json!({"command": "sleep 30", "interactive": true, "background": true}),
    );
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
    let id = start(
        &mut c,
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
    c.post(&format!("/v1/jobs/{id}/cancel"), &json!({}));
}

#[test]
fn terminal_size_resize_term_and_exit_status() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let id = start(
        &mut c,
        json!({"command": "stty size; echo \"term=$TERM\"; read a; stty size; echo \"got=$a\"; read b; exit 3",
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
    let id = start(
        &mut c,
        json!({"command": "echo ready; sleep 30; echo after",
               "pty": {"cols": 80, "rows": 24}, "background": true}),
    );
    wait_output(&s, &id, "ready");
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
