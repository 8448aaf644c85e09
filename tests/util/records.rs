//! Job records written straight into a state root, as an earlier run (or boot) of the
//! agent would have left them, or as an attacker would plant them: [`record`] makes one,
//! the test changes what it needs through the JSON, and [`plant`] writes it.

use std::fs;
use std::path::Path;

use serde_json::{Value, json};

/// A record (format 1) of job `id` running `command`, created and started at `at` (RFC
/// 3339), under boot `boot`. A `running` one has no exit code nor end; any other status
/// exited 0 at `at`. Its pid and pgid name no process (999999).
pub fn record(id: &str, command: &str, status: &str, at: &str, boot: &str) -> Value {
    let running = status == "running";
    json!({
        "formatVersion": 1, "id": id, "command": command, "cwd": "/", "status": status,
        "exitCode": if running { Value::Null } else { 0.into() }, "signal": null,
        "createdAt": at, "startedAt": at,
        "endedAt": if running { Value::Null } else { at.into() },
        "timeoutSeconds": 60, "pid": 999_999, "pgid": 999_999, "outputBytes": 0,
        "bootId": boot,
    })
}

/// Writes `rec` as its job's folder under the state root `root`: `job.json` and the
/// job's `lock` (no output).
pub fn plant(root: &Path, rec: &Value) {
    let id = rec["id"]
        .as_str()
        .unwrap_or_else(|| panic!("a record to plant has no id: {rec:#}"));
    let dir = root.join("jobs").join(id);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("job.json"), rec.to_string()).unwrap();
    fs::write(dir.join("lock"), "").unwrap();
}
