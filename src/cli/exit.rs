//! The CLI's exit status for a job (`exec` and `attach` both end with it); its cases are
//! tested with `exec`'s help, which lists them.

use crate::model::{JobRecord, Status};

/// The CLI exit status for a job: its own code, 128+signal, 124 timed out, 125 lost.
pub fn exit_status(rec: &JobRecord) -> i32 {
    let by_signal = || {
        rec.signal
            .as_deref()
            .and_then(|s| s.parse::<nix::sys::signal::Signal>().ok())
            .map(|s| 128 + s as i32)
    };
    match rec.status {
        Status::Running => 0,
        Status::Succeeded => 0,
        Status::TimedOut => 124,
        Status::Lost => 125,
        Status::Failed if rec.exit_code.is_none() && rec.signal.is_none() => 125,
        Status::Failed => rec.exit_code.or_else(by_signal).unwrap_or(125),
        // A cancelled job never reports success, even if it trapped TERM and exited 0.
        Status::Cancelled => by_signal()
            .or(rec.exit_code.filter(|&c| c != 0))
            .unwrap_or(130),
    }
}
