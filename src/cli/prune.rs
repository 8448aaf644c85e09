//! `prune`: removes ended jobs past the retention limits.

use std::time::Duration;

use super::print::print_json;
use crate::model::error::{Error, Result};

/// Flags of `prune`.
#[derive(clap::Args)]
pub struct Args {
    /// Keep at most this many ended jobs (newest first)
    #[arg(long, value_name = "N", default_value = "1000")]
    keep_jobs: usize,
    /// Remove ended jobs older than this many days
    #[arg(long, value_name = "DAYS", default_value = "7")]
    keep_days: f64,
    /// Print the removed job ids as JSON: {"removed": [...]}
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<i32> {
    let store = super::open_store()?;
    if !a.keep_days.is_finite() || a.keep_days < 0.0 {
        return Err(Error::Invalid(format!(
            "--keep-days must be 0 or more, got {}",
            a.keep_days
        )));
    }
    let removed = crate::job::settle::prune(
        &store,
        a.keep_jobs,
        Duration::from_secs_f64(a.keep_days * 86_400.0),
    );
    if a.json {
        print_json(&serde_json::json!({"removed": removed}));
    } else if removed.is_empty() {
        println!("nothing to prune");
    } else {
        for r in &removed {
            println!("removed {r}");
        }
        println!("{} jobs removed", removed.len());
    }
    Ok(0)
}
