//! The journal of job events: `<root>/events/<base>.log` segments, one JSON line per
//! event, appended by whoever makes the fact true (the supervisor that wrote a job's pid
//! record or its final record, the reader that settled a lost job).
//!
//! Every append takes `events/lock` (flock) and makes one `write` of one whole line to
//! the last segment, opened with `O_APPEND`: many writers never tear nor interleave
//! lines. A segment is named by the byte offset, counted over the whole journal, at which
//! it starts, so an offset names one place for as long as the journal lives: compaction
//! removes whole segments from the front and never rewrites what it keeps.
//!
//! A cursor is `<boot>-<offset>`: the kernel boot (shortened) under which it was handed
//! out and the offset just past its event. A cursor from another boot (a snapshot restore
//! copied the journal but not the processes, or a reboot), from before the oldest kept
//! segment, past the end, or not at a line's start is refused as [`Error::Gone`].
//!
//! Lines are not fsynced: a crash of any process loses none (the page cache has them),
//! a kernel crash may lose the last ones, as with `output.log`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::model::JobRecord;
use crate::model::error::{Error, Result};

/// A new segment is started once the last one holds this many bytes.
pub const SEGMENT_BYTES: u64 = 1 << 20;
/// Overrides [`SEGMENT_BYTES`] (tests use small segments to exercise compaction).
pub const SEGMENT_BYTES_ENV: &str = "GITTERM_EVENTS_SEGMENT_BYTES";
/// The most bytes one read scans.
const READ_BYTES: usize = 256 << 10;

/// The kinds of event.
pub const STARTED: &str = "job.started";
pub const ENDED: &str = "job.ended";
pub const LOST: &str = "job.lost";

/// One event as stored (its cursor is where it lies, added when read).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    #[serde(rename = "type")]
    pub kind: String,
    pub job_id: String,
    pub status: String,
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub at: String,
    /// Bytes of output stored, once the job has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
    /// Secret occurrences masked in its output, once the job has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redactions: Option<u64>,
    /// CPU seconds the job used, once it has ended (where measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    /// True when the kernel's OOM killer ended one of its processes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub oom_killed: bool,
}

impl Event {
    /// The event `kind` about a job as its record now says.
    pub fn of(kind: &str, rec: &JobRecord) -> Event {
        let ended = rec.status.is_final();
        Event {
            kind: kind.to_string(),
            job_id: rec.id.to_string(),
            status: rec.status.as_str().to_string(),
            exit_code: rec.exit_code,
            signal: rec.signal.clone(),
            at: match (ended, &rec.ended_at, &rec.started_at) {
                (true, Some(t), _) | (false, _, Some(t)) => t.clone(),
                _ => crate::text::timefmt::now(),
            },
            output_bytes: ended.then_some(rec.output_bytes),
            redactions: rec.redactions.filter(|_| ended),
            cpu_seconds: rec.usage.cpu_seconds.filter(|_| ended),
            oom_killed: rec.oom_killed && ended,
        }
    }
}

/// An event read back, with its cursor.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    pub cursor: String,
    pub offset: u64,
    pub event: Event,
}

impl Stored {
    /// The contract's JSON shape.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(&self.event).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.insert("cursor".into(), self.cursor.clone().into());
        }
        v
    }
}

/// A page of events and where to go on from.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub events: Vec<Stored>,
    pub next: u64,
}

/// The journal under a state root.
#[derive(Debug, Clone)]
pub struct Journal {
    dir: PathBuf,
    boot: String,
}

/// The short form of a boot id used in cursors.
pub fn boot_tag(boot_id: &str) -> String {
    let t: String = boot_id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    if t.is_empty() { "0".into() } else { t }
}

fn segment_name(base: u64) -> String {
    format!("{base:020}.log")
}

