//! A thread per file operation with the job user's file-system credentials, and the
//! agent's own thread beside it to answer what only the agent may look at.

use std::io;
use std::path::Path;
use std::sync::mpsc;

use super::guard::{Ask, Guard};
use super::sys;

/// Runs `f` on a thread of its own that has the job user's file-system credentials (its
/// files are created owned by that user, and the kernel decides every permission), or
/// the agent's own when `user` is `None`, with a [`Guard`] of the state root at `root`.
///
/// Why a thread per call: `setfsuid`/`setfsgid` and the raw `setgroups` system call change
/// only the calling thread, so no other request ever runs with these credentials, and the
/// thread exits after the call, so none is ever reused with them. A helper process per
/// request would be as safe, but forking a large multi-threaded server costs more and
/// the child may not allocate. Moving from fsuid 0 to another drops the file capabilities
/// (CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_CHOWN...) from that thread.
///
/// Some questions of the guard need the agent's own eyes (whether a file is one of those
/// under the state root, which the job user cannot read): the calling thread, which
/// keeps the agent's credentials, answers them while `f` runs, and nothing else.
pub fn as_user<R: Send>(
    user: Option<(u32, u32, &[u32])>,
    root: &Path,
    f: impl FnOnce(&Guard) -> R + Send,
) -> io::Result<R> {
    let (tx, rx) = mpsc::channel::<Ask>();
    let guard = Guard::new(root, Some(tx))?;
    let answers = guard.answerer()?;
    std::thread::scope(|s| {
        let worker = std::thread::Builder::new()
            .name("files".into())
            // Room for an archive's gzip state (deflate's frames are large in debug
            // builds); pages never touched cost no memory.
            .stack_size(1 << 20)
            .spawn_scoped(s, move || {
                if let Some((uid, gid, groups)) = user {
                    sys::thread_fs_creds(uid, gid, groups)?;
                }
                Ok(f(&guard))
            })?;
        // The worker's guard holds the only sender: this ends when the worker does.
        for ask in rx {
            let _ = ask.reply.send(answers.holds(ask.id));
        }
        worker
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}
