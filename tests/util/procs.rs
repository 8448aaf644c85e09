//! Processes seen through /proc: states, job markers, signals, cgroups.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{PROMPT, eventually};

/// The environment variable every job process carries (see the supervisor).
pub const JOB_MARKER: &str = "GITTERM_JOB_ID";

/// A process found in /proc.
#[derive(Debug, Clone)]
pub struct ProcInfo {
    pub pid: i32,
    pub state: char,
    pub cmdline: String,
}

impl std::fmt::Display for ProcInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}) {}", self.pid, self.state, self.cmdline)
    }
}

/// Every live process but this one for which `matches(cmdline, environ)` holds, both as
/// NUL-separated bytes. A zombie leader whose other threads run on (it called
/// `pthread_exit`) is live: its command line and environment are read through one of
/// those threads, since the leader's own files are empty once it exited.
pub fn scan(mut matches: impl FnMut(&[u8], &[u8]) -> bool) -> Vec<ProcInfo> {
    let me = std::process::id() as i32;
    let mut found = Vec::new();
    let Ok(dir) = fs::read_dir("/proc") else {
        return found;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if pid <= 1 || pid == me {
            continue;
        }
        let (state, base) = match proc_state(pid) {
            None | Some('X') => continue,
            Some('Z') => match live_thread(pid) {
                Some(tid) => ('Z', format!("/proc/{pid}/task/{tid}")),
                None => continue,
            },
            Some(state) => (state, format!("/proc/{pid}")),
        };
        let cmdline = fs::read(format!("{base}/cmdline")).unwrap_or_default();
        let env = fs::read(format!("{base}/environ")).unwrap_or_default();
        if !matches(&cmdline, &env) {
            continue;
        }
        found.push(ProcInfo {
            pid,
            state,
            cmdline: String::from_utf8_lossy(&cmdline).replace('\0', " "),
        });
    }
    found
}

/// A thread of `pid`'s thread group that is not a zombie, if any.
pub fn live_thread(pid: i32) -> Option<i32> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
        .filter_map(|t| t.file_name().to_str()?.parse::<i32>().ok())
        .find(|tid| {
            let stat = fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"));
            stat.ok()
                .and_then(|t| {
                    let close = t.rfind(')')?;
                    t[close + 1..].trim_start().chars().next()
                })
                .is_some_and(|s| s != 'Z' && s != 'X')
        })
}

/// True while some thread of `pid` can still run: it is not a zombie, or it is a zombie
/// leader whose other threads live on. (`/proc/<pid>/stat` alone says `Z` for the latter.)
pub fn group_alive(pid: i32) -> bool {
    match proc_state(pid) {
        None | Some('X') => false,
        Some('Z') => live_thread(pid).is_some(),
        Some(_) => true,
    }
}

/// True when one of the NUL-separated entries of `list` contains `needle`.
pub fn any_entry_contains(list: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty()
        && list
            .split(|&b| b == 0)
            .any(|e| e.windows(needle.len()).any(|w| w == needle))
}

/// True when one of the NUL-separated entries of `environ` is exactly `kv`.
pub fn has_env_entry(environ: &[u8], kv: &[u8]) -> bool {
    environ.split(|&b| b == 0).any(|e| e == kv)
}

/// The `GITTERM_JOB_ID=<id>` entry of a job's processes.
pub fn marker(id: &str) -> Vec<u8> {
    format!("{JOB_MARKER}={id}").into_bytes()
}

/// Live processes carrying job `id`'s marker.
pub fn job_processes(id: &str) -> Vec<ProcInfo> {
    let m = marker(id);
    scan(|_, env| has_env_entry(env, &m))
}

/// SIGKILLs every process of job `id` (as a sandbox restore would find them: gone) and
/// waits until none is left.
pub fn kill_job_processes(id: &str) {
    eventually(PROMPT, &format!("the processes of {id} to die"), || {
        let left = job_processes(id);
        for p in &left {
            kill(p.pid, libc::SIGKILL);
        }
        left.is_empty().then_some(())
    });
}

/// Kills a job's supervisor (the record's `supervisorPid`) with SIGKILL and waits until it
/// is really gone: every thread of it, not just the leader (the supervisor has more than
/// one, and its files, the job's lock among them, close only with the last).
pub fn kill_supervisor(rec: &serde_json::Value) {
    let sup = rec["supervisorPid"]
        .as_i64()
        .unwrap_or_else(|| panic!("no supervisorPid in {rec:#}")) as i32;
    assert!(
        proc_state(sup).is_some_and(|s| s != 'Z'),
        "supervisor {sup} should be alive"
    );
    kill(sup, libc::SIGKILL);
    eventually(PROMPT, "the supervisor to die", || {
        (!group_alive(sup)).then_some(())
    });
}

/// The state letter of `/proc/<pid>/stat`, or `None` when the pid does not exist.
pub fn proc_state(pid: i32) -> Option<char> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let close = text.rfind(')')?;
    text[close + 1..].trim_start().chars().next()
}

/// True if a process exists and is not a zombie.
pub fn alive(pid: i64) -> bool {
    i32::try_from(pid).is_ok_and(|p| proc_state(p).is_some_and(|s| s != 'Z' && s != 'X'))
}

/// True when `pid` no longer is a live process of job `id`: it is gone, a zombie, or the
/// pid now belongs to some other process.
pub fn dead_or_not_of_job(pid: i32, id: &str) -> bool {
    match proc_state(pid) {
        None | Some('Z') | Some('X') => true,
        Some(_) => {
            let env = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            !has_env_entry(&env, &marker(id))
        }
    }
}

