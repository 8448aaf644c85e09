//! Reading jobs as they are: a `running` record whose supervisor is gone (or whose boot is
//! over) becomes `lost`, and whatever the job left behind is ended. Every reader goes
//! through here, so they all agree; pruning reads the settled list.

use std::fs;
use std::io;
use std::path::Path;
use std::time::Duration;

use crate::model::error::{Error, Result};
use crate::model::record::{LOST_BOOT, LOST_SUPERVISOR};
use crate::model::{JobId, JobRecord, Status};
use crate::state::layout::*;
use crate::state::store::{Listed, Store};

/// How long a reader waits for a lock held by someone other than a live supervisor.
const SETTLE_WAIT: Duration = Duration::from_secs(2);

/// True if the record names a supervisor that is still the process it was.
fn supervisor_alive(rec: &JobRecord) -> bool {
    match (rec.supervisor_pid, rec.supervisor_start) {
        (Some(pid), Some(start)) => crate::os::proc::stat(pid).is_some_and(|s| s.start == start),
        _ => false,
    }
}

/// Continues a running job's supervisor if something stopped it: every reader does, so
/// a waiting `exec`, `serve`'s housekeeping and any client's read keep the job's
/// timeout alive.
pub fn nudge(rec: &JobRecord) -> bool {
    match (rec.supervisor_pid, rec.supervisor_start) {
        (Some(pid), Some(start)) => crate::os::proc::continue_if_stopped(pid, start),
        _ => false,
    }
}

/// [`nudge`]s every running job; `serve` calls it every second, so that a job that stops
/// its supervisor while nobody reads it still ends at its timeout. Returns how many
/// supervisors were continued.
pub fn nudge_running(store: &Store) -> usize {
    let Ok(dir) = fs::read_dir(store.running_dir()) else {
        return 0;
    };
    dir.flatten()
        .filter_map(|e| JobId::parse(e.file_name().to_str()?))
        .filter_map(|id| store.read_raw(&id).ok())
        .filter(|r| r.status == Status::Running && nudge(r))
        .count()
}

/// What the sweep of a lost job did, truthfully: what was ended, what survived, and
/// what cannot be found at all.
fn describe(sw: &crate::os::proc::Sweep) -> String {
    let found = if sw.had_cgroup {
        "in the job's cgroup or carrying its marker"
    } else {
        "carrying the job's marker (it had no cgroup)"
    };
    let mut s = format!("{} remaining processes {found} were ended", sw.ended);
    if sw.survivors > 0 {
        s.push_str(&format!("; {} could not be ended", sw.survivors));
    }
    s.push_str("; a process that left the cgroup and cleared the marker cannot be found");
    s
}

