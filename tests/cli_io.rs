//! The CLI's input and output as a user at a shell meets them: `exec` passing its stdin
//! on (a pipe, a file; not a terminal, not with `-n`), `attach` drawing a quiet job's
//! screen at once and refusing what it cannot attach to at once and in its own words, the
//! note on a clamped timeout, and the usage errors and version a newcomer sees.

use std::fs::File;
use std::io::{Read, Write};
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::util::*;

/// A pseudo-terminal the test drives, with the CLI on its other side.
struct Term {
    master: File,
    seen: Vec<u8>,
}

impl Term {
    /// Runs `args` with stdin, stdout and stderr on a new 80x24 terminal.
    fn run(sb: &Sandbox, args: &[&str]) -> (Child, Term) {
        let size = nix::pty::Winsize {
            ws_row: 24,
            ws_col: 80,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = nix::pty::openpty(Some(&size), None).expect("openpty");
        let slave = File::from(pty.slave);
        let mut c = sb.cmd(args);
        c.stdin(slave.try_clone().unwrap())
            .stdout(slave.try_clone().unwrap())
            .stderr(slave);
        // The command (and our copies of the slave) is dropped here: once the CLI exits,
        // reading the master ends.
        let child = sb.spawn(c);
        let master = File::from(pty.master);
        let flags = nix::fcntl::fcntl(&master, nix::fcntl::FcntlArg::F_GETFL).unwrap();
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(&master, nix::fcntl::FcntlArg::F_SETFL(flags)).unwrap();
        (
            child,
            Term {
                master,
                seen: Vec::new(),
            },
        )
    }

    /// Everything the terminal was sent so far.
    fn read(&mut self) -> String {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = self.master.read(&mut buf) {
            self.seen.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&self.seen).into_owned()
    }

    /// Waits until the terminal shows `needle`.
    fn wait_for(&mut self, needle: &str) -> String {
        eventually_ok(PROMPT, &format!("{needle:?} on the terminal"), || {
            let t = self.read();
            if t.contains(needle) { Ok(t) } else { Err(t) }
        })
    }

    /// Types `keys`.
    fn type_keys(&mut self, keys: &[u8]) {
        self.master.write_all(keys).expect("type on the terminal");
    }
}

/// Waits for a child whose stdio is not piped; its exit code.
fn exit_code(child: &mut Child) -> Option<i32> {
    eventually(PROMPT, "the CLI to exit", || child.try_wait().unwrap()).code()
}

#[test]
fn attach_draws_a_quiet_jobs_screen_at_once() {
    let s = Server::start(&[]);
    let mut c = s.client();
    // It prints once, then is silent: only the replay can show it.
    let id = c.start_id(json!({"command": "printf 'quiet-%s\\n' 42; exec sleep 120",
               "pty": {"cols": 80, "rows": 24}, "background": true}));
    let log = s.home.join("jobs").join(&id).join("output.log");
    eventually(PROMPT, "the job's first line", || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("quiet-42")
            .then_some(())
    });
    let (mut child, mut term) = Term::run(&s.sb, &["attach", &id]);
    term.wait_for("quiet-42");
    term.type_keys(b"\x1dd");
    term.wait_for("detached");
    assert_eq!(exit_code(&mut child), Some(0), "{}", term.read());
    c.post(&format!("/v1/jobs/{id}/cancel"), &json!({}));
}

