//! The resource controllers a job's cgroups can use: where they are (cgroup v2 beside the
//! job's fence, or cgroup v1 hierarchies of their own on hybrid hosts), the files that
//! set limits, and the files that tell usage and OOM kills, with their formats.
//!
//! A process's place in each hierarchy is read from `/proc/self/cgroup` and mapped to a
//! folder through `/proc/self/mountinfo` (the mount's root is cut from the path, as runc
//! does), so the job's groups go below the agent's own in every hierarchy.

use std::fs;
use std::path::{Path, PathBuf};

use crate::model::resources::{CPU_PERIOD_US, Capabilities, Limits, Usage};

/// The v1 controllers a job may join, each in its own hierarchy (or a shared one).
pub const V1_CONTROLLERS: [&str; 3] = ["memory", "cpu", "pids"];
/// The v2 controllers enabled for job groups where they can be.
pub const V2_CONTROLLERS: [&str; 4] = ["memory", "cpu", "pids", "io"];

/// One line of `/proc/<pid>/cgroup`: hierarchy id, its controllers, the path in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub id: u32,
    pub controllers: Vec<String>,
    pub path: String,
}

/// Parses `/proc/<pid>/cgroup` (`ID:CONTROLLERS:PATH` lines; v2's is `0::PATH`).
pub fn parse_memberships(text: &str) -> Vec<Membership> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let id = it.next()?.parse().ok()?;
            let ctrls = it.next()?;
            let path = it.next()?.to_string();
            Some(Membership {
                id,
                controllers: ctrls
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_string)
                    .collect(),
                path,
            })
        })
        .collect()
}

/// A cgroup v1 mount from `/proc/self/mountinfo`: its folder, the hierarchy path it shows
/// (`/` unless a sub-tree was bind-mounted), and its controllers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V1Mount {
    pub dir: PathBuf,
    pub root: String,
    pub controllers: Vec<String>,
}

/// The cgroup v1 mounts a mountinfo table lists.
pub fn parse_v1_mounts(mountinfo: &str) -> Vec<V1Mount> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let f: Vec<&str> = left.split_whitespace().collect();
            let r: Vec<&str> = right.split_whitespace().collect();
            if r.first() != Some(&"cgroup") || f.len() < 5 {
                return None;
            }
            let supers = r.get(2).copied().unwrap_or("");
            Some(V1Mount {
                dir: PathBuf::from(unescape_mount(f[4])),
                root: unescape_mount(f[3]),
                controllers: supers
                    .split(',')
                    .filter(|o| V1_CONTROLLERS.contains(o) || *o == "cpuacct")
                    .map(str::to_string)
                    .collect(),
            })
        })
        .collect()
}

/// Mount paths escape space, tab, newline and backslash as octal.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The folder of `membership`'s path in `mount` (the mount's root cut off the path).
pub fn folder_in(mount: &V1Mount, path: &str) -> Option<PathBuf> {
    let rel = if mount.root == "/" {
        path
    } else {
        // A path outside the bind-mounted sub-tree has no folder here.
        let rest = path.strip_prefix(mount.root.as_str())?;
        if !(rest.is_empty() || rest.starts_with('/')) {
            return None;
        }
        rest
    };
    let rel = rel.trim_start_matches('/');
    Some(if rel.is_empty() {
        mount.dir.clone()
    } else {
        mount.dir.join(rel)
    })
}

