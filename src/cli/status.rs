//! `status`: the job table, or one job's record and output tail.

use super::print::{listed_json, print_json, print_table};
use crate::model::error::Result;
use crate::model::{JobRecord, Status};
use crate::state::store::Store;

/// Flags of `status`.
#[derive(clap::Args)]
pub struct Args {
    /// The job to show (as `exec` prints it); without it, list all jobs, newest first
    id: Option<String>,
    /// Print JSON: the job record with its output tail, or {"jobs": [...]}
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<i32> {
    let store = super::open_store()?;
    match a.id {
        Some(id) => {
            let id = Store::parse_id(&id)?;
            let rec = crate::job::settle::load(&store, &id)?;
            if a.json {
                print_json(&store.view(&rec));
            } else {
                print_record(&store, &rec);
            }
        }
        None => {
            let list = crate::job::settle::list(&store);
            if a.json {
                print_json(
                    &serde_json::json!({"jobs": list.iter().map(listed_json).collect::<Vec<_>>()}),
                );
            } else {
                print_table(&list);
            }
        }
    }
    Ok(0)
}

fn print_record(store: &Store, rec: &JobRecord) {
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    println!("id:        {}", rec.id);
    println!("status:    {}", rec.status.as_str());
    if let Some(r) = &rec.reason {
        println!("reason:    {r}");
    }
    println!("command:   {}", rec.command);
    println!("cwd:       {}", rec.cwd);
    println!(
        "exit:      {}",
        rec.exit_code
            .map(|c| c.to_string())
            .or(rec.signal.clone())
            .unwrap_or_else(|| "-".into())
    );
    println!("created:   {}", rec.created_at);
    println!("started:   {}", opt(&rec.started_at));
    println!("ended:     {}", opt(&rec.ended_at));
    println!("timeout:   {} s", rec.timeout_seconds);
    println!(
        "pid/pgid:  {}/{}",
        rec.pid.map_or("-".into(), |p| p.to_string()),
        rec.pgid.map_or("-".into(), |p| p.to_string())
    );
    let id = Some(rec.id.clone());
    let bytes = if rec.status == Status::Running {
        store.output_size(&rec.id)
    } else {
        rec.output_bytes
    };
    println!(
        "output:    {bytes} bytes{}",
        if rec.output_truncated {
            " (truncated)"
        } else {
            ""
        }
    );
    if let Some(id) = id {
        let tail = store.tail(&id);
        if !tail.is_empty() {
            println!("--- output tail ---");
            print!("{tail}");
            if !tail.ends_with('\n') {
                println!();
            }
        }
    }
}