#[test]
fn attach_refuses_at_once_and_says_what_to_do() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let plain = c.start_id(json!({"command": "sleep 120", "background": true}));
    let piped = c.start_id(json!({"command": "cat", "interactive": true, "background": true}));
    let ended = s.sb.run(&["exec", "--wait", "0", "--", "exit 3"]);
    let ended = ended.stdout.trim().to_string();
    s.sb.wait_final(&ended, PROMPT);
    let unknown = "job_0123456789abcdef0123";
    let attach = |id: &str| {
        let out = s.sb.run(&["attach", id]);
        assert_eq!(out.code, Some(1), "{out:#?}");
        // The refusal must not wait for anything: the old one came after a 5 s wait
        // for the job to end.
        assert!(out.elapsed < Duration::from_secs(5), "{out:#?}");
        assert_eq!(out.stderr.lines().count(), 1, "{out:#?}");
        assert!(out.stdout.is_empty(), "{out:#?}");
        out.stderr
    };
    for id in [&plain, &piped] {
        let e = attach(id);
        assert!(
            e.contains(&format!("job {id} is not a terminal job"))
                && e.contains("exec --tty")
                && e.contains(&format!("gitterm-agent logs --follow {id}")),
            "{e}"
        );
        // In the CLI's words, not the API's.
        assert!(
            !e.contains("\"interactive\"") && !e.contains("pty\")"),
            "{e}"
        );
    }
    let e = attach(&ended);
    assert!(
        e.contains(&format!("job {ended} has ended (failed, exit code 3)"))
            && e.contains(&format!("gitterm-agent logs {ended}")),
        "{e}"
    );
    let e = attach(unknown);
    assert!(
        e.contains(&format!("no job {unknown}")) && e.contains("gitterm-agent status"),
        "{e}"
    );
    for id in [&plain, &piped] {
        c.post(&format!("/v1/jobs/{id}/cancel"), &json!({}));
    }
}

/// Shared bytes to write to a child.
struct ArcBytes(std::sync::Arc<Vec<u8>>);

impl AsRef<[u8]> for ArcBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// `exec ARGS` with `input` written to its stdin (a pipe) from another thread, to the end.
fn exec_piped(sb: &Sandbox, args: &[&str], input: impl AsRef<[u8]> + Send + 'static) -> Out {
    let mut c = sb.cmd(args);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = sb.spawn(c);
    let mut stdin = child.stdin.take().unwrap();
    // A job that stops reading makes the write fail (EPIPE) once the CLI is gone.
    let writer = std::thread::spawn(move || stdin.write_all(input.as_ref()).is_ok());
    let out = sb.finish(child, CLI_DEADLINE);
    let _ = writer.join();
    out
}

#[test]
fn exec_passes_a_piped_stdin_to_the_job() {
    let sb = Sandbox::new();
    let out = exec_piped(&sb, &["exec", "--", "cat"], b"x\n".to_vec());
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), "x\n"),
        "{out:#?}"
    );
    // A file too (here `< FILE`), and --json runs it the same.
    let f = sb.file("in.txt");
    std::fs::write(&f, "one\ntwo\n").unwrap();
    let mut c = sb.cmd(&["exec", "--json", "--", "wc -l"]);
    c.stdin(File::open(&f).unwrap());
    let out = sb.run_cmd(c);
    assert_eq!(out.json()["output"], "2\n", "{out:#?}");
    // Nothing to pass: /dev/null (the harness's default), and -n.
    let out = sb.run(&["exec", "--", "cat; echo end"]);
    assert_eq!(out.stdout, "end\n", "{out:#?}");
    let out = exec_piped(&sb, &["exec", "-n", "--", "cat; echo end"], b"x\n".to_vec());
    assert_eq!(out.stdout, "end\n", "{out:#?}");
    let out = exec_piped(&sb, &["exec", "--no-stdin", "--", "cat"], b"x\n".to_vec());
    assert_eq!(out.stdout, "", "{out:#?}");
}

