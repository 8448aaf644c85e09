//! Per-job cgroup v2 folders: a fence that holds escaped processes and kills them all,
//! and where the controllers are (cgroup v2 beside it, or v1 hierarchies on hybrid
//! hosts) the job's resource groups: its limits, usage and OOM counters.

use std::fs;
use std::path::{Path, PathBuf};

use super::resources::{self, Flavor, Hierarchies};
use crate::model::resources::{Capabilities, Limits, Usage};

/// A cgroup v2 folder for one job: a fence that holds escaped processes and kills them all
/// at once. Used only where the hierarchy is writable; the subreaper works without it.
/// On hybrid hosts the job also has a folder in each cgroup v1 hierarchy it joined.
pub struct JobCgroup {
    path: PathBuf,
    /// The job's folders in cgroup v1 hierarchies, joined by its shell before it runs
    /// anything: memory always where usable (without it an unlimited job's usage and OOM
    /// kills could not be measured: a child of its shell killed by the OOM killer would
    /// go unseen), cpu and pids when limited. The first join costs the start an RCU grace
    /// period (milliseconds; see `os::spawn`).
    v1: Vec<PathBuf>,
}

/// The hierarchies' controllers, looked up once per process (the fork server's children
/// inherit the answer).
pub fn hierarchies() -> &'static Hierarchies {
    static H: std::sync::OnceLock<Hierarchies> = std::sync::OnceLock::new();
    H.get_or_init(|| {
        if std::env::var_os("GITTERM_NO_CGROUP").is_some() {
            let mut h = Hierarchies::default();
            for c in resources::V1_CONTROLLERS {
                h.why_not.push((
                    c,
                    "cgroups are turned off (GITTERM_NO_CGROUP is set)".into(),
                ));
            }
            return h;
        }
        let base = jobs_base();
        let mut h = Hierarchies::discover(base.map(PathBuf::as_path));
        if base.is_none() {
            // Without the v2 fence a job has no cgroup at all: v1 groups alone would not
            // hold what escapes, so they are not used either.
            h.v1_memory = None;
            h.v1_cpu = None;
            h.v1_pids = None;
            h.why_not = resources::V1_CONTROLLERS
                .iter()
                .map(|&c| {
                    (
                        c,
                        "no writable cgroup v2 hierarchy for the job's own group".to_string(),
                    )
                })
                .collect();
        }
        h
    })
}

/// Which limits this sandbox can enforce.
pub fn capabilities() -> Capabilities {
    hierarchies().capabilities()
}

/// Refuses limits the sandbox cannot enforce, naming what is missing.
pub fn check_limits(limits: &Limits) -> Result<(), String> {
    match hierarchies().missing(limits) {
        Some(why) => Err(why),
        None => Ok(()),
    }
}

/// Where cgroup v2 is mounted, if anywhere: one of the two usual places when the
/// filesystem there says it is cgroup2 (a statfs each, where the mount table of a
/// container can run to hundreds of lines), else the first such mount in the table.
pub fn cgroup2_mount() -> Option<PathBuf> {
    for usual in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        if nix::sys::statfs::statfs(usual)
            .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
        {
            return Some(PathBuf::from(usual));
        }
    }
    let mounts = super::proc::read_kernel_file("/proc/self/mounts").ok()?;
    cgroup2_mounts_in(&mounts).next()
}

/// The cgroup2 mount points a mount table (`/proc/self/mounts`) lists, in its order.
fn cgroup2_mounts_in(table: &str) -> impl Iterator<Item = PathBuf> + '_ {
    table.lines().filter_map(|l| {
        let mut f = l.split_whitespace();
        let (_dev, dir, kind) = (f.next()?, f.next()?, f.next()?);
        (kind == "cgroup2").then(|| PathBuf::from(dir))
    })
}

/// `<mount>/<this process's cgroup>/gitterm`, where job cgroups go; looked up once per
/// process (the fork server's children inherit it), as a process's own cgroup does not
/// change under it in practice and the lookup reads the whole mount table.
fn jobs_base() -> Option<&'static PathBuf> {
    static BASE: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    BASE.get_or_init(|| {
        let mount = cgroup2_mount()?;
        let own = super::proc::read_kernel_file("/proc/self/cgroup").ok()?;
        let rel = own
            .lines()
            .find_map(|l| l.strip_prefix("0::"))?
            .trim_start_matches('/');
        let base = if rel.is_empty() {
            mount
        } else {
            mount.join(rel)
        };
        Some(base.join("gitterm"))
    })
    .as_ref()
}

impl JobCgroup {
    /// Looks the hierarchies up now, so that forks of this process need not.
    pub fn warm() {
        let _ = jobs_base();
        let _ = hierarchies();
    }

    /// The cgroup path for a job id (it may not exist).
    pub fn path_for(job_id: &str) -> Option<PathBuf> {
        if std::env::var_os("GITTERM_NO_CGROUP").is_some() {
            return None;
        }
        Some(jobs_base()?.join(job_id))
    }

