//! The preview gate: one listener per grant's `gatePort` (on `--preview-address`), in front
//! of a dev server on loopback. A browser gets in with a one-shot token
//! (`?preview_token=`), exchanged by a 302 for a host-only cookie; every other request
//! needs that cookie for a live grant of the port, and is then forwarded to
//! `127.0.0.1:<port>` with the gate's credentials taken out.
//!
//! - `conn.rs`: each connection's loop: the head within its limits, the exchange, the
//!   cookie, the origin check, then the forward;
//! - `forward.rs`: one request to the dev server and its answer back, streamed both ways,
//!   and WebSocket upgrades spliced once the dev server answered 101;
//! - `answer.rs`: the gate's own answers (302, 401, 403, 503 and the HTTP faults).
//!
//! The grants and their open connections are [`crate::state::grants`]'s, shared with the
//! API (which mints and revokes); the gate implements [`Gates`] so that a mint on a new
//! `gatePort` makes it listen there.

mod answer;
mod conn;
mod forward;

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::state::grants::{Gates, Grants};

/// The read buffer of each side of a forwarded connection, and of a body's pump. 256 KiB
/// was tried: bulk bodies went no faster on loopback (the copies, not the reads, cost),
/// and each open connection held some 260 KiB instead of 80.
const STREAM_BUFFER: usize = 64 << 10;

/// The default `--preview-address`.
pub const DEFAULT_ADDRESS: &str = "0.0.0.0";

/// What the gate accepts, and how long it waits.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the listeners bind.
    pub address: IpAddr,
    /// Most connections open at once, over every gate port.
    pub max_connections: usize,
    /// Most connections open at once to one grant.
    pub max_per_grant: usize,
    /// Failed token exchanges one client address may make per minute.
    pub failed_exchanges_per_minute: u32,
    /// The HTTP limits of the browser's side (the head is capped at 16 KiB).
    pub http: crate::http::Limits,
    /// How long the dev server may take to begin its answer.
    pub upstream_head_timeout: Duration,
    /// How long a body or an upgraded connection may be silent, either way.
    pub stream_idle_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            address: IpAddr::from([0, 0, 0, 0]),
            max_connections: 1024,
            max_per_grant: 256,
            failed_exchanges_per_minute: 30,
            http: crate::http::Limits {
                max_head: 16 << 10,
                max_headers: 100,
                idle_timeout: Duration::from_secs(60),
                head_timeout: Duration::from_secs(10),
                body_timeout: Duration::from_secs(60),
                write_timeout: Duration::from_secs(30),
                ..Default::default()
            },
            upstream_head_timeout: Duration::from_secs(300),
            stream_idle_timeout: Duration::from_secs(3600),
        }
    }
}

/// The gate: its listeners and everything its connections share.
pub struct Gate {
    cfg: Config,
    grants: Arc<Grants>,
    /// Gate ports listened on.
    listening: Mutex<HashSet<u16>>,
    /// Connections open now, authenticated or not.
    open: AtomicUsize,
    /// Failed exchanges by client address: (window start, count).
    failures: Mutex<HashMap<IpAddr, (Instant, u32)>>,
    stopping: AtomicBool,
    /// Itself, for [`Gates::open`] (which gets a borrow).
    me: std::sync::Weak<Gate>,
}

impl Gate {
    /// A gate over `grants`; it listens once [`Gate::run`] runs or a mint opens a port.
    pub fn new(grants: Arc<Grants>, cfg: Config) -> Arc<Gate> {
        Arc::new_cyclic(|me| Gate {
            me: me.clone(),
            cfg,
            grants,
            listening: Mutex::new(HashSet::new()),
            open: AtomicUsize::new(0),
            failures: Mutex::new(HashMap::new()),
            stopping: AtomicBool::new(false),
        })
    }

    /// Listens on every live grant's gate port, then every 200 ms reads the grants again
    /// (a revoke by another process), closes the connections of grants that ended, and
    /// listens on new gate ports, until `stop` is readable.
    pub fn run(self: &Arc<Gate>, stop: BorrowedFd<'_>) -> std::io::Result<()> {
        let mut failed = HashSet::new();
        loop {
            for port in self.grants.refresh(Duration::from_millis(200)) {
                // Tried again every round (the port may come free), logged once; a mint
                // for the port tells its caller why.
                if let Err(e) = self.listen(port)
                    && failed.insert(port)
                {
                    log(serde_json::json!({"event": "gate-failed", "gatePort": port, "error": e}));
                }
            }
            self.grants.close_ended();
            if wait_readable(stop, Duration::from_millis(200)) {
                self.stopping.store(true, Ordering::SeqCst);
                return Ok(());
            }
        }
    }

