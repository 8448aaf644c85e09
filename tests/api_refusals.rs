//! The API refuses what it would otherwise misread: unknown body fields and query
//! parameters are 400 `invalid`, naming the closest known one, and nothing happens. Over a
//! real `serve` on loopback, with raw requests as curl would send them.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// A `serve` on an ephemeral port with its own state root; killed on drop.
struct Server {
    child: Child,
    addr: String,
    token: String,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let mut child = Command::new(env!("CARGO_BIN_EXE_gitterm-agent"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env("GITTERM_HOME", &root)
            .env("HOME", dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start serve");
        // The first log line names the address; the rest is drained so the server never
        // blocks on a full pipe.
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let first = lines.next().and_then(|l| l.ok()).unwrap_or_default();
        std::thread::spawn(move || lines.for_each(drop));
        let v: Value = serde_json::from_str(&first).unwrap_or_else(|_| panic!("{first}"));
        let addr = v["address"].as_str().expect("an address").to_string();
        let token = std::fs::read_to_string(root.join("agent.token")).unwrap();
        Server {
            child,
            addr,
            token: token.trim().to_string(),
            _dir: dir,
        }
    }

    /// Sends one request and returns the status and the JSON body.
    fn send(&self, method: &str, target: &str, body: Option<&str>) -> (u16, Value) {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        let body = body.unwrap_or("");
        write!(
            s,
            "{method} {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.token,
            body.len()
        )
        .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").expect("a whole response");
        let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap();
        (status, serde_json::from_str(body).unwrap_or(Value::Null))
    }

    /// Expects 400 `invalid` with exactly this message.
    fn refused(&self, method: &str, target: &str, body: Option<&str>, message: &str) {
        let (status, v) = self.send(method, target, body);
        assert_eq!(status, 400, "{method} {target}: {v}");
        assert_eq!(v["error"]["code"], "invalid", "{v}");
        assert_eq!(v["error"]["message"], message, "{method} {target}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn unknown_fields_and_parameters_are_refused_and_nothing_happens() {
    let s = Server::start();
    s.refused(
        "POST",
        "/v1/jobs",
        Some(r#"{"command": "sleep 1", "timeout": 5}"#),
        "unknown field `timeout`; did you mean `timeoutSeconds`?",
    );
    s.refused(
        "POST",
        "/v1/jobs",
        Some(r#"{"comand": "ls"}"#),
        "unknown field `comand`; did you mean `command`? (command is missing)",
    );
    let (status, v) = s.send("GET", "/v1/jobs", None);
    assert_eq!((status, &v["jobs"]), (200, &Value::Array(vec![])), "{v}");

    s.refused(
        "POST",
        "/v1/env",
        Some(r#"{"sett": {"A": "1"}}"#),
        "unknown field `sett`; did you mean `set`?",
    );
    let (_, v) = s.send("GET", "/v1/env", None);
    assert_eq!(v["names"], Value::Array(vec![]), "{v}");

    // The query is checked before the job is looked up: even an unknown job's route says
    // what is wrong with the query.
    let job = "/v1/jobs/job_00000000000000000000";
    s.refused(
        "GET",
        &format!("{job}/output?ofset=10"),
        None,
        "unknown query parameter `ofset`; did you mean `offset`?",
    );
    s.refused(
        "GET",
        "/v1/jobs?stauts=running",
        None,
        "unknown query parameter `stauts`; did you mean `status`?",
    );
    s.refused(
        "GET",
        "/v1/sandbox?verbose=1",
        None,
        "unknown query parameter `verbose`: this route takes none",
    );
    s.refused(
        "POST",
        &format!("{job}/cancel"),
        Some(r#"{"force": true}"#),
        "unknown field `force`: this request's body takes none",
    );
    // What the routes do read still works.
    let (status, _) = s.send("GET", "/v1/jobs?status=running&limit=5", None);
    assert_eq!(status, 200);
    let (status, v) = s.send("GET", &format!("{job}/output?offset=0&limit=1"), None);
    assert_eq!((status, &v["error"]["code"]), (404, &"not_found".into()));
}
