//! One test's private world and its cleanup guard.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::procs::{
    ProcInfo, any_entry_contains, has_env_entry, kill, marker, proc_state, remove_job_cgroup, scan,
};
use super::{BIN, CLI_DEADLINE, PROMPT, eventually};

/// How long the guard lets processes of a test take to exit once the agent has ended its
/// jobs; anything still there then was left behind.
const LINGER: Duration = Duration::from_secs(5);

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

    /// True for exit code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// One test's private world: a temp folder holding the state root (`root/`), the working
/// folder of every command (`work/`) and whatever else the test puts there.
///
/// Dropping it is the cleanup guard: background processes it started are killed, the
/// agent is asked to end every job still running and to settle the rest, and then any
/// process still carrying the marker of one of its jobs, or naming its folder in its
/// command line or environment, is killed and fails the test (unless it is already
/// failing).
pub struct Sandbox {
    dir: tempfile::TempDir,
    home: PathBuf,
    work: PathBuf,
    no_cgroup: bool,
    /// Background processes started through [`Sandbox::spawn`]: (pid, start time).
    children: Mutex<Vec<(i32, u64)>>,
    /// Job ids seen by the test, kept even if their folder vanishes.
    known: Mutex<Vec<String>>,
}

impl Sandbox {
    /// A sandbox whose jobs may use a cgroup where the machine allows it.
    pub fn new() -> Sandbox {
        let dir = tempfile::Builder::new()
            .prefix("gitterm-test-")
            .tempdir()
            .expect("temp folder");
        let work = dir.path().join("work");
        fs::create_dir(&work).expect("working folder");
        Sandbox {
            home: dir.path().join("root"),
            work,
            dir,
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

    /// The same sandbox with its state root at `<dir>/<rel>` (say, on a mount made there).
    pub fn with_home(mut self, rel: &str) -> Sandbox {
        self.home = self.dir.path().join(rel);
        self
    }

    /// The sandbox's own folder (holds the state root and the working folder).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The state root (`GITTERM_HOME`).
    pub fn home(&self) -> &Path {
        &self.home
    }

    /// The folder every command (and so every job, by default) runs in.
    pub fn work(&self) -> &Path {
        &self.work
    }

    /// A file in the working folder.
    pub fn file(&self, name: &str) -> PathBuf {
        self.work.join(name)
    }

    /// A command for `program` in this sandbox: its state root, working folder and HOME,
    /// no stdin, and none of the variables that would change the agent's behaviour.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env("GITTERM_HOME", &self.home)
            .env("HOME", self.dir.path())
            .env_remove("GITTERM_BOOT_ID_FILE")
            .env_remove("GITTERM_JOB_USER")
            .env_remove(super::JOB_MARKER)
            .current_dir(&self.work)
            .stdin(Stdio::null());
        if self.no_cgroup {
            c.env("GITTERM_NO_CGROUP", "1");
        } else {
            c.env_remove("GITTERM_NO_CGROUP");
        }
        c
    }

    /// A command for the binary under test, in this sandbox.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = self.command(BIN);
        c.args(args);
        c
    }

    /// Runs the binary to its end (at most [`CLI_DEADLINE`]) and collects what it printed.
    pub fn run(&self, args: &[&str]) -> Out {
        self.run_cmd(self.cmd(args))
    }

