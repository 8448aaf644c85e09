//! Job resources and process control: limits on the job's cgroups (real ones, on this
//! machine's hierarchies), usage live and final, OOM kills named, signals, argv, stderr
//! apart, and nothing of a job's cgroups left after it.

use std::path::Path;
use std::sync::Arc;

use crate::util::*;

/// What `GET /v1/sandbox` says this machine can enforce; skips (returning `None`) when a
/// test needs a limit it cannot.
fn can(s: &Server, what: &str) -> Option<()> {
    let v = s.client().get("/v1/sandbox").json();
    if v["limits"][what] == true {
        return Some(());
    }
    skip_root(&format!(
        "this sandbox cannot enforce {what} limits: {}",
        v["limits"]
    ));
    None
}

/// The same for the CLI, asked through a throwaway server in `sb`.
fn can_cli(sb: &Arc<Sandbox>, what: &str) -> Option<()> {
    let s = Server::start_in(Arc::clone(sb), "127.0.0.1:0", &[]);
    can(&s, what)
}

/// The cgroup folders a record names (its v2 fence and its v1 folders).
fn cgroup_folders(rec: &Value) -> Vec<String> {
    let mut all: Vec<String> = rec["cgroupsV1"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    if let Some(f) = rec["cgroup"].as_str() {
        all.push(f.to_string());
    }
    all
}

/// Every folder named for `id` under a cgroup mount (any hierarchy, any depth below
/// this process's own place).
fn folders_named(id: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut todo = vec![std::path::PathBuf::from("/sys/fs/cgroup")];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let p = e.path();
                if e.file_name() == id {
                    found.push(p.display().to_string());
                }
                // Only our own folders are deep: other trees are not walked far.
                if p.components().count() < 12 {
                    todo.push(p);
                }
            }
        }
    }
    found
}

/// Whether this process may read the kernel's log, where the OOM killer names its victim
/// and the group whose limit was reached (root with CAP_SYSLOG); without it the agent
/// names only what it reaped itself.
fn kernel_log_readable() -> bool {
    std::fs::File::open("/dev/kmsg").is_ok()
}

