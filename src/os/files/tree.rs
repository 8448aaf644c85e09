//! Walks over folders: a recursive delete, and a page of a folder's names. Neither
//! recurses nor holds more than one folder open, so no tree is too deep for them, and
//! their memory goes with a level's name or a page, not with the tree or the folder.

use std::collections::BinaryHeap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, openat};
use nix::sys::stat::{FileStat, Mode, fstat, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use super::guard::{Guard, Id, Place, id_of};
use super::{READ_DIR, is_dir, open_folder};

/// Removes the entry at `p`; a folder's content too if `recursive` (never crossing into
/// the state root).
pub fn remove(guard: &Guard, p: &Place, recursive: bool) -> io::Result<()> {
    let Some(st) = &p.st else {
        return Err(Errno::ENOENT.into());
    };
    if !is_dir(st) {
        unlinkat(&p.dir, p.name.as_c_str(), UnlinkatFlags::NoRemoveDir)?;
        return Ok(());
    }
    if recursive {
        let top = openat(&p.dir, p.name.as_c_str(), READ_DIR, Mode::empty())?;
        if id_of(&fstat(&top)?) != id_of(st) {
            return Err(Errno::ESTALE.into());
        }
        empty(guard, top)?;
    }
    unlinkat(&p.dir, p.name.as_c_str(), UnlinkatFlags::RemoveDir)?;
    Ok(())
}

/// Empties the folder `top`, depth first, as `fts` walks without `chdir`: one folder open
/// at a time, and for each level below `top` only the identity of the folder above and
/// the name of the one entered (at most 255 bytes), so memory grows by a few hundred
/// bytes a level, descriptors not at all, and no path is ever formed (a tree 10,000
/// levels deep has paths far over `PATH_MAX`). The walk climbs back through `..`, checked
/// against the identity recorded on the way down: a folder moved meanwhile stops the
/// walk (`ESTALE`) rather than letting it delete somewhere else.
fn empty(guard: &Guard, top: OwnedFd) -> io::Result<()> {
    let mut cur = top;
    let mut trail: Vec<(Id, CString)> = Vec::new();
    loop {
        match clear_files(cur.as_fd())? {
            Some((name, st)) => {
                // Only a folder's identity can take the walk into the state root (a bind
                // mount of it, or of a folder above it, in the tree).
                guard.check_walked(&st)?;
                let child = openat(&cur, name.as_c_str(), READ_DIR, Mode::empty())?;
                if id_of(&fstat(&child)?) != id_of(&st) {
                    return Err(Errno::ESTALE.into());
                }
                trail.push((id_of(&fstat(&cur)?), name));
                cur = child;
            }
            None => {
                let Some((above, name)) = trail.pop() else {
                    return Ok(());
                };
                let up = openat(&cur, "..", READ_DIR, Mode::empty())?;
                if id_of(&fstat(&up)?) != above {
                    return Err(Errno::ESTALE.into());
                }
                drop(cur);
                unlinkat(&up, name.as_c_str(), UnlinkatFlags::RemoveDir)?;
                cur = up;
            }
        }
    }
}

/// Unlinks the entries of `dir` that are not folders, up to its first folder, whose name
/// and stat it returns; `None` once it is empty.
fn clear_files(dir: BorrowedFd<'_>) -> io::Result<Option<(CString, FileStat)>> {
    let mut d = Dir::openat(dir, ".", READ_DIR, Mode::empty())?;
    for e in d.iter() {
        let e = e?;
        let name = e.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        // What readdir says is not a folder is unlinked as it stands; a folder swapped in
        // meanwhile (EISDIR), or an entry of unknown type, is looked at first.
        if e.file_type().is_some_and(|t| t != Type::Directory) {
            match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => continue,
                Err(Errno::EISDIR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let st = match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(e.into()),
        };
        if is_dir(&st) {
            return Ok(Some((name.to_owned(), st)));
        }
        match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

/// The `cap` smallest of the names offered, bytewise: a max-heap that lets a name in
/// only if it is smaller than the largest kept, so it holds `cap` names at most.
pub struct Smallest {
    cap: usize,
    heap: BinaryHeap<Vec<u8>>,
}

impl Smallest {
    /// Keeps at most `cap` names.
    pub fn new(cap: usize) -> Smallest {
        Smallest {
            cap,
            heap: BinaryHeap::with_capacity(cap.min(4096)),
        }
    }

    /// Keeps `name` if it is among the `cap` smallest so far (copied only then).
    pub fn offer(&mut self, name: &[u8]) {
        if self.heap.len() < self.cap {
            self.heap.push(name.to_vec());
        } else if self.heap.peek().is_some_and(|top| name < top.as_slice()) {
            self.heap.pop();
            self.heap.push(name.to_vec());
        }
    }

    /// The names kept, in order.
    pub fn into_sorted(self) -> Vec<Vec<u8>> {
        self.heap.into_sorted_vec()
    }
}

/// The page of the folder at `p` after `after`: its `limit` smallest names greater than
/// `after`, sorted bytewise, and whether more follow. One pass over the folder keeps
/// `limit + 1` names at most, so a page of a 200,000-entry folder costs the page's
/// memory, not the folder's. A name the folder holds throughout a paging is on exactly
/// one page (the cursor is a name, not a position); one added or removed meanwhile may
/// or may not be.
pub fn page(p: &Place, after: Option<&[u8]>, limit: usize) -> io::Result<(Vec<Vec<u8>>, bool)> {
    let mut dir = Dir::from_fd(open_folder(p)?)?;
    let mut keep = Smallest::new(limit.saturating_add(1));
    for e in dir.iter() {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n == b"." || n == b".." || after.is_some_and(|a| n <= a) {
            continue;
        }
        keep.offer(n);
    }
    let mut names = keep.into_sorted();
    let more = names.len() > limit;
    names.truncate(limit);
    Ok((names, more))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::files::{FinalLink, Intent};
    use nix::fcntl::OFlag;
    use proptest::prelude::*;
    use std::os::unix::ffi::OsStrExt;
    use std::path::{Path, PathBuf};

    proptest! {
        #[test]
        fn the_smallest_are_kept_in_order(
            names in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..4), 0..60),
            cap in 0usize..12,
        ) {
            let mut s = Smallest::new(cap);
            for n in &names {
                s.offer(n);
            }
            let mut want = names.clone();
            want.sort();
            want.truncate(cap);
            prop_assert_eq!(s.into_sorted(), want);
        }
    }

    /// Builds a tree below `top` from `ops` as a hostile job might: folders entered and
    /// left, files, symlinks out of it (to `/`, up, to `keep`), hard links to `keep`.
    fn build(top: &Path, keep: &Path, ops: &[u8]) {
        let open = |at: &OwnedFd, name: &str| {
            openat(
                at,
                name,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY,
                Mode::empty(),
            )
            .unwrap()
        };
        let mut cur = openat(
            nix::fcntl::AT_FDCWD,
            top,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
        let mut depth = 0usize;
        for (i, op) in ops.iter().enumerate() {
            let name = format!("n{}", op >> 3);
            match op & 7 {
                0..=2 => {
                    if nix::sys::stat::mkdirat(&cur, name.as_str(), Mode::from_bits_truncate(0o755))
                        .is_ok()
                    {
                        cur = open(&cur, &name);
                        depth += 1;
                    }
                }
                3 if depth > 0 => {
                    cur = open(&cur, "..");
                    depth -= 1;
                }
                4 => {
                    let _ = openat(
                        &cur,
                        name.as_str(),
                        OFlag::O_CREAT | OFlag::O_WRONLY,
                        Mode::from_bits_truncate(0o600),
                    );
                }
                5 => {
                    let to = ["/", "..", "../..", "."][i % 4];
                    let _ = nix::unistd::symlinkat(to, &cur, name.as_str());
                }
                6 => {
                    let _ = nix::unistd::symlinkat(keep, &cur, name.as_str());
                }
                _ => {
                    let _ = nix::unistd::linkat(
                        nix::fcntl::AT_FDCWD,
                        keep,
                        &cur,
                        name.as_str(),
                        AtFlags::empty(),
                    );
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn any_tree_a_job_can_make_is_removed_and_nothing_outside(
            ops in proptest::collection::vec(any::<u8>(), 0..600),
        ) {
            let (_d, root, keep, top) = scratch();
            build(&top, &keep, &ops);
            super::super::as_user(None, &root, |g| remove(g, &place(&top, g), true))
                .unwrap()
                .unwrap();
            prop_assert!(!top.exists());
            prop_assert_eq!(std::fs::read(&keep).unwrap(), b"k");
            prop_assert!(root.exists() && Path::new("/bin").exists());
        }
    }

    fn place(path: &Path, g: &Guard) -> Place {
        super::super::resolve(
            g,
            path.as_os_str().as_bytes(),
            FinalLink::Keep,
            Intent::MoveOrRemove,
        )
        .unwrap()
    }

    /// A scratch folder (on tmpfs where there is one: the disk's journal makes the tests
    /// slow, not harder) with a state root, a file outside the tree to keep, and the top of
    /// the tree to remove.
    fn scratch() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
        let d = tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .unwrap();
        let root = d.path().join("state");
        std::fs::create_dir(&root).unwrap();
        let keep = d.path().join("keep");
        std::fs::write(&keep, "k").unwrap();
        let top = d.path().join("top");
        std::fs::create_dir(&top).unwrap();
        (d, root, keep, top)
    }

    /// Makes `levels` nested folders `d` below `at` (by descriptor: no path that long
    /// could be named), with a file and a symlink out at every `every`th level.
    fn deep(at: &Path, levels: usize, every: usize, outside: &Path) {
        let mut cur = openat(
            nix::fcntl::AT_FDCWD,
            at,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
        for i in 0..levels {
            if every > 0 && i % every == 0 {
                let f = openat(
                    &cur,
                    "f",
                    OFlag::O_CREAT | OFlag::O_WRONLY,
                    Mode::from_bits_truncate(0o644),
                )
                .unwrap();
                drop(f);
                nix::unistd::symlinkat(outside, &cur, "out").unwrap();
            }
            nix::sys::stat::mkdirat(&cur, "d", Mode::from_bits_truncate(0o755)).unwrap();
            cur = openat(
                &cur,
                "d",
                OFlag::O_RDONLY | OFlag::O_DIRECTORY,
                Mode::empty(),
            )
            .unwrap();
        }
    }

    #[test]
    fn a_tree_ten_thousand_levels_deep_is_removed_on_a_small_stack() {
        let (_d, root, keep, top) = scratch();
        deep(&top, 10_000, 97, &keep);
        // The files thread's own stack: 256 KiB, far less than a recursion would need.
        super::super::as_user(None, &root, |g| remove(g, &place(&top, g), true))
            .unwrap()
            .unwrap();
        assert!(!top.exists());
        assert_eq!(std::fs::read(&keep).unwrap(), b"k");
    }

    #[test]
    fn a_bind_mount_of_a_folder_above_the_root_stops_a_delete() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("state");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("agent.token"), "t").unwrap();
        let top = d.path().join("top");
        std::fs::create_dir_all(top.join("a/b")).unwrap();
        let ok = std::process::Command::new("mount")
            .arg("--bind")
            .arg(d.path())
            .arg(top.join("a/b"))
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return;
        }
        let r = super::super::as_user(None, &root, |g| remove(g, &place(&top, g), true)).unwrap();
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(top.join("a/b"))
            .status();
        assert!(r.is_err_and(|e| super::super::is_forbidden(&e)));
        assert_eq!(std::fs::read(root.join("agent.token")).unwrap(), b"t");
    }
}
