//! Writing responses: status line, headers and body in one buffer.

use std::io::Write;

use super::Response;

/// The reason phrase of a status.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

/// Serializes a response: status line, headers and body in one buffer, so it leaves in one
/// write.
pub fn encode(resp: &Response, minor: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(160 + resp.body.len());
    let _ = write!(
        out,
        "HTTP/1.1 {} {}\r\nContent-Length: {}\r\n",
        resp.status,
        reason(resp.status),
        resp.body.len()
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
    out.extend_from_slice(&resp.body);
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
        };
        assert_eq!(
            String::from_utf8(encode(&resp, 1)).unwrap(),
            "HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{}"
        );
    }
}
