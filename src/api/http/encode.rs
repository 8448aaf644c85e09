//! Writing responses: status line, headers and body in one buffer.

use std::io::Write;

use super::Response;

/// The reason phrase of a status.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        206 => "Partial Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        416 => "Range Not Satisfiable",
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
    let mut out = encode_head(resp, minor, resp.body.len());
    out.extend_from_slice(&resp.body);
    out
}

/// Bodies up to this size are copied behind the head to leave in one write; a larger one
/// is written from where it is, so that a response is never held twice.
const COPIED_BODY: usize = 64 << 10;

/// Writes a response with `write` (called once for a small response, twice for a large
/// one: the head, then the body).
pub(super) fn write_response(
    resp: &Response,
    minor: u8,
    mut write: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> std::io::Result<()> {
    if resp.body.len() <= COPIED_BODY {
        return write(&encode(resp, minor));
    }
    write(&encode_head(resp, minor, 0))?;
    write(&resp.body)
}

/// Writes a file body in bounded pieces with `write` (each piece with its own deadline,
/// so that a large file needs a reader that keeps up, not a fast one).
pub(super) fn write_file(
    body: &super::FileBody,
    mut write: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; (256 << 10).min(body.len.max(1) as usize)];
    let mut at = body.offset;
    let end = body.offset + body.len;
    while at < end {
        let want = buf.len().min((end - at) as usize);
        let n = body.file.read_at(&mut buf[..want], at)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file shrank while being sent",
            ));
        }
        write(&buf[..n])?;
        at += n as u64;
    }
    Ok(())
}

/// The status line and headers, with room for `extra` more bytes.
fn encode_head(resp: &Response, minor: u8, extra: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(160 + extra);
    let _ = write!(
        out,
        "HTTP/1.1 {} {}\r\nContent-Length: {}\r\n",
        resp.status,
        reason(resp.status),
        resp.file.as_ref().map_or(resp.body.len() as u64, |f| f.len)
    );
    for (k, v) in &resp.headers {
        let _ = write!(out, "{k}: {v}\r\n");
    }
    if resp.close {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if minor == 0 {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_responses() {
        let resp = Response {
            status: 404,
            headers: vec![("Content-Type", "application/json".into())],
            body: b"{}".to_vec(),
            close: true,
            route: "",
            job_id: None,
            file: None,
        };
        assert_eq!(
            String::from_utf8(encode(&resp, 1)).unwrap(),
            "HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{}"
        );
    }

    #[test]
    fn a_large_body_is_written_after_its_head_not_copied() {
        let resp = |n: usize| Response {
            status: 200,
            headers: vec![],
            body: vec![b'x'; n],
            close: false,
            route: "",
            job_id: None,
            file: None,
        };
        for (n, writes) in [(10, 1), (COPIED_BODY, 1), (COPIED_BODY + 1, 2)] {
            let r = resp(n);
            let mut parts: Vec<Vec<u8>> = Vec::new();
            write_response(&r, 1, |b| {
                parts.push(b.to_vec());
                Ok(())
            })
            .unwrap();
            assert_eq!(parts.len(), writes, "{n}");
            assert_eq!(parts.concat(), encode(&r, 1), "{n}");
        }
    }
}
