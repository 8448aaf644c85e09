//! The secrets of running jobs, for every supervisor to mask in its own job's output.
//!
//! Jobs of one user are one trust domain, as Unix makes them: one can read another's
//! `/proc/<pid>/environ`. So every supervisor masks, besides its own job's secrets, those of
//! every job it saw running, and never forgets one: a job that reads a neighbour's secret
//! and prints it gets `[redacted]`.
//!
//! `<root>/secrets/` (0700, the agent's) holds, for each running job with secrets, a
//! symbolic link named after the job whose text is `pid-<supervisor>-fd-<n>`: where the
//! supervisor keeps its memory file of the job's `NAME=value` lines. Readers open
//! `/proc/<supervisor>/fd/<n>` themselves; the link itself resolves to nothing (a name in
//! this folder that is never made), so a tool that walks the state root following links
//! (`grep -r`, a backup) reads no value through it. The values never touch the disk; only
//! the agent's user (or root) can open `/proc/<pid>/fd` of a supervisor, which needs the
//! right to trace it. A supervisor that dies leaves a dangling name, removed
//! by the next reader that finds it so; a reused pid is caught by checking that what the
//! link opens is a memory file of this name.
//!
//! `<root>/secrets/.generation` grows by one byte each time a link is made, after the link
//! and before the job's shell starts (it is replaced by a fresh one-byte file when it
//! reaches 1 MiB). A supervisor stats it before each output chunk it processes and lists
//! the folder only when its size or inode changed, so a job with output pays one `stat`
//! per read, and a start with secrets a link and a one-byte append.
//!
//! A supervisor also watches the folder (inotify) and reads a new link as soon as it is
//! made, output or not: a job that copies a neighbour's secret while printing nothing,
//! and prints it after the neighbour ended, is caught as well. Where inotify cannot be had
//! (root's `fs.inotify.max_user_instances`, 128 by default, counts every supervisor), the
//! check before each chunk remains, which catches whatever is printed while its owner
//! runs.
//!
//! Why that order holds: a job can print a neighbour's secret only after reading it from
//! the neighbour's environment, which exists only once the neighbour's shell is exec'd,
//! which is after its generation byte was written. The supervisor reads the chunk, then
//! stats: it cannot see such a chunk without seeing the new generation.

use std::collections::BTreeSet;
use std::ffi::CStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::model::JobId;

/// The folder under the state root.
pub const DIR: &str = super::layout::SECRETS_DIR;
/// The generation file inside it.
const GENERATION: &str = ".generation";
/// The generation file is replaced once it is this large.
const GENERATION_MAX: u64 = 1 << 20;
/// The memory file's name, checked by readers (a link into a reused pid opens something
/// else).
const MEMFD_NAME: &CStr = c"gitterm-secrets";
/// The most bytes read from one job's file (its secrets are far smaller).
const READ_MAX: u64 = 1 << 20;

/// One running job's published secrets: the memory file the link names, and the link,
/// removed on drop.
pub struct Published {
    /// Kept open: the link names its descriptor.
    _file: File,
    link: PathBuf,
}

impl Drop for Published {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.link);
    }
}

/// Publishes the job's secrets (`NAME=value` lines) for the other supervisors, and bumps
/// the generation. Call it before the job's shell starts; keep the result for the job's
/// life.
pub fn publish(root: &Path, id: &JobId, text: &str) -> io::Result<Published> {
    let file = crate::os::spawn::named_memory_file(MEMFD_NAME, text.as_bytes())?;
    let dir = root.join(DIR);
    crate::state::fsutil::ensure_private_dir(&dir)?;
    let link = dir.join(id.as_str());
    let target = format!("pid-{}-fd-{}", std::process::id(), file.as_raw_fd());
    if let Err(e) = std::os::unix::fs::symlink(&target, &link) {
        if e.kind() != io::ErrorKind::AlreadyExists {
            return Err(e);
        }
        // Only a job of this id could have made it: one that was interrupted before.
        fs::remove_file(&link)?;
        std::os::unix::fs::symlink(&target, &link)?;
    }
    let published = Published { _file: file, link };
    bump(&dir)?;
    Ok(published)
}

