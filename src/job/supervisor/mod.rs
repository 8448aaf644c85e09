//! One job's life: the supervisor process (`gitterm-agent supervise <id>`).
//!
//! It is started by [`crate::job::launch`], detaches from whoever started it, becomes the
//! subreaper of everything the job starts, runs `/bin/sh -c COMMAND` in a new session, pumps
//! the output through the pipeline into `output.log`, enforces the timeouts, ends every
//! process the job left behind, and writes the final record. It holds the job's lock for
//! its whole life: a lock anyone else can take means the supervisor is gone.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

use crate::job::handshake::{LOCK_FD, Ready, SPEC_FD};
use crate::model::spec::{JOB_ENV_MARKER, Spec};
use crate::model::{JobId, JobRecord, Status};
use crate::os::cgroup::JobCgroup;
use crate::os::proc;
use crate::state::layout::{FINAL_RECORD, RECORD};
use crate::state::store::Store;
use crate::text::pipeline::Pipeline;

mod control;
mod finish;
mod pending;
mod run;
mod sink;

use sink::{Output, Sink};

/// Room kept for what the final record adds to the first (see
/// [`crate::state::layout::FINAL_RECORD`]): the end's fields and a reason.
const RESERVE_EXTRA: usize = 2048;

/// Why the job is ending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    ShellExited,
    Timeout,
    Idle,
    Cancel,
    Stopped(i32),
}

/// Entry point of `gitterm-agent supervise <id>` (an exec'd supervisor, whose launcher
/// waits for it): detaches first. The exit status is the process's.
pub fn main(root: &Path, id: &str) -> i32 {
    run(root, id, true)
}

/// Entry point of a supervisor forked by the fork server (which has the kernel reap its
/// children) or by the CLI (which exits when its job does): no second fork to detach,
/// which would cost a process on every start's path.
pub fn main_forked(root: &Path, id: &str) -> i32 {
    run(root, id, false)
}

fn run(root: &Path, id: &str, detach: bool) -> i32 {
    let Some(id) = JobId::parse(id) else {
        eprintln!("supervise: malformed job id");
        return 2;
    };
    let [lock, spec] = match crate::os::spawn::adopt_inherited_fds([LOCK_FD, SPEC_FD]) {
        Ok(f) => f,
        Err(e) => return report_failure(&format!("lock and spec fds: {e}")),
    };
    // The launcher made the root; its path is absolute.
    let store = Store::at(root);
    // Detach: the launcher waits for this first process only until the fork, so it never
    // keeps a zombie supervisor. The daemon is reparented to the nearest subreaper (or
    // init).
    if detach {
        match crate::os::spawn::fork_detached() {
            Ok(false) => return 0,
            Ok(true) => {}
            Err(e) => return report_failure(&format!("fork: {e}")),
        }
    }
    let _ = Ready::send_pid(&mut io::stdout().lock(), std::process::id());
    let mut first: Option<JobRecord> = None;
    let code = match Supervisor::start(&store, &id, spec, &mut first) {
        Ok(mut s) => {
            let _ = Ready::Ok.send(&mut io::stdout().lock());
            s.sink.set_events(crate::job::handshake::events_out());
            detach_stdio();
            // After the pid record, and after the launcher has its answer.
            crate::state::events::record(store.root(), crate::state::events::STARTED, &s.rec);
            s.run();
            0
        }
        Err(msg) => {
            fail_record(&store, &id, first, &msg);
            report_failure(&msg)
        }
    };
    drop(lock);
    code
}

fn report_failure(msg: &str) -> i32 {
    let _ = Ready::Err(msg.to_string()).send(&mut io::stdout().lock());
    1
}

fn detach_stdio() {
    if let Ok(null) = OpenOptions::new().read(true).write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stdin(&null);
        let _ = nix::unistd::dup2_stdout(&null);
        let _ = nix::unistd::dup2_stderr(&null);
    }
}

