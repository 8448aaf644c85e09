//! `/v1/files/archive`: a folder out as one tar (or tar.gz) stream, and a streamed one
//! unpacked into a folder, both as the job user with the files API's path rules (see
//! [`crate::os::files::archive`]).

use std::io::Read;
use std::path::PathBuf;

use serde_json::json;

use super::files::{fs_error, full_path, run, who};
use super::{Answer, Call, Failure, Reply};
use crate::api::app::App;
use crate::http::{BodyOut, Response, Source, Streamed, fault_of};
use crate::model::error::{Error, Result};
use crate::os::files::archive::{self, Format, PackError, UnpackError, UnpackOpts};
use crate::os::files::{self as fs, FinalLink, Intent};

fn format(call: &Call<'_>) -> Result<Format> {
    match call.query.get("format") {
        None | Some("") => Ok(Format::Tar),
        Some(f) => Format::parse(f).ok_or_else(|| {
            Error::Invalid(format!(
                "format {f:?} is not an archive format this agent writes or reads; use tar or tar.gz"
            ))
        }),
    }
}

fn pack_error(e: PackError, path: &str) -> Error {
    match e {
        PackError::Unreadable(rel, e) => {
            let at = if rel == "." {
                path.to_string()
            } else {
                format!("{}/{rel}", path.trim_end_matches('/'))
            };
            match fs_error(e, &at) {
                Error::Forbidden(m) => Error::Forbidden(format!(
                    "{m}: the job user cannot read it, so the folder cannot be archived whole; \
                     archive a folder without it"
                )),
                other => other,
            }
        }
        PackError::TooBig(m) => Error::TooLarge(format!("{path}: {m}; archive a smaller folder")),
        PackError::Io(e) => fs_error(e, path),
    }
}

/// The folder's place, which must be a folder.
fn folder(g: &fs::Guard, path: &str) -> Result<fs::Place> {
    let p = fs::resolve(g, path.as_bytes(), FinalLink::Follow, Intent::Use)
        .map_err(|e| fs_error(e, path))?;
    match &p.st {
        None => Err(Error::NotFound(format!("{path}: no such file or folder"))),
        Some(st) if !fs::is_dir(st) => Err(Error::Invalid(format!(
            "{path}: not a folder; GET /v1/files/content reads a file"
        ))),
        Some(_) => Ok(p),
    }
}

/// `GET /v1/files/archive?path=P&format=tar|tar.gz`: the folder as one archive, streamed
/// (chunked) as it is made. Every entry is first looked at as the job user, so that one it
/// cannot read is refused (403, naming it) before the answer starts; an error after that
/// cuts the stream before its end, which a client sees as an incomplete body.
pub fn get(app: &App, call: &Call<'_>) -> Answer {
    let format = format(call)?;
    let path = run(app, |g, home| {
        let path = full_path(call.query.get("path"), "path", home)?;
        let p = folder(g, &path)?;
        archive::check_readable(g, &p).map_err(|e| pack_error(e, &path))?;
        Ok(path)
    })?;
    let w = who(app)?;
    let base = path
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|b| !b.is_empty())
        .unwrap_or("root")
        .replace(|c: char| c == '"' || c == '\\' || c.is_control(), "_");
    let ext = match format {
        Format::Tar => "tar",
        Format::TarGz => "tar.gz",
    };
    let mut resp = Response::new(
        200,
        vec![
            ("Content-Type", format.content_type().into()),
            (
                "Content-Disposition",
                format!("attachment; filename=\"{base}.{ext}\""),
            ),
            ("Cache-Control", "no-store".into()),
        ],
        Vec::new(),
    );
    resp.stream = Some(Streamed::Chunks(Box::new(Packing {
        creds: w.creds,
        root: app.store.root().to_path_buf(),
        path,
        format,
    })));
    Ok(resp)
}

/// The archive being made, as the job user, on the connection's time.
struct Packing {
    creds: Option<(u32, u32, Vec<u32>)>,
    root: PathBuf,
    path: String,
    format: Format,
}

impl Source for Packing {
    fn send(&mut self, out: &mut BodyOut<'_>) -> std::io::Result<()> {
        let creds = self
            .creds
            .as_ref()
            .map(|(u, g, gs)| (*u, *g, gs.as_slice()));
        let (path, format) = (self.path.as_str(), self.format);
        fs::as_user(creds, &self.root, |g| {
            let p = fs::resolve(g, path.as_bytes(), FinalLink::Follow, Intent::Use)?;
            if !p.st.as_ref().is_some_and(fs::is_dir) {
                return Err(std::io::Error::other(format!(
                    "{path} is no longer a folder"
                )));
            }
            archive::pack(g, &p, format, &mut |b| out.bytes(b)).map_err(|e| match e {
                PackError::Io(e) | PackError::Unreadable(_, e) => e,
                PackError::TooBig(m) => std::io::Error::other(m),
            })
        })?
    }
}

