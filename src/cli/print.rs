//! What several commands print: JSON, short durations, the job table.

use std::borrow::Cow;
use std::io::Write;
use std::time::{Duration, SystemTime};

use crate::state::store::Listed;

/// Prints a line on stdout. A closed stdout is no error here: `exec` keeps SIGPIPE ignored
/// (its job must not die with the reader), and println! would panic.
pub fn print_line(line: impl std::fmt::Display) {
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// True for a character that must not reach a terminal as it is: a control character
/// (C0, DEL, C1: cursor moves, colours, titles, a terminal's answerback) or one that
/// reorders or hides text (bidirectional overrides and isolates, zero-width marks).
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200b}'..='\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{2069}'
                | '\u{feff}'
        )
}

/// A field from a record (which a job can make: its command, its cwd, or the record
/// itself when it runs as root) as it may be printed for a person: every [`hidden`]
/// character escaped (`\n`, `\t`, `\u{1b}`), everything else as it is.
pub fn shown(s: &str) -> Cow<'_, str> {
    if !s.chars().any(hidden) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if hidden(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

pub fn print_json(v: &serde_json::Value) {
    print_line(serde_json::to_string_pretty(v).unwrap_or_default());
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
    let mut notes = Vec::new();
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
                    .map(|c| if hidden(c) { ' ' } else { c })
                    .take(60)
                    .collect();
                // Listed as recorded, because this listing could not settle it: said below.
                let status = match r.extra.get(crate::state::store::UNSETTLED) {
                    Some(why) => {
                        notes.push(format!("* {}: {}", r.id, shown(why.as_str().unwrap_or(""))));
                        format!("{}*", r.status.as_str())
                    }
                    None => r.status.as_str().to_string(),
                };
                println!(
                    "{:<24}  {:<9}  {:>5}  {:>8}  {:>7}  {cmd}",
                    r.id,
                    status,
                    age,
                    dur,
                    shown(&exit)
                );
            }
            Listed::Corrupt { id, error } => {
                println!("{:<24}  {:<9}  {}", shown(id), "corrupt", shown(error))
            }
        }
    }
    for n in notes {
        println!("{n}");
    }
}

/// Prints a message for the user on stderr, in the one style of every error and notice
/// of the command line: `gitterm-agent: <message>`.
/// A message may quote what a job made (a record's reason, a cwd): it is [`shown`].
pub fn diagnostic(msg: impl std::fmt::Display) {
    eprintln!("gitterm-agent: {}", shown(&msg.to_string()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_escapes_what_would_drive_a_terminal_and_keeps_the_rest() {
        assert!(matches!(shown("ls -l /tmp/é ✓"), Cow::Borrowed(_)));
        assert_eq!(shown("a\u{1b}]0;pwned\u{7}b"), "a\\u{1b}]0;pwned\\u{7}b");
        assert_eq!(shown("x\ny\tz\r"), "x\\ny\\tz\\r");
        assert_eq!(shown("\u{9b}31m"), "\\u{9b}31m");
        assert_eq!(shown("\u{7f}"), "\\u{7f}");
        assert_eq!(shown("abc\u{202e}fed"), "abc\\u{202e}fed");
        assert_eq!(shown("a\u{200b}b\u{feff}"), "a\\u{200b}b\\u{feff}");
    }

    proptest::proptest! {
        #[test]
        fn shown_never_lets_a_hidden_character_through(s in proptest::prelude::any::<String>()) {
            let out = shown(&s);
            proptest::prop_assert!(!out.chars().any(hidden), "{:?}", out);
            // Nothing else changes: every visible character is there, in order.
            let kept: String = s.chars().filter(|&c| !hidden(c) && c != '\\').collect();
            let back: String = out.chars().filter(|&c| c != '\\').collect();
            let mut it = back.chars();
            proptest::prop_assert!(kept.chars().all(|c| it.any(|d| d == c)));
        }
    }

    #[test]
    fn human_durations_round_down_to_one_unit() {
        let cases = [
            (Duration::from_millis(850), "850ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_secs(119), "119s"),
            (Duration::from_secs(120), "2m"),
            (Duration::from_secs(7199), "119m"),
            (Duration::from_secs(7200), "2h"),
            (Duration::from_secs(172_799), "47h"),
            (Duration::from_secs(172_800), "2d"),
        ];
        for (d, want) in cases {
            assert_eq!(human(d), want, "{d:?}");
        }
    }

    #[test]
    fn since_is_none_for_a_missing_or_later_time() {
        let t = crate::text::timefmt::parse("2024-01-01T00:00:00.000Z").unwrap();
        let later = t + Duration::from_secs(90);
        assert_eq!(
            since(Some("2024-01-01T00:00:00.000Z"), later),
            Some(Duration::from_secs(90))
        );
        assert_eq!(since(None, later), None);
        assert_eq!(since(Some("not a time"), later), None);
        assert_eq!(
            since(Some("2024-01-01T00:00:00.000Z"), t - Duration::from_secs(1)),
            None
        );
    }
}
