//! The HTTP endpoint over real sockets: a real `gitterm-agent serve`, real jobs, a raw client.
//! Timing is asserted only within generous deadlines (the machine is shared and noisy), or
//! where a test explains why a correct server cannot miss its bound.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::util::*;

fn id_of(v: &Value) -> String {
    v["id"].as_str().expect("an id").to_string()
}

#[test]
fn health_needs_no_token_and_reveals_nothing_else() {
    let s = Server::start(&[]);
    let r = s.anon().get("/v1/health");
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["ok"], true);
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v.as_object().unwrap().len(), 2, "{v}");
    assert_eq!(r.header("content-type"), Some("application/json"));
    // The generated token: 64 hex characters, 0600, and reused by a later start.
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(s.home.join("agent.token")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(s.token.len(), 64);
    assert!(s.token.bytes().all(|b| b.is_ascii_hexdigit()));
}

#[test]
fn auth_is_strict() {
    let s = Server::start(&[]);
    let tok = s.token.clone();
    let bearer = |t: &str| vec![format!("Bearer {t}")];
    let cases: Vec<(&str, Vec<String>, String)> = vec![
        ("no header", vec![], "/v1/jobs".into()),
        ("wrong token", bearer(&"0".repeat(64)), "/v1/jobs".into()),
        ("prefix only", bearer(&tok[..32]), "/v1/jobs".into()),
        (
            "token plus more",
            bearer(&format!("{tok}0")),
            "/v1/jobs".into(),
        ),
        (
            "lowercase scheme",
            vec![format!("bearer {tok}")],
            "/v1/jobs".into(),
        ),
        (
            "uppercase scheme",
            vec![format!("BEARER {tok}")],
            "/v1/jobs".into(),
        ),
        (
            "uppercase token",
            bearer(&tok.to_uppercase()),
            "/v1/jobs".into(),
        ),
        (
            "other scheme",
            vec![format!("Basic {tok}")],
            "/v1/jobs".into(),
        ),
        ("scheme only", vec!["Bearer".into()], "/v1/jobs".into()),
        (
            "duplicated",
            [bearer(&tok), bearer(&tok)].concat(),
            "/v1/jobs".into(),
        ),
        ("query token", vec![], format!("/v1/jobs?token={tok}")),
        (
            "query token beside header",
            bearer(&tok),
            format!("/v1/jobs?access_token={tok}"),
        ),
        (
            "bare token in query",
            bearer(&tok),
            format!("/v1/jobs?x={tok}"),
        ),
        ("unknown route", vec![], "/v1/nothing-here".into()),
        (
            "cancel without token",
            vec![],
            "/v1/jobs/job_00000000000000000000/cancel".into(),
        ),
    ];
    for (what, auths, path) in cases {
        let mut c = s.anon();
        let headers: Vec<(&str, &str)> = auths
            .iter()
            .map(|a| ("Authorization", a.as_str()))
            .collect();
        let r = c.send("GET", &path, &headers, None);
        assert_eq!(r.status, 401, "{what}: {}", r.text());
        assert_eq!(r.code(), "auth", "{what}");
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        assert!(
            !r.text().contains(&tok),
            "{what}: the answer shows the token"
        );
    }
    assert_eq!(s.client().get("/v1/jobs").status, 200);
    // The log never holds a token, even one sent in a URL.
    assert!(!s.log_text().contains(&tok));
}

#[test]
fn token_file_and_scoped_token() {
    let sb = Arc::new(Sandbox::new());
    let full = sb.dir().join("full.token");
    let scoped = sb.dir().join("scoped.token");
    write_mode(&full, "full-token-0123456789abcdef\n", 0o600);
    write_mode(&scoped, "scoped-token-0123456789abcdef\n", 0o600);
    let s = Server::start_in(
        Arc::clone(&sb),
        "127.0.0.1:0",
        &[
            "--token-file",
            full.to_str().unwrap(),
            "--scoped-token-file",
            scoped.to_str().unwrap(),
        ],
    );
    assert!(!s.home.join("agent.token").exists());
    let mut f = Client::connect(&s.addr).token("full-token-0123456789abcdef");
    let mut sc = Client::connect(&s.addr).token("scoped-token-0123456789abcdef");
    // Allowed with the scoped token.
    assert_eq!(sc.get("/v1/sandbox").status, 200);
    assert_eq!(sc.get("/v1/env").status, 200);
    assert_eq!(
        sc.post("/v1/env", &json!({"set": {"SCOPED_A": "1"}}))
            .status,
        200
    );
    let job = sc.start_job(json!({"command": "sleep 30", "background": true}));
    let id = id_of(&job);
    assert_eq!(sc.get("/v1/jobs").status, 200);
    assert_eq!(sc.get(&format!("/v1/jobs/{id}")).status, 200);
    assert_eq!(sc.get(&format!("/v1/jobs/{id}/output")).status, 200);
    // Refused with the scoped token: 403 forbidden, nothing changed.
    for (m, p, b) in [
        ("POST", format!("/v1/jobs/{id}/cancel"), None),
        (
            "POST",
            "/v1/previews".to_string(),
            Some(json!({"port": 1, "waitSeconds": 0})),
        ),
        ("GET", "/v1/ports".to_string(), None),
    ] {
        let r = sc.call(m, &p, b.as_ref());
        assert_eq!(r.status, 403, "{m} {p}: {}", r.text());
        assert_eq!(r.code(), "forbidden");
    }
    assert_eq!(
        sc.get(&format!("/v1/jobs/{id}")).json()["status"],
        "running"
    );
    // The full token may do it all.
    let r = f.post(&format!("/v1/jobs/{id}/cancel"), &json!({}));
    assert_eq!(r.json()["status"], "cancelled");
    assert_eq!(f.get("/v1/ports").status, 200);

    // A token file others may read is refused at start.
    write_mode(&full, "full-token-0123456789abcdef\n", 0o644);
    let out = sb.run(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        full.to_str().unwrap(),
    ]);
    assert!(!out.success(), "{out:#?}");
    let err = &out.stderr;
    assert!(err.contains("token file") && err.contains("0644"), "{err}");
    assert!(!err.contains("full-token-0123456789abcdef"));
}

