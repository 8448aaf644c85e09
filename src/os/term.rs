//! The local terminal of `attach`: raw mode (restored on drop) and its size.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use nix::sys::termios::{self, SetArg, Termios};

/// The terminal in raw mode; dropping it restores the settings it had.
pub struct RawMode<'a> {
    fd: BorrowedFd<'a>,
    saved: Termios,
}

impl<'a> RawMode<'a> {
    /// Puts `fd` in raw mode; `None` when it is not a terminal.
    pub fn enter(fd: BorrowedFd<'a>) -> Option<RawMode<'a>> {
        let saved = termios::tcgetattr(fd).ok()?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(fd, SetArg::TCSADRAIN, &raw).ok()?;
        Some(RawMode { fd, saved })
    }
}

impl Drop for RawMode<'_> {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(self.fd, SetArg::TCSADRAIN, &self.saved);
    }
}

/// The size of the terminal on `fd` as (cols, rows); `None` when it is not one.
pub fn size(fd: impl AsFd) -> Option<(u16, u16)> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `struct winsize` to the pointer, valid for the call.
    let r = unsafe { libc::ioctl(fd.as_fd().as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
    (r == 0 && ws.ws_col > 0 && ws.ws_row > 0).then_some((ws.ws_col, ws.ws_row))
}
