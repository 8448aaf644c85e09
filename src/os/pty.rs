//! Pseudo-terminals: the pair a terminal job runs on, and its size.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};

/// A pseudo-terminal pair: the supervisor keeps `master`, the job gets `slave`.
pub struct Pair {
    pub master: OwnedFd,
    pub slave: OwnedFd,
}

/// Opens a pair of `cols` × `rows` cells. Both ends are close-on-exec (the child's copies
/// of the slave are made by dup2, which clears it); the master is non-blocking.
pub fn open(cols: u16, rows: u16) -> io::Result<Pair> {
    let ws = nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let r = nix::pty::openpty(Some(&ws), None)?;
    for fd in [&r.master, &r.slave] {
        fcntl(fd.as_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    }
    let fl = OFlag::from_bits_retain(fcntl(r.master.as_fd(), FcntlArg::F_GETFL)?);
    fcntl(r.master.as_fd(), FcntlArg::F_SETFL(fl | OFlag::O_NONBLOCK))?;
    Ok(Pair {
        master: r.master,
        slave: r.slave,
    })
}

/// Sets the terminal's size; the kernel sends SIGWINCH to its foreground process group.
pub fn resize(master: impl AsFd, cols: u16, rows: u16) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `struct winsize` from the pointer, which is valid for
    // the whole call.
    let r = unsafe { libc::ioctl(master.as_fd().as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes the terminal's device node (`/dev/pts/N`) the agent's alone (0600), so no other
/// job, of whatever user but root, can open it to read what is typed into it or to write
/// into it. The job needs no access to the node: its shell holds the terminal open from
/// the start, `/dev/tty` reaches the controlling terminal through the tty driver (not the
/// node's permissions), and `stty`, `tty` and full-screen programs work on the descriptors
/// they inherit. The node stays the opener's (the agent's), never the job user's, who
/// could otherwise open it up again with `chmod`.
pub fn seal_slave(slave: impl AsFd) -> io::Result<()> {
    nix::sys::stat::fchmod(
        slave.as_fd(),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )?;
    Ok(())
}