fn segment_bytes() -> u64 {
    std::env::var(SEGMENT_BYTES_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(SEGMENT_BYTES)
}

impl Journal {
    /// The journal under `root`, with cursors of this boot.
    pub fn open(root: &Path) -> Journal {
        Journal::with_boot(root, &crate::state::sandbox::boot_id())
    }

    /// The journal under `root` with cursors of the given boot (tests fake boots).
    pub fn with_boot(root: &Path, boot_id: &str) -> Journal {
        Journal {
            dir: root.join(crate::state::layout::EVENTS_DIR),
            boot: boot_tag(boot_id),
        }
    }

    /// The journal's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The segments' starting offsets, oldest first.
    fn segments(&self) -> Vec<u64> {
        segment_bases(&self.dir)
    }

    fn path(&self, base: u64) -> PathBuf {
        self.dir.join(segment_name(base))
    }

    /// Appends one event. Best effort for callers: the fact (the record) is already true.
    pub fn append(&self, ev: &Event) -> io::Result<()> {
        let mut line = serde_json::to_vec(ev).map_err(io::Error::other)?;
        line.push(b'\n');
        let open_lock = || {
            OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC)
                .open(self.dir.join("lock"))
        };
        // The folder is made by the first append (the state root above it is private).
        let lock = match open_lock() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                crate::state::fsutil::ensure_private_dir(&self.dir)?;
                open_lock()?
            }
            r => r?,
        };
        lock.lock()?;
        let segs = self.segments();
        let mut base = segs.last().copied().unwrap_or(0);
        let mut len = fs::metadata(self.path(base)).map(|m| m.len()).unwrap_or(0);
        if len >= segment_bytes() {
            base += len;
            len = 0;
        }
        // Readable too: the check below reads the last byte.
        let mut f = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(self.path(base))?;
        // A line cut short (a full disk) is ended, so that the next one stands alone.
        if len > 0 {
            let mut last = [0u8; 1];
            if f.read_at(&mut last, len - 1).is_ok() && last[0] != b'\n' {
                line.insert(0, b'\n');
            }
        }
        let r = f.write_all(&line);
        drop(lock);
        r
    }

    /// The offset just past the last whole event: where a reader that wants only what
    /// comes next starts.
    pub fn end(&self) -> u64 {
        let Some(&base) = self.segments().last() else {
            return 0;
        };
        base + fs::metadata(self.path(base)).map(|m| m.len()).unwrap_or(0)
    }

    /// The cursor naming `offset` in this boot.
    pub fn cursor(&self, offset: u64) -> String {
        format!("{}-{offset}", self.boot)
    }

    /// Parses a cursor of this journal: its offset, or [`Error::Gone`] if it names no
    /// place in what is kept under this boot, [`Error::Invalid`] if malformed.
    pub fn parse_cursor(&self, cursor: &str) -> Result<u64> {
        let gone = |why: &str| {
            Error::Gone(format!(
                "the events cursor {cursor:?} {why}; list the jobs (GET /v1/jobs gives an \
                 eventsCursor) and watch from there"
            ))
        };
        let (boot, off) = cursor
            .rsplit_once('-')
            .ok_or_else(|| Error::Invalid(format!("malformed events cursor {cursor:?}")))?;
        let off: u64 = off
            .parse()
            .map_err(|_| Error::Invalid(format!("malformed events cursor {cursor:?}")))?;
        if boot != self.boot {
            return Err(gone("is from another boot of the sandbox"));
        }
        let segs = self.segments();
        let first = segs.first().copied().unwrap_or(0);
        if off < first {
            return Err(gone("is older than the events kept"));
        }
        if off > self.end() {
            return Err(gone("is past the end of the journal"));
        }
        if off > first && !self.newline_before(&segs, off) {
            return Err(gone("does not name an event's place"));
        }
        Ok(off)
    }

    fn newline_before(&self, segs: &[u64], off: u64) -> bool {
        let Some(&base) = segs.iter().rev().find(|&&b| b < off) else {
            return false;
        };
        let mut b = [0u8; 1];
        File::open(self.path(base))
            .and_then(|f| f.read_exact_at(&mut b, off - base - 1))
            .is_ok_and(|()| b[0] == b'\n')
    }

    /// The oldest kept offset.
    pub fn start(&self) -> u64 {
        self.segments().first().copied().unwrap_or(0)
    }

    /// Up to `limit` events after `from` (an offset from [`Journal::parse_cursor`], or
    /// [`Journal::start`]), those of `job` only if given. `next` is where to go on from:
    /// past every line looked at, matching or not.
    pub fn read(&self, from: u64, limit: usize, job: Option<&str>) -> Result<Page> {
        let segs = self.segments();
        let mut pos = from;
        let mut events = Vec::new();
        let mut scanned = 0usize;
        let io_err = |e| Error::io(format!("reading {}", self.dir.display()), e);
        loop {
            let Some(idx) = segs.iter().rposition(|&b| b <= pos) else {
                if segs.first().is_some_and(|&f| pos < f) {
                    return Err(Error::Gone(
                        "the events asked for were compacted away; list the jobs and watch \
                         from their eventsCursor"
                            .into(),
                    ));
                }
                break;
            };
            let base = segs[idx];
            let mut f = match File::open(self.path(base)) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(Error::Gone(
                        "the events asked for were compacted away".into(),
                    ));
                }
                Err(e) => return Err(io_err(e)),
            };
            f.seek(SeekFrom::Start(pos - base)).map_err(io_err)?;
            let mut buf = Vec::new();
            f.take((READ_BYTES - scanned.min(READ_BYTES)) as u64)
                .read_to_end(&mut buf)
                .map_err(io_err)?;
            let mut used = 0;
            while let Some(nl) = buf[used..].iter().position(|&c| c == b'\n') {
                let line = &buf[used..used + nl];
                used += nl + 1;
                let end = pos + used as u64;
                if let Ok(event) = serde_json::from_slice::<Event>(line)
                    && job.is_none_or(|j| j == event.job_id)
                {
                    events.push(Stored {
                        cursor: self.cursor(end),
                        offset: end,
                        event,
                    });
                    if events.len() >= limit {
                        return Ok(Page { events, next: end });
                    }
                }
            }
            let want = READ_BYTES - scanned.min(READ_BYTES);
            let eof = buf.len() < want;
            pos += used as u64;
            scanned += used;
            match segs.get(idx + 1) {
                // Whatever is left of a segment that is no longer appended to is a line
                // cut short: skip it.
                Some(&next) if eof && scanned < READ_BYTES => {
                    pos = pos.max(next);
                }
                _ => break,
            }
        }
        Ok(Page { events, next: pos })
    }

    /// Removes old segments, whole: the oldest while the others still hold at least
    /// `keep_events` events, and any whose last append is older than `keep_for`. The
    /// segment being appended to is always kept. Returns how many were removed.
    pub fn compact(&self, keep_events: usize, keep_for: Duration) -> usize {
        let segs = self.segments();
        let Some((_, older)) = segs.split_last() else {
            return 0;
        };
        let lines = |b: u64| {
            fs::read(self.path(b))
                .map(|d| d.iter().filter(|&&c| c == b'\n').count())
                .unwrap_or(0)
        };
        let counts: Vec<usize> = segs.iter().map(|&b| lines(b)).collect();
        let mut total: usize = counts.iter().sum();
        let now = SystemTime::now();
        let mut removed = 0;
        for (i, &b) in older.iter().enumerate() {
            let old = fs::metadata(self.path(b))
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|a| a > keep_for);
            if (total - counts[i] >= keep_events || old) && fs::remove_file(self.path(b)).is_ok() {
                total -= counts[i];
                removed += 1;
            } else {
                break;
            }
        }
        removed
    }
}

