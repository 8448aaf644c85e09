//! Waiting for changes in a folder with inotify, falling back to short naps.

use std::time::Duration;

/// Waits on a watcher, or naps briefly where inotify was unavailable.
pub fn nap(w: Option<&Watcher>, d: Duration) {
    match w {
        Some(w) => w.wait(d),
        None => std::thread::sleep(d.min(Duration::from_millis(20))),
    }
}

mod inner {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    use std::os::fd::AsFd;
    use std::path::Path;
    use std::time::Duration;

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
            let ms = nap.as_millis().min(i32::MAX as u128) as i32;
            let mut fds = [PollFd::new(self.0.as_fd(), PollFlags::POLLIN)];
            if poll(
                &mut fds,
                PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
            )
            .unwrap_or(0)
                > 0
            {
                let _ = self.0.read_events();
            }
        }
    }
}

pub use inner::Watcher;
