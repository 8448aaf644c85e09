//! Helpers for the real-process tests: a private state root per test, running the binary
//! with a deadline, polling instead of sleeping, and a guard that ends everything a test
//! started (supervisors of its root, and every process carrying one of its job ids).

#![allow(dead_code)]

use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_gitterm-agent");

/// The environment variable every job process carries (see the supervisor).
pub const JOB_MARKER: &str = "GITTERM_JOB_ID";

/// A generous bound for anything that should happen "promptly". Tests never assert on a
/// tighter timing than this; they poll and stop as soon as the condition holds.
pub const PROMPT: Duration = Duration::from_secs(15);

/// How long any one CLI invocation may take before the test gives up on it.
pub const CLI_DEADLINE: Duration = Duration::from_secs(60);

/// What a finished CLI invocation produced.
#[derive(Debug)]
pub struct Out {
    /// The exit code, `None` when killed by a signal.
    pub code: Option<i32>,
    /// The signal that killed it, if any.
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Out {
    /// Parses stdout as JSON (panics with the whole output when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:#?}"))
    }
}

/// One test's private world: a state root, a working folder, and a cleanup guard.
pub struct Sandbox {
    home: tempfile::TempDir,
    work: tempfile::TempDir,
    no_cgroup: bool,
    /// CLI processes started in the background (killed on drop if still there).
    children: Mutex<Vec<i32>>,
    /// Job ids seen by the test, kept even if their folder vanishes.
    known: Mutex<Vec<String>>,
}

impl Sandbox {
    /// A sandbox whose jobs may use a cgroup where the machine allows it.
    pub fn new() -> Sandbox {
        Sandbox {
            home: tempfile::Builder::new()
                .prefix("gitterm-home-")
                .tempdir()
                .expect("temp home"),
            work: tempfile::Builder::new()
                .prefix("gitterm-work-")
                .tempdir()
                .expect("temp work folder"),
            no_cgroup: false,
            children: Mutex::new(Vec::new()),
            known: Mutex::new(Vec::new()),
        }
    }

    /// A sandbox whose jobs never use a cgroup (the subreaper fallback alone).
    pub fn without_cgroup() -> Sandbox {
        let mut s = Sandbox::new();
        s.no_cgroup = true;
        s
    }

    /// The state root (`GITTERM_HOME`).
    pub fn home(&self) -> &Path {
        self.home.path()
    }

    /// The folder every CLI invocation (and so every job, by default) runs in.
    pub fn work(&self) -> &Path {
        self.work.path()
    }

    /// A file in the working folder.
    pub fn file(&self, name: &str) -> PathBuf {
        self.work().join(name)
    }

