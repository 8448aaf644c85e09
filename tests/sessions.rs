//! Sessions: a folder and variables that carry from one command to the next, while every
//! command is a job of its own. Real dash and bash, a real Python venv, the awkward values
//! a variable can hold, commands that end every way (exit, `set -e`, timeout, cancel,
//! `kill -9` of their shell), two starts racing, `serve` killed between commands, the CLI
//! and the API on one session, a job user's session, and secrets copied around.

use std::sync::Arc;

use crate::util::*;

/// Makes a session over the API and returns its id.
fn session(c: &mut Client, body: Value) -> String {
    let r = c.post("/v1/sessions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert!(text(&v, "id").starts_with("ses_"), "{v}");
    text(&v, "id").to_string()
}

/// Runs one command of a session and waits for its end.
fn run(c: &mut Client, sid: &str, command: &str) -> Value {
    run_with(c, sid, json!({ "command": command }))
}

fn run_with(c: &mut Client, sid: &str, mut body: Value) -> Value {
    body["waitSeconds"] = json!(120);
    let r = c.post(&format!("/v1/sessions/{sid}/jobs"), &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["sessionId"], sid, "{v:#}");
    assert_ne!(v["status"], "running", "{v:#}");
    v
}

fn output(v: &Value) -> &str {
    text(v, "output")
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The awkward values: every one must come back byte for byte.
const AWKWARD: &[&str] = &[
    "",
    "two words",
    "  lead and trail  ",
    "it's",
    "\"double\"",
    "'",
    "''''",
    "line1\nline2\n",
    "\n",
    "$HOME $(id) `id` ${x}",
    "back\\slash\\\\ \\n \\'",
    "a=b=c",
    "café € 😀",
    "tab\there\r\u{1}\u{1b}[31m",
    "*?[a-z] ~ & ; | < > ( ) { } # !",
    "-n",
    "--",
];

/// Sets every awkward value (given for this command only, through `env`) as a plain and an
/// exported variable, then reads them back in a later command, as hex, plain and exported
/// (the exported one from a child process).
fn carries_awkward_values(shell: &str) {
    let s = Server::start(&[]);
    let mut c = s.client();
    let sid = session(&mut c, json!({ "shell": shell }));
    let mut env = serde_json::Map::new();
    let mut set = String::new();
    for (i, v) in AWKWARD.iter().enumerate() {
        env.insert(format!("IN_{i}"), json!(v));
        set.push_str(&format!("P_{i}=$IN_{i}; export X_{i}=\"$IN_{i}\"; "));
    }
    // Not UTF-8, so not sendable in JSON: made by the shell.
    set.push_str("P_bin=$(printf '\\377\\376 x'); export X_bin=\"$P_bin\"");
    let first = run_with(&mut c, &sid, json!({ "command": set, "env": env }));
    assert_eq!(first["sessionSaved"], true, "{first:#}");
    let mut read = String::new();
    for i in (0..AWKWARD.len())
        .map(|i| i.to_string())
        .chain(["bin".into()])
    {
        read.push_str(&format!(
            "printf 'P_{i}=%s X_{i}=%s C_{i}=%s\\n' \"$(printf %s \"${{P_{i}-UNSET}}\" | od -An -v -tx1 | tr -d ' \\n')\" \
             \"$(printf %s \"${{X_{i}-UNSET}}\" | od -An -v -tx1 | tr -d ' \\n')\" \
             \"$(sh -c 'printf %s \"${{X_{i}-UNSET}}\"' | od -An -v -tx1 | tr -d ' \\n')\"; \
             sh -c 'test \"${{P_{i}+set}}\" = set && echo P_{i} leaked'; "
        ));
    }
    let second = run(&mut c, &sid, &read);
    let out = output(&second);
    assert!(
        !out.contains("leaked"),
        "an unexported variable reached a child:\n{out}"
    );
    let mut right = 0;
    let mut values: Vec<(String, Vec<u8>)> = AWKWARD
        .iter()
        .enumerate()
        .map(|(i, v)| (i.to_string(), v.as_bytes().to_vec()))
        .collect();
    values.push(("bin".into(), b"\xff\xfe x".to_vec()));
    for (i, v) in &values {
        let want = hex(v);
        let line = format!("P_{i}={want} X_{i}={want} C_{i}={want}");
        if out.lines().any(|l| l == line) {
            right += 1;
        } else {
            eprintln!("value {i} ({v:?}) did not carry: want {line}");
        }
    }
    assert_eq!(
        right,
        values.len(),
        "{shell}: {right}/{} carried:\n{out}",
        values.len()
    );
}

#[test]
fn dash_carries_every_awkward_value_exactly() {
    carries_awkward_values("sh");
}

#[test]
fn bash_carries_every_awkward_value_exactly() {
    carries_awkward_values("bash");
}

#[test]
fn folder_exports_and_unsets_carry_and_the_bookkeeping_never_shows() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let work = s.sb.work().to_str().unwrap().to_string();
    std::fs::create_dir(s.sb.file("sub dir")).unwrap();
    let sid = session(
        &mut c,
        json!({ "cwd": work, "env": { "START": "1", "GONE": "x" } }),
    );
    let v = c.get(&format!("/v1/sessions/{sid}")).json();
    assert_eq!(v["envNames"], json!(["GONE", "START"]), "{v}");
    assert_eq!(v["busy"], Value::Null);
    let first = run(
        &mut c,
        &sid,
        "cd 'sub dir'; export A=1; B=2; unset GONE; echo \"0=$0 ?=$?\"",
    );
    assert_eq!(output(&first), "0=/bin/sh ?=0\n");
    let second = run(
        &mut c,
        &sid,
        "pwd; echo \"A=$A B=$B GONE=${GONE-unset} START=$START\"; sh -c 'echo child A=$A B=${B-unset}'",
    );
    assert_eq!(
        output(&second),
        format!("{work}/sub dir\nA=1 B=2 GONE=unset START=1\nchild A=1 B=unset\n")
    );
    // `exit N` and a `set -e` failure save too, and the status is the command's own.
    let exit = run(&mut c, &sid, "export E=exited; exit 3");
    assert_eq!(
        (exit["exitCode"].as_i64(), &exit["sessionSaved"]),
        (Some(3), &json!(true))
    );
    let sete = run(&mut c, &sid, "set -e; export F=sete; false; echo never");
    assert_eq!(sete["exitCode"], 1);
    assert_eq!(sete["sessionSaved"], true);
    // A trace shows the command, and nothing of the session's own.
    let traced = run(&mut c, &sid, "set -x; echo \"$E $F\"; (exit 4)");
    assert_eq!(
        output(&traced),
        "+ echo exited sete\nexited sete\n+ exit 4\n"
    );
    assert_eq!(traced["exitCode"], 4);
    // The request's env is for this command only.
    let once = run_with(
        &mut c,
        &sid,
        json!({"command": "echo \"$A $ONCE\"", "env": {"A": "request", "ONCE": "o"}}),
    );
    assert_eq!(output(&once), "request o\n");
    let after = run(&mut c, &sid, "echo \"$A ${ONCE-unset}\"");
    assert_eq!(output(&after), "1 unset\n");
    let v = c.get(&format!("/v1/sessions/{sid}")).json();
    assert_eq!(v["cwd"], format!("{work}/sub dir"));
    assert_eq!(v["lastJobId"], after["id"]);
    let names: Vec<&str> = v["envNames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    for n in ["A", "B", "E", "F", "START"] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    assert!(
        !names.contains(&"GONE") && !names.contains(&"ONCE"),
        "{names:?}"
    );
    // Names only: no value in any answer.
    assert!(!c.get("/v1/sessions").text().contains("sete"));
}

#[test]
fn special_and_readonly_variables_do_not_break_the_next_command() {
    let s = Server::start(&[]);
    let mut c = s.client();
    for shell in ["sh", "bash"] {
        let sid = session(&mut c, json!({ "shell": shell }));
        let first = run(
            &mut c,
            &sid,
            "readonly R=1; RANDOM=5; LINENO=3; SHLVL=9; OPTIND=4; _=x; IFS=': '; \
             OLDPWD=/; PS4='>> '; echo ok",
        );
        assert_eq!(output(&first), "ok\n", "{shell}: {first:#}");
        let next = run(
            &mut c,
            &sid,
            "echo \"R=$R\"; R=2; [ \"$R\" = 2 ] && [ \"$RANDOM$RANDOM$RANDOM\" != 555 ] && [ \"$SHLVL\" != 9 ] && [ \"$IFS\" = ': ' ] && echo fresh",
        );
        assert_eq!(next["status"], "succeeded", "{shell}: {next:#}");
        assert_eq!(output(&next), "R=1\nfresh\n", "{shell}");
    }
}

#[test]
fn bash_carries_functions_aliases_and_a_real_venv() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let work = s.sb.work().to_str().unwrap().to_string();
    let sid = session(&mut c, json!({ "shell": "bash", "cwd": work }));
    let first = run(
        &mut c,
        &sid,
        "greet() { echo \"hello $1\"; }; alias ll='echo listed'; echo \"$0\"",
    );
    assert_eq!(output(&first), "/bin/bash\n");
    let second = run(&mut c, &sid, "greet there; ll");
    assert_eq!(output(&second), "hello there\nlisted\n", "{second:#}");

    let venv = run_with(
        &mut c,
        &sid,
        json!({"command": "python3 -m venv .venv && . .venv/bin/activate && echo \"$VIRTUAL_ENV\"",
               "timeoutSeconds": 300}),
    );
    if venv["exitCode"] != 0 && output(&venv).contains("ensurepip") {
        return skip("python3 -m venv cannot install pip here (no ensurepip)");
    }
    assert_eq!(output(&venv), format!("{work}/.venv\n"), "{venv:#}");
    let used = run(
        &mut c,
        &sid,
        "which python; pip --version; type deactivate | head -1",
    );
    let out = output(&used);
    assert!(
        out.starts_with(&format!("{work}/.venv/bin/python\n")),
        "{out}"
    );
    assert!(out.contains(&format!("{work}/.venv/lib/")), "{out}");
    assert!(out.contains("deactivate is a function"), "{out}");
    let off = run(&mut c, &sid, "deactivate; echo \"${VIRTUAL_ENV-none}\"");
    assert_eq!(output(&off), "none\n", "{off:#}");
    let after = run(
        &mut c,
        &sid,
        "which python3; declare -F deactivate || echo no function",
    );
    assert!(!output(&after).contains(".venv"), "{after:#}");
    assert!(output(&after).ends_with("no function\n"), "{after:#}");
}

