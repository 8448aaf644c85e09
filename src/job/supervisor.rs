//! One job's life: the supervisor process (`gitterm-agent supervise <id>`).
//!
//! It is started by [`crate::job::launch`], detaches from whoever started it, becomes the
//! subreaper of everything the job starts, runs `/bin/sh -c COMMAND` in a new session, pumps
//! the output through the pipeline into `output.log`, enforces the timeouts, ends every
//! process the job left behind, and writes the final record. It holds the job's lock for
//! its whole life: a lock anyone else can take means the supervisor is gone.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::model::spec::{JOB_ENV_MARKER, Spec};
use crate::model::{JobId, JobRecord, Status};
use crate::os::proc::{self, JobCgroup};
use crate::state::store::Store;
use crate::text::pipeline::Pipeline;

/// The fd on which the launcher hands the (already locked) job lock to the supervisor.
pub const LOCK_FD: i32 = 3;
use crate::state::layout::RESERVE;
const RESERVE_BYTES: usize = 16 * 1024;

/// Why the job is ending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    ShellExited,
    Timeout,
    Idle,
    Cancel,
    Stopped(i32),
}

/// Entry point of `gitterm-agent supervise <id>`; the exit status is the process's.
pub fn main(root: &Path, id: &str) -> i32 {
    let Some(id) = JobId::parse(id) else {
        eprintln!("supervise: malformed job id");
        return 2;
    };
    let lock = match crate::os::spawn::adopt_inherited_fd(LOCK_FD) {
        Ok(l) => l,
        Err(e) => return report_failure(&format!("lock fd: {e}")),
    };
    let store = match Store::open(root) {
        Ok(s) => s,
        Err(e) => return report_failure(&e.to_string()),
    };
    // Detach: the launcher waits for this first process only until the fork, so neither a
    // CLI nor the server ever keeps a zombie supervisor. The daemon is reparented to the
    // nearest subreaper (or init).
    match crate::os::spawn::fork_detached() {
        Ok(false) => return 0,
        Ok(true) => {}
        Err(e) => return report_failure(&format!("fork: {e}")),
    }
    let code = match Supervisor::start(&store, &id) {
        Ok(mut s) => {
            ready_line("ok");
            s.sink.set_events(events_pipe());
            detach_stdio();
            s.run();
            0
        }
        Err(msg) => {
            fail_record(&store, &id, &msg);
            ready_line(&format!("err {msg}"));
            1
        }
    };
    drop(lock);
    code
}

fn report_failure(msg: &str) -> i32 {
    ready_line(&format!("err {msg}"));
    1
}

fn ready_line(s: &str) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{s}");
    let _ = out.flush();
}

/// Keeps the launcher's pipe as a change channel: a byte per stored chunk of output, and
/// EOF once the final record is written. The launcher learns of the end at once, without
/// watching files (closing an inotify instance can cost milliseconds).
fn events_pipe() -> Option<File> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let file = File::from(io::stdout().as_fd().try_clone_to_owned().ok()?);
    fcntl(&file, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).ok()?;
    Some(file)
}

fn detach_stdio() {
    if let Ok(null) = OpenOptions::new().read(true).write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stdin(&null);
        let _ = nix::unistd::dup2_stdout(&null);
        let _ = nix::unistd::dup2_stderr(&null);
    }
}

/// Records a job that could not be started at all.
fn fail_record(store: &Store, id: &JobId, msg: &str) {
    if let Ok(mut rec) = store.read_raw(id) {
        for f in [
            crate::state::layout::SECRETS,
            crate::state::layout::SPEC,
            crate::state::layout::STDIN,
            RESERVE,
        ] {
            let _ = fs::remove_file(store.job_dir(id).join(f));
        }
        if let Some(cg) = JobCgroup::existing(id.as_str()) {
            cg.remove();
        }
        rec.status = Status::Failed;
        rec.reason = Some(format!("the agent could not start the job: {msg}"));
        rec.ended_at = Some(crate::text::timefmt::now());
        let _ = store.write_record(&rec);
        let _ = fs::remove_file(store.root().join("running").join(id.as_str()));
    }
}

