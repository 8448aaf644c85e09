//! The HTTP/JSON control endpoint (`gitterm-agent serve`).
//!
//! - [`http`]: the HTTP/1.1 layer (std threads, every client-controlled size and wait
//!   bounded); it knows nothing of routes or JSON.
//! - [`routes`]: every route as one [`Route`] enum (method, template, scope, handler).
//! - [`app`]: admission (auth, routing, scope, query), dispatch, error answers and the
//!   request log; [`handlers`]: one file per resource.
//! - [`auth`]: tokens and tickets; [`cors`]: what pages of other origins may call;
//!   [`request`]: pure parsing of queries and bodies; [`watch`]: one
//!   shared inotify instance for long-polls.
//!
//! The server keeps no state beyond the store: each job has its own supervisor process, so
//! stopping or killing the server never touches a running job, and a restart is a rescan.

pub mod app;
pub mod auth;
pub mod cors;
pub mod feed;
pub mod handlers;

pub mod request;
pub mod routes;
pub mod watch;

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::http;
use crate::model::error::{Error, Result};
use crate::model::limits::Seconds;
use crate::state::store::Store;

pub use routes::{ROUTES, Route, Scope};

/// The default `--listen`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7433";

/// Flags of `serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// ADDR:PORT (port 0 picks a free one; the first log line names it) or unix:/path
    #[arg(long, default_value = DEFAULT_LISTEN, value_name = "ADDR:PORT|unix:PATH")]
    pub listen: String,
    /// A 0600 file holding the bearer token (default: <root>/agent.token, generated once)
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// A 0600 file holding a second token that may only read the sandbox, start and read
    /// jobs, and read or set the env
    #[arg(long, value_name = "FILE")]
    pub scoped_token_file: Option<PathBuf>,
    /// Largest request body accepted
    #[arg(long, value_name = "BYTES", default_value = "8388608")]
    pub max_body: u64,
    /// Most client connections open at once; at most half of them may wait (long-polls,
    /// starts that wait, previews), and idle ones give way to new ones
    #[arg(long, value_name = "N", default_value = "1024")]
    pub max_connections: usize,
    /// Seconds a client may take to send a request's headers (a new connection's first
    /// request: from the connect, so a silent connection is closed after it)
    #[arg(long, value_name = "S", default_value = "10")]
    pub header_timeout: Seconds,
    /// Seconds a client may take to send a request's body
    #[arg(long, value_name = "S", default_value = "60")]
    pub body_timeout: Seconds,
    #[command(flatten)]
    pub limits: crate::model::limits::LimitArgs,
    /// Largest file `PUT /v1/files/content` writes (the body is streamed, never held)
    #[arg(long, value_name = "BYTES", default_value = "4294967296")]
    pub max_file_bytes: u64,
    /// Keep at most this many ended jobs (pruned at start and every 10 minutes)
    #[arg(long, value_name = "N", default_value = "1000")]
    pub keep_jobs: usize,
    /// Prune ended jobs older than this many days
    #[arg(long, value_name = "D", default_value = "7")]
    pub keep_days: f64,
    /// A browser origin (`https://host[:port]`) whose pages may use tickets (a terminal
    /// WebSocket, an event stream, a followed log) and get CORS grants on those routes;
    /// repeatable. Without it, a ticket is refused when the request carries an `Origin`
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    pub allowed_origins: Vec<String>,
    /// Keep at least this many job events in the journal; older whole segments (1 MiB)
    /// beyond them, or older than --keep-days, are compacted away (start, every 10 minutes)
    #[arg(long, value_name = "N", default_value = "100000")]
    pub keep_events: usize,
}