/// Where each resource of a job is controlled, found once per process.
#[derive(Debug, Clone, Default)]
pub struct Hierarchies {
    /// The v2 controllers enabled for the folders below the v2 jobs folder.
    pub v2: Vec<String>,
    /// `<v1 mount>/<our path>/gitterm` for memory, cpu and pids, where usable.
    pub v1_memory: Option<PathBuf>,
    pub v1_cpu: Option<PathBuf>,
    pub v1_pids: Option<PathBuf>,
    /// Why a controller is not usable, per resource (for the 409's message).
    pub why_not: Vec<(&'static str, String)>,
}

impl Hierarchies {
    /// Looks every hierarchy up; `v2_base` is the v2 jobs folder (the fence's parent),
    /// where there is one. Creates the jobs folders and enables the v2 controllers there.
    pub fn discover(v2_base: Option<&Path>) -> Hierarchies {
        let mut h = Hierarchies::default();
        if let Some(base) = v2_base {
            h.v2 = enable_v2(base);
        }
        let own = super::proc::read_kernel_file("/proc/self/cgroup").unwrap_or_default();
        let info = super::proc::read_kernel_file("/proc/self/mountinfo").unwrap_or_default();
        let members = parse_memberships(&own);
        let mounts = parse_v1_mounts(&info);
        for ctrl in V1_CONTROLLERS {
            if h.v2.iter().any(|c| c == ctrl) {
                continue;
            }
            let found = v1_base(&members, &mounts, ctrl);
            match found {
                Ok(p) => match ctrl {
                    "memory" => h.v1_memory = Some(p),
                    "cpu" => h.v1_cpu = Some(p),
                    _ => h.v1_pids = Some(p),
                },
                Err(why) => h.why_not.push((ctrl, why)),
            }
        }
        h
    }

    /// Which limits can be enforced.
    pub fn capabilities(&self) -> Capabilities {
        let v2 = |c: &str| self.v2.iter().any(|x| x == c);
        Capabilities {
            memory: v2("memory") || self.v1_memory.is_some(),
            cpu: v2("cpu") || self.v1_cpu.is_some(),
            pids: v2("pids") || self.v1_pids.is_some(),
        }
    }

    /// Says which of `limits` cannot be enforced here, and why; `None` when all can.
    pub fn missing(&self, limits: &Limits) -> Option<String> {
        let caps = self.capabilities();
        let mut out = Vec::new();
        for (asked, can, field, ctrl) in [
            (
                limits.memory_bytes.is_some(),
                caps.memory,
                "memoryBytes",
                "memory",
            ),
            (limits.cpus.is_some(), caps.cpu, "cpus", "cpu"),
            (limits.pids.is_some(), caps.pids, "pids", "pids"),
        ] {
            if asked && !can {
                let why = self.why_not.iter().find(|(c, _)| *c == ctrl).map_or_else(
                    || format!("no {ctrl} controller is usable"),
                    |(_, w)| w.clone(),
                );
                out.push(format!("limits.{field} needs the {ctrl} controller: {why}"));
            }
        }
        (!out.is_empty()).then(|| {
            format!(
                "{}; GET /v1/sandbox lists the limits this sandbox can enforce",
                out.join("; ")
            )
        })
    }
}

/// `<mount>/<our path>/gitterm` for a v1 controller, created (as root) and checked to
/// hold the controller's files.
fn v1_base(members: &[Membership], mounts: &[V1Mount], ctrl: &str) -> Result<PathBuf, String> {
    let Some(mount) = mounts
        .iter()
        .find(|m| m.controllers.iter().any(|c| c == ctrl))
    else {
        return Err(format!(
            "neither cgroup v2 (with {ctrl} enabled) nor a cgroup v1 {ctrl} hierarchy is mounted"
        ));
    };
    let Some(own) = members
        .iter()
        .find(|m| m.id != 0 && m.controllers.iter().any(|c| c == ctrl))
    else {
        return Err(format!(
            "this process has no place in the {ctrl} hierarchy (/proc/self/cgroup)"
        ));
    };
    let Some(dir) = folder_in(mount, &own.path) else {
        return Err(format!(
            "this process's {ctrl} cgroup {} is outside the mounted {}",
            own.path,
            mount.dir.display()
        ));
    };
    let base = dir.join("gitterm");
    fs::create_dir_all(&base).map_err(|e| {
        format!(
            "{} cannot be created ({e}): the agent needs to run as root with the cgroup \
             hierarchy writable",
            base.display()
        )
    })?;
    let probe = match ctrl {
        "memory" => "memory.limit_in_bytes",
        "cpu" => "cpu.cfs_quota_us",
        _ => "pids.max",
    };
    if !base.join(probe).exists() {
        return Err(format!("{} has no {probe}", base.display()));
    }
    Ok(base)
}

/// Enables the v2 controllers for the folders below `base` where the parent offers them
/// (asking the parent to offer them first); returns those enabled.
fn enable_v2(base: &Path) -> Vec<String> {
    let _ = fs::create_dir_all(base);
    let offered = |p: &Path| -> Vec<String> {
        fs::read_to_string(p.join("cgroup.controllers"))
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let mut have = offered(base);
    if let Some(parent) = base.parent() {
        for c in V2_CONTROLLERS {
            if !have.iter().any(|h| h == c) && offered(parent).iter().any(|h| h == c) {
                // Fails (EBUSY) when the agent's own cgroup holds processes and is not the
                // root: then the controller was not delegated to us, and stays off.
                let _ = fs::write(parent.join("cgroup.subtree_control"), format!("+{c}"));
            }
        }
        have = offered(base);
    }
    for c in V2_CONTROLLERS {
        if have.iter().any(|h| h == c) {
            let _ = fs::write(base.join("cgroup.subtree_control"), format!("+{c}"));
        }
    }
    fs::read_to_string(base.join("cgroup.subtree_control"))
        .unwrap_or_default()
        .split_whitespace()
        .filter(|c| V2_CONTROLLERS.contains(c))
        .map(str::to_string)
        .collect()
}

/// Which kind of hierarchy a folder is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    V1,
    V2,
}

/// One file write that sets a limit: file name, value, and whether the job may run
/// without it (swap limits, where swap accounting is off, are not there to write).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitWrite {
    pub file: &'static str,
    pub value: String,
    pub optional: bool,
}

