//! `docs/openapi.json` against the server: the routes it lists are the routes served, and
//! live answers have exactly the fields their schemas document. (Every JSON answer any test
//! gets through [`Client::send`] is checked as well; the test here makes sure each route and
//! its usual answers are seen at least once.)

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::util::schema::{self, named};
use crate::util::*;

#[test]
fn openapi_lists_exactly_the_served_routes() {
    let spec = schema::spec();
    assert!(spec["openapi"].as_str().unwrap().starts_with("3.1"));
    let mut documented = BTreeSet::new();
    for (path, ops) in spec["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            if ["get", "post", "put", "delete", "patch", "head", "options"]
                .contains(&method.as_str())
            {
                documented.insert((method.to_uppercase(), path.clone()));
                assert!(
                    op["responses"].as_object().is_some_and(|r| !r.is_empty()),
                    "{method} {path}"
                );
            }
        }
    }
    let served: BTreeSet<(String, String)> = gitterm_agent::api::ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(documented, served);
    // And every served route answers as a route (not 404, not a wrong-method answer with
    // `Allow`) on a live server.
    let s = Server::start(&[]);
    let mut c = s.client();
    for (m, p) in &served {
        let path = p.replace("{id}", "job_00000000000000000000");
        let r = c.send(m, &path, &[], (m == "POST").then_some(&b"{}"[..]));
        assert!(r.header("allow").is_none(), "{m} {p}: {}", r.text());
        if r.status == 404 {
            assert!(
                r.text().contains("no job")
                    || r.text().contains("no preview grant")
                    || r.text().contains("no session")
                    || r.text().contains("no such file watch"),
                "{m} {p} is not routed: {}",
                r.text()
            );
        }
    }
}

/// Asserts that `r` was checked against the documented answer `what`, and returns it.
fn seen(r: Resp, what: &str) -> Resp {
    assert_eq!(
        r.checked.as_deref(),
        Some(what),
        "{} {}",
        r.status,
        r.text()
    );
    r
}

