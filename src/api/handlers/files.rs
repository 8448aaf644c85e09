//! `/v1/files/...`: stat, list, read, write, mkdir, move and delete, each run with the job
//! user's file-system credentials (the agent's own without one), so the kernel decides
//! every permission and new files belong to that user. The state root is always refused
//! (see [`crate::os::files`]).

use std::io::{self, Read};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use super::{Answer, Call, Failure, Reply};
use crate::api::app::App;
use crate::api::request::{self, DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT, query_bool};
use crate::http::{BodyOut, Response, Source, Streamed, fault_of};
use crate::model::error::{Error, Result};
use crate::os::files::{self as fs, FinalLink, Guard, Intent, Place, WriteError, WriteOpts};

/// Removes stray upload files (ours, over an hour old) that a crash left in the job
/// user's HOME and in /tmp. Uploads fill an unnamed file (`O_TMPFILE`) and name it only for
/// the moment before the rename, so a named one survives a crash only in that moment, or
/// on a file system without `O_TMPFILE` (where the file is named while it fills).
pub fn sweep_at_start(cfg: &crate::model::spec::Config) -> usize {
    let home = match cfg.job_user.as_deref() {
        Some(name) => crate::os::users::lookup(name).map(|u| u.home).ok(),
        None => std::env::var("HOME").ok(),
    };
    let hour = Duration::from_secs(3600);
    let mut n = fs::sweep(std::path::Path::new("/tmp"), hour);
    if let Some(h) = home.filter(|h| h != "/tmp") {
        n += fs::sweep(std::path::Path::new(&h), hour);
    }
    n
}

/// Who the operations run as: the job user's ids and home.
pub(in crate::api) struct Who {
    pub(in crate::api) creds: Option<(u32, u32, Vec<u32>)>,
    pub(in crate::api) home: String,
}

pub(in crate::api) fn who(app: &App) -> Result<Who> {
    match app.cfg.job_user.as_deref() {
        Some(name) => {
            let u = crate::os::users::lookup(name)?;
            let me = nix::unistd::geteuid().as_raw();
            Ok(Who {
                creds: (me != u.uid || me == 0).then_some((u.uid, u.gid, u.groups)),
                home: u.home,
            })
        }
        None => Ok(Who {
            creds: None,
            home: std::env::var("HOME").unwrap_or_else(|_| "/".into()),
        }),
    }
}

/// Runs `f` as the job user with the state root's guard.
pub(super) fn run<R: Send>(
    app: &App,
    f: impl FnOnce(&Guard, &str) -> Result<R> + Send,
) -> Result<R> {
    let w = who(app)?;
    let creds = w.creds.as_ref().map(|(u, g, gs)| (*u, *g, gs.as_slice()));
    let home = w.home.as_str();
    fs::as_user(creds, app.store.root(), |guard| f(guard, home)).map_err(|e| {
        Error::io(
            "looking at the state root and taking the job user's file-system credentials",
            e,
        )
    })?
}

/// A path argument, absolute or relative to `home`.
pub(super) fn full_path(raw: Option<&str>, what: &str, home: &str) -> Result<String> {
    let p = raw.ok_or_else(|| Error::Invalid(format!("{what} is missing")))?;
    if p.is_empty() {
        return Err(Error::Invalid(format!("{what} is empty")));
    }
    if p.contains('\0') {
        return Err(Error::Invalid(format!("{what} holds a NUL byte")));
    }
    if p.len() > fs::MAX_PATH {
        return Err(Error::Invalid(format!(
            "{what} is over {} bytes",
            fs::MAX_PATH
        )));
    }
    let full = if p.starts_with('/') {
        p.to_string()
    } else {
        format!("{}/{p}", home.trim_end_matches('/'))
    };
    if full.len() > fs::MAX_PATH {
        return Err(Error::Invalid(format!(
            "{what} is over {} bytes",
            fs::MAX_PATH
        )));
    }
    Ok(full)
}

