//! The client half, for a server that forwards requests (the preview gate): writing a
//! request head, reading a response head within a size limit, telling how a response's
//! body is framed (RFC 9112 §6.3: HEAD, 1xx, 204 and 304 have none), and relaying a body
//! as it arrives, one write per read, so a stream of events is never held back.

use std::io::{self, BufRead, Write};

use super::body::parse_chunk_size;
use super::lines::{LineFault, head_end, head_lines, header_line};

/// Headers that belong to one connection, not to the message (RFC 9110 §7.6.1): never
/// forwarded. `Connection` may name more.
pub const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// True if header `name` is hop-by-hop in a message whose `Connection` values are
/// `connection` (which may name more such headers).
pub fn is_hop_by_hop<'a>(name: &str, mut connection: impl Iterator<Item = &'a str>) -> bool {
    HOP_BY_HOP.iter().any(|h| name.eq_ignore_ascii_case(h))
        || connection.any(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(name)))
}

/// A response's status line and headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    pub status: u16,
    pub reason: String,
    /// HTTP/1.x minor version.
    pub minor: u8,
    /// Names as sent, values trimmed, in order.
    pub headers: Vec<(String, String)>,
}

impl ResponseHead {
    /// Every value of a header (names compare case-insensitively).
    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The first value of a header.
    pub fn header<'a>(&'a self, name: &'a str) -> Option<&'a str> {
        self.all(name).next()
    }

    /// True if the server will close the connection after this response.
    pub fn closes(&self) -> bool {
        let has = |t: &str| {
            self.all("connection")
                .flat_map(|v| v.split(','))
                .any(|v| v.trim().eq_ignore_ascii_case(t))
        };
        if self.minor == 0 {
            !has("keep-alive")
        } else {
            has("close")
        }
    }
}

fn bad(m: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, m.into())
}

/// Reads one response head of at most `max` bytes; `None` when the server closed before
/// sending a byte. Errors on a malformed or oversized head, or a close in its middle.
pub fn read_response_head<R: BufRead>(r: &mut R, max: usize) -> io::Result<Option<ResponseHead>> {
    let mut raw: Vec<u8> = Vec::new();
    loop {
        let avail = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            return if raw.is_empty() {
                Ok(None)
            } else {
                Err(bad(
                    "the server closed the connection in the middle of its response head",
                ))
            };
        }
        let old = raw.len();
        let take = avail.len().min(max + 1 - old);
        raw.extend_from_slice(&avail[..take]);
        let from = old.saturating_sub(3);
        if let Some(end) = head_end(&raw, from) {
            r.consume(end - old);
            raw.truncate(end);
            return parse_response_head(&raw).map(Some);
        }
        r.consume(take);
        if raw.len() > max {
            return Err(bad(format!("the response head is over {max} bytes")));
        }
    }
}

/// Parses a response head (status line and header lines, each ended by LF or CRLF).
pub fn parse_response_head(raw: &[u8]) -> io::Result<ResponseHead> {
    let mut lines = head_lines(raw);
    let line = String::from_utf8_lossy(lines.next().unwrap_or_default()).into_owned();
    let mut parts = line.splitn(3, ' ');
    let minor = match parts.next() {
        Some("HTTP/1.1") => 1,
        Some("HTTP/1.0") => 0,
        _ => return Err(bad("the response is not HTTP/1.x")),
    };
    let status: u16 = parts
        .next()
        .filter(|s| s.len() == 3 && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse().ok())
        .filter(|s| (100..=599).contains(s))
        .ok_or_else(|| bad("the response's status is not a number from 100 to 599"))?;
    let reason: String = parts
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    let mut headers = Vec::new();
    for l in lines {
        if l.is_empty() {
            break;
        }
        let (name, value) = header_line(l, |b| b > b' ' && b != 0x7f).map_err(|f| {
            bad(match f {
                LineFault::Folded => "folded header lines in a response",
                LineFault::NoColon => "a response header without ':'",
                LineFault::BadName => "a malformed response header name",
                LineFault::Control => "a response header value holds a control character",
            })
        })?;
        headers.push((name, value));
    }
    Ok(ResponseHead {
        status,
        reason,
        minor,
        headers,
    })
}

/// How a response's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseBody {
    /// No body (HEAD, 1xx, 204, 304).
    None,
    Length(u64),
    Chunked,
    /// Until the server closes the connection.
    UntilClose,
}

