//! A job's standard error kept apart (`separateStderr`): its own pipe, read beside the
//! output pipe; every byte goes to output.log as before (both streams, in the order the
//! reads got them) and through a pipeline of its own into stderr.log.

use std::fs::{File, OpenOptions};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::sink::Output;
use crate::text::pipeline::Pipeline;

/// The stderr pipe's reading end, its pipeline and stderr.log.
pub(super) struct Stderr {
    pub(super) pipe: Option<OwnedFd>,
    pipeline: Pipeline,
    out: Output,
}

impl Stderr {
    /// stderr.log in the job's (staging) folder, for the pipe's reading end `pipe`.
    pub(super) fn open(
        dir: &Path,
        pipe: OwnedFd,
        secrets: &[&[u8]],
        cap: u64,
    ) -> Result<Stderr, String> {
        let file: File = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(dir.join(crate::state::layout::STDERR))
            .map_err(|e| format!("stderr.log: {e}"))?;
        Ok(Stderr {
            pipe: Some(pipe),
            pipeline: Pipeline::new(secrets),
            out: Output::new(file, cap),
        })
    }

    /// Sanitizes, redacts and stores what the job wrote to stderr.
    pub(super) fn feed(&mut self, data: &[u8]) {
        let mut chunk = std::mem::take(&mut self.out.spare);
        chunk.clear();
        self.pipeline.feed(data, &mut chunk);
        self.out.store(&chunk);
        self.out.spare = chunk;
    }

    /// Secrets learnt from other jobs while this one runs.
    pub(super) fn add_secrets(&mut self, values: &[&[u8]]) {
        self.pipeline.add_secrets(values);
    }

    /// Stores the last line, once the job is gone; returns the bytes stored.
    pub(super) fn finish(&mut self) -> u64 {
        let mut tail = Vec::new();
        self.pipeline.finish(&mut tail);
        self.out.store(&tail);
        self.out.written
    }
}