#[test]
fn live_answers_have_exactly_the_documented_fields() {
    let sb = Arc::new(Sandbox::new());
    let scoped = sb.dir().join("scoped.token");
    write_mode(&scoped, "scoped-token-0123456789abcdef\n", 0o600);
    let s = Server::start_in(
        Arc::clone(&sb),
        "127.0.0.1:0",
        &[
            "--scoped-token-file",
            scoped.to_str().unwrap(),
            "--max-running",
            "2",
            "--max-body",
            "4096",
        ],
    );
    let mut c = s.client();
    let mut anon = s.anon();
    seen(anon.get("/v1/health"), "GET /v1/health 200");
    seen(anon.get("/v1/jobs"), "GET /v1/jobs 401");

    // Env.
    seen(
        c.post("/v1/env", &json!({"set": {"DOC_A": "1"}})),
        "POST /v1/env 200",
    );
    seen(c.get("/v1/env"), "GET /v1/env 200");
    seen(
        c.post("/v1/env", &json!({"set": {"1BAD": "x"}})),
        "POST /v1/env 400",
    );

    // Jobs of every kind: failed (with an idempotency key and an idle timeout), timed out,
    // cut by its output cap... and running.
    let failed = seen(
        c.send(
            "POST",
            "/v1/jobs",
            &[("Idempotency-Key", "doc-1")],
            Some(br#"{"command":"echo hi; exit 3","idleTimeoutSeconds":30,"waitSeconds":30}"#),
        ),
        "POST /v1/jobs 200",
    )
    .json();
    assert_eq!(failed["idempotencyKey"], "doc-1");
    let timed_out = seen(
        c.post(
            "/v1/jobs",
            &json!({"command": "sleep 5", "timeoutSeconds": 0.5, "waitSeconds": 30}),
        ),
        "POST /v1/jobs 200",
    )
    .json();
    assert!(timed_out["reason"].is_string(), "{timed_out}");
    let running = seen(
        c.post(
            "/v1/jobs",
            &json!({"command": "echo started; sleep 30", "background": true}),
        ),
        "POST /v1/jobs 200",
    )
    .json();
    let id = text(&running, "id").to_string();
    let other = seen(
        c.post(
            "/v1/jobs",
            &json!({"command": "sleep 30", "background": true}),
        ),
        "POST /v1/jobs 200",
    )
    .json();
    seen(
        c.post("/v1/jobs", &json!({"command": "true"})),
        "POST /v1/jobs 429",
    );
    seen(
        c.post("/v1/jobs", &json!({"command": ""})),
        "POST /v1/jobs 400",
    );
    let bad = s.home.join("jobs").join("job_0123456789abcdef0123");
    std::fs::create_dir(&bad).unwrap();
    std::fs::write(bad.join("job.json"), b"{broken").unwrap();

    // Reading them.
    let list = seen(c.get("/v1/jobs"), "GET /v1/jobs 200").json();
    assert_eq!(list["jobs"].as_array().unwrap().len(), 5, "{list}");
    seen(c.get(&format!("/v1/jobs/{id}")), "GET /v1/jobs/{id} 200");
    seen(
        c.get("/v1/jobs/job_00000000000000000000"),
        "GET /v1/jobs/{id} 404",
    );
    seen(
        c.get("/v1/jobs/job_0123456789abcdef0123"),
        "GET /v1/jobs/{id} 500",
    );
    let page = seen(
        c.get(&format!("/v1/jobs/{id}/output?waitSeconds=30")),
        "GET /v1/jobs/{id}/output 200",
    )
    .json();
    assert_eq!(page["data"], "started\n");
    seen(
        c.get(&format!("/v1/jobs/{id}/output?offset=-1")),
        "GET /v1/jobs/{id}/output 400",
    );
    seen(c.get("/v1/sandbox"), "GET /v1/sandbox 200");
    seen(c.get("/v1/ports"), "GET /v1/ports 200");

    // Cancelling: refused to the scoped token, then done.
    let mut sc = Client::connect(&s.addr).token("scoped-token-0123456789abcdef");
    seen(
        sc.post(&format!("/v1/jobs/{id}/cancel"), &json!({})),
        "POST /v1/jobs/{id}/cancel 403",
    );
    for job in [&id, text(&other, "id")] {
        seen(
            c.post(&format!("/v1/jobs/{job}/cancel"), &json!({})),
            "POST /v1/jobs/{id}/cancel 200",
        );
    }
    seen(
        c.post("/v1/jobs/job_00000000000000000000/cancel", &json!({})),
        "POST /v1/jobs/{id}/cancel 404",
    );

    // Previews: ready, a server job that died, nothing in time, bad input.
    let port: u16 = s.addr.rsplit(':').next().unwrap().parse().unwrap();
    seen(
        c.post("/v1/previews", &json!({"port": port, "waitSeconds": 5})),
        "POST /v1/previews 200",
    );
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    seen(
        c.post(
            "/v1/previews",
            &json!({"port": free, "command": "exit 4", "waitSeconds": 30}),
        ),
        "POST /v1/previews 409",
    );
    seen(
        c.post("/v1/previews", &json!({"port": free, "waitSeconds": 0.2})),
        "POST /v1/previews 504",
    );
    seen(
        c.post("/v1/previews", &json!({"port": 0})),
        "POST /v1/previews 400",
    );

    // Errors outside any documented operation.
    seen(c.get("/v1/nothing-here"), "Error");
    seen(c.send("DELETE", "/v1/jobs", &[], None), "Error");
    // A body over --max-body, refused from its Content-Length (read raw: the server closes
    // the connection without reading the body).
    let mut raw = s.client();
    raw.write_raw(
        format!(
            "POST /v1/jobs HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\nContent-Length: 5000\r\n\r\n",
            s.token
        )
        .as_bytes(),
    )
    .unwrap();
    let r = raw.read_response().unwrap();
    assert_eq!(
        schema::check_answer("POST", "/v1/jobs", &r),
        Ok(Some("POST /v1/jobs 413".to_string()))
    );
}

/// A job as the server shows it, with every field it may have.
fn job_view() -> Value {
    json!({
        "formatVersion": 1, "id": "job_0123456789abcdef0123", "command": "true", "cwd": "/",
        "status": "succeeded", "exitCode": 0, "signal": null,
        "createdAt": "2026-11-30T21:57:19.123Z", "startedAt": "2026-11-30T21:57:19.124Z",
        "endedAt": "2026-11-30T21:57:19.200Z", "timeoutSeconds": 3600.0,
        "idleTimeoutSeconds": null, "pid": 10, "pgid": 10, "outputBytes": 0,
        "reason": "why", "outputTruncated": false, "outputDroppedBytes": 0,
        "supervisorPid": 9, "supervisorStart": 123, "bootId": "b", "idempotencyKey": "k",
        "cgroup": "/sys/fs/cgroup/gitterm/job_0123456789abcdef0123", "graceSeconds": 5.0,
        "output": "", "isError": false, "pending": "",
    })
}

/// The errors of checking `v` against schema `name`, joined.
fn errors(name: &str, v: &Value) -> String {
    schema::check(named(name), v).join("\n")
}

#[test]
fn the_schema_check_finds_missing_undocumented_and_mistyped_fields() {
    let job = job_view();
    assert_eq!(errors("JobView", &job), "");
    // At the top.
    let mut j = job.clone();
    j.as_object_mut().unwrap().remove("pgid");
    assert!(errors("JobView", &j).contains(r#"$: the required field "pgid" is missing"#));
    let mut j = job.clone();
    j["isError"] = Value::Null;
    assert!(errors("JobView", &j).contains("$.isError: a null where the schema says boolean"));
    let mut j = job.clone();
    j["status"] = json!("paused");
    assert!(errors("JobView", &j).contains("$.status: \"paused\" is not one of"));
    let mut j = job.clone();
    j["bogus"] = json!(1);
    assert_eq!(errors("JobView", &j), "$.bogus: not in the schema");
    // In array items (through a oneOf) and in nested objects.
    let mut j = job.clone();
    j.as_object_mut().unwrap().remove("output");
    j.as_object_mut().unwrap().remove("isError");
    j.as_object_mut().unwrap().remove("pending");
    let list =
        json!({"jobs": [j.clone(), {"id": "job_x", "corrupt": true, "error": "e"}], "next": null});
    assert_eq!(errors("JobList", &list), "");
    j["extra"] = json!({"deep": true});
    let list = json!({"jobs": [{"id": "job_x", "corrupt": true, "error": "e"}, j], "next": null});
    let e = errors("JobList", &list);
    assert!(e.contains("$.jobs[1]: fits 0 of the 2 alternatives"), "{e}");
    assert!(e.contains("$.jobs[1].extra: not in the schema"), "{e}");
    let ports = json!({"ports": [{"port": 1, "pid": null, "jobId": null}]});
    assert!(errors("Ports", &ports).contains(r#"$.ports[0]: the required field "address""#));
    let sandbox = json!({
        "version": "0", "bootId": "b", "previousBootId": null, "resumed": false,
        "agentStartedAt": "2026-11-30T21:57:19.123Z", "envNames": ["A", 1],
        "jobs": {"running": 1, "paused": 2},
    });
    let e = errors("Sandbox", &sandbox);
    assert!(
        e.contains("$.envNames[1]: a number where the schema says string"),
        "{e}"
    );
    assert!(e.contains("$.jobs.paused: not in the schema"), "{e}");
    // An error answer: the Error schema names only code and message.
    let err = json!({"error": {"code": "invalid", "message": "m", "field": "x"}});
    assert_eq!(errors("Error", &err), "$.error.field: not in the schema");
}
