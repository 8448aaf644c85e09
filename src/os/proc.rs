//! Processes: the only module that talks to the kernel about pids, signals, sessions,
//! subreapers and cgroups.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::sys::signal::Signal;

/// Fills `buf` from the kernel's random source.
pub fn random_bytes(buf: &mut [u8]) -> io::Result<()> {
    getrandom::fill(buf).map_err(|e| io::Error::other(e.to_string()))
}

/// The fields of `/proc/<pid>/stat` the agent uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub pid: i32,
    pub state: char,
    pub ppid: i32,
    pub pgrp: i32,
    pub session: i32,
    /// Start time in clock ticks since boot: with the pid, identifies a process for good.
    pub start: u64,
}

/// Parses a `/proc/<pid>/stat` line (the command name may hold spaces and parentheses).
pub fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state); field N is rest[N - 3].
    Some(Stat {
        pid,
        state: rest.first()?.chars().next()?,
        ppid: rest.get(1)?.parse().ok()?,
        pgrp: rest.get(2)?.parse().ok()?,
        session: rest.get(3)?.parse().ok()?,
        start: rest.get(19)?.parse().ok()?,
    })
}

/// Reads one process's stat, or `None` if it is gone.
pub fn stat(pid: i32) -> Option<Stat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Every process visible in /proc.
pub fn all_processes() -> Vec<Stat> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let name = e.ok()?.file_name();
        let pid: i32 = name.to_str()?.parse().ok()?;
        stat(pid)
    })
    .collect()
}

/// The descendants of `root` (not `root` itself), parents before children.
///
/// Walks `/proc/<pid>/task/<tid>/children`, so the cost grows with the job's tree, not
/// with the whole machine (a thousand supervisors ending at once must not each read every
/// process); falls back to a full scan where the kernel lacks those files.
pub fn descendants(root: i32) -> Vec<Stat> {
    if !Path::new(&format!("/proc/{root}/task/{root}/children")).exists() {
        return descendants_in(root, &all_processes());
    }
    let mut out: Vec<Stat> = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        let Ok(tasks) = fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let Ok(list) = fs::read_to_string(t.path().join("children")) else {
                continue;
            };
            for child in list
                .split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok())
            {
                if child != root
                    && !out.iter().any(|o| o.pid == child)
                    && let Some(st) = stat(child)
                {
                    out.push(st);
                    frontier.push(child);
                }
            }
        }
    }
    out
}

/// [`descendants`] over a given process table (pure, for tests).
pub fn descendants_in(root: i32, table: &[Stat]) -> Vec<Stat> {
    let mut out: Vec<Stat> = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for s in table.iter().filter(|s| s.ppid == p && s.pid != root) {
            if !out.iter().any(|o| o.pid == s.pid) {
                out.push(*s);
                frontier.push(s.pid);
            }
        }
    }
    out
}

/// A handle on one process that can never signal a reused pid.
pub struct Pidfd(OwnedFd);

impl Pidfd {
    /// Opens a handle on `pid` if it still is the process that started at `start`.
    pub fn open(pid: i32, start: u64) -> Option<Pidfd> {
        if pid <= 1 {
            return None;
        }
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return None;
        }
        // SAFETY: the syscall returned a fresh fd that nothing else owns.
        let fd = Pidfd(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        // The pid could have been reused between the caller's look and the open: check the
        // start time after the open, when the fd pins the process.
        (stat(pid)?.start == start).then_some(fd)
    }

    /// Waits up to `timeout` for the process to exit (a pidfd turns readable then); true
    /// if it did.
    pub fn wait_exit(&self, timeout: std::time::Duration) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd;
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        let mut fds = [PollFd::new(self.0.as_fd(), PollFlags::POLLIN)];
        poll(
            &mut fds,
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
        )
        .is_ok_and(|n| n > 0)
    }

    /// Sends `sig`; false if the process is gone.
    pub fn signal(&self, sig: Signal) -> bool {
        // SAFETY: the fd is a valid pidfd we own; a null siginfo means "as kill(2)".
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                sig as i32,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        r == 0
    }
}

/// Signals a process only if it is still the one that started at `start`.
pub fn signal_verified(pid: i32, start: u64, sig: Signal) -> bool {
    Pidfd::open(pid, start).is_some_and(|p| p.signal(sig))
}

/// Makes this process the reaper of its orphaned descendants.
pub fn set_child_subreaper() -> io::Result<()> {
    nix::sys::prctl::set_child_subreaper(true)?;
    Ok(())
}

/// The signal's conventional name, e.g. "SIGKILL".
pub fn signal_name(sig: i32) -> String {
    Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("SIG{sig}"))
}

/// A cgroup v2 folder for one job: a fence that holds escaped processes and kills them all
/// at once. Used only where the hierarchy is writable; the subreaper works without it.
pub struct JobCgroup {
    path: PathBuf,
}

/// Where cgroup v2 is mounted, if anywhere.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_dev, dir, kind) = (f.next()?, f.next()?, f.next()?);
        (kind == "cgroup2").then(|| PathBuf::from(dir))
    })
}