/// Appends one byte to the generation file (a fresh file once it is large).
fn bump(dir: &Path) -> io::Result<()> {
    let path = dir.join(GENERATION);
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(&path)?;
    f.write_all(b".")?;
    if f.metadata()?.len() >= GENERATION_MAX {
        // A new inode: readers compare it as well as the size.
        let fresh = dir.join(format!("{GENERATION}.{}", std::process::id()));
        fs::write(&fresh, b".")?;
        fs::rename(&fresh, &path)?;
    }
    Ok(())
}

/// What a supervisor knows of the other jobs' secrets.
pub struct Watcher {
    dir: PathBuf,
    own: String,
    /// The generation file's (inode, size) when the folder was last listed.
    seen_generation: Option<(u64, u64)>,
    /// Jobs whose secrets were read (they never change while a job runs).
    seen: BTreeSet<String>,
    /// Wakes the supervisor when a link is made (absent without inotify).
    wake: Option<crate::os::watch::Watcher>,
}

impl Watcher {
    /// A watcher for the job `own` (whose secrets it skips); nothing is read yet.
    pub fn new(root: &Path, own: &JobId) -> Watcher {
        let dir = root.join(DIR);
        let wake = crate::state::fsutil::ensure_private_dir(&dir)
            .ok()
            .and_then(|()| crate::os::watch::Watcher::new(&dir));
        Watcher {
            dir,
            own: own.as_str().to_string(),
            seen_generation: None,
            seen: BTreeSet::new(),
            wake,
        }
    }

    /// What to poll for [`Watcher::woken`] (none without inotify).
    pub fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.wake.as_ref().map(std::os::fd::AsFd::as_fd)
    }

    /// After [`Watcher::fd`] polled readable: the values of jobs that published since.
    pub fn woken(&mut self) -> Vec<String> {
        match &self.wake {
            // The generation may not be bumped yet when the link's event arrives.
            Some(w) if w.drain() => self.scan(None),
            _ => Vec::new(),
        }
    }

    /// The values of the secrets of jobs that started since the last call (all running
    /// ones on the first): empty, after one `stat`, when none did.
    pub fn poll(&mut self) -> Vec<String> {
        let generation = fs::metadata(self.dir.join(GENERATION))
            .ok()
            .map(|m| (m.ino(), m.size()));
        // No generation file yet: no job has published; look again next time.
        if generation.is_none() || generation == self.seen_generation {
            return Vec::new();
        }
        self.scan(generation)
    }

    /// Lists the folder and reads the links not read yet.
    fn scan(&mut self, generation: Option<(u64, u64)>) -> Vec<String> {
        if generation.is_some() {
            self.seen_generation = generation;
        }
        let mut values = Vec::new();
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return values;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with('.') || name == self.own || self.seen.contains(name) {
                continue;
            }
            if JobId::parse(name).is_none() {
                continue;
            }
            match read_published(&entry.path()) {
                Ok(Some(text)) => {
                    if let Ok(vars) = crate::model::secret::parse(&text) {
                        values.extend(vars.into_iter().map(|v| v.value.expose().to_string()));
                    }
                    self.seen.insert(name.to_string());
                }
                Ok(None) => {}
                // Its supervisor is gone: the name is all that is left.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    let _ = fs::remove_file(entry.path());
                }
                Err(_) => {}
            }
        }
        values
    }
}

