//! `logs`: prints a job's stored output, and with `--follow` what comes until it ends.

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use super::follow::{Waiter, watch};
use crate::model::error::Result;
use crate::state::store::Store;

/// Flags of `logs`.
#[derive(clap::Args)]
pub struct Args {
    /// The job id (as `exec` and `status` print it)
    id: String,
    /// Start at this byte offset of the output
    #[arg(long, value_name = "BYTES", default_value = "0")]
    offset: u64,
    /// Keep printing new output until the job ends
    #[arg(long, short)]
    follow: bool,
}

pub fn run(a: Args) -> Result<i32> {
    let store = super::open_store()?;
    let id = Store::parse_id(&a.id)?;
    let mut waiter = if a.follow {
        Waiter::files(&store, &id)
    } else {
        Waiter::Files(None)
    };
    // Without --follow, the deadline is now: print what is there, then stop.
    let deadline = (!a.follow).then(Instant::now);
    let mut off = a.offset;
    watch(
        &store,
        &id,
        None,
        Some(&mut off),
        deadline,
        &AtomicBool::new(false),
        &mut waiter,
    )?;
    Ok(0)
}
