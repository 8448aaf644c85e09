//! A recursive delete removes any tree a job can make, however deep, on the files
//! thread's small stack, and nothing outside it: the input is a program that enters and
//! leaves folders, makes files, symlinks out (to `/`, up, beside) and hard links.
#![no_main]
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use gitterm_agent::os::files;
use libfuzzer_sys::fuzz_target;
use nix::fcntl::{AT_FDCWD, AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, mkdirat};

static RUN: AtomicU64 = AtomicU64::new(0);

fn scratch() -> PathBuf {
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let n = RUN.fetch_add(1, Ordering::Relaxed);
    let d = base.join(format!("gitterm-fuzz-tree-{}-{n}", std::process::id()));
    std::fs::create_dir(&d).unwrap();
    d
}

fn enter(at: &OwnedFd, name: &str) -> OwnedFd {
    openat(at, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap()
}

fuzz_target!(|data: &[u8]| {
    let d = scratch();
    let (root, keep, top) = (d.join("state"), d.join("keep"), d.join("top"));
    std::fs::create_dir(&root).unwrap();
    std::fs::write(&keep, "k").unwrap();
    std::fs::create_dir(&top).unwrap();
    let mut cur = openat(AT_FDCWD, &top, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty())
        .unwrap();
    let mut depth = 0usize;
    for (i, op) in data.iter().enumerate() {
        let name = format!("n{}", op >> 3);
        match op & 7 {
            // Mostly down: the deep cases are the point.
            0..=3 => {
                if mkdirat(&cur, name.as_str(), Mode::from_bits_truncate(0o755)).is_ok() {
                    cur = enter(&cur, &name);
                    depth += 1;
                }
            }
            4 if depth > 0 => {
                cur = enter(&cur, "..");
                depth -= 1;
            }
            5 => {
                let _ = openat(
                    &cur,
                    name.as_str(),
                    OFlag::O_CREAT | OFlag::O_WRONLY,
                    Mode::from_bits_truncate(0o600),
                );
            }
            6 => {
                let to = ["/", "..", "../..", "."][i % 4];
                let _ = nix::unistd::symlinkat(to, &cur, name.as_str());
            }
            _ => {
                let _ = nix::unistd::linkat(AT_FDCWD, &keep, &cur, name.as_str(), AtFlags::empty());
            }
        }
    }
    drop(cur);
    let path = top.as_os_str().as_bytes().to_vec();
    let r = files::as_user(None, &root, |g| {
        let p = files::resolve(g, &path, files::FinalLink::Keep, files::Intent::MoveOrRemove)?;
        files::remove(g, &p, true)
    })
    .unwrap();
    assert!(r.is_ok(), "{r:?}");
    assert!(!top.exists());
    assert_eq!(std::fs::read(&keep).unwrap(), b"k");
    assert!(root.is_dir() && Path::new("/bin").exists());
    std::fs::remove_dir_all(&d).unwrap();
});
