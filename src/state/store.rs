//! Job folders as stored: reading and writing records, listing ids, and reading output
//! (tail and pages). Settling a record whose supervisor is gone is a step above, in
//! `job::settle`.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::model::error::{Error, Result};
use crate::model::{JobId, JobRecord, Status};
use crate::text::utf8::{leading_continuations, truncate, utf8_window};

use super::fsutil::{Unsynced, ensure_private_dir, replace};
use super::layout::*;

/// The field of a record as read that says why that read could not settle it (see
/// `job::settle`); never stored, and one found in a stored record is dropped.
pub const UNSETTLED: &str = "unsettled";

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
        ensure_private_dir(&root.join(RUNNING_DIR))
            .map_err(|e| Error::io(format!("state root {}", root.display()), e))?;
        Ok(Store { root })
    }

    /// A handle on a state root that [`Store::open`] made before (its absolute path):
    /// creates and checks nothing, for a supervisor whose launcher just did.
    pub fn at(root: &Path) -> Store {
        Store {
            root: root.to_path_buf(),
        }
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

    /// Where job `id`'s folder is assembled before it is renamed into place whole.
    pub fn staging_dir(&self, id: &JobId) -> PathBuf {
        self.jobs_dir().join(format!("{STAGING_PREFIX}{id}"))
    }

    /// `<root>/running`: one empty marker per running job.
    pub fn running_dir(&self) -> PathBuf {
        self.root.join(RUNNING_DIR)
    }

    /// The running marker of job `id`.
    pub fn running_marker(&self, id: &JobId) -> PathBuf {
        self.running_dir().join(id.as_str())
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
        self.replace_record(rec)?.sync()
    }

    /// Replaces a job's record atomically without waiting for the disk (see
    /// [`Unsynced`]): for the records of a job's start, and for its final record before
    /// its waiters are told (the sync follows).
    pub fn replace_record(&self, rec: &JobRecord) -> io::Result<Unsynced> {
        let data = serde_json::to_vec_pretty(rec).map_err(io::Error::other)?;
        replace(&self.job_dir(&rec.id).join(RECORD), &data, 0o600)
    }

    /// Writes the first record of a job still being assembled in `dir` (its staging
    /// folder): nobody can read it before the folder is renamed into place, so it needs
    /// no temp file. Not synced (see [`Unsynced`]): the final record is.
    pub fn write_first_record(&self, dir: &Path, rec: &JobRecord) -> io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let data = serde_json::to_vec_pretty(rec).map_err(io::Error::other)?;
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(dir.join(RECORD))?
            .write_all(&data)
    }

    /// Renames job `id`'s staging folder into place: from now on readers see the job.
    pub fn publish(&self, id: &JobId) -> io::Result<()> {
        fs::rename(self.staging_dir(id), self.job_dir(id))
    }

    /// Opens job `id`'s lock, which its supervisor holds (flock) for its whole life: the
    /// job folder itself, or the `lock` file of a job an older version started.
    pub fn open_lock(&self, id: &JobId) -> io::Result<File> {
        let dir = self.job_dir(id);
        match File::open(dir.join(LOCK)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => File::open(dir),
            r => r,
        }
    }

    /// Replaces job `rec`'s record with the file reserved for it at the start (see
    /// [`FINAL_RECORD`]); not synced (see [`Unsynced`]).
    pub fn replace_record_reserved(
        &self,
        reserved: super::fsutil::Reserved,
        rec: &JobRecord,
    ) -> io::Result<Unsynced> {
        let data = serde_json::to_vec_pretty(rec).map_err(io::Error::other)?;
        let dir = self.job_dir(&rec.id);
        let (unsynced, exchanged) =
            reserved.exchange(&dir.join(FINAL_RECORD), &dir.join(RECORD), &data)?;
        if exchanged {
            self.recycle(&dir.join(FINAL_RECORD), &rec.id);
        }
        Ok(unsynced)
    }

    /// Keeps the file at `path` (an ended job's first record, just replaced) for a later
    /// start's final record ([`Store::reserve_final`]) instead of freeing its inode; the
    /// job folder is left with its record and output alone. Where it cannot be kept, it
    /// is removed.
    fn recycle(&self, path: &Path, id: &JobId) {
        let dir = self.root.join(RECYCLED_DIR);
        let to = dir.join(id.as_str());
        let kept = fs::rename(path, &to).or_else(|e| {
            if e.kind() != io::ErrorKind::NotFound {
                return Err(e);
            }
            ensure_private_dir(&dir)?;
            fs::rename(path, &to)
        });
        if kept.is_err() {
            let _ = fs::remove_file(path);
        }
    }

    /// The final record's file for the job being assembled in `dir`, with `bytes` of room
    /// (see [`super::fsutil::reserve`]): a recycled one moved in and emptied where there
    /// is one, else a new file. A new file on ext4 without a journal costs a scan past
    /// every inode its block group freed lately (up to a millisecond); a rename, none.
    pub fn reserve_final(&self, dir: &Path, bytes: usize) -> io::Result<super::fsutil::Reserved> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = dir.join(FINAL_RECORD);
        let recycled = self.root.join(RECYCLED_DIR);
        if let Ok(entries) = fs::read_dir(&recycled) {
            // A few tries: another start may take the same one first.
            for e in entries.flatten().take(4) {
                if fs::rename(e.path(), &path).is_err() {
                    continue;
                }
                // Only a plain file of ours with no other name is emptied.
                let file = fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
                    .open(&path)
                    .and_then(|f| {
                        use std::os::unix::fs::MetadataExt;
                        let m = f.metadata()?;
                        if m.is_file()
                            && m.nlink() == 1
                            && m.uid() == nix::unistd::geteuid().as_raw()
                        {
                            Ok(f)
                        } else {
                            Err(io::Error::other("not a recycled record"))
                        }
                    });
                match file.and_then(|f| super::fsutil::Reserved::adopt(f, bytes)) {
                    Ok(r) => return Ok(r),
                    Err(_) => {
                        let _ = fs::remove_file(&path);
                        break;
                    }
                }
            }
        }
        super::fsutil::reserve(&path, bytes, 0o600)
    }

    /// Reads a record as stored, without any liveness check.
    pub fn read_raw(&self, id: &JobId) -> Result<JobRecord> {
        let dir = self.job_dir(id);
        let bytes = match read_current(&dir.join(RECORD)) {
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
        let mut rec = serde_json::from_slice::<JobRecord>(&bytes).map_err(|e| {
            Error::Internal(format!(
                "job {id} is corrupt: job.json does not parse ({e})"
            ))
        })?;
        rec.extra.remove(UNSETTLED);
        Ok(rec)
    }

    /// The ids of every job folder (not those still being assembled), in no order.
    pub fn ids(&self) -> Vec<JobId> {
        let Ok(dir) = fs::read_dir(self.jobs_dir()) else {
            return Vec::new();
        };
        dir.filter_map(|e| JobId::parse(e.ok()?.file_name().to_str()?))
            .collect()
    }

    /// Bytes stored in output.log so far.
    pub fn output_size(&self, id: &JobId) -> u64 {
        fs::metadata(self.job_dir(id).join(OUTPUT))
            .map(|m| m.len())
            .unwrap_or(0)
    }

    /// The last [`TAIL_BYTES`] of output, starting on a character boundary.
    pub fn tail(&self, id: &JobId) -> String {
        self.tail_of(id, OUTPUT)
    }

    /// The last [`TAIL_BYTES`] of the job's file `name` (output.log, stderr.log).
    pub fn tail_of(&self, id: &JobId, name: &str) -> String {
        let Ok(mut f) = File::open(self.job_dir(id).join(name)) else {
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
        let mut rec = rec.clone();
        let mut pending = String::new();
        if rec.status == Status::Running {
            rec.output_bytes = self.output_size(&rec.id);
            pending = self.pending(&rec.id);
            live_usage(&mut rec);
            if rec.stderr_bytes.is_some() {
                rec.stderr_bytes = fs::metadata(self.job_dir(&rec.id).join(STDERR))
                    .map(|m| m.len())
                    .ok();
            }
        }
        // An ended job's record says how much it stored: with nothing stored there is no
        // tail to read (a file open less on the answer of every quiet job).
        let tail = if rec.status.is_final() && rec.output_bytes == 0 {
            String::new()
        } else {
            self.tail(&rec.id)
        };
        let mut v = rec.view(tail);
        if let Some(o) = v.as_object_mut() {
            o.insert("pending".into(), pending.into());
            if rec.stderr_bytes.is_some() {
                o.insert("stderr".into(), self.tail_of(&rec.id, STDERR).into());
            }
        }
        v
    }

    /// The line a running job is writing and has not ended (sanitized and redacted by its
    /// supervisor), `""` when there is none.
    pub fn pending(&self, id: &JobId) -> String {
        match fs::read(self.job_dir(id).join(crate::state::layout::PENDING)) {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(_) => String::new(),
        }
    }

    /// Reads a page of output: at most `limit` bytes from `offset`, cut on a character
    /// boundary (but always at least one whole character when there is one).
    pub fn read_page(&self, id: &JobId, offset: u64, limit: usize) -> Result<Page> {
        self.read_page_of(id, OUTPUT, offset, limit)
    }

    /// [`Store::read_page`] of the job's file `name` (output.log, stderr.log).
    pub fn read_page_of(&self, id: &JobId, name: &str, offset: u64, limit: usize) -> Result<Page> {
        if limit == 0 || limit > MAX_PAGE {
            return Err(Error::Invalid(format!(
                "limit must be between 1 and {MAX_PAGE}, got {limit}"
            )));
        }
        let path = self.job_dir(id).join(name);
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

/// Fills in a running job's `usage` from its cgroups as they are now (a few small reads);
/// without a cgroup it stays as recorded (null figures until the end).
pub fn live_usage(rec: &mut JobRecord) {
    if rec.status == Status::Running
        && let Some(u) =
            crate::os::cgroup::live_usage(rec.cgroup.as_deref(), &rec.cgroups_v1, rec.id.as_str())
    {
        rec.usage = u;
    }
}

/// The bytes of the file named `path`, as that name holds them once they are read. A
/// record's file is never written in place while it is named `job.json`, but once an
/// ended job's final record is exchanged in, the first record's file is recycled: emptied
/// and, later, another job's final record. A reader that opened it just before the
/// exchange could read it empty, or that other job's record; so the read counts only if
/// the name still holds the file read, else it is read again.
fn read_current(path: &Path) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::MetadataExt;
    let mut last = Vec::new();
    for _ in 0..8 {
        let mut f = File::open(path)?;
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)?;
        let read = f.metadata()?;
        let now = fs::metadata(path)?;
        if now.ino() == read.ino() && now.dev() == read.dev() {
            return Ok(bytes);
        }
        last = bytes;
    }
    // Replaced eight times while being read: the last read is as good as any.
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name replaced again and again, each file it held emptied right after (as a
    /// recycled record is): a reader never gets an empty or foreign file.
    #[test]
    fn a_read_is_of_the_file_the_name_holds_after_it() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("job.json");
        fs::write(&path, b"first").unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (dir, path, stop) = (d.path().to_path_buf(), path.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let old = File::options().write(true).open(&path).unwrap();
                    let tmp = dir.join("next");
                    fs::write(&tmp, format!("record {n}")).unwrap();
                    fs::rename(&tmp, &path).unwrap();
                    // The file just replaced is emptied, as a recycled record is.
                    old.set_len(0).unwrap();
                    n += 1;
                }
            })
        };
        for _ in 0..20_000 {
            let got = read_current(&path).unwrap();
            assert!(!got.is_empty(), "read an emptied file");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap();
    }
}
