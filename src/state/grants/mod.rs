//! Preview grants: who may open which gate port, kept under `<root>/previews/` (0600): the
//! grants with their tokens' SHA-256 hashes (`grants.json`, never a token itself) and the
//! cookie key (`key`). The file is the truth: `serve` holds it in memory and reads it again
//! when it changes (so `gitterm-agent previews revoke` takes effect in a running `serve`),
//! and every change is a read-modify-write under `lock` (flock).
//!
//! A grant opened under another boot than the current one is `suspended` (the sandbox was
//! restored from a snapshot: nothing that listened then listens now) until a mint for its
//! key re-opens it, with the same id, so the cookies given out before work again.
//!
//! Also here, below both front ends: the open connections of each grant ([`live`]), which a
//! revoke closes, and [`Gates`], how the API's mint makes the gate listen on a new port.

pub mod live;

use std::fs::{File, OpenOptions};
use std::net::TcpStream;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::model::error::{Error, Result};
use crate::model::preview;

pub use live::{Counted, Full, Live};

/// Under the state root: the grants, their key and their lock.
pub const DIR: &str = "previews";
const FILE: &str = "grants.json";
const KEY_FILE: &str = "key";
const LOCK_FILE: &str = "lock";
const FORMAT_VERSION: u32 = 1;

/// How long a token lasts.
pub const TOKEN_SECONDS: u64 = 3600;
/// The longest and default `ttlSeconds` of a grant.
pub const MAX_TTL_SECONDS: u64 = 86_400;
/// Revoked and expired grants are kept this long (listed), then dropped from the file.
const KEEP_ENDED_SECONDS: u64 = 7 * 86_400;
/// Tokens a grant keeps unused at once; minting more drops the oldest.
const MAX_TOKENS: usize = 64;
/// The most grants kept (live or ended).
const MAX_GRANTS: usize = 1024;

/// Seconds since the epoch now.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Who a grant is for: `{"scope", "id"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub scope: String,
    pub id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Token {
    hash: String,
    expires_at: u64,
}

/// One grant as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Stored {
    id: String,
    port: u16,
    gate_port: u16,
    identity: Option<Identity>,
    public: bool,
    created_at: u64,
    expires_at: u64,
    revoked: bool,
    /// The boot under which it was last opened; another boot suspends it.
    boot_id: String,
    /// Unused tokens only: a used one is removed as it is used.
    tokens: Vec<Token>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Doc {
    format_version: u32,
    grants: Vec<Stored>,
}

/// A grant as the API and the CLI show it (never a token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    pub id: String,
    pub port: u16,
    pub gate_port: u16,
    pub identity: Option<Identity>,
    pub public: bool,
    /// RFC 3339.
    pub created_at: String,
    pub expires_at: String,
    pub revoked: bool,
    pub suspended: bool,
    /// The dev server listens on an address other than loopback.
    pub bypassable: bool,
    /// Connections open now.
    pub connections: usize,
}

/// What a mint asks for.
#[derive(Debug, Clone)]
pub struct Mint {
    pub port: u16,
    pub gate_port: u16,
    pub identity: Option<Identity>,
    pub public: bool,
    pub ttl_seconds: u64,
}

/// A new token for a grant.
#[derive(Debug, Clone)]
pub struct Issued {
    pub token: String,
    /// Unix seconds.
    pub expires_at: u64,
}

/// Why the gate refuses a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// No valid credential (401), with the short text to answer.
    Unauthorized(&'static str),
    /// The grant was opened under another boot (503).
    Suspended { port: u16 },
}

/// What opened a request at the gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    pub grant: String,
    /// Where the dev server listens.
    pub port: u16,
}

/// How the API makes the gate listen on a port (implemented by the gate, handed to
/// [`Grants::set_gates`] by `serve`).
pub trait Gates: Send + Sync {
    /// Listens on `gate_port` unless it does already; `Err` says why it cannot.
    fn open(&self, gate_port: u16) -> std::result::Result<(), String>;
}

