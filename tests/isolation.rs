//! Jobs against each other and the scoped caller against the full one: each test is the
//! attack, run as the attacker would (a job of a real user, a scoped client).
//!
//! - A job reads another running job's secret from `/proc/<pid>/environ` and prints it:
//!   the output holds `[redacted]`, in output.log and the API.
//! - A job opens another terminal job's `/dev/pts/N`: refused, while the terminal job's
//!   own `tty`, `/dev/tty` and full-screen programs still work.
//! - A scoped token names a root-only secrets file: refused.
//! - A scoped token persists a `PATH` into a folder its job user writes: a later root job
//!   never gets it.
//! - A request spells a secret, encoded, in a field stored in the clear: refused.
//! - `POST /v1/env` sets the job marker: refused.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use crate::util::*;

const SCOPED: &str = "scoped-token-isolation-0123456789";

fn id_of(v: &Value) -> String {
    text(v, "id").to_string()
}

/// Lets a job user reach the sandbox's folders (its root is 0700 by default).
fn open_the_way(sb: &Sandbox) {
    fs::set_permissions(sb.dir(), fs::Permissions::from_mode(0o755)).unwrap();
}

/// A server whose jobs run as `user` (when given), with the scoped token [`SCOPED`].
fn server(user: Option<&TestUser>) -> Server {
    let sb = Arc::new(Sandbox::new());
    open_the_way(&sb);
    let scoped = sb.dir().join("scoped.token");
    write_mode(&scoped, &format!("{SCOPED}\n"), 0o600);
    let mut flags = vec!["--scoped-token-file", scoped.to_str().unwrap()];
    if let Some(u) = user {
        flags.extend(["--job-user", u.name.as_str()]);
    }
    let flags: Vec<String> = flags.into_iter().map(String::from).collect();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Server::start_in(sb, "127.0.0.1:0", &flags)
}

fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= c.len() {
                out.push(A[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn assert_refused(r: &Resp, status: u16, code: &str) {
    assert_eq!(
        (r.status, r.code().as_str()),
        (status, code),
        "{}",
        r.text()
    );
}

// ---------------------------------------------------------------------------------------
// §16: the job marker cannot be persisted.
// ---------------------------------------------------------------------------------------

#[test]
fn the_job_marker_cannot_be_persisted() {
    let s = server(None);
    let mut c = s.client();
    let r = c.post("/v1/env", &json!({"set": {"KEEP": "1"}}));
    assert_eq!(r.status, 200, "{}", r.text());
    let forged = "job_00000000000000000000";
    let r = c.post(
        "/v1/env",
        &json!({"set": {"GITTERM_JOB_ID": forged, "OTHER": "x"}}),
    );
    assert_refused(&r, 400, "invalid");
    assert!(r.text().contains("GITTERM_JOB_ID"), "{}", r.text());
    // Nothing changed, and a job still carries its own marker.
    assert_eq!(c.get("/v1/env").json()["names"], json!(["KEEP"]));
    let r = c.post(
        "/v1/jobs",
        &json!({"command": "echo \"$GITTERM_JOB_ID\"", "waitSeconds": 30}),
    );
    let v = r.json();
    assert_eq!(text(&v, "output"), format!("{}\n", id_of(&v)));
}

// ---------------------------------------------------------------------------------------
// §11: a secret in any masked spelling is refused where a request is stored as given.
// ---------------------------------------------------------------------------------------

#[test]
fn an_encoded_secret_in_cwd_or_the_idempotency_key_is_refused() {
    let s = server(None);
    let mut c = s.client();
    let secret = "cwd key secret 5d1e";
    let secrets = json!({"TOKEN": secret});
    let b64 = base64(secret.as_bytes());
    let percent = secret.replace(' ', "%20");
    let json_escaped = secret.replace(' ', "\\u0020");
    let link = s.sb.work().join("innocent");
    let mut cwds = Vec::new();
    for name in [b64.as_str(), &b64[..b64.len() - 2], &percent, &json_escaped] {
        let dir = s.sb.work().join(format!("under-{name}"));
        fs::create_dir(&dir).unwrap();
        cwds.push(dir);
    }
    // A harmless name that resolves to one that spells the secret.
    std::os::unix::fs::symlink(&cwds[0], &link).unwrap();
    cwds.push(link);
    for dir in &cwds {
        let r = c.post(
            "/v1/jobs",
            &json!({"command": "pwd", "cwd": dir.to_str().unwrap(), "secretEnv": secrets}),
        );
        assert_refused(&r, 400, "invalid");
        assert!(r.text().contains("TOKEN"), "{}", r.text());
        assert!(!r.text().contains(&b64[..16]), "{}", r.text());
    }
    let body = serde_json::to_vec(&json!({"command": "true", "secretEnv": secrets})).unwrap();
    for key in [format!("k-{b64}"), format!("k-{percent}")] {
        let r = c.send(
            "POST",
            "/v1/jobs",
            &[("Idempotency-Key", &key)],
            Some(&body),
        );
        assert_refused(&r, 400, "invalid");
        assert!(!r.text().contains(&b64[..16]), "{}", r.text());
    }
    // What does not spell it still works.
    let r = c.send(
        "POST",
        "/v1/jobs",
        &[("Idempotency-Key", "k-plain")],
        Some(&body),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(s.sb.job_ids().len(), 1);
    for needle in [&b64[..16], percent.as_str(), secret] {
        let found = files_holding(&s.home, needle);
        assert!(found.is_empty(), "{needle:?} was stored in {found:?}");
    }
}

// ---------------------------------------------------------------------------------------
// §3: a scoped token cannot have the agent read a file its job user could not.
// ---------------------------------------------------------------------------------------

#[test]
fn a_scoped_token_cannot_name_secret_files() {
    let Some(u) = TestUser::create("sfile") else {
        return;
    };
    let s = server(Some(&u));
    let file = s.sb.dir().join("root-only.env");
    let value = "root-only-secret-value-77";
    write_mode(&file, &format!("ROOT_ONLY={value}\n"), 0o600);
    let mut sc = Client::connect(&s.addr).token(SCOPED);
    let r = sc.post(
        "/v1/jobs",
        &json!({"command": "echo \"$ROOT_ONLY\" | base64", "secretFiles": [file.to_str().unwrap()],
                "waitSeconds": 30}),
    );
    assert_refused(&r, 403, "forbidden");
    assert!(r.text().contains("secretFiles"), "{}", r.text());
    assert!(s.sb.job_ids().is_empty(), "a refused start made a job");
    // The job user itself cannot read the file either: that is what was guarded.
    let r = sc.post(
        "/v1/jobs",
        &json!({"command": format!("cat '{}' || echo refused", file.display()), "waitSeconds": 30}),
    );
    assert!(
        text(&r.json(), "output").ends_with("refused\n"),
        "{}",
        r.text()
    );
    // What still works: the scoped token's secretEnv, the full token's secretFiles.
    let r = sc.post(
        "/v1/jobs",
        &json!({"command": "test \"$MINE\" = mine-value-1 && echo got", "secretEnv": {"MINE": "mine-value-1"},
                "waitSeconds": 30}),
    );
    assert_eq!(text(&r.json(), "output"), "got\n", "{}", r.text());
    let r = s.client().post(
        "/v1/jobs",
        &json!({"command": format!("test \"$ROOT_ONLY\" = {value} && echo got"),
                "secretFiles": [file.to_str().unwrap()], "waitSeconds": 30}),
    );
    let v = r.json();
    assert_eq!(text(&v, "output"), "got\n", "{v:#}");
    assert_eq!(v["user"], u.name.as_str());
}

// ---------------------------------------------------------------------------------------
// §4: what the scoped token persists never reaches a job of a more privileged user.
// ---------------------------------------------------------------------------------------

#[test]
fn a_path_persisted_by_the_scoped_token_never_reaches_a_root_job() {
    let Some(u) = TestUser::create("path") else {
        return;
    };
    let s = server(Some(&u));
    let mut sc = Client::connect(&s.addr).token(SCOPED);
    let mut full = s.client();
    let bin = u.home.join("bin");
    let hook = u.home.join("hook.sh");
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display());
    // The full token's own variable: every job gets it, and the scoped one cannot touch it.
    assert_eq!(
        full.post("/v1/env", &json!({"set": {"SITE": "full"}}))
            .status,
        200
    );
    let r = sc.post(
        "/v1/env",
        &json!({"set": {"PATH": path, "BASH_ENV": hook.to_str().unwrap(), "ENV": hook.to_str().unwrap()}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    for change in [
        json!({"set": {"SITE": "scoped"}}),
        json!({"unset": ["SITE"]}),
        json!({"set": {"X": "1"}, "replace": true}),
    ] {
        let r = sc.post("/v1/env", &change);
        assert_refused(&r, 403, "forbidden");
        assert!(r.text().contains("SITE"), "{}", r.text());
    }
    // The scoped caller's job (as the job user) plants programs where its PATH looks first.
    let plant = "mkdir -p ~/bin && for p in ls id cat sh bash; do \
                 printf '#!/bin/sh\\necho PLANTED-$(/usr/bin/id -u)\\n' > ~/bin/$p; chmod +x ~/bin/$p; done; \
                 echo 'echo PLANTED-BASH_ENV-$(/usr/bin/id -u)' > ~/hook.sh; \
                 echo \"$PATH|$SITE\"; ls";
    let r = sc.post("/v1/jobs", &json!({"command": plant, "waitSeconds": 30}));
    let v = r.json();
    assert_eq!(v["user"], u.name.as_str());
    // Its own jobs do get what it set (that is what it set it for).
    assert_eq!(
        text(&v, "output"),
        format!("{path}|full\nPLANTED-{}\n", u.uid),
        "{v:#}"
    );
    // A later full-token job as root: none of it.
    let r = full.post(
        "/v1/jobs",
        &json!({"command": "echo \"path=$PATH|site=$SITE|bash_env=$BASH_ENV\"; ls / >/dev/null && id -u; bash -c 'echo bash'",
                "user": "root", "waitSeconds": 30}),
    );
    let v = r.json();
    let out = text(&v, "output");
    assert!(
        !out.contains("PLANTED"),
        "a root job ran the job user's program:\n{out}"
    );
    assert!(!out.contains(bin.to_str().unwrap()), "{out}");
    assert!(out.contains("|site=full|bash_env=\n0\nbash\n"), "{out}");
    // Nor a job of another user the full token chose.
    let r = full.post(
        "/v1/jobs",
        &json!({"command": "echo \"$PATH\"", "user": "nobody", "cwd": "/", "waitSeconds": 30}),
    );
    let out = text(&r.json(), "output").to_string();
    assert!(!out.contains(bin.to_str().unwrap()), "{out}");
}

// ---------------------------------------------------------------------------------------
// §2: jobs of one user are one trust domain, but the agent never hands back another
// job's secret, and no job opens another's terminal.
// ---------------------------------------------------------------------------------------

fn output_log(s: &Server, id: &str) -> String {
    fs::read_to_string(s.home.join("jobs").join(id).join("output.log")).unwrap_or_default()
}

fn wait_log(s: &Server, id: &str, needle: &str) -> String {
    eventually(PROMPT, &format!("{needle:?} in the output of {id}"), || {
        let t = output_log(s, id);
        t.contains(needle).then_some(t)
    })
}

#[test]
fn a_job_that_prints_another_jobs_secret_from_proc_gets_redacted() {
    let Some(u) = TestUser::create("environ") else {
        return;
    };
    let s = server(Some(&u));
    let mut c = s.client();
    let secret = "neighbours secret/value-4c21";
    let b64 = base64(format!("VICTIM={secret}").as_bytes());
    // What a thief prints: the value plain, in base64, and percent-encoded by a program.
    let steal = "tr '\\0' '\\n' < /proc/$P/environ | grep '^VICTIM=' > stolen.$$; \
                 cat stolen.$$; base64 -w0 < stolen.$$; echo; \
                 sed 's/ /%20/g; s|/|%2F|g' stolen.$$; rm stolen.$$";
    let home = u.home.display().to_string();
    // One that started (and printed) before the victim existed...
    let early = c.start_job(
        json!({"command": format!("echo ready; while [ ! -e {home}/go ]; do sleep 0.05; done; \
                                   P=$(cat {home}/go); {steal}; echo end"),
               "background": true, "timeoutSeconds": 60}),
    );
    let early_id = id_of(&early);
    wait_log(&s, &early_id, "ready\n");
    let victim = c.start_job(
        json!({"command": "sleep 60", "secretEnv": {"VICTIM": secret}, "background": true}),
    );
    let victim_id = id_of(&victim);
    let pid = victim["pid"].as_i64().expect("the victim's pid");
    // ... one that copies it silently while the victim runs and prints it after it ended...
    let silent = c.start_job(json!({"command": format!("P={pid}; tr '\\0' '\\n' < /proc/$P/environ | grep '^VICTIM=' > copied; \
                                   echo copied > copied.done; \
                                   while [ ! -e {home}/go2 ]; do sleep 0.05; done; cat copied; rm copied*"),
               "background": true, "timeoutSeconds": 60}),
    );
    let silent_id = id_of(&silent);
    // ... and one started while the victim runs.
    let late =
        c.start_job(json!({"command": format!("P={pid}; {steal}; echo end"), "waitSeconds": 30}));
    fs::write(u.home.join("go"), pid.to_string()).unwrap();
    eventually(PROMPT, "the silent copy", || {
        u.home.join("copied.done").exists().then_some(())
    });
    let early = c.get(&format!("/v1/jobs/{early_id}?waitSeconds=30")).json();
    let r = c.post(&format!("/v1/jobs/{victim_id}/cancel"), &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    fs::write(u.home.join("go2"), "").unwrap();
    let silent = c
        .get(&format!("/v1/jobs/{silent_id}?waitSeconds=30"))
        .json();
    for v in [&early, &late, &silent] {
        let id = id_of(v);
        assert_eq!(v["status"], "succeeded", "{v:#}");
        let api = text(v, "output").to_string();
        let log = output_log(&s, &id);
        for out in [&api, &log] {
            assert!(!out.contains(secret), "the secret came back:\n{out}");
            assert!(!out.contains(&b64[8..24]), "its base64 came back:\n{out}");
            assert!(!out.contains("neighbours%20secret"), "{out}");
            assert!(out.contains("VICTIM=[redacted]"), "{out}");
        }
        // The page API and the log endpoint read the same stored bytes.
        let page = c.get(&format!("/v1/jobs/{id}/output?offset=0"));
        assert!(!page.text().contains(secret), "{}", page.text());
    }
    assert!(
        text(&early, "output").contains(&"[redacted]".to_string())
            && text(&early, "output").ends_with("end\n"),
        "{early:#}"
    );
}

#[test]
fn no_job_opens_another_jobs_terminal() {
    let Some(u) = TestUser::create("pts") else {
        return;
    };
    let s = server(Some(&u));
    let mut c = s.client();
    let home = u.home.display().to_string();
    fs::write(u.home.join("page.txt"), "a page for less\n").unwrap();
    // A terminal job that uses its terminal every way a program does.
    let a = c.start_job(
        json!({"command": format!("tty > {home}/a.tty; echo \"own=$(tty)\"; stty size; tput cols; \
                                   echo via-dev-tty > /dev/tty; printf 'Password: ' > /dev/tty; \
                                   IFS= read -r line < /dev/tty; echo \"got:$line\"; \
                                   less {home}/page.txt; \
                                   vi -c 'call setline(1, \"from-vi\")' -c 'wq' {home}/vi.txt; \
                                   cat {home}/vi.txt; echo end"),
               "pty": {"cols": 100, "rows": 30}, "background": true, "timeoutSeconds": 60}),
    );
    let a_id = id_of(&a);
    // The prompt itself has no newline yet: what precedes it says the job got there.
    wait_log(&s, &a_id, "via-dev-tty\n");
    let pts = fs::read_to_string(u.home.join("a.tty")).unwrap();
    let pts = pts.trim();
    assert!(pts.starts_with("/dev/pts/"), "{pts}");
    // Another job of the same user reaches for it: read, write, both, and by /dev/tty's
    // trick of a fresh open through /proc.
    let shell_pid = a["pid"].as_i64().unwrap();
    let attack = format!(
        "for m in '<' '>' '<>'; do if (eval \"exec 3$m{pts}\") 2>/dev/null; then echo \"OPENED $m\"; \
         else echo \"refused $m\"; fi; done; \
         if (echo forged > /proc/{shell_pid}/fd/1) 2>/dev/null; then echo OPENED-proc; else echo refused-proc; fi; \
         chmod 666 {pts} 2>/dev/null && echo OPENED-chmod || echo refused-chmod"
    );
    let b = c.start_job(json!({"command": attack, "waitSeconds": 30}));
    assert_eq!(b["user"], u.name.as_str());
    assert_eq!(
        text(&b, "output"),
        "refused <\nrefused >\nrefused <>\nrefused-proc\nrefused-chmod\n",
        "{b:#}"
    );
    // A's own terminal still works: answer the prompt, leave less.
    let r = c.send(
        "POST",
        &format!("/v1/jobs/{a_id}/stdin"),
        &[],
        Some(b"typed-line\n"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    wait_log(&s, &a_id, "got:typed-line");
    eventually(PROMPT, "less to show its page", || {
        output_log(&s, &a_id)
            .contains("a page for less")
            .then_some(())
    });
    let r = c.send("POST", &format!("/v1/jobs/{a_id}/stdin"), &[], Some(b"q"));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = c.get(&format!("/v1/jobs/{a_id}?waitSeconds=30")).json();
    assert_eq!(v["status"], "succeeded", "{v:#}");
    let log = output_log(&s, &a_id);
    for want in [
        &format!("own={pts}\n") as &str,
        "30 100\n",
        "100\n",
        "via-dev-tty\n",
        "from-vi\nend\n",
    ] {
        assert!(log.contains(want), "{want:?} missing from:\n{log}");
    }
    assert!(!log.contains("forged"), "{log}");
}
