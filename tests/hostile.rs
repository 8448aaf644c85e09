//! Hostile jobs and callers, each test written as the attacker would: a job that runs as
//! its own user and tries to reach the agent, one that stops or kills its supervisor, takes
//! its lock, leaves its cgroup, clears its marker, forks without end or leaves a zombie
//! leader with a live thread; a record planted to make a reader kill elsewhere; requests
//! that smuggle a secret into what is stored in the clear, forge the job marker, or pass
//! what the kernel would refuse.
//!
//! Where a test needs what the machine may lack (root, a writable cgroup v2, gcc,
//! python3), it calls the harness's `skip` (or `skip_root`) and skips that part.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::util::*;

/// Seconds from the record's time field `from` to its time field `to`.
fn span(rec: &Value, from: &str, to: &str) -> f64 {
    let t =
        |f: &str| epoch_ms(text(rec, f)).unwrap_or_else(|| panic!("{f} is not a time in {rec:#}"));
    (t(to) - t(from)) as f64 / 1000.0
}

/// Runs a command with a deadline of its own (shorter than the harness's): what must
/// not hang fails the test once `within` has passed.
fn run_within(sb: &Sandbox, mut c: Command, within: Duration) -> Out {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = sb.spawn(c);
    sb.finish(child, within)
}

/// A client whose reads give up after `within` (the request then fails the test).
fn client_within(s: &Server, within: Duration) -> Client {
    let c = s.client();
    c.r.get_ref().set_timeout(within);
    c
}

/// Waits until the process is stopped (`T`).
fn wait_stopped(pid: i32, what: &str) {
    eventually(PROMPT, what, || {
        matches!(proc_state(pid), Some('T') | Some('t')).then_some(())
    });
}

/// Polls the record on disk, which (unlike every reader) never continues a stopped
/// supervisor, until the job has ended.
fn wait_final_on_disk(sb: &Sandbox, id: &str, within: Duration) -> Value {
    eventually(within, &format!("job {id}'s record to be final"), || {
        let v: Value =
            serde_json::from_slice(&fs::read(sb.job_dir(id).join("job.json")).ok()?).ok()?;
        (v["status"] != "running").then_some(v)
    })
}

/// The id of a job object.
fn id_of(v: &Value) -> String {
    text(v, "id").to_string()
}

/// Makes the folders down to the sandbox's state root traversable by anyone (as a
/// sandbox image's usually are), so that only the agent's own modes keep a job user out.
fn open_the_way(sb: &Sandbox) {
    fs::set_permissions(sb.dir(), fs::Permissions::from_mode(0o755)).unwrap();
}

// ---------------------------------------------------------------------------------------
// 1. Privilege separation: jobs that run as a user of their own.
// ---------------------------------------------------------------------------------------

#[test]
fn a_job_user_has_the_users_ids_groups_login_and_home() {
    let Some(u) = TestUser::create("id") else {
        return;
    };
    let sb = Sandbox::new();
    let script = "id -u; id -G; echo \"$HOME|$USER|$LOGNAME|$SHELL\"; pwd";
    let caller = |c: &mut Command| {
        // What the caller has must not leak into the job as its login.
        c.env("USER", "caller")
            .env("LOGNAME", "caller")
            .env("SHELL", "/caller/shell");
    };
    let mut c = sb.cmd(&["exec", "--json", "--job-user", &u.name, "--", script]);
    caller(&mut c);
    let out = sb.run_cmd(c);
    let v = out.json();
    sb.remember(text(&v, "id"));
    assert_eq!(v["status"], "succeeded", "{v:#}");
    let home = u.home.to_str().unwrap();
    let output = text(&v, "output");
    let lines: Vec<&str> = output.lines().collect();
    assert_eq!(lines.len(), 4, "{output}");
    assert_eq!(lines[0], u.uid.to_string(), "id -u");
    let mut groups: Vec<u32> = lines[1]
        .split_whitespace()
        .map(|g| g.parse().unwrap())
        .collect();
    groups.sort_unstable();
    let mut want = vec![u.gid, u.group_id];
    want.sort_unstable();
    assert_eq!(
        groups, want,
        "id -G: the primary and the supplementary group"
    );
    assert_eq!(
        lines[2],
        format!("{home}|{0}|{0}|/bin/bash", u.name),
        "HOME|USER|LOGNAME|SHELL"
    );
    assert_eq!(lines[3], home, "the job starts at the user's home");
    assert_eq!(v["cwd"], home);
    assert_eq!((&v["user"], &v["uid"]), (&json!(u.name), &json!(u.uid)));

    // GITTERM_JOB_USER names the user too; the job's own variables win over the login's;
    // a cwd given is kept.
    let mut c = sb.cmd(&[
        "exec",
        "--json",
        "--env",
        "HOME=/job/home",
        "--env",
        "SHELL=/job/shell",
        "--cwd",
        "/tmp",
        "--",
        "id -u; echo \"$HOME|$SHELL|$USER\"; pwd",
    ]);
    caller(&mut c);
    c.env("GITTERM_JOB_USER", &u.name);
    let v = sb.run_cmd(c).json();
    sb.remember(text(&v, "id"));
    assert_eq!(v["status"], "succeeded", "{v:#}");
    assert_eq!(
        text(&v, "output"),
        format!("{}\n/job/home|/job/shell|{}\n/tmp\n", u.uid, u.name)
    );
    assert_eq!(v["uid"], u.uid);
}

#[test]
fn a_job_user_cannot_stop_its_supervisor_and_times_out_on_time() {
    let Some(u) = TestUser::create("stop") else {
        return;
    };
    let sb = Sandbox::new();
    let v = sb.start(&[
        "--job-user",
        &u.name,
        "--timeout",
        "2",
        "--grace",
        "1",
        "--",
        "kill -STOP $PPID; echo \"kill exited $?\"; sleep 30",
    ]);
    let id = id_of(&v);
    let log = sb.job_dir(&id).join("output.log");
    eventually(PROMPT, "the job to try its kill", || {
        fs::read_to_string(&log)
            .ok()
            .filter(|t| t.contains("kill exited"))
    });
    let sup = int(&v, "supervisorPid");
    assert!(
        !matches!(proc_state(sup), Some('T') | Some('t')),
        "the job user stopped its supervisor"
    );
    // Nobody reads the job (a reader would continue a stopped supervisor): its own
    // supervisor must end it at its timeout.
    let rec = wait_final_on_disk(&sb, &id, PROMPT);
    assert_eq!(rec["status"], "timed_out", "{rec:#}");
    let output = fs::read_to_string(&log).unwrap();
    assert!(
        output.contains("Operation not permitted") && output.contains("kill exited 1"),
        "the kill should fail with EPERM: {output}"
    );
    // 2 s and the TERM; a stopped supervisor would have let the sleep run its 30 s.
    let took = span(&rec, "startedAt", "endedAt");
    assert!((1.9..6.0).contains(&took), "ended {took} s after its start");
}

