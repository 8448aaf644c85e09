//! Typed command-line values and the agent's limits, shared by `exec` and `serve`, so
//! that a bad number is refused by the parser, with the flag's name, before anything runs.

use std::str::FromStr;
use std::time::Duration;

use super::spec::{Config, check_seconds};

/// A number of seconds: finite, more than 0, not absurd.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seconds(pub f64);

impl Seconds {
    /// As a `Duration`.
    pub fn duration(self) -> Duration {
        Duration::from_secs_f64(self.0)
    }
}

impl FromStr for Seconds {
    type Err = String;
    fn from_str(s: &str) -> Result<Seconds, String> {
        let v: f64 = s
            .trim()
            .parse()
            .map_err(|_| format!("expected a number of seconds, got {s:?}"))?;
        check_seconds("the value", v)
            .map(Seconds)
            .map_err(|e| e.message().to_string())
    }
}

/// A number of seconds where 0 is allowed (`--wait 0`: return at once; `--grace 0`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SecondsOrZero(pub f64);

impl FromStr for SecondsOrZero {
    type Err = String;
    fn from_str(s: &str) -> Result<SecondsOrZero, String> {
        if s.trim().parse::<f64>() == Ok(0.0) {
            return Ok(SecondsOrZero(0.0));
        }
        Seconds::from_str(s).map(|v| SecondsOrZero(v.0))
    }
}

/// Limits shared by `exec` and `serve`.
#[derive(clap::Args, Clone, Debug)]
pub struct LimitArgs {
    /// Seconds between TERM and KILL when a job ends
    #[arg(
        long,
        value_name = "S",
        default_value = "5",
        allow_hyphen_values = true
    )]
    pub grace: SecondsOrZero,
    /// Cap on any job's timeout (longer requests are clamped)
    #[arg(
        long,
        value_name = "S",
        default_value = "3600",
        allow_hyphen_values = true
    )]
    pub max_job_seconds: Seconds,
    /// Per-job cap on stored output; past it output is drained but not stored
    #[arg(long, value_name = "BYTES", default_value = "1073741824")]
    pub max_output_bytes: u64,
    /// Most jobs running at once (at least 1)
    #[arg(long, value_name = "N", default_value = "256",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_running: u32,
    /// Run jobs as this user (from /etc/passwd) when the agent runs as root, so a job
    /// cannot touch its supervisor or the agent's state
    #[arg(long, value_name = "NAME", env = "GITTERM_JOB_USER")]
    pub job_user: Option<String>,
}

impl LimitArgs {
    /// The limits as the launcher takes them.
    pub fn config(&self) -> Config {
        Config {
            max_job_seconds: self.max_job_seconds.0,
            grace_seconds: self.grace.0,
            max_output_bytes: self.max_output_bytes,
            max_running: self.max_running as usize,
            job_user: self.job_user.clone().filter(|u| !u.is_empty()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_refuse_what_they_would_misread() {
        assert_eq!("1.5".parse::<Seconds>(), Ok(Seconds(1.5)));
        for bad in ["0", "-1", "abc", "", "inf", "NaN", "1e10"] {
            assert!(bad.parse::<Seconds>().is_err(), "{bad:?}");
        }
        assert_eq!("0".parse::<SecondsOrZero>(), Ok(SecondsOrZero(0.0)));
        assert!("-0.5".parse::<SecondsOrZero>().is_err());
    }
}
