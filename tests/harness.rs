//! The harness itself: its guard must fail a test that leaves a process behind, and must
//! not fail one that leaves the agent's jobs to be ended; a skipped test must say so past
//! the runner's capture, and fail where nothing root-only may skip.

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::util::*;

/// Drops `sb` and returns the guard's complaint, if any.
fn guard_complaint(sb: Sandbox) -> Option<String> {
    let outcome = catch_unwind(AssertUnwindSafe(move || drop(sb)));
    outcome.err().map(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

#[test]
fn the_guard_fails_a_test_that_leaves_a_job_process_behind() {
    // What `a_changed_boot_id_marks_running_jobs_lost` once did: its supervisor killed, the
    // job settled as lost under another boot id (so the agent, rightly, signals none of its
    // recorded pids), and its `sleep` left running.
    let sb = Sandbox::new();
    let boot = sb.dir().join("boot_id");
    std::fs::write(&boot, "boot-a\n").unwrap();
    let mut c = sb.cmd(&["exec", "--wait", "0", "--json", "--", "sleep 30"]);
    c.env("GITTERM_BOOT_ID_FILE", &boot);
    let rec = sb.run_cmd(c).json();
    let (id, sup) = (text(&rec, "id").to_string(), int(&rec, "supervisorPid"));
    kill(sup, libc::SIGKILL);
    eventually(PROMPT, "the supervisor to die", || {
        (!alive(sup.into())).then_some(())
    });
    std::fs::write(&boot, "boot-b\n").unwrap();
    let mut c = sb.cmd(&["status", &id, "--json"]);
    c.env("GITTERM_BOOT_ID_FILE", &boot);
    assert_eq!(sb.run_cmd(c).json()["status"], "lost");
    let left = job_processes(&id);
    assert!(
        left.iter().any(|p| p.cmdline.contains("sleep 30")),
        "the job's sleep should still run: {left:?}"
    );

    let complaint = guard_complaint(sb).expect("the guard let a leftover process pass");
    for p in &left {
        assert!(complaint.contains(&format!("{} ", p.pid)), "{complaint}");
    }
    assert!(complaint.contains("sleep 30"), "{complaint}");
    assert!(
        job_processes(&id).is_empty(),
        "the guard did not kill {left:?}"
    );
}

#[test]
fn the_guard_fails_a_test_that_leaves_any_process_naming_its_folder() {
    // Not a job at all: a process the test started, that outlived its own parent.
    let sb = Sandbox::new();
    let mut c = sb.command("sh");
    c.args(["-c", "sleep 30 >/dev/null 2>&1 & echo $! > orphan"]);
    assert!(sb.run_cmd(c).success());
    let pid = sb.pid_from("orphan");
    assert!(alive(pid.into()));
    let complaint = guard_complaint(sb).expect("the guard let a leftover process pass");
    assert!(complaint.contains(&format!("{pid} ")), "{complaint}");
    eventually(PROMPT, "the orphan to be killed", || {
        (!alive(pid.into())).then_some(())
    });
}

#[test]
fn the_guard_lets_the_agent_end_jobs_left_running() {
    let sb = Sandbox::new();
    let v = sb.start(&["--", "sleep 300 & echo $! > bg; sleep 301"]);
    let id = text(&v, "id").to_string();
    let bg = sb.pid_from("bg");
    let shell = int(&v, "pid");
    assert_eq!(guard_complaint(sb), None);
    assert!(dead_or_not_of_job(bg, &id) && dead_or_not_of_job(shell, &id));
}

#[test]
fn eventually_returns_the_value_or_names_what_it_waited_for() {
    let mut n = 0;
    let got = eventually(PROMPT, "three tries", || {
        n += 1;
        (n == 3).then_some(n * 10)
    });
    assert_eq!(got, 30);
    let failed = catch_unwind(|| {
        eventually(
            std::time::Duration::from_millis(30),
            "the impossible",
            || None::<()>,
        )
    });
    let msg = failed.expect_err("should time out");
    let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("the impossible"), "{msg}");
}

#[test]
fn timestamps_are_read_as_the_agent_writes_them() {
    assert_eq!(epoch_ms("1970-01-01T00:00:00.000Z"), Some(0));
    assert_eq!(epoch_ms("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(
        epoch_ms("2026-11-30T21:57:19.123Z"),
        Some(1_796_075_839_123)
    );
    assert_eq!(epoch_ms("2000-02-29T00:00:00.5Z"), Some(951_782_400_500));
    assert_eq!(epoch_ms("nonsense"), None);
    assert!(now_ms() > 1_700_000_000_000);
}

/// Not a test of its own: what [`a_skipped_test_says_so_and_fails_where_all_must_run`] runs
/// in a child test binary.
#[test]
#[ignore = "run by harness::a_skipped_test_says_so_and_fails_where_all_must_run"]
fn skip_probe() {
    skip_root("the probe's reason");
}

#[test]
fn a_skipped_test_says_so_and_fails_where_all_must_run() {
    let sb = Sandbox::new();
    let log = sb.file("skips.log");
    let probe = |require_all: bool, threads: &str| {
        let mut c = std::process::Command::new(std::env::current_exe().unwrap());
        c.args([
            "--exact",
            "harness::skip_probe",
            "--ignored",
            "--test-threads",
            threads,
        ])
        .env(skip::SKIP_LOG, &log)
        .env_remove(skip::REQUIRE_ALL);
        if require_all {
            c.env(skip::REQUIRE_ALL, "1");
        }
        c.output().unwrap()
    };
    let line = "SKIPPED harness::skip_probe: the probe's reason";
    for threads in ["1", "2"] {
        let _ = std::fs::remove_file(&log);
        let out = probe(false, threads);
        assert!(out.status.success(), "{out:?}");
        // The runner captured the passing probe's output; the line is on stderr all the same.
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(line), "threads {threads}: {stderr}");
        assert_eq!(std::fs::read_to_string(&log).unwrap(), format!("{line}\n"));
    }
    let _ = std::fs::remove_file(&log);
    let out = probe(true, "2");
    assert!(
        !out.status.success(),
        "a root-only skip passed under REQUIRE_ALL: {out:?}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("root-only test would skip: the probe's reason"),
        "{stdout}"
    );
    assert!(!log.exists(), "a failed skip was logged as a skip");
}
