//! The gate's own answers: short plain-text bodies (never a redirect for a refusal, so a
//! script's `fetch` sees the status and a person sees what to do), and the exchange's 302.

use std::io::Write;
use std::net::TcpStream;

/// What became of a request, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    Forwarded,
    Exchanged,
    Unauthorized,
    Forbidden,
    Unavailable,
    Refused,
}

/// The body of a 503 when nothing listens on the dev server's port.
pub(super) fn nothing_listening(port: u16) -> String {
    format!("PreviewUnavailable: nothing is listening on port {port}")
}

/// The body of a 503 for a suspended grant.
pub(super) const SUSPENDED: &str = "PreviewUnavailable: this sandbox was restored from a snapshot; the preview comes back when its port is exposed again";

/// A plain-text answer; `head_only` leaves the body out (a HEAD).
pub(super) fn text(status: u16, body: &str, close: bool, head_only: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + body.len());
    let _ = write!(
        out,
        "HTTP/1.1 {status} {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\n",
        crate::http::reason(status),
        body.len()
    );
    if status == 401 {
        // No scheme a browser could answer with a login box: the way in is the link.
        out.extend_from_slice(b"WWW-Authenticate: PreviewToken realm=\"preview\"\r\n");
    }
    if close {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

/// The exchange's answer: a 302 to `location` setting the gate cookie.
pub(super) fn exchanged(location: &str, cookie: &str, value: &str, close: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    let _ = write!(
        out,
        "HTTP/1.1 302 Found\r\nLocation: {location}\r\n\
         Set-Cookie: {cookie}={value}; Path=/; HttpOnly; Secure; SameSite=Lax\r\n\
         Cache-Control: no-store\r\nReferrer-Policy: no-referrer\r\nContent-Length: 0\r\n"
    );
    if close {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Answers a connection over the gate's cap without a thread, and closes it.
pub(super) fn busy(s: &TcpStream, max: usize) {
    let _ = s.set_nonblocking(true);
    let body =
        format!("the preview gate has {max} connections open, the most at once; retry shortly\n");
    let _ = (&*s).write(&text(503, &body, true, false));
    let _ = s.shutdown(std::net::Shutdown::Both);
}
