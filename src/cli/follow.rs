//! Waiting on a job until it ends (or a deadline passes), streaming its output meanwhile.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::job::launch;
use crate::model::error::Result;
use crate::model::{JobId, JobRecord};
use crate::state::store::Store;

/// The longest nap between two looks at a job.
const NAP: Duration = Duration::from_millis(250);

/// How a waiting command learns that a job changed.
pub enum Waiter {
    /// The change channel of a job this process started.
    Events(launch::JobEvents),
    /// Watching the job's folder (`None`: polling).
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

/// Waits until job `id` has ended or `deadline` passes; with `print`, prints its output
/// from that offset on as it comes (all of it, once the job has ended). Once `interrupted`
/// is set, asks the job's supervisor (once) to cancel it. Returns the last record read, or
/// `None` when stdout was closed.
pub fn watch(
    store: &Store,
    id: &JobId,
    mut print: Option<&mut u64>,
    deadline: Option<Instant>,
    interrupted: &AtomicBool,
    waiter: &mut Waiter,
) -> Result<Option<JobRecord>> {
    let mut cancel_sent = false;
    loop {
        // Read the record before the output: if it says "ended", all output is on disk.
        let rec = crate::job::settle::load(store, id)?;
        if let Some(off) = print.as_deref_mut()
            && !print_from(store, id, off)?
        {
            return Ok(None);
        }
        // Before the deadline check, so that even `--wait 0` cancels a job whose start
        // was interrupted.
        if interrupted.load(Ordering::Relaxed) && !cancel_sent && !rec.status.is_final() {
            cancel_sent = true;
            request_cancel(&rec);
        }
        if rec.status.is_final() || deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(Some(rec));
        }
        let nap = deadline.map_or(NAP, |d| {
            d.saturating_duration_since(Instant::now()).min(NAP)
        });
        waiter.wait(nap);
    }
}

/// Prints the output from `*off` to its current end and moves `*off` past it; false when
/// stdout is closed (e.g. `| head`).
fn print_from(store: &Store, id: &JobId, off: &mut u64) -> Result<bool> {
    let mut stdout = std::io::stdout().lock();
    loop {
        let page = store.read_page(id, *off, crate::state::layout::MAX_PAGE)?;
        if !page.data.is_empty() && stdout.write_all(page.data.as_bytes()).is_err() {
            return Ok(false);
        }
        *off = page.next_offset;
        if page.eof {
            return Ok(stdout.flush().is_ok());
        }
    }
}

fn request_cancel(rec: &JobRecord) {
    if let (Some(pid), Some(start)) = (rec.supervisor_pid, rec.supervisor_start) {
        crate::os::pidfd::signal_verified(pid, start, nix::sys::signal::Signal::SIGUSR1);
    }
}