/// Records a job that could not be started at all (when the spec named its record): in
/// its staging folder, which is then put in place so the caller and readers see why, or
/// in its folder if the record was already published.
fn fail_record(store: &Store, id: &JobId, rec: Option<JobRecord>, msg: &str) {
    let Some(mut rec) = rec else { return };
    if let Some(cg) = JobCgroup::existing(id.as_str()) {
        cg.remove();
    }
    rec.status = Status::Failed;
    rec.reason = Some(format!("the agent could not start the job: {msg}"));
    rec.ended_at = Some(crate::text::timefmt::now());
    let staging = store.staging_dir(id);
    let published = !staging.exists();
    let dir = if published {
        store.job_dir(id)
    } else {
        staging.clone()
    };
    let _ = fs::remove_file(dir.join(FINAL_RECORD));
    let _ = fs::remove_file(dir.join(crate::job::control::SOCKET));
    let _ = fs::remove_file(store.running_marker(id));
    let written = if published {
        store.write_record(&rec)
    } else {
        let _ = fs::remove_file(staging.join(RECORD));
        store
            .write_first_record(&staging, &rec)
            .and_then(|()| File::open(staging.join(RECORD))?.sync_all())
            .and_then(|()| store.publish(id))
    };
    if written.is_ok() {
        crate::state::events::record(store.root(), crate::state::events::ENDED, &rec);
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
    /// An interactive job's control socket and stdin.
    control: Option<control::Control>,
    sink: Sink,
    pipeline: Pipeline,
    /// The line being written, for answers (`pending`).
    pending: pending::PendingLine,
    /// This job's secrets, published for the other supervisors while it runs.
    published: Option<crate::state::livesecrets::Published>,
    /// The other running jobs' secrets, added to the pipeline as they appear.
    others: crate::state::livesecrets::Watcher,
    /// Other jobs' secret values read but not yet added (added before the next output).
    others_pending: Vec<String>,
    /// The final record's file, with its room (none where it could not be made).
    reserved: Option<crate::state::fsutil::Reserved>,
}

impl Supervisor {
    /// Starts the shell in the job's staging folder and puts the folder in place once the
    /// record names the shell; `first` gets the record as soon as the spec is read, for
    /// [`fail_record`].
    fn start(
        store: &Store,
        id: &JobId,
        mut spec_file: File,
        first: &mut Option<JobRecord>,
    ) -> Result<Supervisor, String> {
        let dir = store.staging_dir(id);
        let mut raw = Vec::new();
        io::Read::read_to_end(&mut spec_file, &mut raw).map_err(|e| format!("spec: {e}"))?;
        drop(spec_file);
        let spec: Spec = serde_json::from_slice(&raw).map_err(|e| format!("spec: {e}"))?;
        if spec.record.id != *id {
            return Err(format!("the spec is for job {}", spec.record.id));
        }
        *first = Some(spec.record.clone());
        let rec = spec.record.clone();
        let secrets = if spec.secrets.is_empty() {
            Vec::new()
        } else {
            crate::model::secret::parse(&spec.secrets).map_err(|e| format!("secrets: {e}"))?
        };
        // The other running jobs' secrets (see livesecrets): read before this job's shell
        // can read their environments, but masked from the first output on: building the
        // index for them is the costly part, and a job that prints nothing never pays it.
        let mut others = crate::state::livesecrets::Watcher::new(store.root(), id);
        let others_pending = others.poll();
        let values: Vec<&[u8]> = secrets
            .iter()
            .map(|s| s.value.expose().as_bytes())
            .collect();
        let pipeline = Pipeline::new(&values);

        // A job that closes its stdin must not kill us when we write to it.
        crate::os::spawn::ignore_sigpipe();
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

        // A terminal job's stdin, stdout and stderr are the terminal; an interactive one's
        // stdin is a pipe whose writing end we keep.
        let pty = match spec.pty {
            Some(size) => {
                let pair = crate::os::pty::open(size.cols, size.rows)
                    .map_err(|e| format!("pseudo-terminal: {e}"))?;
                crate::os::pty::seal_slave(&pair.slave)
                    .map_err(|e| format!("pseudo-terminal: {e}"))?;
                Some(pair)
            }
            None => None,
        };
        let mut keep_stdin: Option<OwnedFd> = None;
        let stdin: OwnedFd = if let Some(p) = &pty {
            keep_stdin = Some(p.master.try_clone().map_err(|e| format!("pty: {e}"))?);
            p.slave.try_clone().map_err(|e| format!("pty: {e}"))?
        } else if spec.interactive {
            let (r, w) = io::pipe().map_err(|e| format!("stdin pipe: {e}"))?;
            keep_stdin = Some(w.into());
            r.into()
        } else if spec.has_stdin {
            // The launcher's memory file, on our own stdin until we detach.
            io::stdin()
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| format!("stdin: {e}"))?
        } else {
            File::open("/dev/null")
                .map_err(|e| format!("/dev/null: {e}"))?
                .into()
        };
        let control = match keep_stdin {
            Some(w) => Some(
                control::Control::bind(
                    &dir.join(crate::job::control::SOCKET),
                    w,
                    spec.pty.map(|size| (size.cols, size.rows)),
                    &values,
                )
                .map_err(|e| format!("control socket: {e}"))?,
            ),
            None => None,
        };
        let (reader, out_fd, err_fd): (OwnedFd, OwnedFd, OwnedFd) = match pty {
            Some(p) => (
                p.master,
                p.slave.try_clone().map_err(|e| format!("pty: {e}"))?,
                p.slave,
            ),
            None => {
                let (reader, writer) = io::pipe().map_err(|e| format!("pipe: {e}"))?;
                // Non-blocking, so the last drain cannot hang on a writer outside the
                // job's tree.
                crate::os::spawn::tune_pipe_reader(&reader).map_err(|e| format!("pipe: {e}"))?;
                let stdout: OwnedFd = writer.try_clone().map_err(|e| format!("pipe: {e}"))?.into();
                (reader.into(), stdout, writer.into())
            }
        };
        let cgroup = JobCgroup::create(id.as_str());
        let cg_dir = cgroup.as_ref().and_then(|c| {
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_CLOEXEC | libc::O_DIRECTORY)
                .open(c.path())
                .ok()
        });
        let me = std::process::id() as i32;
        // Before the shell starts: once it runs, any job of its user can read its secrets
        // from /proc, and every other supervisor must be able to know them by then.
        let published = if secrets.is_empty() {
            None
        } else {
            Some(
                crate::state::livesecrets::publish(store.root(), id, &spec.secrets)
                    .map_err(|e| format!("publishing the secrets to the other jobs: {e}"))?,
            )
        };

        // The environment: ours, a login's variables for a job user, the job's own (which
        // win), the marker, the secrets.
        let mut env: BTreeMap<std::ffi::OsString, std::ffi::OsString> =
            std::env::vars_os().collect();
        if let Some(u) = &spec.user {
            for (k, v) in [
                ("HOME", &u.home),
                ("USER", &u.name),
                ("LOGNAME", &u.name),
                ("SHELL", &u.shell),
            ] {
                env.insert(k.into(), v.into());
            }
        }
        if spec.pty.is_some() {
            env.insert("TERM".into(), "xterm-256color".into());
        }
        for (k, v) in &spec.env {
            env.insert(k.into(), v.into());
        }
        env.insert(JOB_ENV_MARKER.into(), id.as_str().into());
        for s in &secrets {
            env.insert((&s.name).into(), s.value.expose().into());
        }
        let c = |b: Vec<u8>, what: &str| {
            std::ffi::CString::new(b).map_err(|_| format!("{what} holds a NUL byte"))
        };
        let envp = env
            .into_iter()
            .map(|(k, v)| {
                let mut kv = k.into_vec();
                kv.push(b'=');
                kv.extend(v.into_vec());
                c(kv, "the environment")
            })
            .collect::<Result<Vec<_>, _>>()?;
        let started = crate::os::spawn::start_job(crate::os::spawn::JobStart {
            argv: vec![
                c(b"/bin/sh".to_vec(), "the shell")?,
                c(b"-c".to_vec(), "the shell")?,
                c(spec.command.clone().into_bytes(), "the command")?,
            ],
            envp,
            cwd: c(spec.cwd.clone().into_bytes(), "cwd")?,
            stdin,
            stdout: out_fd,
            stderr: err_fd,
            cgroup: cg_dir.map(OwnedFd::from),
            creds: spec.user.as_ref().map(|u| crate::os::spawn::Credentials {
                uid: u.uid,
                gid: u.gid,
                groups: u.groups.clone(),
            }),
            controlling_tty: spec.pty.is_some(),
        })
        .map_err(|e| e.to_string())?;
        let shell = started.pid;
        // Room for the final record: the first one's size (a long command makes it long)
        // and what the end adds. Without room it may still land: go on. Made while the
        // shell starts (a new file can cost a millisecond on ext4 without a journal, after
        // a mass deletion), and before the job has had time to fill the disk.
        let room = serde_json::to_vec_pretty(&rec).map_or(0, |v| v.len()) + RESERVE_EXTRA;
        let reserved = crate::state::fsutil::reserve(
            &dir.join(FINAL_RECORD),
            room.next_multiple_of(4096),
            0o600,
        )
        .ok();
        let mut rec = rec;
        rec.pid = Some(shell);
        rec.pgid = Some(shell);
        rec.started_at = Some(crate::text::timefmt::now());
        rec.supervisor_pid = Some(me);
        rec.supervisor_start = proc::stat(me).map(|s| s.start);
        rec.cgroup = cgroup
            .as_ref()
            .map(|c| c.path().to_string_lossy().into_owned());
        // Neither the record nor the folder's rename is fsynced: a crash of any process
        // loses nothing, and a start is not worth a disk flush on the caller's path. After
        // a kernel crash or power loss a job started in the last seconds may be missing,
        // or read as corrupt or lost; its final record is synced.
        if let Err(e) = store
            .write_first_record(&dir, &rec)
            .and_then(|()| store.publish(id))
        {
            // Without a record nobody could cancel or see the job: end it at once.
            let _ = nix::sys::signal::killpg(Pid::from_raw(shell), Signal::SIGKILL);
            if let Some(cg) = &cgroup {
                cg.kill_all();
            }
            let _ = waitpid(Pid::from_raw(shell), None);
            *first = Some(rec);
            return Err(format!("job.json: {e}"));
        }
        let mut control = control;
        if let Some(c) = &mut control {
            c.moved_to(&store.job_dir(id));
        }
        // The record is written while the shell starts (on another core, when there is
        // one): whether its exec happened is known only now.
        *first = Some(rec.clone());
        started.exec_done().map_err(|e| e.to_string())?;
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
            pipe: Some(reader),
            control,
            sink: Sink::Inline(Output {
                out,
                cap,
                written: 0,
                dropped: 0,
                write_error: None,
                events: None,
                spare: Vec::new(),
            }),
            pipeline,
            pending: pending::PendingLine::new(&store.job_dir(id)),
            published,
            others,
            others_pending,
            reserved,
        })
    }
}