/// An I/O error as the contract's error, naming the path.
pub(super) fn fs_error(e: io::Error, path: &str) -> Error {
    if fs::is_forbidden(&e) {
        return Error::Forbidden(format!("{path}: {e}"));
    }
    if e.kind() == io::ErrorKind::InvalidInput && e.raw_os_error().is_none() {
        return Error::Invalid(format!("{path}: {e}"));
    }
    let m = |what: &str| format!("{path}: {what}");
    match e.raw_os_error().unwrap_or(0) {
        libc::ENOENT => Error::NotFound(m("no such file or folder")),
        libc::EACCES | libc::EPERM => Error::Forbidden(m("permission denied")),
        libc::EROFS => Error::Forbidden(m("read-only file system")),
        libc::ELOOP => Error::Forbidden(m(
            "the path goes through a /proc magic link, or too many symlinks",
        )),
        libc::EEXIST => Error::Conflict(m("already exists")),
        libc::ENOTEMPTY => {
            Error::Conflict(m("the folder is not empty (recursive=true removes it)"))
        }
        libc::ESTALE => Error::Conflict(m("the file changed during the request; retry")),
        libc::ENOSPC | libc::EDQUOT => Error::NoSpace(m("no space left on the file system")),
        libc::EFBIG => Error::TooLarge(m("the file is too large for the file system")),
        libc::ENOTDIR => Error::Invalid(m("a component of the path is not a folder")),
        libc::EISDIR => Error::Invalid(m("is a folder")),
        libc::ENAMETOOLONG => Error::Invalid(m("a name in the path is too long")),
        libc::EXDEV => Error::Invalid(m("cannot move across file systems")),
        libc::EINVAL => Error::Invalid(m("invalid for this object (a folder into itself?)")),
        _ => Error::io(path, e),
    }
}

fn rfc3339(secs: i64, nsec: i64) -> String {
    let t = if secs >= 0 {
        SystemTime::UNIX_EPOCH + Duration::new(secs as u64, nsec.clamp(0, 999_999_999) as u32)
    } else {
        SystemTime::UNIX_EPOCH
    };
    crate::text::timefmt::rfc3339(t)
}

fn stat_json(path: &str, p: &Place, st: &nix::sys::stat::FileStat) -> Value {
    let target = (fs::kind(st) == "symlink")
        .then(|| fs::link_target(p))
        .flatten()
        .map(|t| String::from_utf8_lossy(&t).into_owned());
    let mut v = json!({
        "path": path,
        "type": fs::kind(st),
        "size": st.st_size,
        "mode": format!("{:04o}", st.st_mode & 0o7777),
        "mtime": rfc3339(st.st_mtime, st.st_mtime_nsec),
        "symlinkTarget": target,
    });
    if fs::kind(st) == "file" {
        v["etag"] = fs::etag(st).into();
    }
    v
}

fn existing<'a>(p: &'a Place, path: &str) -> Result<&'a nix::sys::stat::FileStat> {
    p.st.as_ref()
        .ok_or_else(|| Error::NotFound(format!("{path}: no such file or folder")))
}

/// `GET /v1/files/stat?path=P` (lstat).
pub fn stat(app: &App, call: &Call<'_>) -> Reply {
    Ok(run(app, |g, home| {
        let path = full_path(call.query.get("path"), "path", home)?;
        let p = fs::resolve(g, path.as_bytes(), FinalLink::Keep, Intent::Use)
            .map_err(|e| fs_error(e, &path))?;
        let st = existing(&p, &path)?;
        Ok(stat_json(&path, &p, st))
    })?)
}

