//! One inotify instance for every long-poll on a job, however many wait.
//!
//! A watcher per waiting request would hit the per-user limit on inotify instances (128 by
//! default) long before 200 clients wait at once. Here each job folder is watched once,
//! however many requests wait on it, and a reader thread bumps per-job counters that
//! waiters sleep on. Two counters, so that a request waiting for a job's end is not woken by
//! every write to its output. Where inotify is unavailable, waiters nap briefly instead.
//!
//! It is not the agent's only instance, but the others do not grow with the waiting
//! requests: the server holds one more for the events journal ([`crate::api::journal`]), each
//! supervisor one on the running jobs' secrets (`crate::state::livesecrets`), and a CLI
//! command that follows a job one on its folder.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

use crate::model::JobId;

/// Which changes a waiter cares about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The record (and anything else in the folder but the output).
    Record,
    /// The output grew.
    Output,
    /// Either.
    Any,
}

/// Change counters of one job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    record: u64,
    output: u64,
}

impl Marks {
    fn get(&self, kind: Kind) -> u64 {
        match kind {
            Kind::Record => self.record,
            Kind::Output => self.output,
            Kind::Any => self.record + self.output,
        }
    }
}

struct Entry {
    wd: Option<WatchDescriptor>,
    users: usize,
    marks: Marks,
}

#[derive(Default)]
struct Inner {
    jobs: HashMap<JobId, Entry>,
    by_wd: HashMap<WatchDescriptor, JobId>,
    stopping: bool,
}

/// The shared watcher.
pub struct Hub {
    ino: Option<Inotify>,
    inner: Mutex<Inner>,
    cond: Condvar,
}

/// Keeps a job folder watched while a request waits on it. It holds the hub, so it may
/// outlive its handler (a followed log is streamed after the handler returned).
pub struct Watch {
    hub: Arc<Hub>,
    id: JobId,
}

/// How long a waiter sleeps between checks when nothing wakes it: a supervisor killed by
/// SIGKILL changes nothing in the folder, so the record is re-read at least this often.
pub const RECHECK: Duration = Duration::from_millis(500);
const NAP_WITHOUT_INOTIFY: Duration = Duration::from_millis(100);

impl Hub {
    /// Starts the hub and its reader thread.
    pub fn start() -> Arc<Hub> {
        let ino = Inotify::init(InitFlags::IN_CLOEXEC).ok();
        let hub = Arc::new(Hub {
            ino,
            inner: Mutex::new(Inner::default()),
            cond: Condvar::new(),
        });
        if hub.ino.is_some() {
            let h = Arc::clone(&hub);
            // Should the reader fail to start, waiters still re-check every RECHECK.
            let _ = std::thread::Builder::new()
                .name("inotify".into())
                .stack_size(256 << 10)
                .spawn(move || h.read_loop());
        }
        hub
    }

