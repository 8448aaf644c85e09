//! The API refuses what it would otherwise misread: unknown body fields and query
//! parameters are 400 `invalid`, naming the closest known one, and nothing happens. Over a
//! real `serve` on loopback, with raw requests as curl would send them.

use crate::util::*;

/// Sends one request with a raw JSON body (when given).
fn send(c: &mut Client, method: &str, target: &str, body: Option<&str>) -> Resp {
    c.send(method, target, &[], body.map(str::as_bytes))
}

/// Expects 400 `invalid` with exactly this message.
fn refused(c: &mut Client, method: &str, target: &str, body: Option<&str>, message: &str) {
    let r = send(c, method, target, body);
    assert_eq!(r.status, 400, "{method} {target}: {}", r.text());
    let v = r.json();
    assert_eq!(v["error"]["code"], "invalid", "{v}");
    assert_eq!(v["error"]["message"], message, "{method} {target}");
}

#[test]
fn unknown_fields_and_parameters_are_refused_and_nothing_happens() {
    let s = Server::start(&[]);
    let mut c = s.client();
    refused(
        &mut c,
        "POST",
        "/v1/jobs",
        Some(r#"{"command": "sleep 1", "timeout": 5}"#),
        "unknown field `timeout`; did you mean `timeoutSeconds`?",
    );
    refused(
        &mut c,
        "POST",
        "/v1/jobs",
        Some(r#"{"comand": "ls"}"#),
        "unknown field `comand`; did you mean `command`? (command is missing)",
    );
    let r = c.get("/v1/jobs");
    assert_eq!(
        (r.status, &r.json()["jobs"]),
        (200, &json!([])),
        "{}",
        r.text()
    );
    assert!(
        s.sb.job_ids().is_empty(),
        "a refused start made a job folder"
    );

    refused(
        &mut c,
        "POST",
        "/v1/env",
        Some(r#"{"sett": {"A": "1"}}"#),
        "unknown field `sett`; did you mean `set`?",
    );
    let r = c.get("/v1/env");
    assert_eq!(r.json()["names"], json!([]), "{}", r.text());

    // The query is checked before the job is looked up: even an unknown job's route says
    // what is wrong with the query.
    let job = "/v1/jobs/job_00000000000000000000";
    refused(
        &mut c,
        "GET",
        &format!("{job}/output?ofset=10"),
        None,
        "unknown query parameter `ofset`; did you mean `offset`?",
    );
    refused(
        &mut c,
        "GET",
        "/v1/jobs?stauts=running",
        None,
        "unknown query parameter `stauts`; did you mean `status`?",
    );
    refused(
        &mut c,
        "GET",
        "/v1/sandbox?verbose=1",
        None,
        "unknown query parameter `verbose`: this route takes none",
    );
    refused(
        &mut c,
        "POST",
        &format!("{job}/cancel"),
        Some(r#"{"force": true}"#),
        "unknown field `force`: this request's body takes none",
    );
    // What the routes do read still works.
    let r = send(&mut c, "GET", "/v1/jobs?status=running&limit=5", None);
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(
        &mut c,
        "GET",
        &format!("{job}/output?offset=0&limit=1"),
        None,
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (404, "not_found"),
        "{}",
        r.text()
    );
}
