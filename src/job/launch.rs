//! Starting and cancelling jobs: the one spawn path shared by the CLI and the server.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

pub use super::handshake::JobEvents;
use super::handshake::{LOCK_FD, Ready, SPEC_FD};
use super::settle;
use crate::model::env;
use crate::model::error::{Error, Result};
use crate::model::spec::{Config, JobUser, MAX_ARG_BYTES, Spec, StartRequest, check_seconds};
use crate::model::{FORMAT_VERSION, JobId, JobRecord, Status};
use crate::state::envstore::EnvStore;
use crate::state::idempotency::{self, Earlier};
use crate::state::store::Store;
use crate::text::redact::Redactor;

/// A request checked and resolved, before anything is written.
struct Resolved {
    cwd: String,
    timeout: f64,
    /// The request asked for more than the cap.
    clamped: bool,
    idle: Option<f64>,
    user: Option<JobUser>,
}

/// The user a job runs as: the request's, else the agent's job user; none when that is
/// the agent's own uid. Only root can start a job as someone else.
pub(crate) fn resolve_user(req: &StartRequest, cfg: &Config) -> Result<Option<JobUser>> {
    let Some(name) = req.user.as_deref().or(cfg.job_user.as_deref()) else {
        return Ok(None);
    };
    let user = crate::os::users::lookup(name)?;
    let me = nix::unistd::geteuid().as_raw();
    if user.uid == me {
        return Ok(None);
    }
    if me != 0 {
        return Err(Error::Invalid(format!(
            "the agent runs as uid {me}, not root, so it cannot run jobs as user {name}: \
             run it as root, or drop the job user"
        )));
    }
    Ok(Some(user))
}

/// What separates jobs from the agent under `cfg`: `"user"` when jobs run under another
/// uid than the agent's, else `"none"`. An unusable job user is an error, so `serve` and
/// `exec` refuse to start rather than run jobs unseparated.
pub fn isolation(cfg: &Config) -> Result<&'static str> {
    let probe = StartRequest::default();
    Ok(if resolve_user(&probe, cfg)?.is_some() {
        "user"
    } else {
        "none"
    })
}

