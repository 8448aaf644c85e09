//! The command line's edges: bad input of every kind (a clear error, nothing written), the
//! status table, and corrupt records.

use std::fs;

use crate::util::*;

/// Runs `args` and checks it failed clearly without creating any job folder.
fn refused(sb: &Sandbox, args: &[&str], names: &str) {
    let before = sb.job_ids();
    let out = sb.run(args);
    assert!(
        out.code.is_some_and(|c| c != 0),
        "{args:?} should fail: {out:#?}"
    );
    assert!(
        out.stderr.contains(names),
        "{args:?}: stderr should name {names:?}: {out:#?}"
    );
    assert_eq!(sb.job_ids(), before, "{args:?} wrote a job folder");
    // Nor is anything of it left running.
    let home = format!("GITTERM_HOME={}", sb.home().display());
    eventually(PROMPT, "the refused exec's processes gone", || {
        scan(|_, env| has_env_entry(env, home.as_bytes()))
            .is_empty()
            .then_some(())
    });
}

#[test]
fn bad_exec_input_is_refused_and_writes_nothing() {
    let sb = Sandbox::new();
    let file = sb.file("a-file");
    fs::write(&file, "x").unwrap();
    let file = file.to_string_lossy().into_owned();
    let missing = sb.file("no-such-folder").to_string_lossy().into_owned();
    refused(
        &sb,
        &["exec", "--cwd", &missing, "--", "true"],
        "no-such-folder",
    );
    refused(&sb, &["exec", "--cwd", &file, "--", "true"], "a-file");
    refused(
        &sb,
        &["exec", "--env", "NOEQUALS", "--", "true"],
        "NOEQUALS",
    );
    refused(&sb, &["exec", "--env", "1BAD=x", "--", "true"], "1BAD");
    refused(&sb, &["exec", "--env", "=x", "--", "true"], "name");
    refused(&sb, &["exec", "--env", "A-B=x", "--", "true"], "A-B");
    for t in ["-5", "abc", "0", "1e30", "NaN", "inf", "-0", ""] {
        refused(&sb, &["exec", "--timeout", t, "--", "true"], "--timeout");
    }
    refused(
        &sb,
        &["exec", "--idle-timeout", "0", "--", "true"],
        "--idle-timeout",
    );
    refused(&sb, &["exec", "--wait", "-1", "--", "true"], "--wait");
    refused(&sb, &["exec", "--wait", "x", "--", "true"], "--wait");
    refused(&sb, &["exec", "--grace", "-1", "--", "true"], "--grace");
    refused(&sb, &["exec", "--grace", "NaN", "--", "true"], "--grace");
    refused(
        &sb,
        &["exec", "--max-job-seconds", "0", "--", "true"],
        "--max-job-seconds",
    );
    refused(
        &sb,
        &["exec", "--max-running", "0", "--", "true"],
        "--max-running",
    );
    refused(&sb, &["exec", "--", ""], "command");
    refused(&sb, &["exec", "--", "  "], "command");
    refused(&sb, &["exec"], "COMMAND");
    refused(
        &sb,
        &["exec", "--secret-file", &missing, "--", "true"],
        "no-such-folder",
    );
    // And a good one still works afterwards.
    let out = sb.run(&["exec", "--", "true"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert_eq!(sb.job_ids().len(), 1);
}

#[test]
fn bad_or_unknown_ids_are_not_found() {
    let sb = Sandbox::new();
    // One real job, so the jobs folder is not empty.
    assert_eq!(sb.run(&["exec", "--", "true"]).code, Some(0));
    let outside = sb.home().join("etc");
    fs::create_dir(&outside).unwrap();
    for id in [
        "../../etc",
        "../etc",
        "job_XYZ",
        "job_0123456789abcdef0123", // well formed, unknown
        "JOB_0123456789ABCDEF0123",
        "job_0123456789abcdef01234",
        "",
    ] {
        for cmd in [
            vec!["status", id],
            vec!["status", id, "--json"],
            vec!["logs", id],
            vec!["logs", id, "--follow"],
            vec!["cancel", id],
        ] {
            refused(&sb, &cmd, "no job");
        }
    }
    assert!(outside.is_dir());
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    refused(&sb, &["logs"], "ID");
    refused(&sb, &["cancel"], "ID");
    let id = sb.job_ids().pop().unwrap();
    refused(&sb, &["logs", &id, "--offset", "abc"], "--offset");
    refused(&sb, &["logs", &id, "--offset", "-1"], "-1");
}

#[test]
fn help_and_version() {
    let sb = Sandbox::new();
    let out = sb.run(&["--help"]);
    assert_eq!(out.code, Some(0));
    assert!(out.stdout.contains("exec"));
    let out = sb.run(&["--version"]);
    assert_eq!(out.code, Some(0));
    assert!(out.stdout.contains(env!("CARGO_PKG_VERSION")));
    refused(&sb, &["no-such-subcommand"], "no-such-subcommand");
}

#[test]
fn status_table_lists_jobs() {
    let sb = Sandbox::new();
    let out = sb.run(&["status"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert!(out.stdout.starts_with("ID"), "{out:#?}");
    assert_eq!(
        sb.run(&["status", "--json"]).json()["jobs"],
        serde_json::json!([])
    );

    let (_, ok) = sb.exec_json(&["--", "echo hi"]);
    let (_, bad) = sb.exec_json(&["--", "exit 3"]);
    let run = sb.start(&["--", "sleep 300"]);
    let out = sb.run(&["status"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(lines[0].contains("STATUS"), "{out:#?}");
    assert_eq!(lines.len(), 4, "{out:#?}");
    for (v, status) in [(&ok, "succeeded"), (&bad, "failed"), (&run, "running")] {
        let id = text(v, "id");
        let line = lines
            .iter()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("{id} not listed: {out:#?}"));
        assert!(line.contains(status), "{line}");
    }
    // Newest first.
    assert!(lines[1].starts_with(text(&run, "id")), "{out:#?}");
    let list = sb.run(&["status", "--json"]).json();
    let jobs = list["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 3);
    assert_eq!(jobs[0]["id"], run["id"]);
    sb.run(&["cancel", text(&run, "id")]);
    sb.assert_no_leftovers();
}

#[test]
fn corrupt_record_is_listed_and_the_rest_still_works() {
    let sb = Sandbox::new();
    let (_, good) = sb.exec_json(&["--", "echo good"]);
    let (_, victim) = sb.exec_json(&["--", "echo victim"]);
    let good = text(&good, "id").to_string();
    let victim = text(&victim, "id").to_string();
    fs::write(sb.job_dir(&victim).join("job.json"), "{ not json at all").unwrap();

    let out = sb.run(&["status"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with(&victim))
        .unwrap_or_else(|| panic!("corrupt job not listed: {out:#?}"));
    assert!(line.contains("corrupt"), "{line}");
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with(&good) && l.contains("succeeded"))
    );

    let list = sb.run(&["status", "--json"]);
    assert_eq!(list.code, Some(0), "{list:#?}");
    let jobs = list.json()["jobs"].as_array().unwrap().clone();
    let entry = jobs.iter().find(|j| j["id"] == victim.as_str()).unwrap();
    assert_eq!(entry["corrupt"], true, "{entry:#}");

    for args in [
        vec!["status", victim.as_str()],
        vec!["status", victim.as_str(), "--json"],
    ] {
        let out = sb.run(&args);
        assert!(out.code.is_some_and(|c| c != 0), "{out:#?}");
        assert!(out.stderr.contains("corrupt"), "{out:#?}");
    }
    // Other jobs still work, and so does a new one.
    assert_eq!(sb.status(&good)["status"], "succeeded");
    assert_eq!(sb.run(&["logs", &good]).stdout, "good\n");
    let out = sb.run(&["exec", "--", "echo after"]);
    assert_eq!((out.code, out.stdout.as_str()), (Some(0), "after\n"));
    // An empty job.json and a folder without one are corrupt as well.
    fs::write(sb.job_dir(&good).join("job.json"), "").unwrap();
    fs::create_dir(sb.home().join("jobs").join("job_00000000000000000000")).unwrap();
    let out = sb.run(&["status"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert_eq!(
        out.stdout.lines().filter(|l| l.contains("corrupt")).count(),
        3,
        "{out:#?}"
    );
    // Foreign names in the jobs folder are ignored.
    fs::create_dir(sb.home().join("jobs").join("not-a-job")).unwrap();
    assert_eq!(sb.run(&["status"]).code, Some(0));
}

#[test]
fn listing_during_a_start_shows_no_corrupt_job() {
    let sb = Sandbox::new();
    std::thread::scope(|s| {
        let starter = s.spawn(|| {
            for _ in 0..10 {
                assert_eq!(sb.run(&["exec", "--", "true"]).code, Some(0));
            }
        });
        let mut sightings = Vec::new();
        while !starter.is_finished() {
            let out = sb.run(&["status"]);
            assert_eq!(out.code, Some(0), "{out:#?}");
            sightings.extend(
                out.stdout
                    .lines()
                    .filter(|l| l.contains("corrupt"))
                    .map(String::from),
            );
        }
        starter.join().unwrap();
        assert!(sightings.is_empty(), "{sightings:#?}");
    });
}