    /// Creates the job's cgroup, or `None` where the hierarchy is not writable.
    pub fn create(job_id: &str) -> Option<JobCgroup> {
        let path = Self::path_for(job_id)?;
        fs::create_dir_all(&path).ok()?;
        path.join("cgroup.procs").exists().then_some(JobCgroup {
            path,
            v1: Vec::new(),
        })
    }

    /// Creates the job's cgroup with its resource groups and sets `limits` on them. A
    /// limit that cannot be set is an error (the job must not run without it); without
    /// limits, a sandbox with no writable hierarchy gives `Ok(None)`.
    pub fn create_limited(job_id: &str, limits: &Limits) -> Result<Option<JobCgroup>, String> {
        check_limits(limits)?;
        let Some(mut cg) = Self::create(job_id) else {
            return match limits.is_empty() {
                true => Ok(None),
                false => Err("the job's cgroup could not be created".into()),
            };
        };
        let h = hierarchies();
        let result = (|| {
            let v2: Vec<&str> = h.v2.iter().map(String::as_str).collect();
            resources::apply(&cg.path, &resources::limit_writes(Flavor::V2, limits, &v2))?;
            for (ctrl, base, wanted) in [
                ("memory", &h.v1_memory, true),
                ("cpu", &h.v1_cpu, limits.cpus.is_some()),
                ("pids", &h.v1_pids, limits.pids.is_some()),
            ] {
                let Some(base) = base.as_ref().filter(|_| wanted) else {
                    continue;
                };
                let dir = base.join(job_id);
                match fs::create_dir(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    // Memory is joined for usage alone when no limit asks for it.
                    Err(_) if ctrl == "memory" && limits.memory_bytes.is_none() => continue,
                    Err(e) => return Err(format!("creating {}: {e}", dir.display())),
                }
                // Shared hierarchies (cpu,cpuacct) are one folder: joined once.
                if !cg.v1.contains(&dir) {
                    cg.v1.push(dir.clone());
                }
                resources::apply(&dir, &resources::limit_writes(Flavor::V1, limits, &[ctrl]))?;
            }
            Ok(())
        })();
        match result {
            Ok(()) => Ok(Some(cg)),
            Err(e) => {
                cg.remove();
                Err(e)
            }
        }
    }