/// Appends `kind` about `rec` to the journal under the store's root; a failure is only
/// reported (the record, which is the truth, is already in place).
pub fn record(root: &Path, kind: &str, rec: &JobRecord) {
    let _ = Journal::open(root).append(&Event::of(kind, rec));
}

/// The starting offsets of the segments (`<20 digits>.log`) in `dir`, oldest first: the
/// layout the job journal and each watch's journal share.
pub(super) fn segment_bases(dir: &Path) -> Vec<u64> {
    let mut v: Vec<u64> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name();
            let n = n.to_str()?.strip_suffix(".log")?;
            (n.len() == 20).then(|| n.parse().ok()).flatten()
        })
        .collect();
    v.sort_unstable();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(n: usize) -> Event {
        Event {
            kind: ENDED.into(),
            job_id: format!("job_{n:020}"),
            status: "succeeded".into(),
            exit_code: Some(0),
            signal: None,
            at: "2026-01-01T00:00:00Z".into(),
            output_bytes: Some(3),
            redactions: None,
            cpu_seconds: None,
            oom_killed: false,
        }
    }

    #[test]
    fn append_read_resume_and_compact() {
        let d = tempfile::tempdir().unwrap();
        let j = Journal::with_boot(d.path(), "boot-a");
        assert_eq!(j.end(), 0);
        assert_eq!(j.read(0, 10, None).unwrap().events, vec![]);
        for n in 0..5 {
            j.append(&ev(n)).unwrap();
        }
        let p = j.read(0, 2, None).unwrap();
        assert_eq!(p.events.len(), 2);
        assert_eq!(p.events[1].event, ev(1));
        let from = j.parse_cursor(&p.events[1].cursor).unwrap();
        assert_eq!(from, p.next);
        let rest = j.read(from, 100, None).unwrap();
        assert_eq!(rest.events.len(), 3);
        assert_eq!(rest.next, j.end());
        assert_eq!(j.read(rest.next, 100, None).unwrap().events, vec![]);
        let only = j.read(0, 100, Some(&ev(3).job_id)).unwrap();
        assert_eq!(only.events.len(), 1);
        assert_eq!(only.next, j.end());
        // Another boot's cursor, a cursor in the middle of a line, one past the end.
        let other = Journal::with_boot(d.path(), "boot-b");
        assert!(matches!(
            other.parse_cursor(&p.events[0].cursor),
            Err(Error::Gone(_))
        ));
        assert!(matches!(j.parse_cursor(&j.cursor(3)), Err(Error::Gone(_))));
        assert!(matches!(
            j.parse_cursor(&j.cursor(j.end() + 1)),
            Err(Error::Gone(_))
        ));
        assert!(matches!(j.parse_cursor("nope"), Err(Error::Invalid(_))));
        assert_eq!(j.compact(0, Duration::from_secs(60)), 0);
    }

    #[test]
    fn segments_rotate_and_compaction_keeps_offsets() {
        let d = tempfile::tempdir().unwrap();
        let j = Journal::with_boot(d.path(), "boot-a");
        // Segments of ~1 line each at this size.
        one_line_segments(&j, 60);
        let p = j.read(0, 1000, None).unwrap();
        assert_eq!(p.events.len(), 60);
        assert!(j.segments().len() > 2);
        let mid = p.events[40].cursor.clone();
        let removed = j.compact(30, Duration::from_secs(3600));
        assert!(removed > 0);
        let first = j.start();
        assert!(first > 0);
        assert!(matches!(j.parse_cursor(&j.cursor(0)), Err(Error::Gone(_))));
        let from = j.parse_cursor(&mid).unwrap();
        let rest = j.read(from, 1000, None).unwrap();
        assert_eq!(rest.events.len(), 19);
        assert_eq!(rest.events[0].event, ev(41));
        let kept = j.read(first, 1000, None).unwrap().events.len();
        assert_eq!(kept, 30);
    }

    /// A line cut short (a full disk, a crash mid-write) does not swallow the next event:
    /// the append ends it first, and readers skip the torn line.
    #[test]
    fn an_append_after_a_torn_line_stands_alone() {
        let d = tempfile::tempdir().unwrap();
        let j = Journal::with_boot(d.path(), "boot-a");
        j.append(&ev(0)).unwrap();
        let mut torn = serde_json::to_vec(&ev(1)).unwrap();
        torn.truncate(torn.len() / 2);
        let mut f = OpenOptions::new().append(true).open(j.path(0)).unwrap();
        f.write_all(&torn).unwrap();
        drop(f);
        j.append(&ev(2)).unwrap();
        let got: Vec<Event> = j
            .read(0, 10, None)
            .unwrap()
            .events
            .into_iter()
            .map(|e| e.event)
            .collect();
        assert_eq!(got, vec![ev(0), ev(2)]);
    }

    /// Writes `n` events as segments of one line each, by naming segments by hand (the
    /// size knob is an environment variable, which tests must not set for other threads).
    fn one_line_segments(j: &Journal, n: usize) {
        fs::create_dir_all(j.dir()).unwrap();
        let mut base = 0;
        for i in 0..n {
            let mut line = serde_json::to_vec(&ev(i)).unwrap();
            line.push(b'\n');
            fs::write(j.path(base), &line).unwrap();
            base += line.len() as u64;
        }
    }
}