#[test]
fn a_command_ended_by_timeout_cancel_or_kill_leaves_the_session_as_it_was() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let sid = session(&mut c, json!({}));
    run(&mut c, &sid, "export KEEP=before; cd /tmp");
    let timed = run_with(
        &mut c,
        &sid,
        json!({"command": "export KEEP=timeout; cd /; sleep 30", "timeoutSeconds": 0.5}),
    );
    assert_eq!(timed["status"], "timed_out");
    assert_eq!(timed["sessionSaved"], false, "{timed:#}");

    let r = c.post(
        &format!("/v1/sessions/{sid}/jobs"),
        &json!({"command": "export KEEP=cancel; cd /; sleep 30", "background": true}),
    );
    let id = text(&r.json(), "id").to_string();
    let cancelled = c.post(&format!("/v1/jobs/{id}/cancel"), &json!({})).json();
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancelled["sessionSaved"], false);

    // The command's own shell killed: no state of its is saved.
    let r = c.post(
        &format!("/v1/sessions/{sid}/jobs"),
        &json!({"command": "export KEEP=killed; cd /; kill -9 $$", "waitSeconds": 60}),
    );
    let killed = r.json();
    assert_eq!(killed["signal"], "SIGKILL", "{killed:#}");
    assert_eq!(killed["sessionSaved"], false);

    // The latest command is the one that was not saved, and nothing of it is left over.
    let v = c.get(&format!("/v1/sessions/{sid}")).json();
    assert_eq!(v["lastJobId"], killed["id"], "{v:#}");
    let folder = s.home.join("sessions").join(&sid);
    let names = || {
        let mut n: Vec<String> = std::fs::read_dir(&folder)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            // The file the next state is written into before it is swapped in.
            .filter(|n| n != ".state.json.next")
            .collect();
        n.sort();
        n
    };
    eventually(PROMPT, "the session folder to hold its two files", || {
        (names() == ["session.json", "state.json"]).then_some(())
    });
    let now = run(&mut c, &sid, "echo \"$KEEP $PWD\"");
    assert_eq!(output(&now), "before /tmp\n");
}