#[test]
fn jobs_start_list_read_and_cancel() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let v = c.start_job(json!({"command": "echo hi; exit 3", "waitSeconds": 30}));
    assert_eq!(v["status"], "failed");
    assert_eq!(v["exitCode"], 3);
    assert_eq!(v["isError"], true);
    assert_eq!(v["output"], "hi\n");
    for k in [
        "id",
        "command",
        "cwd",
        "status",
        "exitCode",
        "signal",
        "createdAt",
        "startedAt",
        "endedAt",
        "timeoutSeconds",
        "pid",
        "pgid",
        "outputBytes",
        "output",
        "isError",
    ] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    let first = id_of(&v);
    let ok = c.start_job(json!({"command": "printf 'a\\n'"}));
    assert_eq!(ok["status"], "succeeded");
    assert_eq!(ok["isError"], false);
    let second = id_of(&ok);
    let running = c.start_job(json!({"command": "sleep 30", "background": true}));
    assert_eq!(running["status"], "running");
    assert_eq!(running["isError"], false);
    let third = id_of(&running);

    // Newest first; filters; limit.
    let list = c.get("/v1/jobs").json();
    let ids: Vec<&str> = list["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![third.as_str(), second.as_str(), first.as_str()]);
    let list = c.get("/v1/jobs?status=running").json();
    assert_eq!(list["jobs"].as_array().unwrap().len(), 1);
    assert_eq!(list["jobs"][0]["id"], third.as_str());
    let list = c.get("/v1/jobs?limit=2").json();
    assert_eq!(list["jobs"].as_array().unwrap().len(), 2);
    let list = c.get("/v1/jobs?status=failed&limit=5").json();
    assert_eq!(list["jobs"][0]["id"], first.as_str());
    for bad in [
        "/v1/jobs?status=bogus",
        "/v1/jobs?limit=0",
        "/v1/jobs?limit=x",
        "/v1/jobs?limit=1&limit=2",
    ] {
        let r = c.get(bad);
        assert_eq!((r.status, r.code().as_str()), (400, "invalid"), "{bad}");
    }

    // One job.
    let one = c.get(&format!("/v1/jobs/{first}")).json();
    assert_eq!(one["output"], "hi\n");
    assert_eq!(one["exitCode"], 3);

    // Cancel: running -> cancelled; an ended job stays as it was.
    let r = c.post(&format!("/v1/jobs/{third}/cancel"), &json!({}));
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["status"], "cancelled");
    assert_eq!(r.json()["isError"], true);
    let before = c.get(&format!("/v1/jobs/{first}")).json();
    let r = c.send("POST", &format!("/v1/jobs/{first}/cancel"), &[], None);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["status"], "failed");
    assert_eq!(c.get(&format!("/v1/jobs/{first}")).json(), before);
}

#[test]
fn output_pages() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let v = c.start_job(json!({"command": "printf 'hi\\n'; printf 'é€x'"}));
    let id = id_of(&v);
    let p = c
        .get(&format!("/v1/jobs/{id}/output?offset=0&limit=2"))
        .json();
    assert_eq!(
        p,
        json!({"offset": 0, "nextOffset": 2, "data": "hi", "eof": false, "done": false})
    );
    let p = c.get(&format!("/v1/jobs/{id}/output?offset=2")).json();
    assert_eq!(p["data"], "\né€x");
    assert_eq!(p["eof"], true);
    assert_eq!(p["done"], true);
    // A limit inside a character backs off to its start; an offset inside one skips on.
    let p = c
        .get(&format!("/v1/jobs/{id}/output?offset=3&limit=3"))
        .json();
    assert_eq!(
        (p["data"].as_str(), p["nextOffset"].as_u64()),
        (Some("é"), Some(5))
    );
    let p = c
        .get(&format!("/v1/jobs/{id}/output?offset=4&limit=10"))
        .json();
    assert_eq!(
        (p["offset"].as_u64(), p["data"].as_str()),
        (Some(5), Some("€x"))
    );
    for bad in [
        "offset=-1",
        "offset=999",
        "limit=0",
        "limit=65537",
        "offset=x",
        "waitSeconds=601",
    ] {
        let r = c.get(&format!("/v1/jobs/{id}/output?{bad}"));
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid"),
            "{bad}: {}",
            r.text()
        );
    }
    let r = c.get(&format!("/v1/jobs/{id}/output?limit=65536"));
    assert_eq!(r.status, 200);
}

#[test]
fn every_start_field() {
    let s = Server::start(&["--max-job-seconds", "100"]);
    let mut c = s.client();
    let cwd = s.dir().join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    let sec = s.dir().join("s.env");
    write_mode(&sec, "FROM_FILE=file-secret-value\nBOTH=from-file\n", 0o600);
    let v = c.start_job(json!({
            "command": "pwd; echo \"$A $B\"; cat; echo; test \"$FROM_FILE\" = \"file-$(echo secret)-value\" && echo file-ok; test \"$INLINE\" = \"inline-$(echo secret)\" && echo inline-ok; test \"$BOTH\" = from-env && echo both-ok",
            "cwd": cwd.to_str().unwrap(),
            "env": {"A": "1", "B": "two words"},
            "stdin": "aGVsbG8gc3RkaW4=",
            "encoding": "base64",
            "secretEnv": {"INLINE": "inline-secret", "BOTH": "from-env"},
            "secretFiles": [sec.to_str().unwrap()],
            "timeoutSeconds": 500,
            "waitSeconds": 30,
        }),
    );
    assert_eq!(v["status"], "succeeded", "{v}");
    let out = v["output"].as_str().unwrap();
    let canon = std::fs::canonicalize(&cwd).unwrap();
    assert_eq!(
        out,
        format!(
            "{}\n1 two words\nhello stdin\nfile-ok\ninline-ok\nboth-ok\n",
            canon.display()
        )
    );
    // Clamped to --max-job-seconds.
    assert_eq!(v["timeoutSeconds"], 100.0);
    // Secret values are not in the record.
    let rec =
        std::fs::read_to_string(s.home.join("jobs").join(id_of(&v)).join("job.json")).unwrap();
    assert!(!rec.contains("inline-secret") && !rec.contains("file-secret-value"));

    let v = c.start_job(json!({"command": "cat", "stdin": "plain ü\n"}));
    assert_eq!(v["output"], "plain ü\n");
    let v = c.start_job(json!({"command": "sleep 5", "timeoutSeconds": 0.5}));
    assert_eq!(v["status"], "timed_out");
    let v = c.start_job(json!({"command": "echo a; sleep 5", "idleTimeoutSeconds": 0.5}));
    assert_eq!(v["status"], "timed_out");
    assert_eq!(v["output"], "a\n");
    // waitSeconds 0 answers at once; the job goes on.
    let v = c.start_job(json!({"command": "sleep 1; echo late", "waitSeconds": 0}));
    assert_eq!(v["status"], "running");
    let id = id_of(&v);
    let v = c.get(&format!("/v1/jobs/{id}?waitSeconds=30")).json();
    assert_eq!(
        (v["status"].as_str(), v["output"].as_str()),
        (Some("succeeded"), Some("late\n"))
    );
}

