//! What `serve` runs besides answering requests: the settle and prune of jobs, the
//! journal's compaction, the watchdog that continues stopped supervisors, and (as PID 1)
//! the reaper of orphans.

use std::time::Duration;

use crate::api::log;
use crate::state::store::Store;

/// Settles every record at start (a resumed sandbox's `running` jobs become `lost` at
/// once, not on first read), then prunes ended jobs now and every ten minutes.
pub(super) fn start_housekeeping(
    store: Store,
    keep_jobs: usize,
    keep_events: usize,
    keep_for: Duration,
) {
    // Every second: a job that stopped its supervisor while nobody reads it still ends at
    // its timeout (the supervisor is continued and finds the deadline passed); and what
    // the allocator holds free after a burst of requests goes back to the kernel.
    let watched = store.clone();
    let _ = std::thread::Builder::new()
        .name("watchdog".into())
        .stack_size(256 << 10)
        .spawn(move || {
            loop {
                let n = crate::job::settle::nudge_running(&watched);
                if n > 0 {
                    log(serde_json::json!({"event": "continued", "supervisors": n}));
                }
                crate::os::alloc::trim();
                std::thread::sleep(Duration::from_secs(1));
            }
        });
    let _ = std::thread::Builder::new()
        .name("housekeeping".into())
        .stack_size(256 << 10)
        .spawn(move || {
            let settled = crate::job::settle::list(&store).len();
            log(serde_json::json!({"event": "rescan", "jobs": settled}));
            loop {
                let journal = crate::state::events::Journal::open(store.root());
                let compacted = journal.compact(keep_events, keep_for);
                if compacted > 0 {
                    log(serde_json::json!({"event": "compact", "segments": compacted}));
                }
                let removed = crate::job::settle::prune(&store, keep_jobs, keep_for);
                if !removed.is_empty() {
                    log(serde_json::json!({"event": "prune", "removed": removed.len()}));
                }
                std::thread::sleep(Duration::from_secs(600));
            }
        });
}

/// Lowers the connection cap to what the open-file limit allows (one fd per connection,
/// with room left for starting jobs), so the cap answers 429 before accept() fails. The
/// limit itself is not raised: jobs inherit it, and some programs dislike a huge one.
pub(super) fn within_fd_limit(want: usize) -> usize {
    use nix::sys::resource::{Resource, getrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, _)) => want.min((soft as usize).saturating_sub(128).max(16)),
        Err(_) => want,
    }
}

/// As PID 1 (a container's init), orphans are re-parented to us and must be reaped, or
/// they stay zombies. The launcher tolerates this reaper taking its intermediate child's
/// status.
pub(super) fn start_reaper() {
    use nix::sys::wait::{WaitPidFlag, waitpid};
    let _ = std::thread::Builder::new()
        .name("reaper".into())
        .stack_size(64 << 10)
        .spawn(|| {
            loop {
                match waitpid(nix::unistd::Pid::from_raw(-1), Some(WaitPidFlag::__WALL)) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    // No children right now: look again shortly.
                    Err(_) => std::thread::sleep(Duration::from_millis(200)),
                }
            }
        });
}