/// Reads a record and settles a `running` one whose supervisor is gone (or whose boot
/// is over) into `lost`, ending whatever the job left behind.
pub fn load(store: &Store, id: &JobId) -> Result<JobRecord> {
    let mut rec = store.read_raw(id)?;
    if rec.status != Status::Running {
        return Ok(rec);
    }
    nudge(&rec);
    let stale_boot = match (&rec.boot_id, crate::state::sandbox::boot_id()) {
        (Some(then), now) => !now.is_empty() && *then != now,
        _ => false,
    };
    // The lock decides; the boot id only names the reason. A lock we cannot even open
    // (out of fds, say) proves nothing, so the job stays as recorded.
    let _lock = match store.open_lock(id) {
        Ok(l) => match l.try_lock() {
            Ok(()) => Some(l),
            Err(std::fs::TryLockError::WouldBlock) => {
                // Held by the supervisor (really running), or by another reader that
                // is settling a job whose supervisor is gone: then wait for its verdict,
                // so every reader agrees (a prune must not see "running" meanwhile).
                // Another reader settling it, a supervisor of an older version still
                // writing its first record (this one's folder appears only once the
                // record names the supervisor), or a job process that took the lock and
                // killed its supervisor: look again until the record names a live
                // supervisor or the lock is free, for a bounded time, then report the
                // job as recorded.
                let mut deadline = std::time::Instant::now() + SETTLE_WAIT;
                let mut swept = false;
                loop {
                    if supervisor_alive(&rec) {
                        return Ok(rec);
                    }
                    match l.try_lock() {
                        Ok(()) => break,
                        Err(std::fs::TryLockError::WouldBlock)
                            if std::time::Instant::now() < deadline =>
                        {
                            std::thread::sleep(Duration::from_millis(5));
                            rec = store.read_raw(id)?;
                            if rec.status != Status::Running {
                                return Ok(rec);
                            }
                        }
                        // Its supervisor started and is gone, yet the lock stays held: by
                        // a process of the job itself (it took the lock and killed its
                        // supervisor). End the job's processes, which frees the lock, then
                        // settle it; another reader holding it is neither in the job's
                        // cgroup nor carries its marker, so it is not touched.
                        Err(std::fs::TryLockError::WouldBlock)
                            if rec.supervisor_pid.is_some() && !swept =>
                        {
                            swept = true;
                            crate::os::proc::sweep_job(
                                id.as_str(),
                                rec.cgroup.as_deref().map(Path::new),
                            );
                            deadline = std::time::Instant::now() + SETTLE_WAIT;
                        }
                        Err(_) => return Ok(rec),
                    }
                }
                Some(l)
            }
            Err(_) => return Ok(rec),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(_) => return Ok(rec),
    };
    // Re-read under the lock: the supervisor may have written its final record just
    // before it exited.
    rec = store.read_raw(id)?;
    if rec.status != Status::Running {
        return Ok(rec);
    }
    let sweep = (!stale_boot)
        .then(|| crate::os::proc::sweep_job(id.as_str(), rec.cgroup.as_deref().map(Path::new)));
    for f in LEGACY.iter().chain([&RESERVE, &FINAL_RECORD]) {
        let _ = fs::remove_file(store.job_dir(id).join(f));
    }
    let _ = fs::remove_file(store.running_marker(id));
    rec.status = Status::Lost;
    rec.reason = Some(match sweep {
        None => LOST_BOOT.to_string(),
        // No supervisor ever recorded itself: whoever was starting the job stopped first.
        Some(sw) if rec.supervisor_pid.is_none() => format!(
            "the job never started: whoever was starting it stopped before its supervisor \
             ran; {}",
            describe(&sw)
        ),
        Some(sw) => format!("{LOST_SUPERVISOR}; {}", describe(&sw)),
    });
    rec.ended_at = Some(crate::text::timefmt::now());
    rec.output_bytes = store.output_size(id);
    store
        .write_record(&rec)
        .map_err(|e| Error::io(format!("recording job {id} as lost"), e))?;
    crate::state::events::record(store.root(), crate::state::events::LOST, &rec);
    Ok(rec)
}

/// Every job, newest first; unreadable records are listed as corrupt.
pub fn list(store: &Store) -> Vec<Listed> {
    let Ok(dir) = fs::read_dir(store.jobs_dir()) else {
        return Vec::new();
    };
    let mut out: Vec<Listed> = dir
        .filter_map(|e| {
            let name = e.ok()?.file_name();
            let id = JobId::parse(name.to_str()?)?;
            Some(match load(store, &id) {
                Ok(r) => Listed::Job(Box::new(r)),
                Err(Error::NotFound(_)) => return None, // pruned meanwhile
                Err(e) => Listed::Corrupt {
                    id: id.to_string(),
                    error: e.to_string(),
                },
            })
        })
        .collect();
    out.sort_by(|a, b| match (a, b) {
        (Listed::Job(a), Listed::Job(b)) => b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)),
        (Listed::Job(_), Listed::Corrupt { .. }) => std::cmp::Ordering::Less,
        (Listed::Corrupt { .. }, Listed::Job(_)) => std::cmp::Ordering::Greater,
        (Listed::Corrupt { id: a, .. }, Listed::Corrupt { id: b, .. }) => a.cmp(b),
    });
    out
}

/// Removes ended jobs beyond the newest `keep_jobs` and those that ended more than
/// `keep_for` ago, oldest first; never a running one. Returns the removed ids.
pub fn prune(store: &Store, keep_jobs: usize, keep_for: Duration) -> Vec<String> {
    let now = std::time::SystemTime::now();
    let mut ended: Vec<JobRecord> = list(store)
        .into_iter()
        .filter_map(|l| match l {
            Listed::Job(r) if r.status.is_final() => Some(*r),
            _ => None,
        })
        .collect();
    let key = |r: &JobRecord| r.ended_at.clone().unwrap_or_else(|| r.created_at.clone());
    ended.sort_by_key(|r| std::cmp::Reverse(key(r)));
    let mut removed = Vec::new();
    for (i, r) in ended.iter().enumerate() {
        let age = crate::text::timefmt::parse(&key(r)).and_then(|t| now.duration_since(t).ok());
        if (i >= keep_jobs || age.is_some_and(|a| a > keep_for))
            && fs::remove_dir_all(store.job_dir(&r.id)).is_ok()
        {
            removed.push(r.id.to_string());
        }
    }
    removed.reverse();
    // Idempotency keys of jobs that are gone (their lock files once the key is an hour
    // old): a retry after that starts a new job, as it would after pruning.
    if let Ok(dir) = fs::read_dir(store.root().join("idempotency")) {
        for e in dir.flatten() {
            let path = e.path();
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok());
            let gone = match path.extension() {
                Some(x) if x == "lock" => {
                    old.is_some_and(|a| a > Duration::from_secs(3600))
                        && !path.with_extension("").exists()
                }
                _ => fs::read_to_string(&path)
                    .ok()
                    .and_then(|t| t.lines().next().and_then(JobId::parse))
                    .is_none_or(|id| !store.job_dir(&id).exists()),
            };
            if gone {
                let _ = fs::remove_file(&path);
            }
        }
    }
    // Folders of starts that died half-way (see `Store::staging_dir`) hold nothing
    // anyone can read; clear them once they are clearly abandoned.
    if let Ok(dir) = fs::read_dir(store.jobs_dir()) {
        for e in dir.flatten() {
            let stale = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok());
            let staged = e
                .file_name()
                .to_str()
                .and_then(|n| n.strip_prefix(STAGING_PREFIX))
                .is_some_and(|id| id.starts_with("job_"));
            if staged && stale.is_some_and(|a| a > Duration::from_secs(3600)) {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
    removed
}
