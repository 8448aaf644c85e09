//! Sessions on disk: `<root>/sessions/<id>/` holds `session.json` (the session's own
//! record, written by whoever starts or removes its commands) and `state.json` (what it
//! carries, replaced by the supervisor of the command that changed it). Both 0600 in
//! 0700 folders, owned by the agent's user: a job user cannot read its own session's
//! values. Nothing here signals a process or reads a job.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::model::error::{Error, Result};
use crate::model::session::{MAX_STATE_BYTES, SessionId, SessionMeta, SessionState};

use super::fsutil;
use super::layout::{SESSION_META, SESSION_STATE, SESSIONS_DIR, STAGING_PREFIX};

/// How long a start waits for another start or removal of the same session.
const LOCK_WAIT: Duration = Duration::from_secs(5);

/// The folder of all sessions.
pub fn sessions_dir(root: &Path) -> PathBuf {
    root.join(SESSIONS_DIR)
}

/// One session's folder.
pub fn dir(root: &Path, id: &SessionId) -> PathBuf {
    sessions_dir(root).join(id.as_str())
}

fn not_found(id: &SessionId) -> Error {
    Error::NotFound(format!(
        "no session {id}: list them with GET /v1/sessions (or `gitterm-agent session list`)"
    ))
}

/// Makes a session whole: assembled under a hidden name and renamed into place, so a
/// session folder never lacks either file.
pub fn create(root: &Path, meta: &SessionMeta, state: &SessionState) -> Result<()> {
    let io = |what: &'static str| move |e: io::Error| Error::io(format!("session: {what}"), e);
    fsutil::ensure_private_dir(&sessions_dir(root)).map_err(io("folder"))?;
    let staging = sessions_dir(root).join(format!("{STAGING_PREFIX}{}", meta.id));
    fsutil::ensure_private_dir(&staging).map_err(io("folder"))?;
    let written = (|| {
        fsutil::write_atomic(&staging.join(SESSION_META), &to_json(meta)?, 0o600)?;
        fsutil::write_atomic(&staging.join(SESSION_STATE), &to_json(state)?, 0o600)?;
        fs::rename(&staging, dir(root, &meta.id))
    })();
    if written.is_err() {
        let _ = fs::remove_dir_all(&staging);
    }
    written.map_err(io("writing"))
}

fn to_json<T: serde::Serialize>(v: &T) -> io::Result<Vec<u8>> {
    serde_json::to_vec_pretty(v).map_err(io::Error::other)
}

fn read<T: serde::de::DeserializeOwned>(root: &Path, id: &SessionId, file: &str) -> Result<T> {
    let path = dir(root, id).join(file);
    let raw = match fs::read(&path) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(not_found(id)),
        Err(e) => return Err(Error::io(format!("reading session {id}"), e)),
    };
    serde_json::from_slice(&raw)
        .map_err(|e| Error::Internal(format!("session {id}: {file} is corrupt: {e}")))
}

/// The session's own record.
pub fn load_meta(root: &Path, id: &SessionId) -> Result<SessionMeta> {
    read(root, id, SESSION_META)
}

/// What the session carries.
pub fn load_state(root: &Path, id: &SessionId) -> Result<SessionState> {
    read(root, id, SESSION_STATE)
}

/// Why a state was not saved.
#[derive(Debug)]
pub enum SaveError {
    /// The session was removed meanwhile.
    Gone,
    /// Over [`MAX_STATE_BYTES`].
    TooLarge(usize),
    Io(io::Error),
}

/// The file a new state is written into and then swapped with `state.json`: after the
/// swap it holds the old state, and the next command's supervisor writes over it.
const NEXT_STATE: &str = ".state.json.next";

/// A state in place whose bytes are not yet known to be on disk (see [`Saved::sync`]).
#[must_use = "sync it, or say why a kernel crash may lose it"]
pub struct Saved {
    file: File,
    dir: File,
}

impl Saved {
    /// Makes the new state durable: the file, then the folder entry.
    pub fn sync(self) -> io::Result<()> {
        self.file.sync_all()?;
        self.dir.sync_all()
    }
}

