//! Private folders and atomic file replacement.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

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

#[cfg(test)]
mod tests {
    use super::*;

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
