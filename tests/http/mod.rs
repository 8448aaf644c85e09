//! Helpers for the HTTP tests: a real `serve` on an ephemeral port with its own state root,
//! and a tiny raw-socket HTTP/1.1 client (so the tests see exactly what goes on the wire).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use serde_json::{Value, json};

/// The agent binary under test.
pub fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_gitterm-agent")
}

/// A running `serve` with its own state root. Dropping it cancels the jobs still running
/// and kills the server.
pub struct Server {
    pub child: Option<Child>,
    pub home: PathBuf,
    /// Keeps the temp folder alive (and removes it at the end).
    pub dir: Arc<tempfile::TempDir>,
    /// `127.0.0.1:PORT` or `unix:/path`.
    pub addr: String,
    pub token: String,
    pub log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts a server on 127.0.0.1:0 with extra flags.
    pub fn start(flags: &[&str]) -> Server {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        Server::start_in(dir, "127.0.0.1:0", flags)
    }

    /// Starts a server with the state root `<dir>/root`, listening on `listen`.
    pub fn start_in(dir: Arc<tempfile::TempDir>, listen: &str, flags: &[&str]) -> Server {
        let home = dir.path().join("root");
        let mut child = Command::new(exe())
            .args(["serve", "--listen", listen, "--grace", "1"])
            .args(flags)
            .env("GITTERM_HOME", &home)
            .env("HOME", dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                let mut first = true;
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if first {
                        let _ = tx.send(line.clone());
                        first = false;
                    }
                    let mut l = log.lock().unwrap();
                    l.push_str(&line);
                    l.push('\n');
                }
            });
        }
        let first = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("serve did not start: {}", log.lock().unwrap());
            }
        };
        let v: Value = serde_json::from_str(&first)
            .unwrap_or_else(|_| panic!("first log line is not JSON: {first}"));
        let addr = v["address"].as_str().unwrap_or_default().to_string();
        assert!(!addr.is_empty(), "no address in {first}");
        let token = std::fs::read_to_string(home.join("agent.token"))
            .unwrap_or_default()
            .trim()
            .to_string();
        Server {
            child: Some(child),
            home,
            dir,
            addr,
            token,
            log,
        }
    }

    /// A client with the full token.
    pub fn client(&self) -> Client {
        Client::connect(&self.addr).token(&self.token)
    }

    /// A client without a token.
    pub fn anon(&self) -> Client {
        Client::connect(&self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Kills the server with SIGKILL (jobs go on).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends SIGTERM and returns the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().unwrap();
        signal(c.id() as i32, libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                return st;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                panic!("serve did not stop on SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Cancels every job still running under this state root, through the CLI (which
    /// needs no server).
    pub fn cancel_all(&self) {
        let Ok(dir) = std::fs::read_dir(self.home.join("jobs")) else {
            return;
        };
        for e in dir.flatten() {
            let rec = std::fs::read(e.path().join("job.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
            if rec.is_some_and(|r| r["status"] == "running") {
                let _ = Command::new(exe())
                    .arg("cancel")
                    .arg(e.file_name())
                    .env("GITTERM_HOME", &self.home)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.cancel_all();
        self.kill9();
    }
}

/// Sends a signal to a pid.
pub fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// A response.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
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
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
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
}

impl Client {
    pub fn connect(addr: &str) -> Client {
        Client {
            addr: addr.to_string(),
            r: BufReader::new(Conn::open(addr)),
            token: None,
        }
    }

    pub fn token(mut self, t: &str) -> Client {
        self.token = Some(t.to_string());
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

    /// Sends a request with extra headers and a raw body.
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
        self.read_response().expect("read response")
    }

    /// Writes raw bytes on the connection.
    pub fn write_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.r.get_mut().write_all(bytes)
    }

    /// Reads one response (skipping `100 Continue`); `None` if the connection closed first.
    pub fn read_response(&mut self) -> Option<Resp> {
        loop {
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
                    break;
                }
                let (k, v) = h.split_once(':')?;
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
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
            });
        }
    }

    /// True once the server closed the connection (reads EOF or a reset), within `within`.
    pub fn closed_within(&mut self, within: Duration) -> bool {
        self.r.get_ref().set_timeout(within);
        let mut buf = [0u8; 4096];
        loop {
            match self.r.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue, // e.g. a 408 before the close
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

/// Polls `f` until it returns `Some`, or panics after `within`.
pub fn eventually<T>(within: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Writes a file with a mode.
pub fn write_mode(path: &Path, data: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, data).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// True if a process exists (and is not a zombie).
pub fn alive(pid: i64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().map(|r| r.trim().to_string()))
        .is_some_and(|r| !r.starts_with('Z'))
}
