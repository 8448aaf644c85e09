//! Reading files that only their owner may read (secret files, token files), refusing
//! anything else before it is opened where possible.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::model::error::{Error, Result};
#[cfg(test)]
use crate::model::secret::serialize;
use crate::model::secret::{SecretVar, parse};

/// The largest private file [`read_private_file`] reads.
pub const MAX_PRIVATE_FILE_BYTES: u64 = 1024 * 1024;

/// Reads a file that only its owner may read: a regular file (symlinks are not followed),
/// owned by the effective uid, with no group or other permission bits, at most
/// [`MAX_PRIVATE_FILE_BYTES`]. `what` ("secret file", "token file") starts every message.
pub fn read_private_file(path: &Path, what: &str) -> Result<Vec<u8>> {
    let shown = path.display();
    let refuse = |problem: &str| Error::Invalid(format!("{what} {shown}: {problem}"));
    // lstat first so that a FIFO or device is refused without ever being opened (opening
    // some devices has side effects); the fstat below closes the race with a swap.
    let before = std::fs::symlink_metadata(path).map_err(|e| refuse(&io_problem(&e)))?;
    check_type(&before.file_type()).map_err(|p| refuse(&p))?;
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| refuse(&io_problem(&e)))?;
    let meta = file
        .metadata()
        .map_err(|e| refuse(&format!("cannot inspect it ({e})")))?;
    check_type(&meta.file_type()).map_err(|p| refuse(&p))?;
    if (meta.dev(), meta.ino()) != (before.dev(), before.ino()) {
        return Err(refuse(
            "it was replaced while being opened; it must stay in place",
        ));
    }
    let euid = nix::unistd::geteuid().as_raw();
    if meta.uid() != euid {
        return Err(refuse(&format!(
            "it is owned by uid {}; it must be owned by the agent's user (uid {euid})",
            meta.uid()
        )));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(refuse(&format!(
            "its mode is {mode:04o}; it must be readable by its owner only (0600 or 0400)"
        )));
    }
    if meta.len() > MAX_PRIVATE_FILE_BYTES {
        return Err(too_large(what, path, meta.len()));
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    read_capped(&mut file, &mut data).map_err(|e| refuse(&format!("cannot read it ({e})")))?;
    if data.len() as u64 > MAX_PRIVATE_FILE_BYTES {
        return Err(too_large(what, path, data.len() as u64));
    }
    Ok(data)
}

fn read_capped(file: &mut File, data: &mut Vec<u8>) -> io::Result<()> {
    // One byte past the cap tells a file that grew after the fstat from one at the cap.
    file.take(MAX_PRIVATE_FILE_BYTES + 1).read_to_end(data)?;
    Ok(())
}

fn too_large(what: &str, path: &Path, len: u64) -> Error {
    Error::TooLarge(format!(
        "{what} {}: it holds {len} bytes; the limit is {MAX_PRIVATE_FILE_BYTES} bytes",
        path.display()
    ))
}

fn check_type(t: &std::fs::FileType) -> std::result::Result<(), String> {
    let kind = if t.is_file() {
        return Ok(());
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    };
    Err(format!(
        "it is {kind}; it must be a regular file (symbolic links are not followed)"
    ))
}

fn io_problem(e: &io::Error) -> String {
    match e.raw_os_error() {
        // O_NOFOLLOW reports a symlink swapped in after the lstat as ELOOP.
        Some(libc::ELOOP) => {
            "it is a symbolic link; it must be a regular file (symbolic links are not followed)"
                .to_string()
        }
        _ => format!("cannot open it ({e})"),
    }
}

