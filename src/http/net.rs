//! The sockets: a listener (TCP or Unix) and the connections it accepts.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A bound listening socket.
pub enum Listener {
    Tcp(TcpListener),
    /// The listener and its socket file, removed when the server stops.
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Where it listens, as `--listen` would name it (with the real port for `:0`).
    pub fn describe(&self) -> String {
        match self {
            Listener::Tcp(l) => l
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "?".into()),
            Listener::Unix(_, p) => format!("unix:{}", p.display()),
        }
    }

    pub(super) fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Listener::Tcp(l) => l.as_fd(),
            Listener::Unix(l, _) => l.as_fd(),
        }
    }

    pub(super) fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Listener::Tcp(l) => l.set_nonblocking(true),
            Listener::Unix(l, _) => l.set_nonblocking(true),
        }
    }

    pub(super) fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                s.set_nonblocking(false)?;
                // One write per response already; this keeps small responses from waiting
                // on a delayed ACK.
                let _ = s.set_nodelay(true);
                Ok(Stream(Arc::new(Socket::Tcp(s))))
            }
            Listener::Unix(l, _) => {
                let (s, _) = l.accept()?;
                s.set_nonblocking(false)?;
                Ok(Stream(Arc::new(Socket::Unix(s))))
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A client connection. Cloning it shares the one socket: the server's connection table
/// keeps a clone, so that it can close a connection its thread is blocked reading.
#[derive(Clone)]
pub struct Stream(Arc<Socket>);

enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub(super) fn set_read_timeout(&self, d: Duration) -> io::Result<()> {
        // std refuses a zero timeout; the smallest real one ends the wait just as well.
        let d = Some(d.max(Duration::from_millis(1)));
        match &*self.0 {
            Socket::Tcp(s) => s.set_read_timeout(d),
            Socket::Unix(s) => s.set_read_timeout(d),
        }
    }

    pub(super) fn set_write_timeout(&self, d: Duration) -> io::Result<()> {
        let d = Some(d.max(Duration::from_millis(1)));
        match &*self.0 {
            Socket::Tcp(s) => s.set_write_timeout(d),
            Socket::Unix(s) => s.set_write_timeout(d),
        }
    }

    pub(super) fn set_nonblocking(&self) -> io::Result<()> {
        match &*self.0 {
            Socket::Tcp(s) => s.set_nonblocking(true),
            Socket::Unix(s) => s.set_nonblocking(true),
        }
    }

    pub(super) fn shutdown(&self, how: Shutdown) {
        let _ = match &*self.0 {
            Socket::Tcp(s) => s.shutdown(how),
            Socket::Unix(s) => s.shutdown(how),
        };
    }

    /// Asks the kernel to hold at most about `bytes` unsent for this socket (which also
    /// ends its growing by itself), and returns what it holds now: Linux doubles the
    /// request for its own bookkeeping and counts that too, so it is an upper bound.
    pub(super) fn limit_send_buffer(&self, bytes: usize) -> io::Result<usize> {
        use nix::sys::socket::{getsockopt, setsockopt, sockopt::SndBuf};
        setsockopt(&self.as_fd(), SndBuf, &bytes)?;
        Ok(getsockopt(&self.as_fd(), SndBuf)?)
    }

    /// True when the client has sent bytes not read yet (or closed its side).
    pub(super) fn has_input(&self) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let mut fds = [PollFd::new(self.as_fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::ZERO).is_ok_and(|n| n > 0)
    }

    /// Writes all of `buf` by `deadline`: a client that reads too slowly, or not at all,
    /// gets a timeout error instead of holding the writer (and `buf`) for as long as it
    /// likes, whatever the pace of its reads.
    pub(super) fn write_all_by(
        &self,
        mut buf: &[u8],
        deadline: std::time::Instant,
    ) -> io::Result<()> {
        while !buf.is_empty() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            self.set_write_timeout(left)?;
            match (&*self).write(buf) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// True once the peer has closed its side (or the connection broke): whatever is
    /// written next, nobody reads. Seen by peeking, so bytes it sent and we did not read
    /// yet (a pipelined request) hide a close behind them until they are read.
    pub(super) fn hung_up(&self) -> bool {
        use nix::sys::socket::{MsgFlags, recv};
        use std::os::fd::AsRawFd;
        let mut byte = [0u8; 1];
        match recv(
            self.as_fd().as_raw_fd(),
            &mut byte,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(0) => true,
            Ok(_) => false,
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => false,
            Err(_) => true,
        }
    }
}

impl From<TcpStream> for Stream {
    /// A connection accepted by a server of its own (the preview gate's listeners).
    fn from(s: TcpStream) -> Stream {
        Stream(Arc::new(Socket::Tcp(s)))
    }
}

#[cfg(test)]
impl Stream {
    pub(super) fn from_unix(s: UnixStream) -> Stream {
        Stream(Arc::new(Socket::Unix(s)))
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match &*self.0 {
            Socket::Tcp(s) => s.as_fd(),
            Socket::Unix(s) => s.as_fd(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &*self.0 {
            Socket::Tcp(s) => (&*s).read(buf),
            Socket::Unix(s) => (&*s).read(buf),
        }
    }
}

impl Write for &Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &*self.0 {
            Socket::Tcp(s) => (&*s).write(buf),
            Socket::Unix(s) => (&*s).write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// True for the error a read or write gives when its timeout passed.
pub(super) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn pair() -> (Stream, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        (Stream::from_unix(a), b)
    }

    #[test]
    fn a_write_gives_up_at_its_deadline_however_the_reader_trickles() {
        let (s, mut peer) = pair();
        // The peer reads a little now and then: each write makes progress, so only a
        // deadline for the whole response ends it.
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 1024];
            let mut got = 0;
            while let Ok(n) = peer.read(&mut buf) {
                if n == 0 {
                    break;
                }
                got += n;
                std::thread::sleep(Duration::from_millis(20));
            }
            got
        });
        let big = vec![b'x'; 64 << 20];
        let t = Instant::now();
        let r = s.write_all_by(&big, t + Duration::from_millis(300));
        assert!(r.as_ref().is_err_and(is_timeout), "{r:?}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        s.shutdown(Shutdown::Both);
        assert!(reader.join().unwrap() < big.len());
    }

    #[test]
    fn a_peer_that_hangs_up_is_seen_once_what_it_sent_is_read() {
        let (s, peer) = pair();
        assert!(!s.hung_up());
        drop(peer);
        assert!(s.hung_up());
        let (s, mut peer) = pair();
        peer.write_all(b"GET").unwrap();
        assert!(!s.hung_up());
        // Half-closed: the peer will send nothing more, and is taken to be gone.
        peer.shutdown(Shutdown::Write).unwrap();
        let mut buf = [0u8; 8];
        let mut reading = s.clone();
        assert_eq!(reading.read(&mut buf).unwrap(), 3);
        assert!(s.hung_up());
    }

    #[test]
    fn pending_input_is_seen_without_reading_it() {
        let (s, mut peer) = pair();
        assert!(!s.has_input());
        peer.write_all(b"GET").unwrap();
        assert!(s.has_input());
        let mut buf = [0u8; 8];
        let mut reading = s.clone();
        assert_eq!(reading.read(&mut buf).unwrap(), 3);
        assert!(!s.has_input());
    }
}
