//! Private folders and atomic file replacement.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Creates a folder (and parents) with mode 0700, and tightens it if it already existed.
pub fn ensure_private_dir(path: &Path) -> io::Result<()> {
    // One mkdir and one stat where the folder is there (every start asks for several).
    match fs::DirBuilder::new().mode(0o700).create(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)?,
        r => r?,
    }
    let meta = fs::metadata(path)?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            format!("{} is not a folder", path.display()),
        ));
    }
    if meta.permissions().mode() & 0o777 != 0o700 {
        fs::set_permissions(path, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Opens (creating, mode 0600, never truncating) the file a store takes its lock on.
pub fn open_lock_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
}

/// Replaces `path` atomically: write a temp file beside it, fsync, rename, fsync the folder.
/// A crash at any instant leaves either the old or the new content.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    replace(path, data, mode)?.sync()
}

/// A file replaced atomically whose new content every reader already sees, but which is
/// not yet known to be on disk: a crash of any process loses nothing (the page cache has
/// it); only a kernel crash or power loss before [`Unsynced::sync`] can.
#[must_use = "sync it, or say why a kernel crash may lose it"]
pub struct Unsynced {
    file: File,
    dir: PathBuf,
}

impl Unsynced {
    /// Makes the replacement durable: the file, then the folder entry.
    pub fn sync(self) -> io::Result<()> {
        self.file.sync_all()?;
        File::open(&self.dir)?.sync_all()
    }
}

/// Replaces `path` atomically (temp file beside it, then rename) without waiting for the
/// disk; see [`Unsynced`].
pub fn replace(path: &Path, data: &[u8], mode: u32) -> io::Result<Unsynced> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut rnd = [0u8; 6];
    crate::os::proc::random_bytes(&mut rnd)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.{}.tmp", crate::model::id::hex(&rnd)));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(data)?;
        fs::rename(&tmp, path)?;
        Ok(f)
    })();
    match result {
        Ok(file) => Ok(Unsynced {
            file,
            dir: dir.to_path_buf(),
        }),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// A file holding room for a record to come: made with its blocks taken, written and
/// renamed into place later, so that the write cannot fail for want of space.
pub struct Reserved {
    file: File,
    /// The room is zeros written (the filesystem cannot allocate without writing): the
    /// file must be cut to the record's length.
    padded: bool,
}

/// Makes `path` (new, empty) with `bytes` of room: blocks allocated past its end where
/// the filesystem can (nothing to cut later, so a record that fits frees no block), else
/// zeros written.
pub fn reserve(path: &Path, bytes: usize, mode: u32) -> io::Result<Reserved> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)?;
    reserve_in(file, bytes)
}

/// Gives the (empty) `file` `bytes` of room.
fn reserve_in(mut file: File, bytes: usize) -> io::Result<Reserved> {
    use nix::fcntl::{FallocateFlags, fallocate};
    let padded = fallocate(&file, FallocateFlags::FALLOC_FL_KEEP_SIZE, 0, bytes as i64).is_err();
    if padded {
        file.write_all(&vec![0u8; bytes])?;
    }
    Ok(Reserved { file, padded })
}

impl Reserved {
    /// Writes `data` into the reserved file, now at `from`, and renames it over `to`
    /// (atomic, as [`replace`]); not synced, see [`Unsynced`]. Data longer than the room
    /// is written all the same (it may then need new blocks).
    pub fn replace(self, from: &Path, to: &Path, data: &[u8]) -> io::Result<Unsynced> {
        self.write(data)?;
        fs::rename(from, to)?;
        Ok(self.unsynced(to))
    }

