//! Writing responses: status line, headers and body in one buffer; or the head, then a
//! body streamed from its source ([`Streamed`]) in blocks, each with its own deadline.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::net::Stream;
use super::{Response, Streamed};

/// The reason phrase of a status.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        206 => "Partial Content",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        416 => "Range Not Satisfiable",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        507 => "Insufficient Storage",
        _ => "Status",
    }
}

/// Serializes a response: status line, headers and body in one buffer, so it leaves in one
/// write.
pub fn encode(resp: &Response, minor: u8) -> Vec<u8> {
    let mut out = encode_head(
        resp,
        minor,
        Length::Known(resp.body.len() as u64),
        resp.body.len(),
    );
    out.extend_from_slice(&resp.body);
    out
}

/// Bodies up to this size are copied behind the head to leave in one write; a larger one
/// is written from where it is, so that a response is never held twice. Also the largest
/// part of a file read into memory to leave as one chunk (larger ones are sent from the
/// file).
const COPIED_BODY: usize = 64 << 10;

/// A file leaves in blocks of at most this size, read into one buffer (reused, so a
/// response holds no more than this) and each written within the write timeout: a client
/// must take 1 MiB per timeout to be sent more. (std's `io::copy` would not sendfile a
/// file to a socket, and this crate keeps its system calls in `os`: a large block makes
/// the copy through memory cost little next to the disk.)
pub(super) const BLOCK: usize = 1 << 20;

/// Writes a response with `write` (called once for a small response, twice for a large
/// one: the head, then the body).
/// With `head_only` (the answer to a `HEAD`), only the head leaves, announcing the length
/// the body has (RFC 9110 §9.3.2).
pub(super) fn write_response(
    resp: &Response,
    minor: u8,
    head_only: bool,
    mut write: impl FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<()> {
    if head_only {
        let len = Length::Known(resp.body.len() as u64);
        return write(&encode_head(resp, minor, len, 0));
    }
    if resp.body.len() <= COPIED_BODY {
        return write(&encode(resp, minor));
    }
    write(&encode_head(
        resp,
        minor,
        Length::Known(resp.body.len() as u64),
        0,
    ))?;
    write(&resp.body)
}

/// Writes the head of `resp` and then `body` from its source: the head within `timeout`,
/// then each block of the body (or each chunk) within `timeout` of its start. A chunked
/// body to an HTTP/1.0 client is sent as it comes, and `resp.close` is set: its end is
/// the connection's. With `head_only` (a `HEAD`), the head alone leaves and the source is
/// dropped unread.
pub(super) fn write_streamed(
    resp: &mut Response,
    body: Streamed,
    minor: u8,
    head_only: bool,
    stream: &Stream,
    timeout: Duration,
) -> io::Result<()> {
    match body {
        Streamed::File { file, offset, len } => {
            let head = encode_head(resp, minor, Length::Known(len), 0);
            stream.write_all_by(&head, Instant::now() + timeout)?;
            if head_only {
                return Ok(());
            }
            let mut out = BodyOut::new(stream, false, timeout);
            out.raw_file(&file, offset, len)
        }
        Streamed::Chunks(mut source) => {
            let chunked = minor >= 1;
            resp.close |= !chunked;
            let length = if chunked {
                Length::Chunked
            } else {
                Length::UntilClose
            };
            let head = encode_head(resp, minor, length, 0);
            stream.write_all_by(&head, Instant::now() + timeout)?;
            if head_only {
                return Ok(());
            }
            let mut out = BodyOut::new(stream, chunked, timeout);
            source.send(&mut out)?;
            if chunked {
                stream.write_all_by(b"0\r\n\r\n", Instant::now() + timeout)?;
            }
            Ok(())
        }
    }
}

/// Where a [`super::Source`] sends its body: each part becomes one chunk, sent within the
/// write timeout (a large part from a file: each block of it within the write timeout).
pub struct BodyOut<'a> {
    stream: &'a Stream,
    chunked: bool,
    timeout: Duration,
    /// Where parts of a file are read, grown as needed up to a [`BLOCK`] and a chunk's
    /// framing, and kept for the next part.
    buf: Vec<u8>,
}