/// Settles every record at start (a resumed sandbox's `running` jobs become `lost` at
/// once, not on first read), then prunes ended jobs now and every ten minutes.
fn start_housekeeping(store: Store, keep_jobs: usize, keep_events: usize, keep_for: Duration) {
    // Every second: a job that stopped its supervisor while nobody reads it still ends at
    // its timeout (the supervisor is continued and finds the deadline passed); and what
    // the allocator holds free after a burst of requests goes back to the kernel.
    let watched = store.clone();
    let _ = std::thread::Builder::new()
        .name("watchdog".into())
        .stack_size(256 << 10)
        .spawn(move || {
            loop {
                let n = crate::job::settle::nudge_running(&watched);
                if n > 0 {
                    log(serde_json::json!({"event": "continued", "supervisors": n}));
                }
                crate::os::alloc::trim();
                std::thread::sleep(Duration::from_secs(1));
            }
        });
    let _ = std::thread::Builder::new()
        .name("housekeeping".into())
        .stack_size(256 << 10)
        .spawn(move || {
            let settled = crate::job::settle::list(&store).len();
            log(serde_json::json!({"event": "rescan", "jobs": settled}));
            loop {
                let journal = crate::state::events::Journal::open(store.root());
                let compacted = journal.compact(keep_events, keep_for);
                if compacted > 0 {
                    log(serde_json::json!({"event": "compact", "segments": compacted}));
                }
                let removed = crate::job::settle::prune(&store, keep_jobs, keep_for);
                if !removed.is_empty() {
                    log(serde_json::json!({"event": "prune", "removed": removed.len()}));
                }
                std::thread::sleep(Duration::from_secs(600));
            }
        });
}

/// Runs the server until SIGTERM/SIGINT.
pub fn serve_main(args: ServeArgs) -> Result<i32> {
    // First, while this process has one thread: supervisors are then forks of a small
    // process instead of an exec of this binary each.
    crate::job::launch::use_fork_server()?;
    let cfg = args.limits.config();
    if args.max_connections == 0 {
        return Err(Error::Invalid(
            "--max-connections must be at least 1".into(),
        ));
    }
    let head_timeout = args.header_timeout.duration();
    let body_timeout = args.body_timeout.duration();
    let store = Store::open(&crate::state::layout::default_root())?;
    let tokens = auth::Tokens::load(
        store.root(),
        args.token_file.as_deref(),
        args.scoped_token_file.as_deref(),
    )?;
    if !args.keep_days.is_finite() || args.keep_days < 0.0 {
        return Err(Error::Invalid(format!(
            "--keep-days must be 0 or more, got {}",
            args.keep_days
        )));
    }
    let origins = cors::Origins::parse(&args.allowed_origins)?;
    let sandbox = crate::state::sandbox::record_start(store.root())?;
    let listener = bind(&args.listen)?;

    let (stop_rx, stop_tx) =
        UnixStream::pair().map_err(|e| Error::io("creating the signal pipe", e))?;
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let tx = stop_tx
            .try_clone()
            .map_err(|e| Error::io("creating the signal pipe", e))?;
        signal_hook::low_level::pipe::register(sig, tx)
            .map_err(|e| Error::io("installing signal handlers", e))?;
    }
    if std::process::id() == 1 {
        start_reaper();
    }

    let isolation = crate::job::launch::isolation(&cfg)?;
    let max_connections = within_fd_limit(args.max_connections);
    let max_waiting = (max_connections / 2).max(1);
    let mut listening = serde_json::json!({
        "event": "listening",
        "address": listener.describe(),
        "version": crate::VERSION,
        "pid": std::process::id(),
        "resumed": sandbox.resumed,
        "maxConnections": max_connections,
        "maxWaiting": max_waiting,
        "isolation": isolation,
    });
    let mut warnings = Vec::new();
    if nix::unistd::geteuid().is_root() && isolation == "none" {
        warnings.push(
            "running as root without --job-user: jobs run as root and can tamper with \
             their supervision (stop or kill it, read the token and other jobs' secrets)",
        );
    }
    if let http::Listener::Tcp(l) = &listener
        && l.local_addr().is_ok_and(|a| !a.ip().is_loopback())
    {
        warnings.push("listening beyond loopback: plain HTTP, the token is the only guard");
    }
    if !warnings.is_empty() {
        listening["warning"] = warnings.join("; ").into();
    }
    log(listening);
    let swept = handlers::files::sweep_at_start(&cfg);
    if swept > 0 {
        log(serde_json::json!({"event": "swept", "uploads": swept}));
    }
    start_housekeeping(
        store.clone(),
        args.keep_jobs,
        args.keep_events,
        Duration::from_secs_f64(args.keep_days * 86_400.0),
    );
    // A handler's panic becomes a 500 for its request; its message goes to the log as
    // one JSON line like everything else.
    std::panic::set_hook(Box::new(|info| {
        log(serde_json::json!({"event": "panic", "error": info.to_string()}));
    }));
    let hub = watch::Hub::start();
    let app = Arc::new(
        app::App::new(store, cfg, tokens, sandbox, Arc::clone(&hub))
            .with_max_waiting(max_waiting)
            .with_allowed_origins(origins)
            .with_max_file_bytes(args.max_file_bytes)
            .with_max_body(args.max_body),
    );
    let limits = http::Limits {
        max_body: args.max_body,
        max_connections,
        head_timeout,
        body_timeout,
        ..Default::default()
    };
    let state = Arc::new(http::State::default());
    // Long-polls answer at once when the stop begins, so the grace is for short requests.
    let on_stop = {
        let hub = Arc::clone(&hub);
        move || hub.stop()
    };
    let result = http::run(
        listener,
        limits,
        app,
        Arc::clone(&state),
        stop_rx.as_fd(),
        Duration::from_secs(3),
        on_stop,
    );
    log(serde_json::json!({"event": "stopped"}));
    result.map_err(|e| Error::io("serving", e))?;
    Ok(0)
}