/// The writes that set `limits` on a group of `flavor`, in order. `only` picks the
/// resources this folder controls (a v1 folder is in one hierarchy).
pub fn limit_writes(flavor: Flavor, limits: &Limits, only: &[&str]) -> Vec<LimitWrite> {
    let w = |file, value: String, optional| LimitWrite {
        file,
        value,
        optional,
    };
    let mut out = Vec::new();
    let has = |c: &str| only.contains(&c);
    if let (Some(m), true) = (limits.memory_bytes, has("memory")) {
        match flavor {
            Flavor::V2 => {
                out.push(w("memory.max", m.to_string(), false));
                out.push(w("memory.swap.max", "0".into(), true));
            }
            Flavor::V1 => {
                out.push(w("memory.limit_in_bytes", m.to_string(), false));
                // memory+swap at the same figure: no swap. After the memory limit, which
                // it may not be below.
                out.push(w("memory.memsw.limit_in_bytes", m.to_string(), true));
            }
        }
    }
    if let (Some(c), true) = (limits.cpus, has("cpu")) {
        let quota = Limits::cpu_quota_us(c);
        match flavor {
            Flavor::V2 => out.push(w("cpu.max", format!("{quota} {CPU_PERIOD_US}"), false)),
            Flavor::V1 => {
                out.push(w("cpu.cfs_period_us", CPU_PERIOD_US.to_string(), false));
                out.push(w("cpu.cfs_quota_us", quota.to_string(), false));
            }
        }
    }
    if let (Some(p), true) = (limits.pids, has("pids")) {
        out.push(w("pids.max", p.to_string(), false));
    }
    out
}

/// Writes `writes` into `dir`; the first required one that fails is the error.
pub fn apply(dir: &Path, writes: &[LimitWrite]) -> Result<(), String> {
    for lw in writes {
        if let Err(e) = fs::write(dir.join(lw.file), &lw.value)
            && !lw.optional
        {
            return Err(format!(
                "could not set {} to {} in {}: {e}",
                lw.file,
                lw.value,
                dir.display()
            ));
        }
    }
    Ok(())
}

/// The value of `key` in a flat keyed file (`cpu.stat`, `memory.events`,
/// `memory.oom_control`, `/proc/vmstat`: `KEY VALUE` lines).
pub fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Bytes read and written in a v2 `io.stat` (`MAJ:MIN rbytes=N wbytes=N …` per device).
pub fn io_stat(text: &str) -> (u64, u64) {
    let (mut r, mut w) = (0u64, 0u64);
    for field in text.split_whitespace() {
        if let Some(v) = field.strip_prefix("rbytes=") {
            r += v.parse::<u64>().unwrap_or(0);
        } else if let Some(v) = field.strip_prefix("wbytes=") {
            w += v.parse::<u64>().unwrap_or(0);
        }
    }
    (r, w)
}

