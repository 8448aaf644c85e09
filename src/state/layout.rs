//! Where everything lives under the state root: one place names every file and folder
//! under it and in a job folder (the modules that own them refer here). The files inside
//! [`SECRETS_DIR`] are [`crate::state::livesecrets`]'s own.

use std::path::PathBuf;

/// Bytes of output returned as a job's `output` tail.
pub const TAIL_BYTES: u64 = 8 * 1024;
/// The largest output page.
pub const MAX_PAGE: usize = 64 * 1024;

/// File names inside a job folder.
pub const RECORD: &str = "job.json";
pub const OUTPUT: &str = "output.log";
/// The line a running job is writing and has not ended yet, as answers show it
/// (`pending`); absent when there is none, and once the job ended.
pub const PENDING: &str = "pending";
/// Where the pending line is written before it is renamed into place.
pub const PENDING_TMP: &str = "pending.tmp";
/// The lock file of jobs started by older versions; a job's lock is now its folder
/// itself (one file fewer per start), but a supervisor of an older version may still hold
/// this one, so a reader takes it where it exists.
pub const LOCK: &str = "lock";
/// Files older versions kept in a job folder while it ran (the spec, secrets and stdin
/// now reach the supervisor as memory files); removed when such a job is settled.
pub const LEGACY: [&str; 3] = ["spec.json", "secrets.env", "stdin"];
/// Room older versions kept in a job folder for the final record.
pub const RESERVE: &str = ".reserve";
/// The final record's file, made when the job starts with room for it, so the record
/// lands even on a full disk; written and renamed over [`RECORD`] at the end. One file
/// both reserves the room and becomes the record: a start makes and frees fewer inodes.
pub const FINAL_RECORD: &str = ".job.json.final";

/// Under the root: the emptied first-record files of ended jobs, each kept to become a
/// later start's [`FINAL_RECORD`] (see `crate::state::store::Store::reserve_final`): a
/// job then frees no inode and its start makes one fewer.
pub const RECYCLED_DIR: &str = "recycled";

/// Under the root: one name per running job, so a start counts them cheaply (a hard link
/// to the job's output.log: a name without an inode of its own).
pub const RUNNING_DIR: &str = "running";
/// Under the root: the journal of job events (see `crate::state::events`).
pub const EVENTS_DIR: &str = "events";
/// Under the root: one file per idempotency key.
pub const IDEMPOTENCY_DIR: &str = "idempotency";
/// Prefix of a job folder still being assembled (renamed into place whole).
pub const STAGING_PREFIX: &str = ".new-";
/// Under the root: the generated API token (see `crate::api::auth`).
pub const TOKEN_FILE: &str = "agent.token";
/// Under the root: the stored environment variables, and the lock of their writers (see
/// `crate::state::envstore`).
pub const ENV_FILE: &str = "env.json";
/// See [`ENV_FILE`].
pub const ENV_LOCK: &str = "env.lock";
/// Under the root: the sandbox's boot id, to tell a restart (see `crate::state::sandbox`).
pub const SANDBOX_FILE: &str = "sandbox.json";
/// Under the root: the running jobs' secrets, for each other's masking (see
/// `crate::state::livesecrets`).
pub const SECRETS_DIR: &str = "secrets";

/// Under the root: one folder per session (see `crate::state::sessions`), holding
/// [`SESSION_META`] and [`SESSION_STATE`].
pub const SESSIONS_DIR: &str = "sessions";
/// A session's own record.
pub const SESSION_META: &str = "session.json";
/// What a session carries from one command to the next (variable values: never returned).
pub const SESSION_STATE: &str = "state.json";

/// In an interactive job's folder while it runs: its control socket (see
/// `crate::job::control`).
pub const CONTROL_SOCKET: &str = "control.sock";
/// An empty file beside [`CONTROL_SOCKET`], kept after the job ends: the job was
/// interactive.
pub const INTERACTIVE_MARK: &str = "interactive";
/// In a job folder: the readers' own lock, taken to settle the job (see
/// `crate::job::settle`); the supervisor's lock cannot serve, since a job process may hold
/// that one.
pub const SETTLE_LOCK: &str = ".settle.lock";

/// The state root: `$GITTERM_HOME`, else `$HOME/.gitterm`.
pub fn default_root() -> PathBuf {
    if let Some(h) = std::env::var_os("GITTERM_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".gitterm")
}
/// In a job folder: one line per signal a request sent to the job (`SIGNAL TARGET`), for
/// the final record's reason.
pub const SIGNALS: &str = "signals";
/// In a job folder: the job's standard error alone, for a job started with
/// `separateStderr` (sanitized and redacted as output.log is).
pub const STDERR: &str = "stderr.log";