    /// A command for the binary, in this sandbox.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .env("GITTERM_HOME", self.home())
            .current_dir(self.work())
            .stdin(Stdio::null());
        if self.no_cgroup {
            c.env("GITTERM_NO_CGROUP", "1");
        } else {
            c.env_remove("GITTERM_NO_CGROUP");
        }
        c
    }

    /// Runs the binary to its end (at most [`CLI_DEADLINE`]) and collects what it printed.
    pub fn run(&self, args: &[&str]) -> Out {
        let mut c = self.cmd(args);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let started = Instant::now();
        let mut child = c.spawn().expect("spawn gitterm-agent");
        let (code, signal, stdout, stderr) = self.collect(&mut child, CLI_DEADLINE, args);
        Out {
            code,
            signal,
            stdout,
            stderr,
            elapsed: started.elapsed(),
        }
    }

    /// Starts the binary in the background; the child is killed on drop if still running.
    pub fn spawn(&self, mut c: Command) -> Child {
        let child = c.spawn().expect("spawn gitterm-agent");
        self.children.lock().unwrap().push(child.id() as i32);
        child
    }

    /// Waits (at most `within`) for a child started with piped stdout and stderr, and
    /// collects its output.
    pub fn finish(&self, mut child: Child, within: Duration) -> Out {
        let started = Instant::now();
        let (code, signal, stdout, stderr) = self.collect(&mut child, within, &["(spawned)"]);
        Out {
            code,
            signal,
            stdout,
            stderr,
            elapsed: started.elapsed(),
        }
    }

    fn collect(
        &self,
        child: &mut Child,
        within: Duration,
        what: &[&str],
    ) -> (Option<i32>, Option<i32>, String, String) {
        use std::os::unix::process::ExitStatusExt;
        let reader = |r: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(mut r) = r {
                    let _ = r.read_to_end(&mut buf);
                }
                String::from_utf8_lossy(&buf).into_owned()
            })
        };
        let out = reader(
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        );
        let err = reader(
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        );
        let deadline = Instant::now() + within;
        let status = loop {
            if let Some(st) = child.try_wait().expect("wait for gitterm-agent") {
                break st;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("gitterm-agent {what:?} did not finish within {within:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let stdout = out.join().unwrap_or_default();
        let stderr = err.join().unwrap_or_default();
        (status.code(), status.signal(), stdout, stderr)
    }

    /// `exec --json ARGS...`: the output and the parsed job object.
    pub fn exec_json(&self, args: &[&str]) -> (Out, Value) {
        let mut all = vec!["exec", "--json"];
        all.extend_from_slice(args);
        let out = self.run(&all);
        let v = out.json();
        (out, v)
    }

    /// Starts a detached job (`exec --wait 0 --json`) and returns its object.
    pub fn start(&self, args: &[&str]) -> Value {
        let mut all = vec!["--wait", "0"];
        all.extend_from_slice(args);
        let (out, v) = self.exec_json(&all);
        assert_eq!(out.code, Some(0), "detached exec failed: {out:#?}");
        assert_eq!(v["status"], "running", "detached job: {v:#}");
        assert!(out.elapsed < PROMPT, "--wait 0 took {:?}", out.elapsed);
        v
    }

    /// `status ID --json` (which also settles a job whose supervisor is gone).
    pub fn status(&self, id: &str) -> Value {
        let out = self.run(&["status", id, "--json"]);
        assert_eq!(out.code, Some(0), "status {id}: {out:#?}");
        out.json()
    }

    /// Polls `status ID --json` until the job has ended (at most `within`).
    pub fn wait_final(&self, id: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let v = self.status(id);
            if v["status"] != "running" {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "job {id} still running after {within:?}: {v:#}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The stored record, read straight from disk (no liveness check).
    pub fn raw_record(&self, id: &str) -> Value {
        let text = fs::read_to_string(self.job_dir(id).join("job.json")).expect("job.json");
        serde_json::from_str(&text).expect("job.json parses")
    }

    /// `<home>/jobs/<id>`.
    pub fn job_dir(&self, id: &str) -> PathBuf {
        self.home().join("jobs").join(id)
    }

    /// The names in `<home>/jobs` (job folders, sorted).
    pub fn job_ids(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.home().join("jobs"))
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    // Folders being assembled (`.new-job_…`) are not jobs yet.
                    .filter(|n| n.starts_with("job_"))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Remembers a job id, so that cleanup covers it even if its folder is removed.
    pub fn remember(&self, id: &str) {
        let mut k = self.known.lock().unwrap();
        if !k.iter().any(|i| i == id) {
            k.push(id.to_string());
        }
    }

    /// Every job id this sandbox knows of: its folders and the ids remembered.
    fn all_ids(&self) -> Vec<String> {
        let mut ids = self.job_ids();
        for id in self.known.lock().unwrap().iter() {
            if !ids.contains(id) {
                ids.push(id.clone());
            }
        }
        ids
    }

    /// A pid the job wrote into a file of the working folder (waits for the file).
    pub fn pid_from(&self, name: &str) -> i32 {
        let path = self.file(name);
        let mut text = String::new();
        wait_until(PROMPT, &format!("{name} to hold a pid"), || {
            text = fs::read_to_string(&path).unwrap_or_default();
            text.trim().parse::<i32>().is_ok()
        });
        text.trim().parse().unwrap()
    }

    /// Live processes this sandbox left: its supervisors and its jobs' processes.
    pub fn leftovers(&self) -> Vec<String> {
        let ids = self.all_ids();
        scan_processes(self.home(), &ids)
            .into_iter()
            .filter(|p| p.state != 'Z')
            .map(|p| format!("{} ({}) {}", p.pid, p.state, p.cmdline))
            .collect()
    }

    /// Asserts that nothing of this sandbox is still alive (waits up to [`PROMPT`] for
    /// supervisors to finish exiting).
    pub fn assert_no_leftovers(&self) {
        let deadline = Instant::now() + PROMPT;
        loop {
            let left = self.leftovers();
            if left.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "processes outlived their jobs: {left:#?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills everything this sandbox started. Idempotent.
    pub fn cleanup(&self) {
        for pid in self.children.lock().unwrap().drain(..) {
            if proc_state(pid).is_some_and(|s| s != 'Z') {
                kill(pid, libc::SIGKILL);
            }
        }
        let ids = self.all_ids();
        // Supervisors first, so none of them starts anything new; twice, for anything
        // forked meanwhile.
        for _ in 0..2 {
            for p in scan_processes(self.home(), &ids) {
                if p.state != 'Z' {
                    kill(p.pid, libc::SIGKILL);
                }
            }
        }
        for id in &ids {
            if let Some(cg) = job_cgroup(id)
                && cg.exists()
            {
                let _ = fs::write(cg.join("cgroup.kill"), "1");
                for _ in 0..100 {
                    if fs::remove_dir(&cg).is_ok() || !cg.exists() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }
}

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox::new()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// A process found in /proc.
#[derive(Debug, Clone)]
pub struct ProcInfo {
    pub pid: i32,
    pub state: char,
    pub cmdline: String,
}

/// Processes that belong to a sandbox: supervisors of `home`, and processes whose
/// environment carries one of `ids` as their job id.
fn scan_processes(home: &Path, ids: &[String]) -> Vec<ProcInfo> {
    let home = home.as_os_str().as_encoded_bytes();
    let markers: Vec<Vec<u8>> = ids
        .iter()
        .map(|id| format!("{JOB_MARKER}={id}").into_bytes())
        .collect();
    let me = std::process::id() as i32;
    let mut found = Vec::new();
    let Ok(dir) = fs::read_dir("/proc") else {
        return found;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if pid <= 1 || pid == me {
            continue;
        }
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let supervisor = args.windows(3).any(|w| {
            w[0] == b"supervise".as_slice() && w[1] == b"--root".as_slice() && w[2] == home
        });
        let env = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let in_job = env
            .split(|&b| b == 0)
            .any(|kv| markers.iter().any(|m| kv == m.as_slice()));
        if supervisor || in_job {
            found.push(ProcInfo {
                pid,
                state: proc_state(pid).unwrap_or('?'),
                cmdline: String::from_utf8_lossy(&cmdline).replace('\0', " "),
            });
        }
    }
    found
}

/// The state letter of `/proc/<pid>/stat`, or `None` when the pid does not exist.
pub fn proc_state(pid: i32) -> Option<char> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let close = text.rfind(')')?;
    text[close + 1..].trim_start().chars().next()
}

/// True when `pid` no longer is a live process of job `id`: it is gone, a zombie, or the
/// pid now belongs to some other process.
pub fn dead_or_not_of_job(pid: i32, id: &str) -> bool {
    match proc_state(pid) {
        None | Some('Z') | Some('X') => true,
        Some(_) => {
            let marker = format!("{JOB_MARKER}={id}");
            let env = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            !env.split(|&b| b == 0).any(|kv| kv == marker.as_bytes())
        }
    }
}

/// True while `pid` is a live (non-zombie) process of job `id`.
pub fn alive_in_job(pid: i32, id: &str) -> bool {
    !dead_or_not_of_job(pid, id)
}

/// Waits until every pid is dead (or reused by something else), at most `within`.
pub fn assert_dead(pids: &[i32], id: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let alive: Vec<i32> = pids
            .iter()
            .copied()
            .filter(|&p| alive_in_job(p, id))
            .collect();
        if alive.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "processes {alive:?} of job {id} still alive after {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `cond` until it holds, at most `within` (panics naming `what`).
pub fn wait_until(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Sends a signal.
pub fn kill(pid: i32, sig: i32) {
    // SAFETY: kill(2) takes plain integers.
    unsafe { libc::kill(pid, sig) };
}

/// True when the process has a handler installed for `sig` (SigCgt in /proc/pid/status).
pub fn catches(pid: i32, sig: i32) -> bool {
    let Ok(text) = fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    text.lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|m| m & (1 << (sig - 1)) != 0)
}

/// Mode bits (the low 9) of a path.
pub fn mode(path: &Path) -> u32 {
    fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// The job's cgroup v2 folder as the agent would create it, if cgroup v2 is mounted.
pub fn job_cgroup(id: &str) -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    let mount = mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_dev, dir, kind) = (f.next()?, f.next()?, f.next()?);
        (kind == "cgroup2").then(|| PathBuf::from(dir))
    })?;
    let own = fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))?
        .trim_start_matches('/')
        .to_string();
    let base = if rel.is_empty() {
        mount
    } else {
        mount.join(rel)
    };
    Some(base.join("gitterm").join(id))
}

/// A JSON field as i32 (panics with the object when absent).
pub fn int(v: &Value, field: &str) -> i32 {
    v[field]
        .as_i64()
        .unwrap_or_else(|| panic!("{field} is not an integer in {v:#}")) as i32
}

/// A JSON field as &str (panics with the object when absent).
pub fn text<'a>(v: &'a Value, field: &str) -> &'a str {
    v[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} is not a string in {v:#}"))
}