/// Reads a small cgroup file.
fn read(dir: &Path, file: &str) -> Option<String> {
    super::proc::read_kernel_file(dir.join(file)).ok()
}

/// Reads one number from a cgroup file (`memory.peak`, `memory.max_usage_in_bytes`).
fn number(dir: &Path, file: &str) -> Option<u64> {
    read(dir, file)?.trim().parse().ok()
}

/// What the cgroups of a job measure: CPU from the fence's `cpu.stat` (a core file of
/// every v2 group, controller or not), memory and io from the group that has the
/// controller. Figures no group measures stay `None`.
pub fn usage(fence: Option<&Path>, v2_memory: bool, v2_io: bool, v1: &[PathBuf]) -> Usage {
    let mut u = Usage::default();
    if let Some(f) = fence {
        u.cpu_seconds = read(f, "cpu.stat")
            .and_then(|t| keyed(&t, "usage_usec"))
            .map(|us| us as f64 / 1e6);
        if v2_memory {
            u.memory_peak_bytes = number(f, "memory.peak");
        }
        if v2_io && let Some(t) = read(f, "io.stat") {
            let (r, w) = io_stat(&t);
            u.io_read_bytes = Some(r);
            u.io_write_bytes = Some(w);
        }
    }
    for d in v1 {
        if u.memory_peak_bytes.is_none() {
            u.memory_peak_bytes = number(d, "memory.max_usage_in_bytes");
        }
    }
    u
}

/// What a job's memory group says of OOM kills: how many of its processes the kernel's
/// OOM killer ended (any OOM: the job's limit or the whole sandbox's), and whether the
/// group itself reached its limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OomCounters {
    pub kills: u64,
    pub hit_limit: bool,
}

/// [`OomCounters`] of a v2 group (`memory.events`: `oom_kill`, and `oom` for the limit).
pub fn oom_v2(dir: &Path) -> Option<OomCounters> {
    let t = read(dir, "memory.events")?;
    Some(OomCounters {
        kills: keyed(&t, "oom_kill")?,
        hit_limit: keyed(&t, "oom").unwrap_or(0) > 0 || keyed(&t, "max").unwrap_or(0) > 0,
    })
}

/// [`OomCounters`] of a v1 memory group (`memory.oom_control`'s `oom_kill`; the limit
/// was reached when `memory.failcnt` counted).
pub fn oom_v1(dir: &Path) -> Option<OomCounters> {
    let t = read(dir, "memory.oom_control")?;
    Some(OomCounters {
        kills: keyed(&t, "oom_kill")?,
        // With memory+swap limited at the same figure, that limit is the one reached.
        hit_limit: number(dir, "memory.failcnt").unwrap_or(0) > 0
            || number(dir, "memory.memsw.failcnt").unwrap_or(0) > 0,
    })
}

/// One OOM kill as the kernel logged it (its `oom-kill:` line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedKill {
    pub pid: i32,
    pub task: String,
    /// The cgroup whose limit was reached (`oom_memcg`; absent for a machine-wide OOM).
    pub oom_memcg: Option<String>,
    /// `CONSTRAINT_MEMCG`, `CONSTRAINT_NONE` (the machine), …
    pub constraint: String,
}

/// Parses an `oom-kill:` log line of a process in the job's memory group (`task_memcg`
/// ends with `/gitterm/<job_id>`, or is below it).
pub fn parse_oom_line(line: &str, job_id: &str) -> Option<LoggedKill> {
    let (kill, task_memcg) = parse_oom_line_any(line)?;
    let marker = format!("/gitterm/{job_id}");
    (task_memcg.ends_with(&marker) || task_memcg.contains(&format!("{marker}/"))).then_some(kill)
}

