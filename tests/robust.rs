//! Robustness against jobs and callers that try to wedge or fool the agent, each test
//! written as its attacker would: a writer whose input a job never reads, a job that
//! kills its supervisor and keeps its lock, one that stops the fork server every start
//! goes through, and a job that plants terminal escapes where the command line prints.

use std::fs;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::util::*;

/// The id of a job object.
fn id_of(v: &Value) -> String {
    text(v, "id").to_string()
}

// ---------------------------------------------------------------------------------------
// The command line prints no control character a job chose.
// ---------------------------------------------------------------------------------------

/// Escapes a terminal acts on: a title change with its bell, clear screen, a C1 CSI,
/// a right-to-left override and a zero-width space.
const EVIL: &str = "\x1b]0;pwned\x07\x1b[2J\u{9b}31m\u{202e}\u{200b}";

/// The first character of `s` that would drive or fool a terminal (line ends are the
/// printer's own).
fn first_hidden(s: &str) -> Option<char> {
    s.chars().find(|&c| {
        (c.is_control() && c != '\n')
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200b}')
    })
}

fn assert_printable(what: &str, out: &Out) {
    for (name, s) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        assert!(
            first_hidden(s).is_none(),
            "{what} printed {:?} on {name}: {s:?}",
            first_hidden(s)
        );
    }
}

#[test]
fn the_command_line_prints_no_escape_a_job_put_in_its_record() {
    let sb = Sandbox::new();
    let cwd = sb.file(&format!("dir{EVIL}"));
    fs::create_dir(&cwd).unwrap();
    let cwd_arg = cwd.to_str().unwrap();
    let (out, v) = sb.exec_json(&[
        "--cwd",
        cwd_arg,
        "--",
        &format!("echo '{EVIL}' > /dev/null; exit 3"),
    ]);
    assert_eq!(out.code, Some(3), "{out:#?}");
    let id = id_of(&v);
    assert!(text(&v, "command").contains(EVIL) && text(&v, "cwd").contains(EVIL));
    // As a job running as root can, the record is rewritten with escapes in every field
    // the command line prints.
    let mut rec = sb.raw_record(&id);
    for f in ["reason", "createdAt", "startedAt", "endedAt", "signal"] {
        rec[f] = format!("x{EVIL}y").into();
    }
    rec["exitCode"] = Value::Null;
    fs::write(sb.job_dir(&id).join("job.json"), rec.to_string()).unwrap();
    // And a folder that is no record names itself with them.
    fs::create_dir(sb.home().join("jobs").join("job_0000000000000000c0de")).unwrap();
    for args in [
        vec!["status", &id],
        vec!["status"],
        vec!["cancel", &id],
        vec!["logs", &id],
        vec!["events"],
    ] {
        let out = sb.run(&args);
        assert_printable(&format!("{args:?}"), &out);
        assert!(out.code.is_some(), "{out:#?}");
    }
    let shown = sb.run(&["status", &id]);
    assert!(
        shown.stdout.contains("\\u{1b}]0;pwned\\u{7}"),
        "the escape is shown, not dropped: {}",
        shown.stdout
    );
    // A message quoting what the caller gave (a cwd that is not there) is shown too.
    let missing = format!("{}/no{EVIL}", sb.work().display());
    let out = sb.run(&["exec", "--cwd", &missing, "--", "true"]);
    assert_ne!(out.code, Some(0), "{out:#?}");
    assert_printable("exec --cwd <missing>", &out);
    // Its JSON keeps the bytes exactly (escaped by JSON itself).
    let j = sb.status(&id);
    assert!(text(&j, "command").contains(EVIL), "{j:#}");
}

// ---------------------------------------------------------------------------------------
// A job that stops the fork server holds no later start.
// ---------------------------------------------------------------------------------------

/// How long a start may take here: well under the 30 s a stopped fork server once held
/// each start for, and under the harness's [`PROMPT`], so a start that waits for the
/// server to be continued fails the test while a loaded machine does not.
const START_BOUND: Duration = Duration::from_secs(10);