struct Supervisor {
    store: Store,
    id: JobId,
    rec: JobRecord,
    spec: Spec,
    me: i32,
    shell: i32,
    cgroup: Option<JobCgroup>,
    sigfd: SignalFd,
    pipe: Option<OwnedFd>,
    sink: Sink,
    pipeline: Pipeline,
}

impl Supervisor {
    fn start(store: &Store, id: &JobId) -> Result<Supervisor, String> {
        let dir = store.job_dir(id);
        let rec = store.read_raw(id).map_err(|e| e.to_string())?;
        let spec: Spec = serde_json::from_slice(
            &fs::read(dir.join(crate::state::layout::SPEC))
                .map_err(|e| format!("spec.json: {e}"))?,
        )
        .map_err(|e| format!("spec.json: {e}"))?;
        let mut spec = spec;
        let secrets = match fs::read_to_string(dir.join(crate::state::layout::SECRETS)) {
            Ok(t) => {
                if let Some(raw) = t
                    .lines()
                    .next()
                    .and_then(|l| l.strip_prefix(crate::model::spec::COMMAND_LINE))
                {
                    spec.command =
                        serde_json::from_str(raw).map_err(|e| format!("secrets file: {e}"))?;
                }
                crate::model::secret::parse(&t).map_err(|e| format!("secrets file: {e}"))?
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(format!("secrets file: {e}")),
        };
        let values: Vec<&[u8]> = secrets
            .iter()
            .map(|s| s.value.expose().as_bytes())
            .collect();
        let pipeline = Pipeline::new(&values);

        proc::set_child_subreaper().map_err(|e| format!("subreaper: {e}"))?;
        let mut mask = SigSet::empty();
        for s in [
            Signal::SIGCHLD,
            Signal::SIGUSR1,
            Signal::SIGTERM,
            Signal::SIGINT,
            Signal::SIGHUP,
        ] {
            mask.add(s);
        }
        mask.thread_block().map_err(|e| format!("sigmask: {e}"))?;
        let sigfd = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
            .map_err(|e| format!("signalfd: {e}"))?;

        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(dir.join(crate::state::layout::OUTPUT))
            .map_err(|e| format!("output.log: {e}"))?;
        let _ = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(dir.join(RESERVE))
            .and_then(|mut f| f.write_all(&[0u8; RESERVE_BYTES]));

        let stdin = if spec.has_stdin {
            Stdio::from(
                File::open(dir.join(crate::state::layout::STDIN))
                    .map_err(|e| format!("stdin file: {e}"))?,
            )
        } else {
            Stdio::null()
        };
        let (reader, writer) = io::pipe().map_err(|e| format!("pipe: {e}"))?;
        // Non-blocking, so the last drain cannot hang on a writer outside the job's tree.
        crate::os::spawn::tune_pipe_reader(&reader).map_err(|e| format!("pipe: {e}"))?;
        let cgroup = JobCgroup::create(id.as_str());
        let cg_procs = cgroup.as_ref().and_then(|c| {
            OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(c.procs_file())
                .ok()
        });
        let cg_fd = cg_procs.as_ref().map(|f| f.as_raw_fd());
        let me = std::process::id() as i32;

        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(&spec.command)
            .current_dir(&spec.cwd)
            .envs(&spec.env)
            .env(JOB_ENV_MARKER, id.as_str())
            .stdin(stdin)
            .stdout(writer.try_clone().map_err(|e| format!("pipe: {e}"))?)
            .stderr(writer);
        for s in &secrets {
            cmd.env(&s.name, s.value.expose());
        }
        crate::os::spawn::as_job(&mut cmd, me, cg_fd);
        let child = cmd
            .spawn()
            .map_err(|e| format!("could not run /bin/sh: {e}"))?;
        drop(cmd); // closes our copies of the pipe's write end
        drop(cg_procs);
        let shell = child.id() as i32;
        // The pid is reaped through waitpid below, not through `child`.
        std::mem::forget(child);

        let mut rec = rec;
        rec.pid = Some(shell);
        rec.pgid = Some(shell);
        rec.started_at = Some(crate::text::timefmt::now());
        rec.supervisor_pid = Some(me);
        rec.supervisor_start = proc::stat(me).map(|s| s.start);
        rec.cgroup = cgroup
            .as_ref()
            .map(|c| c.path().to_string_lossy().into_owned());
        if let Err(e) = store.write_record(&rec) {
            // Without a record nobody could cancel or see the job: end it at once.
            let _ = nix::sys::signal::killpg(Pid::from_raw(shell), Signal::SIGKILL);
            if let Some(cg) = &cgroup {
                cg.kill_all();
            }
            let _ = waitpid(Pid::from_raw(shell), None);
            return Err(format!("job.json: {e}"));
        }
        let cap = spec.max_output_bytes;
        Ok(Supervisor {
            store: store.clone(),
            id: id.clone(),
            rec,
            spec,
            me,
            shell,
            cgroup,
            sigfd,
            pipe: Some(OwnedFd::from(reader)),
            sink: Sink::Inline(Output {
                out,
                cap,
                written: 0,
                dropped: 0,
                write_error: None,
                events: None,
            }),
            pipeline,
        })
    }

    fn run(&mut self) {
        let started = Instant::now();
        let secs = |s: f64| Duration::from_secs_f64(s.max(0.0));
        let deadline = started + secs(self.spec.timeout_seconds);
        let idle = self.spec.idle_timeout_seconds.map(secs);
        let grace = secs(self.spec.grace_seconds);
        let mut last_output = started;
        let mut shell_status: Option<WaitStatus> = None;
        let mut ending: Option<(End, Instant)> = None;
        let mut killed = false;
        let mut last_kill = started;
        let mut buf = vec![0u8; CHUNK];
        self.sink = std::mem::replace(&mut self.sink, Sink::Moved).threaded();

        loop {
            let now = Instant::now();
            // Decide what is due.
            if ending.is_none() {
                if now >= deadline {
                    ending = Some((End::Timeout, now));
                    self.signal_all(Signal::SIGTERM);
                } else if idle.is_some_and(|i| now >= last_output + i) {
                    ending = Some((End::Idle, now));
                    self.signal_all(Signal::SIGTERM);
                }
            }
            if let Some((_, since)) = ending {
                if !killed && now >= since + grace {
                    killed = true;
                    last_kill = now;
                    self.signal_all(Signal::SIGKILL);
                } else if killed && now >= last_kill + Duration::from_millis(200) {
                    // Whatever survived (forked meanwhile, re-parented late) gets KILL again.
                    last_kill = now;
                    self.signal_all(Signal::SIGKILL);
                }
                if shell_status.is_some() && !self.any_alive() {
                    break;
                }
            }
            let mut wake = match ending {
                None => {
                    let mut w = deadline;
                    if let Some(i) = idle {
                        w = w.min(last_output + i);
                    }
                    w
                }
                Some(_) if killed => now + Duration::from_millis(50),
                // While ending, re-check often: processes die without telling us when they
                // are not our children.
                Some((_, since)) => (since + grace).min(now + Duration::from_millis(50)),
            };
            if self.pipe.is_none() && ending.is_none() {
                wake = wake.min(now + Duration::from_millis(500));
            }
            let ms = wake.saturating_duration_since(now).as_millis().min(60_000) as i32;
            let timeout = PollTimeout::try_from(ms.max(if wake > now { 1 } else { 0 }))
                .unwrap_or(PollTimeout::MAX);

            let (pipe_ready, sig_ready) = {
                let mut fds = vec![PollFd::new(self.sigfd.as_fd(), PollFlags::POLLIN)];
                if let Some(p) = &self.pipe {
                    fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
                }
                match poll(&mut fds, timeout) {
                    Ok(_) => {
                        let r = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
                        (fds.get(1).is_some_and(r), r(&fds[0]))
                    }
                    Err(_) => (false, false),
                }
            };
            if pipe_ready {
                match self.read_pipe(&mut buf) {
                    Some(0) => self.pipe = None,
                    Some(_) => last_output = Instant::now(),
                    None => {}
                }
            }
            if sig_ready {
                while let Ok(Some(info)) = self.sigfd.read_signal() {
                    let sig = info.ssi_signo as i32;
                    if sig == libc::SIGCHLD {
                        self.reap(&mut shell_status);
                    } else if ending.is_none() || matches!(ending, Some((End::ShellExited, _))) {
                        let kind = if sig == libc::SIGUSR1 {
                            End::Cancel
                        } else {
                            End::Stopped(sig)
                        };
                        // A cancel after the shell exited still wins over "exited": the
                        // caller asked and the job had not ended yet.
                        let since = ending.map(|e| e.1).unwrap_or_else(Instant::now);
                        ending = Some((kind, since));
                        self.signal_all(Signal::SIGTERM);
                    }
                }
            }
            if shell_status.is_some() && ending.is_none() {
                ending = Some((End::ShellExited, Instant::now()));
                self.signal_all(Signal::SIGTERM);
            }
        }
        // Everything is dead: whatever is still in the pipe has no writer left.
        while self.pipe.is_some() {
            if !matches!(self.read_pipe(&mut buf), Some(n) if n > 0) {
                break;
            }
        }
        let mut tail = self.sink.buffer();
        self.pipeline.finish(&mut tail);
        self.sink.store(tail);
        self.sink = std::mem::replace(&mut self.sink, Sink::Moved).joined();
        self.finish(
            shell_status,
            ending.map(|e| e.0).unwrap_or(End::ShellExited),
        );
    }

    /// Reads once from the pipe; `Some(0)` at EOF, `None` when nothing was there.
    fn read_pipe(&mut self, buf: &mut [u8]) -> Option<usize> {
        let pipe = self.pipe.as_ref()?;
        let n = match nix::unistd::read(pipe, buf) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => return None,
            Err(_) => return Some(0),
        };
        let n = n as usize;
        if n > 0 {
            let mut chunk = self.sink.buffer();
            self.pipeline.feed(&buf[..n], &mut chunk);
            self.sink.store(chunk);
        }
        Some(n)
    }