/// Validates a request and resolves its working folder, before anything is written.
fn validate(req: &StartRequest, cfg: &Config) -> Result<Resolved> {
    if req.command.trim().is_empty() {
        return Err(Error::Invalid(
            "command is empty: give a shell command to run".into(),
        ));
    }
    if req.command.contains('\0') {
        return Err(Error::Invalid("command holds a NUL byte".into()));
    }
    if req.command.len() > MAX_ARG_BYTES {
        return Err(Error::Invalid(format!(
            "command is {} bytes; the kernel passes at most {MAX_ARG_BYTES} bytes in one \
             argument: send a long script as stdin (run `sh -s`) or write it to a file",
            req.command.len()
        )));
    }
    env::check_all(&req.env)?;
    if req.argv.is_some() && req.session.is_some() {
        return Err(Error::Invalid(
            "argv and session exclude each other: argv runs a program without a shell, a \
             session's commands run in its shell (give command instead)"
                .into(),
        ));
    }
    if req.separate_stderr && req.pty.is_some() {
        return Err(Error::Invalid(
            "separateStderr and pty exclude each other: a terminal has one stream".into(),
        ));
    }
    if let Some(l) = &req.limits {
        l.check()?;
        crate::os::cgroup::check_limits(l).map_err(Error::Conflict)?;
    }
    if (req.interactive || req.pty.is_some()) && req.stdin.is_some() {
        return Err(Error::Invalid(
            "stdin and interactive exclude each other: an interactive job's stdin is \
             written later (POST /v1/jobs/{id}/stdin)"
                .into(),
        ));
    }
    if let Some(p) = req.pty {
        for (side, v) in [("cols", p.cols), ("rows", p.rows)] {
            if !(1..=crate::model::spec::MAX_PTY_SIDE).contains(&v) {
                return Err(Error::Invalid(format!(
                    "pty.{side} must be 1 to {}, got {v}",
                    crate::model::spec::MAX_PTY_SIDE
                )));
            }
        }
    }
    for var in &req.secrets {
        env::check_job_name(&var.name)?;
    }
    // Values a request stores in the clear (the record's cwd, the idempotency file) must
    // not spell out a secret in any form output would mask: refuse rather than store it or
    // mask it into a wrong path.
    let secrets = secrets_finder(req);
    for (field, text) in [
        ("cwd", req.cwd.as_deref()),
        ("Idempotency-Key", req.idempotency_key.as_deref()),
    ] {
        refuse_secret(&secrets, req, field, text)?;
    }
    let user = resolve_user(req, cfg)?;
    let cwd = match &req.cwd {
        Some(c) if c.contains('\0') => return Err(Error::Invalid("cwd holds a NUL byte".into())),
        Some(c) => Path::new(c).to_path_buf(),
        None => match &user {
            // A job user starts at home, as a login would.
            Some(u) => Path::new(&u.home).to_path_buf(),
            None => std::env::current_dir()
                .map_err(|e| Error::Invalid(format!("the current folder is unusable: {e}")))?,
        },
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
    // The folder is stored as resolved: a symbolic link may have led into a name that
    // spells a secret (or the default, a home folder, may).
    refuse_secret(&secrets, req, "cwd", cwd.to_str())?;
    let asked = req
        .timeout_seconds
        .map(|t| check_seconds("timeoutSeconds", t))
        .transpose()?;
    let timeout = asked
        .unwrap_or(cfg.max_job_seconds)
        .min(cfg.max_job_seconds);
    let clamped = asked.is_some_and(|t| t > cfg.max_job_seconds);
    let idle = req
        .idle_timeout_seconds
        .map(|t| check_seconds("idleTimeoutSeconds", t))
        .transpose()?;
    Ok(Resolved {
        cwd: cwd.to_string_lossy().into_owned(),
        timeout,
        clamped,
        idle,
        user,
    })
}

/// A redactor for the request's secrets, in every form output masks them.
pub(super) fn secrets_finder(req: &StartRequest) -> Redactor {
    let values: Vec<&[u8]> = req
        .secrets
        .iter()
        .map(|s| s.value.expose().as_bytes())
        .collect();
    let forms = crate::text::pipeline::masked_forms(&values);
    Redactor::new(&forms.iter().map(Vec::as_slice).collect::<Vec<_>>())
}

/// Refuses a request field that is stored in the clear when it holds a secret in any
/// spelling that is masked in output (plain, escaped, base64…), naming the secret.
fn refuse_secret(
    secrets: &Redactor,
    req: &StartRequest,
    field: &str,
    text: Option<&str>,
) -> Result<()> {
    let Some(text) = text.filter(|t| secrets.finds(t.as_bytes())) else {
        return Ok(());
    };
    // Which secret it is, so the caller knows what to change.
    let name = req
        .secrets
        .iter()
        .find(|s| {
            let forms = crate::text::pipeline::masked_forms(&[s.value.expose().as_bytes()]);
            Redactor::new(&forms.iter().map(Vec::as_slice).collect::<Vec<_>>())
                .finds(text.as_bytes())
        })
        .map_or("?", |s| s.name.as_str());
    Err(Error::Invalid(format!(
        "{field} holds the value of secret {name} (as given or encoded); it would be stored \
         in the clear: choose a {field} without it"
    )))
}

/// How many jobs are running now (cheap: one folder listing).
pub fn running_count(store: &Store) -> usize {
    fs::read_dir(store.running_dir())
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
    if let Ok(dir) = fs::read_dir(store.running_dir()) {
        for e in dir.flatten() {
            match e.file_name().to_str().and_then(JobId::parse) {
                Some(id) => match settle::settle_and_load(store, &id) {
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

/// Starts a job and returns its record once the shell runs. The persisted env comes
/// first; the request's own variables win over it.
pub fn start(store: &Store, cfg: &Config, req: StartRequest) -> Result<JobRecord> {
    start_watched(store, cfg, req).map(|(rec, _)| rec)
}

/// [`start`], also returning the job's change channel (absent when an idempotent retry
/// returned an earlier job) so the caller can wait for output and the end without polling.
pub fn start_watched(
    store: &Store,
    cfg: &Config,
    req: StartRequest,
) -> Result<(JobRecord, Option<JobEvents>)> {
    start_with_stdin(store, cfg, req, None)
}

/// [`start_watched`] with `stdin` (an open file, pipe or socket: the CLI's own) as the
/// job's stdin itself, streamed by the kernel and never read here.
pub fn start_with_stdin(
    store: &Store,
    cfg: &Config,
    req: StartRequest,
    stdin: Option<fs::File>,
) -> Result<(JobRecord, Option<JobEvents>)> {
    match begin(store, cfg, req, stdin, true)? {
        Begun::Started(id, Some(rec), events) => {
            debug_assert_eq!(rec.id, id);
            Ok((rec, Some(events)))
        }
        Begun::Started(id, None, events) => {
            Ok((settle::settle_and_load(store, &id)?, Some(events)))
        }
        Begun::Earlier(rec) => Ok((rec, None)),
    }
}

/// What [`start_to_wait`] began.
pub enum Begun {
    /// A new job, its record (when it was read back) and its change channel.
    Started(JobId, Option<JobRecord>, JobEvents),
    /// An idempotent retry: the job the key started before, as it is now.
    Earlier(JobRecord),
}

/// [`start_watched`] for a caller that waits for the job's end on its channel and reads
/// the record then (a read that settles the job just as one now would): the record is not
/// read back once the shell runs, which saves a read of it and a look at its supervisor on
/// every waited start.
pub fn start_to_wait(store: &Store, cfg: &Config, req: StartRequest) -> Result<Begun> {
    begin(store, cfg, req, None, false)
}

fn begin(
    store: &Store,
    cfg: &Config,
    req: StartRequest,
    stdin: Option<fs::File>,
    read_back: bool,
) -> Result<Begun> {
    let resolved = validate(&req, cfg)?;
    if stdin.is_some() && (req.stdin.is_some() || req.interactive || req.pty.is_some()) {
        return Err(Error::Invalid(
            "a job has one stdin: an open file, its stdin bytes, or an interactive one".into(),
        ));
    }
    // Held until the job is recorded under its key, so two retries racing each other
    // still start one job.
    let fingerprint = req.fingerprint();
    let key_lock = match req.idempotency_key.as_deref() {
        Some(k) => Some((k, idempotency::lock(store, k)?)),
        None => None,
    };
    if let Some((key, lock)) = &key_lock {
        match idempotency::lookup(store, lock, key, fingerprint) {
            Earlier::None => {}
            Earlier::Same(id) => return Ok(Begun::Earlier(settle::settle_and_load(store, &id)?)),
            Earlier::Different(id) => {
                return Err(Error::Conflict(format!(
                    "Idempotency-Key {key:?} was already used for job {id} with a different \
                     request; send the same request to get that job, or use a new key"
                )));
            }
        }
    }
    if settled_running_count(store, cfg.max_running) >= cfg.max_running {
        return Err(Error::RateLimited(format!(
            "{} jobs are running, the most this agent allows; wait for one to end or cancel one",
            cfg.max_running
        )));
    }
    let mut random = [0u8; 10];
    crate::os::proc::random_bytes(&mut random).map_err(|e| Error::io("random id", e))?;
    let id = JobId::from_random(random);
    let dir = store.job_dir(&id);
    // What the scoped token persisted reaches only jobs of the user its own jobs run as.
    let scoped_user = {
        let uid = |u: &Option<JobUser>| u.as_ref().map(|u| u.uid);
        uid(&resolve_user(&StartRequest::default(), cfg)?) == uid(&resolved.user)
    };
    let persisted_env = EnvStore::open(store.root())
        .persisted()?
        .for_job(scoped_user);
    let result = create_and_spawn(store, cfg, &persisted_env, &req, &id, resolved, stdin).and_then(
        |events| {
            // Settles the job at once if its supervisor already died (the lock is free now).
            let rec = read_back
                .then(|| settle::settle_and_load(store, &id))
                .transpose()?;
            Ok((rec, events))
        },
    );
    match result {
        Ok((rec, events)) => {
            if let Some((key, lock)) = &key_lock {
                idempotency::record(store, lock, key, &id, fingerprint);
            }
            Ok(Begun::Started(id, rec, events))
        }
        Err(e) => {
            // Nothing half-written: a job that never started leaves no folder behind,
            // unless its supervisor already recorded why it failed. One whose shell did
            // start (the record has a pid) is kept and settled, so whatever it started is
            // swept and the record says `lost`.
            match store.read_raw(&id) {
                Ok(r) if r.status == Status::Running && r.pid.is_some() => {
                    let _ = settle::settle_and_load(store, &id);
                }
                Ok(r) if r.status != Status::Running => {}
                _ => {
                    crate::os::sweep::sweep_job(id.as_str(), None);
                    let _ = fs::remove_dir_all(&dir);
                }
            }
            let _ = fs::remove_dir_all(store.staging_dir(&id));
            let _ = fs::remove_file(store.running_marker(&id));
            Err(e)
        }
    }
}

fn create_and_spawn(
    store: &Store,
    cfg: &Config,
    persisted_env: &BTreeMap<String, String>,
    req: &StartRequest,
    id: &JobId,
    resolved: Resolved,
    given_stdin: Option<fs::File>,
) -> Result<JobEvents> {
    let Resolved {
        cwd,
        timeout,
        clamped,
        idle,
        user,
    } = resolved;
    // Built under a hidden name and renamed into place whole (by the supervisor, once the
    // shell runs and the record names it), so a job folder never exists without its
    // record, even if this process dies half-way.
    let dir = store.staging_dir(id);
    let io = |what: &str| {
        let what = format!("creating job {id}: {what}");
        move |e| Error::io(what, e)
    };
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(io("folder"))?;
    // The folder is the job's lock (no lock file: every file a start makes costs an
    // inode); it keeps its inode, so its lock, across the rename.
    let lock = fs::File::open(&dir).map_err(io("lock"))?;
    lock.lock().map_err(io("lock"))?;
    // Made here so the running marker can be a second name for it, which costs no inode.
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dir.join(crate::state::layout::OUTPUT))
        .map_err(io("output.log"))?;
    fs::hard_link(
        dir.join(crate::state::layout::OUTPUT),
        store.running_marker(id),
    )
    .map_err(io("running marker"))?;

    // Masked in every form output masks, as cwd and the key are refused in every one.
    let masked = secrets_finder(req).redact_str(&req.command);
    let mut env = persisted_env.clone();
    env.extend(req.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    let record = JobRecord {
        format_version: FORMAT_VERSION,
        id: id.clone(),
        command: masked,
        cwd: cwd.clone(),
        status: Status::Running,
        exit_code: None,
        signal: None,
        created_at: crate::text::timefmt::now(),
        started_at: None,
        ended_at: None,
        timeout_seconds: timeout,
        idle_timeout_seconds: idle,
        timeout_clamped: clamped,
        pid: None,
        pgid: None,
        output_bytes: 0,
        reason: None,
        output_truncated: false,
        output_dropped_bytes: 0,
        supervisor_pid: None,
        supervisor_start: None,
        boot_id: Some(crate::state::sandbox::boot_id()).filter(|b| !b.is_empty()),
        idempotency_key: req.idempotency_key.clone(),
        grace_seconds: Some(cfg.grace_seconds),
        user: user.as_ref().map(|u| u.name.clone()),
        uid: user.as_ref().map(|u| u.uid),
        redactions: None,
        cgroup: None,
        session_id: req.session.as_ref().map(|s| s.id.to_string()),
        session_saved: None,
        limits: req.limits.filter(|l| !l.is_empty()),
        usage: Default::default(),
        oom_killed: false,
        cgroups_v1: Vec::new(),
        stderr_bytes: req.separate_stderr.then_some(0),
        extra: Default::default(),
    };
    // The record holds only the masked command; the real one and the secret values
    // travel in the spec, a memory file, and are never stored.
    let spec = Spec {
        command: req.command.clone(),
        secrets: crate::model::secret::serialize(&req.secrets),
        cwd,
        env,
        timeout_seconds: timeout,
        idle_timeout_seconds: idle,
        grace_seconds: cfg.grace_seconds,
        max_output_bytes: cfg.max_output_bytes,
        has_stdin: req.stdin.is_some() || given_stdin.is_some(),
        user,
        interactive: req.interactive || req.pty.is_some(),
        pty: req.pty,
        session: req.session.clone(),
        limits: req.limits.filter(|l| !l.is_empty()),
        argv: req.argv.clone(),
        separate_stderr: req.separate_stderr,
        record,
    };

    // Stdin (a .netrc, say) never touches the disk: it reaches the supervisor as a memory
    // file on its own stdin, which it hands to the shell.
    let stdin = match given_stdin {
        Some(f) => Some(f),
        None => req
            .stdin
            .as_deref()
            .map(crate::os::spawn::memory_file)
            .transpose()
            .map_err(io("stdin"))?,
    };
    let spec = crate::os::spawn::memory_file(&serde_json::to_vec(&spec).unwrap_or_default())
        .map_err(io("spec"))?;
    let events = spawn_supervisor(store, id, &lock, &spec, stdin)?;
    drop(lock);
    Ok(events)
}

/// The fork server `serve` starts before its first thread (see [`use_fork_server`]).
static FORK_SERVER: std::sync::OnceLock<crate::os::forkserver::ForkServer> =
    std::sync::OnceLock::new();

/// Starts the fork server that this process's job starts then use. Call it while the
/// process is still single-threaded (`serve` does, first thing).
pub fn use_fork_server() -> Result<()> {
    // The cgroup hierarchy is looked up once, here: every supervisor the server forks
    // inherits the answer instead of reading the mount table again.
    crate::os::cgroup::JobCgroup::warm();
    // So is the boot id, which every journal line of theirs carries.
    let _ = crate::state::sandbox::boot_id();
    let fs = crate::os::forkserver::ForkServer::start(super::supervisor::main_forked)
        .map_err(|e| Error::io("starting the fork server", e))?;
    let _ = FORK_SERVER.set(fs);
    Ok(())
}

/// Starts the job's supervisor: through the fork server, as a fork of this process when
/// it is single-threaded (the CLI), else by exec'ing this binary (`supervise`). Returns
/// the supervisor's channel, once it answered.
fn spawn_supervisor(
    store: &Store,
    id: &JobId,
    lock: &fs::File,
    spec: &fs::File,
    stdin: Option<fs::File>,
) -> Result<JobEvents> {
    use std::os::fd::AsFd;
    let failed = |e| Error::io("starting the job's supervisor", e);
    let stdin_fd = stdin.as_ref().map(|f| f.as_fd());
    // A fork server that is gone (killed) or was given up (stopped) leaves the exec path.
    // One that was sent the start and never answered may have forked its supervisor
    // anyway: the start fails rather than risk a second one.
    let served = match FORK_SERVER.get().map(|s| {
        s.launch(
            store.root(),
            id.as_str(),
            lock.as_fd(),
            spec.as_fd(),
            stdin_fd,
        )
    }) {
        Some(Ok(r)) => Some(r),
        Some(Err(e)) if e.kind() == std::io::ErrorKind::TimedOut => return Err(failed(e)),
        _ => None,
    };
    let (mut out, first): (fs::File, Option<i32>) = if let Some(r) = served {
        (r, None)
    } else if crate::os::proc::threads(std::process::id() as i32) == 1 {
        let (_, r) = crate::os::forkserver::fork_entry(
            super::supervisor::main_forked,
            store.root(),
            id.as_str(),
            lock.as_fd(),
            spec.as_fd(),
            stdin_fd,
        )
        .map_err(failed)?;
        // This CLI exits when its job does; meanwhile the supervisor is its child.
        (r, None)
    } else {
        let mut cmd = Command::new("/proc/self/exe");
        cmd.arg("supervise")
            .arg("--root")
            .arg(store.root())
            .arg(id.as_str())
            .stdin(stdin.map_or_else(Stdio::null, Stdio::from))
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        crate::os::spawn::as_supervisor(
            &mut cmd,
            [(lock.as_raw_fd(), LOCK_FD), (spec.as_raw_fd(), SPEC_FD)],
        );
        let mut child = cmd.spawn().map_err(failed)?;
        let out = child.stdout.take().map(OwnedFd::from).map(fs::File::from);
        let pid = child.id() as i32;
        // Reaped below by pid, not through `child`.
        std::mem::forget(child);
        (
            out.ok_or_else(|| Error::Internal("no channel to the supervisor".into()))?,
            Some(pid),
        )
    };
    // Bounded: a job that stops its supervisor before it answers must not hang the
    // caller; meanwhile whoever stopped it is undone.
    let (ready, pending) = Ready::receive_within(
        &mut out,
        Instant::now() + crate::job::handshake::READY_WAIT,
        &mut |pid| {
            if let Some(pid) = pid
                && let Some(st) = crate::os::proc::stat(pid)
            {
                crate::os::pidfd::continue_if_stopped(pid, st.start);
            }
        },
    );
    // An exec'd supervisor's first process exits right after forking the real one; if a
    // PID-1 reaper got to it first, the status is simply gone, which is fine.
    if let Some(pid) = first {
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
    }
    let out = Some(out);
    let msg = match ready {
        Ready::Ok => return Ok(JobEvents::with_pending(out, pending)),
        Ready::Err(m) => m,
    };
    match store.read_raw(id) {
        // It recorded why the job failed.
        Ok(r) if r.status != Status::Running => Ok(JobEvents::new(None)),
        // The shell started, then the supervisor died: the job exists, and reading it
        // settles it as `lost` (sweeping whatever it started).
        Ok(r) if r.pid.is_some() => Ok(JobEvents::new(None)),
        _ => Err(Error::Internal(format!("could not start job {id}: {msg}"))),
    }
}

/// Asks a job's supervisor to cancel the job, then waits (up to the grace period and a
/// margin) for the final record. Cancelling an ended job changes nothing.
pub fn cancel(store: &Store, id: &JobId, wait: Duration) -> Result<JobRecord> {
    let mut deadline = Instant::now() + wait;
    let mut first = true;
    loop {
        let rec = settle::settle_and_load(store, id)?;
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
        // A stopped supervisor would never act on the request.
        settle::nudge(&rec);
        if let (Some(pid), Some(start)) = (rec.supervisor_pid, rec.supervisor_start)
            && let Some(sup) = crate::os::pidfd::Pidfd::open(pid, start)
            && sup.signal(Signal::SIGUSR1)
        {
            // The supervisor exits right after writing the final record: wait on its pidfd
            // (no file watching, nothing to set up or tear down), then read the record.
            sup.wait_exit(deadline.saturating_duration_since(Instant::now()));
            return settle::settle_and_load(store, id);
        }
        // The supervisor has not recorded itself yet (or just exited): look again.
        if Instant::now() >= deadline {
            return Ok(rec);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
