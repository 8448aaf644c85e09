//! The request body: how it is framed (`Content-Length` or chunked, never both), and
//! reading it within its size and time limits.

use std::io::{self, BufRead, BufReader};
use std::time::{Duration, Instant};

use super::Fault;
use super::Limits;
use super::head::Head;
use super::net::{Stream, is_timeout};

/// How a request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    None,
    Length(u64),
    Chunked,
}

/// Works out a request's body framing, refusing ambiguous or oversized ones up front.
pub fn framing(head: &Head, max_body: u64) -> Result<Framing, Fault> {
    let bad = |m: &str| Fault::Malformed(m.to_string());
    let te: Vec<&str> = head.all("transfer-encoding").collect();
    let cl: Vec<&str> = head.all("content-length").collect();
    if !te.is_empty() {
        // RFC 9112 §6.1: HTTP/1.0 has no transfer codings, so such framing is faulty.
        if head.minor == 0 {
            return Err(bad(
                "Transfer-Encoding is not defined in HTTP/1.0: send HTTP/1.1, or Content-Length",
            ));
        }
        if !cl.is_empty() {
            // The classic request-smuggling shape: refuse rather than pick one.
            return Err(bad("both Transfer-Encoding and Content-Length are set"));
        }
        if te.len() != 1 || !te[0].eq_ignore_ascii_case("chunked") {
            return Err(bad("the only Transfer-Encoding supported is chunked"));
        }
        return Ok(Framing::Chunked);
    }
    match cl.as_slice() {
        [] => Ok(Framing::None),
        [v] => {
            if v.is_empty() || v.len() > 19 || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad("Content-Length is not a number"));
            }
            let n: u64 = v
                .parse()
                .map_err(|_| bad("Content-Length is not a number"))?;
            if n > max_body {
                return Err(too_large_body(max_body));
            }
            Ok(if n == 0 {
                Framing::None
            } else {
                Framing::Length(n)
            })
        }
        _ => Err(bad("Content-Length is given more than once")),
    }
}

fn too_large_body(max: u64) -> Fault {
    Fault::TooLarge(format!(
        "the request body is over the limit of {max} bytes (--max-body; for a file upload, --max-file-bytes)"
    ))
}

/// A reader that gives up at a deadline.
struct Timed<'a> {
    r: &'a mut BufReader<Stream>,
    deadline: Instant,
    what: Duration,
}

impl Timed<'_> {
    fn slow(&self) -> Fault {
        Fault::TooSlow(format!(
            "the request body did not arrive within {} s",
            self.what.as_secs_f64()
        ))
    }

    /// Buffered bytes, reading more if there are none; errors on EOF or the deadline.
    fn fill(&mut self) -> Result<&[u8], Fault> {
        loop {
            if self.r.buffer().is_empty() {
                let left = self.deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(self.slow());
                }
                let _ = self.r.get_ref().set_read_timeout(left);
            }
            match self.r.fill_buf() {
                Ok([]) => {
                    return Err(Fault::Malformed(
                        "the connection closed in the middle of the body".into(),
                    ));
                }
                Ok(_) => return Ok(self.r.buffer()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if is_timeout(&e) => return Err(self.slow()),
                Err(e) => return Err(Fault::Malformed(format!("reading the body: {e}"))),
            }
        }
    }

    fn read_into(&mut self, out: &mut Vec<u8>, mut n: u64) -> Result<(), Fault> {
        while n > 0 {
            let avail = self.fill()?;
            let take = avail.len().min(n.min(usize::MAX as u64) as usize);
            out.extend_from_slice(&avail[..take]);
            self.r.consume(take);
            n -= take as u64;
        }
        Ok(())
    }

    /// One line without its line end, at most `max` bytes.
    fn line(&mut self, max: usize) -> Result<Vec<u8>, Fault> {
        let mut line = Vec::new();
        loop {
            let avail = self.fill()?;
            if let Some(p) = memchr::memchr(b'\n', avail) {
                line.extend_from_slice(&avail[..p]);
                self.r.consume(p + 1);
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Ok(line);
            }
            let n = avail.len();
            line.extend_from_slice(avail);
            self.r.consume(n);
            if line.len() > max {
                return Err(Fault::Malformed("a chunk line is too long".into()));
            }
        }
    }
}

