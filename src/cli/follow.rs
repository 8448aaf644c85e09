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
/// from that offset on as it comes (all of it, once the job has ended). `first` is a
/// settled record just read (the start's), used for the first look instead of reading
/// it again. Once `interrupted` is set, asks the job's supervisor (once) to cancel it.
/// Returns the last record read, or `None` when stdout was closed.
pub fn watch(
    store: &Store,
    id: &JobId,
    mut first: Option<JobRecord>,
    mut print: Option<&mut u64>,
    deadline: Option<Instant>,
    interrupted: &AtomicBool,
    waiter: &mut Waiter,
) -> Result<Option<JobRecord>> {
    let mut cancel_sent = false;
    loop {
        // Read the record before the output: if it says "ended", all output is on disk.
        let rec = match first.take() {
            Some(rec) => rec,
            None => crate::job::settle::settle_and_load(store, id)?,
        };
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
/// stdout is closed (e.g. `| head`). The stored output is whole UTF-8, written a chunk at
/// a time, so it is copied as it is, in large blocks, at disk speed.
fn print_from(store: &Store, id: &JobId, off: &mut u64) -> Result<bool> {
    use std::io::{Read, Seek, SeekFrom};
    let path = store.job_dir(id).join(crate::state::layout::OUTPUT);
    let mut f = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(crate::model::error::Error::io("output.log", e)),
    };
    let io = |e| crate::model::error::Error::io("output.log", e);
    let len = f.metadata().map_err(io)?.len();
    if *off > len {
        return Err(crate::model::error::Error::Invalid(format!(
            "offset {} is past the end of the output ({len} bytes)",
            *off
        )));
    }
    if *off == len {
        return Ok(true);
    }
    f.seek(SeekFrom::Start(*off)).map_err(io)?;
    let mut stdout = std::io::stdout().lock();
    // Large blocks for a large log; no more than it holds for a short one.
    let mut buf = vec![0u8; (len - *off).clamp(64 << 10, 1 << 20) as usize];
    // An offset given in the middle of a character starts at the next one.
    let mut first = *off > 0;
    loop {
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            return Ok(stdout.flush().is_ok());
        }
        let skip = if first {
            crate::text::utf8::leading_continuations(&buf[..n])
        } else {
            0
        };
        first = false;
        if stdout.write_all(&buf[skip..n]).is_err() {
            return Ok(false);
        }
        *off += n as u64;
    }
}

fn request_cancel(rec: &JobRecord) {
    if let (Some(pid), Some(start)) = (rec.supervisor_pid, rec.supervisor_start) {
        crate::os::pidfd::signal_verified(pid, start, nix::sys::signal::Signal::SIGUSR1);
    }
}
