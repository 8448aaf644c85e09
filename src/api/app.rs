//! The server's state: the store, limits, tokens and tickets, and what requests share
//! (the places of those that wait, the events feed, the inotify hub).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::answer::Failure;
use super::auth::{Access, Tokens};
use super::waits::Hub;
use crate::http::auth::{Origins, Tickets};
use crate::model::error::Error;
use crate::model::spec::Config;
use crate::state::envstore::EnvStore;
use crate::state::sandbox::SandboxStart;
use crate::state::store::Store;

/// The default `serve --max-file-bytes`: 4 GiB.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 4 << 30;

/// The server's handler: the store, limits and tokens.
pub struct App {
    pub(super) store: Store,
    pub(super) cfg: Config,
    pub(super) tokens: Tokens,
    pub(super) sandbox: SandboxStart,
    pub(super) hub: Arc<Hub>,
    /// The events journal as the server follows it, and the counters of the metrics.
    pub(super) feed: Arc<super::journal::Feed>,
    /// Requests waiting now (see [`App::wait_slot`]); event streams count too.
    waiting: Arc<AtomicUsize>,
    /// The most that may wait at once.
    max_waiting: usize,
    /// Tickets not used yet (see [`App::issue_ticket`]).
    pub(super) tickets: Tickets<Access>,
    /// Browser origins whose pages may use a ticket and get CORS grants (`--allowed-origin`).
    pub(super) allowed_origins: Origins,
    /// The largest file an upload may write.
    pub(super) max_file_bytes: u64,
    /// The largest request body (`--max-body`), for a body this handler streams itself.
    pub(super) max_body: u64,
    /// The preview grants, shared with the gate.
    pub(super) grants: Option<Arc<crate::state::grants::Grants>>,
    /// The file watches and their journals.
    pub(super) watches: Arc<crate::state::watches::Watches>,
}

/// A request's place among those that wait; given back on drop. It owns its share of the
/// count, so a streamed answer (a followed log) can hold it after its handler returned.
pub struct WaitSlot(Arc<AtomicUsize>);

impl Drop for WaitSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl App {
    /// A handler over `store`.
    pub fn new(
        store: Store,
        cfg: Config,
        tokens: Tokens,
        sandbox: SandboxStart,
        hub: Arc<Hub>,
    ) -> App {
        let feed = super::journal::Feed::start(store.root());
        let store_root = &store.root().to_path_buf();
        App {
            feed,
            store,
            cfg,
            tokens,
            sandbox,
            hub,
            waiting: Arc::new(AtomicUsize::new(0)),
            max_waiting: usize::MAX,
            tickets: Tickets::default(),
            allowed_origins: Origins::default(),
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            max_body: crate::http::Limits::default().max_body,
            grants: None,
            watches: crate::state::watches::Watches::open(store_root),
        }
    }

    /// The browser origins whose pages may use tickets and get CORS grants.
    pub fn with_allowed_origins(mut self, origins: Origins) -> App {
        self.allowed_origins = origins;
        self
    }

    /// A new ticket that opens `path` once, with no more access than the caller's own
    /// (a scoped token's ticket is scoped), and when it expires.
    pub(super) fn issue_ticket(
        &self,
        path: String,
        scoped: bool,
    ) -> std::result::Result<(String, std::time::SystemTime), Failure> {
        let access = if scoped { Access::Scoped } else { Access::Full };
        let now = std::time::Instant::now();
        let (value, expires) = self.tickets.issue(path, access, now)?;
        Ok((value, std::time::SystemTime::now() + (expires - now)))
    }

    /// Caps the size of files written through `PUT /v1/files/content`.
    pub fn with_max_file_bytes(mut self, n: u64) -> App {
        self.max_file_bytes = n;
        self
    }

    /// The preview grants this server mints, lists and revokes (shared with the gate).
    pub fn with_grants(mut self, grants: Arc<crate::state::grants::Grants>) -> App {
        self.grants = Some(grants);
        self
    }

    /// Caps request bodies the handlers stream (a job's stdin) as the server caps others.
    pub fn with_max_body(mut self, n: u64) -> App {
        self.max_body = n;
        self
    }

    /// Caps the requests that wait at once: long-polls, starts that wait for their job,
    /// previews (see `App::wait_slot`).
    pub fn with_max_waiting(mut self, n: usize) -> App {
        self.max_waiting = n.max(1);
        self
    }

    /// A place for a request about to wait: a long-poll (`waitSeconds` on a job or its
    /// output), a followed log, a start that waits for its job's end, a preview. Each
    /// holds a connection for as long as it waits, so their number is capped below the
    /// connection cap, and short requests always find room. Over the cap: 429
    /// `rate_limited`, and the connection closes so that its place is free at once.
    pub(super) fn wait_slot(&self, retry: &str) -> std::result::Result<WaitSlot, Failure> {
        let taken = self
            .waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.max_waiting).then_some(n + 1)
            });
        match taken {
            Ok(_) => Ok(WaitSlot(Arc::clone(&self.waiting))),
            Err(_) => {
                let mut f = Failure::from(Error::RateLimited(format!(
                    "{} requests are waiting already, the most at once; retry shortly, or {retry}",
                    self.max_waiting
                )));
                f.close = true;
                Err(f)
            }
        }
    }

    /// The persisted env.
    pub(super) fn env(&self) -> EnvStore {
        EnvStore::open(self.store.root())
    }
}
