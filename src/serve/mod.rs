//! `gitterm-agent serve`: its flags, the state it opens, the listeners it binds and the
//! housekeeping it runs, and then one HTTP server per listener (the control endpoint of
//! [`crate::api`]; the preview gate's listeners join them), all stopped by one signal.
//!
//! This is the composition of the front ends that share a process: it is the one module
//! that may import more than one of them.

mod bind;
mod housekeeping;

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::api::{app, auth, handlers, log, waits};
use crate::http;
use crate::model::error::{Error, Result};
use crate::model::limits::Seconds;
use crate::state::store::Store;

pub use bind::bind;
use housekeeping::{start_housekeeping, start_reaper, within_fd_limit};

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
    /// The address the preview gate's listeners bind (each grant's gatePort on it)
    #[arg(long, value_name = "ADDR", default_value = crate::gate::DEFAULT_ADDRESS)]
    pub preview_address: std::net::IpAddr,
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
    let origins = http::auth::Origins::parse(&args.allowed_origins, "--allowed-origin")?;
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
    // Before the first line, so that a client who saw it finds them gone (the journal
    // names each one: no tree is walked).
    let unpacks = handlers::archive::sweep_at_start(&cfg, store.root());
    log(listening);
    let swept = handlers::files::sweep_at_start(&cfg);
    if swept > 0 {
        log(serde_json::json!({"event": "swept", "uploads": swept}));
    }
    if unpacks > 0 {
        log(serde_json::json!({"event": "swept", "unpacks": unpacks}));
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
    let hub = waits::Hub::start();
    let grants = crate::state::grants::Grants::open(store.root())?;
    let gate = crate::gate::start(
        Arc::clone(&grants),
        crate::gate::Config {
            address: args.preview_address,
            ..Default::default()
        },
    );
    let app = Arc::new(
        app::App::new(store, cfg, tokens, sandbox, Arc::clone(&hub))
            .with_grants(grants)
            .with_max_waiting(max_waiting)
            .with_allowed_origins(origins)
            .with_max_file_bytes(args.max_file_bytes)
            .with_max_body(args.max_body),
    );
    // Watches kept from before this start: a rescan each, then watched again.
    let resumed = crate::api::handlers::watches::resume(&app);
    if resumed > 0 {
        log(serde_json::json!({"event": "watches", "resumed": resumed}));
    }
    let limits = http::Limits {
        max_body: args.max_body,
        max_connections,
        head_timeout,
        body_timeout,
        ..Default::default()
    };
    // Long-polls answer at once when the stop begins, so the grace is for short requests.
    let on_stop = {
        let hub = Arc::clone(&hub);
        move || hub.stop()
    };
    let servers = vec![
        Server::start("api", &stop_rx, move |stop| {
            let state = Arc::new(http::State::default());
            http::run(listener, limits, app, state, stop, GRACE, on_stop)
        })?,
        Server::start("gate", &stop_rx, move |stop| gate.run(stop))?,
    ];
    let mut result = Ok(());
    for server in servers {
        let (name, outcome) = server.join();
        if let Err(e) = outcome {
            log(serde_json::json!({"event": "failed", "server": name, "error": e.to_string()}));
            result = Err(Error::io(format!("serving {name}"), e));
        }
    }
    log(serde_json::json!({"event": "stopped"}));
    result.map(|()| 0)
}

/// How long requests in flight may take to finish once the stop begins.
const GRACE: Duration = Duration::from_secs(3);

/// One listener's HTTP server, on a thread of its own, until the stop signal.
struct Server {
    name: &'static str,
    thread: std::thread::JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// Runs `serve` on a new thread with its own handle on the stop pipe (every server
    /// polls it, none reads it, so one signal stops them all).
    fn start(
        name: &'static str,
        stop: &UnixStream,
        serve: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> + Send + 'static,
    ) -> Result<Server> {
        let stop = stop
            .try_clone()
            .map_err(|e| Error::io("sharing the signal pipe", e))?;
        let thread = std::thread::Builder::new()
            .name(format!("serve-{name}"))
            .spawn(move || serve(stop.as_fd()))
            .map_err(|e| Error::io(format!("starting the {name} server"), e))?;
        Ok(Server { name, thread })
    }

    /// Waits for the server's end: what it returned, or a panic as an error.
    fn join(self) -> (&'static str, std::io::Result<()>) {
        let outcome = self
            .thread
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("its thread panicked")));
        (self.name, outcome)
    }
}