pub(super) fn read_body(
    r: &mut BufReader<Stream>,
    framing: Framing,
    limits: &Limits,
) -> Result<Vec<u8>, Fault> {
    let mut t = Timed {
        r,
        deadline: Instant::now() + limits.body_timeout,
        what: limits.body_timeout,
    };
    let mut body = Vec::new();
    match framing {
        Framing::None => {}
        Framing::Length(n) => {
            body.reserve(n.min(1 << 20) as usize);
            t.read_into(&mut body, n)?;
        }
        Framing::Chunked => {
            loop {
                let line = t.line(1024)?;
                let size = parse_chunk_size(&line)?;
                if size == 0 {
                    break;
                }
                if body.len() as u64 + size > limits.max_body {
                    return Err(too_large_body(limits.max_body));
                }
                t.read_into(&mut body, size)?;
                if !t.line(2)?.is_empty() {
                    return Err(Fault::Malformed("a chunk is longer than its size".into()));
                }
            }
            // Trailers are read and dropped, within the same bounds as headers.
            let mut trailer_bytes = 0;
            loop {
                let line = t.line(limits.max_head)?;
                if line.is_empty() {
                    break;
                }
                trailer_bytes += line.len();
                if trailer_bytes > limits.max_head {
                    return Err(Fault::TooLarge("the chunked trailers are too long".into()));
                }
            }
        }
    }
    Ok(body)
}

/// A request body read as it arrives, for a handler that streams it (see
/// `Handler::handle_stream`): at most `max` bytes, each read within the body timeout of
/// the previous one (the whole body may take longer: it is as big as it is). Errors carry
/// their [`Fault`] (see `super::fault_of`).
pub struct BodyReader<'a> {
    r: &'a mut BufReader<Stream>,
    framing: Framing,
    /// Bytes left in the body (`Length`) or in the current chunk (`Chunked`).
    left: u64,
    /// A chunk was read, so its line end is due before the next size.
    in_chunks: bool,
    done: bool,
    total: u64,
    max: u64,
    idle: Duration,
    max_head: usize,
}

impl<'a> BodyReader<'a> {
    pub fn new(
        r: &'a mut BufReader<Stream>,
        framing: Framing,
        limits: &Limits,
        max: u64,
    ) -> BodyReader<'a> {
        BodyReader {
            r,
            framing,
            left: match framing {
                Framing::Length(n) => n,
                _ => 0,
            },
            in_chunks: false,
            done: framing == Framing::None,
            total: 0,
            max,
            idle: limits.body_timeout,
            max_head: limits.max_head,
        }
    }

    /// True once the body was read to its end (so the connection may carry another request).
    pub fn complete(&self) -> bool {
        self.done
    }

    /// Reads and drops the rest of the body if at most `max` bytes of it are left to
    /// come (as far as is known: a chunked body is read until `max` bytes were dropped).
    pub(super) fn skip(&mut self, max: u64) {
        if self.framing == Framing::Length(self.left + self.total) && self.left > max {
            return;
        }
        let mut buf = [0u8; 8 << 10];
        let mut dropped = 0u64;
        while !self.done && dropped <= max {
            match self.read_some(&mut buf) {
                Ok(n) => dropped += n as u64,
                Err(_) => return,
            }
        }
    }

    /// The length the client announced, if it did.
    pub fn announced(&self) -> Option<u64> {
        match self.framing {
            Framing::Length(n) => Some(n),
            _ => None,
        }
    }

    fn timed(&mut self) -> Timed<'_> {
        Timed {
            r: self.r,
            deadline: Instant::now() + self.idle,
            what: self.idle,
        }
    }

    fn next_chunk(&mut self) -> Result<(), Fault> {
        let max = self.max;
        let max_head = self.max_head;
        let total = self.total;
        let in_chunks = self.in_chunks;
        let mut t = self.timed();
        if in_chunks && !t.line(2)?.is_empty() {
            return Err(Fault::Malformed("a chunk is longer than its size".into()));
        }
        let size = parse_chunk_size(&t.line(1024)?)?;
        if size == 0 {
            let mut trailer_bytes = 0;
            loop {
                let line = t.line(max_head)?;
                if line.is_empty() {
                    break;
                }
                trailer_bytes += line.len();
                if trailer_bytes > max_head {
                    return Err(Fault::TooLarge("the chunked trailers are too long".into()));
                }
            }
            self.done = true;
            return Ok(());
        }
        if total + size > max {
            return Err(too_large_body(max));
        }
        self.left = size;
        self.in_chunks = true;
        Ok(())
    }

    fn read_some(&mut self, out: &mut [u8]) -> Result<usize, Fault> {
        while !self.done && self.left == 0 {
            match self.framing {
                Framing::Chunked => self.next_chunk()?,
                _ => self.done = true,
            }
        }
        if self.done || out.is_empty() {
            return Ok(0);
        }
        let want = out.len().min(self.left.min(usize::MAX as u64) as usize);
        let mut t = self.timed();
        let avail = t.fill()?;
        let n = avail.len().min(want);
        out[..n].copy_from_slice(&avail[..n]);
        t.r.consume(n);
        self.left -= n as u64;
        self.total += n as u64;
        if self.framing != Framing::Chunked && self.left == 0 {
            self.done = true;
        }
        Ok(n)
    }
}