fn f64_of(v: &Value, ptr: &str) -> f64 {
    v.pointer(ptr)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{ptr} is not a number in {v:#}"))
}

#[test]
fn a_job_over_its_memory_limit_is_oom_killed_and_named() {
    let sb = Arc::new(Sandbox::new());
    if can_cli(&sb, "memory").is_none() {
        return;
    }
    // 200 MiB under 64 MiB, in a child of the shell (so the shell itself survives and
    // says how its child died).
    let (out, v) = sb.exec_json(&[
        "--memory",
        "64M",
        "--",
        "python3 -c 'b = bytearray(200 << 20); print(len(b))'; echo shell-went-on",
    ]);
    assert_eq!(v["oomKilled"], true, "{v:#}");
    assert_eq!(v["limits"]["memoryBytes"], 64 << 20);
    let reason = text(&v, "reason");
    if kernel_log_readable() {
        assert!(reason.contains("python3 (pid "), "{reason}");
    }
    assert!(reason.contains("its memory limit (64 MiB)"), "{reason}");
    assert!(text(&v, "output").contains("shell-went-on"), "{v:#}");
    // The shell went on and exited 0: the job succeeded (its status is its shell's), and
    // exec still says that a process of it was OOM-killed.
    assert_eq!(v["status"], "succeeded", "{v:#}");
    assert_eq!(out.code, Some(0), "{out:#?}");
    let peak = v["usage"]["memoryPeakBytes"].as_u64().unwrap();
    assert!(peak <= 64 << 20 && peak > 32 << 20, "{v:#}");
    // Plain exec prints the reason: here the killed process is the job's program itself
    // (the shell runs it in its own place), so the job failed with SIGKILL.
    let out = sb.run(&[
        "exec",
        "--memory",
        "64M",
        "--",
        "python3 -c 'b = bytearray(200 << 20)'",
    ]);
    assert_eq!(out.code, Some(137), "{out:#?}");
    assert!(out.stderr.contains("out of memory"), "{out:#?}");
    assert!(
        !kernel_log_readable() || out.stderr.contains("python3 (pid"),
        "{out:#?}"
    );
    let out = sb.run(&[
        "exec",
        "--memory",
        "64M",
        "--",
        "python3 -c 'b = bytearray(200 << 20)'; echo went-on",
    ]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert!(out.stdout.contains("went-on"), "{out:#?}");
    assert!(out.stderr.contains("out of memory"), "{out:#?}");
    assert!(
        !kernel_log_readable() || out.stderr.contains("python3 (pid"),
        "{out:#?}"
    );
    sb.assert_no_leftovers();
}

#[test]
fn a_sigkill_that_is_not_an_oom_kill_is_not_called_one() {
    let sb = Arc::new(Sandbox::new());
    for args in [
        &["--memory", "64M", "--", "sh -c 'kill -9 $$'; kill -9 $$"][..],
        &["--", "python3 -c 'b = bytearray(20 << 20)'; kill -KILL $$"][..],
    ] {
        let (_, v) = sb.exec_json(args);
        assert_eq!(v["signal"], "SIGKILL", "{v:#}");
        assert_eq!(v["oomKilled"], false, "{v:#}");
        assert!(
            !v["reason"].as_str().unwrap_or("").contains("memory"),
            "{v:#}"
        );
    }
    // Close to the limit but never over it: no OOM either.
    if can_cli(&sb, "memory").is_some() {
        let (_, v) = sb.exec_json(&[
            "--memory",
            "64M",
            "--",
            "python3 -c 'b = bytearray(16 << 20); print(len(b))'",
        ]);
        assert_eq!(v["status"], "succeeded", "{v:#}");
        assert_eq!(v["oomKilled"], false, "{v:#}");
    }
}

#[test]
fn a_fork_loop_never_has_more_processes_than_its_pids_limit() {
    let s = Server::start(&[]);
    if can(&s, "pids").is_none() {
        return;
    }
    let mut c = s.client();
    // Forks until refused, keeps every child, and says how many it got.
    let prog = "import os, time\nn = 0\nfor i in range(200):\n    try:\n        pid = os.fork()\n    except OSError:\n        continue\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    n += 1\nprint('forked', n, flush=True)\ntime.sleep(30)\n";
    let id = c.start_id(json!({
        "argv": ["python3", "-c", prog],
        "limits": {"pids": 20},
        "background": true,
    }));
    let rec = c.get(&format!("/v1/jobs/{id}")).json();
    let fence = text(&rec, "cgroup").to_string();
    let mut most = 0;
    let said = eventually(LONG, "the fork loop to stop", || {
        let n = std::fs::read_to_string(Path::new(&fence).join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .count();
        most = most.max(n);
        let v = c.get(&format!("/v1/jobs/{id}")).json();
        text(&v, "output")
            .lines()
            .find_map(|l| l.strip_prefix("forked ")?.trim().parse::<usize>().ok())
    });
    assert!(most <= 20, "{most} processes under pids 20");
    // The parent counts itself: 19 children at most, and it did get near the limit.
    assert!((10..=19).contains(&said), "forked {said}");
    let v = c.post(&format!("/v1/jobs/{id}/cancel"), &json!({})).json();
    assert_eq!(v["status"], "cancelled", "{v:#}");
}

#[test]
fn a_busy_loop_at_half_a_cpu_gets_about_half_a_core() {
    let s = Server::start(&[]);
    if can(&s, "cpu").is_none() {
        return;
    }
    let mut c = s.client();
    // Spins for 4 s of wall time; its CPU time is what the limit allows.
    let spin = "import time\nend = time.monotonic() + 4\nwhile time.monotonic() < end:\n    pass\n";
    let v = c.start_job(json!({
        "argv": ["python3", "-c", spin],
        "limits": {"cpus": 0.5},
        "waitSeconds": 60,
    }));
    assert_eq!(v["status"], "succeeded", "{v:#}");
    let cpu = f64_of(&v, "/usage/cpuSeconds");
    // Half of 4 s is 2 s; unlimited it would be about 4. A loaded machine may give less.
    assert!(
        (0.6..=2.8).contains(&cpu),
        "{cpu} CPU seconds in 4 s at cpus 0.5"
    );
}

#[test]
fn usage_counts_cpu_spent_in_a_grandchild_with_or_without_a_cgroup() {
    // The spinner is a grandchild of the job's program, which its parent waits for.
    for sb in [Sandbox::new(), Sandbox::without_cgroup()] {
        let sb = Arc::new(sb);
        let (_, v) = sb.exec_json(&[
            "--",
            "python3 -c 'import os, time\nif os.fork() == 0:\n    if os.fork() == 0:\n        t = time.process_time()\n        while time.process_time() < 0.6: pass\n        os._exit(0)\n    os.wait()\n    os._exit(0)\nos.wait()'",
        ]);
        assert_eq!(v["status"], "succeeded", "{v:#}");
        let cpu = f64_of(&v, "/usage/cpuSeconds");
        assert!(cpu >= 0.6, "{cpu} CPU seconds: {v:#}");
        assert!(v["usage"]["memoryPeakBytes"].as_u64().unwrap() > 0, "{v:#}");
    }
}

#[test]
fn usage_is_live_while_the_job_runs() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let id = c.start_id(json!({
        "argv": ["python3", "-c", "import time\nwhile time.process_time() < 0.5: pass\nprint('spun', flush=True)\ntime.sleep(60)\n"],
        "background": true,
    }));
    let v = eventually(PROMPT, "the spin to show in usage", || {
        let v = c.get(&format!("/v1/jobs/{id}")).json();
        (v["usage"]["cpuSeconds"].as_f64().unwrap_or(0.0) >= 0.5).then_some(v)
    });
    assert_eq!(v["status"], "running", "{v:#}");
    assert!(
        v["usage"]["memoryPeakBytes"].as_u64().unwrap_or(0) > 0,
        "{v:#}"
    );
    // The listing has it too.
    let list = c.get("/v1/jobs?status=running").json();
    assert!(
        list["jobs"][0]["usage"]["cpuSeconds"].as_f64().unwrap() >= 0.5,
        "{list:#}"
    );
    let v = c.post(&format!("/v1/jobs/{id}/cancel"), &json!({})).json();
    assert!(f64_of(&v, "/usage/cpuSeconds") >= 0.5, "{v:#}");
}

#[test]
fn the_sandbox_figures_match_the_kernels() {
    let s = Server::start(&[]);
    let v = s.client().get("/v1/sandbox").json();
    let r = &v["resources"];
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb = |k: &str| -> u64 {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(':'))
            .map(|v| {
                v.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap()
                    * 1024
            })
            .unwrap()
    };
    assert_eq!(r["memoryTotalBytes"].as_u64().unwrap(), kb("MemTotal"));
    let avail = r["memoryAvailableBytes"].as_u64().unwrap() as f64;
    let now = kb("MemAvailable") as f64;
    assert!((avail - now).abs() < now * 0.25, "{avail} vs {now}");
    let st = nix::sys::statvfs::statvfs(&s.home).unwrap();
    let total = st.blocks() as u64 * st.fragment_size() as u64;
    assert_eq!(r["diskTotalBytes"].as_u64().unwrap(), total);
    let free = st.blocks_available() as f64 * st.fragment_size() as f64;
    let got = r["diskFreeBytes"].as_f64().unwrap();
    assert!(
        (got - free).abs() < 1e9_f64.max(free * 0.05),
        "{got} vs {free}"
    );
    let mut load = [0f64; 3];
    // SAFETY: getloadavg fills at most 3 doubles of the array.
    assert!(unsafe { libc::getloadavg(load.as_mut_ptr(), 3) } > 0);
    let got = f64_of(r, "/load1");
    assert!(
        (got - load[0]).abs() <= 2.0 + load[0] * 0.5,
        "{got} vs {}",
        load[0]
    );
    assert_eq!(
        r["cpus"].as_u64().unwrap() as usize,
        std::thread::available_parallelism().unwrap().get()
    );
    for k in ["memory", "cpu", "pids"] {
        assert!(v["limits"][k].is_boolean(), "{v:#}");
    }
    if is_root() {
        // This project's machines (and CI) can enforce all three.
        assert_eq!(
            v["limits"],
            json!({"memory": true, "cpu": true, "pids": true})
        );
    }
}

#[test]
fn a_limit_the_sandbox_cannot_enforce_is_a_conflict_naming_it() {
    let sb = Arc::new(Sandbox::without_cgroup());
    let s = Server::start_in(Arc::clone(&sb), "127.0.0.1:0", &[]);
    let mut c = s.client();
    let v = c.get("/v1/sandbox").json();
    assert_eq!(
        v["limits"],
        json!({"memory": false, "cpu": false, "pids": false})
    );
    let r = c.post(
        "/v1/jobs",
        &json!({"command": "true", "limits": {"memoryBytes": 67108864, "pids": 5}}),
    );
    assert_eq!(r.status, 409, "{}", r.text());
    let m = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        m.contains("limits.memoryBytes") && m.contains("limits.pids") && !m.contains("cpus"),
        "{m}"
    );
    assert!(sb.job_ids().is_empty(), "a refused job left a folder");
    // Without limits the job runs, and its usage comes from the kernel's count of what
    // the supervisor reaped.
    let v = c.start_job(
        json!({"command": "python3 -c 'import time\nwhile time.process_time() < 0.3: pass'"}),
    );
    assert_eq!(v["status"], "succeeded", "{v:#}");
    assert!(f64_of(&v, "/usage/cpuSeconds") >= 0.3, "{v:#}");
    // Bad values are refused as such, before any capability is looked at.
    for (limits, field) in [
        (json!({"memoryBytes": 100}), "memoryBytes"),
        (json!({"cpus": 0}), "cpus"),
        (json!({"pids": 0}), "pids"),
        (json!({"memory": 1}), "memory"),
        (json!({"cpus": "1"}), "cpus"),
    ] {
        let r = c.post("/v1/jobs", &json!({"command": "true", "limits": limits}));
        assert_eq!(r.status, 400, "{limits}: {}", r.text());
        assert!(r.text().contains(field), "{}", r.text());
    }
}