/// Reads the memory file a link names, if it still is a supervisor's file of secrets
/// (`None` for a link that names no such thing).
fn read_published(link: &Path) -> io::Result<Option<String>> {
    let target = fs::read_link(link)?;
    let Some((pid, fd)) = target
        .to_str()
        .and_then(|t| t.strip_prefix("pid-"))
        .and_then(|t| t.split_once("-fd-"))
        .and_then(|(p, f)| Some((p.parse::<u32>().ok()?, f.parse::<u32>().ok()?)))
    else {
        return Ok(None);
    };
    let f = File::open(format!("/proc/{pid}/fd/{fd}"))?;
    let opened = fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd()))?;
    let expected = format!("/memfd:{}", MEMFD_NAME.to_string_lossy());
    if !opened.to_string_lossy().starts_with(&expected) {
        return Ok(None);
    }
    let mut text = String::new();
    f.take(READ_MAX).read_to_string(&mut text)?;
    Ok(Some(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn id(n: u8) -> JobId {
        JobId::from_random([n; 10])
    }

    #[test]
    fn a_watcher_learns_each_published_job_once_and_skips_its_own() {
        let d = tempfile::tempdir().unwrap();
        let mut w = Watcher::new(d.path(), &id(1));
        assert!(w.poll().is_empty());
        let own = publish(d.path(), &id(1), "MINE=own-value-1\n").unwrap();
        let a = publish(d.path(), &id(2), "A=first-value-2\nB=second-value\n").unwrap();
        let mut got = w.poll();
        got.sort();
        assert_eq!(got, ["first-value-2", "second-value"]);
        // Nothing new: one stat, nothing read.
        assert!(w.poll().is_empty());
        let b = publish(d.path(), &id(3), "C=third-value-3\n").unwrap();
        assert_eq!(w.poll(), ["third-value-3"]);
        // A job that ends takes its name away; a watcher keeps what it learnt.
        drop(a);
        assert!(fs::symlink_metadata(d.path().join(DIR).join(id(2).as_str())).is_err());
        drop((own, b));
        let names: Vec<_> = fs::read_dir(d.path().join(DIR))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, [GENERATION]);
    }

    #[test]
    fn a_watcher_is_woken_by_a_publish() {
        let d = tempfile::tempdir().unwrap();
        let mut w = Watcher::new(d.path(), &id(1));
        let readable = |w: &Watcher| {
            crate::os::poll::readable(w.fd().expect("inotify here"), Duration::ZERO).unwrap()
        };
        assert!(!readable(&w));
        let p = publish(d.path(), &id(5), "W=woken-value-5\n").unwrap();
        assert!(readable(&w));
        assert_eq!(w.woken(), ["woken-value-5"]);
        assert!(w.woken().is_empty());
        assert!(w.poll().is_empty(), "already known");
        drop(p);
    }

    #[test]
    fn a_dangling_link_is_removed_and_a_foreign_file_is_not_read() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join(DIR);
        let keep = publish(d.path(), &id(9), "K=kept-value-9\n").unwrap();
        // A supervisor that died: its link names a descriptor nobody has.
        let gone = format!("pid-{}-fd-999999", std::process::id());
        std::os::unix::fs::symlink(&gone, dir.join(id(2).as_str())).unwrap();
        // A reused pid: the descriptor is some other file.
        let other = File::open("/etc/passwd").unwrap();
        let reused = format!("pid-{}-fd-{}", std::process::id(), other.as_raw_fd());
        std::os::unix::fs::symlink(&reused, dir.join(id(3).as_str())).unwrap();
        // Not a link of ours at all.
        std::os::unix::fs::symlink("/etc/passwd", dir.join(id(4).as_str())).unwrap();
        bump(&dir).unwrap();
        let mut w = Watcher::new(d.path(), &id(1));
        assert_eq!(w.poll(), ["kept-value-9"]);
        assert!(fs::symlink_metadata(dir.join(id(2).as_str())).is_err());
        assert!(fs::symlink_metadata(dir.join(id(3).as_str())).is_ok());
        // Followed as a path, a published link leads nowhere.
        assert!(fs::read(dir.join(id(9).as_str())).is_err());
        drop((keep, other));
    }

    #[test]
    fn the_generation_file_is_replaced_when_large_and_still_seen_to_change() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join(DIR);
        fs::create_dir(&dir).unwrap();
        fs::write(
            dir.join(GENERATION),
            vec![b'.'; GENERATION_MAX as usize - 1],
        )
        .unwrap();
        let mut w = Watcher::new(d.path(), &id(1));
        w.poll();
        let p = publish(d.path(), &id(4), "V=value-four\n").unwrap();
        assert_eq!(fs::metadata(dir.join(GENERATION)).unwrap().len(), 1);
        assert_eq!(w.poll(), ["value-four"]);
        drop(p);
    }
}
