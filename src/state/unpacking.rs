//! The unpacks in progress: `<root>/unpacking/<id>`, one file per unpack, made before its
//! staging folder and removed once the staging folder is gone. The unpack writes the
//! staging folder's absolute path into it (the name is chosen inside the target, where
//! only the job user's side knows the real path) and holds an flock on it for its whole
//! life, so a file found unlocked names what a server that died mid-unpack left behind.
//!
//! Staging folders can be anywhere a client unpacks to, and the job user's trees are too
//! big to walk: this journal is what lets a start find them at once.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The folder of the journal under the state root.
pub const UNPACKING_DIR: &str = "unpacking";

/// One unpack's journal entry: locked while it lives, removed when dropped.
pub struct Entry {
    file: File,
    path: PathBuf,
}

impl Entry {
    /// Makes and locks a new entry (empty: the unpack writes its staging folder's path).
    pub fn begin(root: &Path) -> io::Result<Entry> {
        let dir = root.join(UNPACKING_DIR);
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let path = dir.join(crate::os::files::random_hex());
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        file.lock()?;
        Ok(Entry { file, path })
    }

    /// The open entry, for the unpack to write its staging folder's path into (an open
    /// descriptor: written by the job user's side, which may not open the state root).
    pub fn file(&self) -> &File {
        &self.file
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A journal entry no live unpack holds: what a dead server's unpack left.
pub struct Stale {
    /// The entry's own file, removed by [`Stale::done`].
    pub entry: PathBuf,
    /// The staging folder it names (empty if the unpack died before naming one).
    pub staging: Vec<u8>,
}

impl Stale {
    /// Removes the entry (once its staging folder is dealt with).
    pub fn done(self) {
        let _ = std::fs::remove_file(&self.entry);
    }
}

/// The entries no live unpack holds (one that holds its lock is skipped: another server
/// on the same root may be unpacking).
pub fn stale(root: &Path) -> Vec<Stale> {
    let Ok(rd) = std::fs::read_dir(root.join(UNPACKING_DIR)) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let Ok(mut f) = File::open(e.path()) else {
            continue;
        };
        if f.try_lock().is_err() {
            continue;
        }
        let mut staging = Vec::new();
        // A path is at most a few KiB; more is not ours.
        if (&mut f).take(1 << 16).read_to_end(&mut staging).is_err() {
            continue;
        }
        out.push(Stale {
            entry: e.path(),
            staging,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_live_entry_is_not_stale_and_a_dropped_one_is_gone() {
        let root =
            std::env::temp_dir().join(format!("unpacking-test-{}", crate::os::files::random_hex()));
        std::fs::create_dir(&root).unwrap();
        let e = Entry::begin(&root).unwrap();
        e.file().write_all(b"/x/.gitterm-unpack-0").unwrap();
        assert!(stale(&root).is_empty(), "a held entry counted as stale");
        // What a dead server leaves: the file, with nobody holding it.
        let left = root.join(UNPACKING_DIR).join("0123");
        std::fs::write(&left, b"/y/.gitterm-unpack-1").unwrap();
        let s = stale(&root);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].staging, b"/y/.gitterm-unpack-1");
        drop(e);
        for s in s {
            s.done();
        }
        assert_eq!(
            std::fs::read_dir(root.join(UNPACKING_DIR)).unwrap().count(),
            0
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
