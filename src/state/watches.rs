//! File watches as the server keeps them: `<root>/watches/<id>/watch.json` (the folder,
//! whether recursive, when made) and the watch's own journal beside it, segments named
//! by the offset they start at, one JSON line per change, as the job events' journal
//! (`crate::state::events`). Changes are written as they come, whether or not a client
//! reads, so what happened while none was connected is delivered later.
//!
//! Never a silent gap: a full kernel queue is a `rescan` (from the engine); each start of
//! the server appends a `rescan` to every watch before it watches again (what changed
//! while no server ran is unknown); a cursor older than what is kept (at least
//! [`KEEP_EVENTS`]) is answered with one `rescan` and then what is kept. A cursor is
//! `<boot>-<offset>`; one from an earlier boot is good up to where this boot's first
//! server start wrote its rescan, and past that (a restored snapshot's timeline) it is
//! 410 `gone`, as is one past the end or not at an event's start.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::model::error::{Error, Result};
use crate::os::files::watch::{Change, Engine, Kind};

/// The folder of the watches under the state root.
pub const WATCHES_DIR: &str = "watches";
/// Most watches one server keeps.
pub const MAX_WATCHES: usize = 64;
/// Events kept per watch, at least (whole segments go once the rest hold this many).
pub const KEEP_EVENTS: usize = 10_000;
/// A new segment is started once the last holds this many bytes.
const SEGMENT_BYTES: u64 = 256 << 10;
/// The most bytes one read scans.
const READ_BYTES: u64 = 256 << 10;
const META: &str = "watch.json";

/// What `watch.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    pub id: String,
    pub path: String,
    pub recursive: bool,
    pub created_at: String,
    /// The boot of the last server start, and the journal's end when it began.
    pub boot: String,
    pub boot_at: u64,
}

/// One watch's journal: its segments (start offset, lines), and its end.
struct Log {
    dir: PathBuf,
    segs: Vec<(u64, usize)>,
    end: u64,
}

fn seg_name(base: u64) -> String {
    format!("{base:020}.log")
}

impl Log {
    fn open(dir: &Path) -> Log {
        let mut segs: Vec<(u64, usize)> = super::events::segment_bases(dir)
            .into_iter()
            .map(|b| (b, 0))
            .collect();
        for s in segs.iter_mut() {
            s.1 = fs::read(dir.join(seg_name(s.0)))
                .map(|d| d.iter().filter(|&&c| c == b'\n').count())
                .unwrap_or(0);
        }
        let end = segs
            .last()
            .map(|&(b, _)| b + fs::metadata(dir.join(seg_name(b))).map_or(0, |m| m.len()))
            .unwrap_or(0);
        Log {
            dir: dir.to_path_buf(),
            segs,
            end,
        }
    }

    fn start(&self) -> u64 {
        self.segs.first().map_or(0, |s| s.0)
    }

    fn append(&mut self, lines: &[u8], count: usize) -> io::Result<()> {
        let last = self.segs.last().map(|s| s.0);
        let base = match last {
            Some(b) if self.end - b < SEGMENT_BYTES => b,
            _ => {
                self.segs.push((self.end, 0));
                self.end
            }
        };
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(self.dir.join(seg_name(base)))?;
        f.write_all(lines)?;
        self.end += lines.len() as u64;
        if let Some(s) = self.segs.last_mut() {
            s.1 += count;
        }
        // Whole segments from the front, while the rest hold enough.
        let mut total: usize = self.segs.iter().map(|s| s.1).sum();
        while self.segs.len() > 1 && total - self.segs[0].1 >= KEEP_EVENTS {
            let (b, n) = self.segs.remove(0);
            let _ = fs::remove_file(self.dir.join(seg_name(b)));
            total -= n;
        }
        Ok(())
    }

    fn line_start(&self, off: u64) -> bool {
        if off == self.start() || off == self.end {
            return true;
        }
        let Some(&(base, _)) = self.segs.iter().rev().find(|s| s.0 < off) else {
            return false;
        };
        let mut b = [0u8; 1];
        File::open(self.dir.join(seg_name(base)))
            .and_then(|f| f.read_exact_at(&mut b, off - base - 1))
            .is_ok_and(|()| b[0] == b'\n')
    }