/// Lowers the connection cap to what the open-file limit allows (one fd per connection,
/// with room left for starting jobs), so the cap answers 429 before accept() fails. The
/// limit itself is not raised: jobs inherit it, and some programs dislike a huge one.
fn within_fd_limit(want: usize) -> usize {
    use nix::sys::resource::{Resource, getrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, _)) => want.min((soft as usize).saturating_sub(128).max(16)),
        Err(_) => want,
    }
}

/// Writes one JSON line to stderr; a closed stderr is no reason to fail.
fn log(v: serde_json::Value) {
    // One write per line (stderr is unbuffered): lines from many threads never interleave,
    // and a request costs one syscall for its log line, not one per token.
    let mut line = v.to_string();
    line.push('\n');
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Binds `--listen`: `ADDR:PORT` or `unix:/path` (a 0600 socket file).
pub fn bind(listen: &str) -> Result<http::Listener> {
    if let Some(path) = listen.strip_prefix("unix:") {
        return bind_unix(Path::new(path)).map(|l| http::Listener::Unix(l, path.into()));
    }
    let addrs: Vec<std::net::SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(listen)
        .map_err(|e| {
            Error::Invalid(format!(
                "--listen {listen:?}: expected ADDR:PORT (e.g. {DEFAULT_LISTEN}) or unix:/path ({e})"
            ))
        })?
        .collect();
    let l = std::net::TcpListener::bind(&addrs[..])
        .map_err(|e| Error::io(format!("cannot listen on {listen}"), e))?;
    Ok(http::Listener::Tcp(l))
}

fn bind_unix(path: &Path) -> Result<UnixListener> {
    if path.as_os_str().is_empty() {
        return Err(Error::Invalid("--listen unix: needs a path".into()));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            // A socket left by a server that was killed: reuse the path, unless a server
            // still answers there.
            if UnixStream::connect(path).is_ok() {
                return Err(Error::Internal(format!(
                    "cannot listen on unix:{}: another server is answering there",
                    path.display()
                )));
            }
            std::fs::remove_file(path).map_err(|e| {
                Error::io(format!("removing the stale socket {}", path.display()), e)
            })?;
        }
        Ok(_) => {
            return Err(Error::Invalid(format!(
                "--listen unix:{}: the path exists and is not a socket; refusing to replace it",
                path.display()
            )));
        }
        Err(_) => {}
    }
    // The socket file is created 0600 from the start (not chmod-ed after, which would leave
    // a moment where anyone may connect). Still single-threaded here, so the process-wide
    // umask change affects nothing else.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let l = bound.map_err(|e| Error::io(format!("cannot listen on unix:{}", path.display()), e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::io(format!("chmod 0600 {}", path.display()), e))?;
    Ok(l)
}

/// As PID 1 (a container's init), orphans are re-parented to us and must be reaped, or
/// they stay zombies. The launcher tolerates this reaper taking its intermediate child's
/// status.
fn start_reaper() {
    use nix::sys::wait::{WaitPidFlag, waitpid};
    let _ = std::thread::Builder::new()
        .name("reaper".into())
        .stack_size(64 << 10)
        .spawn(|| {
            loop {
                match waitpid(nix::unistd::Pid::from_raw(-1), Some(WaitPidFlag::__WALL)) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    // No children right now: look again shortly.
                    Err(_) => std::thread::sleep(Duration::from_millis(200)),
                }
            }
        });
}
