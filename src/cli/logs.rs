//! `logs`: prints a job's stored output, and with `--follow` what comes until it ends.

use std::sync::atomic::AtomicBool;

use super::follow::{Waiter, follow_output};
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
    crate::job::settle::load(&store, &id)?;
    let mut off = a.offset;
    let stop = AtomicBool::new(false);
    let mut waiter = Waiter::files(&store, &id);
    follow_output(&store, &id, &mut off, a.follow, None, &stop, &mut waiter)?;
    Ok(0)
}