#[test]
fn two_starts_at_once_run_one_and_refuse_the_other_naming_it() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let sid = session(&mut c, json!({}));
    let path = format!("/v1/sessions/{sid}/jobs");
    let body = json!({"command": "sleep 30", "background": true});
    let answers: Vec<Resp> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let (addr, token, path, body) = (&s.addr, &s.token, &path, &body);
                sc.spawn(move || Client::connect(addr).token(token).post(path, body))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok: Vec<&Resp> = answers.iter().filter(|r| r.status == 200).collect();
    let refused: Vec<&Resp> = answers.iter().filter(|r| r.status == 409).collect();
    assert_eq!(
        (ok.len(), refused.len()),
        (1, 1),
        "{:?}",
        answers.iter().map(Resp::text).collect::<Vec<_>>()
    );
    let running = text(&ok[0].json(), "id").to_string();
    assert_eq!(refused[0].code(), "conflict");
    assert!(
        refused[0].text().contains(&running),
        "{}",
        refused[0].text()
    );
    let v = c.get(&format!("/v1/sessions/{sid}")).json();
    assert_eq!(v["busy"], running);
    // The CLI refuses too, naming it.
    let cli = s.sb.run(&["exec", "--session", &sid, "--", "true"]);
    assert!(!cli.success());
    assert!(cli.stderr.contains(&running), "{}", cli.stderr);
    // Removing the session cancels its command.
    let r = c.call("DELETE", &format!("/v1/sessions/{sid}"), None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(s.sb.status(&running)["status"], "cancelled");
    assert_eq!(c.get(&format!("/v1/sessions/{sid}")).status, 404);
}

