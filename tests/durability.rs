//! Durability with real processes: boot changes, corrupt records, output caps, full disks,
//! pruning, older record formats, and a killed CLI.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_gitterm-agent");

/// A temp state root; on drop, every job still running under it is killed.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        Home {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .env("GITTERM_HOME", self.root())
            .env_remove("GITTERM_BOOT_ID_FILE");
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).stdin(Stdio::null()).output().unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.run(args);
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stderr)))
    }

    fn wait_status(&self, id: &str, want: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let v = self.json(&["status", id, "--json"]);
            if v["status"] == want || Instant::now() > deadline {
                return v;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        kill_jobs_under(&self.root());
    }
}

/// Kills every supervisor started for this root (their shells die with them).
fn kill_jobs_under(root: &Path) {
    let needle = root.to_string_lossy().into_owned();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains("supervise") && cmdline.contains(&needle) {
            // SAFETY: plain kill(2) of a process this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

#[test]
fn a_changed_boot_id_marks_running_jobs_lost() {
    let h = Home::new();
    let boot = h.dir.path().join("boot_id");
    std::fs::write(&boot, "boot-a\n").unwrap();
    let out = h
        .cmd(&["exec", "--wait", "0", "--json", "--", "sleep 30"])
        .env("GITTERM_BOOT_ID_FILE", &boot)
        .output()
        .unwrap();
    let rec: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rec["status"], "running");
    assert_eq!(rec["bootId"], "boot-a");
    let id = rec["id"].as_str().unwrap();
    // A restore brings back the files, not the processes: the supervisor is gone.
    let sup = rec["supervisorPid"].as_i64().unwrap() as i32;
    // SAFETY: plain kill(2) of the supervisor this test started.
    unsafe { libc::kill(sup, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{sup}")).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::write(&boot, "boot-b\n").unwrap();
    let out = h
        .cmd(&["status", id, "--json"])
        .env("GITTERM_BOOT_ID_FILE", &boot)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "lost");
    assert!(
        v["reason"].as_str().unwrap().contains("sandbox restarted"),
        "{v}"
    );
    assert!(v["endedAt"].is_string());
}

#[test]
fn a_changed_boot_id_does_not_end_a_job_whose_supervisor_lives() {
    // A checkpoint/restore that keeps the processes: the lock decides, not the boot id.
    let h = Home::new();
    let boot = h.dir.path().join("boot_id");
    std::fs::write(&boot, "boot-a\n").unwrap();
    let out = h
        .cmd(&["exec", "--wait", "0", "--json", "--", "sleep 1; echo done"])
        .env("GITTERM_BOOT_ID_FILE", &boot)
        .output()
        .unwrap();
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::write(&boot, "boot-b\n").unwrap();
    let out = h
        .cmd(&["status", &id, "--json"])
        .env("GITTERM_BOOT_ID_FILE", &boot)
        .output()
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["status"],
        "running"
    );
    assert_eq!(h.wait_status(&id, "succeeded")["output"], "done\n");
}

#[test]
fn a_corrupt_record_is_reported_and_others_keep_working() {
    let h = Home::new();
    let a = h.json(&["exec", "--json", "--", "echo a"]);
    let b = h.json(&["exec", "--json", "--", "echo b"]);
    let bad = a["id"].as_str().unwrap();
    let rec = h.root().join("jobs").join(bad).join("job.json");
    let text = std::fs::read(&rec).unwrap();
    std::fs::write(&rec, &text[..text.len() / 2]).unwrap();

    let out = h.run(&["status"]);
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.contains(bad) && l.contains("corrupt")),
        "{table}"
    );
    assert!(table.contains(b["id"].as_str().unwrap()));

    let list = h.json(&["status", "--json"]);
    let entry = list["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"] == bad)
        .unwrap()
        .clone();
    assert_eq!(entry["corrupt"], true);
    assert!(entry["error"].as_str().unwrap().contains("corrupt"));

    let one = h.run(&["status", bad]);
    assert!(!one.status.success());
    assert!(String::from_utf8_lossy(&one.stderr).contains("corrupt"));

    let c = h.json(&["exec", "--json", "--", "echo c"]);
    assert_eq!(c["status"], "succeeded");
    assert_eq!(c["output"], "c\n");
}

#[test]
fn the_output_cap_drops_output_but_the_job_runs_on() {
    let h = Home::new();
    let v = h.json(&[
        "exec",
        "--json",
        "--max-output-bytes",
        "1000",
        "--",
        "for i in $(seq 1 2000); do echo line-$i; done; echo finished >&2; exit 3",
    ]);
    assert_eq!(v["status"], "failed");
    assert_eq!(v["exitCode"], 3);
    assert_eq!(v["outputTruncated"], true);
    assert!(v["outputDroppedBytes"].as_u64().unwrap() > 10_000);
    assert!(v["outputBytes"].as_u64().unwrap() <= 1000);
    let log = h
        .root()
        .join("jobs")
        .join(v["id"].as_str().unwrap())
        .join("output.log");
    let stored = std::fs::read(log).unwrap();
    assert!(stored.len() <= 1000 && stored.starts_with(b"line-1\nline-2\n"));
    assert!(v["reason"].as_str().unwrap().contains("cap"));
}

