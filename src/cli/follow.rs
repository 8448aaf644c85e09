//! Waiting on a job (until it ends or a deadline passes), and streaming its output.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::job::launch;
use crate::model::error::Result;
use crate::model::{JobId, JobRecord};
use crate::state::store::Store;

/// How a waiting command learns that a job changed.
pub enum Waiter {
    /// The change channel of a job this process started.
    Events(launch::JobEvents),
    /// Watching the job's folder.
    Files(Option<crate::os::watch::Watcher>),
}

impl Waiter {
    pub fn files(store: &Store, id: &JobId) -> Waiter {
        Waiter::Files(crate::os::watch::Watcher::new(&store.job_dir(id)))
    }

    fn wait(&mut self, d: Duration) {
        match self {
            Waiter::Events(e) => {
                e.wait(d);
            }
            Waiter::Files(w) => crate::os::watch::nap(w.as_ref(), d),
        }
    }
}

pub fn wait_end(
    store: &Store,
    id: &JobId,
    deadline: Option<Instant>,
    interrupted: &AtomicBool,
    waiter: &mut Waiter,
) -> Result<JobRecord> {
    let mut cancel_sent = false;
    loop {
        let rec = crate::job::settle::load(store, id)?;
        let now = Instant::now();
        if rec.status.is_final() || deadline.is_some_and(|d| now >= d) {
            return Ok(rec);
        }
        if interrupted.load(Ordering::Relaxed) && !cancel_sent {
            cancel_sent = true;
            request_cancel(&rec);
        }
        let nap = deadline.map_or(Duration::from_millis(250), |d| {
            (d - now).min(Duration::from_millis(250))
        });
        waiter.wait(nap);
    }
}

fn request_cancel(rec: &JobRecord) {
    if let (Some(pid), Some(start)) = (rec.supervisor_pid, rec.supervisor_start) {
        crate::os::proc::signal_verified(pid, start, nix::sys::signal::Signal::SIGUSR1);
    }
}

/// Prints output from `*off`; with `follow`, keeps going until the job has ended and all
/// its output is printed (or `deadline` passes). Returns true if stdout was closed.
pub fn follow_output(
    store: &Store,
    id: &JobId,
    off: &mut u64,
    follow: bool,
    deadline: Option<Instant>,
    interrupted: &AtomicBool,
    waiter: &mut Waiter,
) -> Result<bool> {
    let mut stdout = std::io::stdout().lock();
    let mut cancel_sent = false;
    loop {
        // Read the record before the output: if it says "ended", all output is on disk.
        let rec = crate::job::settle::load(store, id)?;
        loop {
            let page = store.read_page(id, *off, crate::state::layout::MAX_PAGE)?;
            if !page.data.is_empty() && stdout.write_all(page.data.as_bytes()).is_err() {
                return Ok(true); // reader went away (e.g. `| head`)
            }
            *off = page.next_offset;
            if page.eof {
                break;
            }
        }
        let _ = stdout.flush();
        if !follow || rec.status.is_final() || deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(false);
        }
        if interrupted.load(Ordering::Relaxed) && !cancel_sent {
            cancel_sent = true;
            request_cancel(&rec);
        }
        let nap = deadline.map_or(Duration::from_millis(250), |d| {
            d.saturating_duration_since(Instant::now())
                .min(Duration::from_millis(250))
        });
        waiter.wait(nap);
    }
}