#[test]
fn a_session_survives_serve_killed_between_commands_and_the_cli_shares_it() {
    let mut s = Server::start(&[]);
    let mut c = s.client();
    let sid = session(&mut c, json!({"cwd": "/tmp"}));
    run(&mut c, &sid, "export FROM_API='api value'; cd /usr");
    s.kill9();
    // Meanwhile the CLI, with no server, runs the next command of the same session.
    let out = s.sb.run(&[
        "exec",
        "--session",
        &sid,
        "--",
        "echo \"$FROM_API\"; pwd; export FROM_CLI=yes",
    ]);
    assert!(out.success(), "{}", out.stderr);
    assert_eq!(out.stdout, "api value\n/usr\n");
    let listed = s.sb.run(&["session", "list"]);
    assert!(
        listed.stdout.contains(&sid) && listed.stdout.contains("/usr"),
        "{}",
        listed.stdout
    );
    let s2 = Server::start_in(Arc::clone(&s.sb), "127.0.0.1:0", &[]);
    let mut c2 = s2.client();
    let v = run(&mut c2, &sid, "echo \"$FROM_API/$FROM_CLI\"");
    assert_eq!(output(&v), "api value/yes\n");
    let all = c2.get("/v1/sessions").json();
    assert_eq!(all["sessions"][0]["id"], sid);
    let rm = s2.sb.run(&["session", "rm", &sid]);
    assert!(rm.success(), "{}", rm.stderr);
    assert_eq!(c2.get(&format!("/v1/sessions/{sid}")).status, 404);
}