/// Replaces the session's state atomically, without waiting for the disk, and without
/// making or freeing an inode: the new state is written over the old scratch file (never
/// truncated to nothing first) and the two names are swapped (`RENAME_EXCHANGE`). A rename
/// over a file, or a truncation to zero, makes ext4 write the new data out first
/// (`auto_da_alloc`: milliseconds on a busy disk, on the way to the command's final
/// record), and a freed inode makes later allocations dearer on ext4 without a journal.
/// Where the file system cannot swap, a plain rename. A session removed meanwhile is not
/// brought back: the file is written inside its folder.
pub fn save_state(
    root: &Path,
    id: &SessionId,
    state: &SessionState,
) -> std::result::Result<Saved, SaveError> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let data = to_json(state).map_err(SaveError::Io)?;
    if data.len() > MAX_STATE_BYTES {
        return Err(SaveError::TooLarge(data.len()));
    }
    let gone = |e: io::Error| match e.kind() {
        io::ErrorKind::NotFound => SaveError::Gone,
        _ => SaveError::Io(e),
    };
    let folder = dir(root, id);
    let dirfd = File::open(&folder).map_err(gone)?;
    let (next, cur) = (folder.join(NEXT_STATE), folder.join(SESSION_STATE));
    let file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(&next)
        .map_err(gone)?;
    let placed = (|| {
        file.write_all_at(&data, 0)?;
        file.set_len(data.len() as u64)?;
        match crate::os::rename::exchange(&next, &cur) {
            Ok(()) => Ok(()),
            Err(_) => fs::rename(&next, &cur),
        }
    })();
    placed.map_err(gone)?;
    Ok(Saved { file, dir: dirfd })
}

/// Takes the session's lock (its folder's flock), waiting a little for another holder.
pub fn lock(root: &Path, id: &SessionId) -> Result<File> {
    let f = match File::open(dir(root, id)) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(not_found(id)),
        Err(e) => return Err(Error::io(format!("session {id}"), e)),
    };
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match f.try_lock() {
            Ok(()) => return Ok(f),
            Err(fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(fs::TryLockError::WouldBlock) => {
                return Err(Error::Conflict(format!(
                    "session {id} is busy starting or removing a command; try again"
                )));
            }
            Err(fs::TryLockError::Error(e)) => {
                return Err(Error::io(format!("locking session {id}"), e));
            }
        }
    }
}

/// Every session's id, in id order (hidden folders being assembled or removed are not).
pub fn ids(root: &Path) -> Vec<SessionId> {
    let mut ids: Vec<SessionId> = fs::read_dir(sessions_dir(root))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(SessionId::parse))
                .collect()
        })
        .unwrap_or_default();
    ids.sort();
    ids
}

/// Removes a session: renamed away first (so it is gone at once, and a supervisor saving
/// into it finds no folder), then deleted.
pub fn remove(root: &Path, id: &SessionId) -> Result<()> {
    let gone = sessions_dir(root).join(format!(".gone-{id}"));
    match fs::rename(dir(root, id), &gone) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(not_found(id)),
        Err(e) => return Err(Error::io(format!("removing session {id}"), e)),
    }
    fs::remove_dir_all(&gone).map_err(|e| Error::io(format!("removing session {id}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::session::{Bytes, Shell, Var};

    #[test]
    fn a_session_round_trips_and_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let id = SessionId::from_random([7; 10]);
        let meta = SessionMeta {
            format_version: 1,
            id: id.clone(),
            shell: Shell::Bash,
            user: None,
            created_at: "2026-01-01T00:00:00Z".into(),
            extra: Default::default(),
        };
        let mut st = SessionState {
            cwd: "/tmp".into(),
            ..Default::default()
        };
        st.vars.insert(
            "A".into(),
            Var {
                value: Some(Bytes(b"\xff odd".to_vec())),
                exported: true,
            },
        );
        create(t.path(), &meta, &st).unwrap();
        assert_eq!(load_meta(t.path(), &id).unwrap(), meta);
        assert_eq!(load_state(t.path(), &id).unwrap(), st);
        for f in [SESSION_META, SESSION_STATE] {
            let m = fs::metadata(dir(t.path(), &id).join(f)).unwrap();
            assert_eq!(m.permissions().mode() & 0o777, 0o600);
        }
        assert_eq!(ids(t.path()), vec![id.clone()]);
        let _l = lock(t.path(), &id).unwrap();
        remove(t.path(), &id).unwrap();
        assert!(matches!(
            save_state(t.path(), &id, &st),
            Err(SaveError::Gone)
        ));
        assert!(matches!(load_meta(t.path(), &id), Err(Error::NotFound(_))));
        assert!(ids(t.path()).is_empty());
    }
}