/// Parses any `oom-kill:` log line: the kill, and the victim's memory cgroup.
fn parse_oom_line_any(line: &str) -> Option<(LoggedKill, String)> {
    let rest = &line[line.find("oom-kill:")? + "oom-kill:".len()..];
    let mut kill = LoggedKill {
        pid: 0,
        task: String::new(),
        oom_memcg: None,
        constraint: String::new(),
    };
    let mut task_memcg = String::new();
    for kv in rest.trim_end().split(',') {
        let Some((k, v)) = kv.split_once('=') else {
            continue;
        };
        match k {
            "constraint" => kill.constraint = v.to_string(),
            "oom_memcg" => kill.oom_memcg = Some(v.to_string()),
            "task_memcg" => task_memcg = v.to_string(),
            "task" => kill.task = v.chars().filter(|c| !c.is_control()).collect(),
            "pid" => kill.pid = v.parse().ok()?,
            _ => {}
        }
    }
    (kill.pid > 0).then_some((kill, task_memcg))
}

/// The OOM kills of the job's processes in the kernel's log (`/dev/kmsg`, readable by
/// root), oldest first: those in the job's memory group, and those of `pids` (processes
/// of the job that died of SIGKILL, for a job without a memory group; the last line for
/// each). Empty where the log cannot be read.
pub fn logged_oom_kills(job_id: &str, pids: &[i32]) -> Vec<LoggedKill> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(mut f) = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/kmsg")
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut buf = vec![0u8; 8192];
    // Each read is one record; the ring holds a bounded number of them.
    for _ in 0..200_000 {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let rec = String::from_utf8_lossy(&buf[..n]);
                if let Some(k) = parse_oom_line(&rec, job_id) {
                    out.push(k);
                } else if let Some((k, _)) = parse_oom_line_any(&rec)
                    && pids.contains(&k.pid)
                {
                    out.retain(|o: &LoggedKill| o.pid != k.pid);
                    out.push(k);
                }
            }
            // A record overwritten while we read: go on with the next.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
            Err(_) => break,
        }
    }
    out
}

/// The kernel's count of OOM kills since boot (`/proc/vmstat` `oom_kill`).
pub fn global_oom_kills() -> Option<u64> {
    keyed(
        &super::proc::read_kernel_file("/proc/vmstat").ok()?,
        "oom_kill",
    )
}

/// The sandbox's figures for `GET /v1/sandbox` and the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxResources {
    pub cpus: usize,
    pub memory_total_bytes: Option<u64>,
    pub memory_available_bytes: Option<u64>,
    pub disk_total_bytes: Option<u64>,
    pub disk_free_bytes: Option<u64>,
    pub load1: Option<f64>,
}

/// A `/proc/meminfo` figure in bytes.
pub fn meminfo(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kb * 1024)
    })
}