/// `PUT /v1/files/archive?path=P&format=tar|tar.gz`: the streamed archive unpacked into
/// folder P (created if missing, its parent must exist), all or nothing:
/// `{"path", "entries", "bytes"}`.
pub fn put(app: &App, call: &Call<'_>, body: &mut (dyn Read + Send)) -> Reply {
    let format = format(call)?;
    let max_bytes = app.max_file_bytes;
    // Whether the body failed (the client's side), so the rest of it is not read.
    let mut broken = false;
    // Made before the staging folder and held until it is gone, so that a start after a
    // crash in between finds and removes it.
    let entry = crate::state::unpacking::Entry::begin(app.store.root())
        .map_err(|e| Error::io("noting the unpack in the state root", e))?;
    let journal = entry.file();
    let done = run(app, |g, home| {
        let path = full_path(call.query.get("path"), "path", home)?;
        let p = fs::resolve(g, path.as_bytes(), FinalLink::Follow, Intent::Use)
            .map_err(|e| fs_error(e, &path))?;
        let o = UnpackOpts {
            format,
            max_bytes,
            journal: Some(journal),
        };
        match archive::unpack(g, &p, &mut *body, &o) {
            Ok(n) => Ok(json!({"path": path, "entries": n.entries, "bytes": n.bytes})),
            Err(e) => Err(match e {
                UnpackError::Invalid(m) => Error::Invalid(format!("{path}: {m}")),
                UnpackError::TooLarge(m) => Error::TooLarge(format!("{path}: {m}")),
                UnpackError::Forbidden(m) => Error::Forbidden(format!("{path}: {m}")),
                UnpackError::Conflict(m) => Error::Conflict(format!("{path}: {m}")),
                UnpackError::Body(e) => {
                    broken = true;
                    match fault_of(&e) {
                        Some(crate::http::Fault::TooLarge(m)) => Error::TooLarge(m.clone()),
                        Some(crate::http::Fault::TooSlow(m)) => Error::Timeout(m.clone()),
                        _ => Error::Invalid(format!("reading the body: {e}; nothing was unpacked")),
                    }
                }
                UnpackError::Io(e) => fs_error(e, &path),
            }),
        }
    });
    drop(entry);
    done.map_err(|e| {
        // A refused archive's rest is read (a little of it) so that the client, still
        // sending, gets the answer instead of a reset connection; beyond that the
        // connection closes after the answer.
        let whole = !broken && drain(body, DRAIN);
        let mut f = Failure::from(e);
        f.close = !whole;
        f
    })
}

/// How much of a refused archive's body is read before the answer.
const DRAIN: u64 = 4 << 20;

/// Reads and drops at most `max` bytes; true if the body ended within them.
fn drain(body: &mut (dyn Read + Send), max: u64) -> bool {
    let mut buf = [0u8; 16 << 10];
    let mut left = max;
    loop {
        match body.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) if (n as u64) < left => left -= n as u64,
            _ => return false,
        }
    }
}

/// An archive's body is bounded by what it unpacks to (`--max-file-bytes`, counted after
/// decompression, and the entry count), not by its own size.
pub fn max_body(_: &App) -> u64 {
    u64::MAX
}

/// Removes the staging folders that unpacks of a server which died meanwhile left (the
/// journal under the state root names each one), as the job user, each only if it is
/// really ours: our name, a folder, owned by the job user. Returns how many.
pub fn sweep_at_start(cfg: &crate::model::spec::Config, root: &std::path::Path) -> usize {
    let left = crate::state::unpacking::stale(root);
    if left.is_empty() {
        return 0;
    }
    let user = match cfg.job_user.as_deref() {
        Some(name) => match crate::os::users::lookup(name) {
            Ok(u) => Some((u.uid, u.gid, u.groups)),
            Err(_) => return 0,
        },
        None => None,
    };
    let owner = user
        .as_ref()
        .map_or_else(|| nix::unistd::geteuid().as_raw(), |u| u.0);
    let creds = user.as_ref().map(|(u, g, gs)| (*u, *g, gs.as_slice()));
    let mut n = 0;
    for s in left {
        let removed = fs::as_user(creds, root, |g| {
            archive::remove_left_staging(g, &s.staging, owner)
        });
        match removed {
            Ok(Ok(true)) => n += 1,
            Ok(Ok(false)) => {}
            // Kept, to be tried again at the next start.
            _ => continue,
        }
        s.done();
    }
    n
}
