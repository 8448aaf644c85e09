//! The supervisor's start, as named steps in the order they must run: read the spec, block
//! the signals, open the output and the job's stdio, build the environment, spawn the
//! shell, publish the first record. The order is the crash-safety story: the other jobs'
//! secrets are read and this job's published before its shell can run, and the folder is
//! put in place only once its record names the shell.

use std::collections::BTreeMap;
use std::ffi::{CString, OsString};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

use crate::model::secret::SecretVar;
use crate::model::spec::{JOB_ENV_MARKER, PtySize, Spec};
use crate::model::{JobId, JobRecord};
use crate::os::cgroup::JobCgroup;
use crate::os::proc;
use crate::os::spawn::Started;
use crate::state::store::Store;
use crate::text::pipeline::Pipeline;

use super::sink::{Output, Sink};
use super::{RESERVE_EXTRA, Supervisor, control, pending};

/// The job's stdin, stdout and stderr, chosen once from the spec (as conmon-rs's
/// `ContainerIOType`); [`Stdio::open`] makes the descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stdio {
    /// No input: stdin is /dev/null, the output a pipe.
    Null,
    /// The request's stdin text: the launcher's memory file, on our own stdin until we
    /// detach; the output a pipe.
    Text,
    /// An interactive job: stdin is a pipe whose writing end we keep; the output a pipe.
    Pipe,
    /// A terminal job: its stdin, stdout and stderr are the terminal; we keep the master.
    Terminal(PtySize),
}

/// What [`Stdio::open`] made.
struct JobIo {
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    /// Where the job's output is read: the terminal's master or the pipe's reading end.
    output: OwnedFd,
    /// The job's input, for its control socket: the master or the stdin pipe's writing
    /// end (none for a job that takes no input while it runs).
    input: Option<OwnedFd>,
    /// Where the job's stderr is read when it is kept apart.
    err_output: Option<OwnedFd>,
}

impl Stdio {
    /// The spec's choice: a terminal implies input, input or not decides stdin's kind.
    fn of(spec: &Spec) -> Stdio {
        match spec.pty {
            Some(size) => Stdio::Terminal(size),
            None if spec.interactive => Stdio::Pipe,
            None if spec.has_stdin => Stdio::Text,
            None => Stdio::Null,
        }
    }

    /// The terminal's size, for the control socket (which resizes it).
    fn terminal_size(self) -> Option<(u16, u16)> {
        match self {
            Stdio::Terminal(size) => Some((size.cols, size.rows)),
            _ => None,
        }
    }

    /// Makes the descriptors, in the order the start always made them; `separate`: stderr
    /// gets a pipe of its own.
    fn open(self, separate: bool) -> Result<JobIo, String> {
        let (stdin, input): (OwnedFd, Option<OwnedFd>) = match self {
            Stdio::Terminal(size) => return open_terminal(size),
            Stdio::Pipe => {
                let (r, w) = io::pipe().map_err(|e| format!("stdin pipe: {e}"))?;
                (r.into(), Some(w.into()))
            }
            Stdio::Text => (
                io::stdin()
                    .as_fd()
                    .try_clone_to_owned()
                    .map_err(|e| format!("stdin: {e}"))?,
                None,
            ),
            Stdio::Null => (
                File::open("/dev/null")
                    .map_err(|e| format!("/dev/null: {e}"))?
                    .into(),
                None,
            ),
        };
        let (reader, writer) = io::pipe().map_err(|e| format!("pipe: {e}"))?;
        // Non-blocking, so the last drain cannot hang on a writer outside the job's tree.
        crate::os::spawn::tune_pipe_reader(&reader).map_err(|e| format!("pipe: {e}"))?;
        let stdout: OwnedFd = writer.try_clone().map_err(|e| format!("pipe: {e}"))?.into();
        let (stderr, err_output): (OwnedFd, Option<OwnedFd>) = if separate {
            let (r, w) = io::pipe().map_err(|e| format!("stderr pipe: {e}"))?;
            crate::os::spawn::tune_pipe_reader(&r).map_err(|e| format!("stderr pipe: {e}"))?;
            drop(writer);
            (w.into(), Some(r.into()))
        } else {
            (writer.into(), None)
        };
        Ok(JobIo {
            stdin,
            stdout,
            stderr,
            output: reader.into(),
            input,
            err_output,
        })
    }
}

/// A terminal job's stdio: the new terminal's slave three times, its master kept twice
/// (read for the output, written by the control socket).
fn open_terminal(size: PtySize) -> Result<JobIo, String> {
    let pty_err = |e: io::Error| format!("pty: {e}");
    let pair =
        crate::os::pty::open(size.cols, size.rows).map_err(|e| format!("pseudo-terminal: {e}"))?;
    crate::os::pty::seal_slave(&pair.slave).map_err(|e| format!("pseudo-terminal: {e}"))?;
    let input = pair.master.try_clone().map_err(pty_err)?;
    let stdin = pair.slave.try_clone().map_err(pty_err)?;
    let stdout = pair.slave.try_clone().map_err(pty_err)?;
    Ok(JobIo {
        stdin,
        stdout,
        stderr: pair.slave,
        output: pair.master,
        input: Some(input),
        err_output: None,
    })
}

