//! What a job is asked to be: the caller's request, the agent's limits, and the spec the
//! launcher hands its supervisor, with the checks that need no I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::error::{Error, Result};
use super::secret::SecretVar;

/// Environment variable every job process carries, naming its job (for sweeps and ports).
pub const JOB_ENV_MARKER: &str = "GITTERM_JOB_ID";
/// In a job's secrets file, the line holding the real command (a JSON string) when it
/// differs from the masked one; a `#` line, so the secrets parser skips it.
pub const COMMAND_LINE: &str = "#command=";

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
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_job_seconds: 3600.0,
            grace_seconds: 5.0,
            max_output_bytes: 1 << 30,
            max_running: 256,
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
}

impl StartRequest {
    /// What tells two requests apart for an idempotency key: everything the job would run
    /// with, but secret values (their names count): even a hash of a value stays off disk.
    pub fn fingerprint(&self) -> u128 {
        let mut parts: Vec<Vec<u8>> = vec![
            self.command.as_bytes().to_vec(),
            self.cwd.as_deref().unwrap_or("\0none").as_bytes().to_vec(),
            self.stdin.clone().unwrap_or_else(|| b"\0none".to_vec()),
            format!("{:?}/{:?}", self.timeout_seconds, self.idle_timeout_seconds).into_bytes(),
        ];
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

/// The longest single argument the kernel passes to a program (MAX_ARG_STRLEN, 32 pages,
/// including the terminating NUL): the command is one argument of `sh -c`, and each
/// variable one `NAME=value` string.
pub const MAX_ARG_BYTES: usize = 32 * 4096 - 1;

/// Checks a timeout value given in seconds; `what` names the field in errors.
pub fn check_seconds(what: &str, v: f64) -> Result<f64> {
    if !v.is_finite() {
        return Err(Error::Invalid(format!(
            "{what} must be a number of seconds, got {v}"
        )));
    }
    if v <= 0.0 {
        return Err(Error::Invalid(format!(
            "{what} must be more than 0 seconds, got {v}"
        )));
    }
    if v > ABSURD_SECONDS {
        return Err(Error::Invalid(format!(
            "{what} of {v} s is absurd (over {ABSURD_SECONDS} s)"
        )));
    }
    Ok(v)
}

/// Checks an environment variable for a job.
pub fn check_env(name: &str, value: &str) -> Result<()> {
    super::secret::validate_name(name)?;
    if value.contains('\0') {
        return Err(Error::Invalid(format!(
            "environment variable {name} holds a NUL byte"
        )));
    }
    if name.len() + 1 + value.len() > MAX_ARG_BYTES {
        return Err(Error::Invalid(format!(
            "environment variable {name} is {} bytes; the kernel passes at most \
             {MAX_ARG_BYTES} bytes in one NAME=value string: put a large value in a file",
            name.len() + 1 + value.len()
        )));
    }
    Ok(())
}

/// What the launcher tells the supervisor, stored as `spec.json` (0600) in the job folder.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// The real command (the record holds a masked copy).
    pub command: String,
    pub cwd: String,
    /// Variables on top of the supervisor's own environment (persisted env, then the job's).
    pub env: BTreeMap<String, String>,
    pub timeout_seconds: f64,
    pub idle_timeout_seconds: Option<f64>,
    pub grace_seconds: f64,
    pub max_output_bytes: u64,
    pub has_stdin: bool,
}
