//! Per-job cgroup v2 folders: a fence that holds escaped processes and kills them all.

use std::fs;
use std::path::{Path, PathBuf};

/// A cgroup v2 folder for one job: a fence that holds escaped processes and kills them all
/// at once. Used only where the hierarchy is writable; the subreaper works without it.
pub struct JobCgroup {
    path: PathBuf,
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
    /// Looks the hierarchy up now, so that forks of this process need not.
    pub fn warm() {
        let _ = jobs_base();
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
        let ours = path.starts_with(&mount)
            && path.file_name().is_some_and(|n| n == job_id)
            && path
                .parent()
                .and_then(Path::file_name)
                .is_some_and(|n| n == "gitterm")
            && path.components().all(|c| {
                matches!(
                    c,
                    std::path::Component::RootDir | std::path::Component::Normal(_)
                )
            });
        if ours { Self::at(path) } else { None }
    }

    /// The cgroup at `path`, if it exists.
    pub fn at(path: &Path) -> Option<JobCgroup> {
        path.join("cgroup.procs").exists().then(|| JobCgroup {
            path: path.to_path_buf(),
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
        self.remove();
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.path
    }
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