/// `GET /v1/files/list?path=P&limit=N&cursor=C`: one level, names sorted bytewise; the
/// cursor is the last name of the page, hex-encoded, and a page is one pass over the
/// folder keeping only the page ([`fs::page`]).
pub fn list(app: &App, call: &Call<'_>) -> Reply {
    let limit = call
        .query
        .uint("limit", 1, MAX_LIST_LIMIT as u64)?
        .unwrap_or(DEFAULT_LIST_LIMIT as u64) as usize;
    let after = match call.query.get("cursor") {
        None | Some("") => None,
        Some(c) => Some(unhex(c).ok_or_else(|| Error::Invalid("cursor is malformed".into()))?),
    };
    Ok(run(app, |g, home| {
        let path = full_path(call.query.get("path"), "path", home)?;
        let err = |e| fs_error(e, &path);
        let p = fs::resolve(g, path.as_bytes(), FinalLink::Follow, Intent::Use).map_err(err)?;
        if !fs::is_dir(existing(&p, &path)?) {
            return Err(Error::Invalid(format!("{path}: not a folder")));
        }
        let (page, more) = fs::page(&p, after.as_deref(), limit).map_err(err)?;
        let base = path.trim_end_matches('/');
        let mut entries = Vec::with_capacity(page.len());
        for n in &page {
            let shown = format!("{base}/{}", String::from_utf8_lossy(n));
            // An entry that vanished meanwhile is left out.
            if let Ok((child, st)) = fs::stat_in(&p, n) {
                entries.push(stat_json(&shown, &child, &st));
            }
        }
        let next = more.then(|| page.last().map(|n| hex(n))).flatten();
        Ok(json!({"entries": entries, "next": next}))
    })?)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 2 * 1024 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The largest file an upload may write: `--max-file-bytes`.
pub fn max_upload(app: &App) -> u64 {
    app.max_file_bytes
}

/// A `Range` header's one range (`bytes=a-b`, `a-`, `-n`) within `size`: `Ok(None)` for no
/// (or an unsupported) range, `Err` if it cannot be satisfied.
fn range(h: Option<&str>, size: u64) -> std::result::Result<Option<(u64, u64)>, ()> {
    let Some(spec) = h.and_then(|h| h.trim().strip_prefix("bytes=")) else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return Ok(None);
    };
    let num = |s: &str| s.trim().parse::<u64>().ok();
    let (start, end) = match (a.trim().is_empty(), b.trim().is_empty()) {
        (true, false) => {
            let n = num(b).ok_or(())?;
            if n == 0 {
                return Err(());
            }
            (size.saturating_sub(n), size.saturating_sub(1))
        }
        (false, true) => (num(a).ok_or(())?, size.saturating_sub(1)),
        (false, false) => {
            let (s, e) = (num(a).ok_or(())?, num(b).ok_or(())?);
            if e < s {
                return Ok(None);
            }
            (s, e.min(size.saturating_sub(1)))
        }
        (true, true) => return Ok(None),
    };
    if size == 0 || start >= size {
        return Err(());
    }
    Ok(Some((start, end - start + 1)))
}

/// `GET /v1/files/content?path=P`: the bytes, streamed from the open file; a file of
/// procfs or sysfs (whose size is made up) to its end, chunked.
pub fn read(app: &App, call: &Call<'_>) -> Answer {
    let (file, st) = run(app, |g, home| {
        let path = full_path(call.query.get("path"), "path", home)?;
        let err = |e| fs_error(e, &path);
        // A file replaced between its lookup and its open is looked up again (an upload's
        // rename), so a reader gets the old content or the new, not an error.
        for _ in 0..8 {
            let p = fs::resolve(g, path.as_bytes(), FinalLink::Follow, Intent::Use).map_err(err)?;
            let st = existing(&p, &path)?;
            if fs::kind(st) != "file" {
                return Err(Error::Invalid(format!(
                    "{path}: not a regular file (a {})",
                    fs::kind(st)
                )));
            }
            match fs::open_read(&p) {
                Err(e) if e.raw_os_error() == Some(libc::ESTALE) => continue,
                other => return other.map_err(err),
            }
        }
        Err(Error::Conflict(format!(
            "{path}: the file kept changing while it was opened; retry"
        )))
    })?;
    if !fs::size_is_known(&file) {
        // procfs, sysfs and the like give a made-up size (0, 4096): read to the end and
        // sent chunked, without a validator or ranges, which would be made up too.
        let mut resp = Response::new(
            200,
            vec![
                ("Content-Type", "application/octet-stream".into()),
                ("Accept-Ranges", "none".into()),
                ("Cache-Control", "no-store".into()),
            ],
            Vec::new(),
        );
        resp.stream = Some(Streamed::Chunks(Box::new(ToEnd(file))));
        return Ok(resp);
    }
    let size = st.st_size as u64;
    if call.head.none_match(&fs::etag(&st)) {
        // The client holds this very file (RFC 9110 §13.1.2); a 304 repeats what a 200
        // would say of caching.
        let tag = vec![
            ("ETag", fs::etag(&st)),
            ("Cache-Control", "no-store".into()),
        ];
        return Ok(Response::new(304, tag, Vec::new()));
    }
    let mut resp = Response::new(
        200,
        vec![
            ("Content-Type", "application/octet-stream".into()),
            ("ETag", fs::etag(&st)),
            ("Accept-Ranges", "bytes".into()),
            ("Cache-Control", "no-store".into()),
        ],
        Vec::new(),
    );
    let (offset, len) = match range(call.head.header("range"), size) {
        Ok(None) => (0, size),
        Ok(Some((start, len))) => {
            resp.status = 206;
            resp.headers.push((
                "Content-Range",
                format!("bytes {start}-{}/{size}", start + len - 1),
            ));
            (start, len)
        }
        Err(()) => {
            let mut r = crate::api::answer::error_response(
                Error::Invalid(format!(
                    "the Range cannot be satisfied: the file has {size} bytes"
                ))
                .into(),
            );
            r.status = 416;
            r.headers.push(("Content-Range", format!("bytes */{size}")));
            return Ok(r);
        }
    };
    resp.stream = Some(Streamed::File { file, offset, len });
    Ok(resp)
}