#[test]
fn exec_stdin_is_streamed_exact_and_never_waited_for() {
    let sb = Sandbox::new();
    // 100 MB that no pattern shortcut could fake, hashed by the job and here.
    let mut data = vec![0u8; 100 << 20];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    let mut local = std::process::Command::new("sha256sum");
    local.stdin(Stdio::piped()).stdout(Stdio::piped());
    let mut local = local.spawn().unwrap();
    let mut to_local = local.stdin.take().unwrap();
    let data = std::sync::Arc::new(data);
    let copy = std::sync::Arc::clone(&data);
    let feeder = std::thread::spawn(move || to_local.write_all(&copy[..]).unwrap());
    let want = local.wait_with_output().unwrap();
    feeder.join().unwrap();
    let out = exec_piped(&sb, &["exec", "--", "sha256sum"], ArcBytes(data));
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert_eq!(
        out.stdout.lines().next(),
        String::from_utf8_lossy(&want.stdout).lines().next(),
        "{out:#?}"
    );

    // Streamed: the job answers a line while the input is still open.
    let mut c = sb.cmd(&["exec", "--", "read l; echo got-$l; read m; echo then-$m"]);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = sb.spawn(c);
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"ping\n").unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains("got-ping\n") {
        let n = stdout.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "the CLI ended early: {:?}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    stdin.write_all(b"pong\n").unwrap();
    drop(stdin);
    stdout.read_to_end(&mut seen).unwrap();
    assert_eq!(String::from_utf8_lossy(&seen), "got-ping\nthen-pong\n");
    assert_eq!(exit_code(&mut child), Some(0));

    // A job that never reads its stdin still ends, and so does its CLI, though the
    // writer never stops.
    let mut c = sb.cmd(&["exec", "--", "echo done"]);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = sb.spawn(c);
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let block = [b'y'; 64 << 10];
        while stdin.write_all(&block).is_ok() {}
    });
    let out = sb.finish(child, PROMPT);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), "done\n"),
        "{out:#?}"
    );
    writer.join().unwrap();

    // `| head -1` as before: the reader goes, the job is ended, the CLI exits.
    let mut c = sb.cmd(&["exec", "--", "cat"]);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = sb.spawn(c);
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let block = b"line\n".repeat(1 << 12);
        while stdin.write_all(&block).is_ok() {}
    });
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 5];
    stdout.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"line\n");
    drop(stdout);
    let code = exit_code(&mut child);
    assert!(matches!(code, Some(130 | 143)), "{code:?}");
    writer.join().unwrap();
}

#[test]
fn a_jobs_stdin_outlives_its_cli() {
    let sb = Sandbox::new();
    let dest = sb.file("got.txt");
    let cmd = format!("cat > '{}'", dest.display());
    let mut c = sb.cmd(&["exec", "--wait", "0", "--", &cmd]);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = sb.spawn(c);
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut id = String::new();
    stdout.read_to_string(&mut id).unwrap();
    assert_eq!(exit_code(&mut child), Some(0));
    let id = id.trim();
    sb.remember(id);
    // The CLI is gone; the job reads on, to the writer's end.
    stdin.write_all(b"after the CLI\n").unwrap();
    assert_eq!(sb.status(id)["status"], "running");
    drop(stdin);
    let rec = sb.wait_final(id, PROMPT);
    assert_eq!(rec["status"], "succeeded", "{rec:#}");
    assert_eq!(std::fs::read_to_string(&dest).unwrap(), "after the CLI\n");
}

#[test]
fn a_terminal_stdin_without_tty_is_not_the_jobs() {
    let sb = Sandbox::new();
    // Were the terminal passed on, `cat` would wait for keys that never come.
    let (mut child, mut term) = Term::run(&sb, &["exec", "--", "cat; echo end-of-input"]);
    term.wait_for("end-of-input");
    assert_eq!(exit_code(&mut child), Some(0), "{}", term.read());
}

#[test]
fn a_job_user_reads_the_stdin_passed_to_it() {
    let Some(u) = TestUser::create("stdin") else {
        return;
    };
    let sb = Sandbox::new();
    let out = exec_piped(
        &sb,
        &["exec", "--job-user", &u.name, "--", "id -un; cat"],
        b"for the job user\n".to_vec(),
    );
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert_eq!(
        out.stdout,
        format!("{}\nfor the job user\n", u.name),
        "{out:#?}"
    );
}

