//! Starting and cancelling jobs: the one spawn path shared by the CLI and the server.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::error::{Error, Result};
use crate::job::{FORMAT_VERSION, JobId, JobRecord, Status};
use crate::proc;
use crate::redact::Redactor;
use crate::secrets::SecretVar;
use crate::store::{self, Store};
use crate::supervise::{LOCK_FD, Spec};

/// In a job's secrets file, the line holding the real command (a JSON string) when it
/// differs from the masked one; a `#` line, so the secrets parser skips it.
pub const COMMAND_LINE: &str = "#command=";

/// Timeouts above this many seconds are refused as absurd (a unit mistake), not clamped.
pub const ABSURD_SECONDS: f64 = 1e9;

/// The agent's limits, set by flags of `exec` and `serve`.
#[derive(Debug, Clone)]
pub struct Config {
    /// Cap on any job's timeout; longer requests are clamped.
    pub max_job_seconds: f64,
    /// Seconds between TERM and KILL.
    pub grace_seconds: f64,
    /// Per-job cap on stored output.
    pub max_output_bytes: u64,
    /// Most jobs running at once.
    pub max_running: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_job_seconds: 3600.0,
            grace_seconds: 5.0,
            max_output_bytes: 1 << 30,
            max_running: 256,
        }
    }
}

/// Everything a caller may ask of a new job.
#[derive(Debug, Clone, Default)]
pub struct StartRequest {
    pub command: String,
    pub cwd: Option<String>,
    /// The job's own variables (they win over the persisted env).
    pub env: BTreeMap<String, String>,
    pub stdin: Option<Vec<u8>>,
    pub secrets: Vec<SecretVar>,
    pub timeout_seconds: Option<f64>,
    pub idle_timeout_seconds: Option<f64>,
    pub idempotency_key: Option<String>,
}

/// Checks a timeout value given in seconds; `what` names the field in errors.
pub fn check_seconds(what: &str, v: f64) -> Result<f64> {
    if !v.is_finite() {
        return Err(Error::Invalid(format!(
            "{what} must be a number of seconds, got {v}"
        )));
    }
    if v <= 0.0 {
        return Err(Error::Invalid(format!(
            "{what} must be more than 0 seconds, got {v}"
        )));
    }
    if v > ABSURD_SECONDS {
        return Err(Error::Invalid(format!(
            "{what} of {v} s is absurd (over {ABSURD_SECONDS} s)"
        )));
    }
    Ok(v)
}

/// Checks an environment variable for a job.
pub fn check_env(name: &str, value: &str) -> Result<()> {
    crate::secrets::validate_name(name)?;
    if value.contains('\0') {
        return Err(Error::Invalid(format!(
            "environment variable {name} holds a NUL byte"
        )));
    }
    Ok(())
}

/// Validates a request and resolves its working folder, before anything is written.
fn validate(req: &StartRequest, cfg: &Config) -> Result<(String, f64, Option<f64>)> {
    if req.command.trim().is_empty() {
        return Err(Error::Invalid(
            "command is empty: give a shell command to run".into(),
        ));
    }
    if req.command.contains('\0') {
        return Err(Error::Invalid("command holds a NUL byte".into()));
    }
    for (k, v) in &req.env {
        check_env(k, v)?;
    }
    let cwd = match &req.cwd {
        Some(c) if c.contains('\0') => return Err(Error::Invalid("cwd holds a NUL byte".into())),
        Some(c) => Path::new(c).to_path_buf(),
        None => std::env::current_dir()
            .map_err(|e| Error::Invalid(format!("the current folder is unusable: {e}")))?,
    };
    let meta =
        fs::metadata(&cwd).map_err(|e| Error::Invalid(format!("cwd {}: {e}", cwd.display())))?;
    if !meta.is_dir() {
        return Err(Error::Invalid(format!(
            "cwd {} is not a folder",
            cwd.display()
        )));
    }
    if nix::unistd::access(&cwd, nix::unistd::AccessFlags::X_OK).is_err() {
        return Err(Error::Invalid(format!(
            "cwd {} cannot be entered (permission denied)",
            cwd.display()
        )));
    }
    let cwd = fs::canonicalize(&cwd).unwrap_or(cwd);
    let timeout = match req.timeout_seconds {
        Some(t) => check_seconds("timeoutSeconds", t)?.min(cfg.max_job_seconds),
        None => cfg.max_job_seconds,
    };
    let idle = req
        .idle_timeout_seconds
        .map(|t| check_seconds("idleTimeoutSeconds", t))
        .transpose()?;
    Ok((cwd.to_string_lossy().into_owned(), timeout, idle))
}

