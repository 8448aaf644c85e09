//! One job's life: the supervisor process (`gitterm-agent supervise <id>`).
//!
//! It is started by [`crate::job::launch`], detaches from whoever started it, becomes the
//! subreaper of everything the job starts, runs `/bin/sh -c COMMAND` in a new session, pumps
//! the output through the pipeline into `output.log`, enforces the timeouts, ends every
//! process the job left behind, and writes the final record. It holds the job's lock for
//! its whole life: a lock anyone else can take means the supervisor is gone.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
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
use crate::state::store::Store;
use crate::text::pipeline::Pipeline;

mod finish;
mod run;
mod sink;

use sink::{Output, Sink};

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
    let [lock, spec] = match crate::os::spawn::adopt_inherited_fds([LOCK_FD, SPEC_FD]) {
        Ok(f) => f,
        Err(e) => return report_failure(&format!("lock and spec fds: {e}")),
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
        Ok(true) => {
            let _ = Ready::send_pid(&mut io::stdout().lock(), std::process::id());
        }
        Err(e) => return report_failure(&format!("fork: {e}")),
    }
    let code = match Supervisor::start(&store, &id, spec) {
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
            fail_record(&store, &id, &msg);
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

/// Records a job that could not be started at all.
fn fail_record(store: &Store, id: &JobId, msg: &str) {
    if let Ok(mut rec) = store.read_raw(id) {
        let _ = fs::remove_file(store.job_dir(id).join(RESERVE));
        if let Some(cg) = JobCgroup::existing(id.as_str()) {
            cg.remove();
        }
        rec.status = Status::Failed;
        rec.reason = Some(format!("the agent could not start the job: {msg}"));
        rec.ended_at = Some(crate::text::timefmt::now());
        if store.write_record(&rec).is_ok() {
            crate::state::events::record(store.root(), crate::state::events::ENDED, &rec);
        }
        let _ = fs::remove_file(store.running_marker(id));
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
    fn start(store: &Store, id: &JobId, mut spec_file: File) -> Result<Supervisor, String> {
        let dir = store.job_dir(id);
        let rec = store.read_raw(id).map_err(|e| e.to_string())?;
        let mut raw = Vec::new();
        io::Read::read_to_end(&mut spec_file, &mut raw).map_err(|e| format!("spec: {e}"))?;
        drop(spec_file);
        let spec: Spec = serde_json::from_slice(&raw).map_err(|e| format!("spec: {e}"))?;
        let secrets = if spec.secrets.is_empty() {
            Vec::new()
        } else {
            crate::model::secret::parse(&spec.secrets).map_err(|e| format!("secrets: {e}"))?
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
            .and_then(|mut f| {
                // Blocks taken now (no data written); zeros where the filesystem cannot.
                use nix::fcntl::{FallocateFlags, fallocate};
                match fallocate(&f, FallocateFlags::empty(), 0, RESERVE_BYTES as i64) {
                    Ok(()) => Ok(()),
                    Err(_) => f.write_all(&[0u8; RESERVE_BYTES]),
                }
            });

        let stdin: OwnedFd = if spec.has_stdin {
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
        let (reader, writer) = io::pipe().map_err(|e| format!("pipe: {e}"))?;
        // Non-blocking, so the last drain cannot hang on a writer outside the job's tree.
        crate::os::spawn::tune_pipe_reader(&reader).map_err(|e| format!("pipe: {e}"))?;
        let cgroup = JobCgroup::create(id.as_str());
        let cg_dir = cgroup.as_ref().and_then(|c| {
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_CLOEXEC | libc::O_DIRECTORY)
                .open(c.path())
                .ok()
        });
        let me = std::process::id() as i32;

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
        let stdout: OwnedFd = writer.try_clone().map_err(|e| format!("pipe: {e}"))?.into();
        let shell = crate::os::spawn::spawn_job(crate::os::spawn::JobStart {
            argv: vec![
                c(b"/bin/sh".to_vec(), "the shell")?,
                c(b"-c".to_vec(), "the shell")?,
                c(spec.command.clone().into_bytes(), "the command")?,
            ],
            envp,
            cwd: c(spec.cwd.clone().into_bytes(), "cwd")?,
            stdin,
            stdout,
            stderr: writer.into(),
            cgroup: cg_dir.map(OwnedFd::from),
            creds: spec.user.as_ref().map(|u| crate::os::spawn::Credentials {
                uid: u.uid,
                gid: u.gid,
                groups: u.groups.clone(),
            }),
        })
        .map_err(|e| e.to_string())?;
        let _ = me;
        let mut rec = rec;
        rec.pid = Some(shell);
        rec.pgid = Some(shell);
        rec.started_at = Some(crate::text::timefmt::now());
        rec.supervisor_pid = Some(me);
        rec.supervisor_start = proc::stat(me).map(|s| s.start);
        rec.cgroup = cgroup
            .as_ref()
            .map(|c| c.path().to_string_lossy().into_owned());
        // Not fsynced (see the launcher): the final record is.
        if let Err(e) = store.replace_record(&rec) {
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
                spare: Vec::new(),
            }),
            pipeline,
        })
    }
}
