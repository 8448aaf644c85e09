//! Atomic exchange of two names (`renameat2(RENAME_EXCHANGE)`), which nix offers only
//! on glibc and the static build has musl.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Swaps what `a` and `b` name, atomically: each reader sees both old names or both new.
/// Both must exist on one filesystem. Unsupported (an old kernel, a filesystem without
/// it): `EINVAL` or `ENOSYS`, and nothing changed.
pub fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path holds a NUL byte"))
    };
    let (a, b) = (c(a)?, c(b)?);
    // SAFETY: two NUL-terminated paths that live for the call; the kernel only reads them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_swap_whole_and_a_missing_one_changes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        std::fs::write(&a, b"first").unwrap();
        std::fs::write(&b, b"second").unwrap();
        match exchange(&a, &b) {
            Ok(()) => {
                assert_eq!(std::fs::read(&a).unwrap(), b"second");
                assert_eq!(std::fs::read(&b).unwrap(), b"first");
            }
            // A filesystem without it: nothing moved.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {
                assert_eq!(std::fs::read(&a).unwrap(), b"first");
            }
            Err(e) => panic!("{e}"),
        }
        let gone = d.path().join("gone");
        assert!(exchange(&a, &gone).is_err());
        assert!(!gone.exists());
    }
}