/// Starts `command` through the API and checks that the start answered within
/// [`START_BOUND`] with the job's end.
fn start_promptly(s: &Server, command: &str) -> Value {
    let mut c = s.client();
    c.r.get_ref().set_timeout(START_BOUND);
    let t = Instant::now();
    let r = c.post("/v1/jobs", &json!({"command": command, "waitSeconds": 5}));
    assert!(
        t.elapsed() < START_BOUND,
        "the start took {:?}",
        t.elapsed()
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    s.sb.remember(text(&v, "id"));
    v
}

/// The fork server of `serve` (its child named for `ps`).
fn fork_server(s: &Server) -> i32 {
    let found = children_named(s.pid() as i32, "gitterm-forks");
    assert_eq!(found.len(), 1, "one fork server under serve: {found:?}");
    found[0]
}

#[test]
fn a_job_that_stops_the_fork_server_holds_no_later_start() {
    if !is_root() {
        skip_root("not root, so jobs cannot signal the fork server");
        return;
    }
    let s = Server::start(&[]);
    let fs = fork_server(&s);
    // As a root job can: stop the spare the next start is to be handed to (forked once
    // this job's own start took the one before).
    let v = start_promptly(
        &s,
        &format!(
            "i=0; while [ $i -lt 500 ]; do for p in $(ps -o pid= --ppid {fs}); do \
             [ \"$(cat /proc/$p/comm)\" = gitterm-spare ] && kill -STOP $p && exit 0; done; \
             i=$((i+1)); sleep 0.01; done; exit 1"
        ),
    );
    assert_eq!(v["status"], "succeeded", "no spare to stop: {v:#}");
    for i in 0..2 {
        let v = start_promptly(&s, &format!("echo past a stopped spare {i}"));
        assert_eq!(v["status"], "succeeded", "{v:#}");
        assert_eq!(
            text(&v, "output"),
            format!("past a stopped spare {i}\n"),
            "{v:#}"
        );
    }
    // And the server every start but the spare it holds goes through.
    let v = start_promptly(&s, &format!("kill -STOP {fs}"));
    assert_eq!(v["status"], "succeeded", "{v:#}");
    eventually(PROMPT, "the fork server to be stopped", || {
        matches!(proc_state(fs), Some('T') | Some('t') | None).then_some(())
    });
    for i in 0..4 {
        let v = start_promptly(&s, &format!("echo start {i}"));
        assert_eq!(v["status"], "succeeded", "{v:#}");
        assert_eq!(text(&v, "output"), format!("start {i}\n"), "{v:#}");
    }
    // The stopped server was given up: ended, and reaped (no zombie for serve's life).
    eventually(
        PROMPT,
        "the stopped fork server to be ended and reaped",
        || proc_state(fs).is_none().then_some(()),
    );
    // And one that keeps stopping it and the spare supervisors it forks ahead (each of
    // which a start is handed to) while starts go on.
    let serve = s.pid();
    let stopper = start_promptly(
        &s,
        &format!(
            "while :; do for f in $(ps -o pid= --ppid {serve}); do \
             [ \"$(cat /proc/$f/comm)\" = gitterm-forks ] || continue; kill -STOP $f; \
             for p in $(ps -o pid= --ppid $f); do \
             [ \"$(cat /proc/$p/comm)\" = gitterm-spare ] && kill -STOP $p; done; done; \
             sleep 0.01; done > /dev/null 2>&1 & echo started"
        ),
    );
    assert_eq!(stopper["status"], "succeeded", "{stopper:#}");
    for i in 0..4 {
        let v = start_promptly(&s, &format!("echo again {i}"));
        assert_eq!(v["status"], "succeeded", "{v:#}");
    }
    // The stopper is a process of its job: ended by the guard's cancel is not enough (the
    // job has ended), so end it here as its owner would.
    kill_job_processes(text(&stopper, "id"));
}

// ---------------------------------------------------------------------------------------
// A job's input arrives exactly once, however slowly the job reads it.
// ---------------------------------------------------------------------------------------

/// 1.5 MB in which every 8-byte word names its own offset: a byte delivered twice, lost
/// or moved shows as a word out of place.
fn numbered(len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len.div_ceil(8))
        .flat_map(|i| format!("{:07x}\n", i * 8).into_bytes())
        .collect();
    v.truncate(len);
    v
}

/// Where two byte strings first differ (for a failure that says where).
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or((a.len() != b.len()).then(|| a.len().min(b.len())))
}

