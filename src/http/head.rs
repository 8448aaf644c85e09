//! The request head: reading it off the connection within its size and time limits, and
//! parsing the request line and header lines.

use std::io::{self, BufRead, BufReader};
use std::time::Instant;

use super::Fault;
use super::Limits;
use super::lines::{LineFault, head_end, head_lines, header_line};
use super::net::{Stream, is_timeout};

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub method: String,
    /// The request target as sent, e.g. `/v1/jobs?limit=5` (or in absolute form,
    /// `http://host/v1/jobs?limit=5`).
    pub target: String,
    /// The target before `?`.
    pub path: String,
    /// The target after `?` (empty when there is none).
    pub query: String,
    /// HTTP/1.x minor version.
    pub minor: u8,
    /// Header names (as sent) and values (trimmed), in order.
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// Every value of a header, in order (names compare case-insensitively).
    pub fn all<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a str> + use<'a> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(&name))
            .map(|(_, v)| v.as_str())
    }

    /// The first value of a header.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.all(name).next()
    }

    /// True if `If-None-Match` names `etag` (weakly, RFC 9110 §13.1.2) or is `*`: the
    /// client has the current representation, and a GET or HEAD is answered 304.
    pub fn none_match(&self, etag: &str) -> bool {
        let opaque = |t: &str| t.trim().trim_start_matches("W/").to_string();
        let want = opaque(etag);
        self.all("if-none-match")
            .flat_map(|v| v.split(','))
            .any(|t| t.trim() == "*" || opaque(t) == want)
    }

    /// True if the client asked to close the connection after this request.
    pub fn wants_close(&self) -> bool {
        let has = |token: &str| {
            self.all("connection")
                .flat_map(|v| v.split(','))
                .any(|t| t.trim().eq_ignore_ascii_case(token))
        };
        if self.minor == 0 {
            !has("keep-alive")
        } else {
            has("close")
        }
    }
}

/// Reads one request head (up to and including the blank line). `None` when the client
/// closed, or sent nothing at all in time, which ends the connection quietly.
///
/// `head_by` is the deadline of the whole head when its clock already runs: a new
/// connection's first head is due `head_timeout` after the accept, so a socket that never
/// sends a byte is closed then. Without it (a kept-alive connection between requests) the
/// client has `idle_timeout` to begin, and `head_timeout` from its first byte.
pub fn read_head(
    r: &mut BufReader<Stream>,
    limits: &Limits,
    head_by: Option<Instant>,
) -> Result<Option<Vec<u8>>, Fault> {
    let mut buf: Vec<u8> = Vec::new();
    let mut deadline: Option<Instant> = head_by;
    // Out of time: a head begun is answered `timeout`; silence is simply closed.
    let late = |buf: &Vec<u8>| {
        if buf.is_empty() {
            Ok(None)
        } else {
            Err(slow_head(limits))
        }
    };
    loop {
        let wait = match deadline {
            None => limits.idle_timeout,
            Some(d) => d.saturating_duration_since(Instant::now()),
        };
        if wait.is_zero() {
            return late(&buf);
        }
        if r.buffer().is_empty() {
            let _ = r.get_ref().set_read_timeout(wait);
        }
        let avail = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if is_timeout(&e) => return late(&buf),
            Err(_) => return Ok(None),
        };
        if avail.is_empty() {
            return Ok(None); // EOF: a partial head has no one left to answer
        }
        let mut avail = avail;
        if buf.is_empty() {
            // Stray line breaks between requests are tolerated (RFC 9112 §2.2).
            let skip = avail
                .iter()
                .take_while(|&&b| b == b'\r' || b == b'\n')
                .count();
            if skip > 0 {
                r.consume(skip);
                continue;
            }
            deadline.get_or_insert_with(|| Instant::now() + limits.head_timeout);
            avail = r.buffer();
        }
        let old = buf.len();
        let take = avail.len().min(limits.max_head + 1 - old);
        buf.extend_from_slice(&avail[..take]);
        if let Some(end) = head_end(&buf, old.saturating_sub(3)) {
            r.consume(end - old);
            buf.truncate(end);
            return Ok(Some(buf));
        }
        r.consume(take);
        if buf.len() > limits.max_head {
            return Err(Fault::TooLarge(format!(
                "the request head is over {} bytes",
                limits.max_head
            )));
        }
    }
}