#[test]
fn a_job_that_stops_every_process_of_its_user_cannot_hold_another_jobs_start() {
    let Some(u) = TestUser::create("hold") else {
        return;
    };
    let sb = Sandbox::new();
    // Job A stops every process its user may signal, over and over. A job of the same
    // user starting meanwhile can be stopped after its switch to the user and before its
    // exec, while its supervisor waits for that exec.
    let a = sb.start(&[
        "--job-user",
        &u.name,
        "--timeout",
        "120",
        "--",
        "while :; do kill -STOP -1 2>/dev/null; done",
    ]);
    let mut ended = 0;
    for _ in 0..40 {
        let out = sb.run(&[
            "exec",
            "--json",
            "--job-user",
            &u.name,
            "--timeout",
            "0.2",
            "--",
            "true",
        ]);
        // Every start comes back well inside the launcher's 30 s wait for its supervisor,
        // with a job that ended (stopped after its exec, it ends at its timeout).
        assert!(
            out.elapsed < Duration::from_secs(15),
            "a start took {:?}: {out:#?}",
            out.elapsed
        );
        let v = out.json();
        assert!(
            ["succeeded", "timed_out", "failed"].contains(&v["status"].as_str().unwrap_or("")),
            "{v:#}"
        );
        ended += 1;
    }
    assert_eq!(ended, 40);
    let _ = sb.run(&["cancel", &id_of(&a)]);
}

