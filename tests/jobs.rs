//! The job-supervision core with real processes: exit facts, timeouts, cancel, `lost`,
//! nothing outliving a job, output capture, records on disk, logs, and interrupts.
//!
//! Every test has its own sandbox; its guard fails a test that leaves a process behind.

use std::fs;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::Arc;

use crate::util::*;

// ---------------------------------------------------------------------------------------
// Exit facts
// ---------------------------------------------------------------------------------------

#[test]
fn true_succeeds() {
    let sb = Sandbox::new();
    let (out, v) = sb.exec_json(&["--", "true"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert_eq!(v["status"], "succeeded");
    assert_eq!(v["exitCode"], 0);
    assert!(v["signal"].is_null());
    assert_eq!(v["isError"], false);
    // Without --json: silent, exit 0.
    let out = sb.run(&["exec", "--", "true"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert_eq!(out.stdout, "");
    sb.assert_no_leftovers();
}

#[test]
fn exit_code_is_kept() {
    let sb = Sandbox::new();
    let (out, v) = sb.exec_json(&["--", "exit 7"]);
    assert_eq!(out.code, Some(7), "{out:#?}");
    assert_eq!(v["status"], "failed");
    assert_eq!(v["exitCode"], 7);
    assert!(v["signal"].is_null());
    assert_eq!(v["isError"], true);
    let out = sb.run(&["exec", "--", "exit 7"]);
    assert_eq!(out.code, Some(7), "{out:#?}");
}

#[test]
fn killed_by_a_signal_it_sent_itself_is_failed() {
    let sb = Sandbox::new();
    let (out, v) = sb.exec_json(&["--", "kill -9 $$"]);
    assert_eq!(out.code, Some(137), "{out:#?}");
    assert_eq!(v["status"], "failed");
    assert_eq!(v["signal"], "SIGKILL");
    assert!(v["exitCode"].is_null(), "{v:#}");
    assert_eq!(v["isError"], true);
    let out = sb.run(&["exec", "--", "kill -9 $$"]);
    assert_eq!(out.code, Some(137), "{out:#?}");
}

#[test]
fn command_not_found_is_127() {
    let sb = Sandbox::new();
    let out = sb.run(&["exec", "--", "gitterm-no-such-command-here"]);
    assert_eq!(out.code, Some(127), "{out:#?}");
    // The shell's complaint is part of the job's output, not the agent's stderr.
    assert!(out.stdout.contains("not found"), "{out:#?}");
    let id = sb.job_ids().pop().unwrap();
    let v = sb.status(&id);
    assert_eq!(v["status"], "failed");
    assert_eq!(v["exitCode"], 127);
}

fn assert_timestamp(v: &serde_json::Value, field: &str) {
    let t = text(v, field);
    let b = t.as_bytes();
    let ok = b.len() >= 20
        && t.ends_with('Z')
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && t[..4].bytes().all(|c| c.is_ascii_digit());
    assert!(ok, "{field} is not RFC 3339 UTC: {t:?}");
}

#[test]
fn exec_json_has_every_contract_field() {
    let sb = Sandbox::new();
    // Words after `--` are joined with single spaces, as ssh does.
    let (out, v) = sb.exec_json(&["--", "echo", "a", "b  c"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    for f in [
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
        assert!(v.get(f).is_some(), "field {f} missing from {v:#}");
    }
    let id = text(&v, "id");
    assert!(
        id.len() == 24
            && id.starts_with("job_")
            && id[4..]
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
        "bad id {id:?}"
    );
    assert_eq!(v["command"], "echo a b  c");
    assert_eq!(
        v["cwd"],
        fs::canonicalize(sb.work())
            .unwrap()
            .to_string_lossy()
            .as_ref()
    );
    assert_eq!(v["status"], "succeeded");
    assert_eq!(v["exitCode"], 0);
    assert!(v["signal"].is_null());
    for f in ["createdAt", "startedAt", "endedAt"] {
        assert_timestamp(&v, f);
    }
    assert!(text(&v, "createdAt") <= text(&v, "startedAt"));
    assert!(text(&v, "startedAt") <= text(&v, "endedAt"));
    assert!(v["timeoutSeconds"].as_f64().unwrap() > 0.0);
    assert!(int(&v, "pid") > 1);
    assert!(int(&v, "pgid") > 1);
    assert_eq!(v["output"], "a b c\n");
    assert_eq!(v["outputBytes"], 6);
    assert_eq!(v["isError"], false);
    // `status ID --json` gives the same object.
    let again = sb.status(id);
    assert_eq!(again, v);
}

// ---------------------------------------------------------------------------------------
// Timeouts
// ---------------------------------------------------------------------------------------

#[test]
fn timeout_ends_the_job_with_term() {
    let sb = Sandbox::new();
    let (out, v) = sb.exec_json(&["--timeout", "1", "--", "sleep 30"]);
    assert_eq!(out.code, Some(124), "{out:#?}");
    assert!(out.elapsed < PROMPT, "took {:?}", out.elapsed);
    assert_eq!(v["status"], "timed_out");
    assert_eq!(v["signal"], "SIGTERM", "{v:#}");
    assert_eq!(v["timeoutSeconds"], 1.0);
    assert_eq!(v["isError"], true);
    assert!(!text(&v, "reason").is_empty());
    // Without --json, 124 too.
    let out = sb.run(&["exec", "--timeout", "1", "--", "sleep 30"]);
    assert_eq!(out.code, Some(124), "{out:#?}");
    sb.assert_no_leftovers();
}

#[test]
fn term_ignoring_job_is_killed_after_the_grace() {
    let sb = Sandbox::new();
    let (out, v) = sb.exec_json(&[
        "--timeout",
        "1",
        "--grace",
        "1",
        "--",
        "trap '' TERM; sleep 30",
    ]);
    assert_eq!(out.code, Some(124), "{out:#?}");
    assert!(out.elapsed < PROMPT, "took {:?}", out.elapsed);
    assert_eq!(v["status"], "timed_out");
    assert_eq!(v["signal"], "SIGKILL", "{v:#}");
    sb.assert_no_leftovers();
}

#[test]
fn stopped_job_still_times_out() {
    let sb = Sandbox::new();
    let (out, v) = sb.exec_json(&["--timeout", "1", "--grace", "1", "--", "kill -STOP $$"]);
    assert_eq!(out.code, Some(124), "{out:#?}");
    assert!(out.elapsed < PROMPT, "took {:?}", out.elapsed);
    assert_eq!(v["status"], "timed_out");
    assert_dead(&[int(&v, "pid")], text(&v, "id"), PROMPT);
    // A stopped child that ignores TERM as well.
    let (out, v) = sb.exec_json(&[
        "--timeout",
        "1",
        "--grace",
        "1",
        "--",
        "sh -c 'trap \"\" TERM; kill -STOP $$' & echo $! > child; wait",
    ]);
    assert_eq!(out.code, Some(124), "{out:#?}");
    assert_eq!(v["status"], "timed_out");
    assert_dead(&[sb.pid_from("child")], text(&v, "id"), PROMPT);
    sb.assert_no_leftovers();
}

#[test]
fn idle_timeout_ends_a_silent_job() {
    let sb = Sandbox::new();
    let (out, v) = sb.exec_json(&["--idle-timeout", "1", "--", "echo hi; sleep 30"]);
    assert_eq!(out.code, Some(124), "{out:#?}");
    assert!(out.elapsed < PROMPT, "took {:?}", out.elapsed);
    assert_eq!(v["status"], "timed_out");
    assert_eq!(v["output"], "hi\n");
    assert!(!text(&v, "reason").is_empty());
}

#[test]
fn timeout_is_clamped_to_max_job_seconds() {
    let sb = Sandbox::new();
    let v = sb.start(&[
        "--timeout",
        "100",
        "--max-job-seconds",
        "1",
        "--",
        "sleep 30",
    ]);
    assert_eq!(v["timeoutSeconds"], 1.0, "{v:#}");
    let id = text(&v, "id");
    let end = sb.wait_final(id, PROMPT);
    assert_eq!(end["status"], "timed_out");
    sb.assert_no_leftovers();
}

// ---------------------------------------------------------------------------------------
// Nothing outlives the job
// ---------------------------------------------------------------------------------------

/// A background child, a setsid child and a double-forked setsid daemon, all left behind
/// by a shell that exits 0.
const ESCAPEES: &str = "sleep 300 & echo $! > bg; \
     setsid sleep 300 & echo $! > sid; \
     (setsid sh -c 'echo $$ > daemon; exec sleep 300' &); \
     while [ ! -s daemon ]; do sleep 0.01; done; exit 0";

fn nothing_outlives(sb: Sandbox) {
    let (out, v) = sb.exec_json(&["--grace", "1", "--", ESCAPEES]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert_eq!(v["status"], "succeeded");
    let id = text(&v, "id");
    let pids = [sb.pid_from("bg"), sb.pid_from("sid"), sb.pid_from("daemon")];
    assert_dead(&pids, id, PROMPT);
    assert_dead(&[int(&v, "pid")], id, PROMPT);
    sb.assert_no_leftovers();
    if let Some(cg) = job_cgroup(id) {
        eventually(PROMPT, "the job's cgroup to be removed", || {
            (!cg.exists()).then_some(())
        });
    }
}

#[test]
fn nothing_outlives_the_job() {
    nothing_outlives(Sandbox::new());
}

#[test]
fn nothing_outlives_the_job_without_cgroup() {
    nothing_outlives(Sandbox::without_cgroup());
}

#[test]
fn nothing_outlives_a_cancelled_job_without_cgroup() {
    let sb = Sandbox::without_cgroup();
    let cmd = ESCAPEES.replace("exit 0", "sleep 300");
    let v = sb.start(&["--grace", "1", "--", &cmd]);
    let id = text(&v, "id");
    let pids = [sb.pid_from("bg"), sb.pid_from("sid"), sb.pid_from("daemon")];
    for &p in &pids {
        assert!(alive_in_job(p, id), "{p} should run while the job runs");
    }
    let out = sb.run(&["cancel", id]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert_eq!(sb.status(id)["status"], "cancelled");
    assert_dead(&pids, id, PROMPT);
    sb.assert_no_leftovers();
}

#[test]
fn grandchild_holding_the_output_does_not_hold_the_job() {
    let sb = Sandbox::new();
    // The background sleep keeps the output pipe open after the shell exits.
    let out = sb.run(&[
        "exec",
        "--grace",
        "2",
        "--",
        "sleep 300 & echo $! > bg; echo started",
    ]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert_eq!(out.stdout, "started\n");
    // Well before 300 s: within the grace and a margin.
    assert!(out.elapsed < PROMPT, "took {:?}", out.elapsed);
    let id = sb.job_ids().pop().unwrap();
    assert_eq!(sb.status(&id)["status"], "succeeded");
    assert_dead(&[sb.pid_from("bg")], &id, PROMPT);
    sb.assert_no_leftovers();
}

#[test]
fn job_starts_with_no_signal_blocked_or_ignored() {
    let sb = Arc::new(Sandbox::new());
    // `exec` replaces the shell, so grep shows the mask and the ignored set the shell was
    // started with: its supervisor blocks the signals it reads, ignores SIGPIPE, and
    // starts the shell in a clone that shares its memory, with every signal blocked.
    let show = "exec grep -E '^Sig(Blk|Ign)' /proc/self/status";
    let clean = "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n";
    // Started by a parent that left signals ignored, a real-time one among them (`nohup`
    // and some runners do): the agent keeps them, its jobs must not.
    let mut c = sb.cmd(&["exec", "--", show]);
    // SAFETY: rt_sigaction is async-signal-safe.
    unsafe {
        c.pre_exec(|| {
            let ignore: [usize; 4] = [1, 0, 0, 0]; // SIG_IGN, no flags
            for sig in [libc::SIGHUP, libc::SIGUSR2, 33, 40] {
                if libc::syscall(libc::SYS_rt_sigaction, sig, ignore.as_ptr(), 0usize, 8usize) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let out = sb.run_cmd(c);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert_eq!(out.stdout, clean);
    // A background child of the shell inherits the mask as well.
    let out = sb.run(&["exec", "--", "grep ^SigBlk /proc/self/status & wait"]);
    assert_eq!(out.stdout, "SigBlk:\t0000000000000000\n");
    // The same through serve, whose own threads block and ignore signals of their own.
    let s = Server::start_in(Arc::clone(&sb), "127.0.0.1:0", &[]);
    let r = s
        .client()
        .post("/v1/jobs", &json!({"command": show, "waitSeconds": 30}));
    assert_eq!(r.json()["output"], clean, "{}", r.text());
}

#[test]
fn term_ends_the_job_without_waiting_for_the_grace() {
    let sb = Sandbox::new();
    // A program that replaces the shell must get TERM at its timeout.
    let (out, v) = sb.exec_json(&["--timeout", "1", "--grace", "20", "--", "exec sleep 30"]);
    assert_eq!(v["status"], "timed_out");
    assert!(out.elapsed < PROMPT, "took {:?}", out.elapsed);
    assert_eq!(v["signal"], "SIGTERM", "{v:#}");
    // A background child left by a shell that exited must get TERM too.
    let out = sb.run(&["exec", "--grace", "20", "--", "sleep 300 & echo started"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert!(out.elapsed < PROMPT, "took {:?}", out.elapsed);
}

// ---------------------------------------------------------------------------------------
// Detached jobs, cancel, lost
// ---------------------------------------------------------------------------------------

#[test]
fn detached_job_runs_on_and_cancel_ends_it() {
    let sb = Sandbox::new();
    let v = sb.start(&["--grace", "1", "--", "sleep 300 & echo $! > bg; sleep 301"]);
    assert!(v["exitCode"].is_null());
    assert_eq!(v["isError"], false);
    let id = text(&v, "id");
    let shell = int(&v, "pid");
    let bg = sb.pid_from("bg");
    // The CLI has exited; the job goes on.
    assert!(alive_in_job(shell, id));
    assert!(alive_in_job(bg, id));
    assert_eq!(sb.status(id)["status"], "running");

    let out = sb.run(&["cancel", id]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert!(out.stdout.contains("cancelled"), "{out:#?}");
    let end = sb.status(id);
    assert_eq!(end["status"], "cancelled");
    assert_eq!(end["isError"], true);
    assert!(end["endedAt"].is_string());
    assert_dead(&[shell, bg], id, PROMPT);
    sb.assert_no_leftovers();
}

#[test]
fn cancel_json_and_cancel_of_an_ended_job() {
    let sb = Sandbox::new();
    let v = sb.start(&["--", "sleep 300"]);
    let id = text(&v, "id");
    let out = sb.run(&["cancel", id, "--json"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    let c = out.json();
    assert_eq!(c["status"], "cancelled");
    assert_eq!(c["id"], id);
    // Cancelling an ended job changes nothing.
    let out = sb.run(&["cancel", id, "--json"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert_eq!(out.json()["endedAt"], c["endedAt"]);
    let (_, done) = sb.exec_json(&["--", "true"]);
    let did = text(&done, "id");
    let out = sb.run(&["cancel", did]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    let after = sb.status(did);
    assert_eq!(after["status"], "succeeded");
    assert_eq!(after["endedAt"], done["endedAt"]);
}

#[test]
fn detached_job_still_times_out() {
    let sb = Sandbox::new();
    let v = sb.start(&["--timeout", "1", "--", "sleep 30"]);
    let id = text(&v, "id");
    let end = sb.wait_final(id, PROMPT);
    assert_eq!(end["status"], "timed_out");
    assert_dead(&[int(&v, "pid")], id, PROMPT);
    sb.assert_no_leftovers();
}

#[test]
fn max_running_refuses_more_and_writes_nothing() {
    let sb = Sandbox::new();
    let v = sb.start(&["--", "sleep 300"]);
    let before = sb.job_ids();
    let out = sb.run(&["exec", "--max-running", "1", "--", "true"]);
    assert_ne!(out.code, Some(0), "{out:#?}");
    assert!(out.stderr.contains("running"), "{out:#?}");
    assert_eq!(sb.job_ids(), before);
    sb.run(&["cancel", text(&v, "id")]);
}

fn secret_file(sb: &Sandbox, value: &str) -> String {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = sb.file("secrets.env");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .unwrap();
    writeln!(f, "GITTERM_TEST_TOKEN={value}").unwrap();
    path.to_string_lossy().into_owned()
}

/// Files of a folder that hold `needle`.
fn files_holding(dir: &std::path::Path, needle: &str) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| {
            fs::read(e.path())
                .map(|d| d.windows(needle.len()).any(|w| w == needle.as_bytes()))
                .unwrap_or(false)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn killed_supervisor_makes_the_job_lost() {
    let sb = Sandbox::new();
    let secret = "lost-secret-value-1234";
    let sf = secret_file(&sb, secret);
    let v = sb.start(&[
        "--secret-file",
        &sf,
        "--",
        "sleep 300 & echo $! > bg; sleep 301",
    ]);
    let id = text(&v, "id");
    let shell = int(&v, "pid");
    let bg = sb.pid_from("bg");
    kill_supervisor(&v);

    let out = sb.run(&["status", id, "--json"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    let rec = out.json();
    assert_eq!(rec["status"], "lost", "{rec:#}");
    assert!(!text(&rec, "reason").is_empty());
    assert_eq!(rec["isError"], true);
    assert!(rec["endedAt"].is_string());
    // The record on disk says so too, and later reads agree.
    assert_eq!(sb.raw_record(id)["status"], "lost");
    assert_eq!(sb.status(id)["status"], "lost");
    // The job's processes are gone too.
    assert_dead(&[shell, bg], id, PROMPT);
    sb.assert_no_leftovers();
    // The secrets file went with it.
    assert_eq!(files_holding(&sb.job_dir(id), secret), Vec::<String>::new());
}

#[test]
fn lost_job_cgroup_is_removed() {
    let sb = Sandbox::new();
    let v = sb.start(&["--", "sleep 300 & sleep 301"]);
    let id = text(&v, "id");
    let Some(cg) = job_cgroup(id).filter(|c| c.exists()) else {
        return skip("no writable cgroup v2 here");
    };
    kill_supervisor(&v);
    assert_eq!(sb.status(id)["status"], "lost");
    sb.assert_no_leftovers();
    eventually(PROMPT, "the job's cgroup to be removed", || {
        (!cg.exists()).then_some(())
    });
}

/// Polls until some job folder's record (not one of `exclude`) names its supervisor;
/// returns that record. With `spin`, polls without pausing (to hit narrow windows).
fn wait_for_supervisor(sb: &Sandbox, exclude: &[String], spin: bool) -> serde_json::Value {
    let find = || {
        let rec = sb
            .job_ids()
            .iter()
            .filter(|id| !exclude.contains(id))
            .filter_map(|id| fs::read_to_string(sb.job_dir(id).join("job.json")).ok())
            .filter_map(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .find(|r| r["supervisorPid"].is_i64() && r["status"] == "running")?;
        sb.remember(text(&rec, "id"));
        Some(rec)
    };
    let what = "a supervisor to record itself";
    if spin {
        eventually_spinning(PROMPT, what, find)
    } else {
        eventually(PROMPT, what, find)
    }
}

#[test]
fn term_to_the_supervisor_ends_the_job() {
    // E.g. the sandbox shutting down: the supervisor ends its job and records why.
    let sb = Sandbox::new();
    let v = sb.start(&["--grace", "1", "--", "sleep 300 & echo $! > bg; sleep 301"]);
    let id = text(&v, "id");
    let bg = sb.pid_from("bg");
    kill(int(&v, "supervisorPid"), libc::SIGTERM);
    let end = sb.wait_final(id, PROMPT);
    assert_eq!(end["status"], "cancelled", "{end:#}");
    assert!(text(&end, "reason").contains("SIGTERM"), "{end:#}");
    assert_dead(&[int(&v, "pid"), bg], id, PROMPT);
    sb.assert_no_leftovers();
}

#[test]
fn foreground_exec_reports_a_lost_supervisor() {
    let sb = Sandbox::new();
    let mut c = sb.cmd(&["exec", "--", "sleep 300"]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = sb.spawn(c);
    let cli = child.id() as i32;
    // The CLI handles Ctrl-C once the job has started and it follows the output.
    eventually(PROMPT, "the job to start", || {
        (catches(cli, libc::SIGINT) && !sb.job_ids().is_empty()).then_some(())
    });
    let rec = wait_for_supervisor(&sb, &[], false);
    kill_supervisor(&rec);
    let out = sb.finish(child, PROMPT);
    assert_eq!(out.code, Some(125), "{out:#?}");
    assert!(out.stderr.contains("lost"), "{out:#?}");
    let id = text(&rec, "id");
    assert_eq!(sb.status(id)["status"], "lost");
    assert_dead(&[int(&rec, "pid")], id, PROMPT);
    sb.assert_no_leftovers();
}

#[test]
fn supervisor_dying_during_start_leaves_nothing_running() {
    let sb = Sandbox::new();
    // Kill each supervisor as soon as it has recorded itself; sometimes that is before
    // it told the launcher "ok". Whatever the launcher then says, nothing may run on.
    let mut seen = Vec::new();
    for _ in 0..10 {
        let mut c = sb.cmd(&["exec", "--", "sleep 300 & sleep 301"]);
        c.stdout(Stdio::null()).stderr(Stdio::piped());
        let child = sb.spawn(c);
        let rec = wait_for_supervisor(&sb, &seen, true);
        seen.push(text(&rec, "id").to_string());
        kill_supervisor(&rec);
        let out = sb.finish(child, PROMPT);
        assert_ne!(out.code, Some(0), "{out:#?}");
    }
    // Settle every job that is still there (lost, and swept).
    assert_eq!(sb.run(&["status"]).code, Some(0));
    sb.assert_no_leftovers();
}

#[test]
fn lost_job_frees_its_running_slot() {
    let sb = Sandbox::new();
    let v = sb.start(&["--", "sleep 300"]);
    kill_supervisor(&v);
    // Nobody has looked at the job since its supervisor died.
    let out = sb.run(&["exec", "--max-running", "1", "--", "true"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
}

#[test]
fn lost_job_leaves_only_its_record_and_output() {
    let sb = Sandbox::new();
    let v = sb.start(&["--env", "SOME_VAR=some-value", "--", "sleep 300"]);
    let id = text(&v, "id");
    kill_supervisor(&v);
    assert_eq!(sb.status(id)["status"], "lost");
    let mut names: Vec<String> = fs::read_dir(sb.job_dir(id))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["job.json", "output.log"]);
}

#[test]
fn detached_job_does_not_hold_the_callers_fds() {
    let sb = Sandbox::new();
    let (mut r, w) = std::io::pipe().unwrap();
    let wfd = w.as_raw_fd();
    let mut c = sb.cmd(&["exec", "--wait", "0", "--json", "--", "sleep 30"]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    // SAFETY: dup2 and fcntl are async-signal-safe.
    unsafe {
        c.pre_exec(move || {
            // An fd the caller leaked to the CLI (as shells and runners sometimes do).
            let rc = if wfd == 9 {
                libc::fcntl(9, libc::F_SETFD, 0)
            } else {
                libc::dup2(wfd, 9)
            };
            if rc < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = sb.spawn(c);
    let out = sb.finish(child, CLI_DEADLINE);
    assert_eq!(out.code, Some(0), "{out:#?}");
    drop(w);
    // The CLI is gone: nothing may hold the write end any more, so the read end sees EOF
    // (not after the job's 30 s).
    // SAFETY: setting O_NONBLOCK on an fd we own.
    unsafe { libc::fcntl(r.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
    let mut buf = [0u8; 16];
    eventually(PROMPT, "EOF on the caller's pipe", || {
        (matches!(r.read(&mut buf), Ok(0))).then_some(())
    });
}

// ---------------------------------------------------------------------------------------
// Output and records
// ---------------------------------------------------------------------------------------

#[test]
fn stdout_and_stderr_are_both_captured() {
    let sb = Sandbox::new();
    let out = sb.run(&["exec", "--", "echo a; echo b >&2; echo c"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert_eq!(out.stdout, "a\nb\nc\n");
    assert_eq!(out.stderr, "");
    let id = sb.job_ids().pop().unwrap();
    assert_eq!(
        fs::read_to_string(sb.job_dir(&id).join("output.log")).unwrap(),
        "a\nb\nc\n"
    );
    let v = sb.status(&id);
    assert_eq!(v["output"], "a\nb\nc\n");
    assert_eq!(v["outputBytes"], 6);
}

#[test]
fn large_output_is_stored_and_streamed_whole() {
    let sb = Sandbox::new();
    let expected: String = (1..=200_000).map(|i| format!("{i}\n")).collect();
    let out = sb.run(&["exec", "--", "seq 1 200000"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout == expected, "streamed output differs");
    let id = sb.job_ids().pop().unwrap();
    let stored = fs::read_to_string(sb.job_dir(&id).join("output.log")).unwrap();
    assert!(stored == expected, "stored output differs");
    let v = sb.status(&id);
    assert_eq!(v["outputBytes"], expected.len());
    assert!(expected.ends_with(text(&v, "output")));
}

#[test]
fn records_on_disk() {
    let sb = Sandbox::new();
    let secret = "records-secret-value-5678";
    let sf = secret_file(&sb, secret);
    let v = sb.start(&["--secret-file", &sf, "--", "echo out; sleep 300"]);
    let id = text(&v, "id");
    let dir = sb.job_dir(id);
    assert_eq!(mode(sb.home()), 0o700);
    assert_eq!(mode(&sb.home().join("jobs")), 0o700);
    assert_eq!(mode(&dir), 0o700);
    // While it runs, no file of the folder holds its secrets: they reached the supervisor
    // in memory.
    let holders = files_holding(&dir, secret);
    assert!(holders.is_empty(), "secret held by {holders:?}");

    sb.run(&["cancel", id]);
    sb.assert_no_leftovers();
    let rec = sb.raw_record(id);
    assert_eq!(rec["status"], "cancelled");
    assert!(
        rec["formatVersion"].as_u64().is_some_and(|v| v >= 1),
        "{rec:#}"
    );
    assert_eq!(rec["id"], id);
    assert_eq!(mode(&dir.join("job.json")), 0o600);
    assert!(dir.join("output.log").is_file());
    assert_eq!(fs::read_to_string(dir.join("output.log")).unwrap(), "out\n");
    // No temp files, no secret anywhere, no internal leftovers.
    let names: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
    assert_eq!(files_holding(&dir, secret), Vec::<String>::new());
    for n in &names {
        assert!(
            ["job.json", "output.log"].contains(&n.as_str()),
            "unexpected file {n} left in {names:?}"
        );
    }
    // No running marker left either.
    let running = sb.home().join("running");
    if running.is_dir() {
        assert_eq!(fs::read_dir(&running).unwrap().count(), 0);
    }
    if let Some(cg) = job_cgroup(id) {
        assert!(!cg.exists(), "cgroup {} left", cg.display());
    }
}

#[test]
fn logs_offset_and_follow() {
    let sb = Sandbox::new();
    let v = sb.start(&["--", "for i in 1 2 3 4 5; do echo line$i; sleep 0.3; done"]);
    let id = text(&v, "id");
    let all = "line1\nline2\nline3\nline4\nline5\n";
    // Without --follow: whatever is there now, at once.
    let now = sb.run(&["logs", id]);
    assert_eq!(now.code, Some(0), "{now:#?}");
    assert!(all.starts_with(&now.stdout), "{now:#?}");
    // --follow prints everything and returns when the job ends.
    let out = sb.run(&["logs", id, "--follow"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert_eq!(out.stdout, all);
    assert_eq!(sb.raw_record(id)["status"], "succeeded");
    // On an ended job.
    assert_eq!(sb.run(&["logs", id]).stdout, all);
    assert_eq!(sb.run(&["logs", id, "-f"]).stdout, all);
    let out = sb.run(&["logs", id, "--offset", "6"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert_eq!(out.stdout, &all[6..]);
    let out = sb.run(&["logs", id, "--offset", &all.len().to_string()]);
    assert_eq!((out.code, out.stdout.as_str()), (Some(0), ""));
    let out = sb.run(&["logs", id, "--offset", "1000"]);
    assert_ne!(out.code, Some(0), "{out:#?}");
    assert!(out.stderr.contains("offset"), "{out:#?}");
}

// ---------------------------------------------------------------------------------------
// Interrupts
// ---------------------------------------------------------------------------------------

#[test]
fn interrupting_exec_cancels_the_job() {
    let sb = Sandbox::new();
    for (sig, json) in [
        (libc::SIGINT, false),
        (libc::SIGTERM, true),
        (libc::SIGHUP, false),
    ] {
        let before = sb.job_ids();
        let mut args = vec!["exec", "--grace", "1"];
        if json {
            args.push("--json");
        }
        args.extend(["--", "sleep 300 & echo $! > bg; sleep 301"]);
        let _ = fs::remove_file(sb.file("bg"));
        let mut c = sb.cmd(&args);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = sb.spawn(c);
        let cli = child.id() as i32;
        // Once the CLI handles the signal, the job has started.
        eventually(PROMPT, "the CLI to handle the signal", || {
            (catches(cli, sig)).then_some(())
        });
        let bg = sb.pid_from("bg");
        kill(cli, sig);
        let out = sb.finish(child, PROMPT);
        assert_eq!(out.signal, None, "signal {sig}: CLI died: {out:#?}");
        assert_ne!(out.code, Some(0), "signal {sig}: {out:#?}");
        let id = sb
            .job_ids()
            .into_iter()
            .find(|i| !before.contains(i))
            .unwrap();
        let rec = sb.status(&id);
        assert_eq!(rec["status"], "cancelled", "signal {sig}: {rec:#}");
        if json {
            assert_eq!(out.json()["status"], "cancelled");
        }
        assert_dead(&[int(&rec, "pid"), bg], &id, PROMPT);
    }
    sb.assert_no_leftovers();
}

#[test]
fn interrupt_during_start_leaves_no_running_or_corrupt_job() {
    let sb = Sandbox::new();
    for _ in 0..3 {
        let before = sb.job_ids().len();
        let mut c = sb.cmd(&["exec", "--", "sleep 300"]);
        c.stdout(Stdio::null()).stderr(Stdio::null());
        let child = sb.spawn(c);
        let cli = child.id() as i32;
        // Ctrl-C as soon as the job's folder exists.
        eventually_spinning(PROMPT, "a job folder to appear", || {
            (sb.job_ids().len() != before).then_some(())
        });
        kill(cli, libc::SIGINT);
        sb.finish(child, PROMPT);
    }
    eventually(PROMPT, "every job to be ended and readable", || {
        ({
            let out = sb.run(&["status", "--json"]);
            let v = out.json();
            v["jobs"]
                .as_array()
                .unwrap()
                .iter()
                .all(|j| j.get("corrupt").is_none() && j["status"] != "running")
        })
        .then_some(())
    });
}

#[test]
fn closed_stdout_does_not_orphan_the_job() {
    let sb = Sandbox::new();
    let mut c = sb.cmd(&["exec", "--", "while :; do echo x; sleep 0.1; done"]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = sb.spawn(c);
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = [0u8; 2];
    stdout.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"x\n");
    drop(stdout); // as `| head -1` does
    let out = sb.finish(child, PROMPT);
    let id = sb.job_ids().pop().unwrap();
    let rec = sb.status(&id);
    assert_ne!(
        rec["status"], "running",
        "CLI exited ({out:?}) but its job runs on"
    );
}

#[test]
fn killed_cli_leaves_the_job_to_its_timeout() {
    // Killing the CLI with SIGKILL (no chance to cancel) leaves the job to its supervisor,
    // which still enforces the timeout.
    let sb = Sandbox::new();
    let mut c = sb.cmd(&["exec", "--timeout", "2", "--", "sleep 300"]);
    c.stdout(Stdio::null()).stderr(Stdio::null());
    let child = sb.spawn(c);
    let cli = child.id() as i32;
    // Started: its record names its supervisor. (A CLI killed before it spawned one, its
    // job's folder already in place, leaves a job nobody supervises: lost.)
    let id = eventually(PROMPT, "the job to start", || {
        let id = sb.job_ids().pop()?;
        (catches(cli, libc::SIGINT) && sb.raw_record(&id)["supervisorPid"].is_i64()).then_some(id)
    });
    kill(cli, libc::SIGKILL);
    let out = sb.finish(child, PROMPT);
    assert_eq!(out.signal, Some(libc::SIGKILL));
    let end = sb.wait_final(&id, PROMPT);
    assert_eq!(end["status"], "timed_out", "{end:#}");
    sb.assert_no_leftovers();
}

// ---------------------------------------------------------------------------------------
// More of exec: env, cwd, stdin, --wait, the output cap, sessions, exit status of cancel
// ---------------------------------------------------------------------------------------

#[test]
fn env_and_cwd_reach_the_job() {
    let sb = Sandbox::new();
    fs::create_dir(sb.file("sub")).unwrap();
    let (out, v) = sb.exec_json(&[
        "--env",
        "GT_ONE=one",
        "--env",
        "GT_EQ=a=b",
        "--env",
        "GT_EMPTY=",
        "--cwd",
        "sub",
        "--",
        "echo \"$GT_ONE $GT_EQ [${GT_EMPTY-unset}]\"; pwd",
    ]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    let sub = fs::canonicalize(sb.file("sub")).unwrap();
    let sub = sub.to_string_lossy();
    assert_eq!(v["output"], format!("one a=b []\n{sub}\n"));
    // A relative --cwd is recorded as the absolute folder.
    assert_eq!(v["cwd"], sub.as_ref());
}

#[test]
fn job_stdin_is_not_the_callers_with_no_stdin() {
    let sb = Sandbox::new();
    // A caller whose stdin is a pipe it never closes (a spawn's default in many
    // languages) would make a reading job wait for it, as with ssh: `-n` says not to.
    // (The stdin exec passes on is tested in cli_io.)
    let mut c = sb.cmd(&["exec", "-n", "--", "cat; echo done"]);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = sb.spawn(c);
    let stdin = child.stdin.take();
    let out = sb.finish(child, PROMPT);
    drop(stdin);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert_eq!(out.stdout, "done\n");
}

#[test]
fn wait_returns_a_running_job_when_it_expires() {
    let sb = Sandbox::new();
    let (out, v) = sb.exec_json(&["--wait", "1", "--", "sleep 300"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert!(out.elapsed < PROMPT, "took {:?}", out.elapsed);
    assert_eq!(v["status"], "running");
    assert_eq!(v["isError"], false);
    let id = text(&v, "id");
    assert!(alive_in_job(int(&v, "pid"), id));
    // Without --json: a word on stderr, exit 0, the job goes on.
    let out = sb.run(&["exec", "--wait", "2", "--", "echo hi; sleep 300"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert_eq!(out.stdout, "hi\n");
    assert!(out.stderr.contains("running"), "{out:#?}");
    for id in sb.job_ids() {
        assert_eq!(sb.run(&["cancel", &id]).code, Some(0));
    }
    sb.assert_no_leftovers();
}

#[test]
fn output_cap_keeps_the_first_bytes() {
    let sb = Sandbox::new();
    let (out, v) = sb.exec_json(&["--max-output-bytes", "10", "--", "seq 1 100"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert_eq!(v["status"], "succeeded");
    assert_eq!(v["outputBytes"], 10);
    assert_eq!(v["outputTruncated"], true);
    assert_eq!(v["output"], "1\n2\n3\n4\n5\n");
    assert!(!text(&v, "reason").is_empty());
    let log = fs::read_to_string(sb.job_dir(text(&v, "id")).join("output.log")).unwrap();
    assert_eq!(log, "1\n2\n3\n4\n5\n");
}

#[test]
fn job_runs_in_its_own_session_and_group() {
    let sb = Sandbox::new();
    let v = sb.start(&["--", "sleep 300"]);
    let pid = int(&v, "pid");
    assert_eq!(int(&v, "pgid"), pid);
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    // fields[1] ppid, [2] pgrp, [3] session
    assert_eq!(fields[2], pid.to_string(), "pgrp: {stat}");
    assert_eq!(fields[3], pid.to_string(), "session: {stat}");
    assert_eq!(
        fields[1],
        int(&v, "supervisorPid").to_string(),
        "ppid: {stat}"
    );
    // The supervisor is detached from the CLI (and so from the caller's terminal): it is
    // in another session than ours, which the CLI shared.
    let sup = int(&v, "supervisorPid");
    let sstat = fs::read_to_string(format!("/proc/{sup}/stat")).unwrap();
    let sfields: Vec<&str> = sstat[sstat.rfind(')').unwrap() + 2..].split(' ').collect();
    // SAFETY: getsid(0) only reads our own session id.
    let ours = unsafe { libc::getsid(0) };
    assert_ne!(sfields[3], ours.to_string(), "supervisor session: {sstat}");
    // Where the machine allows a cgroup, the job is in its own.
    if let Some(cg) = job_cgroup(text(&v, "id")).filter(|c| c.exists()) {
        let procs = fs::read_to_string(cg.join("cgroup.procs")).unwrap();
        assert!(
            procs.lines().any(|l| l == pid.to_string()),
            "{pid} not in {}: {procs:?}",
            cg.display()
        );
    }
    sb.run(&["cancel", text(&v, "id")]);
    sb.assert_no_leftovers();
}

#[test]
fn cancelled_exec_never_exits_zero() {
    let sb = Sandbox::new();
    let mut c = sb.cmd(&[
        "exec",
        "--json",
        "--",
        "trap 'exit 0' TERM; echo ready; while :; do sleep 0.1; done",
    ]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = sb.spawn(c);
    let cli = child.id() as i32;
    eventually(PROMPT, "the job to start", || {
        (catches(cli, libc::SIGINT) && !sb.job_ids().is_empty()).then_some(())
    });
    let id = sb.job_ids().pop().unwrap();
    eventually(PROMPT, "the job to be ready", || {
        (fs::read_to_string(sb.job_dir(&id).join("output.log")).is_ok_and(|o| o.contains("ready")))
            .then_some(())
    });
    assert_eq!(sb.run(&["cancel", &id]).code, Some(0));
    let out = sb.finish(child, PROMPT);
    let v = out.json();
    assert_eq!(v["status"], "cancelled");
    assert_eq!(v["isError"], true);
    assert_ne!(out.code, Some(0), "a cancelled job exited 0: {v:#}");
}
