//! Idempotency keys: `idempotency/<hash>` names the job first started with a key, the key
//! itself (so a hash collision is never mistaken for a match) and the request's
//! fingerprint (so the same key with a different request is refused, not answered with
//! the old job). The hash is one the project fixes, so names survive an upgrade.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use crate::model::JobId;
use crate::model::error::{Error, Result};
use crate::model::hash::fnv1a_128;

use super::fsutil::{ensure_private_dir, write_atomic};
use super::layout::IDEMPOTENCY_DIR;
use super::store::Store;

/// How long a start waits for another start with the same key (past the launcher's own
/// bounded wait for its supervisor).
const KEY_WAIT: std::time::Duration = std::time::Duration::from_secs(40);

/// The longest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 255;

/// What an earlier start with the same key left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Earlier {
    /// No job (or its job was pruned): start one.
    None,
    /// The job started for the same request.
    Same(JobId),
    /// A job started for a different request.
    Different(JobId),
}

/// Held while a key is looked up and recorded, so two retries racing each other still
/// start one job.
pub struct KeyLock(#[allow(dead_code)] File);

fn path(store: &Store, key: &str) -> PathBuf {
    store
        .root()
        .join(IDEMPOTENCY_DIR)
        .join(format!("{:032x}", fnv1a_128(&[key.as_bytes()])))
}

/// Checks a key and takes its lock.
pub fn lock(store: &Store, key: &str) -> Result<KeyLock> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES || key.chars().any(|c| c.is_control()) {
        return Err(Error::Invalid(format!(
            "Idempotency-Key must be 1 to {MAX_KEY_BYTES} bytes of printable characters"
        )));
    }
    let path = path(store, key).with_extension("lock");
    if let Some(dir) = path.parent() {
        ensure_private_dir(dir).map_err(|e| Error::io("idempotency folder", e))?;
    }
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(|e| Error::io("idempotency lock", e))?;
    // Bounded: the request holding it may be waiting on a supervisor that its job stopped.
    let deadline = std::time::Instant::now() + KEY_WAIT;
    loop {
        match f.try_lock() {
            Ok(()) => return Ok(KeyLock(f)),
            Err(fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(fs::TryLockError::WouldBlock) => {
                return Err(Error::Conflict(format!(
                    "another request with Idempotency-Key {key:?} is still starting its job; \
                     retry in a moment"
                )));
            }
            Err(fs::TryLockError::Error(e)) => return Err(Error::io("idempotency lock", e)),
        }
    }
}

/// What was started with `key` before, compared with this request's `fingerprint`.
pub fn lookup(store: &Store, _lock: &KeyLock, key: &str, fingerprint: u128) -> Earlier {
    let Ok(text) = fs::read_to_string(path(store, key)) else {
        return Earlier::None;
    };
    let mut lines = text.lines();
    let (Some(id), Some(k)) = (lines.next().and_then(JobId::parse), lines.next()) else {
        return Earlier::None;
    };
    if k != key || !store.job_dir(&id).is_dir() {
        return Earlier::None;
    }
    // Files written before fingerprints existed match any request, as they did then.
    match lines.next().map(|f| u128::from_str_radix(f, 16)) {
        Some(Ok(f)) if f != fingerprint => Earlier::Different(id),
        _ => Earlier::Same(id),
    }
}

/// Records the job started for `key`.
pub fn record(store: &Store, _lock: &KeyLock, key: &str, id: &JobId, fingerprint: u128) {
    let text = format!("{id}\n{key}\n{fingerprint:032x}\n");
    let _ = write_atomic(&path(store, key), text.as_bytes(), 0o600);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_key_same_request_is_the_same_job_and_a_different_request_is_told() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(d.path()).unwrap();
        let id = JobId::from_random([7; 10]);
        fs::create_dir_all(store.job_dir(&id)).unwrap();
        let l = lock(&store, "k1").unwrap();
        assert_eq!(lookup(&store, &l, "k1", 1), Earlier::None);
        record(&store, &l, "k1", &id, 1);
        assert_eq!(lookup(&store, &l, "k1", 1), Earlier::Same(id.clone()));
        assert_eq!(lookup(&store, &l, "k1", 2), Earlier::Different(id.clone()));
        fs::remove_dir_all(store.job_dir(&id)).unwrap();
        assert_eq!(lookup(&store, &l, "k1", 2), Earlier::None, "pruned job");
        for bad in ["", "a\nb", &"x".repeat(256)] {
            assert!(
                matches!(lock(&store, bad), Err(Error::Invalid(_))),
                "{bad:?}"
            );
        }
    }
}