fn slow_head(limits: &Limits) -> Fault {
    Fault::TooSlow(format!(
        "the request head did not arrive within {} s",
        limits.head_timeout.as_secs_f64()
    ))
}

/// Parses a head (request line and header lines, each ended by LF or CRLF).
pub fn parse_head(raw: &[u8], max_headers: usize) -> Result<Head, Fault> {
    let bad = |m: &str| Fault::Malformed(m.to_string());
    let mut lines = head_lines(raw);
    let line = lines.next().ok_or_else(|| bad("empty request"))?;
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad(
            "malformed request line: expected METHOD TARGET HTTP/1.1",
        ));
    };
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return Err(bad("malformed request line: bad method"));
    }
    let minor = match version {
        "HTTP/1.1" => 1,
        "HTTP/1.0" => 0,
        _ => return Err(bad("unsupported HTTP version: use HTTP/1.1")),
    };
    if target.is_empty() {
        return Err(bad("malformed request line: empty target"));
    }
    let origin = origin_form(target).ok_or_else(|| bad("malformed absolute request target"))?;
    let (path, query) = match origin.split_once('?') {
        Some((p, q)) => (p, q),
        None => (origin, ""),
    };
    let mut headers = Vec::new();
    for l in lines {
        if l.is_empty() {
            break;
        }
        // No whitespace before the colon: proxies disagree on such names (RFC 9112 §5.1).
        let line = header_line(l, is_tchar).map_err(|f| {
            bad(match f {
                LineFault::Folded => "folded header lines are not supported",
                LineFault::NoColon => "a header line without ':'",
                LineFault::BadName => "malformed header name",
                LineFault::Control => "a header value holds a control character",
            })
        })?;
        headers.push(line);
        if headers.len() > max_headers {
            return Err(Fault::TooLarge(format!(
                "more than {max_headers} header lines"
            )));
        }
    }
    Ok(Head {
        method: method.to_string(),
        target: target.to_string(),
        path: path.to_string(),
        query: query.to_string(),
        minor,
        headers,
    })
}

/// The path and query of a request target: itself in origin form (`/v1/jobs?x`); in
/// absolute form (`http://host:7433/v1/jobs?x`, which a server must accept: RFC 9112
/// §3.2.2) what follows the authority, `/` when nothing does. `None` for an absolute form
/// whose authority holds what no authority may (then the request is malformed).
fn origin_form(target: &str) -> Option<&str> {
    let scheme_len = ["http://", "https://"].into_iter().find_map(|p| {
        let t = target.get(..p.len())?;
        t.eq_ignore_ascii_case(p).then_some(p.len())
    });
    let Some(n) = scheme_len else {
        return Some(target);
    };
    let rest = &target[n..];
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    if !rest[..end].bytes().all(is_authority_byte) {
        return None;
    }
    Some(match &rest[end..] {
        "" => "/",
        r if r.starts_with('?') => return None,
        r => r,
    })
}

/// A byte that may stand in a URI's authority (RFC 3986 §3.2: userinfo, host, port).
fn is_authority_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:%[]@".contains(&b)
}