    fn read_loop(&self) {
        let Some(ino) = &self.ino else { return };
        loop {
            let events = match ino.read_events() {
                Ok(e) => e,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            for ev in events {
                let Some(id) = inner.by_wd.get(&ev.wd).cloned() else {
                    continue;
                };
                if ev.mask.contains(AddWatchFlags::IN_IGNORED) {
                    // The folder is gone (pruned); the kernel dropped the watch.
                    inner.by_wd.remove(&ev.wd);
                    if let Some(e) = inner.jobs.get_mut(&id) {
                        e.wd = None;
                        e.marks.record += 1;
                    }
                    continue;
                }
                let output = ev
                    .name
                    .as_deref()
                    .is_some_and(|n| n == crate::state::layout::OUTPUT)
                    && ev.mask.contains(AddWatchFlags::IN_MODIFY);
                if let Some(e) = inner.jobs.get_mut(&id) {
                    if output {
                        e.marks.output += 1;
                    } else {
                        e.marks.record += 1;
                    }
                }
            }
            drop(inner);
            self.cond.notify_all();
        }
    }

    /// Watches a job folder until the returned guard is dropped.
    pub fn watch(self: &Arc<Self>, dir: &Path, id: &JobId) -> Watch {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let entry = inner.jobs.entry(id.clone()).or_insert(Entry {
            wd: None,
            users: 0,
            marks: Marks::default(),
        });
        entry.users += 1;
        if entry.wd.is_none()
            && let Some(ino) = &self.ino
            && let Ok(wd) = ino.add_watch(
                dir,
                AddWatchFlags::IN_MODIFY
                    | AddWatchFlags::IN_MOVED_TO
                    | AddWatchFlags::IN_CREATE
                    | AddWatchFlags::IN_DELETE_SELF
                    // The supervisor's lock file is closed when it exits, even by SIGKILL.
                    | AddWatchFlags::IN_CLOSE_WRITE,
            )
        {
            entry.wd = Some(wd);
            inner.by_wd.insert(wd, id.clone());
        }
        Watch {
            hub: Arc::clone(self),
            id: id.clone(),
        }
    }

    /// Wakes every waiter for good: the server is stopping, and long-polls answer with
    /// what they have.
    pub fn stop(&self) {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stopping = true;
        self.cond.notify_all();
    }

    /// True once [`Hub::stop`] was called.
    pub fn stopping(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stopping
    }
}

impl Watch {
    /// The current counters; take them before reading the state they guard, so that a
    /// change in between is not missed.
    pub fn marks(&self) -> Marks {
        let inner = self.hub.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .jobs
            .get(&self.id)
            .map(|e| e.marks)
            .unwrap_or_default()
    }

    /// Sleeps until the `kind` counter moves past `seen`, the server stops, `deadline`
    /// passes or [`RECHECK`] elapses, whichever is first.
    pub fn wait(&self, seen: Marks, kind: Kind, deadline: Instant) {
        let now = Instant::now();
        let until = deadline.min(now + RECHECK);
        let mut inner = self.hub.inner.lock().unwrap_or_else(|e| e.into_inner());
        let watched = inner.jobs.get(&self.id).is_some_and(|e| e.wd.is_some());
        if !watched {
            drop(inner);
            std::thread::sleep(
                until
                    .saturating_duration_since(now)
                    .min(NAP_WITHOUT_INOTIFY),
            );
            return;
        }
        loop {
            let moved = inner
                .jobs
                .get(&self.id)
                .is_none_or(|e| e.marks.get(kind) != seen.get(kind) || e.wd.is_none());
            let now = Instant::now();
            if moved || inner.stopping || now >= until {
                return;
            }
            inner = self
                .hub
                .cond
                .wait_timeout(inner, until - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut inner = self.hub.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(e) = inner.jobs.get_mut(&self.id) else {
            return;
        };
        e.users -= 1;
        if e.users > 0 {
            return;
        }
        let wd = e.wd;
        inner.jobs.remove(&self.id);
        if let Some(wd) = wd {
            inner.by_wd.remove(&wd);
            if let Some(ino) = &self.hub.ino {
                let _ = ino.rm_watch(wd);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakes_on_record_and_output_changes_separately() {
        let d = tempfile::tempdir().unwrap();
        let hub = Hub::start();
        let id = JobId::parse("job_0123456789abcdef0123").unwrap();
        let w = hub.watch(d.path(), &id);
        let w2 = hub.watch(d.path(), &id);
        let seen = w.marks();
        std::fs::write(d.path().join(crate::state::layout::OUTPUT), b"x").unwrap();
        let far = Instant::now() + Duration::from_secs(30);
        let t = Instant::now();
        w.wait(seen, Kind::Output, far);
        assert!(t.elapsed() < RECHECK * 4);
        assert_ne!(w.marks().get(Kind::Output), seen.get(Kind::Output));
        let seen = w2.marks();
        crate::state::fsutil::write_atomic(&d.path().join("job.json"), b"{}", 0o600).unwrap();
        w2.wait(seen, Kind::Record, far);
        drop(w);
        drop(w2);
        assert!(hub.inner.lock().unwrap().jobs.is_empty());
        assert!(hub.inner.lock().unwrap().by_wd.is_empty());
    }
}