impl<'a> BodyOut<'a> {
    fn new(stream: &'a Stream, chunked: bool, timeout: Duration) -> BodyOut<'a> {
        BodyOut {
            stream,
            chunked,
            timeout,
            buf: Vec::new(),
        }
    }

    /// Sends `data` as one chunk (nothing at all when empty: an empty chunk would end the
    /// body).
    pub fn bytes(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let by = Instant::now() + self.timeout;
        if !self.chunked {
            return self.stream.write_all_by(data, by);
        }
        let size = format!("{:x}\r\n", data.len());
        if data.len() <= COPIED_BODY {
            let mut buf = Vec::with_capacity(size.len() + data.len() + 2);
            buf.extend_from_slice(size.as_bytes());
            buf.extend_from_slice(data);
            buf.extend_from_slice(b"\r\n");
            return self.stream.write_all_by(&buf, by);
        }
        self.stream.write_all_by(size.as_bytes(), by)?;
        self.stream.write_all_by(data, by)?;
        self.stream.write_all_by(b"\r\n", by)
    }

    /// Sends `len` bytes of `file` from `offset` as one chunk: a small part in one write
    /// with its framing, a larger one a [`BLOCK`] at a time. A file that holds fewer bytes
    /// is an error (`UnexpectedEof`).
    pub fn file(&mut self, file: &File, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        if !self.chunked {
            return self.raw_file(file, offset, len);
        }
        let size = format!("{len:x}\r\n");
        if len <= COPIED_BODY as u64 {
            let mut buf = std::mem::take(&mut self.buf);
            buf.clear();
            buf.extend_from_slice(size.as_bytes());
            buf.resize(size.len() + len as usize, 0);
            let read = file.read_exact_at(&mut buf[size.len()..], offset);
            buf.extend_from_slice(b"\r\n");
            let sent = read.and_then(|()| {
                self.stream
                    .write_all_by(&buf, Instant::now() + self.timeout)
            });
            self.buf = buf;
            return sent;
        }
        self.stream
            .write_all_by(size.as_bytes(), Instant::now() + self.timeout)?;
        self.raw_file(file, offset, len)?;
        self.stream
            .write_all_by(b"\r\n", Instant::now() + self.timeout)
    }

    /// True once the client has closed its side of the connection, or it broke: nobody is
    /// there to read the rest. A source that waits looks at it now and then.
    pub fn hung_up(&self) -> bool {
        self.stream.hung_up()
    }

    /// `len` bytes of `file` from `offset`, unframed, a [`BLOCK`] at a time, each within
    /// the write timeout.
    fn raw_file(&mut self, file: &File, offset: u64, len: u64) -> io::Result<()> {
        let block = len.min(BLOCK as u64) as usize;
        if self.buf.len() < block {
            self.buf.resize(block, 0);
        }
        let mut at = offset;
        let end = offset + len;
        while at < end {
            let n = (end - at).min(BLOCK as u64) as usize;
            file.read_exact_at(&mut self.buf[..n], at)?;
            self.stream
                .write_all_by(&self.buf[..n], Instant::now() + self.timeout)?;
            at += n as u64;
        }
        Ok(())
    }
}

/// How a head announces the length of its body.
enum Length {
    Known(u64),
    Chunked,
    /// Neither: the body ends when the connection does (HTTP/1.0).
    UntilClose,
}

/// The status line and headers, with room for `extra` more bytes.
fn encode_head(resp: &Response, minor: u8, length: Length, extra: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(160 + extra);
    let _ = write!(out, "HTTP/1.1 {} {}\r\n", resp.status, reason(resp.status));
    // A 1xx response has no body, so no length either.
    // A 304 has no body either; a length would have to be the 200's, which is not known
    // here (RFC 9110 §8.6).
    match length {
        _ if resp.status < 200 || resp.status == 304 => {}
        Length::Known(n) => {
            let _ = write!(out, "Content-Length: {n}\r\n");
        }
        Length::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
        Length::UntilClose => {}
    }
    for (k, v) in &resp.headers {
        let _ = write!(out, "{k}: {v}\r\n");
    }
    out.extend_from_slice(b"Date: ");
    date_now(&mut out);
    out.extend_from_slice(b"\r\n");
    if resp.close {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if minor == 0 {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Appends the current time as a `Date` value (RFC 9110 §6.6.1), formatted at most once a
/// second for the whole server.
fn date_now(out: &mut Vec<u8>) {
    static CACHE: Mutex<(u64, String)> = Mutex::new((u64::MAX, String::new()));
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut c = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if c.0 != secs {
        *c = (secs, crate::text::timefmt::imf_fixdate(secs));
    }
    out.extend_from_slice(c.1.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_responses() {
        let mut resp = Response::new(
            404,
            vec![("Content-Type", "application/json".into())],
            b"{}".to_vec(),
        );
        resp.close = true;
        assert_eq!(
            undated(&encode(&resp, 1)),
            "HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{}"
        );
    }

    /// A response's text with its `Date` line (checked for its shape) taken out.
    fn undated(b: &[u8]) -> String {
        let t = String::from_utf8_lossy(b).into_owned();
        let at = t.find("\r\nDate: ").expect("a Date header") + 2;
        let end = at + t[at..].find("\r\n").unwrap() + 2;
        let date = &t[at + 6..end - 2];
        assert_eq!(date.len(), 29, "{date:?}");
        assert!(
            date.ends_with(" GMT") && date.as_bytes()[3] == b',',
            "{date:?}"
        );
        format!("{}{}", &t[..at], &t[end..])
    }

    #[test]
    fn a_head_answer_has_the_length_of_its_body_but_not_the_body() {
        for n in [0, 10, COPIED_BODY + 1] {
            let r = Response::new(200, vec![], vec![b'x'; n]);
            let mut sent = Vec::new();
            write_response(&r, 1, true, |b| {
                sent.extend_from_slice(b);
                Ok(())
            })
            .unwrap();
            assert_eq!(
                undated(&sent),
                format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n")
            );
        }
        let (s, reader) = pair();
        let (mut resp, body) = file_response(1000, 1000);
        write_streamed(&mut resp, body, 1, true, &s, T).unwrap();
        s.shutdown(std::net::Shutdown::Both);
        assert_eq!(
            undated(&reader.join().unwrap()),
            "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
        );
        // A chunked source is never asked for its body.
        struct Never;
        impl super::super::Source for Never {
            fn send(&mut self, _: &mut BodyOut<'_>) -> io::Result<()> {
                panic!("a HEAD read the body")
            }
        }
        let (s, reader) = pair();
        let mut resp = Response::new(200, vec![], vec![]);
        write_streamed(&mut resp, Streamed::Chunks(Box::new(Never)), 1, true, &s, T).unwrap();
        s.shutdown(std::net::Shutdown::Both);
        assert_eq!(
            undated(&reader.join().unwrap()),
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
    }

    #[test]
    fn a_304_has_no_length() {
        let r = Response::new(304, vec![("ETag", "\"x\"".into())], vec![]);
        assert_eq!(
            undated(&encode(&r, 1)),
            "HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n"
        );
    }

    #[test]
    fn a_large_body_is_written_after_its_head_not_copied() {
        let resp = |n: usize| Response::new(200, vec![], vec![b'x'; n]);
        for (n, writes) in [(10, 1), (COPIED_BODY, 1), (COPIED_BODY + 1, 2)] {
            let r = resp(n);
            let mut parts: Vec<Vec<u8>> = Vec::new();
            write_response(&r, 1, false, |b| {
                parts.push(b.to_vec());
                Ok(())
            })
            .unwrap();
            assert_eq!(parts.len(), writes, "{n}");
            assert_eq!(parts.concat(), encode(&r, 1), "{n}");
        }
    }

    /// A socket pair: the server's end, and a thread reading all of the other end.
    fn pair() -> (Stream, std::thread::JoinHandle<Vec<u8>>) {
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            let _ = std::io::Read::read_to_end(&mut b, &mut got);
            got
        });
        (Stream::from_unix(a), reader)
    }

    /// A file holding `n` bytes that differ from their neighbours.
    /// A bare 200 and a file body of `n` bytes announced as `len`.
    fn file_response(n: usize, len: u64) -> (Response, Streamed) {
        let (file, _) = file_of(n);
        let body = Streamed::File {
            file,
            offset: 0,
            len,
        };
        (Response::new(200, vec![], vec![]), body)
    }

    fn file_of(n: usize) -> (File, Vec<u8>) {
        let data: Vec<u8> = (0..n).map(|i| b'a' + (i % 23) as u8).collect();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&data).unwrap();
        (f, data)
    }

    const T: Duration = Duration::from_secs(30);

    #[test]
    fn a_file_body_is_sent_from_the_file_with_its_length() {
        // Over a block, and not a multiple of one.
        let (file, data) = file_of(BLOCK * 2 + 12345);
        let (s, reader) = pair();
        let mut resp = Response::new(206, vec![("Content-Range", "x".into())], vec![]);
        let body = Streamed::File {
            file,
            offset: 7,
            len: BLOCK as u64 + 100,
        };
        write_streamed(&mut resp, body, 1, false, &s, T).unwrap();
        s.shutdown(std::net::Shutdown::Both);
        let got = undated(&reader.join().unwrap()).into_bytes();
        let head = format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: x\r\n\r\n",
            BLOCK + 100
        );
        assert_eq!(got[..head.len()], *head.as_bytes());
        assert!(got[head.len()..] == data[7..7 + BLOCK + 100]);
    }

    #[test]
    fn a_file_shorter_than_announced_is_an_error() {
        let (s, reader) = pair();
        let (mut resp, body) = file_response(1000, 1001);
        let e = write_streamed(&mut resp, body, 1, false, &s, T).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        s.shutdown(std::net::Shutdown::Both);
        let _ = reader.join();
    }

    /// A source sending a few parts: bytes, an empty part, a small and a large piece of a
    /// file.
    struct Parts(File);

    impl super::super::Source for Parts {
        fn send(&mut self, out: &mut BodyOut<'_>) -> io::Result<()> {
            assert!(!out.hung_up());
            out.bytes(b"hello ")?;
            out.bytes(b"")?;
            out.file(&self.0, 0, 3)?;
            out.file(&self.0, 3, COPIED_BODY as u64 + 1)
        }
    }

    #[test]
    fn chunks_are_framed_and_end_with_the_last_chunk() {
        let (file, data) = file_of(COPIED_BODY + 10);
        let (s, reader) = pair();
        let mut resp = Response::new(200, vec![], vec![]);
        let body = Streamed::Chunks(Box::new(Parts(file)));
        write_streamed(&mut resp, body, 1, false, &s, T).unwrap();
        assert!(!resp.close);
        s.shutdown(std::net::Shutdown::Both);
        let got = undated(&reader.join().unwrap()).into_bytes();
        let mut want =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nhello \r\n3\r\n".to_vec();
        want.extend_from_slice(&data[..3]);
        want.extend_from_slice(format!("\r\n{:x}\r\n", COPIED_BODY + 1).as_bytes());
        want.extend_from_slice(&data[3..COPIED_BODY + 4]);
        want.extend_from_slice(b"\r\n0\r\n\r\n");
        assert!(got == want, "{:?}", String::from_utf8_lossy(&got[..200]));
    }

    #[test]
    fn chunks_to_an_http_1_0_client_are_unframed_and_end_with_the_connection() {
        let (file, data) = file_of(COPIED_BODY + 10);
        let (s, reader) = pair();
        let mut resp = Response::new(200, vec![], vec![]);
        let body = Streamed::Chunks(Box::new(Parts(file)));
        write_streamed(&mut resp, body, 0, false, &s, T).unwrap();
        assert!(resp.close);
        s.shutdown(std::net::Shutdown::Both);
        let got = undated(&reader.join().unwrap()).into_bytes();
        let mut want = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nhello ".to_vec();
        want.extend_from_slice(&data[..COPIED_BODY + 4]);
        assert!(got == want);
    }

    #[test]
    fn a_client_that_stops_reading_a_file_is_cut_off_at_the_deadline_of_a_block() {
        let (file, _) = file_of(64 << 20);
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let s = Stream::from_unix(a);
        let mut resp = Response::new(200, vec![], vec![]);
        let body = Streamed::File {
            file,
            offset: 0,
            len: 64 << 20,
        };
        let t = Instant::now();
        let r = write_streamed(&mut resp, body, 1, false, &s, Duration::from_millis(300));
        assert!(r.is_err(), "{r:?}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        drop(b);
    }

    #[test]
    fn a_file_that_takes_longer_than_the_timeout_in_all_is_sent_to_a_steady_reader() {
        let (file, data) = file_of(6 * BLOCK);
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        // About 1 MiB every 150 ms: each block well within the timeout, the whole not.
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut buf = vec![0u8; 64 << 10];
            let mut since_pause = 0;
            loop {
                match std::io::Read::read(&mut b, &mut buf) {
                    Ok(0) | Err(_) => return got,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
                since_pause += 1;
                if since_pause == 16 {
                    since_pause = 0;
                    std::thread::sleep(Duration::from_millis(150));
                }
            }
        });
        let s = Stream::from_unix(a);
        let mut resp = Response::new(200, vec![], vec![]);
        let body = Streamed::File {
            file,
            offset: 0,
            len: data.len() as u64,
        };
        let timeout = Duration::from_millis(500);
        let t = Instant::now();
        write_streamed(&mut resp, body, 1, false, &s, timeout).unwrap();
        assert!(t.elapsed() > timeout, "{:?}", t.elapsed());
        s.shutdown(std::net::Shutdown::Both);
        let got = reader.join().unwrap();
        assert!(got.ends_with(&data));
    }
}
