//! `status`: the job table, or one job's record and output tail.

use super::print::{listed_json, print_json, print_table, shown};
use crate::model::error::Result;
use crate::model::{JobId, JobRecord, Status};
use crate::state::layout::TAIL_BYTES;
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
            let rec = crate::job::settle::settle_and_load(&store, &id)?;
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
    // Every field is [`shown`]: the command and cwd are the caller's, and a job that runs
    // as root can write its record whole.
    let opt = |v: &Option<String>| shown(v.as_deref().unwrap_or("-")).into_owned();
    println!("id:        {}", rec.id);
    println!("status:    {}", rec.status.as_str());
    if let Some(r) = &rec.reason {
        println!("reason:    {}", shown(r));
    }
    println!("command:   {}", shown(&rec.command));
    println!("cwd:       {}", shown(&rec.cwd));
    let exit = rec
        .exit_code
        .map(|c| c.to_string())
        .or(rec.signal.clone())
        .unwrap_or_else(|| "-".into());
    println!("exit:      {}", shown(&exit));
    println!("created:   {}", shown(&rec.created_at));
    println!("started:   {}", opt(&rec.started_at));
    println!("ended:     {}", opt(&rec.ended_at));
    println!("timeout:   {} s", rec.timeout_seconds);
    println!(
        "pid/pgid:  {}/{}",
        rec.pid.map_or("-".into(), |p| p.to_string()),
        rec.pgid.map_or("-".into(), |p| p.to_string())
    );
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
    let tail = tail(store, &rec.id);
    if !tail.is_empty() {
        println!("--- output tail ---");
        print!("{tail}");
        if !tail.ends_with('\n') {
            println!();
        }
    }
}

/// The output tail `status` prints: the last [`TAIL_BYTES`] of the output, from the first
/// line that starts in them when they begin inside the output.
fn tail(store: &Store, id: &JobId) -> String {
    let size = store.output_size(id);
    if size == 0 {
        return String::new();
    }
    // Past the tail's size, one byte more: whether the tail begins a line.
    let start = size.saturating_sub(TAIL_BYTES + 1);
    let Ok(page) = store.read_page(id, start, (size - start) as usize) else {
        return String::new();
    };
    if size <= TAIL_BYTES {
        page.data
    } else {
        from_line_start(&page.data, page.offset == start).to_string()
    }
}

/// The part of a tail from the first line that starts in it. `data` is cut on character
/// boundaries; with `lead`, its first character stands just before the tail proper, read
/// only to see whether it ends a line. When no line starts in the tail (but at its very
/// end), the tail is given whole.
fn from_line_start(data: &str, lead: bool) -> &str {
    match data.find('\n') {
        Some(i) if i + 1 < data.len() => &data[i + 1..],
        _ if lead => data.char_indices().nth(1).map_or("", |(i, _)| &data[i..]),
        _ => data,
    }
}

#[cfg(test)]
mod tests {
    use super::from_line_start;

    #[test]
    fn tail_starts_at_the_first_line_start() {
        // A partial first line is left out, whether or not a lead character was read.
        assert_eq!(
            from_line_start("ial line\nnext\nlast\n", true),
            "next\nlast\n"
        );
        assert_eq!(from_line_start("ial line\nnext\n", false), "next\n");
        // The lead character ends a line: the tail begins one, and is given whole.
        assert_eq!(from_line_start("\nfirst\nlast", true), "first\nlast");
        // Without a line start inside, the tail is given as it is (without the lead).
        assert_eq!(from_line_start("xno newline", true), "no newline");
        assert_eq!(from_line_start("no newline", false), "no newline");
        assert_eq!(from_line_start("xlong line\n", true), "long line\n");
        assert_eq!(from_line_start("long line\n", false), "long line\n");
        // A lead character of several bytes is left out whole.
        assert_eq!(from_line_start("éabc", true), "abc");
        assert_eq!(from_line_start("", true), "");
        assert_eq!(from_line_start("x", true), "");
    }
}