/// Counters of the gate's answers, for `/v1/metrics` (never a token or an identity).
#[derive(Debug, Default)]
pub struct Stats {
    /// Forwarded to the dev server (whatever it answered).
    pub forwarded: AtomicU64,
    /// A token exchanged for a cookie (302).
    pub exchanged: AtomicU64,
    /// 401.
    pub unauthorized: AtomicU64,
    /// 403: a foreign origin.
    pub forbidden: AtomicU64,
    /// 503: nothing listening, or suspended.
    pub unavailable: AtomicU64,
    /// 400, 431, 429: malformed, too large, too many.
    pub refused: AtomicU64,
}

impl Stats {
    /// Every counter with its `outcome` label value.
    pub fn all(&self) -> [(&'static str, u64); 6] {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("forwarded", g(&self.forwarded)),
            ("exchanged", g(&self.exchanged)),
            ("unauthorized", g(&self.unauthorized)),
            ("forbidden", g(&self.forbidden)),
            ("unavailable", g(&self.unavailable)),
            ("refused", g(&self.refused)),
        ]
    }
}

/// The grants of this state root, held in memory.
pub struct Grants {
    dir: PathBuf,
    key: Vec<u8>,
    boot_id: String,
    doc: Mutex<Held>,
    /// Open connections by grant.
    pub live: Arc<Live>,
    gates: OnceLock<Arc<dyn Gates>>,
    /// The gate's answers.
    pub stats: Stats,
}

struct Held {
    doc: Doc,
    /// The file as last read: (inode, size, mtime ns); `None` when there was none.
    stamp: Option<(u64, u64, i128)>,
    /// When the file was last looked at.
    checked: Instant,
}

fn stamp(path: &Path) -> Option<(u64, u64, i128)> {
    let m = std::fs::metadata(path).ok()?;
    Some((
        m.ino(),
        m.size(),
        i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
    ))
}

fn rfc3339(secs: u64) -> String {
    crate::text::timefmt::rfc3339(UNIX_EPOCH + Duration::from_secs(secs))
}

impl Grants {
    /// The grants under `root`, for the kernel's boot (or `GITTERM_BOOT_ID_FILE`'s). Makes
    /// the folder and the key on first use.
    pub fn open(root: &Path) -> Result<Arc<Grants>> {
        Grants::open_with(root, &super::sandbox::boot_id())
    }

    /// [`Grants::open`] for a given boot id (tests pass fake ones).
    pub fn open_with(root: &Path, boot_id: &str) -> Result<Arc<Grants>> {
        let dir = root.join(DIR);
        super::fsutil::ensure_private_dir(&dir)
            .map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
        let key = load_key(&dir)?;
        let g = Grants {
            doc: Mutex::new(Held {
                doc: Doc::default(),
                stamp: None,
                checked: Instant::now(),
            }),
            dir,
            key,
            boot_id: boot_id.to_string(),
            live: Arc::new(Live::default()),
            gates: OnceLock::new(),
            stats: Stats::default(),
        };
        {
            let mut h = g.held();
            g.reload(&mut h)?;
        }
        Ok(Arc::new(g))
    }