impl io::Read for BodyReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        self.read_some(out).map_err(io::Error::other)
    }
}

/// Parses a chunk-size line: hex digits, then optional `;extensions`.
pub fn parse_chunk_size(line: &[u8]) -> Result<u64, Fault> {
    let bad = || Fault::Malformed("malformed chunk size".into());
    let end = line.iter().position(|&b| b == b';').unwrap_or(line.len());
    let hex = std::str::from_utf8(&line[..end])
        .map_err(|_| bad())?
        .trim_matches([' ', '\t']);
    if hex.is_empty() || hex.len() > 15 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    u64::from_str_radix(hex, 16).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str) -> Result<Head, Fault> {
        super::super::parse_head(raw.as_bytes(), 100)
    }

    fn framed(headers: &str, max: u64) -> Result<Framing, Fault> {
        framing(
            &head(&format!("POST / HTTP/1.1\r\n{headers}\r\n")).unwrap(),
            max,
        )
    }

    #[test]
    fn body_framing_is_unambiguous() {
        assert_eq!(framed("", 10), Ok(Framing::None));
        assert_eq!(framed("Content-Length: 0\r\n", 10), Ok(Framing::None));
        assert_eq!(
            framed("Content-Length: 10\r\n", 10),
            Ok(Framing::Length(10))
        );
        assert!(matches!(
            framed("Content-Length: 11\r\n", 10),
            Err(Fault::TooLarge(_))
        ));
        assert!(matches!(
            framed("Content-Length: 99999999999999999999999\r\n", 10),
            Err(Fault::Malformed(_))
        ));
        for bad in [
            "Content-Length: -1\r\n",
            "Content-Length: 1e3\r\n",
            "Content-Length: +5\r\n",
            "Content-Length: 5\r\nContent-Length: 5\r\n",
            "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            "Transfer-Encoding: gzip\r\n",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
        ] {
            assert!(
                matches!(framed(bad, 10), Err(Fault::Malformed(_))),
                "{bad:?}"
            );
        }
        assert_eq!(
            framed("Transfer-Encoding: Chunked\r\n", 10),
            Ok(Framing::Chunked)
        );
        // HTTP/1.0 has no chunked coding: a request that says otherwise is refused.
        let old = head("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
        assert!(matches!(framing(&old, 10), Err(Fault::Malformed(_))));
    }

    #[test]
    fn chunk_sizes() {
        assert_eq!(parse_chunk_size(b"0").unwrap(), 0);
        assert_eq!(parse_chunk_size(b"1a").unwrap(), 26);
        assert_eq!(parse_chunk_size(b"FF;name=value").unwrap(), 255);
        for bad in [&b""[..], b"x", b"-1", b"1 2", b"fffffffffffffffff", b";a"] {
            assert!(parse_chunk_size(bad).is_err(), "{bad:?}");
        }
    }
}
