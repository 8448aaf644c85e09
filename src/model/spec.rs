//! What a job is asked to be: the caller's request, the agent's limits, and the spec the
//! launcher hands its supervisor, with the checks that need no I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::error::{Error, Result};
use super::secret::SecretVar;

pub use super::env::{JOB_ENV_MARKER, MAX_ARG_BYTES};

/// Timeouts above this many seconds are refused as absurd (a unit mistake), not clamped.
pub const ABSURD_SECONDS: f64 = 1e9;

/// The agent's limits, set by flags of `exec` and `serve`.
#[derive(Debug, Clone)]
pub struct Config {
    /// Cap on any job's timeout; longer requests are clamped.
    pub max_job_seconds: f64,
    /// Seconds between TERM and KILL.
    pub grace_seconds: f64,
    /// Per-job cap on stored output.
    pub max_output_bytes: u64,
    /// Most jobs running at once.
    pub max_running: usize,
    /// The user jobs run as unless a request names another; absent: the agent's own.
    pub job_user: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_job_seconds: 3600.0,
            grace_seconds: 5.0,
            max_output_bytes: 1 << 30,
            max_running: 256,
            job_user: None,
        }
    }
}

/// Everything a caller may ask of a new job.
#[derive(Debug, Clone, Default)]
pub struct StartRequest {
    pub command: String,
    pub cwd: Option<String>,
    /// The job's own variables (they win over the persisted env).
    pub env: BTreeMap<String, String>,
    pub stdin: Option<Vec<u8>>,
    pub secrets: Vec<SecretVar>,
    pub timeout_seconds: Option<f64>,
    pub idle_timeout_seconds: Option<f64>,
    pub idempotency_key: Option<String>,
    /// Run as this user instead of the agent's job user.
    pub user: Option<String>,
    /// Keep the job's stdin open, written through its supervisor's control socket.
    pub interactive: bool,
    /// Run the job on a pseudo-terminal of this size (implies `interactive`).
    pub pty: Option<PtySize>,
    /// The job is a session's command: its state is restored first and saved at its end.
    pub session: Option<super::session::SessionRun>,
    /// Limits on the job's cgroup.
    pub limits: Option<super::resources::Limits>,
    /// Run this program with these arguments, without a shell (instead of `command`).
    pub argv: Option<Vec<String>>,
    /// Keep the job's stderr apart in stderr.log too.
    pub separate_stderr: bool,
}

/// A terminal's size, in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    pub cols: u16,
    pub rows: u16,
}

/// The largest terminal side accepted, in cells.
pub const MAX_PTY_SIDE: u16 = 1000;

impl StartRequest {
    /// What tells two requests apart for an idempotency key: everything the job would run
    /// with, but secret values (their names count): even a hash of a value stays off disk.
    pub fn fingerprint(&self) -> u128 {
        let mut parts: Vec<Vec<u8>> = vec![
            self.command.as_bytes().to_vec(),
            self.cwd.as_deref().unwrap_or("\0none").as_bytes().to_vec(),
            self.stdin.clone().unwrap_or_else(|| b"\0none".to_vec()),
            format!("{:?}/{:?}", self.timeout_seconds, self.idle_timeout_seconds).into_bytes(),
            format!("user {:?}", self.user).into_bytes(),
            format!("interactive {:?} {:?}", self.interactive, self.pty).into_bytes(),
        ];
        if self.limits.is_some() || self.argv.is_some() || self.separate_stderr {
            parts
                .push(format!("resources {:?} {}", self.limits, self.separate_stderr).into_bytes());
            for w in self.argv.iter().flatten() {
                parts.push(format!("argv {w}").into_bytes());
            }
        }
        for (k, v) in &self.env {
            parts.push(format!("env {k}").into_bytes());
            parts.push(v.as_bytes().to_vec());
        }
        let mut names: Vec<&str> = self.secrets.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        for n in names {
            parts.push(format!("secret {n}").into_bytes());
        }
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        super::hash::fnv1a_128(&refs)
    }
}

/// The shortest timeout accepted: 1 ms (a subnormal number of seconds is a mistake).
pub const MIN_SECONDS: f64 = 0.001;

/// A number as an error message shows it: at most 6 significant digits.
fn shown(v: f64) -> String {
    let s = format!("{v:.6e}");
    match s.split_once('e') {
        Some((m, e)) => {
            let m = m.trim_end_matches('0').trim_end_matches('.');
            if e == "0" {
                m.to_string()
            } else {
                format!("{m}e{e}")
            }
        }
        None => s,
    }
}

/// Checks a timeout value given in seconds; `what` names the field in errors.
pub fn check_seconds(what: &str, v: f64) -> Result<f64> {
    if !v.is_finite() {
        return Err(Error::Invalid(format!(
            "{what} must be a number of seconds, got {v}"
        )));
    }
    if v < MIN_SECONDS {
        return Err(Error::Invalid(format!(
            "{what} must be at least {MIN_SECONDS} seconds (1 ms), got {}",
            shown(v)
        )));
    }
    if v > ABSURD_SECONDS {
        return Err(Error::Invalid(format!(
            "{what} of {} s is absurd (over {ABSURD_SECONDS} s)",
            shown(v)
        )));
    }
    Ok(v)
}

/// What the launcher tells the supervisor. Never written to disk: it reaches the
/// supervisor as a memory file on a descriptor the launcher passes (the handshake's
/// `SPEC_FD`), so the real command and the secret values have no copy in the job folder.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// The real command (the record holds a masked copy).
    pub command: String,
    /// The job's secrets, as `NAME=value` lines (the secret file format).
    #[serde(default)]
    pub secrets: String,
    pub cwd: String,
    /// Variables on top of the supervisor's own environment (persisted env, then the job's).
    pub env: BTreeMap<String, String>,
    pub timeout_seconds: f64,
    pub idle_timeout_seconds: Option<f64>,
    pub grace_seconds: f64,
    pub max_output_bytes: u64,
    pub has_stdin: bool,
    /// The user the job runs as; absent: the agent's own.
    #[serde(default)]
    pub user: Option<JobUser>,
    /// The job's stdin stays open, fed through the supervisor's control socket.
    #[serde(default)]
    pub interactive: bool,
    /// The job runs on a pseudo-terminal of this size.
    #[serde(default)]
    pub pty: Option<PtySize>,
    /// The job is a session's command (see `crate::model::session`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<super::session::SessionRun>,
    /// Limits on the job's cgroup.
    #[serde(default)]
    pub limits: Option<super::resources::Limits>,
    /// The program and its arguments, run without a shell; absent: `/bin/sh -c command`.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// The job's stderr also goes, alone, to stderr.log.
    #[serde(default)]
    pub separate_stderr: bool,
    /// The job's first record, without its pids: the supervisor completes it and writes
    /// it once the shell runs (one record write per start, not two).
    pub record: super::JobRecord,
}

/// A user a job runs as, as the user database gave it at the start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobUser {
    pub name: String,
    pub uid: u32,
    /// Primary group.
    pub gid: u32,
    /// Primary and supplementary groups.
    pub groups: Vec<u32>,
    pub home: String,
    pub shell: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_have_a_sane_floor_and_short_messages() {
        assert_eq!(check_seconds("t", 0.001).unwrap(), 0.001);
        let Err(Error::Invalid(m)) = check_seconds("timeoutSeconds", 5e-324) else {
            panic!("5e-324 accepted");
        };
        assert!(m.len() < 100, "{m}");
        assert!(m.contains("1 ms") && m.contains("e-324"), "{m}");
        assert!(check_seconds("t", 2e9).is_err());
    }
}