    /// [`Reserved::replace`], but the file it replaces is not freed: the two names are
    /// exchanged (true in the answer), and the old file is left at `from` for the caller
    /// to keep. On ext4 without a journal every inode freed in the last minutes is
    /// skipped, one by one, by every later inode allocation in its block group, so a
    /// record freed per job made each new file of every later start dearer (0.1–0.4 ms
    /// after a few thousand jobs). Where the exchange is not supported, a plain rename
    /// (false).
    pub fn exchange(self, from: &Path, to: &Path, data: &[u8]) -> io::Result<(Unsynced, bool)> {
        self.write(data)?;
        let exchanged = match crate::os::rename::exchange(from, to) {
            Ok(()) => true,
            Err(_) => {
                fs::rename(from, to)?;
                false
            }
        };
        Ok((self.unsynced(to), exchanged))
    }

    fn write(&self, data: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.file.write_all_at(data, 0)?;
        if self.padded {
            self.file.set_len(data.len() as u64)?;
        }
        Ok(())
    }

    fn unsynced(self, to: &Path) -> Unsynced {
        Unsynced {
            file: self.file,
            dir: to.parent().unwrap_or(Path::new(".")).to_path_buf(),
        }
    }

    /// [`reserve`] on a file that exists (a recycled one): emptied, then given the room.
    pub fn adopt(file: File, bytes: usize) -> io::Result<Reserved> {
        file.set_len(0)?;
        reserve_in(file, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_dirs_are_made_nested_tightened_and_never_a_file() {
        let d = tempfile::tempdir().unwrap();
        let nested = d.path().join("a/b/c");
        ensure_private_dir(&nested).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&nested), 0o700);
        fs::set_permissions(&nested, fs::Permissions::from_mode(0o755)).unwrap();
        ensure_private_dir(&nested).unwrap();
        assert_eq!(mode(&nested), 0o700);
        let file = d.path().join("f");
        fs::write(&file, b"x").unwrap();
        let e = ensure_private_dir(&file).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotADirectory, "{e}");
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

    #[test]
    fn a_reserved_file_becomes_the_record_whole() {
        let d = tempfile::tempdir().unwrap();
        let (room, rec) = (d.path().join("room"), d.path().join("rec"));
        write_atomic(&rec, b"the first record, longer than the last", 0o600).unwrap();
        let r = reserve(&room, 16 * 1024, 0o600).unwrap();
        {
            use std::os::unix::fs::MetadataExt;
            let m = fs::metadata(&room).unwrap();
            // Blocks taken, past the end or as zeros.
            assert!(m.blocks() * 512 >= 16 * 1024, "{} blocks", m.blocks());
        }
        let (u, exchanged) = r.exchange(&room, &rec, b"final").unwrap();
        u.sync().unwrap();
        assert_eq!(fs::read(&rec).unwrap(), b"final");
        // The first record was not freed: it is at the room's name now (gone where the
        // filesystem cannot exchange names), and adopted as a room it is empty.
        if exchanged {
            assert_eq!(
                fs::read(&room).unwrap(),
                b"the first record, longer than the last"
            );
            let f = OpenOptions::new().write(true).open(&room).unwrap();
            let r = Reserved::adopt(f, 8192).unwrap();
            assert_eq!(fs::read(&room).unwrap(), b"");
            r.replace(&room, &rec, b"again").unwrap().sync().unwrap();
            assert!(!room.exists());
            assert_eq!(fs::read(&rec).unwrap(), b"again");
        } else {
            assert!(!room.exists());
        }
        let _ = fs::remove_file(&room);
        assert_eq!(
            fs::metadata(&rec).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // More than the room is still written whole.
        let r = reserve(&room, 4, 0o600).unwrap();
        let big = vec![b'x'; 100_000];
        r.replace(&room, &rec, &big).unwrap().sync().unwrap();
        assert_eq!(fs::read(&rec).unwrap(), big);
    }

    #[test]
    fn a_reserve_refuses_an_existing_file() {
        let d = tempfile::tempdir().unwrap();
        let room = d.path().join("room");
        fs::write(&room, b"someone else's").unwrap();
        assert!(reserve(&room, 16, 0o600).is_err());
        assert_eq!(fs::read(&room).unwrap(), b"someone else's");
    }
}