impl Supervisor {
    /// Starts the shell in the job's staging folder and puts the folder in place once the
    /// record names the shell; `first` gets the record as soon as the spec is read, for
    /// [`super::fail_record`].
    pub(super) fn start(
        store: &Store,
        id: &JobId,
        spec_file: File,
        first: &mut Option<JobRecord>,
    ) -> Result<Supervisor, String> {
        let dir = store.staging_dir(id);
        let mut spec = read_spec(spec_file, id)?;
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

        let sigfd = block_signals()?;
        let out = open_output(&dir)?;
        let stdio = Stdio::of(&spec);
        let mut io = stdio.open(spec.separate_stderr)?;
        let stderr = match io.err_output.take() {
            Some(pipe) => Some(super::stderr::Stderr::open(
                &dir,
                pipe,
                &values,
                spec.max_output_bytes,
            )?),
            None => None,
        };
        let control = match io.input {
            Some(input) => Some(
                control::Control::bind(
                    &dir.join(crate::job::control::SOCKET),
                    input,
                    stdio.terminal_size(),
                    &values,
                )
                .map_err(|e| format!("control socket: {e}"))?,
            ),
            None => None,
        };
        let cgroup = JobCgroup::create_limited(id.as_str(), &spec.limits.unwrap_or_default())
            .map_err(|e| format!("limits: {e}"))?;
        let v1_procs = match &cgroup {
            Some(cg) => cg
                .v1_procs_files()
                .iter()
                .map(|p| {
                    OpenOptions::new()
                        .write(true)
                        .custom_flags(libc::O_CLOEXEC)
                        .open(p)
                        .map(OwnedFd::from)
                        .map_err(|e| format!("limits: {}: {e}", p.display()))
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => Vec::new(),
        };
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

        let envp = environment(&spec, id, &secrets, stdio)?;
        // A session's command: its shell's descriptors live only until it is started.
        let (session, session_fds) = super::session::prepare(&mut spec, &envp, &secrets)?.unzip();
        let started = spawn(
            &spec, envp, io.stdin, io.stdout, io.stderr, cg_dir, v1_procs, stdio,
        )?;
        drop(session_fds);

        let shell = started.pid;
        // Room for the final record: the first one's size (a long command makes it long)
        // and what the end adds. Without room it may still land: go on. Made while the
        // shell starts (a new file can cost a millisecond on ext4 without a journal, after
        // a mass deletion), and before the job has had time to fill the disk.
        let room = serde_json::to_vec_pretty(&rec).map_or(0, |v| v.len()) + RESERVE_EXTRA;
        let reserved = store.reserve_final(&dir, room.next_multiple_of(4096)).ok();
        let rec = publish_first_record(store, id, &dir, rec, shell, me, cgroup.as_ref(), first)?;
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
            pipe: Some(io.output),
            control,
            sink: Sink::Inline(Output::new(out, cap)),
            pipeline,
            pending: pending::PendingLine::new(&store.job_dir(id)),
            published,
            others,
            others_pending,
            reserved,
            childless: false,
            session,
            oom: super::oom::Watch::new(),
            stderr,
        })
    }
}

/// The spec the launcher wrote to our spec fd, checked to be this job's.
fn read_spec(mut spec_file: File, id: &JobId) -> Result<Spec, String> {
    let mut raw = Vec::new();
    io::Read::read_to_end(&mut spec_file, &mut raw).map_err(|e| format!("spec: {e}"))?;
    drop(spec_file);
    let spec: Spec = serde_json::from_slice(&raw).map_err(|e| format!("spec: {e}"))?;
    if spec.record.id != *id {
        return Err(format!("the spec is for job {}", spec.record.id));
    }
    Ok(spec)
}

/// Becomes the subreaper of what the job starts, and takes the signals the main loop
/// handles through a signalfd instead of handlers.
fn block_signals() -> Result<SignalFd, String> {
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
    SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(|e| format!("signalfd: {e}"))
}

/// The job's `output.log` in its staging folder, for appending.
fn open_output(dir: &Path) -> Result<File, String> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(dir.join(crate::state::layout::OUTPUT))
        .map_err(|e| format!("output.log: {e}"))
}

