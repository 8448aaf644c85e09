//! Readiness probes for previews: a TCP connect or an HTTP request on loopback.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::model::error::{Error, Result};

/// The longest HTTP probe path, in bytes.
pub const MAX_PATH_BYTES: usize = 2048;
/// How much of the response is read looking for the status line.
const MAX_STATUS_LINE: usize = 1024;

/// How to tell that a server is ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// Something accepts connections on the port.
    Tcp,
    /// `GET path` answers with a status below 500.
    Http { path: String },
}

/// Builds a probe from the request's `kind` ("tcp", the default, or "http") and `path`
/// (http only; default "/", must start with '/', no whitespace or control characters, at
/// most [`MAX_PATH_BYTES`] bytes).
pub fn parse_probe(kind: Option<&str>, path: Option<&str>) -> Result<Probe> {
    match kind.unwrap_or("tcp") {
        "tcp" => match path {
            None => Ok(Probe::Tcp),
            Some(_) => Err(Error::Invalid(
                "probe path applies only to http probes; set the probe to \"http\" or drop the path"
                    .to_string(),
            )),
        },
        "http" => {
            let path = path.unwrap_or("/");
            check_path(path)?;
            Ok(Probe::Http {
                path: path.to_string(),
            })
        }
        other => {
            let shown: String = other.chars().take(32).collect();
            Err(Error::Invalid(format!(
                "probe {shown:?} is unknown; it must be \"tcp\" or \"http\""
            )))
        }
    }
}

fn check_path(path: &str) -> Result<()> {
    if path.len() > MAX_PATH_BYTES {
        return Err(Error::Invalid(format!(
            "probe path is {} bytes; the limit is {MAX_PATH_BYTES} bytes",
            path.len()
        )));
    }
    if !path.starts_with('/') {
        return Err(Error::Invalid("probe path must start with '/'".to_string()));
    }
    // Whitespace or a line break would let the path rewrite the request line or headers.
    if path.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Error::Invalid(
            "probe path must not hold whitespace or control characters; percent-encode them"
                .to_string(),
        ));
    }
    Ok(())
}

/// True if `probe` succeeds on `port` at 127.0.0.1 (or, if nothing answers there, [::1])
/// within `timeout`. Never blocks much beyond `timeout`.
pub fn ready(port: u16, probe: &Probe, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let Some(stream) = connect(port, deadline) else {
        return false;
    };
    match probe {
        Probe::Tcp => true,
        Probe::Http { path } => http_ready(stream, port, path, deadline).unwrap_or(false),
    }
}

/// What is left until `deadline`; `None` once it has passed (std refuses zero timeouts).
fn left(deadline: Instant) -> Option<Duration> {
    Some(deadline.saturating_duration_since(Instant::now())).filter(|d| !d.is_zero())
}

fn connect(port: u16, deadline: Instant) -> Option<TcpStream> {
    [
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
    ]
    .into_iter()
    .find_map(|ip| TcpStream::connect_timeout(&SocketAddr::new(ip, port), left(deadline)?).ok())
}

