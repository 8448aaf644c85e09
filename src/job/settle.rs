//! Reading jobs as they are: a `running` record whose supervisor is gone (or whose boot is
//! over) becomes `lost`, and whatever the job left behind is ended. Every reader goes
//! through here, so they all agree; pruning reads the settled list.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::model::error::{Error, Result};
use crate::model::record::{LOST_BOOT, LOST_SUPERVISOR};
use crate::model::{JobId, JobRecord, Status};
use crate::state::layout::*;
use crate::state::store::{Listed, Store};

/// How long a reader of one job waits for another reader's verdict on it, or for a start
/// still under way to record its supervisor.
const SETTLE_WAIT: Duration = Duration::from_secs(2);

/// How long a listing waits for any one job: a job it cannot settle in that time is
/// listed as recorded, with why (`unsettled`), and never holds the listing up.
pub const LIST_WAIT: Duration = Duration::from_millis(100);

pub use crate::state::store::UNSETTLED;

/// True if the record names a supervisor that is still the process it was, and alive
/// (not a zombie waiting for its parent).
fn supervisor_alive(rec: &JobRecord) -> bool {
    match (rec.supervisor_pid, rec.supervisor_start) {
        (Some(pid), Some(start)) => crate::os::proc::stat(pid)
            .is_some_and(|s| s.start == start && crate::os::proc::alive(&s)),
        _ => false,
    }
}

