//! The server's view of the events journal: one inotify watch on its folder wakes every
//! reader waiting for the next event (each reads the journal at its own offset, so a slow
//! one holds up nobody), and the job counters of `GET /v1/metrics` are kept from the
//! journal (rebuilt from what is kept when the server starts): read on by each scrape,
//! and by the watching thread at most once a second.
//! Also the server's own request counters. A scrape reads these and two `/proc` files;
//! it never scans the job folders.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use crate::state::events::{self, Journal};

/// How long a waiter sleeps at most before looking at the journal again (should inotify
/// miss something, or be unavailable).
const RECHECK: Duration = Duration::from_millis(500);

/// How often at most the follower thread reads the journal for the job counters.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// Upper bounds of the request duration histogram, in seconds.
pub const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
];

/// Job counters taken from the journal.
#[derive(Debug, Clone, Default)]
pub struct JobCounts {
    pub started: u64,
    /// Ended jobs by status (`lost` included).
    pub ended: BTreeMap<String, u64>,
    /// Output bytes stored by the jobs that ended.
    pub output_bytes: u64,
    /// Secret occurrences masked in the output of the jobs that ended.
    pub redactions: u64,
    /// CPU seconds used by the jobs that ended.
    pub cpu_seconds: f64,
    /// Jobs that ended with an OOM kill.
    pub oom_kills: u64,
}

/// Requests of one route: by status code, and their durations.
#[derive(Debug, Clone, Default)]
pub struct RouteStats {
    pub codes: BTreeMap<u16, u64>,
    /// Counts per bucket of [`BUCKETS`] (not cumulative), then the overflow.
    pub buckets: [u64; BUCKETS.len() + 1],
    pub sum: f64,
    pub count: u64,
}

#[derive(Default)]
struct Inner {
    /// Bumped whenever the journal's folder changes.
    seq: u64,
    jobs: JobCounts,
    /// Where the follower has read to.
    tail: u64,
    http: BTreeMap<&'static str, RouteStats>,
}

/// The shared feed.
pub struct Feed {
    pub journal: Journal,
    inner: Mutex<Inner>,
    cond: Condvar,
    /// One follower at a time, so that nothing is counted twice.
    following: Mutex<()>,
}

impl Feed {
    /// Watches the journal under `root` and starts following it.
    pub fn start(root: &Path) -> Arc<Feed> {
        let journal = Journal::open(root);
        let _ = crate::state::fsutil::ensure_private_dir(journal.dir());
        let feed = Arc::new(Feed {
            inner: Mutex::new(Inner {
                tail: journal.start(),
                ..Default::default()
            }),
            journal,
            cond: Condvar::new(),
            following: Mutex::new(()),
        });
        feed.follow();
        let ino = Inotify::init(InitFlags::IN_CLOEXEC).ok().filter(|i| {
            i.add_watch(
                feed.journal.dir(),
                AddWatchFlags::IN_MODIFY | AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO,
            )
            .is_ok()
        });
        let f = Arc::clone(&feed);
        let _ = std::thread::Builder::new()
            .name("events".into())
            .stack_size(256 << 10)
            .spawn(move || {
                let mut last_follow = Instant::now();
                loop {
                    match &ino {
                        Some(i) => match i.read_events() {
                            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                            Err(_) => std::thread::sleep(RECHECK),
                        },
                        None => std::thread::sleep(Duration::from_millis(100)),
                    }
                    f.lock().seq += 1;
                    f.cond.notify_all();
                    // The counters are brought up to date by every scrape; here only often
                    // enough that a scrape never has much to read. Reading the journal on
                    // each of a job's two events would take a core from the next job.
                    if last_follow.elapsed() >= FOLLOW_EVERY {
                        f.follow();
                        last_follow = Instant::now();
                    }
                }
            });
        feed
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts what was appended since the last look.
    pub fn follow(&self) {
        let _one = self.following.lock().unwrap_or_else(|e| e.into_inner());
        let mut tail = self.lock().tail;
        loop {
            let page = match self.journal.read(tail, 10_000, None) {
                Ok(p) => p,
                // Compacted past us: go on from what is kept.
                Err(_) => match self.journal.read(self.journal.start(), 10_000, None) {
                    Ok(p) => p,
                    Err(_) => return,
                },
            };
            let mut inner = self.lock();
            for e in &page.events {
                match e.event.kind.as_str() {
                    events::STARTED => inner.jobs.started += 1,
                    _ => {
                        *inner.jobs.ended.entry(e.event.status.clone()).or_default() += 1;
                        inner.jobs.output_bytes += e.event.output_bytes.unwrap_or(0);
                        inner.jobs.redactions += e.event.redactions.unwrap_or(0);
                        inner.jobs.cpu_seconds += e.event.cpu_seconds.unwrap_or(0.0);
                        inner.jobs.oom_kills += u64::from(e.event.oom_killed);
                    }
                }
            }
            let moved = page.next != tail;
            inner.tail = page.next;
            tail = page.next;
            if !moved {
                return;
            }
        }
    }

    /// The change counter; take it before reading the journal, then [`Feed::wait`] on it.
    pub fn seq(&self) -> u64 {
        self.lock().seq
    }

    /// Sleeps until the journal's folder changes after `seen`, `deadline` passes or
    /// [`RECHECK`] elapses.
    pub fn wait(&self, seen: u64, deadline: Instant) {
        let until = deadline.min(Instant::now() + RECHECK);
        let mut inner = self.lock();
        while inner.seq == seen {
            let now = Instant::now();
            if now >= until {
                return;
            }
            inner = self
                .cond
                .wait_timeout(inner, until - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Counts one answered request.
    pub fn request(&self, route: &'static str, status: u16, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        let mut inner = self.lock();
        let r = inner.http.entry(route).or_default();
        *r.codes.entry(status).or_default() += 1;
        let i = BUCKETS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(BUCKETS.len());
        r.buckets[i] += 1;
        r.sum += secs;
        r.count += 1;
    }

    /// The counters now.
    pub fn snapshot(&self) -> (JobCounts, BTreeMap<&'static str, RouteStats>) {
        let inner = self.lock();
        (inner.jobs.clone(), inner.http.clone())
    }
}
