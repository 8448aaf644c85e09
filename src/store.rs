//! The state root on disk: job folders, atomic record writes, the supervisor lock, output
//! reads (tail and pages), and waiting for a job to change.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::job::{JobId, JobRecord, Status};

/// Bytes of output returned as a job's `output` tail.
pub const TAIL_BYTES: u64 = 8 * 1024;
/// The largest output page.
pub const MAX_PAGE: usize = 64 * 1024;

/// File names inside a job folder.
pub const RECORD: &str = "job.json";
pub const OUTPUT: &str = "output.log";
pub const LOCK: &str = "lock";
pub const SPEC: &str = "spec.json";
pub const SECRETS: &str = "secrets.env";
pub const STDIN: &str = "stdin";
/// Room kept in a job folder so the final record lands even on a full disk.
pub const RESERVE: &str = ".reserve";

/// Why a job is `lost` when its supervisor vanished.
pub const LOST_SUPERVISOR: &str = "its supervisor exited without recording the job's end (killed or crashed); the job's remaining processes were ended";
/// Why a job is `lost` after a snapshot restore or reboot.
pub const LOST_BOOT: &str = "sandbox restarted; its processes were not restored";

/// The state root: `$GITTERM_HOME`, else `$HOME/.gitterm`.
pub fn default_root() -> PathBuf {
    if let Some(h) = std::env::var_os("GITTERM_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".gitterm")
}

/// Creates a folder (and parents) with mode 0700, and tightens it if it already existed.
pub fn ensure_private_dir(path: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)?;
    let meta = fs::metadata(path)?;
    if meta.permissions().mode() & 0o777 != 0o700 {
        fs::set_permissions(path, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Replaces `path` atomically: write a temp file beside it, fsync, rename, fsync the folder.
/// A crash at any instant leaves either the old or the new content.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut rnd = [0u8; 6];
    crate::proc::random_bytes(&mut rnd)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.{}.tmp", crate::job::hex(&rnd)));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// One entry of a listing: a record, or a folder whose record cannot be read.
#[derive(Debug, Clone)]
pub enum Listed {
    Job(Box<JobRecord>),
    Corrupt { id: String, error: String },
}

/// A page of output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub offset: u64,
    pub next_offset: u64,
    pub data: String,
    pub eof: bool,
}

/// Handle on a state root.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// Opens (creating, 0700) the state root and its `jobs` folder.
    pub fn open(root: &Path) -> Result<Store> {
        let root = if root.is_absolute() {
            root.to_path_buf()
        } else {
            std::env::current_dir()
                .map_err(|e| Error::io("current folder", e))?
                .join(root)
        };
        ensure_private_dir(&root.join("jobs")).map_err(|e| {
            Error::io(
                format!("cannot create the state root {}", root.display()),
                e,
            )
        })?;
        ensure_private_dir(&root)
            .map_err(|e| Error::io(format!("state root {}", root.display()), e))?;
        Ok(Store { root })
    }

    /// The state root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/jobs`.
    pub fn jobs_dir(&self) -> PathBuf {
        self.root.join("jobs")
    }

    /// `<root>/jobs/<id>`.
    pub fn job_dir(&self, id: &JobId) -> PathBuf {
        self.jobs_dir().join(id.as_str())
    }

    /// Parses an id given by a caller; malformed ids are "not found" and touch nothing.
    pub fn parse_id(s: &str) -> Result<JobId> {
        JobId::parse(s).ok_or_else(|| {
            Error::NotFound(format!(
                "no job {:?}: ids are job_ followed by 20 lowercase hex characters",
                truncate(s, 64)
            ))
        })
    }

    /// Writes a job's record atomically.
    pub fn write_record(&self, rec: &JobRecord) -> io::Result<()> {
        let id = JobId::parse(&rec.id).ok_or_else(|| io::Error::other("record with a bad id"))?;
        let data = serde_json::to_vec_pretty(rec).map_err(io::Error::other)?;
        write_atomic(&self.job_dir(&id).join(RECORD), &data, 0o600)
    }

    /// Reads a record as stored, without any liveness check.
    pub fn read_raw(&self, id: &JobId) -> Result<JobRecord> {
        let dir = self.job_dir(id);
        let bytes = match fs::read(dir.join(RECORD)) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(if dir.is_dir() {
                    Error::Internal(format!("job {id} is corrupt: its folder has no job.json"))
                } else {
                    Error::NotFound(format!("no job {id}"))
                });
            }
            Err(e) => return Err(Error::io(format!("reading job {id}"), e)),
        };
        serde_json::from_slice::<JobRecord>(&bytes).map_err(|e| {
            Error::Internal(format!(
                "job {id} is corrupt: job.json does not parse ({e})"
            ))
        })
    }

    /// Reads a record and settles a `running` one whose supervisor is gone (or whose boot
    /// is over) into `lost`, ending whatever the job left behind.
    pub fn load(&self, id: &JobId) -> Result<JobRecord> {
        let mut rec = self.read_raw(id)?;
        if rec.status != Status::Running {
            return Ok(rec);
        }
        let stale_boot = match (&rec.boot_id, crate::sandbox::boot_id()) {
            (Some(then), now) => !now.is_empty() && *then != now,
            _ => false,
        };
        let lock_path = self.job_dir(id).join(LOCK);
        // Read-only: a writable open would wake every inotify watcher of the folder.
        // The lock decides; the boot id only names the reason. A lock we cannot even open
        // (out of fds, say) proves nothing, so the job stays as recorded.
        let _lock = match File::open(&lock_path) {
            Ok(l) => match l.try_lock() {
                Ok(()) => Some(l),
                Err(std::fs::TryLockError::WouldBlock) => {
                    // Held by the supervisor (really running), or by another reader that
                    // is settling a job whose supervisor is gone: then wait for its verdict,
                    // so every reader agrees (a prune must not see "running" meanwhile).
                    let supervisor_alive = match (rec.supervisor_pid, rec.supervisor_start) {
                        (Some(pid), Some(start)) => {
                            crate::proc::stat(pid).is_some_and(|s| s.start == start)
                        }
                        _ => true, // still starting: the launcher holds the lock
                    };
                    if supervisor_alive || l.lock().is_err() {
                        return Ok(rec);
                    }
                    Some(l)
                }
                Err(_) => return Ok(rec),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(_) => return Ok(rec),
        };
        // Re-read under the lock: the supervisor may have written its final record just
        // before it exited.
        rec = self.read_raw(id)?;
        if rec.status != Status::Running {
            return Ok(rec);
        }
        if !stale_boot {
            crate::proc::sweep_job(id.as_str(), rec.cgroup.as_deref().map(Path::new));
        }
        for f in [SECRETS, SPEC, STDIN, RESERVE] {
            let _ = fs::remove_file(self.job_dir(id).join(f));
        }
        let _ = fs::remove_file(self.root.join("running").join(id.as_str()));
        rec.status = Status::Lost;
        rec.reason = Some(
            if stale_boot {
                LOST_BOOT
            } else {
                LOST_SUPERVISOR
            }
            .to_string(),
        );
        rec.ended_at = Some(crate::timefmt::now());
        rec.output_bytes = self.output_size(id);
        self.write_record(&rec)
            .map_err(|e| Error::io(format!("recording job {id} as lost"), e))?;
        Ok(rec)
    }

    /// Every job, newest first; unreadable records are listed as corrupt.
    pub fn list(&self) -> Vec<Listed> {
        let Ok(dir) = fs::read_dir(self.jobs_dir()) else {
            return Vec::new();
        };
        let mut out: Vec<Listed> = dir
            .filter_map(|e| {
                let name = e.ok()?.file_name();
                let id = JobId::parse(name.to_str()?)?;
                Some(match self.load(&id) {
                    Ok(r) => Listed::Job(Box::new(r)),
                    Err(Error::NotFound(_)) => return None, // pruned meanwhile
                    Err(e) => Listed::Corrupt {
                        id: id.to_string(),
                        error: e.to_string(),
                    },
                })
            })
            .collect();
        out.sort_by(|a, b| match (a, b) {
            (Listed::Job(a), Listed::Job(b)) => {
                b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id))
            }
            (Listed::Job(_), Listed::Corrupt { .. }) => std::cmp::Ordering::Less,
            (Listed::Corrupt { .. }, Listed::Job(_)) => std::cmp::Ordering::Greater,
            (Listed::Corrupt { id: a, .. }, Listed::Corrupt { id: b, .. }) => a.cmp(b),
        });
        out
    }

    /// Removes ended jobs beyond the newest `keep_jobs` and those that ended more than
    /// `keep_for` ago, oldest first; never a running one. Returns the removed ids.
    pub fn prune(&self, keep_jobs: usize, keep_for: Duration) -> Vec<String> {
        let now = std::time::SystemTime::now();
        let mut ended: Vec<JobRecord> = self
            .list()
            .into_iter()
            .filter_map(|l| match l {
                Listed::Job(r) if r.status.is_final() => Some(*r),
                _ => None,
            })
            .collect();
        let key = |r: &JobRecord| r.ended_at.clone().unwrap_or_else(|| r.created_at.clone());
        ended.sort_by_key(|r| std::cmp::Reverse(key(r)));
        let mut removed = Vec::new();
        for (i, r) in ended.iter().enumerate() {
            let age = crate::timefmt::parse(&key(r)).and_then(|t| now.duration_since(t).ok());
            if i >= keep_jobs || age.is_some_and(|a| a > keep_for) {
                let Some(id) = JobId::parse(&r.id) else {
                    continue;
                };
                if fs::remove_dir_all(self.job_dir(&id)).is_ok() {
                    removed.push(r.id.clone());
                }
            }
        }
        removed.reverse();
        // Idempotency keys of jobs that are gone (their lock files once the key is an hour
        // old): a retry after that starts a new job, as it would after pruning.
        if let Ok(dir) = fs::read_dir(self.root.join("idempotency")) {
            for e in dir.flatten() {
                let path = e.path();
                let old = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| now.duration_since(t).ok());
                let gone = match path.extension() {
                    Some(x) if x == "lock" => {
                        old.is_some_and(|a| a > Duration::from_secs(3600))
                            && !path.with_extension("").exists()
                    }
                    _ => fs::read_to_string(&path)
                        .ok()
                        .and_then(|t| t.lines().next().and_then(JobId::parse))
                        .is_none_or(|id| !self.job_dir(&id).exists()),
                };
                if gone {
                    let _ = fs::remove_file(&path);
                }
            }
        }
        // Folders of starts that died half-way (see launch::staging_dir) hold nothing
        // anyone can read; clear them once they are clearly abandoned.
        if let Ok(dir) = fs::read_dir(self.jobs_dir()) {
            for e in dir.flatten() {
                let stale = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| now.duration_since(t).ok());
                if e.file_name().to_string_lossy().starts_with(".new-job_")
                    && stale.is_some_and(|a| a > Duration::from_secs(3600))
                {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
        removed
    }

    /// Bytes stored in output.log so far.
    pub fn output_size(&self, id: &JobId) -> u64 {
        fs::metadata(self.job_dir(id).join(OUTPUT))
            .map(|m| m.len())
            .unwrap_or(0)
    }

    /// The last [`TAIL_BYTES`] of output, starting on a character boundary.
    pub fn tail(&self, id: &JobId) -> String {
        let Ok(mut f) = File::open(self.job_dir(id).join(OUTPUT)) else {
            return String::new();
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let start = len.saturating_sub(TAIL_BYTES);
        let mut buf = Vec::new();
        if f.seek(SeekFrom::Start(start)).is_err()
            || f.take(TAIL_BYTES).read_to_end(&mut buf).is_err()
        {
            return String::new();
        }
        let skip = if start > 0 {
            leading_continuations(&buf)
        } else {
            0
        };
        String::from_utf8_lossy(&buf[skip..]).into_owned()
    }

    /// The job's record plus its output tail, in the one JSON shape of the contract.
    pub fn view(&self, rec: &JobRecord) -> serde_json::Value {
        let id = JobId::parse(&rec.id);
        let mut rec = rec.clone();
        if rec.status == Status::Running
            && let Some(id) = &id
        {
            rec.output_bytes = self.output_size(id);
        }
        rec.view(id.map(|id| self.tail(&id)).unwrap_or_default())
    }

    /// Reads a page of output: at most `limit` bytes from `offset`, cut on a character
    /// boundary (but always at least one whole character when there is one).
    pub fn read_page(&self, id: &JobId, offset: u64, limit: usize) -> Result<Page> {
        if limit == 0 || limit > MAX_PAGE {
            return Err(Error::Invalid(format!(
                "limit must be between 1 and {MAX_PAGE}, got {limit}"
            )));
        }
        let path = self.job_dir(id).join(OUTPUT);
        let mut f = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.read_raw(id)?;
                return if offset == 0 {
                    Ok(Page {
                        offset,
                        next_offset: 0,
                        data: String::new(),
                        eof: true,
                    })
                } else {
                    Err(Error::Invalid(format!(
                        "offset {offset} is past the end of the output (0 bytes)"
                    )))
                };
            }
            Err(e) => return Err(Error::io(format!("reading the output of {id}"), e)),
        };
        let len = f.metadata().map_err(|e| Error::io("output.log", e))?.len();
        if offset > len {
            return Err(Error::Invalid(format!(
                "offset {offset} is past the end of the output ({len} bytes)"
            )));
        }
        f.seek(SeekFrom::Start(offset))
            .map_err(|e| Error::io("output.log", e))?;
        let mut buf = Vec::with_capacity(limit.min((len - offset) as usize) + 3);
        Read::by_ref(&mut f)
            .take(limit as u64 + 3)
            .read_to_end(&mut buf)
            .map_err(|e| Error::io("output.log", e))?;
        let (skip, take) = utf8_window(&buf, limit);
        let data = String::from_utf8_lossy(&buf[skip..take]).into_owned();
        let next = offset + take as u64;
        Ok(Page {
            offset: offset + skip as u64,
            next_offset: next,
            data,
            eof: next >= len,
        })
    }
}