/// The sandbox's CPUs (those this process may run on), memory (`/proc/meminfo`), the
/// disk of `root` (statvfs: total, and free for unprivileged users), and the 1-minute load
/// average (`/proc/loadavg`, what getloadavg reads).
pub fn sandbox(root: &Path) -> SandboxResources {
    let mem = super::proc::read_kernel_file("/proc/meminfo").unwrap_or_default();
    let disk = nix::sys::statvfs::statvfs(root).ok();
    let load = super::proc::read_kernel_file("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok());
    SandboxResources {
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        memory_total_bytes: meminfo(&mem, "MemTotal"),
        memory_available_bytes: meminfo(&mem, "MemAvailable"),
        disk_total_bytes: disk.as_ref().map(|d| d.blocks() * d.fragment_size()),
        disk_free_bytes: disk
            .as_ref()
            .map(|d| d.blocks_available() * d.fragment_size()),
        load1: load,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_CGROUP: &str = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n\
        2:cpuacct:/\n1:cpu:/\n0::/\n";
    const HYBRID_MOUNTINFO: &str = "\
30 25 0:26 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw
35 30 0:31 / /sys/fs/cgroup/cpu rw shared:14 - cgroup cgroup rw,cpu
36 30 0:32 / /sys/fs/cgroup/cpuacct rw shared:15 - cgroup cgroup rw,cpuacct
37 30 0:33 / /sys/fs/cgroup/memory rw shared:16 - cgroup cgroup rw,memory
38 30 0:34 /docker/x /sys/fs/cgroup/pids rw shared:17 - cgroup cgroup rw,pids
39 30 0:35 / /sys/fs/cgroup/cpu,cpuacct rw shared:18 - cgroup cgroup rw,cpu,cpuacct
";

    #[test]
    fn memberships_and_mounts_of_a_hybrid_host() {
        let m = parse_memberships(HYBRID_CGROUP);
        assert_eq!(m.len(), 6);
        assert_eq!(m[2].controllers, vec!["memory"]);
        assert_eq!(m[2].path, "/process_api/abc");
        assert_eq!(m[5].id, 0);
        assert!(m[5].controllers.is_empty());
        let mounts = parse_v1_mounts(HYBRID_MOUNTINFO);
        assert_eq!(mounts.len(), 5, "{mounts:?}");
        let mem = mounts.iter().find(|m| m.controllers == ["memory"]).unwrap();
        assert_eq!(
            folder_in(mem, "/process_api/abc").unwrap(),
            Path::new("/sys/fs/cgroup/memory/process_api/abc")
        );
        assert_eq!(
            folder_in(mem, "/").unwrap(),
            Path::new("/sys/fs/cgroup/memory")
        );
        // A bind-mounted sub-tree: its root is cut off, and a path outside it has no place.
        let pids = mounts.iter().find(|m| m.controllers == ["pids"]).unwrap();
        assert_eq!(
            folder_in(pids, "/docker/x/job").unwrap(),
            Path::new("/sys/fs/cgroup/pids/job")
        );
        assert_eq!(folder_in(pids, "/docker/xy"), None);
        assert_eq!(folder_in(pids, "/other"), None);
        let both = mounts.last().unwrap();
        assert_eq!(both.controllers, vec!["cpu", "cpuacct"]);
        assert_eq!(unescape_mount("/a\\040b"), "/a b");
    }

    #[test]
    fn limits_in_v2_files() {
        let l = Limits {
            memory_bytes: Some(64 << 20),
            cpus: Some(1.5),
            pids: Some(20),
        };
        let w = limit_writes(Flavor::V2, &l, &V2_CONTROLLERS);
        let pairs: Vec<(&str, &str, bool)> = w
            .iter()
            .map(|x| (x.file, x.value.as_str(), x.optional))
            .collect();
        assert_eq!(
            pairs,
            vec![
                ("memory.max", "67108864", false),
                ("memory.swap.max", "0", true),
                ("cpu.max", "150000 100000", false),
                ("pids.max", "20", false),
            ]
        );
    }

    #[test]
    fn limits_in_v1_files_per_hierarchy() {
        let l = Limits {
            memory_bytes: Some(1 << 30),
            cpus: Some(0.5),
            pids: Some(7),
        };
        let mem: Vec<_> = limit_writes(Flavor::V1, &l, &["memory"])
            .into_iter()
            .map(|x| (x.file, x.value))
            .collect();
        assert_eq!(
            mem,
            vec![
                ("memory.limit_in_bytes", "1073741824".to_string()),
                ("memory.memsw.limit_in_bytes", "1073741824".to_string()),
            ]
        );
        let cpu: Vec<_> = limit_writes(Flavor::V1, &l, &["cpu"])
            .into_iter()
            .map(|x| (x.file, x.value))
            .collect();
        assert_eq!(
            cpu,
            vec![
                ("cpu.cfs_period_us", "100000".to_string()),
                ("cpu.cfs_quota_us", "50000".to_string()),
            ]
        );
        assert_eq!(limit_writes(Flavor::V1, &l, &["pids"])[0].value, "7");
        assert!(limit_writes(Flavor::V1, &Limits::default(), &V1_CONTROLLERS).is_empty());
    }

    #[test]
    fn v2_usage_and_oom_files() {
        let cpu = "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n";
        assert_eq!(keyed(cpu, "usage_usec"), Some(2_500_000));
        assert_eq!(keyed(cpu, "usage"), None);
        let io = "8:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n\
                  259:0 rbytes=1 wbytes=2 rios=1 wios=1 dbytes=0 dios=0\n";
        assert_eq!(io_stat(io), (4097, 8194));
        // A fake v2 group, with the kernel's file names and formats.
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("cpu.stat"), cpu).unwrap();
        fs::write(d.path().join("memory.peak"), "73400320\n").unwrap();
        fs::write(d.path().join("io.stat"), io).unwrap();
        fs::write(
            d.path().join("memory.events"),
            "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n",
        )
        .unwrap();
        let u = usage(Some(d.path()), true, true, &[]);
        assert_eq!(u.cpu_seconds, Some(2.5));
        assert_eq!(u.memory_peak_bytes, Some(73_400_320));
        assert_eq!(
            (u.io_read_bytes, u.io_write_bytes),
            (Some(4097), Some(8194))
        );
        assert_eq!(
            oom_v2(d.path()),
            Some(OomCounters {
                kills: 1,
                hit_limit: true
            })
        );
        // Without the controllers the figures are unknown, not zero.
        let u = usage(Some(d.path()), false, false, &[]);
        assert_eq!(u.memory_peak_bytes, None);
        assert_eq!(u.io_read_bytes, None);
        fs::write(
            d.path().join("memory.events"),
            "low 0\nhigh 0\nmax 0\noom 0\noom_kill 1\n",
        )
        .unwrap();
        assert!(!oom_v2(d.path()).unwrap().hit_limit);
    }

    #[test]
    fn the_kernels_oom_line_names_the_victim_and_the_limit() {
        let id = "job_3f69aa07cf12cbd15c39";
        let line = format!(
            "6,470,10980233892,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),\
             cpuset=/,mems_allowed=0,oom_memcg=/sandbox/gitterm/{id},\
             task_memcg=/sandbox/gitterm/{id},task=python3,pid=1474,uid=0\n"
        );
        let k = parse_oom_line(&line, id).unwrap();
        assert_eq!(k.pid, 1474);
        assert_eq!(k.task, "python3");
        assert_eq!(k.constraint, "CONSTRAINT_MEMCG");
        assert_eq!(
            k.oom_memcg.as_deref(),
            Some(&*format!("/sandbox/gitterm/{id}"))
        );
        // Another job's kill, or a line of another kind, is not this job's.
        assert_eq!(parse_oom_line(&line, "job_00000000000000000000"), None);
        assert_eq!(
            parse_oom_line(&line.replace(id, &format!("{id}0")), id),
            None
        );
        assert_eq!(parse_oom_line("Killed process 1474 (python3)", id), None);
        let global = format!(
            "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,\
             global_oom,task_memcg=/gitterm/{id}/gitterm/job_1,task=a b,pid=7,uid=1000"
        );
        let k = parse_oom_line(&global, id).unwrap();
        assert_eq!((k.pid, k.task.as_str(), k.oom_memcg), (7, "a b", None));
    }

    #[test]
    fn v1_oom_and_meminfo_formats() {
        let d = tempfile::tempdir().unwrap();
        fs::write(
            d.path().join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        )
        .unwrap();
        fs::write(d.path().join("memory.failcnt"), "31\n").unwrap();
        fs::write(d.path().join("memory.max_usage_in_bytes"), "67108864\n").unwrap();
        assert_eq!(
            oom_v1(d.path()),
            Some(OomCounters {
                kills: 2,
                hit_limit: true
            })
        );
        let u = usage(None, false, false, &[d.path().to_path_buf()]);
        assert_eq!(u.memory_peak_bytes, Some(64 << 20));
        assert_eq!(u.cpu_seconds, None);
        let mi = "MemTotal:       24683584 kB\nMemFree:         5537084 kB\nMemAvailable:   23779972 kB\n";
        assert_eq!(meminfo(mi, "MemTotal"), Some(24683584 * 1024));
        assert_eq!(meminfo(mi, "MemAvailable"), Some(23779972 * 1024));
        assert_eq!(meminfo(mi, "Mem"), None);
    }
}