    /// Makes mints open gate ports through `gates` (once; later calls change nothing).
    pub fn set_gates(&self, gates: Arc<dyn Gates>) {
        let _ = self.gates.set(gates);
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        self.doc.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn file(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// Reads the file again if it changed since it was last read.
    fn reload(&self, h: &mut Held) -> Result<()> {
        let path = self.file();
        h.checked = Instant::now();
        let now = stamp(&path);
        if now.is_some() && now == h.stamp {
            return Ok(());
        }
        h.doc = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                Error::Internal(format!(
                    "{} is corrupt ({e}); move it aside to start with no grants",
                    path.display()
                ))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Doc::default(),
            Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
        };
        h.stamp = now;
        Ok(())
    }

    /// Reads the file again if it changed (another process revoked a grant), at most every
    /// `every`; returns the live grants' gate ports.
    pub fn refresh(&self, every: Duration) -> Vec<u16> {
        let mut h = self.held();
        if h.checked.elapsed() >= every {
            let _ = self.reload(&mut h);
        }
        let now = unix_now();
        let mut ports: Vec<u16> = h
            .doc
            .grants
            .iter()
            .filter(|g| !g.revoked && g.expires_at > now)
            .map(|g| g.gate_port)
            .collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    /// Closes the open connections of every grant that is no longer live (revoked,
    /// expired, gone from the file); returns how many it closed.
    pub fn close_ended(&self) -> usize {
        let now = unix_now();
        let ended: Vec<String> = {
            let h = self.held();
            self.live
                .grants()
                .into_iter()
                .filter(|id| {
                    !h.doc
                        .grants
                        .iter()
                        .any(|g| &g.id == id && !g.revoked && g.expires_at > now)
                })
                .collect()
        };
        ended.iter().map(|id| self.live.close(id)).sum()
    }

    /// A read-modify-write of the file under its lock: `f` changes the doc as read now.
    /// The doc in memory is not held meanwhile (the flock orders writers, in this process
    /// and others), so the gate's checks never wait for the write and its fsync.
    fn change<T>(&self, f: impl FnOnce(&mut Doc, u64) -> Result<T>) -> Result<T> {
        let _lock = self.lock()?;
        let mut doc = {
            let mut h = self.held();
            self.reload(&mut h)?;
            Doc {
                format_version: FORMAT_VERSION,
                grants: h.doc.grants.clone(),
            }
        };
        let now = unix_now();
        let out = f(&mut doc, now)?;
        doc.grants.retain(|g| !ended_long_ago(g, now));
        for g in &mut doc.grants {
            g.tokens.retain(|t| t.expires_at > now);
        }
        let data = serde_json::to_vec_pretty(&doc)
            .map_err(|e| Error::Internal(format!("encoding the grants: {e}")))?;
        let path = self.file();
        super::fsutil::write_atomic(&path, &data, 0o600)
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
        let mut h = self.held();
        h.doc = doc;
        h.stamp = stamp(&path);
        Ok(out)
    }

    fn lock(&self) -> Result<File> {
        let path = self.dir.join(LOCK_FILE);
        let file = super::fsutil::open_lock_file(&path)
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        // Held only for a read and a write: ten seconds means its holder is stuck.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(file),
                Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(Error::Timeout(format!(
                        "{} is held by another process for over 10 s; retry",
                        path.display()
                    )));
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(Error::io(format!("locking {}", path.display()), e));
                }
            }
        }
    }

    fn suspended(&self, g: &Stored) -> bool {
        !self.boot_id.is_empty() && !g.boot_id.is_empty() && g.boot_id != self.boot_id
    }

    fn view(&self, g: &Stored, listening: &[crate::os::ports::Listener]) -> Grant {
        Grant {
            id: g.id.clone(),
            port: g.port,
            gate_port: g.gate_port,
            identity: g.identity.clone(),
            public: g.public,
            created_at: rfc3339(g.created_at),
            expires_at: rfc3339(g.expires_at),
            revoked: g.revoked,
            suspended: self.suspended(g),
            bypassable: bypassable(g.port, listening),
            connections: self.live.count(&g.id),
        }
    }

    fn new_token(g: &mut Stored, now: u64) -> Result<Issued> {
        let mut rnd = [0u8; 32];
        crate::os::proc::random_bytes(&mut rnd)
            .map_err(|e| Error::io("drawing a token from the kernel", e))?;
        let token = preview::token_from_random(rnd);
        let expires_at = (now + TOKEN_SECONDS).min(g.expires_at);
        g.tokens.push(Token {
            hash: preview::token_hash(&token),
            expires_at,
        });
        if g.tokens.len() > MAX_TOKENS {
            g.tokens.remove(0);
        }
        Ok(Issued { token, expires_at })
    }

    /// Mints a grant, or returns the live one with the same key (`port`, `identity`) with
    /// a new token, re-opening it if it was suspended. The gate listens on its port once
    /// this returns.
    pub fn mint(&self, m: Mint) -> Result<(Grant, Issued)> {
        if m.port == m.gate_port {
            return Err(Error::Invalid(format!(
                "gatePort {} is the dev server's own port: the gate needs a port of its own \
                 (the one the provider publishes)",
                m.gate_port
            )));
        }
        if !(1..=MAX_TTL_SECONDS).contains(&m.ttl_seconds) {
            return Err(Error::Invalid(format!(
                "ttlSeconds must be from 1 to {MAX_TTL_SECONDS}, got {}",
                m.ttl_seconds
            )));
        }
        if let Some(gates) = self.gates.get() {
            gates.open(m.gate_port).map_err(|why| {
                Error::Conflict(format!(
                    "the gate cannot listen on gatePort {}: {why}",
                    m.gate_port
                ))
            })?;
        }
        let boot = self.boot_id.clone();
        let (g, issued) = self.change(|doc, now| {
            let live = |g: &Stored| !g.revoked && g.expires_at > now;
            if let Some(other) = doc
                .grants
                .iter()
                .find(|g| live(g) && g.gate_port == m.gate_port && g.port != m.port)
            {
                return Err(Error::Conflict(format!(
                    "gatePort {} already fronts port {} (grant {}); give this port another \
                     gatePort",
                    m.gate_port, other.port, other.id
                )));
            }
            if let Some(g) = doc
                .grants
                .iter_mut()
                .find(|g| live(g) && g.port == m.port && g.identity == m.identity)
            {
                if g.gate_port != m.gate_port {
                    return Err(Error::Conflict(format!(
                        "grant {} for port {} and this identity is on gatePort {}; mint with \
                         that gatePort, or revoke it first",
                        g.id, g.port, g.gate_port
                    )));
                }
                if g.public != m.public {
                    return Err(Error::Conflict(format!(
                        "grant {} for this port and identity has public: {}; revoke it to \
                         change that",
                        g.id, g.public
                    )));
                }
                g.boot_id = boot.clone();
                let issued = Grants::new_token(g, now)?;
                return Ok((g.clone(), issued));
            }
            if doc.grants.len() >= MAX_GRANTS {
                return Err(Error::RateLimited(format!(
                    "{MAX_GRANTS} grants are kept already; revoke some first"
                )));
            }
            let mut rnd = [0u8; 17];
            crate::os::proc::random_bytes(&mut rnd)
                .map_err(|e| Error::io("drawing a grant id from the kernel", e))?;
            let mut g = Stored {
                id: preview::grant_id_from_random(rnd),
                port: m.port,
                gate_port: m.gate_port,
                identity: m.identity.clone(),
                public: m.public,
                created_at: now,
                expires_at: now + m.ttl_seconds,
                revoked: false,
                boot_id: boot.clone(),
                tokens: Vec::new(),
            };
            let issued = Grants::new_token(&mut g, now)?;
            doc.grants.push(g.clone());
            Ok((g, issued))
        })?;
        Ok((self.view(&g, &crate::os::ports::listening()), issued))
    }

    /// Another token for a live grant.
    pub fn token(&self, id: &str) -> Result<Issued> {
        self.change(|doc, now| {
            let g = find(doc, id)?;
            if g.revoked {
                return Err(Error::Conflict(format!(
                    "grant {id} is revoked; mint a new one"
                )));
            }
            if g.expires_at <= now {
                return Err(Error::Conflict(format!(
                    "grant {id} has expired; mint a new one"
                )));
            }
            Grants::new_token(g, now)
        })
    }

    /// Every grant kept, live ones first, then by creation.
    pub fn list(&self) -> Vec<Grant> {
        let listening = crate::os::ports::listening();
        let h = self.held();
        let now = unix_now();
        let mut out: Vec<(bool, u64, Grant)> = h
            .doc
            .grants
            .iter()
            .map(|g| {
                let live = !g.revoked && g.expires_at > now;
                (!live, g.created_at, self.view(g, &listening))
            })
            .collect();
        out.sort_by_key(|a| (a.0, a.1));
        out.into_iter().map(|(_, _, g)| g).collect()
    }

    /// One grant.
    pub fn get(&self, id: &str) -> Result<Grant> {
        let h = self.held();
        let g = h
            .doc
            .grants
            .iter()
            .find(|g| g.id == id)
            .ok_or_else(|| not_found(id))?;
        Ok(self.view(g, &crate::os::ports::listening()))
    }

    /// Revokes a grant for good and closes its open connections.
    pub fn revoke(&self, id: &str) -> Result<Grant> {
        let g = self.change(|doc, _| {
            let g = find(doc, id)?;
            g.revoked = true;
            g.tokens.clear();
            Ok(g.clone())
        })?;
        self.live.close(id);
        Ok(self.view(&g, &crate::os::ports::listening()))
    }

    /// Uses up `token` at `gate_port`: the grant and the cookie value that opens it there.
    pub fn exchange(
        &self,
        gate_port: u16,
        token: &str,
    ) -> std::result::Result<(Admitted, String), Denied> {
        const NO: Denied = Denied::Unauthorized(
            "Unauthorized: this preview link was used already, has expired or is not valid here. Ask for a new link.\n",
        );
        let hash = preview::token_hash(token);
        let known = |g: &Stored, now: u64| {
            g.gate_port == gate_port
                && g.tokens.iter().any(|t| {
                    preview::ct_eq(t.hash.as_bytes(), hash.as_bytes()) && t.expires_at > now
                })
        };
        // A guess is refused from memory: only a live token costs a write.
        {
            let mut h = self.held();
            let _ = self.reload(&mut h);
            let now = unix_now();
            match h.doc.grants.iter().find(|g| known(g, now)) {
                None => return Err(NO),
                // Not used up: the link works once the grant is re-opened by a mint.
                Some(g) if self.suspended(g) => return Err(Denied::Suspended { port: g.port }),
                Some(_) => {}
            }
        }
        let found = self.change(|doc, now| {
            let g = doc.grants.iter_mut().find(|g| known(g, now));
            let Some(g) = g else { return Ok(None) };
            g.tokens
                .retain(|t| !preview::ct_eq(t.hash.as_bytes(), hash.as_bytes()));
            if g.revoked || g.expires_at <= now {
                return Ok(None);
            }
            Ok(Some(g.clone()))
        });
        let Ok(Some(g)) = found else { return Err(NO) };
        if self.suspended(&g) {
            return Err(Denied::Suspended { port: g.port });
        }
        let cookie = preview::cookie_value(&self.key, &g.id, gate_port, g.expires_at);
        Ok((
            Admitted {
                grant: g.id,
                port: g.port,
            },
            cookie,
        ))
    }

    /// Checks a request at `gate_port` carrying these cookie values (of the gate cookie's
    /// name): the live grant it opens. A public grant on the port opens every request.
    pub fn admit(&self, gate_port: u16, cookies: &[&str]) -> std::result::Result<Admitted, Denied> {
        let now = unix_now();
        let h = self.held();
        let live = |g: &&Stored| g.gate_port == gate_port && !g.revoked && g.expires_at > now;
        let mut found = None;
        for v in cookies {
            if let Ok(id) = preview::check_cookie(&self.key, v, gate_port, now)
                && let Some(g) = h.doc.grants.iter().find(|g| g.id == id)
                && live(&g)
            {
                found = Some(g);
                break;
            }
        }
        let found = found.or_else(|| h.doc.grants.iter().filter(live).find(|g| g.public));
        let Some(g) = found else {
            return Err(Denied::Unauthorized(if cookies.is_empty() {
                "Unauthorized: open this preview through the link you were given.\n"
            } else {
                "Unauthorized: this preview's access has ended or is not valid here. Ask for a new link.\n"
            }));
        };
        if self.suspended(g) {
            return Err(Denied::Suspended { port: g.port });
        }
        Ok(Admitted {
            grant: g.id.clone(),
            port: g.port,
        })
    }

    /// The dev server's port behind `gate_port`, if a live grant names one.
    pub fn port_behind(&self, gate_port: u16) -> Option<u16> {
        let now = unix_now();
        self.held()
            .doc
            .grants
            .iter()
            .find(|g| g.gate_port == gate_port && !g.revoked && g.expires_at > now)
            .map(|g| g.port)
    }

    /// Counts a connection to a grant (see [`Live::register`]).
    pub fn register(
        &self,
        grant: &str,
        socket: TcpStream,
        per_grant: usize,
        total: usize,
    ) -> std::result::Result<Counted, Full> {
        self.live.register(grant, socket, per_grant, total)
    }
}

