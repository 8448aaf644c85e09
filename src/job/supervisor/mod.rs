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

use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

use crate::job::handshake::{LOCK_FD, Ready};
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
        Ok(true) => {
            let _ = Ready::send_pid(&mut io::stdout().lock(), std::process::id());
        }
        Err(e) => return report_failure(&format!("fork: {e}")),
    }
    let code = match Supervisor::start(&store, &id) {
        Ok(mut s) => {
            let _ = Ready::Ok.send(&mut io::stdout().lock());
            s.sink.set_events(crate::job::handshake::events_out());
            detach_stdio();
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
            // The launcher's memory file, on our own stdin until we detach.
            let f = File::from(
                io::stdin()
                    .as_fd()
                    .try_clone_to_owned()
                    .map_err(|e| format!("stdin: {e}"))?,
            );
            Stdio::from(f)
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
        cmd.arg("-c").arg(&spec.command).current_dir(&spec.cwd);
        let creds = match &spec.user {
            Some(u) => {
                // A login's variables; the job's own env wins.
                cmd.env("HOME", &u.home)
                    .env("USER", &u.name)
                    .env("LOGNAME", &u.name)
                    .env("SHELL", &u.shell);
                Some(crate::os::spawn::Credentials {
                    uid: u.uid,
                    gid: u.gid,
                    groups: u.groups.clone(),
                    cwd: std::ffi::CString::new(spec.cwd.as_str())
                        .map_err(|_| "cwd holds a NUL byte".to_string())?,
                })
            }
            None => None,
        };
        cmd.envs(&spec.env)
            .env(JOB_ENV_MARKER, id.as_str())
            .stdin(stdin)
            .stdout(writer.try_clone().map_err(|e| format!("pipe: {e}"))?)
            .stderr(writer);
        for s in &secrets {
            cmd.env(&s.name, s.value.expose());
        }
        crate::os::spawn::as_job(&mut cmd, me, cg_fd, creds);
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
}
