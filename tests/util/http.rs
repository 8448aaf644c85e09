//! A tiny raw-socket HTTP/1.1 client, so the tests see exactly what goes on the wire. Every
//! JSON answer to a request sent with [`Client::send`] is checked against
//! `docs/openapi.json` (see [`super::schema`]), unless the client is [`Client::unchecked`].

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use serde_json::Value;

/// A response.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The documented answer this one was checked against (`"GET /v1/jobs 200"`, or
    /// `"Error"` for an error outside any documented route); `None` when not checked.
    pub checked: Option<String>,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|_| {
            panic!(
                "not JSON ({}): {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The error code of an error response.
    pub fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The value of the header `name` (any case) among `headers`.
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// A connection: TCP or unix.
pub enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    pub fn open(addr: &str) -> Conn {
        let c = match addr.strip_prefix("unix:") {
            Some(p) => Conn::Unix(UnixStream::connect(p).expect("connect unix")),
            None => Conn::Tcp(TcpStream::connect(addr).expect("connect")),
        };
        c.set_timeout(Duration::from_secs(120));
        c
    }

    pub fn set_timeout(&self, d: Duration) {
        match self {
            Conn::Tcp(s) => {
                s.set_read_timeout(Some(d)).unwrap();
                s.set_write_timeout(Some(d)).unwrap();
            }
            Conn::Unix(s) => {
                s.set_read_timeout(Some(d)).unwrap();
                s.set_write_timeout(Some(d)).unwrap();
            }
        }
    }
}

impl Conn {
    /// True once the peer closed (EOF or a reset) within `within`; what it sends first (say,
    /// a 408) is read past, each read bounded by the time left.
    pub fn closed_within(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut buf = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.set_timeout(left);
            match self.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return false;
                }
                Err(_) => return true,
            }
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(buf),
            Conn::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write(buf),
            Conn::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A keep-alive client on one connection.
pub struct Client {
    pub addr: String,
    pub r: BufReader<Conn>,
    pub token: Option<String>,
    /// Whether answers are checked against docs/openapi.json (see [`Client::unchecked`]).
    pub check: bool,
}

impl Client {
    pub fn connect(addr: &str) -> Client {
        Client {
            addr: addr.to_string(),
            r: BufReader::new(Conn::open(addr)),
            token: None,
            check: true,
        }
    }

    pub fn token(mut self, t: &str) -> Client {
        self.token = Some(t.to_string());
        self
    }

    /// A client that does not check answers against the schema (for timing them).
    pub fn unchecked(mut self) -> Client {
        self.check = false;
        self
    }

    /// Sends a request with a JSON body (when given) and reads the answer.
    pub fn call(&mut self, method: &str, path: &str, body: Option<&Value>) -> Resp {
        let body = body.map(|b| serde_json::to_vec(b).unwrap());
        self.send(method, path, &[], body.as_deref())
    }

    pub fn get(&mut self, path: &str) -> Resp {
        self.call("GET", path, None)
    }

    pub fn post(&mut self, path: &str, body: &Value) -> Resp {
        self.call("POST", path, Some(body))
    }

    /// Starts a job (`POST /v1/jobs` with `body`), fails the test unless it is answered
    /// 200, and returns the job's record.
    pub fn start_job(&mut self, body: Value) -> Value {
        let r = self.post("/v1/jobs", &body);
        assert_eq!(r.status, 200, "POST /v1/jobs {body}: {}", r.text());
        r.json()
    }

    /// [`Client::start_job`], returning the job's id.
    pub fn start_id(&mut self, body: Value) -> String {
        let v = self.start_job(body);
        v["id"]
            .as_str()
            .unwrap_or_else(|| panic!("no id in {v:#}"))
            .to_string()
    }

    /// Sends a request with extra headers and a raw body, reads the answer and checks it
    /// against the documented schema (panicking with every mismatch).
    pub fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Resp {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: test\r\n");
        if let Some(t) = &self.token {
            req.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        if let Some(b) = body {
            req.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                b.len()
            ));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body.unwrap_or_default());
        self.r.get_mut().write_all(&bytes).expect("send request");
        let mut r = self.read_response().expect("read response");
        if self.check {
            r.checked = super::schema::check_answer(method, path, &r)
                .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        }
        r
    }

    /// Writes raw bytes on the connection.
    pub fn write_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.r.get_mut().write_all(bytes)
    }

    /// Reads a status line and the headers, leaving the body to be read; `None` if the
    /// connection closed first or what came is not a response head.
    pub fn try_read_head(&mut self) -> Option<(u16, Vec<(String, String)>)> {
        let mut line = String::new();
        if self.r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let status: u16 = line.split(' ').nth(1)?.parse().ok()?;
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            self.r.read_line(&mut h).ok()?;
            let h = h.trim_end();
            if h.is_empty() {
                return Some((status, headers));
            }
            let (k, v) = h.split_once(':')?;
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }

    /// Reads a response's status and headers, leaving its body (say, a stream) to be read;
    /// panics if no response head comes.
    pub fn read_head(&mut self) -> (u16, Vec<(String, String)>) {
        self.try_read_head()
            .expect("a response head (status line and headers)")
    }

    /// Reads one chunk of a chunked body: `None` at the last chunk (and its trailers).
    /// Panics if the connection closes first or the framing is wrong.
    pub fn read_chunk(&mut self) -> Option<Vec<u8>> {
        let mut line = String::new();
        assert!(
            self.r.read_line(&mut line).unwrap() > 0,
            "the connection closed before the last chunk"
        );
        let size = line.trim_end().split(';').next().unwrap();
        let n = usize::from_str_radix(size, 16).unwrap_or_else(|_| panic!("chunk size {line:?}"));
        if n == 0 {
            loop {
                let mut t = String::new();
                self.r.read_line(&mut t).unwrap();
                if t == "\r\n" {
                    return None;
                }
            }
        }
        let mut data = vec![0; n + 2];
        self.r.read_exact(&mut data).unwrap();
        assert_eq!(&data[n..], b"\r\n", "a chunk ends with CRLF");
        data.truncate(n);
        Some(data)
    }

    /// Reads one response (skipping `100 Continue`); `None` if the connection closed first.
    /// Not checked against the schema: the request it answers is not known here.
    pub fn read_response(&mut self) -> Option<Resp> {
        loop {
            let (status, headers) = self.try_read_head()?;
            if status == 100 {
                continue;
            }
            let len: usize = headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                .map(|(_, v)| v.parse().unwrap())
                .unwrap_or(0);
            let mut body = vec![0; len];
            self.r.read_exact(&mut body).ok()?;
            return Some(Resp {
                status,
                headers,
                body,
                checked: None,
            });
        }
    }

    /// True once the server closed the connection (reads EOF or a reset), within `within`.
    pub fn closed_within(&mut self, within: Duration) -> bool {
        self.r.get_mut().closed_within(within)
    }
}
