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
use std::path::{Path, PathBuf};
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

/// Every file under `dir` whose bytes hold `needle`.
fn files_holding(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => todo.push(path),
                Ok(t) if t.is_file() => {
                    let data = fs::read(&path).unwrap_or_default();
                    if data.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                        found.push(path);
                    }
                }
                _ => {}
            }
        }
    }
    found
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