/// How many bytes at the start of `buf` continue a character begun before it (at most 3).
fn leading_continuations(buf: &[u8]) -> usize {
    buf.iter()
        .take(3)
        .take_while(|&&b| b & 0xC0 == 0x80)
        .count()
}

/// Where a page starts and ends inside `buf` so that both ends sit on character
/// boundaries: skips continuation bytes at the start, and cuts at most `limit` bytes,
/// backing off to a boundary (but keeping one whole character if `limit` is smaller).
pub fn utf8_window(buf: &[u8], limit: usize) -> (usize, usize) {
    let skip = leading_continuations(buf);
    let body = &buf[skip..];
    if body.len() <= limit {
        return (skip, buf.len());
    }
    let mut end = limit;
    while end > 0 && body[end] & 0xC0 == 0x80 {
        end -= 1;
    }
    if end == 0 {
        end = 1;
        while end < body.len() && body[end] & 0xC0 == 0x80 {
            end += 1;
        }
    }
    (skip, skip + end)
}

fn truncate(s: &str, max: usize) -> String {
    let mut out: String = s.chars().take(max).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

pub use watch::Watcher;

/// Waits on a watcher, or naps briefly where inotify was unavailable.
pub fn nap(w: Option<&Watcher>, d: Duration) {
    match w {
        Some(w) => w.wait(d),
        None => std::thread::sleep(d.min(Duration::from_millis(20))),
    }
}

/// Waiting for changes in a folder with inotify, falling back to short naps.
mod watch {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    use std::os::fd::AsFd;
    use std::path::Path;
    use std::time::Duration;

    /// Wakes its owner when anything in one folder changes.
    pub struct Watcher(Inotify);

    impl Watcher {
        /// Watches `dir`; `None` where inotify is unavailable (callers then nap).
        pub fn new(dir: &Path) -> Option<Watcher> {
            let ino = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).ok()?;
            ino.add_watch(
                dir,
                AddWatchFlags::IN_MODIFY
                    | AddWatchFlags::IN_MOVED_TO
                    | AddWatchFlags::IN_DELETE_SELF
                    | AddWatchFlags::IN_CREATE,
            )
            .ok()?;
            Some(Watcher(ino))
        }

        /// Blocks until a change or `nap` passes.
        pub fn wait(&self, nap: Duration) {
            let ms = nap.as_millis().min(i32::MAX as u128) as i32;
            let mut fds = [PollFd::new(self.0.as_fd(), PollFlags::POLLIN)];
            if poll(
                &mut fds,
                PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
            )
            .unwrap_or(0)
                > 0
            {
                let _ = self.0.read_events();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_windows_never_split_characters() {
        let s = "aé€𝄞b".as_bytes(); // 1 + 2 + 3 + 4 + 1 bytes
        assert_eq!(utf8_window(s, 100), (0, s.len()));
        assert_eq!(utf8_window(s, 1), (0, 1));
        assert_eq!(utf8_window(s, 2), (0, 1));
        assert_eq!(utf8_window(s, 3), (0, 3));
        assert_eq!(utf8_window(&s[1..], 1), (0, 2)); // one whole char beats an empty page
        assert_eq!(utf8_window(&s[2..], 4), (1, 4)); // starts mid-character: skip to the next
        for limit in 1..12 {
            for start in 0..s.len() {
                let (a, b) = utf8_window(&s[start..], limit);
                assert!(std::str::from_utf8(&s[start + a..start + b]).is_ok());
            }
        }
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.json");
        write_atomic(&p, b"one", 0o600).unwrap();
        write_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}