    fn reap(&mut self, shell_status: &mut Option<WaitStatus>) {
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(st) => {
                    if st.pid() == Some(Pid::from_raw(self.shell))
                        && matches!(st, WaitStatus::Exited(..) | WaitStatus::Signaled(..))
                    {
                        *shell_status = Some(st);
                    }
                }
            }
        }
    }

    /// True while any process of the job is alive (zombies do not count).
    fn any_alive(&self) -> bool {
        proc::descendants(self.me).iter().any(|p| p.state != 'Z')
            || self.cgroup.as_ref().is_some_and(|c| {
                c.pids()
                    .iter()
                    .any(|&p| proc::stat(p).is_some_and(|s| s.state != 'Z'))
            })
    }

    /// Signals every process of the job: our descendants (we are their subreaper, so this
    /// includes setsid and double-fork escapees) and whatever sits in the job's cgroup.
    fn signal_all(&self, sig: Signal) {
        for round in 0..3 {
            let procs: Vec<proc::Stat> = proc::descendants(self.me)
                .into_iter()
                .filter(|p| p.state != 'Z')
                .collect();
            for p in &procs {
                proc::signal_verified(p.pid, p.start, sig);
                if sig == Signal::SIGTERM {
                    // A stopped process cannot act on TERM until continued.
                    proc::signal_verified(p.pid, p.start, Signal::SIGCONT);
                }
            }
            if let Some(cg) = &self.cgroup {
                if sig == Signal::SIGKILL {
                    cg.kill_all();
                } else {
                    for pid in cg.pids() {
                        // Pin the process first, then check it still is in the job's
                        // cgroup: a pid read from cgroup.procs may have been reused.
                        let Some(st) = proc::stat(pid) else { continue };
                        let Some(fd) = proc::Pidfd::open(pid, st.start) else {
                            continue;
                        };
                        if cg.holds(pid) {
                            fd.signal(sig);
                            fd.signal(Signal::SIGCONT);
                        }
                    }
                }
            }
            // KILL is repeated so a process forked while we were signalling is caught too.
            if sig != Signal::SIGKILL || procs.is_empty() || round == 2 {
                break;
            }
        }
    }

    fn finish(&mut self, shell: Option<WaitStatus>, end: End) {
        let dir = self.store.job_dir(&self.id);
        // output.log is not fsynced: a crash of any process loses nothing (the page cache
        // has it), and a flush of a large log at every job's end would dominate the cost of
        // capture. The record, which says how the job ended, is durable.
        let (written, dropped, write_error) = match &self.sink {
            Sink::Inline(st) => (st.written, st.dropped, st.write_error.clone()),
            // The writer thread died: what it stored is on disk, the rest is unknown.
            _ => (
                fs::metadata(dir.join(crate::state::layout::OUTPUT))
                    .map(|m| m.len())
                    .unwrap_or(0),
                1,
                Some("the output writer failed; later output was not stored".to_string()),
            ),
        };
        let _ = fs::remove_file(dir.join(crate::state::layout::SECRETS));
        let _ = fs::remove_file(dir.join(crate::state::layout::STDIN));
        let _ = fs::remove_file(dir.join(crate::state::layout::SPEC));
        let (code, signal) = match shell {
            Some(WaitStatus::Exited(_, c)) => (Some(c), None),
            Some(WaitStatus::Signaled(_, s, _)) => (None, Some(s.as_str().to_string())),
            _ => (None, None),
        };
        let rec = &mut self.rec;
        rec.exit_code = code;
        rec.signal = signal;
        rec.status = match end {
            End::Cancel => Status::Cancelled,
            End::Timeout | End::Idle => Status::TimedOut,
            End::Stopped(_) => Status::Cancelled,
            End::ShellExited if code == Some(0) => Status::Succeeded,
            End::ShellExited => Status::Failed,
        };
        let mut reasons: Vec<String> = Vec::new();
        match end {
            End::Timeout => {
                reasons.push(format!("timed out after {} s", self.spec.timeout_seconds))
            }
            End::Idle => reasons.push(format!(
                "no output for {} s (idle timeout)",
                self.spec.idle_timeout_seconds.unwrap_or_default()
            )),
            End::Cancel => reasons.push("cancelled".into()),
            End::Stopped(s) => {
                reasons.push(format!("the supervisor received {}", proc::signal_name(s)))
            }
            End::ShellExited => {}
        }
        if dropped > 0 {
            rec.output_truncated = true;
            rec.output_dropped_bytes = dropped;
            reasons.push(match &write_error {
                Some(e) => e.clone(),
                None => format!("output cap of {} bytes reached", self.spec.max_output_bytes),
            });
        }
        rec.reason = (!reasons.is_empty()).then(|| reasons.join("; "));
        rec.output_bytes = written;
        rec.ended_at = Some(crate::text::timefmt::now());
        // Before the final record: whoever sees the job ended must not then be refused a
        // new start because this one still counts as running.
        let _ = fs::remove_file(self.store.root().join("running").join(self.id.as_str()));
        // The reserve gives the final record room on a full disk; retry a few times.
        let _ = fs::remove_file(dir.join(RESERVE));
        for attempt in 0..5 {
            if self.store.write_record(rec).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50 << attempt));
        }
        self.sink.set_events(None);
        // Removing a cgroup can take milliseconds: only after the record is out.
        if let Some(cg) = &self.cgroup {
            cg.remove_when_empty(Duration::from_millis(500));
        }
    }
}

