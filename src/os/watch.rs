//! Waiting for changes in a folder with inotify, falling back to short naps.

use std::path::Path;
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

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
        if super::poll::readable(&self.0, nap).unwrap_or(false) {
            let _ = self.0.read_events();
        }
    }
}

impl Watcher {
    /// Reads the events that are there without blocking; true if there were any.
    pub fn drain(&self) -> bool {
        let mut any = false;
        while let Ok(ev) = self.0.read_events() {
            if ev.is_empty() {
                break;
            }
            any = true;
        }
        any
    }
}

impl std::os::fd::AsFd for Watcher {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Waits on a watcher, or naps briefly where inotify was unavailable.
pub fn nap(w: Option<&Watcher>, d: Duration) {
    match w {
        Some(w) => w.wait(d),
        None => std::thread::sleep(d.min(Duration::from_millis(20))),
    }
}