/// The framing of the response to a `method` request (RFC 9112 §6.3). Both
/// `Transfer-Encoding` and `Content-Length`, or lengths that disagree, are refused: a
/// message read two ways is how responses get smuggled.
pub fn response_body(method: &str, head: &ResponseHead) -> io::Result<ResponseBody> {
    if method == "HEAD" || head.status < 200 || head.status == 204 || head.status == 304 {
        return Ok(ResponseBody::None);
    }
    let te: Vec<&str> = head.all("transfer-encoding").collect();
    let cl: Vec<&str> = head.all("content-length").collect();
    if !te.is_empty() {
        if !cl.is_empty() {
            return Err(bad(
                "the response has both Transfer-Encoding and Content-Length",
            ));
        }
        let last = te
            .iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .next_back()
            .unwrap_or("");
        return Ok(if last.eq_ignore_ascii_case("chunked") {
            ResponseBody::Chunked
        } else {
            ResponseBody::UntilClose
        });
    }
    let mut len: Option<u64> = None;
    for v in cl.iter().flat_map(|v| v.split(',')).map(str::trim) {
        if v.is_empty() || v.len() > 19 || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("the response's Content-Length is not a number"));
        }
        let n: u64 = v
            .parse()
            .map_err(|_| bad("the response's Content-Length is not a number"))?;
        if len.is_some_and(|l| l != n) {
            return Err(bad("the response's Content-Length values disagree"));
        }
        len = Some(n);
    }
    Ok(match len {
        Some(n) => ResponseBody::Length(n),
        None => ResponseBody::UntilClose,
    })
}

