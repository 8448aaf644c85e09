//! Facts about the sandbox: the kernel boot id and whether this start is a resume (a
//! snapshot restore or a reboot since the agent last started).

use std::path::Path;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::model::error::{Error, Result};

/// Names a file to read the boot id from instead of the kernel's, so tests can fake a
/// snapshot restore.
pub const BOOT_ID_FILE_ENV: &str = "GITTERM_BOOT_ID_FILE";
const KERNEL_BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
const RECORD: &str = super::layout::SANDBOX_FILE;

/// The kernel's boot id (or the one in `$GITTERM_BOOT_ID_FILE`), trimmed; empty if
/// unreadable. Read once per process: a process never outlives its boot.
pub fn boot_id() -> String {
    static BOOT_ID: OnceLock<String> = OnceLock::new();
    BOOT_ID
        .get_or_init(|| {
            let path = std::env::var_os(BOOT_ID_FILE_ENV)
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| KERNEL_BOOT_ID.into());
            std::fs::read_to_string(path)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        })
        .clone()
}

/// What the agent learned about the sandbox when it started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStart {
    /// The boot id now.
    pub boot_id: String,
    /// The boot id recorded at the previous agent start, if any was readable.
    pub previous_boot_id: Option<String>,
    /// True when the previous start was under another boot: the sandbox was restored from
    /// a snapshot or rebooted, so no process from before survives.
    pub resumed: bool,
    /// When this agent started (RFC 3339 UTC).
    pub agent_started_at: String,
}

/// `<root>/sandbox.json`: the last start. Only `bootId` matters when reading it back.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    boot_id: String,
    #[serde(default)]
    agent_started_at: String,
}

/// Records this agent start under `root` and tells whether it is a resume.
pub fn record_start(root: &Path) -> Result<SandboxStart> {
    record_start_with(root, &boot_id())
}

/// [`record_start`] for a given boot id (tests pass fake ones). An unreadable or corrupt
/// record counts as no previous start; an empty boot id (unknown) never counts as a resume,
/// as with [`crate::state::store::Store::load`].
pub fn record_start_with(root: &Path, boot_id: &str) -> Result<SandboxStart> {
    let path = root.join(RECORD);
    let previous_boot_id = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Record>(&b).ok())
        .map(|r| r.boot_id);
    let resumed = previous_boot_id
        .as_deref()
        .is_some_and(|prev| !prev.is_empty() && !boot_id.is_empty() && prev != boot_id);
    let start = SandboxStart {
        boot_id: boot_id.to_string(),
        previous_boot_id,
        resumed,
        agent_started_at: crate::text::timefmt::now(),
    };
    let record = Record {
        boot_id: start.boot_id.clone(),
        agent_started_at: start.agent_started_at.clone(),
    };
    let data = serde_json::to_vec_pretty(&record)
        .map_err(|e| Error::Internal(format!("encoding {}: {e}", path.display())))?;
    crate::state::fsutil::ensure_private_dir(root).map_err(|e| {
        Error::io(
            format!("cannot create the state root {}", root.display()),
            e,
        )
    })?;
    crate::state::fsutil::write_atomic(&path, &data, 0o600)
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    Ok(start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn first_start_same_boot_and_resume() {
        let d = tempfile::tempdir().unwrap();
        let first = record_start_with(d.path(), "boot-a").unwrap();
        assert_eq!(first.previous_boot_id, None);
        assert!(!first.resumed);
        assert!(crate::text::timefmt::parse(&first.agent_started_at).is_some());

        let again = record_start_with(d.path(), "boot-a").unwrap();
        assert_eq!(again.previous_boot_id.as_deref(), Some("boot-a"));
        assert!(!again.resumed);

        let restored = record_start_with(d.path(), "boot-b").unwrap();
        assert_eq!(restored.previous_boot_id.as_deref(), Some("boot-a"));
        assert!(restored.resumed);

        let after = record_start_with(d.path(), "boot-b").unwrap();
        assert!(!after.resumed);
        let mode = std::fs::metadata(d.path().join(RECORD))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);

        let json = serde_json::to_value(&restored).unwrap();
        assert_eq!(json["previousBootId"], "boot-a");
        assert_eq!(json["resumed"], true);
        assert!(json["agentStartedAt"].is_string());
    }

    #[test]
    fn corrupt_record_is_no_previous_start() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(RECORD), b"{\"bootId\": 12").unwrap();
        let s = record_start_with(d.path(), "boot-a").unwrap();
        assert_eq!(s.previous_boot_id, None);
        assert!(!s.resumed);
        // ...and it was replaced by a good one.
        let s = record_start_with(d.path(), "boot-b").unwrap();
        assert!(s.resumed);
    }

    #[test]
    fn unknown_boot_is_never_a_resume() {
        let d = tempfile::tempdir().unwrap();
        record_start_with(d.path(), "boot-a").unwrap();
        assert!(!record_start_with(d.path(), "").unwrap().resumed);
    }

    #[test]
    fn creates_a_missing_root() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("state");
        record_start_with(&root, "boot-a").unwrap();
        assert!(root.join(RECORD).is_file());
    }

    #[test]
    fn kernel_boot_id_is_stable() {
        // Read once: the same answer every time, already trimmed.
        assert_eq!(boot_id(), boot_id());
        assert_eq!(boot_id(), boot_id().trim());
    }
}