    /// Lines from `from`: each with the offset past it.
    fn read(&self, from: u64, limit: usize) -> io::Result<(Vec<(u64, Value)>, u64)> {
        let mut out = Vec::new();
        let mut pos = from;
        let mut scanned = 0u64;
        while out.len() < limit && scanned < READ_BYTES && pos < self.end {
            let Some(idx) = self.segs.iter().rposition(|s| s.0 <= pos) else {
                break;
            };
            let base = self.segs[idx].0;
            let mut f = match File::open(self.dir.join(seg_name(base))) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(e) => return Err(e),
            };
            f.seek(SeekFrom::Start(pos - base))?;
            let want = READ_BYTES - scanned;
            let mut buf = Vec::new();
            f.take(want).read_to_end(&mut buf)?;
            let mut used = 0;
            while out.len() < limit
                && let Some(nl) = buf[used..].iter().position(|&c| c == b'\n')
            {
                let line = &buf[used..used + nl];
                used += nl + 1;
                if let Ok(v) = serde_json::from_slice::<Value>(line) {
                    out.push((pos + used as u64, v));
                }
            }
            pos += used as u64;
            scanned += buf.len() as u64;
            if out.len() >= limit {
                break;
            }
            let eof = (buf.len() as u64) < want;
            match self.segs.get(idx + 1) {
                // What is left of a segment no longer appended to is a line cut short.
                Some(&(next, _)) if eof => pos = pos.max(next),
                _ => break,
            }
        }
        Ok((out, pos))
    }
}

struct Watch {
    key: u64,
    meta: Meta,
    log: Log,
    /// Why the watch no longer sees everything, once it does not.
    error: Option<String>,
}

#[derive(Default)]
struct Reg {
    seq: u64,
    watches: HashMap<String, Watch>,
    by_key: HashMap<u64, String>,
    next_key: u64,
}

/// The server's watches.
pub struct Watches {
    dir: PathBuf,
    root: PathBuf,
    boot: String,
    reg: Mutex<Reg>,
    cond: Condvar,
    engine: OnceLock<Arc<Engine>>,
    starting: Mutex<()>,
}

/// A page of a watch's events.
pub struct Page {
    pub events: Vec<Value>,
    pub next: String,
    /// Set once the watch stopped seeing everything (and the page is its last).
    pub error: Option<String>,
}

fn line(kind: &str, path: &str, to: Option<&str>, is_dir: bool, reason: Option<&str>) -> Vec<u8> {
    let mut v = json!({
        "type": kind,
        "path": path,
        "toPath": to,
        "isDir": is_dir,
        "at": crate::text::timefmt::now(),
    });
    if let Some(r) = reason {
        v["reason"] = r.into();
    }
    let mut b = serde_json::to_vec(&v).unwrap_or_default();
    b.push(b'\n');
    b
}