/// A request head as bytes: `METHOD TARGET HTTP/1.1`, then the headers.
pub fn request_head(method: &str, target: &str, headers: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let _ = write!(out, "{method} {target} HTTP/1.1\r\n");
    for (n, v) in headers {
        let _ = write!(out, "{n}: {v}\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// A response head as bytes (`HTTP/1.<minor>`).
pub fn response_head(
    minor: u8,
    status: u16,
    reason: &str,
    headers: &[(String, String)],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let reason = if reason.is_empty() {
        super::reason(status)
    } else {
        reason
    };
    let _ = write!(out, "HTTP/1.{minor} {status} {reason}\r\n");
    for (n, v) in headers {
        let _ = write!(out, "{n}: {v}\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// The piece a large body of known length is relayed in.
pub const BULK: usize = 1 << 20;

/// Writes `data` as one chunk (nothing for empty data, which would end the body).
pub fn write_chunk(w: &mut impl Write, data: &[u8]) -> io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let mut framed = Vec::with_capacity(data.len() + 16);
    let _ = write!(framed, "{:x}\r\n", data.len());
    framed.extend_from_slice(data);
    framed.extend_from_slice(b"\r\n");
    w.write_all(&framed)
}

/// Copies a body framed as `from` off `r` into `w`, one write per read, sent chunked when
/// `chunked` (then ended by the last chunk), else as it comes. Returns the bytes of body
/// copied. A body that ends before its framing says fails, so the caller cuts the
/// connection instead of ending the message as if it were whole.
pub fn relay_body<R: BufRead, W: Write>(
    r: &mut R,
    from: ResponseBody,
    w: &mut W,
    chunked: bool,
) -> io::Result<u64> {
    let mut total = 0u64;
    let mut send = |w: &mut W, data: &[u8]| -> io::Result<()> {
        total += data.len() as u64;
        if chunked {
            write_chunk(w, data)
        } else {
            w.write_all(data)
        }
    };
    match from {
        ResponseBody::None => return Ok(0),
        ResponseBody::Length(mut n) => {
            // A large body is read in large pieces straight into a buffer of its own (a
            // `BufReader` reads past its own buffer when that is empty): fewer reads and
            // writes per megabyte, and the memory is given back when the body is done.
            if n > BULK as u64 {
                // What is buffered first, all of it, so that the reads below bypass it.
                let avail = fill(r)?;
                if avail.is_empty() {
                    return Err(short());
                }
                let take = avail.len().min(n as usize);
                send(w, &avail[..take])?;
                r.consume(take);
                n -= take as u64;
                let mut big = vec![0u8; BULK];
                while n > 0 {
                    let want = big.len().min(n.min(usize::MAX as u64) as usize);
                    let got = match r.read(&mut big[..want]) {
                        Ok(0) => return Err(short()),
                        Ok(k) => k,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e),
                    };
                    send(w, &big[..got])?;
                    n -= got as u64;
                }
            }
            while n > 0 {
                let avail = fill(r)?;
                if avail.is_empty() {
                    return Err(short());
                }
                let take = avail.len().min(n.min(usize::MAX as u64) as usize);
                send(w, &avail[..take])?;
                r.consume(take);
                n -= take as u64;
            }
        }
        ResponseBody::UntilClose => loop {
            let avail = fill(r)?;
            if avail.is_empty() {
                break;
            }
            let take = avail.len();
            send(w, &avail[..take])?;
            r.consume(take);
        },
        ResponseBody::Chunked => loop {
            let size = parse_chunk_size(&line(r, 1024)?).map_err(|e| bad(e.to_string()))?;
            if size == 0 {
                // Trailers are dropped (they are rare, and may be hop-by-hop).
                let mut bytes = 0;
                loop {
                    let l = line(r, 16 << 10)?;
                    if l.is_empty() {
                        break;
                    }
                    bytes += l.len();
                    if bytes > 16 << 10 {
                        return Err(bad("the response's trailers are too long"));
                    }
                }
                break;
            }
            let mut left = size;
            while left > 0 {
                let avail = fill(r)?;
                if avail.is_empty() {
                    return Err(short());
                }
                let take = avail.len().min(left.min(usize::MAX as u64) as usize);
                send(w, &avail[..take])?;
                r.consume(take);
                left -= take as u64;
            }
            if !line(r, 2)?.is_empty() {
                return Err(bad("a response chunk is longer than its size"));
            }
        },
    }
    if chunked {
        w.write_all(b"0\r\n\r\n")?;
    }
    Ok(total)
}

fn short() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the server closed the connection before the end of its body",
    )
}

fn fill<R: BufRead>(r: &mut R) -> io::Result<&[u8]> {
    loop {
        match r.fill_buf() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // Re-borrowed through a raw pointer would be needed to return `b` here; a
            // second call returns the same buffered bytes without reading.
            Ok(_) => break,
            Err(e) => return Err(e),
        }
    }
    r.fill_buf()
}

fn line<R: BufRead>(r: &mut R, max: usize) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let avail = fill(r)?;
        if avail.is_empty() {
            return Err(short());
        }
        if let Some(p) = memchr::memchr(b'\n', avail) {
            out.extend_from_slice(&avail[..p]);
            r.consume(p + 1);
            if out.last() == Some(&b'\r') {
                out.pop();
            }
            return Ok(out);
        }
        let n = avail.len();
        out.extend_from_slice(avail);
        r.consume(n);
        if out.len() > max {
            return Err(bad("a chunk line in the response is too long"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufReader;

    fn head(raw: &str) -> ResponseHead {
        parse_response_head(raw.as_bytes()).unwrap()
    }

    #[test]
    fn parses_and_frames_responses() {
        let h = head("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX: y\r\n\r\n");
        assert_eq!((h.status, h.minor, h.header("x")), (200, 1, Some("y")));
        assert_eq!(response_body("GET", &h).unwrap(), ResponseBody::Length(5));
        assert_eq!(response_body("HEAD", &h).unwrap(), ResponseBody::None);
        for s in [
            "HTTP/1.1 204 No Content\r\n\r\n",
            "HTTP/1.1 304 x\r\n\r\n",
            "HTTP/1.1 103 x\r\n\r\n",
        ] {
            assert_eq!(
                response_body("GET", &head(s)).unwrap(),
                ResponseBody::None,
                "{s}"
            );
        }
        let chunked = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(
            response_body("GET", &chunked).unwrap(),
            ResponseBody::Chunked
        );
        let close = head("HTTP/1.0 200 OK\r\n\r\n");
        assert_eq!(
            response_body("GET", &close).unwrap(),
            ResponseBody::UntilClose
        );
        assert!(close.closes());
        for bad in [
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n",
        ] {
            assert!(response_body("GET", &head(bad)).is_err(), "{bad}");
        }
        for bad in [
            "HTTP/2 200 OK\r\n\r\n",
            "HTTP/1.1 20 OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\nA b\r\n\r\n",
        ] {
            assert!(parse_response_head(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn reads_heads_within_their_limit() {
        let mut r = BufReader::new(&b"HTTP/1.1 200 OK\r\nA: b\r\n\r\nbody"[..]);
        assert_eq!(
            read_response_head(&mut r, 100).unwrap().unwrap().status,
            200
        );
        assert_eq!(r.fill_buf().unwrap(), b"body");
        let mut r = BufReader::new(&b""[..]);
        assert!(read_response_head(&mut r, 100).unwrap().is_none());
        let big = format!("HTTP/1.1 200 OK\r\nA: {}\r\n\r\n", "x".repeat(200));
        let mut r = BufReader::new(big.as_bytes());
        assert!(read_response_head(&mut r, 100).is_err());
    }

    #[test]
    fn relays_bodies_exactly_and_reframes_them() {
        let mut out = Vec::new();
        let mut r = BufReader::new(&b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nT: 1\r\n\r\nNEXT"[..]);
        assert_eq!(
            relay_body(&mut r, ResponseBody::Chunked, &mut out, false).unwrap(),
            5
        );
        assert_eq!(out, b"abcde");
        assert_eq!(r.fill_buf().unwrap(), b"NEXT");
        let mut out = Vec::new();
        let mut r = BufReader::new(&b"hello world"[..]);
        relay_body(&mut r, ResponseBody::UntilClose, &mut out, true).unwrap();
        assert_eq!(out, b"b\r\nhello world\r\n0\r\n\r\n");
        let mut out = Vec::new();
        let mut r = BufReader::new(&b"hel"[..]);
        assert!(relay_body(&mut r, ResponseBody::Length(5), &mut out, false).is_err());
        let mut r = BufReader::new(&b"3\r\nabcd\r\n0\r\n\r\n"[..]);
        assert!(relay_body(&mut r, ResponseBody::Chunked, &mut Vec::new(), false).is_err());
    }

    #[test]
    fn hop_by_hop_headers_include_those_connection_names() {
        assert!(is_hop_by_hop("Keep-Alive", std::iter::empty()));
        assert!(is_hop_by_hop("X-Secret", ["close, x-secret"].into_iter()));
        assert!(!is_hop_by_hop("Content-Type", ["close"].into_iter()));
    }
}