/// RFC 9112 §3.2: an HTTP/1.1 request without `Host`, or any request with more than one
/// or with one that is no authority, is refused (400); a proxy and this server could
/// disagree about which host it is for.
pub fn check_host(head: &Head) -> Result<(), Fault> {
    let mut hosts = head.all("host");
    match (hosts.next(), hosts.next()) {
        (Some(_), Some(_)) => Err(Fault::Malformed(
            "the Host header is given more than once".into(),
        )),
        (None, _) if head.minor >= 1 => Err(Fault::Malformed(
            "an HTTP/1.1 request needs a Host header (RFC 9112 §3.2)".into(),
        )),
        (Some(h), _) if !h.bytes().all(|b| is_authority_byte(b) && b != b'@') => Err(
            Fault::Malformed("the Host header is not a host and optional port".into()),
        ),
        _ => Ok(()),
    }
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str) -> Result<Head, Fault> {
        parse_head(raw.as_bytes(), 100)
    }

    #[test]
    fn parses_request_line_and_headers() {
        let h =
            head("GET /v1/jobs?limit=5 HTTP/1.1\r\nHost: x\r\nAuthorization:  Bearer t \r\n\r\n")
                .unwrap();
        assert_eq!(h.method, "GET");
        assert_eq!(h.path, "/v1/jobs");
        assert_eq!(h.query, "limit=5");
        assert_eq!(h.minor, 1);
        assert_eq!(h.header("authorization"), Some("Bearer t"));
        assert_eq!(h.header("HOST"), Some("x"));
        assert!(!h.wants_close());
        let h = head("GET / HTTP/1.0\n\n").unwrap();
        assert!(h.wants_close());
        let h = head("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").unwrap();
        assert!(!h.wants_close());
        let h = head("GET / HTTP/1.1\r\nConnection: foo, close\r\n\r\n").unwrap();
        assert!(h.wants_close());
    }

    #[test]
    fn refuses_malformed_heads() {
        for raw in [
            "GET /\r\n\r\n",
            "GET / HTTP/2.0\r\n\r\n",
            "GET  / HTTP/1.1\r\n\r\n",
            "G(T / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1 extra\r\n\r\n",
            "GET / HTTP/1.1\r\nNoColon\r\n\r\n",
            "GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
            "GET / HTTP/1.1\r\nName : x\r\n\r\n",
            "GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n",
            "GET / HTTP/1.1\r\n: x\r\n\r\n",
        ] {
            assert!(
                matches!(head(raw), Err(Fault::Malformed(_))),
                "{raw:?} -> {:?}",
                head(raw)
            );
        }
        let many: String = (0..101).map(|i| format!("X-{i}: y\r\n")).collect();
        assert!(matches!(
            head(&format!("GET / HTTP/1.1\r\n{many}\r\n")),
            Err(Fault::TooLarge(_))
        ));
    }

    #[test]
    fn an_absolute_target_is_routed_by_its_path() {
        for (target, path, query) in [
            ("http://localhost:7433/v1/health", "/v1/health", ""),
            ("HTTP://h/v1/jobs?limit=1", "/v1/jobs", "limit=1"),
            ("https://[::1]:1/x", "/x", ""),
            ("http://h", "/", ""),
            ("/v1/health", "/v1/health", ""),
        ] {
            let h = head(&format!("GET {target} HTTP/1.1\r\nHost: h\r\n\r\n")).unwrap();
            assert_eq!(
                (h.path.as_str(), h.query.as_str()),
                (path, query),
                "{target}"
            );
            assert_eq!(h.target, target);
        }
        for target in ["http://a b/x", "http://h?x=1", "http://h\\x/"] {
            let raw = format!("GET {target} HTTP/1.1\r\nHost: h\r\n\r\n");
            assert!(matches!(head(&raw), Err(Fault::Malformed(_))), "{target}");
        }
    }

    #[test]
    fn if_none_match_compares_weakly_and_knows_star() {
        let tag = "\"1-2-3\"";
        let matches = |v: &str| {
            head(&format!("GET / HTTP/1.1\r\nIf-None-Match: {v}\r\n\r\n"))
                .unwrap()
                .none_match(tag)
        };
        for v in ["\"1-2-3\"", "W/\"1-2-3\"", "\"x\", \"1-2-3\"", "*"] {
            assert!(matches(v), "{v}");
        }
        for v in ["\"1-2-4\"", "1-2-3", "\"x\""] {
            assert!(!matches(v), "{v}");
        }
        assert!(!head("GET / HTTP/1.1\r\n\r\n").unwrap().none_match(tag));
    }

    #[test]
    fn host_is_needed_once_in_http_1_1() {
        let host = |raw: &str| check_host(&head(raw).unwrap());
        assert!(host("GET / HTTP/1.1\r\nHost: a:1\r\n\r\n").is_ok());
        assert!(host("GET / HTTP/1.1\r\nHost:\r\n\r\n").is_ok());
        assert!(host("GET / HTTP/1.0\r\n\r\n").is_ok());
        for raw in [
            "GET / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n",
            "GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: u@a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a/b\r\n\r\n",
        ] {
            assert!(matches!(host(raw), Err(Fault::Malformed(_))), "{raw:?}");
        }
    }

    #[test]
    fn finds_the_end_of_a_head() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nrest", 0), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\nrest", 0), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n", 0), None);
        // The blank line found when the search resumes three bytes back.
        let b = b"GET / HTTP/1.1\r\n\r\n";
        assert_eq!(head_end(b, b.len() - 4 - 3), Some(b.len()));
    }
}