/// A file whose size is not known, read until it ends.
struct ToEnd(std::fs::File);

impl Source for ToEnd {
    fn send(&mut self, out: &mut BodyOut<'_>) -> io::Result<()> {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match self.0.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => out.bytes(&buf[..n])?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// `PUT /v1/files/content?path=P&mode=&createDirs=&overwrite=`: the body, streamed into a
/// new file that replaces the target atomically.
pub fn write(app: &App, call: &Call<'_>, body: &mut (dyn Read + Send)) -> Reply {
    let mode = call.query.get("mode").map(request::file_mode).transpose()?;
    let create_dirs = query_bool(call.query, "createDirs")?.unwrap_or(false);
    let overwrite = query_bool(call.query, "overwrite")?.unwrap_or(true);
    let mut tags = call.head.all("if-match");
    let if_match = tags.next();
    if tags.next().is_some() {
        return Err(Error::Invalid("If-Match is given more than once".into()).into());
    }
    let max_bytes = app.max_file_bytes;
    let mut close = false;
    let done = run(app, |g, home| {
        let path = full_path(call.query.get("path"), "path", home)?;
        let err = |e| fs_error(e, &path);
        if create_dirs && let Some(i) = path.rfind('/').filter(|&i| i > 0) {
            make_dirs(g, &path[..i], 0o755)?;
        }
        let p = fs::resolve(g, path.as_bytes(), FinalLink::Follow, Intent::Use).map_err(err)?;
        let o = WriteOpts {
            mode,
            overwrite,
            if_match,
            max_bytes,
        };
        match fs::write_atomic(&p, body, &o) {
            Ok(st) => Ok(stat_json(&path, &p, &st)),
            Err(WriteError::Body(e)) => {
                close = true;
                Err(match fault_of(&e) {
                    Some(crate::http::Fault::TooLarge(m)) => Error::TooLarge(m.clone()),
                    Some(crate::http::Fault::TooSlow(m)) => Error::Timeout(m.clone()),
                    _ => Error::Invalid(format!("reading the body: {e}")),
                })
            }
            Err(WriteError::TooLarge) => {
                close = true;
                Err(Error::TooLarge(format!(
                    "the file is over the limit of {max_bytes} bytes (--max-file-bytes)"
                )))
            }
            Err(WriteError::Conflict(m)) => Err(Error::Conflict(format!("{path}: {m}"))),
            Err(WriteError::NotAFile) => Err(Error::Invalid(format!(
                "{path}: not a regular file; only files are written"
            ))),
            Err(WriteError::Io(e)) => Err(err(e)),
        }
    });
    done.map_err(|e| {
        let mut f = Failure::from(e);
        f.close = close;
        f
    })
}

/// `mkdir -p`: each missing folder of `path` created with `mode`.
fn make_dirs(g: &Guard, path: &str, mode: u32) -> Result<()> {
    let mut at = String::new();
    for c in path.split('/').filter(|c| !c.is_empty()) {
        at.push('/');
        at.push_str(c);
        let err = |e| fs_error(e, &at);
        let p = fs::resolve(g, at.as_bytes(), FinalLink::Follow, Intent::Use).map_err(err)?;
        match &p.st {
            Some(st) if fs::is_dir(st) => {}
            Some(_) => return Err(Error::Invalid(format!("{at}: not a folder"))),
            None => match fs::mkdir(&p, mode) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                Err(e) => return Err(err(e)),
            },
        }
    }
    Ok(())
}

/// `POST /v1/files/mkdir {"path", "mode", "parents"}`: the new folder's stat.
pub fn mkdir(app: &App, call: &Call<'_>) -> Reply {
    let b = request::mkdir_body(call.body)?;
    let mode = b.mode.unwrap_or(0o755);
    Ok(run(app, |g, home| {
        let path = full_path(Some(&b.path), "path", home)?;
        let err = |e| fs_error(e, &path);
        if b.parents {
            make_dirs(g, &path, mode)?;
        } else {
            let p = fs::resolve(g, path.as_bytes(), FinalLink::Keep, Intent::Use).map_err(err)?;
            fs::mkdir(&p, mode).map_err(err)?;
        }
        let p = fs::resolve(g, path.as_bytes(), FinalLink::Keep, Intent::Use).map_err(err)?;
        Ok(stat_json(&path, &p, existing(&p, &path)?))
    })?)
}

/// `POST /v1/files/move {"from", "to", "overwrite"}`: the moved object's stat.
pub fn rename(app: &App, call: &Call<'_>) -> Reply {
    let b = request::move_body(call.body)?;
    Ok(run(app, |g, home| {
        let from = full_path(Some(&b.from), "from", home)?;
        let to = full_path(Some(&b.to), "to", home)?;
        let f = fs::resolve(g, from.as_bytes(), FinalLink::Keep, Intent::MoveOrRemove)
            .map_err(|e| fs_error(e, &from))?;
        existing(&f, &from)?;
        let t = fs::resolve(g, to.as_bytes(), FinalLink::Keep, Intent::MoveOrRemove)
            .map_err(|e| fs_error(e, &to))?;
        if t.st.is_some() && !b.overwrite {
            return Err(Error::Conflict(format!(
                "{to}: already exists (overwrite=true replaces it)"
            )));
        }
        fs::rename(&f, &t, b.overwrite).map_err(|e| fs_error(e, &to))?;
        let t = fs::resolve(g, to.as_bytes(), FinalLink::Keep, Intent::Use)
            .map_err(|e| fs_error(e, &to))?;
        Ok(stat_json(&to, &t, existing(&t, &to)?))
    })?)
}

/// `DELETE /v1/files?path=P&recursive=false`.
pub fn delete(app: &App, call: &Call<'_>) -> Reply {
    let recursive = query_bool(call.query, "recursive")?.unwrap_or(false);
    Ok(run(app, |g, home| {
        let path = full_path(call.query.get("path"), "path", home)?;
        let err = |e| fs_error(e, &path);
        let p =
            fs::resolve(g, path.as_bytes(), FinalLink::Keep, Intent::MoveOrRemove).map_err(err)?;
        existing(&p, &path)?;
        fs::remove(g, &p, recursive).map_err(err)?;
        Ok(json!({"path": path, "deleted": true}))
    })?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(range(None, 10), Ok(None));
        assert_eq!(range(Some("bytes=0-3"), 10), Ok(Some((0, 4))));
        assert_eq!(range(Some("bytes=5-"), 10), Ok(Some((5, 5))));
        assert_eq!(range(Some("bytes=-3"), 10), Ok(Some((7, 3))));
        assert_eq!(range(Some("bytes=8-100"), 10), Ok(Some((8, 2))));
        assert_eq!(range(Some("bytes=10-"), 10), Err(()));
        assert_eq!(range(Some("bytes=0-1,3-4"), 10), Ok(None));
        assert_eq!(range(Some("items=0-1"), 10), Ok(None));
    }

    #[test]
    fn paths_are_absolute_or_from_home() {
        assert_eq!(
            full_path(Some("a/b"), "path", "/home/u/").unwrap(),
            "/home/u/a/b"
        );
        assert_eq!(full_path(Some("/x"), "path", "/h").unwrap(), "/x");
        for bad in ["", "a\0b", &"x".repeat(4097)] {
            assert!(matches!(
                full_path(Some(bad), "path", "/h"),
                Err(Error::Invalid(_))
            ));
        }
        assert!(full_path(None, "path", "/h").is_err());
    }

    #[test]
    fn cursors_round_trip() {
        assert_eq!(unhex(&hex(b"a\xffz")).unwrap(), b"a\xffz");
        assert!(unhex("zz").is_none());
    }
}
