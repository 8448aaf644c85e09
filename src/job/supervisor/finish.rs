//! The job's end: the final record, and what is left to clean.

use std::fs::{self};
use std::time::Duration;

use nix::sys::wait::WaitStatus;

use crate::model::Status;
use crate::os::proc::{self};

use super::sink::Sink;
use super::{End, Supervisor};
use crate::state::layout::FINAL_RECORD;

/// The signals requests sent to the job, as `(SIGNAL, TARGET)` (see
/// [`crate::state::layout::SIGNALS`]).
fn read_signal_requests(dir: &std::path::Path) -> Vec<(String, String)> {
    fs::read_to_string(dir.join(crate::state::layout::SIGNALS))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (s, t) = l.split_once(' ')?;
            Some((s.to_string(), t.to_string()))
        })
        .collect()
}

/// What the kernel counted for every process of the job this supervisor reaped (it is
/// their subreaper, so that is all of them): CPU time, the largest single process's
/// peak resident memory (not the sum), and block I/O in 512-byte units.
fn children_usage() -> crate::model::resources::Usage {
    use nix::sys::resource::{UsageWho, getrusage};
    let Ok(r) = getrusage(UsageWho::RUSAGE_CHILDREN) else {
        return Default::default();
    };
    let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    crate::model::resources::Usage {
        cpu_seconds: Some(secs(r.user_time()) + secs(r.system_time())),
        memory_peak_bytes: Some(r.max_rss() as u64 * 1024),
        io_read_bytes: Some(r.block_reads() as u64 * 512),
        io_write_bytes: Some(r.block_writes() as u64 * 512),
    }
}

impl Supervisor {
    pub(super) fn finish(&mut self, shell: Option<WaitStatus>, end: End) {
        let dir = self.store.job_dir(&self.id);
        // output.log is not fsynced: a crash of any process loses nothing (the page cache
        // has it), and a flush of a large log at every job's end would dominate the cost of
        // capture. The record, which says how the job ended, is durable.
        let (written, dropped, write_error) = match &self.sink {
            Sink::Inline(st) => (st.written, st.dropped, st.write_error.clone()),
            // The writer thread died: what it stored is on disk, the rest is unknown.
            _ => (
                fs::metadata(dir.join(crate::state::layout::OUTPUT))
                    .map(|m| m.len())
                    .unwrap_or(0),
                1,
                Some("the output writer failed; later output was not stored".to_string()),
            ),
        };
        let (code, signal) = match shell {
            Some(WaitStatus::Exited(_, c)) => (Some(c), None),
            Some(WaitStatus::Signaled(_, s, _)) => (None, Some(s.as_str().to_string())),
            _ => (None, None),
        };
        let session_note = self.end_session(shell, end);
        let rec = &mut self.rec;
        rec.exit_code = code;
        rec.signal = signal;
        rec.status = match end {
            End::Cancel => Status::Cancelled,
            End::Timeout | End::Idle => Status::TimedOut,
            End::Stopped(_) => Status::Cancelled,
            End::ShellExited if code == Some(0) => Status::Succeeded,
            End::ShellExited => Status::Failed,
        };
        let mut reasons: Vec<String> = Vec::new();
        match end {
            End::Timeout => {
                reasons.push(format!("timed out after {} s", self.spec.timeout_seconds))
            }
            End::Idle => reasons.push(format!(
                "no output for {} s (idle timeout)",
                self.spec.idle_timeout_seconds.unwrap_or_default()
            )),
            End::Cancel => reasons.push("cancelled".into()),
            End::Stopped(s) => {
                reasons.push(format!("the supervisor received {}", proc::signal_name(s)))
            }
            End::ShellExited => {}
        }
        reasons.extend(session_note);
        // Who ended it: a signal a request sent (its kind and target are on record).
        let requests = read_signal_requests(&dir);
        if let (End::ShellExited, Some(sig)) = (end, rec.signal.as_deref())
            && let Some(target) = requests
                .iter()
                .rev()
                .find_map(|(s, t)| (s == sig).then_some(t))
        {
            reasons.push(format!(
                "ended by {sig}, sent to {} by a signal request (POST /v1/jobs/{}/signal)",
                match target.as_str() {
                    "all" => "every process of the job",
                    _ => "the job's process group",
                },
                self.id
            ));
        }
        let requested_kill = requests.iter().any(|(s, _)| s == "SIGKILL");
        if let Some(v) = self.oom.verdict(
            self.cgroup.as_ref(),
            self.spec.limits.as_ref(),
            requested_kill,
        ) {
            rec.oom_killed = true;
            reasons.insert(0, v.reason);
        }
        rec.usage = self
            .cgroup
            .as_ref()
            .map(|c| c.usage())
            .unwrap_or_default()
            .or(children_usage());
        if dropped > 0 {
            rec.output_truncated = true;
            rec.output_dropped_bytes = dropped;
            reasons.push(match &write_error {
                Some(e) => e.clone(),
                None => format!("output cap of {} bytes reached", self.spec.max_output_bytes),
            });
        }
        rec.reason = (!reasons.is_empty()).then(|| reasons.join("; "));
        rec.output_bytes = written;
        rec.redactions = Some(self.pipeline.redactions()).filter(|&n| n > 0);
        rec.ended_at = Some(crate::text::timefmt::now());
        // Whoever sees the job ended finds no control socket either.
        if let Some(c) = &self.control {
            c.remove();
        }
        // Before the final record: whoever sees the job ended must not then be refused a
        // new start because this one still counts as running.
        let _ = fs::remove_file(self.store.running_marker(&self.id));
        // In place first, then the waiters are told (they read it from the page cache),
        // then it is made durable: the flush is off the caller's path, not skipped. The
        // file reserved at the start has room for it on a full disk; without it (or should
        // it fail), a new file, retried a few times.
        let mut unsynced = self
            .reserved
            .take()
            .and_then(|r| self.store.replace_record_reserved(r, rec).ok());
        if unsynced.is_none() {
            let _ = fs::remove_file(dir.join(FINAL_RECORD));
        }
        for attempt in 0..5 {
            if unsynced.is_some() {
                break;
            }
            if let Ok(u) = self.store.replace_record(rec) {
                unsynced = Some(u);
                break;
            }
            std::thread::sleep(Duration::from_millis(50 << attempt));
        }
        if unsynced.is_some() {
            crate::state::events::record(self.store.root(), crate::state::events::ENDED, rec);
        }
        self.sink.set_events(None);
        if let Some(u) = unsynced {
            let _ = u.sync();
        }
        if let Some(s) = &mut self.session {
            s.sync();
        }
        // Removing a cgroup can take milliseconds: only after the record is out.
        if let Some(cg) = &self.cgroup {
            cg.remove_when_empty(Duration::from_millis(500));
        }
    }
}