#[test]
fn the_cli_makes_sessions_and_refuses_bad_ids() {
    let sb = Sandbox::new();
    let new = sb.run(&["session", "new", "--shell", "bash", "--cwd", "/tmp"]);
    assert!(new.success(), "{}", new.stderr);
    let sid = new.stdout.trim().to_string();
    let a = sb.run(&[
        "exec",
        "--session",
        &sid,
        "--",
        "f() { echo f; }; X=1; cd /",
    ]);
    assert!(a.success(), "{}", a.stderr);
    let (out, v) = sb.exec_json(&["--session", &sid, "--", "f; echo $X; pwd"]);
    assert!(out.success(), "{}", out.stderr);
    assert_eq!(v["output"], "f\n1\n/\n");
    assert_eq!(v["sessionSaved"], true);
    for bad in ["../../etc", "ses_0123456789abcdef0123"] {
        let r = sb.run(&["exec", "--session", bad, "--", "true"]);
        assert!(!r.success());
        assert!(r.stderr.contains("no session"), "{}", r.stderr);
    }
    let r = sb.run(&["exec", "--session", &sid, "--cwd", "/", "--", "true"]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
}

#[test]
fn leftovers_end_with_the_command() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let sid = session(&mut c, json!({}));
    let v = run(&mut c, &sid, "sleep 100 & echo $!; export AFTER=1");
    assert_eq!(v["sessionSaved"], true);
    let pid: i32 = output(&v).trim().parse().unwrap();
    eventually(PROMPT, "the background sleep to end", || {
        (!std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|st| st.contains(") Z")))
        .then_some(())
    });
    assert_eq!(output(&run(&mut c, &sid, "echo $AFTER")), "1\n");
}

#[test]
fn no_secret_value_becomes_session_state() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let sid = session(&mut c, json!({"shell": "bash"}));
    let secret = "sk-session-secret-4242";
    let v = run_with(
        &mut c,
        &sid,
        json!({
            "command": "COPY=$TOKEN; export WRAPPED=\"x${TOKEN}y\"; B64=$(printf %s \"$TOKEN\" | base64); \
                        TOKEN=changed; leak() { echo sk-session-secret-4242; }; export FINE=ok",
            "secretEnv": {"TOKEN": secret}
        }),
    );
    assert_eq!(v["sessionSaved"], true, "{v:#}");
    let reason = text(&v, "reason");
    for n in ["COPY", "WRAPPED", "B64", "functions"] {
        assert!(reason.contains(n), "{n} not named in {reason}");
    }
    assert!(!reason.contains(secret));
    let found = files_holding(&s.home, secret);
    assert!(found.is_empty(), "the secret is in {found:?}");
    let next = run(
        &mut c,
        &sid,
        "echo \"${COPY-unset} ${WRAPPED-unset} ${B64-unset} ${TOKEN-unset} $FINE\"; declare -F leak || echo no leak",
    );
    assert_eq!(output(&next), "unset unset unset unset ok\nno leak\n");
}

#[test]
fn a_job_users_session_is_unreadable_to_that_user() {
    let Some((u, sb)) = user_and_sandbox("session") else {
        return;
    };
    let s = Server::start_in(sb, "127.0.0.1:0", &["--job-user", &u.name]);
    let mut c = s.client();
    let sid = session(&mut c, json!({}));
    let state = s.home.join("sessions").join(&sid).join("state.json");
    let v = run(&mut c, &sid, "export MINE=private-value; id -un");
    assert_eq!(output(&v), format!("{}\n", u.name));
    assert!(
        std::fs::read_to_string(&state)
            .unwrap()
            .contains("private-value")
    );
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&state).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    let peek = run(
        &mut c,
        &sid,
        &format!("echo \"$MINE\"; cat '{}' || echo refused", state.display()),
    );
    let out = output(&peek);
    assert!(out.starts_with("private-value\n"), "{out}");
    assert!(
        out.ends_with("refused\n") && !out.contains("\"vars\""),
        "{out}"
    );
}

