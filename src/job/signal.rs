//! Sending a signal a caller asked for to a running job: to its process group, or to
//! every process of the job (its supervisor's descendants, setsid'd ones included, and
//! whatever sits in its cgroup). The request is put on record first, so the final record
//! can say that the signal came from a request.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::sys::signal::Signal;

use super::settle;
use crate::model::error::{Error, Result};
use crate::model::{JobId, JobRecord};
use crate::os::proc;
use crate::state::store::Store;

/// Which processes of the job get the signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The job's process group (the shell's): what a terminal's Ctrl-C reaches.
    Group,
    /// Every process of the job, wherever it moved to.
    All,
}

impl Target {
    /// The contract's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Target::Group => "group",
            Target::All => "all",
        }
    }
}

/// Sends `sig` to the job's `target` and returns its record (read after the signal). An
/// ended job is a conflict: there is nothing left to signal.
pub fn send(store: &Store, id: &JobId, sig: Signal, target: Target) -> Result<(JobRecord, usize)> {
    let rec = settle::settle_and_load(store, id)?;
    if rec.status.is_final() {
        return Err(ended(&rec));
    }
    let (Some(sup), Some(sup_start), Some(pgid)) =
        (rec.supervisor_pid, rec.supervisor_start, rec.pgid)
    else {
        return Err(Error::Conflict(format!(
            "job {id} is still starting: send the signal again in a moment"
        )));
    };
    // The supervisor must still be the one on record: only then are its descendants the
    // job's processes.
    if crate::os::pidfd::Pidfd::open(sup, sup_start).is_none() {
        let rec = settle::settle_and_load(store, id)?;
        return Err(ended(&rec));
    }
    record_request(&store.job_dir(id), sig, target)
        .map_err(|e| Error::io(format!("recording the signal request of job {id}"), e))?;
    let mut sent = 0;
    let mut seen: Vec<i32> = Vec::new();
    for p in proc::descendants(sup).iter().filter(|p| proc::alive(p)) {
        seen.push(p.pid);
        if (target == Target::All || p.pgrp == pgid)
            && crate::os::pidfd::signal_verified(p.pid, p.start, sig)
        {
            sent += 1;
        }
    }
    if target == Target::All
        && let Some(cg) = rec
            .cgroup
            .as_deref()
            .and_then(|p| crate::os::cgroup::JobCgroup::recorded(Path::new(p), id.as_str()))
    {
        for pid in cg.pids().into_iter().filter(|p| !seen.contains(p)) {
            // Pinned, then checked to be in the job's cgroup still: a pid read from
            // cgroup.procs may have been reused.
            let Some(st) = proc::stat(pid) else { continue };
            let Some(fd) = crate::os::pidfd::Pidfd::open(pid, st.start) else {
                continue;
            };
            if cg.holds(pid) && fd.signal(sig) {
                sent += 1;
            }
        }
    }
    Ok((settle::settle_and_load(store, id)?, sent))
}

fn ended(rec: &JobRecord) -> Error {
    Error::Conflict(format!(
        "job {} has ended ({}): a signal reaches only a running job",
        rec.id,
        rec.status.as_str()
    ))
}

/// Appends `SIGNAL TARGET` to the job's signal requests.
fn record_request(dir: &Path, sig: Signal, target: Target) -> std::io::Result<()> {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join(crate::state::layout::SIGNALS))?;
    f.write_all(format!("{} {}\n", sig.as_str(), target.as_str()).as_bytes())
}