impl JobCgroup {
    /// The cgroup path for a job id (it may not exist).
    pub fn path_for(job_id: &str) -> Option<PathBuf> {
        if std::env::var_os("GITTERM_NO_CGROUP").is_some() {
            return None;
        }
        let mount = cgroup2_mount()?;
        let own = fs::read_to_string("/proc/self/cgroup").ok()?;
        let rel = own
            .lines()
            .find_map(|l| l.strip_prefix("0::"))?
            .trim_start_matches('/');
        let base = if rel.is_empty() {
            mount
        } else {
            mount.join(rel)
        };
        Some(base.join("gitterm").join(job_id))
    }

    /// Creates the job's cgroup, or `None` where the hierarchy is not writable.
    pub fn create(job_id: &str) -> Option<JobCgroup> {
        let path = Self::path_for(job_id)?;
        fs::create_dir_all(&path).ok()?;
        path.join("cgroup.procs")
            .exists()
            .then_some(JobCgroup { path })
    }

    /// An existing job cgroup (for sweeping after a supervisor died).
    pub fn existing(job_id: &str) -> Option<JobCgroup> {
        let path = Self::path_for(job_id)?;
        path.join("cgroup.procs")
            .exists()
            .then_some(JobCgroup { path })
    }

    /// The file a child writes `0` into to join (opened before fork).
    pub fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    /// The pids in the cgroup.
    pub fn pids(&self) -> Vec<i32> {
        fs::read_to_string(self.procs_file())
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// True if `pid` is in this cgroup now.
    pub fn holds(&self, pid: i32) -> bool {
        let Ok(text) = fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            return false;
        };
        text.lines()
            .filter_map(|l| l.strip_prefix("0::"))
            .any(|rel| self.path.ends_with(rel.trim_start_matches('/')))
    }

    /// The cgroup at a path recorded in a job's record, if it still exists.
    pub fn at(path: &Path) -> Option<JobCgroup> {
        path.join("cgroup.procs").exists().then(|| JobCgroup {
            path: path.to_path_buf(),
        })
    }

    /// Kills every process in the cgroup at once.
    pub fn kill_all(&self) -> bool {
        fs::write(self.path.join("cgroup.kill"), "1").is_ok()
    }

    /// Removes the (empty) cgroup folder; harmless if processes remain.
    pub fn remove(&self) {
        let _ = fs::remove_dir(&self.path);
    }

    /// Waits (bounded) until the cgroup has no process left, then removes it.
    pub fn remove_when_empty(&self, within: std::time::Duration) {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            let events = fs::read_to_string(self.path.join("cgroup.events")).unwrap_or_default();
            if !events.lines().any(|l| l == "populated 1") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        self.remove();
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Ends every process of a job whose supervisor is gone: its cgroup, and every process
/// that carries the job's marker in its environment. Returns how many were signalled.
pub fn sweep_job(job_id: &str, recorded_cgroup: Option<&Path>) -> usize {
    let mut n = 0;
    // The supervisor's own cgroup path, as recorded, beats one derived from the reader's.
    let cg = recorded_cgroup
        .and_then(JobCgroup::at)
        .or_else(|| JobCgroup::existing(job_id));
    if let Some(cg) = cg {
        n += cg.pids().len();
        cg.kill_all();
        cg.remove_when_empty(std::time::Duration::from_secs(2));
    }
    let marker = format!("{}={job_id}", crate::model::spec::JOB_ENV_MARKER);
    for s in all_processes() {
        if s.pid <= 1 || s.pid == std::process::id() as i32 {
            continue;
        }
        let Ok(env) = fs::read(format!("/proc/{}/environ", s.pid)) else {
            continue;
        };
        if env.split(|&b| b == 0).any(|kv| kv == marker.as_bytes())
            && signal_verified(s.pid, s.start, Signal::SIGKILL)
        {
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parses_odd_command_names() {
        let line = "1234 (a (weird) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 98765 1000 10";
        let s = parse_stat(line).unwrap();
        assert_eq!(
            (s.pid, s.state, s.ppid, s.pgrp, s.session, s.start),
            (1234, 'S', 1, 1234, 1234, 98765)
        );
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn descendants_follow_the_tree() {
        let mk = |pid, ppid| Stat {
            pid,
            state: 'S',
            ppid,
            pgrp: pid,
            session: pid,
            start: 1,
        };
        let table = [mk(10, 1), mk(11, 10), mk(12, 11), mk(13, 1), mk(14, 12)];
        let mut d: Vec<i32> = descendants_in(10, &table).iter().map(|s| s.pid).collect();
        d.sort();
        assert_eq!(d, vec![11, 12, 14]);
    }

    #[test]
    fn pidfd_refuses_wrong_start_and_low_pids() {
        let me = std::process::id() as i32;
        let st = stat(me).unwrap();
        assert!(Pidfd::open(me, st.start).is_some());
        assert!(Pidfd::open(me, st.start + 1).is_none());
        assert!(Pidfd::open(1, 0).is_none());
        assert!(Pidfd::open(0, 0).is_none());
    }
}
