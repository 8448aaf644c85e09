//! The command line for the person debugging inside the sandbox: `exec`, `attach`,
//! `status`, `logs`, `cancel`, `prune` and `events`, one file each (the binary's main adds
//! `serve` and the internal `supervise`). Local commands read and write the same state root
//! as the server.
//!
//! - [`follow`]: waiting on a job, and streaming its output as it comes
//! - [`print`]: what several commands print: JSON, durations, the job table

mod attach;
mod cancel;
mod events;
mod exec;
mod exit;
mod follow;
mod logs;
mod previews;
mod print;
mod prune;
mod session;
mod status;

use clap::Subcommand;

use crate::model::error::Result;
use crate::state::store::Store;

pub use exit::exit_status;
pub use print::{diagnostic, human};

/// The end of every command's help: where the state is.
pub const ENVIRONMENT: &str = "\
Environment:
  GITTERM_HOME  The state root: jobs, their output, the server's token (default: $HOME/.gitterm)";

/// The exit statuses of every command but `exec` (which lists its own).
const EXIT_STATUSES: &str = "\
Exit status (exec: see exec --help):
  0    Done
  1    Refused: no such job, or it conflicts with the state
  2    A usage error or bad input
  125  The agent itself failed (I/O, spawn)";

/// The end of the top-level help: exit statuses and the environment.
pub fn after_help() -> String {
    format!("{EXIT_STATUSES}\n\n{ENVIRONMENT}")
}

/// The local commands. Each one's flags are built only when it runs (`defer`): building
/// every command's arguments and help up front cost `exec` some 100 us of its start.
#[derive(Subcommand)]
#[command(defer = true)]
// Parsed once per run: boxing exec's flags would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum Cmd {
    /// Run a shell command as a job; stream its output and exit with its status
    #[command(after_help = exec::after_help())]
    Exec(exec::Args),
    /// Attach this terminal to a terminal job (Ctrl-] then d detaches; the job runs on)
    #[command(after_help = ENVIRONMENT)]
    Attach(attach::Args),
    /// List jobs, or show one job's record and output tail
    #[command(after_help = ENVIRONMENT)]
    Status(status::Args),
    /// Print a job's stored output
    #[command(after_help = ENVIRONMENT)]
    Logs(logs::Args),
    /// Cancel a job: TERM, then KILL after the grace period, to all its processes
    #[command(after_help = ENVIRONMENT)]
    Cancel(cancel::Args),
    /// Remove ended jobs past the retention limits
    #[command(after_help = ENVIRONMENT)]
    Prune(prune::Args),
    /// Print the journal of job events (started, ended, lost); --follow waits for more
    #[command(after_help = ENVIRONMENT)]
    Events(events::Args),
    /// List preview grants; `previews revoke ID` takes one away
    #[command(after_help = ENVIRONMENT)]
    Previews(previews::Args),
    /// Make, list or remove sessions: a folder and variables that carry between commands
    #[command(after_help = ENVIRONMENT)]
    Session(session::Args),
}

/// Runs one local command; `Err` is reported by the caller.
pub fn main(cmd: Cmd) -> Result<i32> {
    if matches!(
        cmd,
        Cmd::Status(_) | Cmd::Logs(_) | Cmd::Prune(_) | Cmd::Events(_) | Cmd::Previews(_)
    ) {
        // `status | head` should end quietly, as other Unix tools do, not panic in
        // println!. (`exec` keeps SIGPIPE ignored: a closed reader cancels its job.)
        crate::os::spawn::default_sigpipe();
    }
    match cmd {
        Cmd::Exec(a) => exec::run(a),
        Cmd::Attach(a) => attach::run(a),
        Cmd::Status(a) => status::run(a),
        Cmd::Logs(a) => logs::run(a),
        Cmd::Cancel(a) => cancel::run(a),
        Cmd::Prune(a) => prune::run(a),
        Cmd::Events(a) => events::run(a),
        Cmd::Previews(a) => previews::run(a),
        Cmd::Session(a) => session::run(a),
    }
}

/// The store at the state root (`$GITTERM_HOME`, else `$HOME/.gitterm`).
fn open_store() -> Result<Store> {
    Store::open(&crate::state::layout::default_root())
}