#[test]
fn metrics_move_by_what_ran() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let value = |text: &str, name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    };
    let before = c.get("/v1/metrics").text();
    assert!(value(&before, "gitterm_sandbox_memory_total_bytes") > 0.0);
    assert!(value(&before, "gitterm_sandbox_cpus") >= 1.0);
    assert!(value(&before, "gitterm_sandbox_disk_total_bytes") > 0.0);
    let _ = value(&before, "gitterm_sandbox_load1");
    let cpu0 = value(&before, "gitterm_job_cpu_seconds_total");
    let oom0 = value(&before, "gitterm_job_oom_kills_total");
    c.start_job(
        json!({"argv": ["python3", "-c", "import time\nwhile time.process_time() < 0.4: pass"]}),
    );
    let memory = c.get("/v1/sandbox").json()["limits"]["memory"] == true;
    if memory {
        let v = c.start_job(json!({
            "command": "python3 -c 'b = bytearray(200 << 20)'",
            "limits": {"memoryBytes": 67108864},
        }));
        assert_eq!(v["oomKilled"], true, "{v:#}");
    }
    eventually(PROMPT, "the counters to move", || {
        let t = c.get("/v1/metrics").text();
        let cpu = value(&t, "gitterm_job_cpu_seconds_total") - cpu0;
        let oom = value(&t, "gitterm_job_oom_kills_total") - oom0;
        (cpu >= 0.4 && oom == if memory { 1.0 } else { 0.0 }).then_some(())
    });
}