#[test]
fn a_full_disk_still_records_the_end() {
    let h = Home::new();
    let mnt = h.dir.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=512k", "tmpfs"])
        .arg(&mnt)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: cannot mount a tmpfs here");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _u = Unmount(mnt.clone());
    let out = Command::new(BIN)
        .args([
            "exec",
            "--json",
            "--",
            "head -c 2000000 /dev/zero | tr '\\0' 'a'; echo; echo done",
        ])
        .env("GITTERM_HOME", mnt.join("root"))
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "succeeded", "{v}");
    assert_eq!(v["outputTruncated"], true);
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .contains("could not be stored"),
        "{v}"
    );
    kill_jobs_under(&mnt.join("root"));
}

#[test]
fn prune_removes_the_oldest_ended_jobs_and_never_a_running_one() {
    let h = Home::new();
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(
            h.json(&["exec", "--json", "--", &format!("echo {i}")])["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let running = h.json(&["exec", "--wait", "0", "--json", "--", "sleep 30"]);
    let running_id = running["id"].as_str().unwrap();
    let v = h.json(&["prune", "--keep-jobs", "1", "--json"]);
    let removed: Vec<&str> = v["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    assert_eq!(
        removed,
        vec![ids[0].as_str(), ids[1].as_str(), ids[2].as_str()]
    );
    assert!(h.root().join("jobs").join(&ids[3]).is_dir());
    assert!(h.root().join("jobs").join(running_id).is_dir());
    let v = h.json(&["prune", "--keep-jobs", "0", "--keep-days", "0", "--json"]);
    assert_eq!(v["removed"].as_array().unwrap().len(), 1);
    assert!(h.root().join("jobs").join(running_id).is_dir());
    h.run(&["cancel", running_id]);
}

#[test]
fn a_record_in_an_older_format_is_read_served_and_kept() {
    let h = Home::new();
    h.run(&["status"]); // creates the root
    let id = "job_00112233445566778899";
    let dir = h.root().join("jobs").join(id);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("job.json"),
        r#"{"id":"job_00112233445566778899","command":"echo old","cwd":"/","status":"succeeded",
           "exitCode":0,"signal":null,"createdAt":"2026-01-01T00:00:00Z","startedAt":"2026-01-01T00:00:00Z",
           "endedAt":"2026-01-01T00:00:01Z","timeoutSeconds":60,"pid":10,"pgid":10,"outputBytes":4,
           "someFutureField":{"kept":true}}"#,
    )
    .unwrap();
    std::fs::write(dir.join("output.log"), "old\n").unwrap();
    let v = h.json(&["status", id, "--json"]);
    assert_eq!(v["status"], "succeeded");
    assert_eq!(v["output"], "old\n");
    assert_eq!(v["someFutureField"]["kept"], true);
    let c = h.json(&["cancel", id, "--json"]);
    assert_eq!(
        c["status"], "succeeded",
        "cancelling an ended job changes nothing"
    );
    assert!(String::from_utf8_lossy(&h.run(&["status"]).stdout).contains(id));
}

#[test]
fn a_killed_cli_loses_nothing() {
    let h = Home::new();
    let mut cli = h
        .cmd(&["exec", "--json", "--", "sleep 1; echo done"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the job exists, then kill the CLI outright.
    let deadline = Instant::now() + Duration::from_secs(20);
    let id = loop {
        let list = h.json(&["status", "--json"]);
        // Once the shell runs (it has a pid), the job no longer needs the CLI.
        let first = list["jobs"].as_array().and_then(|a| a.first()).cloned();
        if let Some(j) = first.filter(|j| j["pid"].is_number()) {
            break j["id"].as_str().unwrap().to_string();
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    };
    cli.kill().unwrap();
    cli.wait().unwrap();
    let v = h.wait_status(&id, "succeeded");
    assert_eq!(v["status"], "succeeded");
    assert_eq!(v["output"], "done\n");
}

/// Every file under `dir` but the job's own secrets file, with its content.
fn files_outside_secrets(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_outside_secrets(&p));
        } else if p.file_name().is_some_and(|n| n != "secrets.env") {
            out.push((p.clone(), std::fs::read(&p).unwrap_or_default()));
        }
    }
    out
}