/// `POST /v1/jobs/{id}/stdin` with `body`, written by a thread of its own while the answer
/// is read (a server that answers before it read the whole body is not deadlocked by
/// this client), as a client that streams a large input would.
fn post_stdin(s: &Server, id: &str, body: &[u8], close: bool) -> (Resp, Duration) {
    let path = format!(
        "/v1/jobs/{id}/stdin{}",
        if close { "?close=true" } else { "" }
    );
    let mut c = s.client();
    c.r.get_ref().set_timeout(LONG);
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        s.token,
        body.len()
    );
    let mut req = head.into_bytes();
    req.extend_from_slice(body);
    let mut w = match c.r.get_ref() {
        crate::util::http::Conn::Tcp(t) => t.try_clone().unwrap(),
        crate::util::http::Conn::Unix(_) => unreachable!("the server listens on TCP"),
    };
    let t = Instant::now();
    let writer = std::thread::spawn(move || {
        // A server that stops reading closes the connection: the rest is not sent.
        let _ = std::io::Write::write_all(&mut w, &req);
    });
    let mut r = c.read_response().expect("an answer to the stdin request");
    let took = t.elapsed();
    r.checked = crate::util::schema::check_answer("POST", &path, &r)
        .unwrap_or_else(|e| panic!("POST {path}: {e}"));
    drop(c);
    writer.join().unwrap();
    (r, took)
}

