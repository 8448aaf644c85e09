//! A session's command: the shell gets the restore script and the state descriptor
//! (both memory files), and at the end the state it wrote becomes the session's when,
//! and only when, the command exited by itself.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Seek};
use std::os::fd::{AsFd, OwnedFd};

use nix::sys::wait::WaitStatus;

use crate::model::secret::SecretVar;
use crate::model::session::{
    self, DUMP_FD, MAX_DUMP_BYTES, RESTORE_FD, SessionRun, Shell, parse_dump,
};
use crate::model::spec::Spec;
use crate::state::sessions::{self as store, SaveError};
use crate::text::redact::Redactor;

use super::{End, Supervisor};

/// What the end of a session's command needs.
pub(super) struct SessionIo {
    run: SessionRun,
    /// The memory file the shell's EXIT trap writes its state to.
    dump: File,
    /// The environment the shell started with.
    env: BTreeMap<String, Vec<u8>>,
    /// The command's secrets, in every spelling output masks.
    secrets: Redactor,
    /// The saved state, made durable after the final record.
    saved: Option<store::Saved>,
    /// This job, the session's latest command once it ended.
    job: crate::model::JobId,
}

/// The program a session's shell runs as (`$0`).
pub(super) fn program(spec: &Spec) -> &'static str {
    match spec.session.as_ref().map(|s| s.shell) {
        Some(Shell::Bash) => "/bin/bash",
        _ => "/bin/sh",
    }
}

/// For a session's command: wraps the spec's command (restore, trap, command) and makes
/// the two descriptors the shell inherits, which the caller keeps until the shell is
/// started. Nothing for any other job.
pub(super) fn prepare(
    spec: &mut Spec,
    envp: &[CString],
    secrets: &[SecretVar],
) -> Result<Option<(SessionIo, [OwnedFd; 2])>, String> {
    let Some(run) = spec.session.clone() else {
        return Ok(None);
    };
    let fail = |e: std::io::Error| format!("session state: {e}");
    let restore = crate::os::spawn::memory_file(&session::restore_script(&run)).map_err(fail)?;
    let dump = crate::os::spawn::memory_file(b"").map_err(fail)?;
    let fds = [
        crate::os::spawn::inheritable_copy(restore.as_fd(), RESTORE_FD).map_err(fail)?,
        crate::os::spawn::inheritable_copy(dump.as_fd(), DUMP_FD).map_err(fail)?,
    ];
    spec.command = session::command_line(&run, &spec.command);
    let env = envp
        .iter()
        .filter_map(|kv| {
            let kv = kv.as_bytes();
            let eq = kv.iter().position(|&b| b == b'=')?;
            let name = std::str::from_utf8(&kv[..eq]).ok()?;
            Some((name.to_string(), kv[eq + 1..].to_vec()))
        })
        .collect();
    let values: Vec<&[u8]> = secrets
        .iter()
        .map(|s| s.value.expose().as_bytes())
        .collect();
    let forms = crate::text::pipeline::masked_forms(&values);
    let secrets = Redactor::new(&forms.iter().map(Vec::as_slice).collect::<Vec<_>>());
    Ok(Some((
        SessionIo {
            run,
            dump,
            env,
            secrets,
            saved: None,
            job: spec.record.id.clone(),
        },
        fds,
    )))
}

impl SessionIo {
    /// Writes `state`, with this job as the latest command.
    fn write(
        &mut self,
        root: &std::path::Path,
        mut state: session::SessionState,
    ) -> Result<(), SaveError> {
        state.last_job_id = Some(self.job.clone());
        self.saved = Some(store::save_state(root, &self.run.id, &state)?);
        Ok(())
    }

    /// Makes the saved state durable (after the final record: off the waiters' path).
    pub(super) fn sync(&mut self) {
        if let Some(u) = self.saved.take() {
            let _ = u.sync();
        }
    }
}

impl Supervisor {
    /// Saves the session's new state if the command exited by itself, and records
    /// whether it did; returns a note for the record's `reason` when something was not
    /// saved.
    pub(super) fn end_session(&mut self, shell: Option<WaitStatus>, end: End) -> Option<String> {
        let s = self.session.as_mut()?;
        let (saved, note) = match (end, shell) {
            (End::ShellExited, Some(WaitStatus::Exited(..))) => save(s, self.store.root()),
            (End::ShellExited, Some(WaitStatus::Signaled(_, sig, _))) => (
                false,
                Some(format!(
                    "the session is left as it was: its shell was killed by {}",
                    sig.as_str()
                )),
            ),
            _ => (false, Some("the session is left as it was".into())),
        };
        if !saved {
            // As it was, but for the latest command's id.
            let before = s.run.state.clone();
            let _ = s.write(self.store.root(), before);
        }
        self.rec.session_saved = Some(saved);
        note
    }
}

/// Reads what the shell wrote and saves the next state: `(saved, note)`.
fn save(s: &mut SessionIo, root: &std::path::Path) -> (bool, Option<String>) {
    let mut raw = Vec::new();
    let read = s.dump.rewind().and_then(|()| {
        (&s.dump)
            .take(MAX_DUMP_BYTES as u64 + 1)
            .read_to_end(&mut raw)
    });
    if let Err(e) = read {
        return (false, Some(format!("session not saved: its state: {e}")));
    }
    if raw.is_empty() {
        return (
            false,
            Some(
                "session not saved: the shell ended without writing its state (the command \
                 ran `exec`, or replaced the EXIT trap); the session is left as it was"
                    .into(),
            ),
        );
    }
    let dump = match parse_dump(s.run.shell, &raw) {
        Ok(d) if raw.len() <= MAX_DUMP_BYTES => d,
        _ => {
            return (
                false,
                Some(format!(
                    "session not saved: the state the shell wrote is not in the expected form \
                     (something else wrote to descriptor {DUMP_FD}, or it is over {MAX_DUMP_BYTES} \
                     bytes); the session is left as it was"
                )),
            );
        }
    };
    let secrets = &s.secrets;
    let out = session::next_state(&s.run, &s.env, &dump, &|b| secrets.finds(b));
    let dropped = (!out.dropped.is_empty()).then(|| {
        format!(
            "not saved in the session, since they hold a secret value: {}",
            out.dropped.join(", ")
        )
    });
    match s.write(root, out.state) {
        Ok(()) => (true, dropped),
        Err(SaveError::Gone) => (
            false,
            Some("session not saved: the session was removed meanwhile".into()),
        ),
        Err(SaveError::TooLarge(n)) => (
            false,
            Some(format!(
                "session not saved: its state would be {n} bytes, over the {} bytes a session \
                 keeps; the session is left as it was",
                session::MAX_STATE_BYTES
            )),
        ),
        Err(SaveError::Io(e)) => (false, Some(format!("session not saved: {e}"))),
    }
}