/// A watch id: `fw_` + 20 lowercase hex characters.
pub fn valid_id(s: &str) -> bool {
    s.strip_prefix("fw_")
        .is_some_and(|h| h.len() == 20 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

impl Watches {
    /// The watches under the state root `root` (nothing is read or started yet).
    pub fn open(root: &Path) -> Arc<Watches> {
        Arc::new(Watches {
            dir: root.join(WATCHES_DIR),
            root: root.to_path_buf(),
            boot: crate::state::events::boot_tag(&crate::state::sandbox::boot_id()),
            reg: Mutex::new(Reg::default()),
            cond: Condvar::new(),
            engine: OnceLock::new(),
            starting: Mutex::new(()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Reg> {
        self.reg.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The inotify engine, started on first use with the job user's credentials, with
    /// the thread that writes what it sees into the journals.
    pub fn engine(self: &Arc<Self>, user: Option<(u32, u32, Vec<u32>)>) -> Result<Arc<Engine>> {
        if let Some(e) = self.engine.get() {
            return Ok(Arc::clone(e));
        }
        let _one = self.starting.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = self.engine.get() {
            return Ok(Arc::clone(e));
        }
        let (tx, rx) = mpsc::channel::<Vec<Change>>();
        let engine = Engine::start(user, &self.root, tx).map_err(|e| {
            Error::io(
                "starting inotify for file watches (fs.inotify.max_user_instances may be \
                 reached)",
                e,
            )
        })?;
        let me = Arc::clone(self);
        std::thread::Builder::new()
            .name("fswatch-log".into())
            .stack_size(256 << 10)
            .spawn(move || {
                for batch in rx {
                    me.record(batch);
                }
            })
            .map_err(|e| Error::io("starting the file watches' journal", e))?;
        let _ = self.engine.set(Arc::clone(&engine));
        Ok(engine)
    }

    /// Writes a batch of changes into their watches' journals, and wakes the readers.
    fn record(&self, batch: Vec<Change>) {
        let mut reg = self.lock();
        let mut lines: HashMap<u64, (Vec<u8>, usize)> = HashMap::new();
        for c in batch {
            let Some(id) = reg.by_key.get(&c.watch).cloned() else {
                continue;
            };
            let Some(w) = reg.watches.get_mut(&id) else {
                continue;
            };
            let name = |rel: &[u8]| {
                if rel.is_empty() {
                    w.meta.path.clone()
                } else {
                    format!(
                        "{}/{}",
                        w.meta.path.trim_end_matches('/'),
                        String::from_utf8_lossy(rel)
                    )
                }
            };
            let path = name(&c.rel);
            let to = c.to.as_deref().map(name);
            let reason = match (c.kind, c.note.as_deref()) {
                (Kind::Rescan, Some("overflow")) => Some("overflow"),
                (_, Some(n)) => {
                    w.error = Some(n.to_string());
                    Some("stopped")
                }
                _ => None,
            };
            let e = lines.entry(c.watch).or_default();
            e.0.extend_from_slice(&line(
                c.kind.as_str(),
                &path,
                to.as_deref(),
                c.is_dir,
                reason,
            ));
            e.1 += 1;
        }
        for (key, (bytes, n)) in lines {
            let Some(id) = reg.by_key.get(&key).cloned() else {
                continue;
            };
            if let Some(w) = reg.watches.get_mut(&id) {
                let _ = w.log.append(&bytes, n);
            }
        }
        reg.seq += 1;
        drop(reg);
        self.cond.notify_all();
    }

    /// Makes a new watch of `path` (its journal and record), before its folders are
    /// watched; `Err` 429 at [`MAX_WATCHES`]. Returns its id and engine key.
    pub fn reserve(&self, path: &str, recursive: bool) -> Result<(String, u64)> {
        let mut reg = self.lock();
        if reg.watches.len() >= MAX_WATCHES {
            return Err(Error::RateLimited(format!(
                "{MAX_WATCHES} file watches exist, the most one sandbox keeps; delete one \
                 (DELETE /v1/files/watches/{{id}}) or watch a folder above several"
            )));
        }
        let mut b = [0u8; 10];
        crate::os::proc::random_bytes(&mut b).map_err(|e| Error::io("drawing a watch id", e))?;
        let id = format!("fw_{}", crate::model::id::hex(&b));
        let dir = self.dir.join(&id);
        crate::state::fsutil::ensure_private_dir(&self.dir)
            .and_then(|()| crate::state::fsutil::ensure_private_dir(&dir))
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let meta = Meta {
            id: id.clone(),
            path: path.to_string(),
            recursive,
            created_at: crate::text::timefmt::now(),
            boot: self.boot.clone(),
            boot_at: 0,
        };
        write_meta(&dir, &meta)?;
        let key = reg.next_key;
        reg.next_key += 1;
        reg.by_key.insert(key, id.clone());
        reg.watches.insert(
            id.clone(),
            Watch {
                key,
                meta,
                log: Log::open(&dir),
                error: None,
            },
        );
        Ok((id, key))
    }

    /// Forgets a watch: its engine watch, record and journal.
    pub fn delete(&self, id: &str) -> Result<()> {
        let mut reg = self.lock();
        let Some(w) = reg.watches.remove(id) else {
            return Err(not_found(id));
        };
        reg.by_key.remove(&w.key);
        drop(reg);
        if let Some(e) = self.engine.get() {
            e.remove(w.key);
        }
        let _ = fs::remove_dir_all(self.dir.join(id));
        self.cond.notify_all();
        Ok(())
    }

    /// Marks a watch as no longer seeing everything (its folder is gone, say), with a
    /// rescan that says why.
    pub fn fail(&self, id: &str, why: &str) {
        let mut reg = self.lock();
        if let Some(w) = reg.watches.get_mut(id) {
            let path = w.meta.path.clone();
            let _ = w
                .log
                .append(&line("rescan", &path, None, true, Some("stopped")), 1);
            w.error = Some(why.to_string());
        }
        reg.seq += 1;
        drop(reg);
        self.cond.notify_all();
    }

    /// The watches kept from before this server's start, each with a `rescan` appended
    /// first (what changed while no server watched is unknown): (id, key, path,
    /// recursive) for the caller to watch again.
    pub fn resume(&self) -> Vec<(String, u64, String, bool)> {
        let mut out = Vec::new();
        let mut reg = self.lock();
        for e in fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let dir = e.path();
            let Some(mut meta) = fs::read(dir.join(META))
                .ok()
                .and_then(|b| serde_json::from_slice::<Meta>(&b).ok())
            else {
                continue;
            };
            if !valid_id(&meta.id) || reg.watches.contains_key(&meta.id) {
                continue;
            }
            let mut log = Log::open(&dir);
            if meta.boot != self.boot {
                meta.boot = self.boot.clone();
                meta.boot_at = log.end;
                let _ = write_meta(&dir, &meta);
            }
            let _ = log.append(&line("rescan", &meta.path, None, true, Some("restart")), 1);
            let key = reg.next_key;
            reg.next_key += 1;
            reg.by_key.insert(key, meta.id.clone());
            out.push((meta.id.clone(), key, meta.path.clone(), meta.recursive));
            reg.watches.insert(
                meta.id.clone(),
                Watch {
                    key,
                    meta,
                    log,
                    error: None,
                },
            );
        }
        out
    }

    /// A watch as the API shows it.
    pub fn describe(&self, id: &str) -> Result<Value> {
        let reg = self.lock();
        let w = reg.watches.get(id).ok_or_else(|| not_found(id))?;
        Ok(shown(w))
    }

    /// Every watch, oldest first.
    pub fn list(&self) -> Vec<Value> {
        let reg = self.lock();
        let mut v: Vec<&Watch> = reg.watches.values().collect();
        v.sort_by(|a, b| {
            a.meta
                .created_at
                .cmp(&b.meta.created_at)
                .then(a.key.cmp(&b.key))
        });
        v.into_iter().map(shown).collect()
    }

    /// The change counter; take it before reading, then [`Watches::wait`] on it.
    pub fn seq(&self) -> u64 {
        self.lock().seq
    }

    /// Sleeps until a journal changes after `seen`, or `deadline` (at most 500 ms).
    pub fn wait(&self, seen: u64, deadline: Instant) {
        let until = deadline.min(Instant::now() + Duration::from_millis(500));
        let mut reg = self.lock();
        while reg.seq == seen {
            let now = Instant::now();
            if now >= until {
                return;
            }
            reg = self
                .cond
                .wait_timeout(reg, until - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Up to `limit` events of watch `id` after the cursor `after` (from the oldest kept
    /// without one).
    pub fn page(&self, id: &str, after: Option<&str>, limit: usize) -> Result<Page> {
        let reg = self.lock();
        let w = reg.watches.get(id).ok_or_else(|| not_found(id))?;
        let start = w.log.start();
        let mut events = Vec::new();
        let from = match after.filter(|a| !a.is_empty()) {
            None => start,
            Some(c) => match self.parse_cursor(w, c)? {
                Some(off) => off,
                None => {
                    // Older than what is kept: one rescan, then what is kept.
                    events.push(json!({
                        "cursor": self.cursor(start),
                        "type": "rescan",
                        "path": w.meta.path,
                        "toPath": null,
                        "isDir": true,
                        "at": crate::text::timefmt::now(),
                        "reason": "limit",
                    }));
                    start
                }
            },
        };
        let (lines, next) = w
            .log
            .read(from, limit.saturating_sub(events.len()).max(1))
            .map_err(|e| Error::io(format!("reading the journal of {id}"), e))?;
        for (end, mut v) in lines {
            v["cursor"] = self.cursor(end).into();
            events.push(v);
        }
        let error = (next >= w.log.end).then(|| w.error.clone()).flatten();
        Ok(Page {
            events,
            next: self.cursor(next),
            error,
        })
    }

    /// The cursor of the oldest event kept: where a new watch's reader begins.
    pub fn first_cursor(&self, id: &str) -> Result<String> {
        let reg = self.lock();
        let w = reg.watches.get(id).ok_or_else(|| not_found(id))?;
        Ok(self.cursor(w.log.start()))
    }

    fn cursor(&self, off: u64) -> String {
        format!("{}-{off}", self.boot)
    }

    /// `Some(offset)`, or `None` for a cursor older than what is kept.
    fn parse_cursor(&self, w: &Watch, c: &str) -> Result<Option<u64>> {
        let gone = |why: &str| {
            Error::Gone(format!(
                "the watch cursor {c:?} {why}; list the folder again and read this watch's \
                 events without a cursor (from the oldest kept)"
            ))
        };
        let bad = || Error::Invalid(format!("malformed watch cursor {c:?}"));
        let (boot, off) = c.rsplit_once('-').ok_or_else(bad)?;
        let off: u64 = off.parse().map_err(|_| bad())?;
        if boot != self.boot && !(w.meta.boot == self.boot && off <= w.meta.boot_at) {
            return Err(gone("is from another boot of the sandbox"));
        }
        if off > w.log.end {
            return Err(gone("is past the end of the watch's events"));
        }
        if off < w.log.start() {
            return Ok(None);
        }
        if !w.log.line_start(off) {
            return Err(gone("does not name an event's place"));
        }
        Ok(Some(off))
    }

    /// How many watches exist.
    pub fn count(&self) -> usize {
        self.lock().watches.len()
    }
}

fn not_found(id: &str) -> Error {
    Error::NotFound(format!(
        "no file watch {id:?}; GET /v1/files/watches lists them"
    ))
}

fn shown(w: &Watch) -> Value {
    let mut v = json!({
        "id": w.meta.id,
        "path": w.meta.path,
        "recursive": w.meta.recursive,
        "createdAt": w.meta.created_at,
    });
    if let Some(e) = &w.error {
        v["error"] = e.as_str().into();
    }
    v
}

fn write_meta(dir: &Path, meta: &Meta) -> Result<()> {
    let b = serde_json::to_vec(meta).map_err(|e| Error::Internal(e.to_string()))?;
    crate::state::fsutil::write_atomic(&dir.join(META), &b, 0o600)
        .map_err(|e| Error::io(format!("writing {}", dir.join(META).display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_keeps_offsets_across_segments_and_compaction() {
        let d = tempfile::tempdir().unwrap();
        let mut log = Log::open(d.path());
        let one = line("created", "/x/a", None, false, None);
        let mut ends = Vec::new();
        for _ in 0..(KEEP_EVENTS * 3) {
            log.append(&one, 1).unwrap();
            ends.push(log.end);
        }
        assert!(log.segs.len() > 2);
        let kept: usize = log.segs.iter().map(|s| s.1).sum();
        assert!((KEEP_EVENTS..KEEP_EVENTS + 3000).contains(&kept), "{kept}");
        let start = log.start();
        assert!(start > 0);
        // Reading from any kept event's end goes on exactly from the next one.
        let i = ends.iter().position(|&e| e > start + 1000).unwrap();
        let (got, next) = log.read(ends[i], 5).unwrap();
        assert_eq!(got.len(), 5);
        assert_eq!(got[0].0, ends[i + 1]);
        assert_eq!(next, ends[i + 5]);
        assert!(log.line_start(ends[i]));
        assert!(!log.line_start(ends[i] - 3));
        let again = Log::open(d.path());
        assert_eq!((again.start(), again.end), (log.start(), log.end));
        // A read that crosses a segment's end goes on into the next.
        let (all, end) = log.read(start, usize::MAX).unwrap();
        assert!(all.len() > 1000);
        assert!(end <= log.end);
        assert!(valid_id("fw_0123456789abcdef0123") && !valid_id("fw_../x"));
    }
}