/// Loads a secret file after checking every rule; the error names the file and the rule.
/// See [`read_private_file`] for the file rules and [`parse`] for the content rules.
pub fn load_file(path: &Path) -> Result<Vec<SecretVar>> {
    let data = read_private_file(path, "secret file")?;
    let text = std::str::from_utf8(&data).map_err(|_| {
        Error::Invalid(format!(
            "secret file {}: it is not UTF-8 text; it must hold NAME=value lines",
            path.display()
        ))
    })?;
    parse(text).map_err(|m| Error::Invalid(format!("secret file {}: {m}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Duration, Instant};

    fn write(dir: &Path, name: &str, text: &str, mode: u32) -> std::path::PathBuf {
        let p = dir.join(name);
        fs::write(&p, text).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    fn invalid(r: Result<Vec<SecretVar>>) -> String {
        match r {
            Err(Error::Invalid(m)) => m,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn loads_a_good_file() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "s.env",
            "# comment\n\n  # indented comment\nA_KEY=abcd\n_b2=x=y=z\nA_KEY=last wins\n",
            0o600,
        );
        let v = load_file(&p).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].name, "_b2");
        assert_eq!(v[0].value.expose(), "x=y=z");
        assert_eq!(v[1].name, "A_KEY");
        assert_eq!(v[1].value.expose(), "last wins");
        assert_eq!(parse(&serialize(&v)).unwrap(), v);
    }

    #[test]
    fn mode_0400_is_accepted_and_group_or_other_bits_are_not() {
        let d = tempfile::tempdir().unwrap();
        let p = write(d.path(), "ro.env", "TOKEN=abcdef\n", 0o400);
        assert_eq!(load_file(&p).unwrap().len(), 1);
        for mode in [0o640, 0o604, 0o660, 0o644, 0o610] {
            let p = write(d.path(), &format!("m{mode:o}.env"), "TOKEN=abcdef\n", mode);
            let m = invalid(load_file(&p));
            assert!(m.contains(&p.display().to_string()), "{m}");
            assert!(
                m.contains(&format!("{mode:04o}")) && m.contains("0600"),
                "{m}"
            );
        }
    }

    #[test]
    fn symlinks_are_refused_even_to_good_files() {
        let d = tempfile::tempdir().unwrap();
        let good = write(d.path(), "good.env", "TOKEN=abcdef\n", 0o600);
        let link = d.path().join("link.env");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        let m = invalid(load_file(&link));
        assert!(m.contains("symbolic link") && m.contains("link.env"), "{m}");
    }

    #[test]
    fn fifo_is_refused_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("fifo");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let t = Instant::now();
        let m = invalid(load_file(&p));
        assert!(t.elapsed() < Duration::from_secs(1));
        assert!(m.contains("FIFO"), "{m}");
    }

    #[test]
    fn directories_devices_and_missing_files_are_refused() {
        let d = tempfile::tempdir().unwrap();
        assert!(invalid(load_file(d.path())).contains("directory"));
        let m = invalid(load_file(Path::new("/dev/null")));
        assert!(m.contains("device") && m.contains("/dev/null"), "{m}");
        let m = invalid(load_file(&d.path().join("missing")));
        assert!(m.contains("cannot open"), "{m}");
    }

    #[test]
    fn files_owned_by_someone_else_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = if nix::unistd::geteuid().is_root() {
            let p = write(d.path(), "theirs.env", "TOKEN=abcdef\n", 0o600);
            std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
            p
        } else {
            std::path::PathBuf::from("/etc/passwd") // root's, and readable
        };
        let m = invalid(read_private_file(&p, "token file").map(|_| Vec::new()));
        assert!(
            m.starts_with("token file ") && m.contains("owned by uid"),
            "{m}"
        );
    }

    #[test]
    fn oversized_files_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let big = "A".repeat(MAX_PRIVATE_FILE_BYTES as usize + 1);
        let p = write(d.path(), "big", &big, 0o600);
        match read_private_file(&p, "token file") {
            Err(Error::TooLarge(m)) => assert!(m.contains("token file") && m.contains("limit")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn load_file_wraps_content_errors_with_the_file() {
        let d = tempfile::tempdir().unwrap();
        let p = write(d.path(), "empty.env", "", 0o600);
        let m = invalid(load_file(&p));
        assert!(m.contains("empty.env") && m.contains("no variables"), "{m}");
        let p = d.path().join("bin.env");
        fs::write(&p, b"A=\xff\xfe\xfd\xfc\n").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(invalid(load_file(&p)).contains("UTF-8"));
    }
}
