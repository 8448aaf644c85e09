//! What several commands print: JSON, short durations, the job table.

use std::time::{Duration, SystemTime};

use crate::state::store::Listed;

pub fn print_json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

pub fn listed_json(l: &Listed) -> serde_json::Value {
    match l {
        Listed::Job(r) => serde_json::to_value(r.as_ref()).unwrap_or_default(),
        Listed::Corrupt { id, error } => {
            serde_json::json!({"id": id, "corrupt": true, "error": error})
        }
    }
}

fn since(ts: Option<&str>, until: SystemTime) -> Option<Duration> {
    until.duration_since(crate::text::timefmt::parse(ts?)?).ok()
}

/// A short human duration: `850ms`, `12s`, `5m`, `3h`, `2d`.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        1..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

pub fn print_table(list: &[Listed]) {
    let now = SystemTime::now();
    println!(
        "{:<24}  {:<9}  {:>5}  {:>8}  {:>7}  COMMAND",
        "ID", "STATUS", "AGE", "DURATION", "EXIT"
    );
    for l in list {
        match l {
            Listed::Job(r) => {
                let end = r
                    .ended_at
                    .as_deref()
                    .and_then(crate::text::timefmt::parse)
                    .unwrap_or(now);
                let dur = since(r.started_at.as_deref(), end)
                    .map(human)
                    .unwrap_or_else(|| "-".into());
                let age = since(Some(&r.created_at), now)
                    .map(human)
                    .unwrap_or_else(|| "-".into());
                let exit = match (&r.exit_code, &r.signal) {
                    (Some(c), _) => c.to_string(),
                    (None, Some(s)) => s.clone(),
                    _ => "-".into(),
                };
                let cmd: String = r
                    .command
                    .chars()
                    .map(|c| if c.is_control() { ' ' } else { c })
                    .take(60)
                    .collect();
                println!(
                    "{:<24}  {:<9}  {:>5}  {:>8}  {:>7}  {cmd}",
                    r.id,
                    r.status.as_str(),
                    age,
                    dur,
                    exit
                );
            }
            Listed::Corrupt { id, error } => println!("{id:<24}  {:<9}  {error}", "corrupt"),
        }
    }
}
