//! Sessions, for the API and the CLI alike: make one, start its commands one at a time
//! (each an ordinary job whose supervisor restores and saves the state, see
//! `crate::model::session`), show one, remove one.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::launch::{self, JobEvents};
use super::settle;
use crate::model::error::{Error, Result};
use crate::model::session::{
    STATE_FORMAT, SessionId, SessionMeta, SessionRun, SessionState, Shell, Var,
};
use crate::model::spec::{Config, StartRequest};
use crate::model::{JobId, JobRecord, Status};
use crate::state::idempotency::{self, Earlier};
use crate::state::sessions as store;
use crate::state::store::Store;

/// What a new session starts from.
#[derive(Debug, Clone, Default)]
pub struct NewSession {
    pub cwd: Option<String>,
    /// Exported variables its commands start with.
    pub env: BTreeMap<String, String>,
    pub user: Option<String>,
    pub shell: Shell,
}

/// Parses a session id from a path or the command line: a malformed one is not found,
/// as an unknown one.
pub fn parse_id(s: &str) -> Result<SessionId> {
    SessionId::parse(s).ok_or_else(|| {
        Error::NotFound(format!(
            "no session {s:?}: a session id is ses_ + 20 lowercase hex characters"
        ))
    })
}

/// Makes a session and returns its view.
pub fn create(st: &Store, cfg: &Config, new: NewSession) -> Result<Value> {
    if new.shell == Shell::Bash && !Path::new("/bin/bash").is_file() {
        return Err(Error::Invalid(
            "shell bash: /bin/bash is not installed in this sandbox; use shell sh".into(),
        ));
    }
    crate::model::env::check_all(&new.env)?;
    let probe = StartRequest {
        user: new.user.clone(),
        ..StartRequest::default()
    };
    let user = launch::resolve_user(&probe, cfg)?;
    let cwd = match &new.cwd {
        Some(c) if c.contains('\0') => return Err(Error::Invalid("cwd holds a NUL byte".into())),
        Some(c) => c.into(),
        None => match &user {
            Some(u) => u.home.clone().into(),
            None => std::env::current_dir()
                .map_err(|e| Error::Invalid(format!("the current folder is unusable: {e}")))?,
        },
    };
    let cwd: std::path::PathBuf = cwd;
    if !fs::metadata(&cwd).is_ok_and(|m| m.is_dir()) {
        return Err(Error::Invalid(format!(
            "cwd {} is not a folder: give an existing folder",
            cwd.display()
        )));
    }
    let cwd = fs::canonicalize(&cwd).unwrap_or(cwd);
    let cwd = cwd
        .to_str()
        .ok_or_else(|| Error::Invalid("cwd is not UTF-8".into()))?
        .to_string();
    let mut random = [0u8; 10];
    crate::os::proc::random_bytes(&mut random).map_err(|e| Error::io("random id", e))?;
    let meta = SessionMeta {
        format_version: STATE_FORMAT,
        id: SessionId::from_random(random),
        shell: new.shell,
        user: user.map(|u| u.name),
        created_at: crate::text::timefmt::now(),
        extra: Default::default(),
    };
    let state = SessionState {
        format_version: STATE_FORMAT,
        cwd,
        vars: new
            .env
            .into_iter()
            .map(|(k, v)| {
                let var = Var {
                    value: Some(crate::model::session::Bytes(v.into_bytes())),
                    exported: true,
                };
                (k, var)
            })
            .collect(),
        ..SessionState::default()
    };
    store::create(st.root(), &meta, &state)?;
    Ok(view(st, &meta, &state))
}

/// The running command's id, if one runs: a running job whose record names the session
/// (settled first, so a command whose supervisor is gone no longer counts). Read from the
/// running jobs (one name each, see `state::layout::RUNNING_DIR`), so that a start writes
/// nothing of the session's.
fn busy(st: &Store, id: &SessionId) -> Option<JobId> {
    let running = fs::read_dir(st.running_dir()).ok()?;
    running.flatten().find_map(|e| {
        let job = JobId::parse(e.file_name().to_str()?)?;
        let ours = |r: &JobRecord| r.session_id.as_deref() == Some(id.as_str());
        if !st.read_raw(&job).is_ok_and(|r| ours(&r)) {
            return None;
        }
        settle::settle_and_load(st, &job)
            .ok()
            .filter(|r| r.status == Status::Running && ours(r))
            .map(|_| job)
    })
}

fn view(st: &Store, meta: &SessionMeta, state: &SessionState) -> Value {
    let busy = busy(st, &meta.id);
    let last = busy.clone().or_else(|| state.last_job_id.clone());
    json!({
        "id": meta.id,
        "cwd": state.cwd,
        "envNames": state.names(),
        "shell": meta.shell,
        "user": meta.user,
        "createdAt": meta.created_at,
        "busy": busy,
        "lastJobId": last,
    })
}