    fn listen(self: &Arc<Gate>, port: u16) -> Result<(), String> {
        let mut listening = self.listening.lock().unwrap_or_else(|e| e.into_inner());
        if listening.contains(&port) {
            return Ok(());
        }
        let addr = SocketAddr::new(self.cfg.address, port);
        let l = TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        l.set_nonblocking(true)
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let gate = Arc::clone(self);
        std::thread::Builder::new()
            .name(format!("gate-{port}"))
            .stack_size(256 << 10)
            .spawn(move || gate.accept_loop(l, port))
            .map_err(|e| format!("cannot start the gate's thread: {e}"))?;
        listening.insert(port);
        log(serde_json::json!({"event": "gate-listening", "address": addr.to_string()}));
        Ok(())
    }

    fn accept_loop(self: Arc<Gate>, l: TcpListener, gate_port: u16) {
        while !self.stopping.load(Ordering::SeqCst) {
            if !wait_readable(l.as_fd(), Duration::from_millis(200)) {
                continue;
            }
            let (s, peer) = match l.accept() {
                Ok(x) => x,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            let _ = s.set_nonblocking(false);
            let _ = s.set_nodelay(true);
            if self.open.fetch_add(1, Ordering::SeqCst) >= self.cfg.max_connections {
                self.open.fetch_sub(1, Ordering::SeqCst);
                answer::busy(&s, self.cfg.max_connections);
                self.count(answer::Outcome::Refused);
                continue;
            }
            let gate = Arc::clone(&self);
            let spawned = std::thread::Builder::new()
                .name("gate-conn".into())
                .stack_size(256 << 10)
                .spawn(move || {
                    conn::connection(&gate, gate_port, s, peer);
                    gate.open.fetch_sub(1, Ordering::SeqCst);
                });
            if spawned.is_err() {
                self.open.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Counts one answer by its outcome.
    fn count(&self, outcome: answer::Outcome) {
        use answer::Outcome::*;
        let s = &self.grants.stats;
        let c = match outcome {
            Forwarded => &s.forwarded,
            Exchanged => &s.exchanged,
            Unauthorized => &s.unauthorized,
            Forbidden => &s.forbidden,
            Unavailable => &s.unavailable,
            Refused => &s.refused,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// True if `ip` has used up its failed exchanges for this minute.
    fn exchange_limited(&self, ip: IpAddr) -> bool {
        let f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        f.get(&ip).is_some_and(|(since, n)| {
            since.elapsed() < Duration::from_secs(60) && *n >= self.cfg.failed_exchanges_per_minute
        })
    }

    fn exchange_failed(&self, ip: IpAddr) {
        let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if f.len() > 4096 {
            f.retain(|_, (since, _)| since.elapsed() < Duration::from_secs(60));
        }
        let e = f.entry(ip).or_insert((Instant::now(), 0));
        if e.0.elapsed() >= Duration::from_secs(60) {
            *e = (Instant::now(), 0);
        }
        e.1 += 1;
    }
}

impl Gates for Gate {
    fn open(&self, gate_port: u16) -> Result<(), String> {
        // Its listener's thread holds the gate: it needs the Arc, not the borrow.
        let me = self.me.upgrade().ok_or("the gate has stopped")?;
        me.listen(gate_port)
    }
}

/// Makes the gate over `grants` and hands it to them, so that a mint on a new gate port
/// makes it listen there; [`Gate::run`] then serves until the stop.
pub fn start(grants: Arc<Grants>, cfg: Config) -> Arc<Gate> {
    let gate = Gate::new(Arc::clone(&grants), cfg);
    grants.set_gates(Arc::clone(&gate) as Arc<dyn Gates>);
    gate
}

/// Waits up to `d` for `fd` to be readable (or hung up).
fn wait_readable(fd: BorrowedFd<'_>, d: Duration) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    let ms = PollTimeout::try_from(d.as_millis().min(60_000) as i32).unwrap_or(PollTimeout::ZERO);
    poll(&mut fds, ms).is_ok_and(|n| n > 0)
}

/// One JSON line to stderr, as `serve` logs: never a token, a cookie or a query.
fn log(v: serde_json::Value) {
    let mut line = v.to_string();
    line.push('\n');
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}