/// Continues a running job's supervisor if something stopped it: every reader does, so
/// a waiting `exec`, `serve`'s housekeeping and any client's read keep the job's
/// timeout alive.
pub fn nudge(rec: &JobRecord) -> bool {
    match (rec.supervisor_pid, rec.supervisor_start) {
        (Some(pid), Some(start)) => crate::os::pidfd::continue_if_stopped(pid, start),
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

/// What the sweep of a lost job did, truthfully: what was ended (counted and named),
/// what survived, who holds the job's lock, and what cannot be found at all.
fn describe(sw: &crate::os::sweep::Sweep, lock_holders: &[i32]) -> String {
    let found = if sw.had_cgroup {
        "in the job's cgroup or carrying its marker"
    } else {
        "carrying the job's marker (it had no cgroup)"
    };
    let mut s = format!("{} remaining processes {found} were ended", sw.ended);
    if !sw.named.is_empty() {
        let more = sw.ended.saturating_sub(sw.named.len());
        s.push_str(&format!(" ({}", sw.named.join(", ")));
        if more > 0 {
            s.push_str(&format!(" and {more} more"));
        }
        s.push(')');
    }
    if sw.survivors > 0 {
        s.push_str(&format!("; {} could not be ended", sw.survivors));
    }
    // The lock holders that outlived the sweep: neither in the cgroup nor marked.
    let left: Vec<String> = lock_holders
        .iter()
        .filter(|&&p| crate::os::proc::stat(p).is_some_and(|st| crate::os::proc::alive(&st)))
        .map(|&p| crate::os::proc::describe_pid(p))
        .collect();
    if !left.is_empty() {
        s.push_str(&format!(
            "; the job's lock is held by process {}, which is neither in its cgroup nor \
             carries its marker, and was left running",
            left.join(", ")
        ));
    }
    s.push_str("; a process that left the cgroup and cleared the marker cannot be found");
    s
}

/// Reads a record and settles a `running` one whose supervisor is gone (or whose boot
/// is over) into `lost`, ending whatever the job left behind. Waits at most about
/// [`SETTLE_WAIT`] for anyone else (then settles anyway, see [`load_within`]).
///
/// Not a plain read: it may kill the job's remaining processes and rewrite its record.
pub fn settle_and_load(store: &Store, id: &JobId) -> Result<JobRecord> {
    load_within(store, id, SETTLE_WAIT, true)
}

/// [`settle_and_load`] for a listing (it too may end processes and rewrite the record): waits at most [`LIST_WAIT`] for another reader's verdict or a
/// start under way, then gives the record as it is with [`UNSETTLED`] saying why.
pub fn load_listed(store: &Store, id: &JobId) -> Result<JobRecord> {
    load_within(store, id, LIST_WAIT, false)
}

/// The record as recorded, marked as not settled by this read, and why.
fn unsettled(mut rec: JobRecord, why: &str) -> JobRecord {
    rec.extra.insert(UNSETTLED.into(), why.into());
    rec
}

/// Reads and settles, waiting at most `wait` for others: a start that has not recorded
/// its supervisor yet, or another reader settling the job. Past that, a start under way
/// is reported [`UNSETTLED`]; another reader's settling too, unless `anyway` (one job's
/// read): then this reader settles the job itself.
///
/// Whether the supervisor is gone is decided by the process the record names (its pid
/// and start time), not by the folder's lock alone: a job process that takes the lock
/// once it killed its supervisor must not make its job look alive, nor make readers wait.
fn load_within(store: &Store, id: &JobId, wait: Duration, anyway: bool) -> Result<JobRecord> {
    let mut rec = store.read_raw(id)?;
    if rec.status != Status::Running {
        return Ok(rec);
    }
    nudge(&rec);
    let stale_boot = match (&rec.boot_id, crate::state::sandbox::boot_id()) {
        (Some(then), now) => !now.is_empty() && *then != now,
        _ => false,
    };
    // Free: the supervisor is gone (it holds it for its whole life). Held: by the
    // supervisor, by another reader settling, or by a job process; the record decides.
    let folder = store.open_lock(id).ok();
    let mut held = folder.as_ref().is_some_and(|l| l.try_lock().is_ok());
    if !held {
        // Only a supervisor recorded whole (pid and start time) can be known to be gone.
        if rec.supervisor_pid.is_some() && rec.supervisor_start.is_some() {
            if supervisor_alive(&rec) {
                return Ok(rec);
            }
        } else {
            // No supervisor recorded yet: a start under way (a supervisor of an older
            // version writing its first record; this one's folder appears only once the
            // record names it). Look again until it does, or the lock is free.
            let deadline = Instant::now() + wait;
            loop {
                std::thread::sleep(Duration::from_millis(5));
                rec = store.read_raw(id)?;
                if rec.status != Status::Running {
                    return Ok(rec);
                }
                if rec.supervisor_pid.is_some() && rec.supervisor_start.is_some() {
                    if supervisor_alive(&rec) {
                        return Ok(rec);
                    }
                    break;
                }
                if folder.as_ref().is_some_and(|l| l.try_lock().is_ok()) {
                    held = true;
                    break;
                }
                if Instant::now() >= deadline {
                    return Ok(unsettled(
                        rec,
                        "its start is under way: whoever starts it holds its lock and has \
                         not recorded its supervisor yet; read it again",
                    ));
                }
            }
        }
    }
    // The supervisor is gone: it may have written its final record just before.
    rec = store.read_raw(id)?;
    if rec.status != Status::Running {
        return Ok(rec);
    }
    // Readers settle one at a time, under their own lock.
    let guard = settle_lock(store, id, wait);
    if guard.is_none() && !anyway {
        return Ok(unsettled(
            store.read_raw(id)?,
            "its supervisor is gone and another reader is settling it; read it again",
        ));
    }
    // Re-read under the lock: another reader may have settled the job meanwhile.
    rec = store.read_raw(id)?;
    if rec.status != Status::Running {
        if guard.is_some() {
            // Made just now by this reader, after the job was settled: not left behind.
            let _ = fs::remove_file(store.job_dir(id).join(SETTLE_LOCK));
        }
        return Ok(rec);
    }
    // What its cgroups measured, before the sweep removes them: the lost job's last usage.
    if !stale_boot {
        crate::state::store::live_usage(&mut rec);
    }
    let sweep = (!stale_boot).then(|| {
        crate::os::sweep::sweep_job_with(
            id.as_str(),
            rec.cgroup.as_deref().map(Path::new),
            &rec.cgroups_v1,
        )
    });
    // Whoever still holds the folder's lock is a process of the job (or a reader of an
    // older version): named, ended or not.
    let holders = if held {
        Vec::new()
    } else {
        let me = std::process::id() as i32;
        crate::os::proc::flock_holders(&store.job_dir(id))
            .into_iter()
            .filter(|&p| p != me)
            .collect()
    };
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
            describe(&sw, &holders)
        ),
        Some(sw) => format!("{LOST_SUPERVISOR}; {}", describe(&sw, &holders)),
    });
    rec.ended_at = Some(crate::text::timefmt::now());
    rec.output_bytes = store.output_size(id);
    store
        .write_record(&rec)
        .map_err(|e| Error::io(format!("recording job {id} as lost"), e))?;
    crate::state::events::record(store.root(), crate::state::events::LOST, &rec);
    // Readers waiting on it find the record final; a later one makes a new one.
    let _ = fs::remove_file(store.job_dir(id).join(SETTLE_LOCK));
    drop(guard);
    Ok(rec)
}

/// Takes the readers' lock of job `id`, waiting at most `wait`; `None` if another reader
/// (or whatever holds it) kept it that long, or it cannot be made.
fn settle_lock(store: &Store, id: &JobId, wait: Duration) -> Option<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(store.job_dir(id).join(SETTLE_LOCK))
        .ok()?;
    let deadline = Instant::now() + wait;
    loop {
        match f.try_lock() {
            Ok(()) => return Some(f),
            Err(fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => return None,
        }
    }
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
            Some(match load_listed(store, &id) {
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
    if let Ok(dir) = fs::read_dir(store.root().join(IDEMPOTENCY_DIR)) {
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