#[test]
fn a_job_user_cannot_read_the_agents_files_take_its_lock_or_leave_its_cgroup() {
    let Some(u) = TestUser::create("files") else {
        return;
    };
    let sb = Arc::new(Sandbox::new());
    open_the_way(&sb);
    let scoped = sb.dir().join("scoped.token");
    write_mode(&scoped, "scoped-token-for-the-user-test-0123\n", 0o600);
    let s = Server::start_in(
        Arc::clone(&sb),
        "127.0.0.1:0",
        &[
            "--job-user",
            &u.name,
            "--scoped-token-file",
            scoped.to_str().unwrap(),
        ],
    );
    let mut c = s.client();
    let r = c.post("/v1/env", &json!({"set": {"PERSISTED_NAME": "persisted"}}));
    assert_eq!(r.status, 200, "{}", r.text());
    // Another job of the same user, holding a secret.
    let secret = "other-jobs-secret-value-8f3a";
    let r = c.post(
        "/v1/jobs",
        &json!({"command": "sleep 30", "background": true, "secretEnv": {"OTHER": secret}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let other = id_of(&r.json());
    let root = s.home.to_str().unwrap().to_string();
    for f in ["agent.token", "env.json"] {
        assert!(s.home.join(f).exists(), "no {f} to attack");
    }
    let other_dir = format!("{root}/jobs/{other}");
    // Its secrets reached its supervisor in memory: there is no file of them to attack.
    assert!(!Path::new(&format!("{other_dir}/secrets.env")).exists());

    let mount = cgroup2_mount();
    let mut cgroup_files: Vec<PathBuf> = Vec::new();
    let scratch = ScratchCgroup::create("user");
    if let Some(m) = &mount {
        cgroup_files.push(m.join("cgroup.procs"));
        cgroup_files.push(m.join("gitterm").join("cgroup.procs"));
    }
    if let Some(cg) = &scratch {
        cgroup_files.push(cg.procs());
    }
    let mut script = String::from(
        "try() { if eval \"$2\" >/dev/null 2>&1; then echo \"ALLOWED $1\"; \
         else echo \"refused $1\"; fi; }\n\
         cat /proc/self/cgroup > cgroup.before\n",
    );
    for (name, cmd) in [
        ("token", format!("cat '{root}/agent.token'")),
        ("env", format!("cat '{root}/env.json'")),
        ("listing", format!("ls '{root}/jobs'")),
        ("record", format!("cat '{other_dir}/job.json'")),
        ("secrets", format!("cat '{other_dir}/secrets.env'")),
        (
            "own-record",
            format!("cat '{root}/jobs/'$GITTERM_JOB_ID/job.json"),
        ),
        (
            "lock",
            format!("flock -n '{root}/jobs/'$GITTERM_JOB_ID true"),
        ),
    ] {
        script.push_str(&format!("try {name} \"{cmd}\"\n"));
    }
    // Every cgroup.procs there is: writing one moves the shell out of the job's cgroup.
    if let Some(m) = &mount {
        script.push_str(&format!(
            "for f in $(find '{}' -maxdepth 4 -name cgroup.procs); do \
             if echo $$ > \"$f\"; then echo \"ALLOWED cgroup $f\"; fi; done 2>/dev/null\n",
            m.display()
        ));
    }
    for f in &cgroup_files {
        script.push_str(&format!(
            "try 'cgroup {0}' \"echo $$ > '{0}'\"\n",
            f.display()
        ));
    }
    script.push_str("cat /proc/self/cgroup > cgroup.after\necho done\n");
    let r = c.post(
        "/v1/jobs",
        &json!({"command": script, "timeoutSeconds": 30, "waitSeconds": 30}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["status"], "succeeded", "{v:#}");
    assert_eq!(v["user"], u.name.as_str());
    let output = text(&v, "output");
    assert!(output.ends_with("done\n"), "{output}");
    assert!(
        !output.contains("ALLOWED"),
        "the job user got through:\n{output}"
    );
    let refused = output.lines().filter(|l| l.starts_with("refused ")).count();
    assert_eq!(refused, 7 + cgroup_files.len(), "{output}");
    let before = fs::read_to_string(u.file("cgroup.before")).unwrap();
    let after = fs::read_to_string(u.file("cgroup.after")).unwrap();
    assert_eq!(before, after, "the job moved to another cgroup");
    match v["cgroup"].as_str() {
        Some(cg) => {
            let rel = before.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
            assert!(
                cg.ends_with(rel),
                "the job ran outside its cgroup {cg}: {before}"
            );
        }
        None => skip("the cgroup part: no cgroup v2 for jobs here"),
    }
    // The scoped token may not choose the user a job runs as.
    let mut sc = Client::connect(&s.addr).token("scoped-token-for-the-user-test-0123");
    for user in ["root", u.name.as_str()] {
        let r = sc.post("/v1/jobs", &json!({"command": "id -u", "user": user}));
        assert_eq!(
            (r.status, r.code().as_str()),
            (403, "forbidden"),
            "{}",
            r.text()
        );
    }
    let r = sc.post("/v1/jobs", &json!({"command": "id -u"}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["output"], format!("{}\n", u.uid));
    let all = c.get("/v1/jobs").json();
    assert_eq!(all["jobs"].as_array().unwrap().len(), 3, "{all:#}");
    let r = c.post(&format!("/v1/jobs/{other}/cancel"), &json!({}));
    assert_eq!(r.json()["status"], "cancelled");
}

#[test]
fn serve_names_its_isolation_and_warns_as_root_without_a_job_user() {
    let Some(u) = TestUser::create("iso") else {
        return;
    };
    let plain = Server::start(&[]);
    let warning = plain.started["warning"].as_str().unwrap_or_default();
    assert!(
        warning.contains("root") && warning.contains("--job-user"),
        "serve as root without a job user should warn in its first line: {}",
        plain.started
    );
    let mut c = plain.client();
    assert_eq!(c.get("/v1/sandbox").json()["isolation"], "none");
    // A job may still ask for a user of its own.
    let r = c.post("/v1/jobs", &json!({"command": "id -u", "user": u.name}));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["output"], format!("{}\n", u.uid), "{v:#}");
    assert_eq!((&v["user"], &v["uid"]), (&json!(u.name), &json!(u.uid)));
    let r = c.post(
        "/v1/jobs",
        &json!({"command": "true", "user": "no-such-user-here"}),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "invalid"),
        "{}",
        r.text()
    );

    let isolated = Server::start(&["--job-user", &u.name]);
    let started = &isolated.started;
    assert!(
        !started["warning"]
            .as_str()
            .unwrap_or_default()
            .contains("root"),
        "{started}"
    );
    assert_eq!(started["isolation"], "user", "{started}");
    let mut c = isolated.client();
    assert_eq!(c.get("/v1/sandbox").json()["isolation"], "user");
}

/// A fork bomb as the job user, bounded by the user's process limit, in a sandbox
/// with or without cgroups: serve keeps answering, and the timeout ends all of it.
fn fork_bomb(sb: Sandbox) {
    let Some(u) = TestUser::create("bomb") else {
        return;
    };
    let s = Server::start_in(Arc::new(sb), "127.0.0.1:0", &["--job-user", &u.name]);
    let mut c = s.client();
    let r = c.post(
        "/v1/jobs",
        &json!({
            // The shell stays (exec, no fork) while the bomb grows behind it.
            "command": "bash -c 'ulimit -u 300; bomb() { bomb | bomb & }; bomb; exec sleep 30'",
            "timeoutSeconds": 3,
            "background": true,
        }),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let id = id_of(&r.json());
    let mut health = Client::connect(&s.addr).unchecked();
    health.r.get_ref().set_timeout(Duration::from_secs(10));
    let started = Instant::now();
    let mut worst = Duration::ZERO;
    let mut most = 0;
    let mut samples = 0;
    let rec = loop {
        let t = Instant::now();
        let r = health.get("/v1/health");
        let took = t.elapsed();
        assert_eq!(r.status, 200, "{}", r.text());
        worst = worst.max(took);
        samples += 1;
        most = most.max(u.processes().len());
        let rec = s.sb.raw_record(&id);
        if rec["status"] != "running" {
            break rec;
        }
        assert!(started.elapsed() < LONG, "the bomb was never ended");
        std::thread::sleep(Duration::from_millis(100).saturating_sub(took));
    };
    assert_eq!(rec["status"], "timed_out", "{rec:#}");
    assert!(
        most > 50,
        "the bomb never took off ({most} processes at most)"
    );
    // Health answers in microseconds when idle; a second means the bomb starved serve.
    eprintln!("fork bomb: {most} processes at most; health worst {worst:?} over {samples} samples");
    assert!(
        worst < Duration::from_secs(1),
        "health took {worst:?} during the bomb ({samples} samples)"
    );
    // The supervisor records the end only when nothing of the job is left.
    let left = u.processes();
    assert!(
        left.is_empty(),
        "processes of the job user survived: {left:?}"
    );
}

#[test]
fn a_fork_bomb_under_the_users_process_limit_is_contained() {
    fork_bomb(Sandbox::new());
}

#[test]
fn a_fork_bomb_under_the_users_process_limit_is_contained_without_cgroup() {
    fork_bomb(Sandbox::without_cgroup());
}

// ---------------------------------------------------------------------------------------
// 2. Same user: a job that stops its supervisor.
// ---------------------------------------------------------------------------------------

#[test]
fn a_job_that_stops_its_supervisor_cannot_hang_exec() {
    let sb = Sandbox::new();
    for (when, command) in [
        ("at once", "kill -STOP $PPID; sleep 30"),
        ("after 0.5 s", "sleep 0.5; kill -STOP $PPID; sleep 30"),
        ("then exits", "kill -STOP $PPID; exit 3"),
    ] {
        let c = sb.cmd(&[
            "exec",
            "--json",
            "--timeout",
            "2",
            "--wait",
            "5",
            "--grace",
            "1",
            "--",
            command,
        ]);
        let out = run_within(&sb, c, Duration::from_secs(20));
        let v = out.json();
        sb.remember(text(&v, "id"));
        // 2 s of timeout and a TERM the sleep obeys: a supervisor left stopped would make
        // exec wait its whole 5 s and return the job still running.
        assert!(
            out.elapsed < Duration::from_secs(4),
            "{when}: exec took {:?}: {v:#}",
            out.elapsed
        );
        let took = span(&v, "startedAt", "endedAt");
        match v["status"].as_str() {
            Some("timed_out") => {
                assert_eq!(out.code, Some(124), "{when}: {out:#?}");
                assert!((1.9..4.0).contains(&took), "{when}: ran {took} s: {v:#}");
            }
            // Only a job that really ended before its deadline may say how it ended.
            Some("failed") if when == "then exits" => {
                assert_eq!(v["exitCode"], 3, "{v:#}");
                assert!(
                    took < 2.0,
                    "{when}: recorded its exit after {took} s: {v:#}"
                );
            }
            _ => panic!("{when}: {v:#}"),
        }
    }
}

#[test]
fn a_job_that_stops_its_supervisor_cannot_hang_the_api() {
    let s = Server::start(&[]);
    let body =
        json!({"command": "kill -STOP $PPID; sleep 30", "timeoutSeconds": 2, "waitSeconds": 10});
    let raw = serde_json::to_vec(&body).unwrap();
    let bound = Duration::from_secs(20);
    let t = Instant::now();
    let first = {
        let mut c = client_within(&s, bound);
        let raw = raw.clone();
        std::thread::spawn(move || {
            c.send(
                "POST",
                "/v1/jobs",
                &[("Idempotency-Key", "stopper")],
                Some(&raw),
            )
        })
    };
    // The retry arrives while the first request waits: once its job is listed.
    let mut c = client_within(&s, bound);
    eventually(PROMPT, "the first request's job to be listed", || {
        let v = c.get("/v1/jobs").json();
        v["jobs"].as_array().filter(|j| !j.is_empty()).map(|_| ())
    });
    let retry = c.send(
        "POST",
        "/v1/jobs",
        &[("Idempotency-Key", "stopper")],
        Some(&raw),
    );
    let first = first.join().unwrap();
    // The same 2 s and TERM as through exec: well under the 10 s the request may wait.
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(retry.status, 200, "{}", retry.text());
    let (a, b) = (first.json(), retry.json());
    assert_eq!(a["id"], b["id"], "one key, one job");
    for v in [&a, &b] {
        assert_eq!(v["status"], "timed_out", "{v:#}");
        let took = span(v, "startedAt", "endedAt");
        assert!((1.9..4.0).contains(&took), "ran {took} s: {v:#}");
    }
    let again = c
        .send(
            "POST",
            "/v1/jobs",
            &[("Idempotency-Key", "stopper")],
            Some(&raw),
        )
        .json();
    assert_eq!(
        (&again["id"], &again["status"]),
        (&a["id"], &json!("timed_out"))
    );

    // A cancel of a job that keeps stopping its supervisor (once started, so that this
    // is about the cancel) returns the final record.
    let r = c.post(
        "/v1/jobs",
        &json!({"command": KEEPS_STOPPING, "background": true}),
    );
    let v = r.json();
    let id = id_of(&v);
    wait_stopped(int(&v, "supervisorPid"), "the job to stop its supervisor");
    let t = Instant::now();
    let r = c.post(&format!("/v1/jobs/{id}/cancel"), &json!({}));
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "cancel took {:?}",
        t.elapsed()
    );
    assert_eq!(r.json()["status"], "cancelled", "{}", r.text());
}

/// Once started, stops its supervisor again and again.
const KEEPS_STOPPING: &str = "sleep 0.3; while :; do kill -STOP $PPID; sleep 0.05; done";

#[test]
fn cancel_ends_a_job_that_keeps_stopping_its_supervisor() {
    let sb = Sandbox::new();
    let v = sb.start(&["--grace", "1", "--", KEEPS_STOPPING]);
    let id = id_of(&v);
    wait_stopped(int(&v, "supervisorPid"), "the job to stop its supervisor");
    let out = run_within(
        &sb,
        sb.cmd(&["cancel", &id, "--json"]),
        Duration::from_secs(20),
    );
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert_eq!(out.json()["status"], "cancelled", "{out:#?}");
    assert!(out.elapsed < Duration::from_secs(5), "{out:#?}");
}

/// With `serve` running and nobody reading the job, its watchdog continues a stopped
/// supervisor every second, so the job ends within about a second and the grace of its
/// deadline. (The jobs stop their supervisor once started: one that does at once is
/// above.)
#[test]
fn serve_ends_a_job_whose_stopped_supervisor_nobody_reads() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let mut ids = Vec::new();
    for command in ["sleep 0.3; kill -STOP $PPID; sleep 30", KEEPS_STOPPING] {
        let r = c.post(
            "/v1/jobs",
            &json!({"command": command, "timeoutSeconds": 2, "background": true}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        ids.push((command, id_of(&r.json())));
    }
    for (command, id) in ids {
        let rec = wait_final_on_disk(&s.sb, &id, PROMPT);
        assert_eq!(rec["status"], "timed_out", "{command}: {rec:#}");
        let took = span(&rec, "startedAt", "endedAt");
        // Deadline 2 s, the watchdog's second, the grace of 1 s, and some slack.
        assert!(
            took < 5.5,
            "{command}: ended {took} s after its start: {rec:#}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// 3. A job that takes its own lock and kills its supervisor.
// ---------------------------------------------------------------------------------------

/// A job whose process takes the job's lock (flock on its folder) once it has
/// killed the supervisor: returns the job's record and the lock holder's pid.
fn start_lock_thief(sb: &Sandbox) -> (Value, i32) {
    let v = sb.start(&[
        "--grace",
        "1",
        "--",
        "L=$GITTERM_HOME/jobs/$GITTERM_JOB_ID; \
         S=$PPID; (while kill -0 $S 2>/dev/null; do sleep 0.05; done; \
         flock -n \"$L\" sh -c 'echo $$ > locked; exec sleep 100') & \
         sleep 0.3; kill -9 $S; sleep 100",
    ]);
    let id = id_of(&v);
    let holder = sb.pid_from("locked");
    let sup = int(&v, "supervisorPid");
    eventually(PROMPT, "the supervisor to be gone", || {
        proc_state(sup).is_none().then_some(())
    });
    assert!(alive_in_job(holder, &id), "the lock holder should live");
    (v, holder)
}

#[test]
fn a_job_that_takes_its_lock_and_kills_its_supervisor_blocks_no_reader() {
    let sb = Arc::new(Sandbox::new());
    // The server starts once the thief holds the lock: a server already running might
    // settle the job (and sweep the holder) in the moment between the supervisor's death
    // and the check that the holder lives.
    let (v, _) = start_lock_thief(&sb);
    let s = Server::start_in(Arc::clone(&sb), "127.0.0.1:0", &[]);
    let id = id_of(&v);
    // A reader goes by whether the supervisor the record names is alive, not by the
    // lock: the first one settles the job (tests/robust.rs checks how truthfully).
    let bound = Duration::from_secs(5);
    let mut c = client_within(&s, Duration::from_secs(30));
    for path in [
        "/v1/jobs".to_string(),
        "/v1/sandbox".into(),
        format!("/v1/jobs/{id}"),
    ] {
        let t = Instant::now();
        let r = c.get(&path);
        assert!(t.elapsed() < bound, "GET {path} took {:?}", t.elapsed());
        assert_eq!(r.status, 200, "GET {path}: {}", r.text());
    }
    for args in [vec!["status"], vec!["status", &id, "--json"]] {
        let out = run_within(&sb, sb.cmd(&args), Duration::from_secs(30));
        assert!(out.elapsed < bound, "{args:?} took {:?}", out.elapsed);
        assert_eq!(out.code, Some(0), "{out:#?}");
    }
    // Cancel also waits for a supervisor to record itself (at least the grace and 5 s),
    // each look costing that 2 s: bounded, if not quick.
    let t = Instant::now();
    let r = c.post(&format!("/v1/jobs/{id}/cancel"), &json!({}));
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "cancel took {:?}",
        t.elapsed()
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // Once the holder is gone the next reader settles the job.
    kill_job_processes(&id);
    let rec = sb.wait_final(&id, PROMPT);
    assert_eq!(rec["status"], "lost", "{rec:#}");
}

#[test]
fn cancel_ends_a_job_that_holds_its_own_lock() {
    let sb = Sandbox::new();
    let (v, holder) = start_lock_thief(&sb);
    let id = id_of(&v);
    // (Today the CLI's cancel looks for a supervisor for its whole 30 s, then prints
    // the job still running, its processes untouched.)
    let out = run_within(
        &sb,
        sb.cmd(&["cancel", &id, "--json"]),
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(0), "{out:#?}");
    let rec = out.json();
    assert!(
        rec["status"] != "running" && !alive_in_job(holder, &id),
        "cancel left the job running with its lock holder alive after {:?}: {rec:#}",
        out.elapsed
    );
    assert!(
        out.elapsed < Duration::from_secs(8),
        "cancel took {:?}",
        out.elapsed
    );
}

// ---------------------------------------------------------------------------------------
// 4. A planted record naming someone else's cgroup or process.
// ---------------------------------------------------------------------------------------

/// The kernel's boot id, as the agent records it.
fn boot_id() -> String {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Writes a record of a running job whose supervisor is gone, as an attacker would.
fn plant_running(sb: &Sandbox, id: &str, pid: i64, cgroup: Option<&str>) {
    let now = "2026-12-01T00:00:00.000Z";
    let mut rec = record(id, "sleep 60", "running", now, &boot_id());
    rec["pid"] = pid.into();
    rec["pgid"] = pid.into();
    // A supervisor that cannot be alive: the start time matches no process.
    rec["supervisorPid"] = pid.into();
    rec["supervisorStart"] = 1.into();
    if let Some(cg) = cgroup {
        rec["cgroup"] = cg.into();
    }
    plant(sb.home(), &rec);
    fs::write(sb.job_dir(id).join("output.log"), "").unwrap();
    sb.remember(id);
}

#[test]
fn a_planted_record_naming_another_cgroup_kills_nothing_there() {
    let Some(victim_cg) = ScratchCgroup::create("victim") else {
        skip("no writable cgroup v2 here");
        return;
    };
    let sb = Sandbox::new();
    fs::create_dir_all(sb.home().join("jobs")).unwrap();
    let mut c = sb.command("setsid");
    c.args([
        "sh",
        "-c",
        &format!("echo $$ > '{}'; exec sleep 60", victim_cg.procs().display()),
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    let victim = sb.spawn(c).id() as i32;
    eventually(PROMPT, "the victim to be in its cgroup", || {
        let sleeping =
            fs::read(format!("/proc/{victim}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep"));
        (sleeping && victim_cg.pids().contains(&victim)).then_some(())
    });
    let victim_path = victim_cg.path.to_str().unwrap().to_string();
    let gitterm = own_cgroup().unwrap().join("gitterm");
    let dotted = format!(
        "{}/{}/../../{}",
        gitterm.display(),
        "job_00000000000000000b02",
        victim_cg.path.file_name().unwrap().to_str().unwrap()
    );
    let planted = [
        (
            "job_00000000000000000b01",
            999_999,
            Some(victim_path.as_str()),
        ),
        ("job_00000000000000000b02", 999_999, Some(dotted.as_str())),
        // And one whose pid and process group are the victim's.
        ("job_00000000000000000b03", victim as i64, None),
    ];
    for (id, pid, cg) in planted {
        plant_running(&sb, id, pid, cg);
    }
    let list = sb.run(&["status", "--json"]);
    assert_eq!(list.code, Some(0), "{list:#?}");
    for (id, _, _) in planted {
        let rec = sb.status(id);
        assert_eq!(rec["status"], "lost", "{rec:#}");
    }
    assert!(
        alive(victim.into()) && victim_cg.pids().contains(&victim),
        "a reader killed the process a planted record pointed at"
    );
}

// ---------------------------------------------------------------------------------------
// 5. A lost record says what the sweep could not reach.
// ---------------------------------------------------------------------------------------

/// A job whose process clears its marker (and, with `elsewhere`, leaves the job's cgroup
/// for it) survives its supervisor's death: the record must not claim otherwise.
fn escapee_is_owned_up_to(sb: Sandbox, elsewhere: Option<&ScratchCgroup>) {
    fs::write(
        sb.file("escape.sh"),
        "[ -n \"$1\" ] && echo $$ > \"$1\"\necho $$ > escaped\nexec sleep 60\n",
    )
    .unwrap();
    let to = elsewhere
        .map(|cg| cg.procs().display().to_string())
        .unwrap_or_default();
    let v = sb.start(&[
        "--",
        &format!("env -u GITTERM_JOB_ID sh escape.sh '{to}' & sleep 60"),
    ]);
    let id = id_of(&v);
    let escaped = sb.pid_from("escaped");
    eventually(PROMPT, "the escapee to settle", || {
        let sleeping =
            fs::read(format!("/proc/{escaped}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep"));
        let moved = elsewhere.is_none_or(|cg| cg.pids().contains(&escaped));
        (sleeping && moved).then_some(())
    });
    let env = fs::read(format!("/proc/{escaped}/environ")).unwrap();
    assert!(
        !has_env_entry(&env, &marker(&id)),
        "the marker was not cleared"
    );
    kill_supervisor(&v);
    let rec = sb.status(&id);
    assert_eq!(rec["status"], "lost", "{rec:#}");
    let reason = text(&rec, "reason");
    assert!(alive(escaped.into()), "the escapee should have survived");
    assert!(
        reason.contains("cannot be found") && !reason.contains("remaining processes were ended"),
        "the reason claims more than the sweep did: {reason}"
    );
    if elsewhere.is_none() && rec["cgroup"].is_null() {
        assert!(reason.contains("no cgroup"), "{reason}");
    }
    // Ours to end, now that the agent could not.
    kill(escaped, libc::SIGKILL);
    eventually(PROMPT, "the escapee to die", || {
        (!alive(escaped.into())).then_some(())
    });
}

#[test]
fn a_lost_record_owns_up_to_a_process_that_left_the_cgroup_and_cleared_the_marker() {
    let Some(elsewhere) = ScratchCgroup::create("escape") else {
        skip("no writable cgroup v2 here");
        return;
    };
    escapee_is_owned_up_to(Sandbox::new(), Some(&elsewhere));
}

#[test]
fn a_lost_record_owns_up_to_a_process_that_cleared_the_marker_without_cgroup() {
    escapee_is_owned_up_to(Sandbox::without_cgroup(), None);
}

// ---------------------------------------------------------------------------------------
// 6. A zombie leader whose thread runs on.
// ---------------------------------------------------------------------------------------

/// The main thread starts a thread that runs forever, then calls pthread_exit: the
/// process is a zombie leader whose other thread lives. With `ignore-term` it ignores TERM.
const ZOMBIE_LEADER: &str = r#"
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void *forever(void *arg) {
    (void)arg;
    for (;;) pause();
    return 0;
}

int main(int argc, char **argv) {
    pthread_t t;
    if (argc > 1 && strcmp(argv[1], "ignore-term") == 0) signal(SIGTERM, SIG_IGN);
    if (pthread_create(&t, 0, forever, 0) != 0) return 1;
    pthread_exit(0);
}
"#;

/// Compiles the zombie-leader program into the sandbox, or `None` without gcc.
fn zombie_leader(sb: &Sandbox) -> Option<PathBuf> {
    let src = sb.dir().join("zombie-leader.c");
    let bin = sb.dir().join("zombie-leader");
    fs::write(&src, ZOMBIE_LEADER).unwrap();
    let built = Command::new("gcc")
        .args(["-O0", "-pthread", "-o"])
        .arg(&bin)
        .arg(&src)
        .output();
    match built {
        Ok(o) if o.status.success() => Some(bin),
        Ok(o) => panic!("gcc failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            skip(&format!("no gcc ({e}) to build the zombie leader"));
            None
        }
    }
}

fn zombie_leaders_are_ended(sb: Sandbox) {
    let Some(bin) = zombie_leader(&sb) else {
        return;
    };
    let bin = bin.display();
    for mode in ["obeys-term", "ignore-term"] {
        for end in ["timeout", "cancel", "shell exits"] {
            let _ = fs::remove_file(sb.file("zl.pid"));
            let tail = if end == "shell exits" {
                ""
            } else {
                "; sleep 60"
            };
            let command = format!("'{bin}' {mode} & echo $! > zl.pid{tail}");
            let timeout = if end == "timeout" { "2" } else { "60" };
            // When the shell exits at once the job may have ended before `--wait 0` reads
            // its record, so only a job that must still run is required to be running.
            let v = if end == "shell exits" {
                sb.exec_json(&[
                    "--wait",
                    "0",
                    "--timeout",
                    timeout,
                    "--grace",
                    "1",
                    "--",
                    &command,
                ])
                .1
            } else {
                sb.start(&["--timeout", timeout, "--grace", "1", "--", &command])
            };
            let id = id_of(&v);
            let pid = sb.pid_from("zl.pid");
            let what = format!("{mode}, {end}");
            if end != "shell exits" {
                eventually(PROMPT, "a zombie leader with a live thread", || {
                    (proc_state(pid) == Some('Z') && live_thread(pid).is_some()).then_some(())
                });
            }
            if end == "cancel" {
                let out = sb.run(&["cancel", &id]);
                assert_eq!(out.code, Some(0), "{what}: {out:#?}");
            }
            let rec = sb.wait_final(&id, PROMPT);
            let want = match end {
                "timeout" => "timed_out",
                "cancel" => "cancelled",
                _ => "succeeded",
            };
            assert_eq!(rec["status"], want, "{what}: {rec:#}");
            assert!(
                !group_alive(pid),
                "{what}: the job ended with its zombie leader's thread alive"
            );
        }
    }
}

#[test]
fn a_zombie_leader_with_a_live_thread_is_ended() {
    zombie_leaders_are_ended(Sandbox::new());
}

#[test]
fn a_zombie_leader_with_a_live_thread_is_ended_without_cgroup() {
    zombie_leaders_are_ended(Sandbox::without_cgroup());
}

// ---------------------------------------------------------------------------------------
// 7. TERM is delivered once to each process.
// ---------------------------------------------------------------------------------------

/// Counts the TERMs it gets; once it got one, waits a while for more, writes the count
/// to `<name>.count` and exits.
const TERM_COUNTER: &str = r#"
import signal, sys, time
name = sys.argv[1]
got = 0
def on_term(signum, frame):
    global got
    got += 1
signal.signal(signal.SIGTERM, on_term)
open(name + ".ready", "w").close()
while got == 0:
    time.sleep(0.01)
time.sleep(0.7)
with open(name + ".count", "w") as f:
    f.write(str(got))
"#;

fn one_term_each(sb: Sandbox) {
    if Command::new("python3").arg("-c").arg("").status().is_err() {
        skip("no python3 for the TERM-count job");
        return;
    }
    fs::write(sb.file("count.py"), TERM_COUNTER).unwrap();
    let names = ["child", "sibling", "session", "grandchild"];
    let command = "python3 count.py child & python3 count.py sibling & \
                   setsid python3 count.py session & \
                   sh -c 'python3 count.py grandchild & wait' & wait";
    for round in 1..=3 {
        for n in names {
            for ext in ["ready", "count"] {
                let _ = fs::remove_file(sb.file(&format!("{n}.{ext}")));
            }
        }
        let v = sb.start(&["--timeout", "3", "--grace", "5", "--", command]);
        let id = id_of(&v);
        eventually(PROMPT, "every counter to be ready", || {
            names
                .iter()
                .all(|n| sb.file(&format!("{n}.ready")).exists())
                .then_some(())
        });
        assert_eq!(
            sb.raw_record(&id)["status"],
            "running",
            "round {round}: the job ended before its counters were ready"
        );
        let rec = sb.wait_final(&id, PROMPT);
        assert_eq!(rec["status"], "timed_out", "round {round}: {rec:#}");
        // They exit by themselves 0.7 s after the TERM, well within the 5 s grace.
        assert!(
            span(&rec, "startedAt", "endedAt") < 6.0,
            "round {round}: the counters were killed, not left to exit: {rec:#}"
        );
        for n in names {
            let count = fs::read_to_string(sb.file(&format!("{n}.count")))
                .unwrap_or_else(|e| panic!("round {round}: {n} left no count: {e}"));
            assert_eq!(count, "1", "round {round}: {n} got {count} TERMs");
        }
    }
}

#[test]
fn each_process_gets_one_term() {
    one_term_each(Sandbox::new());
}

#[test]
fn each_process_gets_one_term_without_cgroup() {
    one_term_each(Sandbox::without_cgroup());
}

// ---------------------------------------------------------------------------------------
// 8. Ctrl-C during the grace period.
// ---------------------------------------------------------------------------------------

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: i32) -> f64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let close = stat.rfind(')').unwrap();
    let f: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    // Fields 14 and 15 of stat; the 12th and 13th after the command name.
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks as f64 / hz
}

#[test]
fn ctrl_c_during_the_grace_does_not_spin_exec() {
    let sb = Sandbox::new();
    let mut c = sb.cmd(&[
        "exec",
        "--grace",
        "6",
        "--",
        "trap 'echo term >> got-term' TERM; echo ready > ready; while :; do sleep 0.2; done",
    ]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = sb.spawn(c);
    let exec = child.id() as i32;
    eventually(PROMPT, "the job to start", || {
        sb.file("ready").exists().then_some(())
    });
    for id in sb.job_ids() {
        sb.remember(&id);
    }
    kill(exec, libc::SIGINT);
    eventually(PROMPT, "the job to get its TERM", || {
        sb.file("got-term").exists().then_some(())
    });
    // And Ctrl-C again, as an impatient user does: exec waits in poll, which the signal
    // interrupts.
    std::thread::sleep(Duration::from_millis(100));
    kill(exec, libc::SIGINT);
    let before = cpu_seconds(exec);
    // A measurement, not a wait for a condition: exec is in the 6 s grace throughout.
    std::thread::sleep(Duration::from_secs(4));
    let spent = cpu_seconds(exec) - before;
    assert!(
        proc_state(exec).is_some_and(|s| s != 'Z'),
        "exec ended before the grace did"
    );
    assert!(
        spent < 0.5,
        "exec burned {spent:.2} s of CPU in 4 s of grace"
    );
    let out = sb.finish(child, PROMPT);
    assert!(!out.success(), "an interrupted exec exited 0: {out:#?}");
}

// ---------------------------------------------------------------------------------------
// 9. A nested job.
// ---------------------------------------------------------------------------------------

#[test]
fn a_nested_job_leaves_no_cgroup_folder_in_its_outer_job() {
    let sb = Sandbox::new();
    let v = sb.start(&[
        "--grace",
        "1",
        "--",
        &format!("'{BIN}' exec -- true && echo ok > inner-done; sleep 60"),
    ]);
    let id = id_of(&v);
    let Some(cg) = v["cgroup"].as_str().map(PathBuf::from) else {
        skip("jobs get no cgroup here");
        sb.run(&["cancel", &id]);
        return;
    };
    eventually(PROMPT, "the inner job to end", || {
        sb.file("inner-done").exists().then_some(())
    });
    for inner in sb.job_ids() {
        sb.remember(&inner);
    }
    assert_eq!(sb.job_ids().len(), 2, "the inner job shares the state root");
    eventually(
        PROMPT,
        "no gitterm folder inside the outer job's cgroup",
        || (!cg.join("gitterm").exists()).then_some(()),
    );
    let out = sb.run(&["cancel", &id]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    eventually(PROMPT, "the outer job's cgroup to be removed", || {
        (!cg.exists()).then_some(())
    });
}

// ---------------------------------------------------------------------------------------
// 10. What a request may not set or smuggle.
// ---------------------------------------------------------------------------------------

#[test]
fn the_job_marker_cannot_be_set() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let forged = "job_0123456789abcdef0123";
    for body in [
        json!({"command": "true", "env": {"GITTERM_JOB_ID": forged}}),
        json!({"command": "true", "secretEnv": {"GITTERM_JOB_ID": forged}}),
    ] {
        let r = c.post("/v1/jobs", &body);
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid"),
            "{body}: {}",
            r.text()
        );
        assert!(r.text().contains("GITTERM_JOB_ID"), "{}", r.text());
    }
    let sf = s.dir().join("marker.env");
    write_mode(&sf, &format!("GITTERM_JOB_ID={forged}\n"), 0o600);
    let r = c.post(
        "/v1/jobs",
        &json!({"command": "true", "secretFiles": [sf.to_str().unwrap()]}),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "invalid"),
        "{}",
        r.text()
    );
    for args in [
        vec![
            "exec",
            "--env",
            &format!("GITTERM_JOB_ID={forged}"),
            "--",
            "true",
        ],
        vec!["exec", "--secret-file", sf.to_str().unwrap(), "--", "true"],
    ] {
        let out = s.sb.run(&args);
        assert_eq!(out.code, Some(2), "{args:?}: {out:#?}");
        assert!(out.stderr.contains("GITTERM_JOB_ID"), "{out:#?}");
    }
    assert!(s.sb.job_ids().is_empty(), "a refused start made a job");
    // Whatever the persisted env holds, a job carries its own marker.
    let r = c.post("/v1/env", &json!({"set": {"GITTERM_JOB_ID": forged}}));
    if r.status == 200 {
        let v = c
            .post("/v1/jobs", &json!({"command": "echo $GITTERM_JOB_ID"}))
            .json();
        assert_eq!(v["output"], format!("{}\n", text(&v, "id")), "{v:#}");
    } else {
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid"),
            "{}",
            r.text()
        );
    }
}

#[test]
fn a_secret_in_cwd_or_the_idempotency_key_is_refused_and_stored_nowhere() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let secret = "cwd-or-key-secret-5d1e";
    let dir = s.sb.work().join(format!("under-{secret}"));
    fs::create_dir(&dir).unwrap();
    let secrets = json!({"TOKEN": secret});
    let r = c.post(
        "/v1/jobs",
        &json!({"command": "pwd", "cwd": dir.to_str().unwrap(), "secretEnv": secrets}),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "invalid"),
        "{}",
        r.text()
    );
    assert!(
        r.text().contains("TOKEN") && !r.text().contains(secret),
        "{}",
        r.text()
    );
    let body = serde_json::to_vec(&json!({"command": "true", "secretEnv": secrets})).unwrap();
    let key = format!("retry-{secret}-1");
    let r = c.send(
        "POST",
        "/v1/jobs",
        &[("Idempotency-Key", &key)],
        Some(&body),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "invalid"),
        "{}",
        r.text()
    );
    assert!(!r.text().contains(secret), "{}", r.text());
    // The CLI takes a cwd too.
    let sf = s.dir().join("secret.env");
    write_mode(&sf, &format!("TOKEN={secret}\n"), 0o600);
    let out = s.sb.run(&[
        "exec",
        "--secret-file",
        sf.to_str().unwrap(),
        "--cwd",
        dir.to_str().unwrap(),
        "--",
        "pwd",
    ]);
    assert_eq!(out.code, Some(2), "{out:#?}");
    assert!(!out.stderr.contains(secret), "{out:#?}");

    assert!(s.sb.job_ids().is_empty(), "a refused start made a job");
    let found = files_holding(&s.home, secret);
    assert!(found.is_empty(), "the secret was stored in {found:?}");
    assert!(!s.log_text().contains(secret), "the secret is in the log");
}

#[test]
fn stdin_given_through_the_api_never_reaches_the_disk() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let stdin = "stdin-only-netrc-password-qwzx\n";
    let r = c.post(
        "/v1/jobs",
        &json!({"command": "tr a-z A-Z; sleep 2", "stdin": stdin, "background": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let id = id_of(&r.json());
    let upper = stdin.to_uppercase();
    let log = s.sb.job_dir(&id).join("output.log");
    // The job has read it (its output says so) and still runs.
    eventually(PROMPT, "the job to read its stdin", || {
        fs::read_to_string(&log).ok().filter(|t| t.contains(&upper))
    });
    assert_eq!(s.sb.raw_record(&id)["status"], "running");
    let found = files_holding(&s.home, stdin);
    assert!(
        found.is_empty(),
        "stdin is on disk while the job runs: {found:?}"
    );
    let v = c.get(&format!("/v1/jobs/{id}?waitSeconds=30")).json();
    assert_eq!(v["status"], "succeeded", "{v:#}");
    let found = files_holding(&s.home, stdin);
    assert!(
        found.is_empty(),
        "stdin is on disk after the job: {found:?}"
    );
}

#[test]
fn a_subnormal_timeout_is_refused_in_a_few_words() {
    let s = Server::start(&[]);
    let mut c = s.client();
    for field in ["timeoutSeconds", "idleTimeoutSeconds"] {
        let body = format!(r#"{{"command": "true", "{field}": 5e-324}}"#);
        let r = c.send("POST", "/v1/jobs", &[], Some(body.as_bytes()));
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid"),
            "{}",
            r.text()
        );
        let message = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(
            message.len() < 120 && message.contains(field),
            "{} chars: {message}",
            message.len()
        );
    }
    let out = s.sb.run(&["exec", "--timeout", "5e-324", "--", "true"]);
    assert_eq!(out.code, Some(2), "{out:#?}");
    assert!(s.sb.job_ids().is_empty(), "a refused start made a job");
}

// ---------------------------------------------------------------------------------------
// 11. Idempotency and the kernel's limits.
// ---------------------------------------------------------------------------------------

#[test]
fn an_idempotency_key_reused_for_another_request_conflicts() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let send = |c: &mut Client, body: Value| {
        let raw = serde_json::to_vec(&body).unwrap();
        c.send(
            "POST",
            "/v1/jobs",
            &[("Idempotency-Key", "deploy-7")],
            Some(&raw),
        )
    };
    let first = json!({"command": "echo one", "env": {"STAGE": "a"}});
    let r = send(&mut c, first.clone());
    assert_eq!(r.status, 200, "{}", r.text());
    let id = id_of(&r.json());
    // docs/openapi.json lists no 409 for POST /v1/jobs (see the test below), so these
    // answers are read unchecked.
    let mut unchecked = s.client().unchecked();
    for other in [
        json!({"command": "echo two", "env": {"STAGE": "a"}}),
        json!({"command": "echo one", "env": {"STAGE": "b"}}),
        json!({"command": "echo one", "env": {"STAGE": "a"}, "cwd": "/"}),
        json!({"command": "echo one", "env": {"STAGE": "a"}, "stdin": "x"}),
        json!({"command": "echo one", "env": {"STAGE": "a"}, "timeoutSeconds": 9}),
    ] {
        let r = send(&mut unchecked, other.clone());
        assert_eq!(
            (r.status, r.code().as_str()),
            (409, "conflict"),
            "{other}: {}",
            r.text()
        );
        assert!(
            r.text().contains(&id),
            "the conflict should name {id}: {}",
            r.text()
        );
    }
    let r = send(&mut c, first);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["id"], id.as_str());
    assert_eq!(s.sb.job_ids(), vec![id]);
}

#[test]
fn a_command_or_variable_past_the_kernels_limit_is_invalid() {
    const MAX: usize = 131_071;
    let s = Server::start(&[]);
    let mut c = s.client();
    // Exactly at the limit runs.
    let at = format!(": {}", "x".repeat(MAX - 2));
    let v = c.post("/v1/jobs", &json!({"command": at})).json();
    assert_eq!(v["status"], "succeeded", "a {MAX}-byte command: {v:#}");
    let over = format!(": {}", "x".repeat(MAX - 1));
    let r = c.post("/v1/jobs", &json!({"command": over}));
    assert_eq!((r.status, r.code().as_str()), (400, "invalid"));
    assert!(r.text().contains("131071"), "{}", r.text());
    // One NAME=value string: V= and the value.
    let v = c
        .post(
            "/v1/jobs",
            &json!({"command": "echo ${#V}", "env": {"V": "y".repeat(MAX - 2)}}),
        )
        .json();
    assert_eq!(v["output"], format!("{}\n", MAX - 2), "{v:#}");
    let r = c.post(
        "/v1/jobs",
        &json!({"command": "true", "env": {"V": "y".repeat(MAX - 1)}}),
    );
    assert_eq!((r.status, r.code().as_str()), (400, "invalid"));
    assert!(r.text().contains("131071"), "{}", r.text());
    let before = s.sb.job_ids();
    // The CLI joins its words: two that pass the kernel alone make one too long.
    let half = "z".repeat(MAX / 2 + 1);
    let out = s.sb.run(&["exec", "--", ":", &half, &half]);
    assert_eq!(out.code, Some(2), "{out:#?}");
    assert!(out.stderr.contains("131071"), "{out:#?}");
    assert_eq!(s.sb.job_ids(), before, "a refused start made a job");
}

#[test]
fn the_conflict_of_a_reused_idempotency_key_is_documented() {
    let s = Server::start(&[]);
    let mut c = s.client().unchecked();
    for command in ["true", "false"] {
        let body = serde_json::to_vec(&json!({"command": command})).unwrap();
        let r = c.send("POST", "/v1/jobs", &[("Idempotency-Key", "k")], Some(&body));
        if r.status == 409 {
            crate::util::schema::check_answer("POST", "/v1/jobs", &r).unwrap();
            return;
        }
    }
    panic!("no conflict to check");
}