/// Waits until the job's output has `what`.
fn wait_output(c: &mut Client, id: &str, what: &str) -> Value {
    eventually(PROMPT, &format!("{what:?} in the output"), || {
        let v = c.get(&format!("/v1/jobs/{id}")).json();
        text(&v, "output").contains(what).then_some(v)
    })
}

#[test]
fn signals_reach_a_trap_and_a_setsid_child() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let child_file = s.sb.file("child-got");
    let script = format!(
        "trap 'echo main got INT; exit 7' INT\n\
         setsid sh -c 'trap \"echo got USR1 > {f}; exit 0\" USR1; echo child ready; \
         while :; do sleep 0.05; done' &\n\
         trap 'echo main got USR1' USR1\n\
         echo ready\n\
         while :; do sleep 0.05; done",
        f = child_file.display()
    );
    let id = c.start_id(json!({"command": script, "background": true}));
    wait_output(&mut c, &id, "child ready");
    wait_output(&mut c, &id, "ready");
    // USR1 to every process: the setsid'd child, out of the job's group, gets it too.
    let r = c.post(
        &format!("/v1/jobs/{id}/signal"),
        &json!({"signal": "USR1", "target": "all"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["id"], id.as_str());
    eventually(PROMPT, "the setsid'd child's trap", || {
        std::fs::read_to_string(&child_file)
            .ok()
            .filter(|t| t.contains("got USR1"))
    });
    wait_output(&mut c, &id, "main got USR1");
    // INT by number to the group: the main shell's trap ends the job with its code.
    let r = c.post(&format!("/v1/jobs/{id}/signal"), &json!({"signal": 2}));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = c.get(&format!("/v1/jobs/{id}?waitSeconds=30")).json();
    assert_eq!(v["exitCode"], 7, "{v:#}");
    assert!(text(&v, "output").contains("main got INT"), "{v:#}");
    // An ended job: conflict.
    let r = c.post(&format!("/v1/jobs/{id}/signal"), &json!({"signal": "INT"}));
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.text().contains("has ended"), "{}", r.text());
}