    /// Runs a command to its end (at most [`CLI_DEADLINE`]) and collects what it printed.
    pub fn run_cmd(&self, c: Command) -> Out {
        run_to_end(c, CLI_DEADLINE).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `ARGS...` with stdout parsed as JSON.
    pub fn json(&self, args: &[&str]) -> Value {
        self.run(args).json()
    }

    /// Starts a command in the background; it is killed on drop if still running.
    pub fn spawn(&self, mut c: Command) -> Child {
        let child = c.spawn().expect("spawn a background process");
        let pid = child.id() as i32;
        self.children
            .lock()
            .unwrap()
            .push((pid, start_time(pid).unwrap_or(0)));
        child
    }

    /// Waits (at most `within`) for a child started with piped stdout and stderr, and
    /// collects its output.
    pub fn finish(&self, mut child: Child, within: Duration) -> Out {
        collect(&mut child, within, Instant::now()).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `exec --json ARGS...`: the output and the parsed job object.
    pub fn exec_json(&self, args: &[&str]) -> (Out, Value) {
        let mut all = vec!["exec", "--json"];
        all.extend_from_slice(args);
        let out = self.run(&all);
        let v = out.json();
        if let Some(id) = v["id"].as_str() {
            self.remember(id);
        }
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
        eventually(within, &format!("job {id} to end"), || {
            let v = self.status(id);
            (v["status"] != "running").then_some(v)
        })
    }

    /// The stored record, read straight from disk (no liveness check).
    pub fn raw_record(&self, id: &str) -> Value {
        let text = fs::read_to_string(self.job_dir(id).join("job.json")).expect("job.json");
        serde_json::from_str(&text).expect("job.json parses")
    }

    /// `<home>/jobs/<id>`.
    pub fn job_dir(&self, id: &str) -> PathBuf {
        self.home.join("jobs").join(id)
    }

    /// The names in `<home>/jobs` (job folders, sorted).
    pub fn job_ids(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.home.join("jobs"))
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
        eventually(PROMPT, &format!("{name} to hold a pid"), || {
            fs::read_to_string(&path).ok()?.trim().parse::<i32>().ok()
        })
    }

    /// Every live process of this sandbox but the background processes the test started
    /// itself: its jobs' processes (by their marker), its supervisors and servers, and
    /// anything else naming its folder in its command line or environment.
    fn processes(&self, including_children: bool) -> Vec<ProcInfo> {
        let markers: Vec<Vec<u8>> = self.all_ids().iter().map(|id| marker(id)).collect();
        let dir = self.dir.path().as_os_str().as_encoded_bytes();
        let inside = [dir, b"/"].concat();
        let children = self.live_children();
        scan(|cmdline, env| {
            markers.iter().any(|m| has_env_entry(env, m))
                || any_entry_contains(cmdline, &inside)
                || any_entry_contains(env, &inside)
                || env.split(|&b| b == 0).any(|e| e.ends_with(dir))
        })
        .into_iter()
        .filter(|p| including_children || !children.contains(&p.pid))
        .collect()
    }

    /// Live processes this sandbox left (see [`Sandbox::processes`]), one line each.
    pub fn leftovers(&self) -> Vec<String> {
        self.processes(false)
            .iter()
            .map(|p| p.to_string())
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

    /// The background processes started by the test that still run.
    fn live_children(&self) -> Vec<i32> {
        self.children
            .lock()
            .unwrap()
            .iter()
            .filter(|&&(pid, start)| {
                proc_state(pid).is_some_and(|s| s != 'Z') && start_time(pid) == Some(start)
            })
            .map(|&(pid, _)| pid)
            .collect()
    }

    /// Kills (and reaps) the background processes the test started and left running.
    fn end_children(&self) {
        let live = self.live_children();
        for &pid in &live {
            kill(pid, libc::SIGKILL);
        }
        for pid in live {
            // SAFETY: waitpid on a child of ours; a null status pointer is allowed.
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        }
        self.children.lock().unwrap().clear();
    }

    /// What a test leaves is the agent's to end first: every job still recorded as running
    /// is cancelled, and a listing settles those whose supervisor is gone.
    fn let_the_agent_end_its_jobs(&self) {
        for id in self.job_ids() {
            let running = fs::read(self.job_dir(&id).join("job.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .is_some_and(|r| r["status"] == "running");
            if running {
                let _ = run_to_end(self.cmd(&["cancel", &id]), CLI_DEADLINE);
            }
        }
        if self.home.join("jobs").is_dir() {
            let _ = run_to_end(self.cmd(&["status", "--json"]), CLI_DEADLINE);
        }
    }

    /// SIGKILLs every process of this sandbox until none is left (bounded), and removes the
    /// cgroups of its jobs.
    fn kill_everything(&self) {
        for _ in 0..50 {
            let left = self.processes(true);
            if left.is_empty() {
                break;
            }
            for p in &left {
                kill(p.pid, libc::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for id in self.all_ids() {
            remove_job_cgroup(&id);
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
        self.end_children();
        if std::thread::panicking() {
            // The test failed already: end everything at once and let that failure show.
            self.kill_everything();
            return;
        }
        self.let_the_agent_end_its_jobs();
        let deadline = Instant::now() + LINGER;
        let left = loop {
            let left = self.processes(true);
            if left.is_empty() || Instant::now() >= deadline {
                break left;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.kill_everything();
        if !left.is_empty() {
            let list: Vec<String> = left.iter().map(|p| p.to_string()).collect();
            panic!(
                "the test left {} process(es) behind, still there {LINGER:?} after its jobs \
                 were ended (now killed): {list:#?}",
                list.len()
            );
        }
    }
}

/// The start time of a process (clock ticks since boot), to tell a reused pid apart.
fn start_time(pid: i32) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let close = text.rfind(')')?;
    // Field 22 of stat; the 20th after the closing parenthesis of the command name.
    text[close + 1..].split_whitespace().nth(19)?.parse().ok()
}

/// Runs `c` with piped output to its end, at most `within`; an error (after killing it)
/// when it does not finish in time.
fn run_to_end(mut c: Command, within: Duration) -> Result<Out, String> {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = c.spawn().map_err(|e| format!("cannot start {c:?}: {e}"))?;
    collect(&mut child, within, started).map_err(|e| format!("{c:?}: {e}"))
}

fn collect(child: &mut Child, within: Duration, started: Instant) -> Result<Out, String> {
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
        if let Some(st) = child.try_wait().map_err(|e| format!("wait: {e}"))? {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("did not finish within {within:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ok(Out {
        code: status.code(),
        signal: status.signal(),
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
        elapsed: started.elapsed(),
    })
}