fn ended_long_ago(g: &Stored, now: u64) -> bool {
    // The revoke's time is not kept: a revoked grant is kept, listed, until its expiry
    // plus the window, as an expired one.
    now >= g.expires_at + KEEP_ENDED_SECONDS
}

fn not_found(id: &str) -> Error {
    Error::NotFound(format!(
        "no preview grant {id}; GET /v1/previews/grants lists them"
    ))
}

fn find<'a>(doc: &'a mut Doc, id: &str) -> Result<&'a mut Stored> {
    doc.grants
        .iter_mut()
        .find(|g| g.id == id)
        .ok_or_else(|| not_found(id))
}

/// True if something listens on `port` at an address other than loopback: the dev server
/// can then be reached without the gate. In an E2B sandbox (`E2B_SANDBOX=true`, set by its
/// envd) `127.0.0.1` and `::1` count too: envd re-exposes listeners on exactly those (and
/// `::`) to the sandbox's proxy with socat; another loopback address such as `127.0.0.2`
/// stays private there.
fn bypassable(port: u16, listening: &[crate::os::ports::Listener]) -> bool {
    let reexposed = std::env::var("E2B_SANDBOX").is_ok_and(|v| v == "true");
    bypassable_with(port, listening, reexposed)
}

fn bypassable_with(port: u16, listening: &[crate::os::ports::Listener], reexposed: bool) -> bool {
    let open = |a: std::net::IpAddr| {
        !a.is_loopback()
            || (reexposed
                && (a == std::net::Ipv4Addr::LOCALHOST || a == std::net::Ipv6Addr::LOCALHOST))
    };
    listening
        .iter()
        .any(|l| l.port == port && l.address.parse::<std::net::IpAddr>().is_ok_and(open))
}