#[test]
fn a_signal_that_ends_a_job_is_named_in_its_reason_and_unknown_ones_are_refused() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let id = c.start_id(json!({"command": "echo up; sleep 60", "background": true}));
    wait_output(&mut c, &id, "up");
    for bad in [
        json!({"signal": "SIGNOPE"}),
        json!({"signal": 0}),
        json!({"signal": 99}),
        json!({"signal": "INT", "target": "everyone"}),
        json!({}),
    ] {
        let r = c.post(&format!("/v1/jobs/{id}/signal"), &bad);
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
    }
    let r = c.post(
        &format!("/v1/jobs/{id}/signal"),
        &json!({"signal": "SIGNOPE"}),
    );
    assert!(r.text().contains("SIGNOPE"), "{}", r.text());
    assert_eq!(c.get(&format!("/v1/jobs/{id}")).json()["status"], "running");
    let r = c.post(
        &format!("/v1/jobs/{id}/signal"),
        &json!({"signal": "sigterm"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = c.get(&format!("/v1/jobs/{id}?waitSeconds=30")).json();
    assert_eq!(v["status"], "failed", "{v:#}");
    assert_eq!(v["signal"], "SIGTERM", "{v:#}");
    let reason = text(&v, "reason");
    assert!(
        reason.contains("SIGTERM") && reason.contains("signal request"),
        "{reason}"
    );
    let r = c.post(
        "/v1/jobs/job_00000000000000000000/signal",
        &json!({"signal": "INT"}),
    );
    assert_eq!(r.status, 404, "{}", r.text());
}

#[test]
fn argv_words_reach_the_program_exactly_and_the_command_pastes_back() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let words = ["printf", "[%s]\\n", "*", "$HOME", "a b", "it's", ""];
    let v = c.start_job(json!({"argv": words}));
    assert_eq!(v["status"], "succeeded", "{v:#}");
    let want = "[*]\n[$HOME]\n[a b]\n[it's]\n[]\n";
    assert_eq!(text(&v, "output"), want);
    // Pasting the record's command into a shell runs the same.
    let cmd = text(&v, "command");
    let pasted = std::process::Command::new("/bin/sh")
        .args(["-c", cmd])
        .current_dir(s.sb.work())
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&pasted.stdout), want, "{cmd}");
    // The CLI's --argv does the same.
    let out = s.sb.run(&[
        "exec", "--argv", "--", "printf", "[%s]\\n", "*", "$HOME", "a b",
    ]);
    assert_eq!(out.stdout, "[*]\n[$HOME]\n[a b]\n", "{out:#?}");
    // Exactly one of command and argv; a missing program is the job's failure to start.
    for body in [
        json!({"command": "true", "argv": ["true"]}),
        json!({"argv": []}),
        json!({"argv": ["ls", 3]}),
        json!({"argv": "ls"}),
    ] {
        let r = c.post("/v1/jobs", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
    }
    let v = c.start_job(json!({"argv": ["no-such-program-anywhere", "x"]}));
    assert_eq!(v["status"], "failed", "{v:#}");
    assert!(
        text(&v, "reason").contains("no-such-program-anywhere"),
        "{v:#}"
    );
}

#[test]
fn nothing_of_a_jobs_cgroups_is_left_after_it() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let mut limits = json!({});
    for (k, field, value) in [
        ("memory", "memoryBytes", json!(268435456)),
        ("cpu", "cpus", json!(1.5)),
        ("pids", "pids", json!(100)),
    ] {
        if c.get("/v1/sandbox").json()["limits"][k] == true {
            limits[field] = value;
        }
    }
    let v = c.start_job(json!({
        "command": "setsid sleep 30 & sleep 30 & echo started",
        "limits": limits,
        "waitSeconds": 30,
    }));
    assert_ne!(v["status"], "running", "{v:#}");
    let id = text(&v, "id").to_string();
    let named = cgroup_folders(&v);
    eventually(PROMPT, "the job's cgroups to be removed", || {
        (named.iter().all(|p| !Path::new(p).exists()) && folders_named(&id).is_empty())
            .then_some(())
    });
}

