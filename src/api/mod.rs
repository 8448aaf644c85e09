//! The HTTP/JSON control endpoint (`gitterm-agent serve`).
//!
//! - [`http`]: the HTTP/1.1 layer (std threads, every client-controlled size and wait
//!   bounded); it knows nothing of routes or JSON.
//! - [`auth`]: tokens; [`request`]: pure parsing of queries and bodies; [`watch`]: one
//!   shared inotify instance for long-polls.

pub mod auth;
pub mod http;
pub mod request;
pub mod watch;

use crate::error::{Error, Result};

/// Flags of `serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// ADDR:PORT or unix:/path
    #[arg(long, default_value = "127.0.0.1:7433")]
    pub listen: String,
    #[command(flatten)]
    pub limits: crate::cli::LimitArgs,
}

/// Runs the server until SIGTERM/SIGINT.
pub fn serve_main(_args: ServeArgs) -> Result<i32> {
    Err(Error::Internal("serve is not built yet".into()))
}
