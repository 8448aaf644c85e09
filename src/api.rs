//! The HTTP/JSON control endpoint (`serve`). (Skeleton.)

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