#[test]
fn a_killed_supervisors_cgroups_are_removed_by_the_next_sweep() {
    let sb = Arc::new(Sandbox::new());
    let v = sb.start(&[
        "--memory",
        "256M",
        "--pids",
        "50",
        "--",
        "sleep 60 & setsid sleep 60 & wait",
    ]);
    let id = text(&v, "id").to_string();
    let rec = eventually(PROMPT, "the job's record with its pids", || {
        let r = sb.raw_record(&id);
        r["supervisorPid"].is_i64().then_some(r)
    });
    let named = cgroup_folders(&rec);
    if named.is_empty() {
        skip_root("no cgroup here");
        return;
    }
    assert!(named.iter().all(|p| Path::new(p).exists()), "{named:?}");
    kill(int(&rec, "supervisorPid"), libc::SIGKILL);
    let v = sb.wait_final(&id, PROMPT);
    assert_eq!(v["status"], "lost", "{v:#}");
    eventually(PROMPT, "the lost job's cgroups to be removed", || {
        (named.iter().all(|p| !Path::new(p).exists()) && folders_named(&id).is_empty())
            .then_some(())
    });
    sb.assert_no_leftovers();
}

#[test]
fn a_job_user_can_neither_leave_its_cgroups_nor_raise_its_limits() {
    let Some(user) = TestUser::create("cg") else {
        return;
    };
    let sb = Arc::new(Sandbox::new());
    if can_cli(&sb, "pids").is_none() || can_cli(&sb, "memory").is_none() {
        return;
    }
    // Every way out it can name: its groups' own limit files, the parents' cgroup.procs,
    // a new group of its own, cgroup.kill of the fence.
    let attack = r#"
        for d in /sys/fs/cgroup/*/ /sys/fs/cgroup/unified/; do
          echo $$ > "$d/cgroup.procs" 2>/dev/null && echo "moved into $d"
        done
        m=$(awk -F: '$2=="memory"{print $3}' /proc/self/cgroup)
        p=$(awk -F: '$2=="pids"{print $3}' /proc/self/cgroup)
        echo 9999999999 > /sys/fs/cgroup/memory$m/memory.limit_in_bytes 2>/dev/null && echo raised memory
        echo max > /sys/fs/cgroup/pids$p/pids.max 2>/dev/null && echo raised pids
        echo $$ > /sys/fs/cgroup/memory$m/../cgroup.procs 2>/dev/null && echo left memory
        mkdir /sys/fs/cgroup/memory$m/mine 2>/dev/null && echo made a group
        echo "limit $(cat /sys/fs/cgroup/memory$m/memory.limit_in_bytes) $(cat /sys/fs/cgroup/pids$p/pids.max)"
        cat /proc/self/cgroup
    "#;
    let (_, v) = sb.exec_json(&[
        "--job-user",
        &user.name,
        "--memory",
        "64M",
        "--pids",
        "30",
        "--",
        attack,
    ]);
    let id = text(&v, "id").to_string();
    let out = text(&v, "output");
    for bad in ["moved into", "raised", "left memory", "made a group"] {
        assert!(!out.contains(bad), "the job user {bad}: {out}");
    }
    assert!(out.contains(&format!("limit {} 30", 64 << 20)), "{out}");
    // It is still in its own group in every hierarchy it joined.
    for line in out
        .lines()
        .filter(|l| l.contains(":memory:") || l.contains(":pids:") || l.starts_with("0::"))
    {
        assert!(line.ends_with(&format!("/gitterm/{id}")), "{line} in {out}");
    }
    drop(user);
}

#[test]
fn stderr_is_kept_apart_and_redacted_when_asked() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let secret = "s3cr3t-value-for-stderr";
    let v = c.start_job(json!({
        "command": "echo out-1; echo \"err-1 $TOKEN\" >&2; printf 'out-2\\n'; printf '\\033[31merr-2\\033[0m\\n' >&2",
        "secretEnv": {"TOKEN": secret},
        "separateStderr": true,
    }));
    assert_eq!(v["status"], "succeeded", "{v:#}");
    let id = text(&v, "id").to_string();
    assert_eq!(text(&v, "stderr"), "err-1 [redacted]\nerr-2\n");
    assert_eq!(v["stderrBytes"], "err-1 [redacted]\nerr-2\n".len());
    // output.log still has both.
    let out = text(&v, "output");
    for l in ["out-1", "err-1 [redacted]", "out-2", "err-2"] {
        assert!(out.contains(l), "{out}");
    }
    let page = c.get(&format!("/v1/jobs/{id}/output?stream=stderr")).json();
    assert_eq!(page["data"], "err-1 [redacted]\nerr-2\n", "{page:#}");
    assert_eq!(page["done"], true);
    let log = c.get(&format!("/v1/jobs/{id}/log?stream=stderr"));
    assert_eq!(log.status, 200);
    assert_eq!(log.text(), "err-1 [redacted]\nerr-2\n");
    assert!(files_holding(&s.home, secret).is_empty());
    // Without separateStderr there is no stderr stream; with a terminal it is refused.
    let plain = c.start_id(json!({"command": "echo x >&2"}));
    let r = c.get(&format!("/v1/jobs/{plain}/output?stream=stderr"));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("separateStderr"), "{}", r.text());
    let r = c.get(&format!("/v1/jobs/{plain}/output?stream=both"));
    assert_eq!(r.status, 400, "{}", r.text());
    let r = c.post(
        "/v1/jobs",
        &json!({"command": "true", "separateStderr": true, "pty": {"cols": 80, "rows": 24}}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("one stream"), "{}", r.text());
}

/// This process's folder in the cgroup v1 memory hierarchy, where there is one.
fn own_v1_memory() -> Option<std::path::PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        ctrls
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.to_string())
    })?;
    let dir = Path::new("/sys/fs/cgroup/memory").join(rel.trim_start_matches('/'));
    dir.join("memory.limit_in_bytes").exists().then_some(dir)
}

#[test]
fn an_oom_of_the_sandboxs_own_limit_is_not_blamed_on_the_jobs() {
    if !is_root() {
        skip_root("not root, so no memory cgroup can be made for the agent");
        return;
    }
    let Some(own) = own_v1_memory() else {
        skip("no cgroup v1 memory hierarchy here (the v2 case is covered by unit tests)");
        return;
    };
    // The agent itself (exec, and the supervisor it forks) runs in a memory group of
    // 96 MiB: the sandbox's limit, above every job's group.
    let sandbox = own.join(format!("gt-sandbox-{}", std::process::id()));
    std::fs::create_dir(&sandbox).unwrap();
    std::fs::write(
        sandbox.join("memory.limit_in_bytes"),
        (96u64 << 20).to_string(),
    )
    .unwrap();
    let _ = std::fs::write(
        sandbox.join("memory.memsw.limit_in_bytes"),
        (96u64 << 20).to_string(),
    );
    let sb = Arc::new(Sandbox::new());
    let in_sandbox = |args: &[&str]| -> Value {
        let mut c = sb.command("/bin/sh");
        c.arg("-c")
            .arg("echo $$ > \"$0/cgroup.procs\" && shift && exec \"$@\"")
            .arg(&sandbox)
            .arg("--")
            .arg(BIN)
            .args(["exec", "--json"])
            .args(args);
        let out = sb.run_cmd(c);
        let v = out.json();
        if let Some(id) = v["id"].as_str() {
            sb.remember(id);
        }
        v
    };
    let hog = "python3 -c 'b = bytearray(300 << 20)'";
    for args in [&["--", hog][..], &["--memory", "512M", "--", hog][..]] {
        let v = in_sandbox(args);
        assert_eq!(v["oomKilled"], true, "{v:#}");
        let reason = text(&v, "reason");
        assert!(!reason.contains("the job reached"), "{reason}");
        if kernel_log_readable() {
            // The kernel's log names the victim and the group whose limit it was.
            assert!(reason.contains("python3 (pid "), "{reason}");
            assert!(
                reason.contains("the sandbox reached its memory limit")
                    && reason.contains("gt-sandbox-"),
                "{reason}"
            );
        } else {
            assert!(reason.contains("not the job's own limit"), "{reason}");
        }
    }
    sb.assert_no_leftovers();
    // The agent's jobs folder in that group, then the group (empty once exec is gone).
    eventually(PROMPT, "the test's memory group to be removable", || {
        let _ = std::fs::remove_dir(sandbox.join("gitterm"));
        std::fs::remove_dir(&sandbox).ok()
    });
}