/// The cookie key: 32 random bytes in `key` (hex, 0600), made on first use.
fn load_key(dir: &Path) -> Result<Vec<u8>> {
    let path = dir.join(KEY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(s) => {
            let s = s.trim();
            let bytes: Option<Vec<u8>> = (0..s.len())
                .step_by(2)
                .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
                .collect();
            match bytes {
                Some(b) if b.len() == preview::KEY_BYTES => Ok(b),
                _ => Err(Error::Internal(format!(
                    "{} is not a preview key (64 hex characters); remove it to make a new one \
                     (every preview cookie given out stops working)",
                    path.display()
                ))),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut key = [0u8; preview::KEY_BYTES];
            crate::os::proc::random_bytes(&mut key)
                .map_err(|e| Error::io("drawing the preview key from the kernel", e))?;
            let hex = crate::model::id::hex(&key);
            // Made exclusively: of two processes starting at once, one key wins and both
            // read it.
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(mut f) => {
                    use std::io::Write;
                    f.write_all(hex.as_bytes())
                        .and_then(|()| f.sync_all())
                        .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
                    Ok(key.to_vec())
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    std::thread::sleep(Duration::from_millis(50));
                    load_key(dir)
                }
                Err(e) => Err(Error::io(format!("creating {}", path.display()), e)),
            }
        }
        Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mint(port: u16, gate: u16, who: Option<&str>) -> Mint {
        Mint {
            port,
            gate_port: gate,
            identity: who.map(|w| Identity {
                scope: "user".into(),
                id: w.into(),
            }),
            public: false,
            ttl_seconds: 3600,
        }
    }

    #[test]
    fn a_token_works_once_and_its_cookie_opens_the_grant() {
        let d = tempfile::tempdir().unwrap();
        let g = Grants::open_with(d.path(), "boot-a").unwrap();
        let (grant, t) = g.mint(mint(5173, 8080, None)).unwrap();
        assert!(preview::is_grant_id(&grant.id));
        assert!(g.exchange(8081, &t.token).is_err(), "another gate port");
        let (adm, cookie) = g.exchange(8080, &t.token).unwrap();
        assert_eq!(adm.grant, grant.id);
        assert!(g.exchange(8080, &t.token).is_err(), "used");
        assert_eq!(g.admit(8080, &[&cookie]).unwrap().port, 5173);
        assert!(g.admit(8081, &[&cookie]).is_err());
        assert!(g.admit(8080, &[]).is_err());
        // Same key: same grant, a new token.
        let (again, t2) = g.mint(mint(5173, 8080, None)).unwrap();
        assert_eq!(again.id, grant.id);
        assert_ne!(t2.token, t.token);
        // Another person: another grant, on the same gate port.
        let (bob, _) = g.mint(mint(5173, 8080, Some("bob"))).unwrap();
        assert_ne!(bob.id, grant.id);
        // No token under the root; the files are 0600.
        for f in ["grants.json", "key", "lock"] {
            let p = d.path().join(DIR).join(f);
            assert_eq!(
                std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
                0o600
            );
            let text = std::fs::read_to_string(&p).unwrap();
            assert!(
                !text.contains(&t.token) && !text.contains(&t2.token) && !text.contains(&cookie)
            );
        }
        // Revoked for good: the cookie and a new mint's token do not bring it back.
        g.revoke(&grant.id).unwrap();
        assert!(g.admit(8080, &[&cookie]).is_err());
        assert!(g.exchange(8080, &t2.token).is_err());
        let (fresh, _) = g.mint(mint(5173, 8080, None)).unwrap();
        assert_ne!(fresh.id, grant.id);
        assert!(g.admit(8080, &[&cookie]).is_err());
    }

    #[test]
    fn a_new_boot_suspends_and_a_mint_reopens_with_the_same_id() {
        let d = tempfile::tempdir().unwrap();
        let (id, cookie) = {
            let g = Grants::open_with(d.path(), "boot-a").unwrap();
            let (grant, t) = g.mint(mint(5173, 8080, None)).unwrap();
            (grant.id, g.exchange(8080, &t.token).unwrap().1)
        };
        // A restart on the same boot: the cookie still works.
        let g = Grants::open_with(d.path(), "boot-a").unwrap();
        assert!(g.admit(8080, &[&cookie]).is_ok());
        let g = Grants::open_with(d.path(), "boot-b").unwrap();
        assert_eq!(
            g.admit(8080, &[&cookie]),
            Err(Denied::Suspended { port: 5173 })
        );
        assert!(g.list()[0].suspended);
        let (again, _) = g.mint(mint(5173, 8080, None)).unwrap();
        assert_eq!(again.id, id);
        assert!(!again.suspended);
        assert!(g.admit(8080, &[&cookie]).is_ok());
        // A token tried while its grant is suspended is not used up by the 503.
        let (_, spare) = g.mint(mint(5173, 8080, None)).unwrap();
        let g = Grants::open_with(d.path(), "boot-c").unwrap();
        assert_eq!(
            g.exchange(8080, &spare.token).err(),
            Some(Denied::Suspended { port: 5173 })
        );
        g.mint(mint(5173, 8080, None)).unwrap();
        assert!(g.exchange(8080, &spare.token).is_ok());
    }

    #[test]
    fn a_change_by_another_process_is_seen() {
        let d = tempfile::tempdir().unwrap();
        let serve = Grants::open_with(d.path(), "b").unwrap();
        let (grant, t) = serve.mint(mint(1, 2, None)).unwrap();
        let cookie = serve.exchange(2, &t.token).unwrap().1;
        let cli = Grants::open_with(d.path(), "b").unwrap();
        cli.revoke(&grant.id).unwrap();
        assert!(serve.refresh(Duration::ZERO).is_empty());
        assert!(serve.admit(2, &[&cookie]).is_err());
    }

    #[test]
    fn bypassable_is_beyond_loopback_or_where_the_provider_reexposes_it() {
        let at = |address: &str| crate::os::ports::Listener {
            port: 5173,
            address: address.into(),
            pid: None,
            job_id: None,
        };
        for (addr, plain, e2b) in [
            ("127.0.0.1", false, true),
            ("::1", false, true),
            ("127.0.0.2", false, false),
            ("0.0.0.0", true, true),
            ("::", true, true),
            ("10.1.2.3", true, true),
        ] {
            assert_eq!(bypassable_with(5173, &[at(addr)], false), plain, "{addr}");
            assert_eq!(
                bypassable_with(5173, &[at(addr)], true),
                e2b,
                "{addr} on E2B"
            );
            assert!(!bypassable_with(5174, &[at(addr)], true));
        }
    }

    #[test]
    fn mints_are_checked() {
        let d = tempfile::tempdir().unwrap();
        let g = Grants::open_with(d.path(), "b").unwrap();
        assert!(matches!(g.mint(mint(1, 1, None)), Err(Error::Invalid(_))));
        let mut m = mint(1, 2, None);
        m.ttl_seconds = 0;
        assert!(matches!(g.mint(m), Err(Error::Invalid(_))));
        g.mint(mint(1, 2, None)).unwrap();
        assert!(matches!(g.mint(mint(3, 2, None)), Err(Error::Conflict(_))));
        assert!(matches!(g.mint(mint(1, 4, None)), Err(Error::Conflict(_))));
        assert!(matches!(
            g.token("pv_aaaaaaaaaaaaaaaaaaaaaaaaaa"),
            Err(Error::NotFound(_))
        ));
    }
}