/// Where sanitized output goes: `output.log`, within the cap, surviving a full disk, with a
/// byte on the launcher's change channel per stored chunk.
struct Output {
    out: File,
    cap: u64,
    written: u64,
    dropped: u64,
    write_error: Option<String>,
    events: Option<File>,
}

impl Output {
    /// Appends sanitized output, honouring the cap and surviving a full disk.
    fn store(&mut self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        if self.write_error.is_some() {
            self.dropped += data.len() as u64;
            return;
        }
        let room = self.cap.saturating_sub(self.written);
        let mut take = data.len().min(room as usize);
        if take < data.len() {
            // Never store half a character.
            while take > 0 && data[take] & 0xC0 == 0x80 {
                take -= 1;
            }
        }
        if take > 0 {
            if let Err(e) = self.out.write_all(&data[..take]) {
                self.write_error = Some(format!("output could not be stored: {e}"));
                self.dropped += data.len() as u64;
                return;
            }
            self.written += take as u64;
            self.notify();
        }
        self.dropped += (data.len() - take) as u64;
    }

    /// Tells the launcher (if it still listens) that output arrived; never blocks.
    fn notify(&mut self) {
        if let Some(ev) = &mut self.events
            && let Err(e) = ev.write(b".")
            && e.kind() != io::ErrorKind::WouldBlock
        {
            self.events = None;
        }
    }
}

