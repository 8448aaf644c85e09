//! Statuses and the on-disk record (`job.json`), as fixed by the contract.

use serde::{Deserialize, Serialize};

use super::id::JobId;

/// The record format this binary writes. Readers accept older versions and unknown fields.
pub const FORMAT_VERSION: u32 = 1;

/// Why a job is `lost` when its supervisor vanished.
pub const LOST_SUPERVISOR: &str =
    "its supervisor exited without recording the job's end (killed or crashed)";
/// Why a job is `lost` after a snapshot restore or reboot.
pub const LOST_BOOT: &str = "sandbox restarted; its processes were not restored";

/// A job's status, as the contract names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Its supervisor is alive and the job has not ended.
    Running,
    /// Exited 0.
    Succeeded,
    /// Non-zero exit, or killed by a signal the agent did not send.
    Failed,
    /// Ended by its timeout or idle timeout.
    TimedOut,
    /// Ended by a cancel request.
    Cancelled,
    /// Its supervisor is gone; `reason` says why.
    Lost,
}

impl Status {
    /// The contract's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::TimedOut => "timed_out",
            Status::Cancelled => "cancelled",
            Status::Lost => "lost",
        }
    }

    /// Parses the contract's name.
    pub fn parse(s: &str) -> Option<Status> {
        Some(match s {
            "running" => Status::Running,
            "succeeded" => Status::Succeeded,
            "failed" => Status::Failed,
            "timed_out" => Status::TimedOut,
            "cancelled" => Status::Cancelled,
            "lost" => Status::Lost,
            _ => return None,
        })
    }

    /// All statuses, in the order reports list them.
    pub const ALL: [Status; 6] = [
        Status::Running,
        Status::Succeeded,
        Status::Failed,
        Status::TimedOut,
        Status::Cancelled,
        Status::Lost,
    ];

    /// True once the job can change no more.
    pub fn is_final(self) -> bool {
        self != Status::Running
    }
}

/// The job record, `jobs/<id>/job.json`. Unknown fields written by a newer agent are kept.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JobRecord {
    /// Record format; absent in the very first format, read as 0.
    #[serde(default)]
    pub format_version: u32,
    pub id: JobId,
    /// The shell command, with secret values masked.
    pub command: String,
    pub cwd: String,
    pub status: Status,
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub created_at: String,
    pub started_at: Option<String>,
    pub ended_at: Option<String>,
    pub timeout_seconds: f64,
    #[serde(default)]
    pub idle_timeout_seconds: Option<f64>,
    /// True when the request asked for a longer timeout than the agent's cap
    /// (`--max-job-seconds`), so `timeout_seconds` is the cap; absent otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timeout_clamped: bool,
    pub pid: Option<i32>,
    pub pgid: Option<i32>,
    /// Bytes in output.log; final once the job has ended, a live figure from the file before.
    pub output_bytes: u64,
    /// Why the job is `lost`, timed out or cut short; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// True when output was dropped (cap reached or disk full).
    #[serde(default)]
    pub output_truncated: bool,
    /// How many sanitized bytes were dropped.
    #[serde(default)]
    pub output_dropped_bytes: u64,
    /// The supervisor's pid and its start time (clock ticks since boot), so a reused pid is
    /// never signalled.
    #[serde(default)]
    pub supervisor_pid: Option<i32>,
    #[serde(default)]
    pub supervisor_start: Option<u64>,
    /// The kernel boot id the job started under.
    #[serde(default)]
    pub boot_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The job's cgroup folder, where it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// How many secret occurrences were masked in the job's output (merged where they
    /// touch), once it has ended; absent when none were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redactions: Option<u64>,
    /// The user the job runs as, where it is not the agent's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Seconds between TERM and KILL for this job.
    #[serde(default)]
    pub grace_seconds: Option<f64>,
    /// The session whose command this job is (see `crate::model::session`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// A session's command, once ended: whether what it changed became the session's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_saved: Option<bool>,
    /// The limits the job runs under (`limits` of the request); absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<super::resources::Limits>,
    /// What the job used; final once it ended. Answers fill it in live while it runs.
    #[serde(default)]
    pub usage: super::resources::Usage,
    /// True when the kernel's OOM killer ended one of the job's processes.
    #[serde(default)]
    pub oom_killed: bool,
    /// The job's cgroup v1 folders (one per hierarchy it joined), where it has them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cgroups_v1: Vec<String>,
    /// Bytes in stderr.log, for a job started with `separateStderr`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_bytes: Option<u64>,
    /// Fields this binary does not know, kept on rewrite.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl JobRecord {
    /// The `isError` of the contract: true unless succeeded; false while running.
    pub fn is_error(&self) -> bool {
        !matches!(self.status, Status::Succeeded | Status::Running)
    }

    /// The record plus `output` and `isError`: the one shape of `exec --json`,
    /// `POST /v1/jobs`, `GET /v1/jobs/{id}` and `status ID --json`.
    pub fn view(&self, output: String) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.insert("output".into(), output.into());
            o.insert("isError".into(), self.is_error().into());
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_keeps_unknown_fields_and_reads_old_format() {
        let old = r#"{"id":"job_0123456789abcdef0123","command":"true","cwd":"/","status":"succeeded",
            "exitCode":0,"signal":null,"createdAt":"2026-01-01T00:00:00Z","startedAt":null,
            "endedAt":null,"timeoutSeconds":5,"pid":null,"pgid":null,"outputBytes":0,"future":{"x":1}}"#;
        let r: JobRecord = serde_json::from_str(old).unwrap();
        assert_eq!(r.format_version, 0);
        assert_eq!(r.extra["future"]["x"], 1);
        let again = serde_json::to_string(&r).unwrap();
        assert!(again.contains("\"future\""));
        assert!(!r.is_error());
    }
}
