//! Ending every process of a job whose supervisor is gone.

use std::fs;
use std::path::Path;

use nix::sys::signal::Signal;

use super::cgroup::JobCgroup;
use super::pidfd::signal_verified;
use super::proc::{alive, all_processes, describe_pid};

/// What a sweep of a job whose supervisor is gone did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Whether the job's cgroup was found (it holds every process that did not leave it).
    pub had_cgroup: bool,
    /// Processes signalled.
    pub ended: usize,
    /// The first of those, as `PID NAME` (the name with its control characters dropped).
    pub named: Vec<String>,
    /// Processes found but still alive after the sweep (not ours to signal, say).
    pub survivors: usize,
}

/// How many ended processes a sweep names.
const NAMED: usize = 8;

/// Ends every process of a job whose supervisor is gone: its cgroup (only one named for
/// the job under our own subtree), and every process that carries the job's marker in its
/// environment. A process that both left the cgroup and cleared its marker cannot be
/// found; the report says what was done so that a record never claims more.
pub fn sweep_job(job_id: &str, recorded_cgroup: Option<&Path>) -> Sweep {
    sweep_job_with(job_id, recorded_cgroup, &[])
}

/// [`sweep_job`] with the job's cgroup v1 folders as its record names them (removed
/// with the rest; ones that are not the job's are ignored).
pub fn sweep_job_with(job_id: &str, recorded_cgroup: Option<&Path>, v1: &[String]) -> Sweep {
    let mut report = Sweep::default();
    // The supervisor's own cgroup path, as recorded, beats one derived from the reader's.
    let cg = recorded_cgroup
        .and_then(|p| JobCgroup::recorded(p, job_id))
        .or_else(|| JobCgroup::existing(job_id))
        .map(|c| c.with_v1(v1, job_id));
    let mut in_cgroup = Vec::new();
    if let Some(cg) = &cg {
        report.had_cgroup = true;
        let pids = cg.pids();
        report.ended += pids.len();
        report
            .named
            .extend(pids.iter().take(NAMED).map(|&p| describe_pid(p)));
        cg.kill_all();
        in_cgroup = pids;
    }
    let marked = || {
        let marker = format!("{}={job_id}", crate::model::spec::JOB_ENV_MARKER);
        all_processes().into_iter().filter(move |s| {
            s.pid > 1
                && s.pid != std::process::id() as i32
                && fs::read(format!("/proc/{}/environ", s.pid))
                    .is_ok_and(|env| env.split(|&b| b == 0).any(|kv| kv == marker.as_bytes()))
        })
    };
    for s in marked() {
        let name = describe_pid(s.pid);
        // One in the cgroup too was counted with it (and may still be dying).
        if signal_verified(s.pid, s.start, Signal::SIGKILL) && !in_cgroup.contains(&s.pid) {
            report.ended += 1;
            if report.named.len() < NAMED && !report.named.contains(&name) {
                report.named.push(name);
            }
        }
    }
    if let Some(cg) = &cg {
        cg.remove_when_empty(std::time::Duration::from_secs(2));
        report.survivors += cg.pids().len();
    }
    // KILL is not instant: give the marked ones a moment before counting survivors.
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    let mut left = marked().filter(alive).count();
    while left > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
        left = marked().filter(alive).count();
    }
    report.survivors += left;
    report
}
