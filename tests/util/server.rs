//! A real `serve` on an ephemeral port (or a unix socket) inside a sandbox.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::http::Client;
use super::procs::kill;
use super::sandbox::Sandbox;

/// A running `serve`. Dropping it kills the server (SIGKILL: jobs go on); the sandbox's
/// guard then ends its jobs and checks that nothing is left, once the last holder of the
/// sandbox is gone.
pub struct Server {
    child: Option<Child>,
    pub sb: Arc<Sandbox>,
    /// The state root.
    pub home: PathBuf,
    /// `127.0.0.1:PORT` or `unix:/path`.
    pub addr: String,
    pub token: String,
    /// The first log line: the server's announcement of where it listens.
    pub started: Value,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts a server on 127.0.0.1:0 with extra flags, in a sandbox of its own.
    pub fn start(flags: &[&str]) -> Server {
        Server::start_in(Arc::new(Sandbox::new()), "127.0.0.1:0", flags)
    }

    /// Starts a server in `sb`, listening on `listen` (`--grace 1` unless told otherwise).
    pub fn start_in(sb: Arc<Sandbox>, listen: &str, flags: &[&str]) -> Server {
        Server::start_with(sb, listen, flags, &[])
    }

    /// [`Server::start_in`] on 127.0.0.1:0 with these environment variables set.
    pub fn start_in_env(sb: Arc<Sandbox>, flags: &[&str], env: &[(&str, &str)]) -> Server {
        Server::start_with(sb, "127.0.0.1:0", flags, env)
    }

    fn start_with(sb: Arc<Sandbox>, listen: &str, flags: &[&str], env: &[(&str, &str)]) -> Server {
        let mut c = sb.cmd(&["serve", "--listen", listen, "--grace", "1"]);
        c.envs(env.iter().copied());
        c.args(flags).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = sb.spawn(c);
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
        let started: Value = serde_json::from_str(&first)
            .unwrap_or_else(|_| panic!("first log line is not JSON: {first}"));
        let addr = started["address"].as_str().unwrap_or_default().to_string();
        assert!(!addr.is_empty(), "no address in {first}");
        let home = sb.home().to_path_buf();
        let token = std::fs::read_to_string(home.join("agent.token"))
            .unwrap_or_default()
            .trim()
            .to_string();
        Server {
            child: Some(child),
            sb,
            home,
            addr,
            token,
            started,
            log,
        }
    }

    /// The sandbox's folder (beside the state root).
    pub fn dir(&self) -> &Path {
        self.sb.dir()
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
        kill(c.id() as i32, libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                return st;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                panic!("serve did not stop on SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}
