//! The line a job is writing and has not ended (a prompt, a progress bar's frame), kept in
//! the job's folder for every answer about the job to carry as `pending`.

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::text::pipeline::Pipeline;

/// The least time between two writes of the file: a progress bar redrawn a thousand times
/// a second costs two hundred renames (a few milliseconds of CPU), the first change after
/// a quiet spell is written at once, and a prompt right after another waits at most this.
const MIN_GAP: Duration = Duration::from_millis(5);

/// The `pending` file of one job.
pub(super) struct PendingLine {
    path: PathBuf,
    tmp: PathBuf,
    /// What the file says now.
    shown: Vec<u8>,
    last: Option<Instant>,
    /// Output came since the last look.
    dirty: bool,
    /// A file was ever written: else the end has nothing to remove (two unlinks less on
    /// the path of every job that ends with no line pending).
    written: bool,
}

impl PendingLine {
    /// The file in the job's folder `dir` (none is there yet).
    pub(super) fn new(dir: &std::path::Path) -> Self {
        PendingLine {
            path: dir.join(crate::state::layout::PENDING),
            tmp: dir.join(crate::state::layout::PENDING_TMP),
            shown: Vec::new(),
            last: None,
            dirty: false,
            written: false,
        }
    }

    /// Output arrived: the line may have changed.
    pub(super) fn touched(&mut self) {
        self.dirty = true;
    }

    /// When the file is next due to be brought up to date.
    pub(super) fn due(&self) -> Option<Instant> {
        self.dirty
            .then(|| self.last.map_or_else(Instant::now, |l| l + MIN_GAP))
    }

    /// Brings the file up to date if it is due: replaced whole (written beside, renamed),
    /// so a reader sees the old line or the new, and removed when no line is pending.
    pub(super) fn update(&mut self, pipeline: &Pipeline) {
        let now = Instant::now();
        if !self.dirty || self.last.is_some_and(|l| now < l + MIN_GAP) {
            return;
        }
        self.dirty = false;
        self.last = Some(now);
        let line = pipeline.pending();
        if line == self.shown {
            return;
        }
        let done = if line.is_empty() {
            fs::remove_file(&self.path)
        } else {
            self.written = true;
            fs::write(&self.tmp, &line).and_then(|()| fs::rename(&self.tmp, &self.path))
        };
        // A full disk leaves the answer without the line, never the job stuck.
        if done.is_ok() {
            self.shown = line;
        }
    }

    /// The job ended: its last line is stored in output.log now.
    pub(super) fn remove(&mut self) {
        if self.written {
            let _ = fs::remove_file(&self.path);
            let _ = fs::remove_file(&self.tmp);
        }
        self.shown.clear();
        self.dirty = false;
    }
}