/// How many jobs are running now (cheap: one folder listing).
pub fn running_count(store: &Store) -> usize {
    fs::read_dir(store.root().join("running"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// [`running_count`], after settling markers of jobs whose supervisor is gone (a lost job
/// must not hold a slot). Only called at the limit, so the common case stays one listing.
fn settled_running_count(store: &Store, max: usize) -> usize {
    let n = running_count(store);
    if n < max {
        return n;
    }
    if let Ok(dir) = fs::read_dir(store.root().join("running")) {
        for e in dir.flatten() {
            match e.file_name().to_str().and_then(JobId::parse) {
                Some(id) => match store.load(&id) {
                    Ok(r) if r.status == Status::Running => {}
                    _ => {
                        let _ = fs::remove_file(e.path());
                    }
                },
                None => {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }
    running_count(store)
}

/// Starts a job and returns its record once the shell runs. `persisted_env` comes first;
/// the request's own variables win over it.
pub fn start(
    store: &Store,
    cfg: &Config,
    persisted_env: &BTreeMap<String, String>,
    req: StartRequest,
) -> Result<JobRecord> {
    start_watched(store, cfg, persisted_env, req).map(|(rec, _)| rec)
}

/// [`start`], also returning the job's change channel (absent when an idempotent retry
/// returned an earlier job) so the caller can wait for output and the end without polling.
pub fn start_watched(
    store: &Store,
    cfg: &Config,
    persisted_env: &BTreeMap<String, String>,
    req: StartRequest,
) -> Result<(JobRecord, Option<JobEvents>)> {
    let (cwd, timeout, idle) = validate(&req, cfg)?;
    // Held until the job is recorded under its key, so two retries racing each other
    // still start one job.
    let _key_lock = req
        .idempotency_key
        .as_deref()
        .map(|k| idem_lock(store, k))
        .transpose()?;
    if let Some(key) = &req.idempotency_key
        && let Some(id) = idempotent_lookup(store, key)?
    {
        return Ok((store.load(&id)?, None));
    }
    if settled_running_count(store, cfg.max_running) >= cfg.max_running {
        return Err(Error::RateLimited(format!(
            "{} jobs are running, the most this agent allows; wait for one to end or cancel one",
            cfg.max_running
        )));
    }
    let id = JobId::random().map_err(|e| Error::io("random id", e))?;
    let dir = store.job_dir(&id);
    let result = create_and_spawn(store, cfg, persisted_env, &req, &id, cwd, timeout, idle);
    match result {
        Ok((rec, events)) => {
            if let Some(key) = &req.idempotency_key {
                idempotent_record(store, key, &id);
            }
            Ok((rec, Some(events)))
        }
        Err(e) => {
            // Nothing half-written: a job that never started leaves no folder behind,
            // unless its supervisor already recorded why it failed. One whose shell did
            // start (the record has a pid) is kept and settled, so whatever it started is
            // swept and the record says `lost`.
            match store.read_raw(&id) {
                Ok(r) if r.status == Status::Running && r.pid.is_some() => {
                    let _ = store.load(&id);
                }
                Ok(r) if r.status != Status::Running => {}
                _ => {
                    crate::proc::sweep_job(id.as_str(), None);
                    let _ = fs::remove_dir_all(&dir);
                }
            }
            let _ = fs::remove_dir_all(staging_dir(store, &id));
            let _ = fs::remove_file(store.root().join("running").join(id.as_str()));
            Err(e)
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn create_and_spawn(
    store: &Store,
    cfg: &Config,
    persisted_env: &BTreeMap<String, String>,
    req: &StartRequest,
    id: &JobId,
    cwd: String,
    timeout: f64,
    idle: Option<f64>,
) -> Result<(JobRecord, JobEvents)> {
    // Built under a hidden name and renamed into place whole, so a job folder never
    // exists without its record, even if this process dies half-way.
    let dir = staging_dir(store, id);
    let io = |what: &str| {
        let what = format!("creating job {id}: {what}");
        move |e| Error::io(what, e)
    };
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(io("folder"))?;
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dir.join(store::LOCK))
        .map_err(io("lock"))?;
    lock.lock().map_err(io("lock"))?;

    let values: Vec<&[u8]> = req
        .secrets
        .iter()
        .map(|s| s.value.expose().as_bytes())
        .collect();
    let masked = Redactor::new(&values).redact_str(&req.command);
    let mut env = persisted_env.clone();
    env.extend(req.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    // The spec may hold only the masked command: the real one, when it spells out a secret
    // value, lives in the job's secrets file, the one file allowed to hold values.
    let spec = Spec {
        command: masked.clone(),
        cwd: cwd.clone(),
        env,
        timeout_seconds: timeout,
        idle_timeout_seconds: idle,
        grace_seconds: cfg.grace_seconds,
        max_output_bytes: cfg.max_output_bytes,
        has_stdin: req.stdin.is_some(),
    };
    // These files live only until the job ends and a crash before the start loses the job
    // anyway: a plain private write, no fsync (the records themselves are durable).
    let private = |name: &str, data: &[u8]| {
        use std::io::Write;
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dir.join(name))?
            .write_all(data)
    };
    private(store::SPEC, &serde_json::to_vec(&spec).unwrap_or_default())
        .map_err(io("spec.json"))?;
    if !req.secrets.is_empty() {
        let mut text = String::new();
        if masked != req.command {
            text = format!(
                "{COMMAND_LINE}{}\n",
                serde_json::Value::from(req.command.as_str())
            );
        }
        text.push_str(&crate::secrets::serialize(&req.secrets));
        private(store::SECRETS, text.as_bytes()).map_err(io("secrets file"))?;
    }
    if let Some(stdin) = &req.stdin {
        private(store::STDIN, stdin).map_err(io("stdin"))?;
    }
    let rec = JobRecord {
        format_version: FORMAT_VERSION,
        id: id.to_string(),
        command: masked,
        cwd,
        status: Status::Running,
        exit_code: None,
        signal: None,
        created_at: crate::timefmt::now(),
        started_at: None,
        ended_at: None,
        timeout_seconds: timeout,
        idle_timeout_seconds: idle,
        pid: None,
        pgid: None,
        output_bytes: 0,
        reason: None,
        output_truncated: false,
        output_dropped_bytes: 0,
        supervisor_pid: None,
        supervisor_start: None,
        boot_id: Some(crate::sandbox::boot_id()).filter(|b| !b.is_empty()),
        idempotency_key: req.idempotency_key.clone(),
        grace_seconds: Some(cfg.grace_seconds),
        cgroup: None,
        extra: Default::default(),
    };
    let data = serde_json::to_vec_pretty(&rec).unwrap_or_default();
    store::write_atomic(&dir.join(store::RECORD), &data, 0o600).map_err(io("job.json"))?;
    fs::rename(&dir, store.job_dir(id)).map_err(io("folder"))?;
    fs::File::open(store.jobs_dir())
        .and_then(|d| d.sync_all())
        .map_err(io("jobs folder"))?;
    let running = store.root().join("running");
    crate::store::ensure_private_dir(&running).map_err(io("running folder"))?;
    fs::write(running.join(id.as_str()), b"").map_err(io("running marker"))?;

    let events = spawn_supervisor(store, id, &lock)?;
    drop(lock);
    // Settles the job at once if its supervisor already died (the lock is free now).
    Ok((store.load(id)?, events))
}

/// The supervisor's change channel for a job this process started: readable when output
/// was stored, at EOF once the final record is written.
pub struct JobEvents {
    pipe: Option<std::process::ChildStdout>,
}

impl JobEvents {
    /// Waits up to `timeout` for something to happen; false if nothing did. After the end
    /// (or if the channel broke) it returns true at once, so callers re-read the record.
    pub fn wait(&mut self, timeout: Duration) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::io::Read;
        use std::os::fd::AsFd;
        let Some(pipe) = &mut self.pipe else {
            return true;
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        let mut fds = [PollFd::new(pipe.as_fd(), PollFlags::POLLIN)];
        match poll(
            &mut fds,
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(0) => false,
            Ok(_) => {
                let mut buf = [0u8; 4096];
                if !matches!(pipe.read(&mut buf), Ok(n) if n > 0) {
                    self.pipe = None;
                }
                true
            }
            Err(_) => {
                self.pipe = None;
                true
            }
        }
    }
}

/// Where a job's folder is assembled before it is renamed into place.
pub fn staging_dir(store: &Store, id: &JobId) -> std::path::PathBuf {
    store.jobs_dir().join(format!(".new-{id}"))
}

fn spawn_supervisor(store: &Store, id: &JobId, lock: &fs::File) -> Result<JobEvents> {
    let lock_fd = lock.as_raw_fd();
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg("supervise")
        .arg("--root")
        .arg(store.root())
        .arg(id.as_str())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    // SAFETY: dup2, fcntl and setsid are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            // dup2 onto itself keeps close-on-exec, so clear it by hand in that case.
            let r = if lock_fd == LOCK_FD {
                libc::fcntl(LOCK_FD, libc::F_SETFD, 0)
            } else {
                libc::dup2(lock_fd, LOCK_FD)
            };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Its own session: a terminal's Ctrl-C or hangup never reaches the supervisor.
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::io("starting the job's supervisor", e))?;
    // Unbuffered, byte by byte: what follows the line belongs to the change channel.
    let mut out = child.stdout.take();
    let mut line = Vec::new();
    if let Some(o) = &mut out {
        let mut b = [0u8];
        while line.len() < 4096 && matches!(o.read(&mut b), Ok(1)) && b[0] != b'\n' {
            line.push(b[0]);
        }
    }
    // The first process exits right after forking the real supervisor; if a PID-1 reaper
    // got to it first, the status is simply gone, which is fine.
    let _ = child.wait();
    let line = String::from_utf8_lossy(&line);
    if line == "ok" {
        return Ok(JobEvents { pipe: out });
    }
    let msg = line
        .strip_prefix("err ")
        .unwrap_or("the supervisor exited without a word");
    match store.read_raw(id) {
        // It recorded why the job failed.
        Ok(r) if r.status != Status::Running => Ok(JobEvents { pipe: None }),
        // The shell started, then the supervisor died: the job exists, and reading it
        // settles it as `lost` (sweeping whatever it started).
        Ok(r) if r.pid.is_some() => Ok(JobEvents { pipe: None }),
        _ => Err(Error::Internal(format!("could not start job {id}: {msg}"))),
    }
}

/// Asks a job's supervisor to cancel the job, then waits (up to the grace period and a
/// margin) for the final record. Cancelling an ended job changes nothing.
pub fn cancel(store: &Store, id: &JobId, wait: Duration) -> Result<JobRecord> {
    let mut deadline = Instant::now() + wait;
    let mut first = true;
    loop {
        let rec = store.load(id)?;
        if first {
            // Never give up before a TERM-ignoring job could have been KILLed.
            first = false;
            let grace =
                Duration::from_secs_f64(rec.grace_seconds.unwrap_or(5.0).clamp(0.0, 86_400.0));
            deadline = deadline.max(Instant::now() + grace + Duration::from_secs(5));
        }
        if rec.status.is_final() {
            return Ok(rec);
        }
        if let (Some(pid), Some(start)) = (rec.supervisor_pid, rec.supervisor_start)
            && let Some(sup) = proc::Pidfd::open(pid, start)
            && sup.signal(Signal::SIGUSR1)
        {
            // The supervisor exits right after writing the final record: wait on its pidfd
            // (no file watching, nothing to set up or tear down), then read the record.
            sup.wait_exit(deadline.saturating_duration_since(Instant::now()));
            return store.load(id);
        }
        // The supervisor has not recorded itself yet (or just exited): look again.
        if Instant::now() >= deadline {
            return Ok(rec);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn idem_path(store: &Store, key: &str) -> std::path::PathBuf {
    use std::hash::{Hash, Hasher};
    let mut parts = [0u64; 2];
    for (i, p) in parts.iter_mut().enumerate() {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (i, key).hash(&mut h);
        *p = h.finish();
    }
    store
        .root()
        .join("idempotency")
        .join(format!("{:016x}{:016x}", parts[0], parts[1]))
}

fn idem_lock(store: &Store, key: &str) -> Result<fs::File> {
    if key.is_empty() || key.len() > 255 || key.chars().any(|c| c.is_control()) {
        return Err(Error::Invalid(
            "Idempotency-Key must be 1 to 255 printable characters".into(),
        ));
    }
    let path = idem_path(store, key).with_extension("lock");
    if let Some(dir) = path.parent() {
        store::ensure_private_dir(dir).map_err(|e| Error::io("idempotency folder", e))?;
    }
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(|e| Error::io("idempotency lock", e))?;
    f.lock().map_err(|e| Error::io("idempotency lock", e))?;
    Ok(f)
}

/// The job already started with this idempotency key, if any.
fn idempotent_lookup(store: &Store, key: &str) -> Result<Option<JobId>> {
    let Ok(text) = fs::read_to_string(idem_path(store, key)) else {
        return Ok(None);
    };
    let mut lines = text.lines();
    match (lines.next().and_then(JobId::parse), lines.next()) {
        (Some(id), Some(k)) if k == key && store.job_dir(&id).is_dir() => Ok(Some(id)),
        _ => Ok(None),
    }
}

fn idempotent_record(store: &Store, key: &str, id: &JobId) {
    let path = idem_path(store, key);
    let _ = store::write_atomic(&path, format!("{id}\n{key}\n").as_bytes(), 0o600);
}
