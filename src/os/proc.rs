//! Processes as `/proc` shows them: stat lines, trees, liveness, names and lock holders.
//! Signals that must not reach a reused pid are [`super::pidfd`]'s; ending a lost job's
//! processes is [`super::sweep`]'s.

use std::fs;
use std::io;
use std::path::Path;

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
    parse_stat(&read_kernel_file(format!("/proc/{pid}/stat")).ok()?)
}

/// This process's start time (as [`Stat::start`]), read once per process: a spare
/// supervisor reads it while it waits, so a start does not. Kept with the pid it was read
/// in, so a fork never answers with its parent's.
pub fn own_start() -> Option<u64> {
    static OWN: std::sync::Mutex<Option<(u32, u64)>> = std::sync::Mutex::new(None);
    let me = std::process::id();
    let mut own = OWN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((pid, start)) = *own
        && pid == me
    {
        return Some(start);
    }
    let start = stat(me as i32)?.start;
    *own = Some((me, start));
    Some(start)
}

/// Reads a small file the kernel makes up as it is read (`/proc`, cgroupfs). They report
/// a size of 0, for which `fs::read_to_string` asks for the size and then reads in 32-byte
/// steps (six reads for one `stat` line); a page-sized buffer takes it in one read and the
/// end in another. The supervisor and every reader look at such files many times a job.
pub fn read_kernel_file(path: impl AsRef<Path>) -> io::Result<String> {
    use std::io::Read;
    // Plain reads: `File::read_to_string` would still ask for the size first.
    let mut f = fs::File::open(path)?;
    let mut buf = vec![0u8; 4096];
    let mut n = 0;
    loop {
        if n == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(n);
    String::from_utf8(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
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
            let Ok(list) = read_kernel_file(t.path().join("children")) else {
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

/// True while the process's thread group can still run: not a zombie, or a zombie leader
/// (it called `pthread_exit`) whose other threads live on. Only the thread count tells
/// the two zombies apart.
pub fn alive(s: &Stat) -> bool {
    s.state != 'Z' || threads(s.pid) > 1
}

/// The number of threads in `pid`'s thread group (0 when it is gone). The kernel counts
/// them into the link count of `/proc/<pid>/task` (two plus one per thread): one stat,
/// where `status` would be formatted whole, fifty lines of it, on every CLI start.
pub fn threads(pid: i32) -> usize {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/task"))
        .map(|m| m.nlink().saturating_sub(2) as usize)
        .unwrap_or(0)
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

/// `PID NAME` for a process (its `comm`, which it chooses: control characters dropped).
pub fn describe_pid(pid: i32) -> String {
    let comm = read_kernel_file(format!("/proc/{pid}/comm")).unwrap_or_default();
    let comm: String = comm
        .trim_end()
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    if comm.is_empty() {
        pid.to_string()
    } else {
        format!("{pid} {comm}")
    }
}

/// The processes that hold an flock on the file or folder at `path`, as `/proc/locks`
/// names them (the pid that took each lock), live ones only.
pub fn flock_holders(path: &Path) -> Vec<i32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(md) = fs::metadata(path) else {
        return Vec::new();
    };
    let (major, minor) = (libc::major(md.dev()) as u64, libc::minor(md.dev()) as u64);
    let Ok(locks) = read_kernel_file("/proc/locks") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in locks.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // `1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF`; a waiter's line has `->`.
        if f.get(1) != Some(&"FLOCK") {
            continue;
        }
        let (Some(pid), Some(id)) = (f.get(4).and_then(|p| p.parse::<i32>().ok()), f.get(5)) else {
            continue;
        };
        let mut parts = id.split(':');
        let dev = |p: Option<&str>| p.and_then(|x| u64::from_str_radix(x, 16).ok());
        let (ma, mi, ino) = (
            dev(parts.next()),
            dev(parts.next()),
            parts.next().and_then(|x| x.parse::<u64>().ok()),
        );
        if (ma, mi, ino) == (Some(major), Some(minor), Some(md.ino()))
            && pid > 0
            && stat(pid).is_some_and(|s| alive(&s))
            && !out.contains(&pid)
        {
            out.push(pid);
        }
    }
    out
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
    fn threads_counts_the_thread_group_as_status_does() {
        let me = std::process::id() as i32;
        let from_status = || {
            read_kernel_file(format!("/proc/{me}/status"))
                .ok()
                .and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("Threads:"))
                        .and_then(|n| n.trim().parse::<usize>().ok())
                })
                .unwrap()
        };
        // Other tests start and end threads meanwhile: compare under a thread held open.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let held = std::thread::spawn(move || rx.recv());
        let (a, b) = (threads(me), from_status());
        assert!(a >= 2 && b >= 2, "{a} {b}");
        drop(tx);
        held.join().unwrap().unwrap_err();
        assert_eq!(threads(i32::MAX), 0);
        let mut one = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert_eq!(threads(one.id() as i32), 1);
        one.kill().unwrap();
        one.wait().unwrap();
    }
}

/// Where `execvp` would find `prog` on `path` (a `:` list): a name with a `/` is used as
/// it is, else the first regular file of that name with an execute bit in a listed
/// folder. Empty entries are skipped.
pub fn find_program(prog: &str, path: &str) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    if prog.is_empty() {
        return None;
    }
    if prog.contains('/') {
        return Some(prog.to_string());
    }
    path.split(':').filter(|d| !d.is_empty()).find_map(|d| {
        let p = Path::new(d).join(prog);
        let md = fs::metadata(&p).ok()?;
        (md.is_file() && md.permissions().mode() & 0o111 != 0)
            .then(|| p.to_string_lossy().into_owned())
    })
}

/// The `comm` of a process (control characters dropped), `None` when it is gone.
pub fn comm(pid: i32) -> Option<String> {
    let c = read_kernel_file(format!("/proc/{pid}/comm")).ok()?;
    Some(c.trim_end().chars().filter(|c| !c.is_control()).collect())
}

#[cfg(test)]
mod program_tests {
    use super::*;

    #[test]
    fn programs_are_found_as_execvp_does() {
        assert_eq!(
            find_program("sh", "/nonexistent::/bin").as_deref(),
            Some("/bin/sh")
        );
        assert_eq!(find_program("./x", "").as_deref(), Some("./x"));
        assert_eq!(find_program("no-such-program-here", "/bin:/usr/bin"), None);
    }
}