    /// The `cgroup.procs` files of the job's v1 folders, which its shell writes to join
    /// them (opened before the fork: the job's user may not).
    pub fn v1_procs_files(&self) -> Vec<PathBuf> {
        self.v1.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// The job's v1 folders, for the record.
    pub fn v1_paths(&self) -> Vec<String> {
        self.v1
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect()
    }

    /// Adds the v1 folders a record names for `job_id`, those that are ours: a folder
    /// named for the job in a `gitterm` folder of a cgroup v1 hierarchy's mount (the
    /// reader's own places for it are the fallback).
    pub fn with_v1(mut self, recorded: &[String], job_id: &str) -> JobCgroup {
        for r in recorded {
            let p = Path::new(r);
            if is_job_folder(p, job_id)
                && v1_mounts().iter().any(|m| p.starts_with(m))
                && p.join("cgroup.procs").exists()
                && !self.v1.iter().any(|v| v == p)
            {
                self.v1.push(p.to_path_buf());
            }
        }
        self
    }

    /// The job's v1 folders this process's hierarchies say it would have, that exist.
    fn derived_v1(&mut self, job_id: &str) {
        let h = hierarchies();
        for base in [&h.v1_memory, &h.v1_cpu, &h.v1_pids].into_iter().flatten() {
            let dir = base.join(job_id);
            if dir.join("cgroup.procs").exists() && !self.v1.contains(&dir) {
                self.v1.push(dir);
            }
        }
    }

    /// What the job's groups measure now (see [`resources::usage`]).
    pub fn usage(&self) -> Usage {
        let h = hierarchies();
        let v2 = |c: &str| h.v2.iter().any(|x| x == c);
        resources::usage(Some(&self.path), v2("memory"), v2("io"), &self.v1)
    }

    /// The OOM counters of the job's memory group, where it has one.
    pub fn oom(&self) -> Option<resources::OomCounters> {
        if hierarchies().v2.iter().any(|c| c == "memory") {
            return resources::oom_v2(&self.path);
        }
        self.v1.iter().find_map(|d| resources::oom_v1(d))
    }

    /// An existing job cgroup (for sweeping after a supervisor died).
    pub fn existing(job_id: &str) -> Option<JobCgroup> {
        let path = Self::path_for(job_id)?;
        let mut cg = path.join("cgroup.procs").exists().then_some(JobCgroup {
            path,
            v1: Vec::new(),
        })?;
        cg.derived_v1(job_id);
        Some(cg)
    }

    /// The file a child writes `0` into to join (opened before fork).
    pub fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    /// The pids in the cgroup.
    pub fn pids(&self) -> Vec<i32> {
        super::proc::read_kernel_file(self.procs_file())
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// True if `pid` is in this cgroup now.
    pub fn holds(&self, pid: i32) -> bool {
        let Ok(text) = super::proc::read_kernel_file(format!("/proc/{pid}/cgroup")) else {
            return false;
        };
        text.lines()
            .filter_map(|l| l.strip_prefix("0::"))
            .any(|rel| self.path.ends_with(rel.trim_start_matches('/')))
    }

    /// The cgroup a record names for `job_id`, only if it is one of ours: a folder named
    /// for that job in a `gitterm` folder under the cgroup mount, with no `..` on the way.
    /// A record planted with any other path must never make a reader kill what is there.
    pub fn recorded(path: &Path, job_id: &str) -> Option<JobCgroup> {
        let mount = cgroup2_mount()?;
        let ours = path.starts_with(&mount) && is_job_folder(path, job_id);
        if ours {
            let mut cg = Self::at(path)?;
            cg.derived_v1(job_id);
            Some(cg)
        } else {
            None
        }
    }

    /// The cgroup at `path`, if it exists.
    pub fn at(path: &Path) -> Option<JobCgroup> {
        path.join("cgroup.procs").exists().then(|| JobCgroup {
            path: path.to_path_buf(),
            v1: Vec::new(),
        })
    }

    /// Kills every process in the cgroup at once.
    pub fn kill_all(&self) -> bool {
        fs::write(self.path.join("cgroup.kill"), "1").is_ok()
    }

    /// Removes the (empty) cgroup folder and any nested job's folders left in it (a
    /// nested `gitterm-agent exec` makes `gitterm/<id>` inside this one); harmless if
    /// processes remain. A nested job also removes the `gitterm` folder it made inside
    /// its outer job's cgroup, so the outer one can be removed in turn.
    pub fn remove(&self) {
        fn remove_tree(p: &Path) {
            if let Ok(dir) = fs::read_dir(p) {
                for e in dir.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        remove_tree(&e.path());
                    }
                }
            }
            let _ = fs::remove_dir(p);
        }
        remove_tree(&self.path);
        for d in &self.v1 {
            remove_tree(d);
        }
        if let Some(parent) = self.path.parent()
            && parent.file_name().is_some_and(|n| n == "gitterm")
            && parent
                .parent()
                .and_then(Path::file_name)
                .and_then(|n| n.to_str())
                .is_some_and(|n| crate::model::JobId::parse(n).is_some())
        {
            let _ = fs::remove_dir(parent);
        }
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
        // A v1 group can be removed only once its last process is gone too (it has no
        // `cgroup.events`): the processes were in the fence as well, so this is brief.
        while std::time::Instant::now() < deadline
            && self.v1.iter().any(|d| {
                super::proc::read_kernel_file(d.join("cgroup.procs"))
                    .is_ok_and(|t| !t.trim().is_empty())
            })
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        self.remove();
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A folder named for the job in a `gitterm` folder, with no `..` on the way.
fn is_job_folder(path: &Path, job_id: &str) -> bool {
    path.file_name().is_some_and(|n| n == job_id)
        && path
            .parent()
            .and_then(Path::file_name)
            .is_some_and(|n| n == "gitterm")
        && path.components().all(|c| {
            matches!(
                c,
                std::path::Component::RootDir | std::path::Component::Normal(_)
            )
        })
}

/// The mount folders of the cgroup v1 hierarchies (looked up once).
fn v1_mounts() -> &'static [PathBuf] {
    static M: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();
    M.get_or_init(|| {
        let info = super::proc::read_kernel_file("/proc/self/mountinfo").unwrap_or_default();
        resources::parse_v1_mounts(&info)
            .into_iter()
            .map(|m| m.dir)
            .collect()
    })
}

/// A job's usage as its groups measure it now, from what its record names (for answers
/// about a running job: a few small reads, never older than the read).
pub fn live_usage(fence: Option<&str>, v1: &[String], job_id: &str) -> Option<Usage> {
    let cg = match fence {
        Some(p) => JobCgroup::recorded(Path::new(p), job_id)?,
        None => return None,
    };
    Some(cg.with_v1(v1, job_id).usage())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The statfs shortcut names a place the mount table lists as cgroup2, and finds one
    /// whenever the table has one.
    #[test]
    fn the_shortcut_agrees_with_the_mount_table() {
        let table = super::super::proc::read_kernel_file("/proc/self/mounts").unwrap();
        let listed: Vec<PathBuf> = cgroup2_mounts_in(&table).collect();
        match cgroup2_mount() {
            Some(p) => assert!(listed.contains(&p), "{p:?} is not among {listed:?}"),
            None => assert!(listed.is_empty(), "missed {listed:?}"),
        }
    }
}
