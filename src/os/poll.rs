//! Waiting on one fd with a deadline: the one place that turns a `Duration` into poll(2).

use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

/// Waits up to `timeout` for `fd` to turn readable (or hung up); true if it did. An
/// interrupted wait counts as "not yet", so callers loop on their own deadline.
pub fn readable(fd: impl AsFd, timeout: Duration) -> io::Result<bool> {
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, poll_timeout(timeout)) {
        Ok(n) => Ok(n > 0),
        Err(nix::errno::Errno::EINTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// A poll timeout of at least `d` rounded up to whole milliseconds (so a wait for 0.4 ms
/// does not spin), capped at the largest poll accepts.
pub fn poll_timeout(d: Duration) -> PollTimeout {
    let ms = d.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Instant;

    #[test]
    fn waits_until_readable_or_the_deadline() {
        let (r, mut w) = std::io::pipe().unwrap();
        let t = Instant::now();
        assert!(!readable(&r, Duration::from_millis(30)).unwrap());
        assert!(t.elapsed() >= Duration::from_millis(30));
        w.write_all(b"x").unwrap();
        assert!(readable(&r, Duration::from_secs(5)).unwrap());
        drop(w);
        assert!(readable(&r, Duration::from_secs(5)).unwrap());
    }
}