/// One session's view: `{"id", "cwd", "envNames", "shell", "user", "createdAt", "busy",
/// "lastJobId"}`; names only, never values.
pub fn get(st: &Store, id: &SessionId) -> Result<Value> {
    let meta = store::load_meta(st.root(), id)?;
    let state = store::load_state(st.root(), id)?;
    Ok(view(st, &meta, &state))
}

/// Every session's view, in id order (one removed meanwhile is left out).
pub fn list(st: &Store) -> Vec<Value> {
    store::ids(st.root())
        .iter()
        .filter_map(|id| get(st, id).ok())
        .collect()
}

/// Removes a session, cancelling its running command first.
pub fn remove(st: &Store, cfg: &Config, id: &SessionId) -> Result<()> {
    let _lock = store::lock(st.root(), id)?;
    store::load_meta(st.root(), id)?;
    if let Some(job) = busy(st, id) {
        let wait = Duration::from_secs_f64(cfg.grace_seconds + 5.0);
        launch::cancel(st, &job, wait)?;
    }
    store::remove(st.root(), id)
}

/// The nearest folder at or above `cwd` that still exists: a command can always start,
/// even after the folder the last one ended in was removed.
fn existing(cwd: &str) -> String {
    let mut p = Path::new(cwd);
    loop {
        if p.is_dir() {
            return p.to_string_lossy().into_owned();
        }
        match p.parent() {
            Some(up) => p = up,
            None => return "/".into(),
        }
    }
}

/// Starts `req` as the session's next command (`req.cwd` and `req.user` are the
/// session's own; a request that names them is refused). One command at a time: while
/// one runs, a start is a conflict naming it.
pub fn start(
    st: &Store,
    cfg: &Config,
    id: &SessionId,
    mut req: StartRequest,
    stdin: Option<fs::File>,
) -> Result<(JobRecord, Option<JobEvents>)> {
    if req.cwd.is_some() || req.user.is_some() {
        return Err(Error::Invalid(
            "a session's command runs in the session's folder, as the session's user: leave \
             out cwd and user (cd in a command instead)"
                .into(),
        ));
    }
    // The key is this module's to keep (the start below changes the request: the
    // session's folder and variables), so that a retry is told apart by what was sent.
    let key = req.idempotency_key.take();
    let fingerprint =
        crate::model::hash::fnv1a_128(&[&req.fingerprint().to_le_bytes(), id.as_str().as_bytes()]);
    let key_lock = match key.as_deref() {
        Some(k) => {
            refuse_secret_key(&req, k)?;
            Some((k, idempotency::lock(st, k)?))
        }
        None => None,
    };
    if let Some((k, lock)) = &key_lock {
        match idempotency::lookup(st, lock, k, fingerprint) {
            Earlier::None => {}
            Earlier::Same(job) => return Ok((settle::settle_and_load(st, &job)?, None)),
            Earlier::Different(job) => {
                return Err(Error::Conflict(format!(
                    "Idempotency-Key {k:?} was already used for job {job} with a different \
                     request; send the same request to get that job, or use a new key"
                )));
            }
        }
    }
    let _lock = store::lock(st.root(), id)?;
    let meta = store::load_meta(st.root(), id)?;
    if let Some(job) = busy(st, id) {
        return Err(Error::Conflict(format!(
            "session {id} is running job {job}; one command runs at a time: wait for it to \
             end (GET /v1/jobs/{job}?waitSeconds=60) or cancel it"
        )));
    }
    let state = store::load_state(st.root(), id)?;
    let cwd = existing(&state.cwd);
    let secret_names: BTreeSet<String> = req.secrets.iter().map(|s| s.name.clone()).collect();
    // The shell takes a logical folder (a symbolic link's name) from PWD when it names
    // where it starts.
    req.env.entry("PWD".into()).or_insert_with(|| cwd.clone());
    let keep = req
        .env
        .keys()
        .cloned()
        .chain(secret_names.iter().cloned())
        .collect();
    req.cwd = Some(cwd);
    req.user = meta.user.clone();
    req.session = Some(SessionRun {
        id: id.clone(),
        shell: meta.shell,
        state,
        keep,
        secret_names,
    });
    let (rec, events) = launch::start_with_stdin(st, cfg, req, stdin)?;
    if let Some((k, lock)) = &key_lock {
        idempotency::record(st, lock, k, &rec.id, fingerprint);
    }
    Ok((rec, events))
}

/// Refuses an `Idempotency-Key` that spells one of the command's secrets (it is stored in
/// the clear), in any spelling output masks.
fn refuse_secret_key(req: &StartRequest, key: &str) -> Result<()> {
    let finder = launch::secrets_finder(req);
    if finder.finds(key.as_bytes()) {
        return Err(Error::Invalid(
            "Idempotency-Key holds a secret's value (as given or encoded); it would be stored \
             in the clear: choose another key"
                .into(),
        ));
    }
    Ok(())
}
