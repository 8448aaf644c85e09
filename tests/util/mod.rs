//! The one harness of the integration tests.
//!
//! - [`Sandbox`]: a test's private world (state root, working folder, scratch files) and its
//!   cleanup guard. On drop it lets the agent end what still runs (`cancel`, then a listing
//!   that settles jobs whose supervisor is gone), and then fails the test if any process of
//!   its own is left: one carrying the marker of one of its jobs, or naming its folder in
//!   its command line or environment. Those are killed, and named in the failure.
//! - [`Server`]: a real `serve` on an ephemeral port inside a sandbox, and [`Client`], a raw
//!   HTTP/1.1 client whose every JSON answer is checked against `docs/openapi.json`.
//! - [`TestUser`]: a user made for one test (jobs that run as someone else), removed with
//!   its home afterwards; its drop fails the test if any process of the user is left.
//! - [`record`] / [`plant`]: job records written straight into a state root.
//! - [`skip`] / [`skip_root`]: the one way a test that cannot run here says so (a
//!   `SKIPPED` line the runner shows, counted by `scripts/test.sh`; under
//!   `GITTERM_REQUIRE_ALL=1` a root-only skip fails).
//! - [`eventually`]: the one way to wait for something. Tests poll, never sleep for a
//!   condition, and no assertion is on a tighter timing than [`PROMPT`] unless it says why.
#![allow(dead_code, unused_imports)]

pub mod http;
pub mod procs;
pub mod records;
pub mod sandbox;
pub mod schema;
pub mod server;
pub mod skip;
pub mod users;

use std::time::{Duration, Instant};

pub use http::{Client, Resp};
pub use procs::*;
pub use records::{plant, record};
pub use sandbox::{Out, Sandbox};
pub use serde_json::{Value, json};
pub use server::Server;
pub use skip::{skip, skip_root};
pub use users::{TestUser, is_root, uid_processes};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_gitterm-agent");

/// A generous bound for anything that should happen "promptly": the machine is shared and
/// noisy, so tests wait this long and stop as soon as the condition holds.
pub const PROMPT: Duration = Duration::from_secs(15);

/// A bound for slow things (many connections, long polls under load).
pub const LONG: Duration = Duration::from_secs(60);

/// How long any one CLI invocation may take before the test gives up on it.
pub const CLI_DEADLINE: Duration = Duration::from_secs(60);

/// Polls `f` every 10 ms until it returns `Some`, and returns that; panics naming `what`
/// once `within` has passed.
pub fn eventually<T>(within: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    poll(within, what, Some(Duration::from_millis(10)), || {
        f().ok_or(None::<()>)
    })
}

/// [`eventually`] for a condition that can say what it saw instead (`Err`): the last of
/// those is in the failure.
pub fn eventually_ok<T, E: std::fmt::Debug>(
    within: Duration,
    what: &str,
    mut f: impl FnMut() -> Result<T, E>,
) -> T {
    poll(within, what, Some(Duration::from_millis(10)), || {
        f().map_err(Some)
    })
}

/// [`eventually`] without the pause between tries, to catch narrow windows.
pub fn eventually_spinning<T>(within: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    poll(within, what, None, || f().ok_or(None::<()>))
}

/// The one polling loop: tries `f` until it gives `Ok`, for at most `within`.
fn poll<T, E: std::fmt::Debug>(
    within: Duration,
    what: &str,
    pause: Option<Duration>,
    mut f: impl FnMut() -> Result<T, Option<E>>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        let last = match f() {
            Ok(v) => return v,
            Err(last) => last,
        };
        if Instant::now() >= deadline {
            match last {
                Some(last) => {
                    panic!("timed out after {within:?} waiting for {what}; last saw {last:#?}")
                }
                None => panic!("timed out after {within:?} waiting for {what}"),
            }
        }
        match pause {
            Some(p) => std::thread::sleep(p),
            None => std::thread::yield_now(),
        }
    }
}

/// Every file under `dir` (recursively) whose bytes hold `needle`.
pub fn files_holding(dir: &std::path::Path, needle: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => todo.push(path),
                Ok(t) if t.is_file() => {
                    let data = std::fs::read(&path).unwrap_or_default();
                    if data.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                        found.push(path);
                    }
                }
                _ => {}
            }
        }
    }
    found
}

/// `s` percent-encoded for a query parameter, `/` kept (as the files routes' paths are).
pub fn percent(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A path percent-encoded for a query parameter.
pub fn percent_path(path: &std::path::Path) -> String {
    percent(&path.display().to_string())
}

/// A JSON field as i32 (panics with the object when absent).
pub fn int(v: &Value, field: &str) -> i32 {
    v[field]
        .as_i64()
        .unwrap_or_else(|| panic!("{field} is not an integer in {v:#}")) as i32
}

/// A JSON field as &str (panics with the object when absent).
pub fn text<'a>(v: &'a Value, field: &str) -> &'a str {
    v[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} is not a string in {v:#}"))
}

/// Milliseconds since the epoch of an RFC 3339 UTC time as the agent writes them
/// (`2026-11-29T21:57:19.123Z`); `None` for anything else.
pub fn epoch_ms(t: &str) -> Option<i64> {
    let b = t.as_bytes();
    if b.len() < 20 || !t.ends_with('Z') || b[4] != b'-' || b[10] != b'T' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| t.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let ms = match t[19..t.len() - 1].strip_prefix('.') {
        Some(f) if !f.is_empty() && f.bytes().all(|c| c.is_ascii_digit()) => {
            format!("{f:0<3}")[..3].parse::<i64>().ok()?
        }
        None if t.len() == 20 => 0,
        _ => return None,
    };
    // Days from the civil date (proleptic Gregorian), after H. Hinnant.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + hh) * 60 + mm) * 60_000 + ss * 1000 + ms)
}

/// Milliseconds since the epoch, now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
