//! Process handles that can never signal a reused pid.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nix::sys::signal::Signal;

use super::proc::stat;

/// A handle on one process that can never signal a reused pid.
pub struct Pidfd(OwnedFd);

impl Pidfd {
    /// Opens a handle on `pid` if it still is the process that started at `start`.
    pub fn open(pid: i32, start: u64) -> Option<Pidfd> {
        if pid <= 1 {
            return None;
        }
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return None;
        }
        // SAFETY: the syscall returned a fresh fd that nothing else owns.
        let fd = Pidfd(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        // The pid could have been reused between the caller's look and the open: check the
        // start time after the open, when the fd pins the process.
        (stat(pid)?.start == start).then_some(fd)
    }

    /// Waits up to `timeout` for the process to exit (a pidfd turns readable then); true
    /// if it did.
    pub fn wait_exit(&self, timeout: std::time::Duration) -> bool {
        super::poll::readable(&self.0, timeout).unwrap_or(false)
    }

    /// Sends `sig`; false if the process is gone.
    pub fn signal(&self, sig: Signal) -> bool {
        // SAFETY: the fd is a valid pidfd we own; a null siginfo means "as kill(2)".
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                sig as i32,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        r == 0
    }
}

/// Signals a process only if it is still the one that started at `start`.
pub fn signal_verified(pid: i32, start: u64, sig: Signal) -> bool {
    Pidfd::open(pid, start).is_some_and(|p| p.signal(sig))
}

/// Continues the process that started at `start` if it is stopped (by SIGSTOP or a
/// tracer's stop); true if it was. A job that stops its supervisor (possible only when it
/// runs as the agent's user) must not freeze the supervision for good.
pub fn continue_if_stopped(pid: i32, start: u64) -> bool {
    match stat(pid) {
        Some(s) if s.start == start && matches!(s.state, 'T' | 't') => {
            signal_verified(pid, start, Signal::SIGCONT)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pidfd_refuses_wrong_start_and_low_pids() {
        let me = std::process::id() as i32;
        let st = stat(me).unwrap();
        assert!(Pidfd::open(me, st.start).is_some());
        assert!(Pidfd::open(me, st.start + 1).is_none());
        assert!(Pidfd::open(1, 0).is_none());
        assert!(Pidfd::open(0, 0).is_none());
    }
}