fn http_ready(mut s: TcpStream, port: u16, path: &str, deadline: Instant) -> io::Result<bool> {
    let timed_out = || io::Error::from(io::ErrorKind::TimedOut);
    let request =
        format!("GET {path} HTTP/1.0\r\nHost: localhost:{port}\r\nConnection: close\r\n\r\n");
    s.set_write_timeout(Some(left(deadline).ok_or_else(timed_out)?))?;
    s.write_all(request.as_bytes())?;
    let mut buf = Vec::with_capacity(MAX_STATUS_LINE);
    let mut chunk = [0u8; 512];
    while !buf.contains(&b'\n') && buf.len() < MAX_STATUS_LINE {
        // Reset before every read so that a server trickling bytes cannot stretch the wait.
        s.set_read_timeout(Some(left(deadline).ok_or_else(timed_out)?))?;
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(status_code(&buf).is_some_and(|code| code < 500))
}

/// The status of an `HTTP/1.x NNN [reason]` line at the start of `buf`.
fn status_code(buf: &[u8]) -> Option<u16> {
    let line = buf.split(|&b| b == b'\n').next()?;
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let rest = line.strip_prefix(b"HTTP/1.")?;
    let (&minor, rest) = rest.split_first()?;
    let rest = rest.strip_prefix(b" ")?;
    if !minor.is_ascii_digit() || rest.len() < 3 || !rest[..3].iter().all(u8::is_ascii_digit) {
        return None;
    }
    if rest.len() > 3 && rest[3] != b' ' {
        return None;
    }
    std::str::from_utf8(&rest[..3]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::mpsc;

    /// A one-connection server that answers `response` and reports the request it got.
    fn serve_once(response: &'static str) -> (u16, mpsc::Receiver<String>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut req = Vec::new();
            let mut b = [0u8; 256];
            while !req.ends_with(b"\r\n\r\n") {
                match s.read(&mut b) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&b[..n]),
                }
            }
            let _ = s.write_all(response.as_bytes());
            let _ = tx.send(String::from_utf8_lossy(&req).into_owned());
        });
        (port, rx)
    }

    fn http(path: &str) -> Probe {
        Probe::Http { path: path.into() }
    }

    const T: Duration = Duration::from_secs(5);

    #[test]
    fn http_200_and_404_are_ready() {
        let (port, rx) = serve_once("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
        assert!(ready(port, &http("/health?x=1"), T));
        let req = rx.recv().unwrap();
        assert_eq!(
            req,
            format!(
                "GET /health?x=1 HTTP/1.0\r\nHost: localhost:{port}\r\nConnection: close\r\n\r\n"
            )
        );
        let (port, _rx) = serve_once("HTTP/1.0 404 Not Found\r\n\r\n");
        assert!(ready(port, &http("/"), T));
    }

    #[test]
    fn http_503_and_garbage_are_not_ready() {
        let (port, _rx) = serve_once("HTTP/1.1 503 Service Unavailable\r\n\r\n");
        assert!(!ready(port, &http("/"), T));
        let (port, _rx) = serve_once("SSH-2.0-OpenSSH_9.6\r\n");
        assert!(!ready(port, &http("/"), T));
        let (port, _rx) = serve_once("");
        assert!(!ready(port, &http("/"), T));
    }

    #[test]
    fn a_silent_server_is_not_ready_within_the_timeout() {
        // The kernel completes the handshake from the backlog; nobody ever answers.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(ready(port, &Probe::Tcp, T));
        let timeout = Duration::from_millis(300);
        let t = Instant::now();
        assert!(!ready(port, &http("/"), timeout));
        let took = t.elapsed();
        assert!(
            took >= timeout && took < timeout + Duration::from_secs(1),
            "{took:?}"
        );
    }

    #[test]
    fn a_closed_port_is_not_ready_quickly() {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let t = Instant::now();
        assert!(!ready(port, &Probe::Tcp, T));
        assert!(!ready(port, &http("/"), T));
        assert!(t.elapsed() < Duration::from_secs(2));
        assert!(!ready(port, &Probe::Tcp, Duration::ZERO));
    }

    #[test]
    fn status_lines() {
        assert_eq!(status_code(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(status_code(b"HTTP/1.0 499"), Some(499));
        assert_eq!(status_code(b"HTTP/1.1 302\r\n"), Some(302));
        for bad in [
            &b""[..],
            b"HTTP/2 200 OK\r\n",
            b"HTTP/1.1 20 OK\r\n",
            b"HTTP/1.1 2000 OK\r\n",
            b"HTTP/1.x 200 OK\r\n",
            b"http/1.1 200 OK\r\n",
            b"HTTP/1.1  200 OK\r\n",
        ] {
            assert_eq!(status_code(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn probes_parse_with_their_rules() {
        assert_eq!(parse_probe(None, None).unwrap(), Probe::Tcp);
        assert_eq!(parse_probe(Some("tcp"), None).unwrap(), Probe::Tcp);
        assert_eq!(parse_probe(Some("http"), None).unwrap(), http("/"));
        assert_eq!(
            parse_probe(Some("http"), Some("/a?b=c")).unwrap(),
            http("/a?b=c")
        );
        let long = format!("/{}", "a".repeat(MAX_PATH_BYTES - 1));
        assert!(parse_probe(Some("http"), Some(&long)).is_ok());
        for (kind, path, want) in [
            (Some("udp"), None, "must be \"tcp\" or \"http\""),
            (Some("HTTP"), None, "must be \"tcp\" or \"http\""),
            (Some("tcp"), Some("/"), "only to http"),
            (Some("http"), Some("health"), "start with '/'"),
            (Some("http"), Some(""), "start with '/'"),
            (Some("http"), Some("/a b"), "whitespace"),
            (Some("http"), Some("/a\r\nX: y"), "control"),
            (Some("http"), Some("/a\u{7f}"), "control"),
        ] {
            match parse_probe(kind, path) {
                Err(Error::Invalid(m)) => assert!(m.contains(want), "{kind:?} {path:?}: {m}"),
                other => panic!("{kind:?} {path:?}: {other:?}"),
            }
        }
        let too_long = format!("{long}a");
        let m = parse_probe(Some("http"), Some(&too_long)).unwrap_err();
        assert!(m.message().contains("2048"), "{m}");
    }
}