#[test]
fn a_secret_spelled_out_in_the_command_reaches_no_file_but_the_secrets_file() {
    let h = Home::new();
    let secrets = h.dir.path().join("s.env");
    std::fs::write(&secrets, "TOKEN_Q=literal-secret-987\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o600)).unwrap();
    let rec = h.json(&[
        "exec",
        "--wait",
        "0",
        "--json",
        "--secret-file",
        secrets.to_str().unwrap(),
        "--",
        "echo literal-secret-987; sleep 1; echo \"$TOKEN_Q\"",
    ]);
    let id = rec["id"].as_str().unwrap();
    assert!(!rec.to_string().contains("literal-secret-987"), "{rec}");
    // While it runs, and after it ended, only the secrets file may hold the value.
    for (path, data) in files_outside_secrets(&h.root()) {
        assert!(
            !String::from_utf8_lossy(&data).contains("literal-secret-987"),
            "{}",
            path.display()
        );
    }
    let v = h.wait_status(id, "succeeded");
    assert_eq!(v["output"], "[redacted]\n[redacted]\n");
    assert!(!h.root().join("jobs").join(id).join("secrets.env").exists());
    for (path, data) in files_outside_secrets(&h.root()) {
        assert!(
            !String::from_utf8_lossy(&data).contains("literal-secret-987"),
            "{}",
            path.display()
        );
    }
}

/// Writes a finished or running record by hand, as an earlier boot would have left it.
fn plant_record(root: &Path, id: &str, status: &str, ended: &str, boot: &str) {
    let dir = root.join("jobs").join(id);
    std::fs::create_dir_all(&dir).unwrap();
    let rec = serde_json::json!({
        "formatVersion": 1, "id": id, "command": "true", "cwd": "/", "status": status,
        "exitCode": if status == "running" { Value::Null } else { 0.into() }, "signal": null,
        "createdAt": ended, "startedAt": ended,
        "endedAt": if status == "running" { Value::Null } else { ended.into() },
        "timeoutSeconds": 60, "pid": 999_999, "pgid": 999_999, "outputBytes": 0, "bootId": boot,
    });
    std::fs::write(dir.join("job.json"), rec.to_string()).unwrap();
    std::fs::write(dir.join("lock"), "").unwrap();
}

#[test]
fn serve_after_a_restore_says_resumed_settles_old_jobs_and_prunes() {
    let h = Home::new();
    let root = h.root();
    std::fs::create_dir_all(root.join("jobs")).unwrap();
    std::fs::write(
        root.join("sandbox.json"),
        r#"{"bootId":"boot-before-the-snapshot"}"#,
    )
    .unwrap();
    std::fs::write(
        root.join("env.json"),
        r#"{"formatVersion":1,"vars":{"KEPT":"yes"}}"#,
    )
    .unwrap();
    let running = "job_aaaaaaaaaaaaaaaaaaa1";
    plant_record(
        &root,
        running,
        "running",
        "2026-11-01T00:00:00.000Z",
        "boot-before-the-snapshot",
    );
    for (i, day) in ["01", "02", "03"].iter().enumerate() {
        plant_record(
            &root,
            &format!("job_bbbbbbbbbbbbbbbbbbb{i}"),
            "succeeded",
            &format!("2026-11-{day}T00:00:00.000Z"),
            "boot-before-the-snapshot",
        );
    }
    let mut srv = h
        .cmd(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--keep-jobs",
            "2",
            "--keep-days",
            "3650",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(srv.stderr.take().unwrap()));
    let _srv = Kill(srv);
    let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["resumed"], true);
    let addr = first["address"].as_str().unwrap().to_string();
    let token = std::fs::read_to_string(root.join("agent.token")).unwrap();
    let get = |path: &str| -> Value {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n", token.trim()).unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        serde_json::from_str(resp.split_once("\r\n\r\n").unwrap().1).unwrap()
    };
    let sb = get("/v1/sandbox");
    assert_eq!(sb["resumed"], true);
    assert_eq!(
        sb["envNames"],
        serde_json::json!(["KEPT"]),
        "the persisted env survives"
    );
    // The rescan settles the old boot's running job (now the newest ended one), and pruning
    // keeps it and the newest of the others.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let jobs = get("/v1/jobs");
        let list = jobs["jobs"].as_array().unwrap().clone();
        let lost = list.iter().find(|j| j["id"] == running).cloned();
        let ended = list.iter().filter(|j| j["status"] == "succeeded").count();
        if lost.as_ref().is_some_and(|j| j["status"] == "lost") && ended == 1 {
            assert!(
                lost.unwrap()["reason"]
                    .as_str()
                    .unwrap()
                    .contains("sandbox restarted")
            );
            assert_eq!(
                list.iter().find(|j| j["status"] == "succeeded").unwrap()["id"],
                "job_bbbbbbbbbbbbbbbbbbb2"
            );
            break;
        }
        assert!(Instant::now() < deadline, "{jobs}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