/// True while `pid` is a live (non-zombie) process of job `id`.
pub fn alive_in_job(pid: i32, id: &str) -> bool {
    !dead_or_not_of_job(pid, id)
}

/// Waits until every pid is dead (or reused by something else), at most `within`.
pub fn assert_dead(pids: &[i32], id: &str, within: Duration) {
    let what = format!("processes {pids:?} of job {id} to die");
    eventually(within, &what, || {
        pids.iter()
            .all(|&p| dead_or_not_of_job(p, id))
            .then_some(())
    });
}

/// Sends a signal.
pub fn kill(pid: i32, sig: i32) {
    // SAFETY: kill(2) takes plain integers and has no memory-safety preconditions.
    unsafe { libc::kill(pid, sig) };
}

/// True when the process has a handler installed for `sig` (SigCgt in /proc/pid/status).
pub fn catches(pid: i32, sig: i32) -> bool {
    let Ok(text) = fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    text.lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|m| m & (1 << (sig - 1)) != 0)
}

/// Where cgroup v2 is mounted, if it is.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_dev, dir, kind) = (f.next()?, f.next()?, f.next()?);
        (kind == "cgroup2").then(|| PathBuf::from(dir))
    })
}

/// The cgroup v2 folder this process is in, if cgroup v2 is mounted.
pub fn own_cgroup() -> Option<PathBuf> {
    let mount = cgroup2_mount()?;
    let own = fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))?
        .trim_start_matches('/')
        .to_string();
    Some(if rel.is_empty() {
        mount
    } else {
        mount.join(rel)
    })
}

/// The job's cgroup v2 folder as the agent would create it, if cgroup v2 is mounted.
pub fn job_cgroup(id: &str) -> Option<PathBuf> {
    Some(own_cgroup()?.join("gitterm").join(id))
}

/// The cgroup v2 path of a process (`/proc/<pid>/cgroup`'s `0::` line), as a folder
/// under the mount.
pub fn cgroup_of(pid: i32) -> Option<PathBuf> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(cgroup2_mount()?.join(rel.trim_start_matches('/')))
}

/// A cgroup of the test's own, beside the agent's `gitterm` folder: a place that is not a
/// job's, to move processes to. Dropping it kills what is in it and removes it.
pub struct ScratchCgroup {
    pub path: PathBuf,
}

impl ScratchCgroup {
    /// A new cgroup in this process's own, or `None` where cgroup v2 is not writable.
    pub fn create(tag: &str) -> Option<ScratchCgroup> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static SERIAL: AtomicUsize = AtomicUsize::new(0);
        let n = SERIAL.fetch_add(1, Ordering::Relaxed);
        let path = own_cgroup()?.join(format!("gitterm-test-{tag}-{}-{n}", std::process::id()));
        fs::create_dir(&path).ok()?;
        let cg = ScratchCgroup { path };
        cg.procs().exists().then_some(cg)
    }

    /// Its `cgroup.procs`.
    pub fn procs(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    /// The pids in it.
    pub fn pids(&self) -> Vec<i32> {
        fs::read_to_string(self.procs())
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }
}

impl Drop for ScratchCgroup {
    fn drop(&mut self) {
        let _ = fs::write(self.path.join("cgroup.kill"), "1");
        for _ in 0..200 {
            if fs::remove_dir(&self.path).is_ok() || !self.path.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Kills what is left in a job's cgroup and removes the folder (quietly).
pub fn remove_job_cgroup(id: &str) {
    let Some(cg) = job_cgroup(id).filter(|c| c.exists()) else {
        return;
    };
    let _ = fs::write(cg.join("cgroup.kill"), "1");
    for _ in 0..100 {
        if fs::remove_dir(&cg).is_ok() || !cg.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Mode bits (the low 9) of a path.
pub fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Writes a file with a mode.
pub fn write_mode(path: &Path, data: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    fs::write(path, data).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// The live children of `parent` named `comm` (the name a process gave itself with
/// `prctl`, as `ps` shows it).
pub fn children_named(parent: i32, comm: &str) -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
                return false;
            };
            let mut rest = stat[close + 1..].split_whitespace();
            let (state, ppid) = (rest.next(), rest.next().and_then(|p| p.parse::<i32>().ok()));
            &stat[open + 1..close] == comm && ppid == Some(parent) && state != Some("Z")
        })
        .collect()
}

/// How many connections wait in the accept queue of the TCP socket listening at `addr`
/// (`host:port`), from `/proc/net/tcp` and `tcp6` (a listening socket's `rx_queue`);
/// `None` if no socket listens on that port. `Some(0)`: the server took every connection
/// made so far.
pub fn accept_queue(addr: &str) -> Option<usize> {
    let port = addr.rsplit_once(':')?.1.parse::<u16>().ok()?;
    let port = format!("{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .find_map(|table| {
            let text = fs::read_to_string(table).ok()?;
            text.lines().skip(1).find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let local_port = f.get(1)?.rsplit_once(':')?.1;
                // State 0A is LISTEN; then rx_queue (after the colon in field 4) is the backlog.
                if local_port != port || *f.get(3)? != "0A" {
                    return None;
                }
                usize::from_str_radix(f.get(4)?.split_once(':')?.1, 16).ok()
            })
        })
}

/// The resident memory of process `pid` in bytes (`VmRSS` in `/proc/<pid>/status`), or 0
/// once it is gone.
pub fn rss_bytes(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// What the open file descriptors of process `pid` name (`/proc/<pid>/fd/*`, as the kernel
/// spells them: an unnamed `O_TMPFILE` file is `<folder>/#<inode> (deleted)`).
pub fn open_files(pid: u32) -> Vec<PathBuf> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| fs::read_link(e.path()).ok())
        .collect()
}