/// Starts an interactive job running `command` and returns its id.
fn interactive(s: &Server, command: &str) -> String {
    let r = s.client().post(
        "/v1/jobs",
        &json!({"command": command, "interactive": true, "background": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let id = text(&r.json(), "id").to_string();
    s.sb.remember(&id);
    id
}

/// Waits for the job's end and returns its record.
fn ended(s: &Server, id: &str) -> Value {
    let v = s
        .client()
        .get(&format!("/v1/jobs/{id}?waitSeconds=60"))
        .json();
    assert_ne!(v["status"], "running", "{v:#}");
    v
}

/// Checks that `file` holds exactly `want`.
fn assert_exact(file: &std::path::Path, want: &[u8]) {
    let got = fs::read(file).unwrap_or_default();
    assert!(
        got == want,
        "{} holds {} bytes of {}; first difference at byte {:?}",
        file.display(),
        got.len(),
        want.len(),
        first_difference(&got, want)
    );
}

#[test]
fn a_large_input_reaches_a_slow_reader_exactly_once() {
    let s = Server::start(&[]);
    let body = numbered(1_500_000);
    // Reads 32 KiB at a time with a pause between: far slower than the body arrives, so
    // the supervisor's 1 MiB fills and the request waits for the job as it goes.
    let slow = interactive(
        &s,
        "while :; do n=$(dd bs=32768 count=1 iflag=fullblock 2>/dev/null | tee -a slow.bin | wc -c); \
         [ \"$n\" -eq 0 ] && break; sleep 0.02; done",
    );
    // Reads nothing for 3 s (the body is in by then), then all of it.
    let late = interactive(&s, "sleep 3; cat > late.bin");
    for (id, file) in [(&slow, "slow.bin"), (&late, "late.bin")] {
        let (r, took) = post_stdin(&s, id, &body, true);
        assert_eq!(r.status, 200, "after {took:?}: {}", r.text());
        assert_eq!(r.json(), json!({"ok": true}));
        let v = ended(&s, id);
        assert_eq!(v["status"], "succeeded", "{v:#}");
        assert_exact(&s.sb.file(file), &body);
    }
}

#[test]
fn an_input_the_job_never_reads_is_answered_with_what_was_delivered() {
    let s = Server::start(&[]);
    let body = numbered(1_500_000);
    // Reads nothing until told to, then copies its stdin.
    let id = interactive(&s, "while [ ! -e go ]; do sleep 0.05; done; cat > got.bin");
    let (r, took) = post_stdin(&s, &id, &body, true);
    // The supervisor keeps 1 MiB, the pipe some more: the rest waits for a reader that
    // never comes, and the answer (after the 10 s the route waits) says how far it got.
    assert_eq!(r.status, 429, "after {took:?}: {}", r.text());
    let err = &r.json()["error"];
    assert_eq!(err["code"], "rate_limited", "{err:#}");
    let delivered = err["delivered"]
        .as_u64()
        .unwrap_or_else(|| panic!("no delivered count in {err:#}"));
    assert!(
        delivered > 0 && delivered < body.len() as u64,
        "delivered {delivered} of {}: {err:#}",
        body.len()
    );
    assert!(
        text(err, "message").contains(&delivered.to_string()),
        "{err:#}"
    );
    // The job now reads; the client resumes from where the answer said, and the job has
    // every byte exactly once.
    fs::write(s.sb.file("go"), "").unwrap();
    let (r, took) = post_stdin(&s, &id, &body[delivered as usize..], true);
    assert_eq!(r.status, 200, "after {took:?}: {}", r.text());
    let v = ended(&s, &id);
    assert_eq!(v["status"], "succeeded", "{v:#}");
    assert_exact(&s.sb.file("got.bin"), &body);
    // A write to an ended job delivered nothing, and says so.
    let (r, _) = post_stdin(&s, &id, b"more", false);
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(r.json()["error"]["delivered"], 0, "{}", r.text());
}

// ---------------------------------------------------------------------------------------
// A job that kills its supervisor and keeps its lock is settled at once, truthfully.
// ---------------------------------------------------------------------------------------

/// How long a listing or a read of a job whose supervisor is dead may take here: above the
/// README's 2 s for a loaded machine, below the 8 s a listing took while each of its two
/// reads of such a job waited 2 s, swept, and waited 2 s more.
const READ_BOUND: Duration = Duration::from_secs(5);

/// A root job that kills its supervisor once a process of its own waits for the job's
/// folder lock (which it then holds; with `escape` that process clears the job's marker
/// first, so no sweep finds it), keeping a marked `sleep` for the sweep to end. `lock` is
/// the file it locks, relative to the job's folder (`.`: the folder, the supervisor's
/// lock). It waits for its folder first: that is renamed into place once the shell runs,
/// and `flock` would make a file of that name before. Returns the job's id, the holder's
/// pid and the sleeper's pid.
fn lock_thief(s: &Server, lock: &str, escape: bool) -> (String, i32, i32) {
    let unmark = if escape { "env -u GITTERM_JOB_ID " } else { "" };
    let command = format!(
        "D={}/jobs/$GITTERM_JOB_ID; L=$D/{lock}; \
         while [ ! -d \"$D\" ]; do sleep 0.01; done; \
         {unmark}flock \"$L\" sh -c 'echo $$ > locked.pid; exec sleep 600' & \
         sleep 600 & echo $! > sleeper.pid; \
         sleep 0.3; kill -9 $PPID; wait",
        s.home.display()
    );
    let r = s.client().post(
        "/v1/jobs",
        &json!({"command": command, "background": true, "timeoutSeconds": 300}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let id = id_of(&v);
    s.sb.remember(&id);
    let holder = s.sb.pid_from("locked.pid");
    let sleeper = s.sb.pid_from("sleeper.pid");
    let sup = int(&v, "supervisorPid");
    eventually(PROMPT, "the supervisor to be gone", || {
        matches!(proc_state(sup), None | Some('Z')).then_some(())
    });
    (id, holder, sleeper)
}

/// `GET path` within [`READ_BOUND`].
fn get_promptly(s: &Server, path: &str) -> Value {
    let mut c = s.client();
    c.r.get_ref().set_timeout(Duration::from_secs(30));
    let t = Instant::now();
    let r = c.get(path);
    assert!(
        t.elapsed() < READ_BOUND,
        "GET {path} took {:?}",
        t.elapsed()
    );
    assert_eq!(r.status, 200, "GET {path}: {}", r.text());
    r.json()
}

/// The listing's entry for job `id`.
fn listed(list: &Value, id: &str) -> Value {
    list["jobs"]
        .as_array()
        .and_then(|j| j.iter().find(|e| e["id"] == id))
        .unwrap_or_else(|| panic!("{id} is not listed: {list:#}"))
        .clone()
}

fn thief_is_settled_at_once(sb: Sandbox, escape: bool) {
    if !is_root() {
        skip_root("not root, so a job cannot kill its supervisor");
        return;
    }
    let s = Server::start_in(Arc::new(sb), "127.0.0.1:0", &[]);
    let (id, holder, sleeper) = lock_thief(&s, ".", escape);
    // The first reader is a listing: it settles the job, however the lock is held.
    let list = get_promptly(&s, "/v1/jobs");
    let entry = listed(&list, &id);
    assert_eq!(entry["status"], "lost", "{entry:#}");
    assert!(entry.get("unsettled").is_none(), "{entry:#}");
    let rec = get_promptly(&s, &format!("/v1/jobs/{id}"));
    assert_eq!(rec["status"], "lost", "{rec:#}");
    let reason = text(&rec, "reason");
    // What was ended is counted and named: the sleeper at least, never "0".
    assert!(!alive(sleeper.into()), "the sweep left the sleeper alive");
    assert!(
        !reason.contains(" 0 remaining") && reason.contains(&format!("{sleeper} sleep")),
        "the reason does not own up to what was ended: {reason}"
    );
    if escape {
        assert!(
            alive(holder.into()),
            "the holder should have escaped the sweep"
        );
        // The lock is `flock`'s, the parent of the shell that wrote its pid.
        let flock = fs::read_to_string(format!("/proc/{holder}/stat"))
            .ok()
            .and_then(|st| {
                st.rsplit(')')
                    .next()?
                    .split_whitespace()
                    .nth(1)?
                    .parse::<i32>()
                    .ok()
            })
            .expect("the holder's parent");
        assert!(
            reason.contains(&format!("held by process {flock} flock"))
                && reason.contains("left running"),
            "the reason does not name the lock holder left running: {reason}"
        );
        // Ours to end, now that the agent could not find them by marker or cgroup.
        for p in [holder, flock] {
            kill(p, libc::SIGKILL);
            eventually(PROMPT, "the escaped processes to die", || {
                (!alive(p.into())).then_some(())
            });
        }
    } else {
        eventually(PROMPT, "the holder to be ended with its job", || {
            (!alive(holder.into())).then_some(())
        });
        assert!(
            reason.contains(&holder.to_string()) && !reason.contains("left running"),
            "{reason}"
        );
    }
    // And the command line reads it as quickly.
    let t = Instant::now();
    let out = s.sb.run(&["status"]);
    assert!(t.elapsed() < READ_BOUND, "status took {:?}", t.elapsed());
    assert!(out.stdout.contains(&format!("{id}  lost")), "{out:#?}");
}

#[test]
fn a_job_that_kills_its_supervisor_and_holds_its_lock_is_lost_at_once() {
    thief_is_settled_at_once(Sandbox::new(), false);
}

#[test]
fn a_lock_holder_that_escaped_the_sweep_is_named_and_the_job_is_lost_at_once() {
    // Without a cgroup, clearing the marker is enough to escape the sweep.
    thief_is_settled_at_once(Sandbox::without_cgroup(), true);
}

#[test]
fn a_listing_says_what_it_could_not_settle_and_a_read_settles_it() {
    if !is_root() {
        skip_root("not root, so a job cannot kill its supervisor");
        return;
    }
    let s = Server::start(&[]);
    // The job holds the lock the readers settle under, and kills its supervisor.
    let (id, holder, _) = lock_thief(&s, ".settle.lock", false);
    let list = get_promptly(&s, "/v1/jobs");
    let entry = listed(&list, &id);
    assert_eq!(entry["status"], "running", "{entry:#}");
    assert!(
        text(&entry, "unsettled").contains("another reader is settling"),
        "{entry:#}"
    );
    let out = s.sb.run(&["status"]);
    assert!(
        out.stdout.contains(&format!("{id}  running*"))
            && out.stdout.contains(&format!("* {id}: ")),
        "{out:#?}"
    );
    // One job's read waits its 2 s, then settles the job anyway.
    let rec = get_promptly(&s, &format!("/v1/jobs/{id}"));
    assert_eq!(rec["status"], "lost", "{rec:#}");
    assert!(rec.get("unsettled").is_none(), "{rec:#}");
    eventually(PROMPT, "the holder to be ended with its job", || {
        (!alive(holder.into())).then_some(())
    });
}

#[test]
fn input_reaches_the_job_as_it_arrives_not_when_the_body_ends() {
    let s = Server::start(&[]);
    let id = interactive(&s, "cat");
    let mut c = s.client();
    c.r.get_ref().set_timeout(LONG);
    // A chunked body whose first line comes now and whose end comes only once the job
    // has shown that line: a request that waits for more of the body first never ends.
    let head = format!(
        "POST /v1/jobs/{id}/stdin?close=true HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n\
         6\r\nfirst\n\r\n",
        s.token
    );
    c.write_raw(head.as_bytes()).unwrap();
    let log = s.home.join("jobs").join(&id).join("output.log");
    eventually(PROMPT, "the first line in the job's output", || {
        fs::read_to_string(&log)
            .ok()?
            .contains("first\n")
            .then_some(())
    });
    c.write_raw(b"5\r\nlast\n\r\n0\r\n\r\n").unwrap();
    let r = c.read_response().expect("an answer");
    assert_eq!(r.status, 200, "{}", r.text());
    let v = ended(&s, &id);
    assert_eq!(text(&v, "output"), "first\nlast\n", "{v:#}");
}
