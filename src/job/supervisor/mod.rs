//! One job's life: the supervisor process (`gitterm-agent supervise <id>`).
//!
//! It is started by [`crate::job::launch`], detaches from whoever started it, becomes the
//! subreaper of everything the job starts, runs `/bin/sh -c COMMAND` in a new session, pumps
//! the output through the pipeline into `output.log`, enforces the timeouts, ends every
//! process the job left behind, and writes the final record. It holds the job's lock for
//! its whole life: a lock anyone else can take means the supervisor is gone.
//!
//! The start's steps are in `start`, the main loop in `run`, the end in `finish`.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

use nix::sys::signalfd::SignalFd;

use crate::job::handshake::{LOCK_FD, Ready, SPEC_FD};
use crate::model::spec::Spec;
use crate::model::{JobId, JobRecord, Status};
use crate::os::cgroup::JobCgroup;
use crate::state::layout::{FINAL_RECORD, RECORD};
use crate::state::store::Store;
use crate::text::pipeline::Pipeline;

mod control;
mod finish;
mod oom;
mod pending;
mod run;
mod session;
mod sink;
mod start;
mod stderr;

use sink::Sink;

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
    /// A reap found no child left: the job has no process outside its cgroup.
    childless: bool,
    /// A session's command: what its end saves.
    session: Option<session::SessionIo>,
    /// What tells of OOM kills (see `oom`).
    oom: oom::Watch,
    /// The job's stderr apart, for a job started with `separateStderr`.
    stderr: Option<stderr::Stderr>,
}