#[test]
fn a_clamped_timeout_is_said_and_a_preview_gets_the_cap() {
    let s = Server::start(&["--max-job-seconds", "172800"]);
    let mut c = s.client();
    let record = |c: &mut Client, id: &str| c.get(&format!("/v1/jobs/{id}")).json();
    // Asked for more than the cap: the cap, and the answer says so.
    let r = c.post(
        "/v1/jobs",
        &json!({"command": "true", "timeoutSeconds": 999_999}),
    );
    let v = r.json();
    assert_eq!(
        (v["timeoutSeconds"].as_f64(), &v["timeoutClamped"]),
        (Some(172_800.0), &json!(true)),
        "{v:#}"
    );
    assert_eq!(record(&mut c, text(&v, "id"))["timeoutClamped"], true);
    // Within the cap, or none asked: nothing was clamped (none asked: the cap itself).
    for (body, want) in [
        (json!({"command": "true", "timeoutSeconds": 5}), 5.0),
        (json!({"command": "true"}), 172_800.0),
    ] {
        let v = c.post("/v1/jobs", &body).json();
        assert_eq!(v["timeoutSeconds"].as_f64(), Some(want), "{v:#}");
        assert!(v.get("timeoutClamped").is_none(), "{v:#}");
    }
    // A preview's server job lives as long as the operator lets any job live.
    let free = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let inner = s.dir().join("inner");
    let cmd = format!(
        "GITTERM_HOME={} exec {BIN} serve --listen 127.0.0.1:{free}",
        inner.display()
    );
    let r = c.post(
        "/v1/previews",
        &json!({"port": free, "command": cmd, "probe": "http", "path": "/v1/health"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let job = text(&r.json(), "jobId").to_string();
    let v = record(&mut c, &job);
    assert_eq!(v["timeoutSeconds"].as_f64(), Some(172_800.0), "{v:#}");
    assert!(v.get("timeoutClamped").is_none(), "{v:#}");
    c.post(&format!("/v1/jobs/{job}/cancel"), &json!({}));

    // The CLI says it on stderr, one line naming the cap and the flag that raises it.
    let sb = &s.sb;
    let out = sb.run(&["exec", "--timeout", "99999", "--", "echo ran"]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), "ran\n"),
        "{out:#?}"
    );
    let notes: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(notes.len(), 1, "{out:#?}");
    assert!(
        notes[0].starts_with("gitterm-agent: note: ")
            && notes[0].contains("3600 s")
            && notes[0].contains("--max-job-seconds"),
        "{out:#?}"
    );
    let (out, v) = sb.exec_json(&["--timeout", "50", "--max-job-seconds", "20", "--", "true"]);
    assert_eq!(
        (v["timeoutSeconds"].as_f64(), &v["timeoutClamped"]),
        (Some(20.0), &json!(true))
    );
    assert!(
        out.stderr.contains("20 s") && out.stderr.contains("note:"),
        "{out:#?}"
    );
    // Not clamped: not a word.
    let out = sb.run(&["exec", "--timeout", "60", "--", "true"]);
    assert_eq!(out.stderr, "", "{out:#?}");
    // No --timeout, ended by the cap: the end says which limit that was.
    let out = sb.run(&["exec", "--max-job-seconds", "1", "--", "sleep 60"]);
    assert_eq!(out.code, Some(124), "{out:#?}");
    assert!(
        out.stderr
            .contains("timed out after 1 s (no --timeout was given: that is the cap"),
        "{out:#?}"
    );
}

#[test]
fn a_newcomers_usage_errors_and_the_version() {
    let sb = Sandbox::new();
    // The command without `--`: the tip says where it goes, and nothing runs.
    for args in [
        &["exec", "true"][..],
        &["exec", "--timeout", "5", "ls", "-la"],
    ] {
        let out = sb.run(args);
        assert_eq!(out.code, Some(2), "{out:#?}");
        let word = args
            .iter()
            .find(|a| !a.starts_with('-') && **a != "exec" && **a != "5");
        let tip = format!(
            "tip: the command goes after `--`, as in 'gitterm-agent exec [OPTIONS] -- {} ...'",
            word.unwrap()
        );
        assert!(out.stderr.contains(&tip), "{out:#?}");
    }
    assert!(sb.job_ids().is_empty(), "a refused exec ran a job");
    // A misspelt flag keeps clap's own tip, without ours.
    let out = sb.run(&["exec", "--bogus", "--", "true"]);
    assert!(!out.stderr.contains("goes after"), "{out:#?}");
    // The version names the commit it was built from (or says it is unknown).
    let out = sb.run(&["--version"]);
    let line = out.stdout.trim_end();
    let build = line
        .strip_prefix(&format!("gitterm-agent {} (", env!("CARGO_PKG_VERSION")))
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{out:#?}"));
    let commit = build.split(' ').next().unwrap();
    assert!(
        build == "unknown" || (commit.len() >= 7 && commit.bytes().all(|b| b.is_ascii_hexdigit())),
        "{out:#?}"
    );
    // The synopsis lists every command a user has.
    let out = sb.run(&["--help"]);
    for cmd in [
        "exec", "attach", "status", "logs", "cancel", "prune", "events", "serve",
    ] {
        assert!(
            out.stdout.contains(&format!("\n  {cmd} ")),
            "{cmd}: {out:#?}"
        );
    }
}