#[test]
fn bad_start_requests_are_invalid_and_start_nothing() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let loose = s.dir().join("loose.env");
    write_mode(&loose, "X=abcdefgh\n", 0o644);
    let loose = loose.to_str().unwrap().to_string();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"".to_vec(), "empty"),
        (b"{not json".to_vec(), "JSON"),
        (b"[]".to_vec(), "object"),
        (b"\"command\"".to_vec(), "object"),
        (b"{\"nocommand\":true}".to_vec(), "command"),
        (b"{\"command\":\"\"}".to_vec(), "command"),
        (b"{\"command\":[\"ls\"]}".to_vec(), "command"),
        (b"{\"command\":\"true\",\"cwd\":5}".to_vec(), "cwd"),
        (
            b"{\"command\":\"true\",\"cwd\":\"/no/such/dir\"}".to_vec(),
            "cwd",
        ),
        (b"{\"command\":\"true\",\"env\":\"A=1\"}".to_vec(), "env"),
        (
            b"{\"command\":\"true\",\"env\":{\"A\":true}}".to_vec(),
            "env.A",
        ),
        (
            b"{\"command\":\"true\",\"env\":{\"BAD-NAME\":\"x\"}}".to_vec(),
            "BAD-NAME",
        ),
        (
            b"{\"command\":\"true\",\"env\":{\"\":\"x\"}}".to_vec(),
            "invalid",
        ),
        (
            b"{\"command\":\"true\",\"stdin\":\"@@@\",\"encoding\":\"base64\"}".to_vec(),
            "base64",
        ),
        (
            b"{\"command\":\"true\",\"stdin\":\"x\",\"encoding\":\"latin1\"}".to_vec(),
            "encoding",
        ),
        (b"{\"command\":\"true\",\"stdin\":[1]}".to_vec(), "stdin"),
        (
            b"{\"command\":\"true\",\"secretEnv\":{\"S\":\"ab\"}}".to_vec(),
            "S",
        ),
        (
            b"{\"command\":\"true\",\"secretEnv\":{\"S\":1}}".to_vec(),
            "secretEnv",
        ),
        (
            b"{\"command\":\"true\",\"secretFiles\":\"/x\"}".to_vec(),
            "secretFiles",
        ),
        (
            format!("{{\"command\":\"true\",\"secretFiles\":[\"{loose}\"]}}").into_bytes(),
            "0644",
        ),
        (
            b"{\"command\":\"true\",\"secretFiles\":[\"/no/such/file\"]}".to_vec(),
            "secret file",
        ),
        (
            b"{\"command\":\"true\",\"timeoutSeconds\":\"10\"}".to_vec(),
            "timeoutSeconds",
        ),
        (
            b"{\"command\":\"true\",\"timeoutSeconds\":-1}".to_vec(),
            "timeoutSeconds",
        ),
        (
            b"{\"command\":\"true\",\"idleTimeoutSeconds\":{}}".to_vec(),
            "idleTimeoutSeconds",
        ),
        (
            b"{\"command\":\"true\",\"waitSeconds\":601}".to_vec(),
            "waitSeconds",
        ),
        (
            b"{\"command\":\"true\",\"waitSeconds\":\"1\"}".to_vec(),
            "waitSeconds",
        ),
        (
            b"{\"command\":\"true\",\"background\":1}".to_vec(),
            "background",
        ),
        (b"\xff\xfe".to_vec(), "JSON"),
        ("[".repeat(50_000).into_bytes(), "JSON"),
    ];
    for (body, needle) in &cases {
        let r = c.send("POST", "/v1/jobs", &[], Some(body));
        assert_eq!(
            r.status,
            400,
            "{}: {}",
            String::from_utf8_lossy(body),
            r.text()
        );
        assert_eq!(r.code(), "invalid");
        let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(
            msg.contains(needle),
            "{}: {msg}",
            String::from_utf8_lossy(body)
        );
    }
    let r = c.send(
        "POST",
        "/v1/jobs",
        &[("Idempotency-Key", "a"), ("Idempotency-Key", "b")],
        Some(b"{\"command\":\"true\"}"),
    );
    assert_eq!((r.status, r.code().as_str()), (400, "invalid"));
    assert_eq!(
        c.get("/v1/jobs").json()["jobs"],
        json!([]),
        "nothing was started"
    );
    assert!(
        std::fs::read_dir(s.home.join("jobs"))
            .unwrap()
            .next()
            .is_none()
    );
}

#[test]
fn malformed_and_traversing_ids_are_not_found() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let long = "a".repeat(10_000);
    let ids = [
        "job_00000000000000000000".to_string(),
        "..".into(),
        "%2e%2e".into(),
        "%2E%2E%2Fagent.token".into(),
        "..%2f..%2fetc%2fpasswd".into(),
        "job_%2e%2e".into(),
        "job_0000000000000000000%00".into(),
        "%00".into(),
        "job_0123456789ABCDEF0123".into(),
        long.clone(),
        format!("job_{long}"),
    ];
    for id in &ids {
        for (m, p) in [
            ("GET", format!("/v1/jobs/{id}")),
            ("GET", format!("/v1/jobs/{id}/output")),
            ("POST", format!("/v1/jobs/{id}/cancel")),
        ] {
            let r = c.send(m, &p, &[], None);
            assert_eq!(r.status, 404, "{m} {}: {}", &p[..p.len().min(80)], r.text());
            assert_eq!(r.code(), "not_found");
        }
    }
    // Paths that are not routes at all.
    for p in [
        "/v1/jobs/../agent.token",
        "/v1/jobs/a/b/c",
        "/v1",
        "/",
        "/v1/jobs/",
        "/v2/health",
    ] {
        let r = c.get(p);
        assert_eq!((r.status, r.code().as_str()), (404, "not_found"), "{p}");
    }
    // A raw NUL byte in the target: still just not found.
    c.write_raw(b"GET /v1/jobs/job_\0/output HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer ")
        .unwrap();
    c.write_raw(format!("{}\r\n\r\n", s.token).as_bytes())
        .unwrap();
    let r = c.read_response().unwrap();
    assert_eq!(r.status, 404);
}

#[test]
fn wrong_methods_and_unknown_routes() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let r = c.send("DELETE", "/v1/jobs", &[], None);
    assert_eq!((r.status, r.code().as_str()), (400, "invalid"));
    assert_eq!(r.header("allow"), Some("POST, GET, HEAD"));
    let r = c.get("/v1/jobs/job_00000000000000000000/cancel");
    assert_eq!((r.status, r.header("allow")), (400, Some("POST")));
    let r = c.send("POST", "/v1/health", &[], Some(b"{}"));
    assert_eq!(r.status, 400);
    // A refused small body is skipped, so the connection stays usable.
    let r = c.send("POST", "/v1/nothing", &[], Some(b"{\"a\":1}"));
    assert_eq!(r.status, 404);
    let r = c.get("/v1/nope");
    assert_eq!((r.status, r.code().as_str()), (404, "not_found"));
    // Still one healthy keep-alive connection after all that.
    assert_eq!(c.get("/v1/health").status, 200);
}

