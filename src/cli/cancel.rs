//! `cancel`: ends a job (TERM, then KILL after its grace period) and prints its record.

use std::time::Duration;

use super::print::{print_json, print_line};
use crate::job::launch;
use crate::model::error::Result;
use crate::state::store::Store;

/// Flags of `cancel`.
#[derive(clap::Args)]
pub struct Args {
    /// The job id (as `exec` and `status` print it)
    id: String,
    /// Print the job's final record (with its output tail) as JSON
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<i32> {
    let store = super::open_store()?;
    let id = Store::parse_id(&a.id)?;
    let rec = launch::cancel(&store, &id, Duration::from_secs(30))?;
    if a.json {
        print_json(&store.view(&rec));
    } else {
        print_line(format_args!("{} {}", rec.id, rec.status.as_str()));
    }
    Ok(0)
}