/// The shell's environment: ours, a login's variables for a job user, the job's own
/// (which win), the marker, the secrets.
fn environment(
    spec: &Spec,
    id: &JobId,
    secrets: &[SecretVar],
    stdio: Stdio,
) -> Result<Vec<CString>, String> {
    let mut env: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
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
    if let Stdio::Terminal(_) = stdio {
        env.insert("TERM".into(), "xterm-256color".into());
    }
    for (k, v) in &spec.env {
        env.insert(k.into(), v.into());
    }
    env.insert(JOB_ENV_MARKER.into(), id.as_str().into());
    for s in secrets {
        env.insert((&s.name).into(), s.value.expose().into());
    }
    env.into_iter()
        .map(|(k, v)| {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend(v.into_vec());
            c_string(kv, "the environment")
        })
        .collect()
}

fn c_string(b: Vec<u8>, what: &str) -> Result<CString, String> {
    CString::new(b).map_err(|_| format!("{what} holds a NUL byte"))
}

/// Starts `/bin/sh -c COMMAND` (or the spec's argv) in a new session, in the job's
/// cgroup, as its user, on its stdio. Returns as soon as the shell exists; its exec is
/// checked later ([`Started::exec_done`]), so the first record is written meanwhile.
#[allow(clippy::too_many_arguments)]
fn spawn(
    spec: &Spec,
    envp: Vec<CString>,
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    cgroup: Option<File>,
    v1_procs: Vec<OwnedFd>,
    stdio: Stdio,
) -> Result<Started, String> {
    let argv = match &spec.argv {
        Some(words) => program_argv(words, &envp)?,
        None => vec![
            c_string(super::session::program(spec).into(), "the shell")?,
            c_string(b"-c".to_vec(), "the shell")?,
            c_string(spec.command.clone().into_bytes(), "the command")?,
        ],
    };
    crate::os::spawn::start_job(crate::os::spawn::JobStart {
        argv,
        envp,
        cwd: c_string(spec.cwd.clone().into_bytes(), "cwd")?,
        stdin,
        stdout,
        stderr,
        cgroup: cgroup.map(OwnedFd::from),
        v1_procs,
        creds: spec.user.as_ref().map(|u| crate::os::spawn::Credentials {
            uid: u.uid,
            gid: u.gid,
            groups: u.groups.clone(),
        }),
        controlling_tty: matches!(stdio, Stdio::Terminal(_)),
    })
    .map_err(|e| e.to_string())
}

/// An argv job's words, the program found as `execvp` finds it: a name with a `/` as it
/// is, else the first executable file of that name on the job's `PATH` (the default path
/// when it has none). Looked up before the fork: the child may make no allocation.
fn program_argv(words: &[String], envp: &[CString]) -> Result<Vec<CString>, String> {
    let prog = words.first().ok_or("argv is empty")?;
    let path = envp
        .iter()
        .find_map(|kv| kv.to_bytes().strip_prefix(b"PATH="))
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".to_string());
    let found = crate::os::proc::find_program(prog, &path)
        .ok_or_else(|| format!("could not run {prog}: not found on PATH ({path})"))?;
    let mut argv = vec![c_string(found.into_bytes(), "argv")?];
    for w in &words[1..] {
        argv.push(c_string(w.clone().into_bytes(), "argv")?);
    }
    Ok(argv)
}

/// Writes the record naming the shell and its supervisor, and puts the staging folder in
/// place; on failure ends the job at once (nobody could cancel or see it) and leaves the
/// record in `first` for [`super::fail_record`].
#[allow(clippy::too_many_arguments)]
fn publish_first_record(
    store: &Store,
    id: &JobId,
    dir: &Path,
    mut rec: JobRecord,
    shell: i32,
    me: i32,
    cgroup: Option<&JobCgroup>,
    first: &mut Option<JobRecord>,
) -> Result<JobRecord, String> {
    rec.pid = Some(shell);
    rec.pgid = Some(shell);
    rec.started_at = Some(crate::text::timefmt::now());
    rec.supervisor_pid = Some(me);
    rec.supervisor_start = if me == std::process::id() as i32 {
        proc::own_start()
    } else {
        proc::stat(me).map(|s| s.start)
    };
    rec.cgroup = cgroup.map(|c| c.path().to_string_lossy().into_owned());
    rec.cgroups_v1 = cgroup.map(JobCgroup::v1_paths).unwrap_or_default();
    // Neither the record nor the folder's rename is fsynced: a crash of any process
    // loses nothing, and a start is not worth a disk flush on the caller's path. After
    // a kernel crash or power loss a job started in the last seconds may be missing,
    // or read as corrupt or lost; its final record is synced.
    if let Err(e) = store
        .write_first_record(dir, &rec)
        .and_then(|()| store.publish(id))
    {
        let _ = nix::sys::signal::killpg(Pid::from_raw(shell), Signal::SIGKILL);
        if let Some(cg) = cgroup {
            cg.kill_all();
        }
        let _ = waitpid(Pid::from_raw(shell), None);
        *first = Some(rec);
        return Err(format!("job.json: {e}"));
    }
    Ok(rec)
}