#[test]
fn idempotency_key_starts_one_job() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let body = br#"{"command":"sleep 30","background":true}"#;
    let a = c
        .send(
            "POST",
            "/v1/jobs",
            &[("Idempotency-Key", "retry-1")],
            Some(body),
        )
        .json();
    let b = c
        .send(
            "POST",
            "/v1/jobs",
            &[("Idempotency-Key", "retry-1")],
            Some(body),
        )
        .json();
    assert_eq!(a["id"], b["id"]);
    let other = c
        .send(
            "POST",
            "/v1/jobs",
            &[("Idempotency-Key", "retry-2")],
            Some(body),
        )
        .json();
    assert_ne!(a["id"], other["id"]);
    // Racing retries: still one job per key.
    let addr = s.addr.clone();
    let tok = s.token.clone();
    let ids: Vec<String> = (0..16)
        .map(|_| {
            let (addr, tok) = (addr.clone(), tok.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(&addr).token(&tok);
                let r = c.send(
                    "POST",
                    "/v1/jobs",
                    &[("Idempotency-Key", "race")],
                    Some(br#"{"command":"sleep 30","background":true}"#),
                );
                id_of(&r.json())
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 1, "{ids:?}");
    assert_eq!(
        c.get("/v1/jobs").json()["jobs"].as_array().unwrap().len(),
        3
    );
}

#[test]
fn long_polls_on_jobs_and_output() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let v = c.start_job(
        json!({"command": "sleep 1; echo first; sleep 1; echo second", "background": true}),
    );
    let id = id_of(&v);
    // Output: nothing at offset 0 yet, so the call waits for the first bytes.
    let p = c
        .get(&format!("/v1/jobs/{id}/output?offset=0&waitSeconds=30"))
        .json();
    assert_eq!(p["data"], "first\n", "{p}");
    assert_eq!(p["done"], false);
    let next = p["nextOffset"].as_u64().unwrap();
    let p = c
        .get(&format!(
            "/v1/jobs/{id}/output?offset={next}&waitSeconds=30"
        ))
        .json();
    assert_eq!(p["data"], "second\n", "{p}");
    let next = p["nextOffset"].as_u64().unwrap();
    // At the end of the output of a job that is about to end: the call waits for the end
    // (no more data can come), then says so.
    let p = c
        .get(&format!(
            "/v1/jobs/{id}/output?offset={next}&waitSeconds=30"
        ))
        .json();
    assert_eq!(
        p,
        json!({"offset": next, "nextOffset": next, "data": "", "eof": true, "done": true,
               "pending": ""})
    );
    let v = c.get(&format!("/v1/jobs/{id}?waitSeconds=30")).json();
    assert_eq!(v["status"], "succeeded");
    let p = c
        .get(&format!(
            "/v1/jobs/{id}/output?offset={next}&waitSeconds=30"
        ))
        .json();
    assert_eq!(
        (p["data"].as_str(), p["eof"].as_bool(), p["done"].as_bool()),
        (Some(""), Some(true), Some(true))
    );
    // A long-poll that runs out answers with the running record.
    let v = c.start_job(json!({"command": "sleep 30", "background": true}));
    let id = id_of(&v);
    let v = c.get(&format!("/v1/jobs/{id}?waitSeconds=0.3")).json();
    assert_eq!(v["status"], "running");
    let p = c
        .get(&format!("/v1/jobs/{id}/output?waitSeconds=0.3"))
        .json();
    assert_eq!(
        (p["data"].as_str(), p["done"].as_bool()),
        (Some(""), Some(false))
    );
    c.post(&format!("/v1/jobs/{id}/cancel"), &json!({}));
}

/// How often a long-poll re-reads the record when nothing wakes it (the server's
/// `RECHECK`): a waiter answered sooner after the change was woken by the folder watch.
const RECHECK: Duration = Duration::from_millis(500);

#[test]
fn a_cancel_from_elsewhere_wakes_a_waiting_poll_at_once() {
    // The waiter's request starts at t0; without a wake-up it would re-read the record only
    // at t0 + d + k * RECHECK (d: until the server starts waiting). The cancel is sent at
    // t0 + 2.4 * RECHECK, after the second re-read (for any d < 0.4 * RECHECK), so only a
    // wake-up can answer before t0 + 3 * RECHECK. An attempt whose cancel itself takes too
    // long says nothing either way; it is tried again with a new job.
    let s = Server::start(&[]);
    let mut c = s.client();
    let mut attempts = Vec::new();
    for _ in 0..4 {
        let id = id_of(&c.start_job(json!({"command": "sleep 30", "background": true})));
        let (addr, tok, path) = (
            s.addr.clone(),
            s.token.clone(),
            format!("/v1/jobs/{id}?waitSeconds=120"),
        );
        let t0 = Instant::now();
        let waiter = std::thread::spawn(move || {
            let v = Client::connect(&addr).token(&tok).get(&path).json();
            (v, Instant::now())
        });
        std::thread::sleep((t0 + RECHECK * 12 / 5).saturating_duration_since(Instant::now()));
        let sent = t0.elapsed();
        let r = c.post(&format!("/v1/jobs/{id}/cancel"), &json!({}));
        let cancelled = t0.elapsed();
        assert_eq!(r.json()["status"], "cancelled");
        let (v, answered) = waiter.join().unwrap();
        assert_eq!(v["status"], "cancelled", "{v}");
        let answered = answered - t0;
        attempts.push(format!(
            "cancel sent at {sent:?}, done at {cancelled:?}, waiter answered at {answered:?}"
        ));
        if answered < RECHECK * 3 {
            return;
        }
    }
    panic!(
        "the waiting poll was answered only by a periodic re-read, not woken by the change: \
         {attempts:#?}"
    );
}

#[test]
fn many_long_polls_do_not_pin_the_server() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let v = c.start_job(json!({"command": "sleep 4; echo end", "background": true}));
    let id = id_of(&v);
    let waiters: Vec<_> = (0..200)
        .map(|i| {
            let (addr, tok, id) = (s.addr.clone(), s.token.clone(), id.clone());
            std::thread::Builder::new()
                .stack_size(128 << 10)
                .spawn(move || {
                    let mut c = Client::connect(&addr).token(&tok);
                    if i % 2 == 0 {
                        c.get(&format!("/v1/jobs/{id}?waitSeconds=120")).json()["status"].clone()
                    } else {
                        c.get(&format!("/v1/jobs/{id}/output?waitSeconds=120"))
                            .json()["data"]
                            .clone()
                    }
                })
                .unwrap()
        })
        .collect();
    // Wait until the server holds (most of) them, then check that it still answers.
    eventually(LONG, "200 open connections", || {
        let n = std::fs::read_dir(format!("/proc/{}/task", s.pid()))
            .ok()?
            .count();
        (n >= 150).then_some(())
    });
    let t = Instant::now();
    let r = s.anon().get("/v1/health");
    assert_eq!(r.status, 200);
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "health took {:?}",
        t.elapsed()
    );
    assert_eq!(
        s.client().get(&format!("/v1/jobs/{id}")).json()["status"],
        "running"
    );
    for (i, w) in waiters.into_iter().enumerate() {
        let v = w.join().unwrap();
        if i % 2 == 0 {
            assert_eq!(v, "succeeded");
        } else {
            assert_eq!(v, "end\n");
        }
    }
}