/// The size of one read from the job's pipe, and of the chunks handed to the writer.
const CHUNK: usize = 256 * 1024;

/// The output, written here or on a writer thread: a flood is read and sanitized while the
/// previous chunk is being written, instead of one after the other.
enum Sink {
    Inline(Output),
    Threaded {
        tx: std::sync::mpsc::SyncSender<Vec<u8>>,
        spare: std::sync::mpsc::Receiver<Vec<u8>>,
        handle: std::thread::JoinHandle<Output>,
    },
    /// Only while being converted, or if the writer thread died.
    Moved,
}

impl Sink {
    fn set_events(&mut self, ev: Option<File>) {
        if let Sink::Inline(o) = self {
            o.events = ev;
        }
    }

    /// Moves the writing to its own thread. Signals stay blocked there too (a thread
    /// inherits the mask), so they still arrive only through the signalfd.
    fn threaded(self) -> Sink {
        let Sink::Inline(output) = self else {
            return self;
        };
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(4);
        let (spare_tx, spare) = std::sync::mpsc::channel::<Vec<u8>>();
        let (otx, orx) = std::sync::mpsc::channel::<Output>();
        let spawned = std::thread::Builder::new()
            .name("output".into())
            .stack_size(64 << 10)
            .spawn(move || {
                let mut output = orx.recv().expect("the output is handed over at once");
                for mut chunk in rx {
                    output.store(&chunk);
                    chunk.clear();
                    let _ = spare_tx.send(chunk);
                }
                output
            });
        match spawned {
            Ok(handle) => match otx.send(output) {
                Ok(()) => Sink::Threaded { tx, spare, handle },
                Err(e) => Sink::Inline(e.0),
            },
            // No thread to be had: the closure (and the output it was to receive) is gone,
            // but the output itself was never moved into it.
            Err(_) => Sink::Inline(output),
        }
    }

    /// An empty buffer for the next chunk (recycled from the writer when it can be).
    fn buffer(&self) -> Vec<u8> {
        match self {
            Sink::Threaded { spare, .. } => spare
                .try_recv()
                .unwrap_or_else(|_| Vec::with_capacity(CHUNK)),
            _ => Vec::with_capacity(CHUNK),
        }
    }

    fn store(&mut self, chunk: Vec<u8>) {
        match self {
            Sink::Inline(o) => o.store(&chunk),
            Sink::Threaded { tx, .. } => {
                if !chunk.is_empty() {
                    let _ = tx.send(chunk);
                }
            }
            Sink::Moved => {}
        }
    }

    /// Waits for the writer to store everything sent, and takes the output back.
    fn joined(self) -> Sink {
        match self {
            Sink::Threaded { tx, handle, .. } => {
                drop(tx);
                handle.join().map(Sink::Inline).unwrap_or(Sink::Moved)
            }
            other => other,
        }
    }
}