#[test]
fn exec_and_a_bash_trace_fd_are_handled_and_a_retry_gets_the_same_command() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let sid = session(&mut c, json!({"shell": "bash"}));
    run(&mut c, &sid, "export KEEP=before");
    // A command that replaces its shell saves nothing, and says so.
    let exec = run(&mut c, &sid, "export KEEP=exec; exec true");
    assert_eq!(exec["status"], "succeeded");
    assert_eq!(exec["sessionSaved"], false);
    assert!(text(&exec, "reason").contains("exec"), "{exec:#}");
    // Tracing to a descriptor of its own (bash's BASH_XTRACEFD) shows only the command.
    let traced = run(
        &mut c,
        &sid,
        "exec {fd}>&1; BASH_XTRACEFD=$fd; set -x; echo \"$KEEP\"; exec 7>&1; BASH_XTRACEFD=7; echo two",
    );
    assert_eq!(
        output(&traced),
        "+ echo before\nbefore\n+ exec\n+ BASH_XTRACEFD=7\n+ echo two\ntwo\n",
        "{traced:#}"
    );
    // The same key and request: the same job, not a second command nor a conflict.
    let body = json!({"command": "cd /; export N=$((N+1))", "waitSeconds": 30});
    let path = format!("/v1/sessions/{sid}/jobs");
    let mut keyed = || {
        c.send(
            "POST",
            &path,
            &[("Idempotency-Key", "ses-retry-1")],
            Some(body.to_string().as_bytes()),
        )
        .json()
    };
    let first = keyed();
    let again = keyed();
    assert_eq!(first["id"], again["id"]);
    let other = c.send(
        "POST",
        &path,
        &[("Idempotency-Key", "ses-retry-1")],
        Some(json!({"command": "true"}).to_string().as_bytes()),
    );
    assert_eq!(other.status, 409, "{}", other.text());
    assert_eq!(output(&run(&mut c, &sid, "echo \"$N $PWD\"")), "1 /\n");
}

#[test]
fn the_scoped_token_keeps_to_its_own_user() {
    let Some((u, sb)) = user_and_sandbox("sesscope") else {
        return;
    };
    let scoped_file = sb.dir().join("scoped.token");
    write_mode(&scoped_file, "scoped-token-sessions-0123456789\n", 0o600);
    let s = Server::start_in(
        sb,
        "127.0.0.1:0",
        &["--scoped-token-file", scoped_file.to_str().unwrap()],
    );
    let mut full = s.client();
    let mut scoped = s.client().token("scoped-token-sessions-0123456789");
    let theirs = session(&mut full, json!({"user": u.name}));
    let r = scoped.post(
        &format!("/v1/sessions/{theirs}/jobs"),
        &json!({"command": "id"}),
    );
    assert_eq!(r.status, 403, "{}", r.text());
    let r = scoped.post("/v1/sessions", &json!({"user": u.name}));
    assert_eq!(r.status, 403, "{}", r.text());
    let r = scoped.call("DELETE", &format!("/v1/sessions/{theirs}"), None);
    assert_eq!(r.status, 403, "{}", r.text());
    // Its own session works, as the user its jobs run as.
    let mine = session(&mut scoped, json!({}));
    let v = run(&mut scoped, &mine, "export A=1; echo ok");
    assert_eq!(output(&v), "ok\n");
    let v = run(&mut full, &theirs, "id -un");
    assert_eq!(output(&v), format!("{}\n", u.name));
}

/// A test user and a sandbox that user can enter (its folder 0755); `None` where no test
/// user can be made.
fn user_and_sandbox(name: &str) -> Option<(TestUser, Arc<Sandbox>)> {
    let u = TestUser::create(name)?;
    let sb = Arc::new(Sandbox::new());
    std::fs::set_permissions(
        sb.dir(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    Some((u, sb))
}