#[test]
fn concurrent_start_read_cancel_end_consistently() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let ids: Vec<String> = (0..5)
        .map(|_| id_of(&c.start_job(json!({"command": "sleep 30", "background": true}))))
        .collect();
    let ids = Arc::new(ids);
    let handles: Vec<_> = (0..100)
        .map(|i| {
            let (addr, tok, ids) = (s.addr.clone(), s.token.clone(), Arc::clone(&ids));
            std::thread::spawn(move || {
                let mut c = Client::connect(&addr).token(&tok);
                let id = &ids[i % ids.len()];
                match i % 4 {
                    0 => (
                        "cancel",
                        c.post(&format!("/v1/jobs/{id}/cancel"), &json!({})).json(),
                    ),
                    1 => ("read", c.get(&format!("/v1/jobs/{id}")).json()),
                    2 => ("output", c.get(&format!("/v1/jobs/{id}/output")).json()),
                    _ => {
                        // A start that reuses the job's key: must give the same job back.
                        let r = c.send(
                            "POST",
                            "/v1/jobs",
                            &[("Idempotency-Key", "same")],
                            Some(br#"{"command":"sleep 30","background":true}"#),
                        );
                        ("start", r.json())
                    }
                }
            })
        })
        .collect();
    let mut started = BTreeSet::new();
    for h in handles {
        let (kind, v) = h.join().unwrap();
        match kind {
            "cancel" => assert_eq!(v["status"], "cancelled", "{v}"),
            "read" => assert!(
                ["running", "cancelled"].contains(&v["status"].as_str().unwrap()),
                "{v}"
            ),
            "output" => assert!(v.get("data").is_some(), "{v}"),
            _ => {
                started.insert(id_of(&v));
            }
        }
    }
    assert_eq!(started.len(), 1, "one job for one key: {started:?}");
    for id in ids.iter() {
        let v = c.get(&format!("/v1/jobs/{id}")).json();
        assert_eq!(v["status"], "cancelled");
        assert!(v["endedAt"].is_string());
        let again = c.post(&format!("/v1/jobs/{id}/cancel"), &json!({})).json();
        assert_eq!(
            again["endedAt"], v["endedAt"],
            "a second cancel changes nothing"
        );
    }
}

