//! `events`: the journal of job events, read from the state root without the server.

use std::io::Write;
use std::time::Duration;

use crate::model::error::Result;
use crate::state::events::Journal;

/// Flags of `events`.
#[derive(clap::Args)]
pub struct Args {
    /// Start after this cursor (default: the oldest event kept)
    #[arg(long, value_name = "CURSOR")]
    after: Option<String>,
    /// Keep printing events as they happen, until interrupted
    #[arg(long, short = 'f')]
    follow: bool,
    /// One JSON object a line, each with its cursor
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<i32> {
    let journal = Journal::open(&crate::state::layout::default_root());
    let mut at = match a.after.as_deref() {
        Some(c) => journal.parse_cursor(c)?,
        None => journal.start(),
    };
    let mut out = std::io::stdout().lock();
    loop {
        let page = journal.read(at, 1000, None)?;
        for e in &page.events {
            let line = if a.json {
                e.to_json().to_string()
            } else {
                let ev = &e.event;
                let how = match (ev.exit_code, &ev.signal) {
                    (Some(c), _) => format!(" exit {c}"),
                    (None, Some(s)) => format!(" signal {s}"),
                    _ => String::new(),
                };
                // The journal is a file in the state root: a root job can write it.
                let f = |s: &str| super::print::shown(s).into_owned();
                format!(
                    "{} {:<11} {} {}{}",
                    f(&ev.at),
                    f(&ev.kind),
                    f(&ev.job_id),
                    f(&ev.status),
                    f(&how)
                )
            };
            if writeln!(out, "{line}").is_err() {
                return Ok(0);
            }
        }
        let _ = out.flush();
        let moved = page.next != at;
        at = page.next;
        if !moved {
            if !a.follow {
                return Ok(0);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