#[test]
fn body_limits() {
    let s = Server::start(&["--max-body", "4096"]);
    let mut c = s.client();
    // Refused from the Content-Length alone.
    c.write_raw(
        format!(
            "POST /v1/jobs HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\nContent-Length: 5000\r\n\r\n",
            s.token
        )
        .as_bytes(),
    )
    .unwrap();
    let r = c.read_response().unwrap();
    assert_eq!((r.status, r.code().as_str()), (413, "too_large"));
    assert_eq!(r.header("connection"), Some("close"));
    // Refused while reading a chunked stream that grows past the cap.
    let mut c = s.client();
    c.write_raw(format!("POST /v1/jobs HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\nTransfer-Encoding: chunked\r\n\r\n", s.token).as_bytes()).unwrap();
    let chunk = format!("400\r\n{}\r\n", "x".repeat(0x400));
    for _ in 0..8 {
        if c.write_raw(chunk.as_bytes()).is_err() {
            break;
        }
    }
    let resp = c.read_response();
    let r = resp.expect("a response");
    assert_eq!((r.status, r.code().as_str()), (413, "too_large"));
    // A chunked body within the cap works.
    let mut c = s.client();
    let body = br#"{"command":"echo chunked"}"#;
    let mut req = format!(
        "POST /v1/jobs HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\nTransfer-Encoding: chunked\r\n\r\n",
        s.token
    )
    .into_bytes();
    for part in body.chunks(7) {
        req.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        req.extend_from_slice(part);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    c.write_raw(&req).unwrap();
    let r = c.read_response().unwrap();
    assert_eq!(r.json()["output"], "chunked\n");
    // The default cap is 8 MiB.
    let s = Server::start(&[]);
    let mut c = s.client();
    c.write_raw(
        format!(
            "POST /v1/env HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\n\r\n",
            s.token,
            (8 << 20) + 1
        )
        .as_bytes(),
    )
    .unwrap();
    assert_eq!(c.read_response().unwrap().status, 413);
    // An unauthenticated body is refused before it is read.
    let mut c = s.anon();
    c.write_raw(b"POST /v1/jobs HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000\r\n\r\n")
        .unwrap();
    assert_eq!(c.read_response().unwrap().status, 401);
}

#[test]
fn slow_and_huge_clients_are_cut_off() {
    let s = Server::start(&["--header-timeout", "1", "--body-timeout", "1"]);
    // Slowloris: heads trickled a byte at a time, never finished.
    let mut slow: Vec<Client> = (0..20).map(|_| s.anon()).collect();
    for c in &mut slow {
        c.write_raw(b"GET /v1/health HTTP/1.1\r\nHost: t\r\nX-A: ")
            .unwrap();
    }
    for _ in 0..3 {
        for c in &mut slow {
            let _ = c.write_raw(b"a");
        }
        // Meanwhile others are served at once.
        assert_eq!(s.anon().get("/v1/health").status, 200);
        std::thread::sleep(Duration::from_millis(100));
    }
    for c in &mut slow {
        assert!(
            c.closed_within(Duration::from_secs(30)),
            "a slow head was not cut off"
        );
    }
    // An endless chunked body, trickled.
    let mut c = s.client();
    c.write_raw(format!("POST /v1/env HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\nTransfer-Encoding: chunked\r\n\r\n", s.token).as_bytes()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut cut = false;
    while Instant::now() < deadline {
        if c.write_raw(b"1\r\nx\r\n").is_err() {
            cut = true;
            break;
        }
        if c.closed_within(Duration::from_millis(200)) {
            cut = true;
            break;
        }
    }
    assert!(cut, "an endless body was not cut off");
    // A 1 MB header, and a flood of small ones.
    let mut c = s.anon();
    let _ = c.write_raw(
        format!(
            "GET /v1/health HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n",
            "a".repeat(1 << 20)
        )
        .as_bytes(),
    );
    let r = c.read_response().expect("an answer to a huge header");
    assert_eq!((r.status, r.code().as_str()), (413, "too_large"));
    let mut c = s.anon();
    let many: String = (0..500).map(|i| format!("X-{i}: y\r\n")).collect();
    c.write_raw(format!("GET /v1/health HTTP/1.1\r\nHost: t\r\n{many}\r\n").as_bytes())
        .unwrap();
    assert_eq!(c.read_response().unwrap().status, 413);
    // Malformed heads: 400 invalid.
    for raw in [
        "GARBAGE\r\n\r\n",
        "GET / HTTP/9.9\r\n\r\n",
        "GET /v1/health HTTP/1.1\r\nBad Header\r\n\r\n",
    ] {
        let mut c = s.anon();
        c.write_raw(raw.as_bytes()).unwrap();
        let r = c.read_response().unwrap();
        assert_eq!((r.status, r.code().as_str()), (400, "invalid"), "{raw:?}");
    }
    assert_eq!(s.anon().get("/v1/health").status, 200);
}

#[test]
fn keep_alive_pipelining_and_expect_continue() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let auth = format!("Authorization: Bearer {}\r\n", s.token);
    let body = r#"{"set":{"PIPE_A":"1"}}"#;
    let pipelined = format!(
        "GET /v1/health HTTP/1.1\r\nHost: t\r\n\r\nPOST /v1/env HTTP/1.1\r\nHost: t\r\n{auth}Content-Length: {}\r\n\r\n{body}GET /v1/env HTTP/1.1\r\nHost: t\r\n{auth}\r\nGET /v1/nothing HTTP/1.1\r\nHost: t\r\n{auth}\r\n",
        body.len()
    );
    c.write_raw(pipelined.as_bytes()).unwrap();
    let a = c.read_response().unwrap();
    let b = c.read_response().unwrap();
    let d = c.read_response().unwrap();
    let e = c.read_response().unwrap();
    assert_eq!(a.json()["ok"], true);
    assert_eq!(b.json()["names"], json!(["PIPE_A"]));
    assert_eq!(d.json()["names"], json!(["PIPE_A"]));
    assert_eq!(e.status, 404);
    // Expect: 100-continue gets its interim answer, then the real one.
    let r = c.send(
        "POST",
        "/v1/env",
        &[("Expect", "100-continue")],
        Some(br#"{"unset":["PIPE_A"]}"#),
    );
    assert_eq!(r.json()["names"], json!([]));
    // Refused before the body while the client waits for 100 Continue: answered at once,
    // without waiting for a body that may never come.
    let mut a = s.anon();
    a.write_raw(
        b"POST /v1/jobs HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n",
    )
    .unwrap();
    a.r.get_ref().set_timeout(Duration::from_secs(30));
    assert_eq!(a.read_response().unwrap().status, 401);
    // Connection: close is honoured.
    let r = c.send("GET", "/v1/health", &[("Connection", "close")], None);
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.closed_within(Duration::from_secs(10)));
    // HTTP/1.0 closes unless asked otherwise.
    let mut c = s.anon();
    c.write_raw(b"GET /v1/health HTTP/1.0\r\n\r\n").unwrap();
    assert_eq!(c.read_response().unwrap().status, 200);
    assert!(c.closed_within(Duration::from_secs(10)));
}

#[test]
fn connection_cap() {
    let s = Server::start(&["--max-connections", "4"]);
    let mut held: Vec<Client> = (0..4).map(|_| s.anon()).collect();
    for c in &mut held {
        assert_eq!(c.get("/v1/health").status, 200);
    }
    let mut extra = s.anon();
    let r = extra.read_response().expect("an answer over the cap");
    assert_eq!((r.status, r.code().as_str()), (429, "rate_limited"));
    drop(held);
    eventually(LONG, "a free connection slot", || {
        let mut c = s.anon();
        c.r.get_ref().set_timeout(Duration::from_secs(5));
        c.write_raw(b"GET /v1/health HTTP/1.1\r\nHost: t\r\n\r\n")
            .ok()?;
        (c.read_response()?.status == 200).then_some(())
    });
}

#[test]
fn max_running_is_rate_limited() {
    let s = Server::start(&["--max-running", "2"]);
    let mut c = s.client();
    let a = c.start_job(json!({"command": "sleep 30", "background": true}));
    c.start_job(json!({"command": "sleep 30", "background": true}));
    let r = c.post("/v1/jobs", &json!({"command": "true"}));
    assert_eq!((r.status, r.code().as_str()), (429, "rate_limited"));
    assert_eq!(
        c.get("/v1/jobs").json()["jobs"].as_array().unwrap().len(),
        2
    );
    c.post(&format!("/v1/jobs/{}/cancel", id_of(&a)), &json!({}));
    let v = c.start_job(json!({"command": "echo room"}));
    assert_eq!(v["output"], "room\n");
}

#[test]
fn env_routes() {
    let s = Server::start(&[]);
    let mut c = s.client();
    assert_eq!(c.get("/v1/env").json(), json!({"names": []}));
    let r = c.post(
        "/v1/env",
        &json!({"set": {"B_VAR": "secret-ish value", "A_VAR": "a"}}),
    );
    assert_eq!(r.json(), json!({"names": ["A_VAR", "B_VAR"]}));
    assert!(!r.text().contains("secret-ish"));
    let v = c.start_job(json!({"command": "echo \"$A_VAR $B_VAR\"", "env": {"A_VAR": "own"}}));
    assert_eq!(v["output"], "own secret-ish value\n");
    assert_eq!(
        c.post("/v1/env", &json!({"unset": ["A_VAR"]})).json()["names"],
        json!(["B_VAR"])
    );
    assert_eq!(
        c.post("/v1/env", &json!({"set": {"C": "c"}, "replace": true}))
            .json()["names"],
        json!(["C"])
    );
    // Over the limits, or bad names: invalid, and nothing changes.
    let many: serde_json::Map<String, Value> =
        (0..65).map(|i| (format!("V{i}"), json!("x"))).collect();
    for body in [
        json!({"set": many}),
        json!({"set": {"BIG": "x".repeat(33 * 1024)}}),
        json!({"set": {"1BAD": "x"}}),
        json!({"set": {"OK": 1}}),
        json!({"unset": "C"}),
        json!({"set": {"D": "d"}, "unset": ["D"]}),
        json!([]),
    ] {
        let r = c.post("/v1/env", &body);
        assert_eq!((r.status, r.code().as_str()), (400, "invalid"), "{body}");
    }
    assert_eq!(c.get("/v1/env").json()["names"], json!(["C"]));
    let r = c.send("POST", "/v1/env", &[], None);
    assert_eq!(r.status, 400);
}

#[test]
fn sandbox_and_ports() {
    let s = Server::start(&[]);
    let mut c = s.client();
    c.post("/v1/env", &json!({"set": {"SB": "1"}}));
    c.start_job(json!({"command": "true"}));
    let v = c.get("/v1/sandbox").json();
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert!(v["bootId"].is_string());
    assert_eq!(v["resumed"], false);
    assert!(v["agentStartedAt"].as_str().unwrap().ends_with('Z'));
    assert_eq!(v["envNames"], json!(["SB"]));
    assert_eq!(v["jobs"]["succeeded"], 1);
    assert_eq!(v["jobs"]["running"], 0);
    let ports = c.get("/v1/ports").json();
    let port: u64 = s.addr.rsplit(':').next().unwrap().parse().unwrap();
    let me = ports["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["port"] == port)
        .cloned();
    let me = me.unwrap_or_else(|| panic!("own port {port} not in {ports}"));
    assert_eq!(me["pid"], s.pid());
    assert!(me["jobId"].is_null());
}

#[test]
fn corrupt_records_are_listed_not_skipped() {
    let s = Server::start(&[]);
    let mut c = s.client();
    c.start_job(json!({"command": "true"}));
    let bad = s.home.join("jobs").join("job_0123456789abcdef0123");
    std::fs::create_dir(&bad).unwrap();
    std::fs::write(bad.join("job.json"), b"{broken").unwrap();
    let list = c.get("/v1/jobs").json();
    let jobs = list["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2);
    let corrupt = jobs
        .iter()
        .find(|j| j["corrupt"] == true)
        .expect("the corrupt entry");
    assert_eq!(corrupt["id"], "job_0123456789abcdef0123");
    assert!(corrupt["error"].as_str().unwrap().contains("corrupt"));
    let r = c.get("/v1/jobs/job_0123456789abcdef0123");
    assert_eq!((r.status, r.code().as_str()), (500, "internal"));
    assert_eq!(c.get("/v1/sandbox").json()["jobs"]["corrupt"], 1);
}

#[test]
fn previews() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let port: u16 = s.addr.rsplit(':').next().unwrap().parse().unwrap();
    // Something already listens: ready at once.
    let v = c
        .post("/v1/previews", &json!({"port": port, "waitSeconds": 5}))
        .json();
    assert_eq!(
        (v["port"].as_u64(), v["ready"].as_bool()),
        (Some(port as u64), Some(true))
    );
    assert!(v["waitedMs"].is_u64());
    let v = c
        .post(
            "/v1/previews",
            &json!({"port": port, "probe": "http", "path": "/v1/health"}),
        )
        .json();
    assert_eq!(v["ready"], true);

    // A server started as a job: this agent itself on a free port, probed over HTTP.
    let free = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let inner = s.dir().join("inner");
    let cmd = format!(
        "GITTERM_HOME={} exec {} serve --listen 127.0.0.1:{free}",
        inner.display(),
        BIN
    );
    let r = c.post("/v1/previews", &json!({"port": free, "command": cmd, "probe": "http", "path": "/v1/health", "waitSeconds": 60}));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let job = v["jobId"].as_str().expect("the server job").to_string();
    assert_eq!(
        c.get(&format!("/v1/jobs/{job}")).json()["status"],
        "running"
    );
    // Asking again starts nothing new.
    let again = c
        .post("/v1/previews", &json!({"port": free, "command": cmd}))
        .json();
    assert_eq!(again["jobId"], job.as_str(), "{again}");
    assert_eq!(
        c.get("/v1/jobs?status=running").json()["jobs"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    c.post(&format!("/v1/jobs/{job}/cancel"), &json!({}));

    // The server job dies first: conflict, with its exit code and output.
    let free2 = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let r = c.post(
        "/v1/previews",
        &json!({"port": free2, "command": "echo cannot bind; exit 4", "waitSeconds": 30}),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (409, "conflict"),
        "{}",
        r.text()
    );
    let e = &r.json()["error"];
    assert_eq!(e["exitCode"], 4);
    assert_eq!(e["output"], "cannot bind\n");
    assert!(e["message"].as_str().unwrap().contains("exit code 4"));
    // Nothing in time: timeout.
    let r = c.post("/v1/previews", &json!({"port": free2, "waitSeconds": 0.5}));
    assert_eq!((r.status, r.code().as_str()), (504, "timeout"));
    for bad in [
        json!({}),
        json!({"port": "80"}),
        json!({"port": 0}),
        json!({"port": 80, "waitSeconds": 61}),
        json!({"port": 80, "probe": "icmp"}),
    ] {
        let r = c.post("/v1/previews", &bad);
        assert_eq!((r.status, r.code().as_str()), (400, "invalid"), "{bad}");
    }
}

#[test]
fn server_restart_keeps_jobs() {
    let sb = Arc::new(Sandbox::new());
    let mut s = Server::start_in(Arc::clone(&sb), "127.0.0.1:0", &[]);
    let mut c = s.client();
    let v = c.start_job(json!({"command": "sleep 2; echo survived", "background": true}));
    let id = id_of(&v);
    let sup = c.get(&format!("/v1/jobs/{id}")).json()["supervisorPid"]
        .as_i64()
        .unwrap();
    let token = s.token.clone();
    s.kill9();
    assert!(alive(sup), "the job's supervisor died with the server");
    let s2 = Server::start_in(Arc::clone(&sb), "127.0.0.1:0", &[]);
    assert_eq!(s2.token, token, "the generated token is reused");
    let v = s2
        .client()
        .get(&format!("/v1/jobs/{id}?waitSeconds=60"))
        .json();
    assert_eq!(
        (v["status"].as_str(), v["output"].as_str()),
        (Some("succeeded"), Some("survived\n"))
    );
    drop(s);
}

#[test]
fn sigterm_stops_the_server_and_leaves_jobs_running() {
    let mut s = Server::start(&[]);
    let mut c = s.client();
    let v = c.start_job(json!({"command": "sleep 30", "background": true}));
    let id = id_of(&v);
    let status = s.terminate();
    assert_eq!(status.code(), Some(0));
    assert!(s.log_text().contains("\"stopped\""));
    let rec: Value = serde_json::from_slice(
        &std::fs::read(s.home.join("jobs").join(&id).join("job.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(rec["status"], "running");
    assert!(alive(rec["supervisorPid"].as_i64().unwrap()));
    assert!(alive(rec["pid"].as_i64().unwrap()));
    // The sandbox's guard cancels it through the CLI.
}

#[test]
fn unix_socket_listener() {
    let sb = Arc::new(Sandbox::new());
    let sock = sb.dir().join("agent.sock");
    let listen = format!("unix:{}", sock.display());
    let mut s = Server::start_in(Arc::clone(&sb), &listen, &[]);
    assert_eq!(s.addr, listen);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let mut c = s.client();
    assert_eq!(c.get("/v1/health").json()["ok"], true);
    let v = c.start_job(json!({"command": "echo over unix"}));
    assert_eq!(v["output"], "over unix\n");
    assert_eq!(s.anon().get("/v1/jobs").status, 401);
    // A socket left by a killed server is reused; a clean stop removes it.
    s.kill9();
    assert!(sock.exists());
    let mut s = Server::start_in(Arc::clone(&sb), &listen, &[]);
    assert_eq!(s.client().get("/v1/health").status, 200);
    // A second server on a live socket refuses to start.
    let out = sb.run(&["serve", "--listen", &listen]);
    assert!(!out.success(), "{out:#?}");
    assert!(out.stderr.contains("another server"), "{out:#?}");
    s.terminate();
    assert!(!sock.exists());
    // A path that is not a socket is never replaced.
    let file = sb.dir().join("plain");
    std::fs::write(&file, b"keep").unwrap();
    let out = sb.run(&["serve", "--listen", &format!("unix:{}", file.display())]);
    assert!(!out.success(), "{out:#?}");
    assert_eq!(std::fs::read(&file).unwrap(), b"keep");
}

#[test]
fn request_log_is_json_lines_without_secrets() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let v = c.start_job(json!({"command": "echo x", "secretEnv": {"SEC": "very-secret-value"}}));
    let id = id_of(&v);
    c.get(&format!("/v1/jobs/{id}?limit=1"));
    c.get("/v1/nope?password=hunter2");
    let log = eventually(LONG, "the log lines", || {
        let l = s.log_text();
        (l.lines().count() >= 4).then_some(l)
    });
    for line in log.lines() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}"));
        assert!(v.is_object());
    }
    assert!(!log.contains("very-secret-value"));
    assert!(!log.contains("hunter2"));
    assert!(!log.contains(&s.token));
    let start: Value = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v["route"] == "/v1/jobs" && v["method"] == "POST")
        .unwrap();
    assert_eq!(start["status"], 200);
    assert_eq!(start["jobId"], id.as_str());
    assert!(start["ms"].is_number());
}

#[test]
fn serve_as_pid_1_reaps_orphans() {
    // Needs root for a PID namespace; skip cleanly elsewhere.
    let ok = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skip_root("cannot create a PID namespace here");
        return;
    }
    let sb = Sandbox::new();
    let home = sb.home();
    let mut unshare = sb.command("unshare");
    unshare
        .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(BIN)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = sb.spawn(unshare);
    let mut first = String::new();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    std::io::BufRead::read_line(&mut err, &mut first).unwrap();
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    let v: Value = serde_json::from_str(&first).unwrap();
    assert_eq!(v["pid"], 1);
    let addr = v["address"].as_str().unwrap().to_string();
    let token = std::fs::read_to_string(home.join("agent.token"))
        .unwrap()
        .trim()
        .to_string();
    let mut c = Client::connect(&addr).token(&token);
    for _ in 0..5 {
        let v = c.start_job(json!({"command": "echo pid1"}));
        assert_eq!(v["output"], "pid1\n");
    }
    // The server's host pid is unshare's child; no zombie may linger under it.
    let unshare_pid = child.id();
    let serve_pid = eventually(LONG, "the serve process", || {
        let kids =
            std::fs::read_to_string(format!("/proc/{unshare_pid}/task/{unshare_pid}/children"))
                .ok()?;
        kids.split_whitespace().next()?.parse::<u32>().ok()
    });
    eventually(LONG, "no zombies under PID 1", || {
        let tasks = std::fs::read_dir(format!("/proc/{serve_pid}/task")).ok()?;
        let zombies = tasks
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
            .flat_map(|k| k.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .filter(|k| !alive(k.parse().unwrap()))
            .count();
        (zombies == 0).then_some(())
    });
    assert_eq!(c.get("/v1/health").status, 200);
    kill(serve_pid as i32, libc::SIGTERM);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

#[test]
fn secret_values_never_come_back() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let secret = "s3cr3t-value-for-redaction";
    let v = c.start_job(
        json!({"command": format!("echo \"$TOK\"; echo {secret}"), "secretEnv": {"TOK": secret}}),
    );
    let id = id_of(&v);
    assert_eq!(v["output"], "[redacted]\n[redacted]\n");
    let answers = [
        c.get(&format!("/v1/jobs/{id}")).text(),
        c.get(&format!("/v1/jobs/{id}/output")).text(),
        c.get("/v1/jobs").text(),
        serde_json::to_string(&v).unwrap(),
    ];
    for a in answers {
        assert!(!a.contains(secret), "{a}");
    }
    assert!(!s.log_text().contains(secret));
}

/// The fork server keeps a supervisor forked ahead and hands it to `serve`, which gives a
/// start straight to it. A spare killed while it waits, and then the fork server itself,
/// must cost no start: the ones after find the spare dead and have one forked at once,
/// and once the server is gone supervisors are exec'd (`supervise` on their command line).
#[test]
fn starts_go_through_a_killed_spare_and_a_killed_fork_server() {
    let s = Server::start(&[]);
    let mut c = s.client();
    // Each start's supervisor: forked (the command line is serve's) or exec'd.
    let run = |c: &mut Client, n: usize| -> Vec<bool> {
        (0..n)
            .map(|i| {
                let cmd = format!("sleep 0.3; echo {i}");
                let v = c.start_job(json!({"command": cmd, "waitSeconds": 0}));
                let sup = int(&v, "supervisorPid");
                let line = std::fs::read(format!("/proc/{sup}/cmdline")).unwrap_or_default();
                let exec_d = any_entry_contains(&line, b"supervise");
                assert!(exec_d || any_entry_contains(&line, b"serve"), "{v}");
                let end = c
                    .get(&format!("/v1/jobs/{}?waitSeconds=30", id_of(&v)))
                    .json();
                assert_eq!(end["status"], "succeeded", "{end}");
                assert_eq!(end["output"], format!("{i}\n"), "{end}");
                exec_d
            })
            .collect()
    };
    assert_eq!(run(&mut c, 2), [false, false]);
    let forks = eventually(Duration::from_secs(10), "the fork server", || {
        children_named(s.pid() as i32, "gitterm-forks")
            .first()
            .copied()
    });
    let spare = eventually(Duration::from_secs(10), "a spare", || {
        children_named(forks, "gitterm-spare").first().copied()
    });
    kill(spare, libc::SIGKILL);
    eventually(Duration::from_secs(10), "the spare gone", || {
        (!children_named(forks, "gitterm-spare").contains(&spare)).then_some(())
    });
    assert_eq!(run(&mut c, 4), [false; 4]);
    kill(forks, libc::SIGKILL);
    eventually(Duration::from_secs(10), "the fork server gone", || {
        children_named(s.pid() as i32, "gitterm-forks")
            .is_empty()
            .then_some(())
    });
    // A spare offered before the kill may take the first; then every one is exec'd.
    let after = run(&mut c, 4);
    assert!(after[1..].iter().all(|&e| e), "{after:?}");
}
