//! Whole folders in and out as one tar stream (`tar`, or `tar.gz` through `flate2`): the
//! only module that knows either crate.
//!
//! Packing walks the folder one level open at a time, names sorted, and writes each entry
//! as it is read, so memory goes with a folder's names, not with the tree or a file. It
//! never follows a symlink (it is stored as one), leaves out the state root and whatever
//! the guard refuses, and a first pass ([`check_readable`]) names the first entry the job
//! user cannot read before anything is sent.
//!
//! Unpacking reads the archive as it arrives into a staging folder beside the target,
//! creating every entry itself with `*at` calls from folder descriptors and `O_NOFOLLOW`
//! (never through a path string), checks each entry before it lands, and only once the
//! archive proved whole (its end marker, the gzip trailer, the body's end) moves the
//! entries into place. Any refusal removes the staging folder: the target is as it was.

use std::cell::Cell;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::rc::Rc;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, readlinkat};
use nix::sys::stat::{FileStat, Mode, fstat, fstatat};
use nix::sys::time::TimeSpec;
use nix::unistd::{UnlinkatFlags, unlinkat};

use super::guard::{Guard, Intent, Place, cstr, id_of};
use super::sys::{self, Rename};
use super::{READ_DIR, is_dir, open_folder};

/// The prefix of a staging folder's name (hidden, beside or inside the target).
pub const STAGING_PREFIX: &str = ".gitterm-unpack-";

/// Most entries one archive may hold, in and out.
pub const MAX_ENTRIES: u64 = 1_000_000;
/// Most folder levels below the archived or unpacked folder (each level holds a
/// descriptor while it is walked).
pub const MAX_DEPTH: usize = 128;
/// Longest entry name, and longest symlink target, in bytes.
pub const MAX_NAME: usize = super::MAX_PATH;
/// Largest extension header (PAX records, a GNU long name) read into memory.
const MAX_EXTENSION: u64 = 64 << 10;
/// Most bytes after the end-of-archive marker (tar writers pad to their record size), all
/// zeros; more, or anything else, is refused as not one whole archive.
const MAX_TRAILER: u64 = 1 << 20;
/// The size of the chunks a packed archive is sent in.
const CHUNK: usize = 256 << 10;

/// The two archive forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Tar,
    TarGz,
}

impl Format {
    /// `tar` or `tar.gz`.
    pub fn parse(s: &str) -> Option<Format> {
        match s {
            "tar" => Some(Format::Tar),
            "tar.gz" | "tgz" => Some(Format::TarGz),
            _ => None,
        }
    }

    /// The media type of the archive.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Tar => "application/x-tar",
            Format::TarGz => "application/gzip",
        }
    }
}

/// Why packing could not start or go on.
#[derive(Debug)]
pub enum PackError {
    /// An entry the job user cannot read (its path below the folder, and why).
    Unreadable(String, io::Error),
    /// The tree is deeper than [`MAX_DEPTH`] or holds more than [`MAX_ENTRIES`].
    TooBig(String),
    Io(io::Error),
}

impl From<io::Error> for PackError {
    fn from(e: io::Error) -> PackError {
        PackError::Io(e)
    }
}

impl From<Errno> for PackError {
    fn from(e: Errno) -> PackError {
        PackError::Io(e.into())
    }
}

const READ_FILE: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_NONBLOCK)
    .union(OFlag::O_NOCTTY)
    .union(OFlag::O_CLOEXEC);

fn shown(rel: &[u8]) -> String {
    String::from_utf8_lossy(rel).into_owned()
}

fn join(prefix: &[u8], name: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(prefix.len() + 1 + name.len());
    if !prefix.is_empty() {
        v.extend_from_slice(prefix);
        v.push(b'/');
    }
    v.extend_from_slice(name);
    v
}

/// One folder of a walk: its descriptor, its path below the top, and its names, sorted.
struct Level {
    fd: OwnedFd,
    rel: Vec<u8>,
    names: std::vec::IntoIter<CString>,
}

fn level(fd: OwnedFd, rel: Vec<u8>) -> io::Result<Level> {
    let mut names = Vec::new();
    let mut d = nix::dir::Dir::openat(&fd, ".", READ_DIR, Mode::empty())?;
    for e in d.iter() {
        let e = e?;
        let n = e.file_name();
        if n != c"." && n != c".." {
            names.push(n.to_owned());
        }
    }
    names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Ok(Level {
        fd,
        rel,
        names: names.into_iter(),
    })
}

/// What a walk meets.
enum Met<'a> {
    Dir(&'a [u8], &'a FileStat),
    File(&'a [u8], &'a FileStat, File),
    Link(&'a [u8], &'a FileStat, Vec<u8>),
}

/// Walks the folder `top` depth first, names sorted, calling `f` for each entry it will
/// archive (a folder before what it holds); leaves out what the guard refuses (the state
/// root, a bind mount of it, a hard link into it, the agent's own `/proc`) and what is
/// neither a file, a folder nor a symlink.
fn walk(
    guard: &Guard,
    top: OwnedFd,
    f: &mut dyn FnMut(Met<'_>) -> Result<(), PackError>,
) -> Result<(), PackError> {
    let mut stack = vec![level(top, Vec::new()).map_err(|e| PackError::Unreadable(".".into(), e))?];
    let mut count = 0u64;
    while !stack.is_empty() {
        let depth = stack.len();
        let Some(cur) = stack.last_mut() else { break };
        let Some(name) = cur.names.next() else {
            stack.pop();
            continue;
        };
        let st = match fstatat(&cur.fd, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            // Gone meanwhile: not part of the archive.
            Err(Errno::ENOENT) => continue,
            Err(e) => {
                return Err(PackError::Unreadable(
                    shown(&join(&cur.rel, name.as_bytes())),
                    e.into(),
                ));
            }
        };
        if guard
            .check_entry(cur.fd.as_fd(), &name, &st, Intent::Use)
            .is_err()
        {
            continue;
        }
        let rel = join(&cur.rel, name.as_bytes());
        count += 1;
        if count > MAX_ENTRIES {
            return Err(PackError::TooBig(format!(
                "the folder holds more than {MAX_ENTRIES} entries"
            )));
        }
        let unreadable = |e: Errno| PackError::Unreadable(shown(&rel), e.into());
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => {
                if depth > MAX_DEPTH {
                    return Err(PackError::TooBig(format!(
                        "{} is more than {MAX_DEPTH} folders deep",
                        shown(&rel)
                    )));
                }
                let fd = match openat(&cur.fd, name.as_c_str(), READ_DIR, Mode::empty()) {
                    Ok(fd) => fd,
                    Err(Errno::ENOENT) => continue,
                    Err(e) => return Err(unreadable(e)),
                };
                if id_of(&fstat(&fd)?) != id_of(&st) {
                    return Err(PackError::Io(Errno::ESTALE.into()));
                }
                f(Met::Dir(&rel, &st))?;
                let next =
                    level(fd, rel.clone()).map_err(|e| PackError::Unreadable(shown(&rel), e))?;
                stack.push(next);
            }
            libc::S_IFREG => {
                let fd = match openat(&cur.fd, name.as_c_str(), READ_FILE, Mode::empty()) {
                    Ok(fd) => fd,
                    Err(Errno::ENOENT) => continue,
                    Err(e) => return Err(unreadable(e)),
                };
                let now = fstat(&fd)?;
                if id_of(&now) != id_of(&st) {
                    return Err(PackError::Io(Errno::ESTALE.into()));
                }
                f(Met::File(&rel, &now, File::from(fd)))?;
            }
            libc::S_IFLNK => {
                let target = match readlinkat(&cur.fd, name.as_c_str()) {
                    Ok(t) => t.as_bytes().to_vec(),
                    Err(Errno::ENOENT) => continue,
                    Err(e) => return Err(unreadable(e)),
                };
                f(Met::Link(&rel, &st, target))?;
            }
            // Sockets, FIFOs and device nodes are not content: left out (an unpack
            // refuses them too).
            _ => {}
        }
    }
    Ok(())
}

/// The first pass of a pack: every folder listed and every file opened as the job user,
/// so that an entry it cannot read is named before the answer starts. Returns how many
/// entries the archive will hold.
pub fn check_readable(guard: &Guard, dir: &Place) -> Result<u64, PackError> {
    let top = open_folder(dir).map_err(|e| PackError::Unreadable(".".into(), e))?;
    let mut n = 0;
    walk(guard, top, &mut |_| {
        n += 1;
        Ok(())
    })?;
    Ok(n)
}

/// Sends what it is given in chunks of about [`CHUNK`] bytes.
struct Chunker<'a> {
    out: &'a mut dyn FnMut(&[u8]) -> io::Result<()>,
    buf: Vec<u8>,
}

impl Write for Chunker<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            (self.out)(&self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }
}

/// Exactly `left` bytes of a file: one that shrank while it was read is an error, not a
/// short entry padded with zeros, and what it grew by is left out.
struct Exact {
    file: File,
    left: u64,
    name: String,
}

impl Read for Exact {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        let n = self.file.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{} shrank while it was archived", self.name),
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

fn header(st: &FileStat, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(st.st_mode & 0o7777);
    h.set_uid(u64::from(st.st_uid));
    h.set_gid(u64::from(st.st_gid));
    h.set_mtime(st.st_mtime.max(0) as u64);
    h.set_size(size);
    h
}

fn pack_into<W: Write>(guard: &Guard, top: OwnedFd, w: W) -> Result<W, PackError> {
    let mut b = tar::Builder::new(w);
    walk(guard, top, &mut |met| {
        match met {
            Met::Dir(rel, st) => {
                let mut name = rel.to_vec();
                name.push(b'/');
                let mut h = header(st, tar::EntryType::Directory, 0);
                b.append_data(
                    &mut h,
                    Path::new(std::ffi::OsStr::from_bytes(&name)),
                    io::empty(),
                )?;
            }
            Met::File(rel, st, file) => {
                let size = st.st_size as u64;
                let mut h = header(st, tar::EntryType::Regular, size);
                let data = Exact {
                    file,
                    left: size,
                    name: shown(rel),
                };
                b.append_data(&mut h, Path::new(std::ffi::OsStr::from_bytes(rel)), data)?;
            }
            Met::Link(rel, st, target) => {
                let mut h = header(st, tar::EntryType::Symlink, 0);
                b.append_link(
                    &mut h,
                    Path::new(std::ffi::OsStr::from_bytes(rel)),
                    Path::new(std::ffi::OsStr::from_bytes(&target)),
                )?;
            }
        }
        Ok(())
    })?;
    Ok(b.into_inner()?)
}

/// Packs the folder at `dir` as an archive, handing it to `out` in chunks as it is made.
/// An error after the first chunk leaves the archive short of its end marker, and the
/// caller cuts the answer, so a client never takes a part for the whole.
pub fn pack(
    guard: &Guard,
    dir: &Place,
    format: Format,
    out: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), PackError> {
    let top = open_folder(dir)?;
    let chunker = Chunker {
        out,
        buf: Vec::with_capacity(CHUNK + (64 << 10)),
    };
    let mut chunker = match format {
        Format::Tar => pack_into(guard, top, chunker)?,
        Format::TarGz => {
            // Level 1: a stream is made as fast as a link carries it; on source trees it
            // compresses within a few percent of the default level, at about three
            // times its speed.
            let gz = flate2::write::GzEncoder::new(chunker, flate2::Compression::fast());
            pack_into(guard, top, gz)?.finish()?
        }
    };
    chunker.flush()?;
    Ok(())
}

/// Why an unpack was refused; the target is as it was.
#[derive(Debug)]
pub enum UnpackError {
    /// The archive holds an entry that may not land (named), or is not a whole archive.
    Invalid(String),
    /// It unpacks to more than the cap.
    TooLarge(String),
    /// An entry would land in the state root.
    Forbidden(String),
    /// An entry clashes with what is in the target (a file where the archive has a
    /// folder, or the reverse).
    Conflict(String),
    /// Reading the request body failed (the client's side).
    Body(io::Error),
    Io(io::Error),
}

impl From<io::Error> for UnpackError {
    fn from(e: io::Error) -> UnpackError {
        UnpackError::Io(e)
    }
}

impl From<Errno> for UnpackError {
    fn from(e: Errno) -> UnpackError {
        UnpackError::Io(e.into())
    }
}

/// What an unpack wrote.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unpacked {
    pub entries: u64,
    pub bytes: u64,
}

/// The request body, remembering whether it failed (which is the client's fault, not
/// the archive's).
struct Tap<'a> {
    inner: &'a mut (dyn Read + Send),
    failed: Rc<Cell<bool>>,
}

impl Read for Tap<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf).inspect_err(|_| self.failed.set(true))
    }
}

/// The decompressed archive, counting the bytes read from it.
struct Counted<R> {
    inner: R,
    at: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.at.set(self.at.get() + n as u64);
        Ok(n)
    }
}

/// An entry's name made safe: relative, no `..`, no empty or `.` parts, bounded.
fn clean(raw: &[u8], what: &str) -> Result<Vec<Vec<u8>>, UnpackError> {
    let bad = |why: &str| {
        UnpackError::Invalid(format!(
            "the archive's {what} {:?} {why}; nothing was unpacked",
            shown(raw)
        ))
    };
    if raw.len() > MAX_NAME {
        return Err(bad(&format!("is over {MAX_NAME} bytes")));
    }
    if raw.starts_with(b"/") {
        return Err(bad("is absolute"));
    }
    let mut parts = Vec::new();
    for c in raw.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err(bad("goes up with ..")),
            c if c.len() > 255 => return Err(bad("has a name over 255 bytes")),
            c => parts.push(c.to_vec()),
        }
    }
    if parts.len() > MAX_DEPTH {
        return Err(bad(&format!("is more than {MAX_DEPTH} folders deep")));
    }
    Ok(parts)
}

/// A folder made by the archive, whose mode and time are set once everything is in.
struct DirMeta {
    parts: Vec<Vec<u8>>,
    mode: u32,
    mtime: i64,
    mnsec: i64,
}

/// Opens the folder `parts` below `top`, each part with `O_NOFOLLOW` (never through a
/// symlink), creating missing ones (0700 while the unpack runs) if `create`.
fn open_parts(
    top: BorrowedFd<'_>,
    parts: &[Vec<u8>],
    create: Option<&mut Vec<DirMeta>>,
    entry: &str,
) -> Result<OwnedFd, UnpackError> {
    let mut cur = top.try_clone_to_owned()?;
    let mut made = create;
    for (i, p) in parts.iter().enumerate() {
        let name = cstr(p)?;
        loop {
            match openat(&cur, name.as_c_str(), READ_DIR, Mode::empty()) {
                Ok(fd) => {
                    cur = fd;
                    break;
                }
                Err(Errno::ENOENT) if made.is_some() => {
                    match nix::sys::stat::mkdirat(
                        &cur,
                        name.as_c_str(),
                        Mode::from_bits_truncate(0o700),
                    ) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(e.into()),
                    }
                    if let Some(dirs) = made.as_deref_mut() {
                        dirs.push(DirMeta {
                            parts: parts[..=i].to_vec(),
                            mode: 0o755,
                            mtime: -1,
                            mnsec: 0,
                        });
                    }
                }
                Err(Errno::ELOOP | Errno::ENOTDIR) => {
                    return Err(UnpackError::Invalid(format!(
                        "the archive's entry {entry:?} goes through {:?}, which is not a folder \
                         (a symlink or a file the archive made); nothing was unpacked",
                        shown(&parts[..=i].join(&b'/'))
                    )));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(cur)
}

/// Makes room for a new non-folder entry `name` in `dir`: a file or symlink the archive
/// made earlier under that name goes (the later entry wins, as tar does); a folder stays
/// and the entry is refused.
fn clear_for(dir: BorrowedFd<'_>, name: &CStr, entry: &str) -> Result<(), UnpackError> {
    match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Err(Errno::ENOENT) => Ok(()),
        Ok(st) if is_dir(&st) => Err(UnpackError::Invalid(format!(
            "the archive's entry {entry:?} is a folder earlier in the archive and not a \
             folder here; nothing was unpacked"
        ))),
        Ok(_) => Ok(unlinkat(dir, name, UnlinkatFlags::NoRemoveDir)?),
        Err(e) => Err(e.into()),
    }
}

/// A PAX time (`1796171467.25`): seconds and nanoseconds.
fn pax_time(s: &str) -> Option<(i64, i64)> {
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    let secs: i64 = whole.parse().ok().filter(|&t| t >= 0)?;
    let digits: String = frac.chars().take(9).collect();
    if !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let nsec = if digits.is_empty() {
        0
    } else {
        format!("{digits:0<9}").parse().ok()?
    };
    Some((secs, nsec))
}

fn set_time(dir: BorrowedFd<'_>, name: &CStr, mtime: i64, nsec: i64) {
    if mtime < 0 {
        return;
    }
    let t = TimeSpec::new(mtime, nsec);
    let _ = nix::sys::stat::utimensat(
        dir,
        name,
        &t,
        &t,
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    );
}

/// Removes a staging folder unless disarmed.
struct Staging<'a> {
    guard: &'a Guard,
    at: Option<Place>,
}

impl Drop for Staging<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.at.take() {
            let p = Place {
                st: fstatat(&p.dir, p.name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW).ok(),
                ..p
            };
            // Our folders are 0700 while the unpack runs, so the job user may empty them.
            let _ = super::tree::remove(self.guard, &p, true);
        }
    }
}

/// The bounds of one unpack.
pub struct UnpackOpts<'a> {
    pub format: Format,
    /// Most bytes of file content the archive may unpack to (`--max-file-bytes`).
    pub max_bytes: u64,
    /// Where the staging folder's absolute path is written before it is made (the
    /// server's journal of unpacks in progress), so a start after a crash can remove it.
    pub journal: Option<&'a File>,
}

/// Writes the staging folder's absolute path (`holder`'s real path, then `name`) into
/// `journal`, durably, before the folder exists.
fn note_staging(journal: &File, holder: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let real = std::fs::read_link(format!("/proc/self/fd/{}", holder.as_raw_fd()))?;
    let mut line = real.into_os_string().into_vec();
    if !line.starts_with(b"/") || line.ends_with(b" (deleted)") {
        return Err(Errno::ENOENT.into());
    }
    if !line.ends_with(b"/") {
        line.push(b'/');
    }
    line.extend_from_slice(name.to_bytes());
    let mut j = journal;
    j.write_all(&line)?;
    j.sync_data()
}

/// Removes the staging folder at `path` (absolute) that a server which died in the
/// middle of an unpack left, if it really is one: one of our names, a folder (never
/// followed if a symlink), owned by `owner`. False if there was nothing of ours there.
pub fn remove_left_staging(guard: &Guard, path: &[u8], owner: u32) -> io::Result<bool> {
    let name = path.rsplit(|&b| b == b'/').next().unwrap_or_default();
    if !path.starts_with(b"/") || !is_staging_name(name) {
        return Ok(false);
    }
    let p = match super::resolve(guard, path, super::FinalLink::Keep, Intent::MoveOrRemove) {
        Ok(p) => p,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(false),
        Err(e) => return Err(e),
    };
    match &p.st {
        Some(st) if is_dir(st) && st.st_uid == owner => {}
        _ => return Ok(false),
    }
    super::tree::remove(guard, &p, true)?;
    super::sync_dir(p.dir.as_fd());
    Ok(true)
}

/// Unpacks the archive read from `body` into the folder at `target` (created if
/// missing; its parent must exist): everything is written into a staging folder first,
/// each entry checked, and only a whole valid archive is moved into place, merged into
/// an existing folder as `tar -x` does (a file replaces a file or symlink, a folder is
/// merged into a folder). Any refusal leaves the target as it was, and so does a failure
/// while moving into place (the renames done are undone; see [`merge`]).
pub fn unpack(
    guard: &Guard,
    target: &Place,
    body: &mut (dyn Read + Send),
    o: &UnpackOpts,
) -> Result<Unpacked, UnpackError> {
    let exists = match &target.st {
        Some(st) if is_dir(st) => true,
        Some(_) => {
            return Err(UnpackError::Invalid(
                "the target is not a folder; an archive unpacks into a folder".into(),
            ));
        }
        None => false,
    };
    let stage_name = cstr(format!("{STAGING_PREFIX}{}", super::random_hex()).as_bytes())?;
    // Inside an existing target (the job user may write there, not always beside it: its
    // HOME's parent), else beside the missing one, which it then becomes.
    let holder = if exists {
        open_folder(target)?
    } else {
        target.dir.try_clone()?
    };
    if exists && id_of(&fstat(&holder)?) != target.st.as_ref().map(id_of).unwrap_or_default() {
        return Err(Errno::ESTALE.into());
    }
    if let Some(j) = o.journal {
        note_staging(j, holder.as_fd(), &stage_name)?;
    }
    nix::sys::stat::mkdirat(
        &holder,
        stage_name.as_c_str(),
        Mode::from_bits_truncate(0o700),
    )?;
    let mut staging = Staging {
        guard,
        at: Some(Place {
            dir: holder.try_clone()?,
            name: stage_name.clone(),
            st: None,
        }),
    };
    let stage = openat(&holder, stage_name.as_c_str(), READ_DIR, Mode::empty())?;

    let failed = Rc::new(Cell::new(false));
    let tap = Tap {
        inner: body,
        failed: Rc::clone(&failed),
    };
    let at = Rc::new(Cell::new(0u64));
    let result = match o.format {
        Format::Tar => read_entries(
            Counted {
                inner: tap,
                at: Rc::clone(&at),
            },
            &at,
            stage.as_fd(),
            o,
        ),
        Format::TarGz => read_entries(
            Counted {
                inner: flate2::read::MultiGzDecoder::new(tap),
                at: Rc::clone(&at),
            },
            &at,
            stage.as_fd(),
            o,
        ),
    };
    let (done, root_meta, mut dirs) = match result {
        Ok(r) => r,
        Err(e) if failed.get() => {
            return Err(match e {
                UnpackError::Io(e) | UnpackError::Body(e) => UnpackError::Body(e),
                other => other,
            });
        }
        Err(UnpackError::Io(e)) if e.raw_os_error().is_none() => {
            return Err(UnpackError::Invalid(format!(
                "the body is not a whole {} archive ({e}); nothing was unpacked",
                match o.format {
                    Format::Tar => "tar",
                    Format::TarGz => "tar.gz",
                }
            )));
        }
        Err(e) => return Err(e),
    };

    // Everything is in and checked: into place.
    let top = if exists {
        merge_check(guard, stage.as_fd(), holder.as_fd())?;
        merge(stage.as_fd(), holder.as_fd())?;
        holder
    } else {
        sys::renameat2(
            target.dir.as_fd(),
            &stage_name,
            target.dir.as_fd(),
            &target.name,
            Rename::NoReplace,
        )
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EEXIST) | Some(libc::ENOTEMPTY) => UnpackError::Conflict(
                "the target appeared while the archive was unpacked; retry".into(),
            ),
            _ => e.into(),
        })?;
        staging.at = None;
        let (mode, mtime, mnsec) = root_meta.unwrap_or((0o755, -1, 0));
        let _ = nix::sys::stat::fchmod(&stage, Mode::from_bits_truncate(mode));
        if mtime >= 0 {
            let t = TimeSpec::new(mtime, mnsec);
            let _ = nix::sys::stat::futimens(&stage, &t, &t);
        }
        stage
    };
    // Folders last, deepest first, so that a read-only one was still writable while it
    // filled, and its time is not moved by what went in.
    dirs.sort_by_key(|d| std::cmp::Reverse(d.parts.len()));
    for d in &dirs {
        let Some((last, parents)) = d.parts.split_last() else {
            continue;
        };
        let Ok(parent) = open_parts(top.as_fd(), parents, None, "") else {
            continue;
        };
        let Ok(name) = cstr(last) else { continue };
        if let Ok(fd) = openat(&parent, name.as_c_str(), READ_DIR, Mode::empty()) {
            let _ = nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(d.mode));
        }
        set_time(parent.as_fd(), &name, d.mtime, d.mnsec);
    }
    drop(staging);
    super::sync_dir(top.as_fd());
    Ok(done)
}

type Read3 = (Unpacked, Option<(u32, i64, i64)>, Vec<DirMeta>);

/// Reads every entry into the staging folder; then checks that the archive ended as a
/// whole one does.
fn read_entries<R: Read>(
    input: R,
    at: &Cell<u64>,
    stage: BorrowedFd<'_>,
    o: &UnpackOpts,
) -> Result<Read3, UnpackError> {
    let mut ar = tar::Archive::new(input);
    let mut done = Unpacked::default();
    let mut dirs: Vec<DirMeta> = Vec::new();
    let mut root_meta = None;
    // Where the header after the last entry starts: the end marker is due there.
    let mut next_header = 0u64;
    let mut long_name: Option<Vec<u8>> = None;
    let mut long_link: Option<Vec<u8>> = None;
    let mut pax_path: Option<Vec<u8>> = None;
    let mut pax_link: Option<Vec<u8>> = None;
    let mut pax_size: Option<u64> = None;
    let mut pax_mtime: Option<(i64, i64)> = None;
    let mut seen = 0u64;
    // Raw: extension headers come to us, so that their size is bounded before they are
    // read (the crate would read a long name of any declared size into memory).
    for entry in ar.entries()?.raw(true) {
        let mut entry = entry?;
        seen += 1;
        if seen > MAX_ENTRIES * 2 {
            return Err(UnpackError::Invalid(format!(
                "the archive holds more than {MAX_ENTRIES} entries; nothing was unpacked"
            )));
        }
        let h = entry.header().clone();
        let size = entry.size();
        next_header = entry.raw_file_position() + size.div_ceil(512) * 512;
        let kind = h.entry_type();
        let ext = |e: &mut tar::Entry<'_, R>| -> Result<Vec<u8>, UnpackError> {
            if e.size() > MAX_EXTENSION {
                return Err(UnpackError::Invalid(format!(
                    "the archive has an extension header of {} bytes (at most {MAX_EXTENSION}); \
                     nothing was unpacked",
                    e.size()
                )));
            }
            let mut v = Vec::with_capacity(e.size() as usize);
            e.read_to_end(&mut v)?;
            Ok(v)
        };
        match kind {
            tar::EntryType::GNULongName => {
                let mut v = ext(&mut entry)?;
                while v.last() == Some(&0) {
                    v.pop();
                }
                long_name = Some(v);
                continue;
            }
            tar::EntryType::GNULongLink => {
                let mut v = ext(&mut entry)?;
                while v.last() == Some(&0) {
                    v.pop();
                }
                long_link = Some(v);
                continue;
            }
            tar::EntryType::XHeader => {
                let v = ext(&mut entry)?;
                for rec in tar::PaxExtensions::new(&v) {
                    let rec = rec.map_err(|e| {
                        UnpackError::Invalid(format!(
                            "a malformed PAX header ({e}); nothing was unpacked"
                        ))
                    })?;
                    match rec.key_bytes() {
                        b"path" => pax_path = Some(rec.value_bytes().to_vec()),
                        b"linkpath" => pax_link = Some(rec.value_bytes().to_vec()),
                        b"size" => {
                            pax_size = rec.value().ok().and_then(|s| s.parse().ok());
                        }
                        b"mtime" => pax_mtime = rec.value().ok().and_then(pax_time),
                        _ => {}
                    }
                }
                continue;
            }
            tar::EntryType::XGlobalHeader => {
                ext(&mut entry)?;
                continue;
            }
            _ => {}
        }
        let raw_name = pax_path
            .take()
            .or_else(|| long_name.take())
            .unwrap_or_else(|| h.path_bytes().into_owned());
        let raw_link = pax_link
            .take()
            .or_else(|| long_link.take())
            .or_else(|| h.link_name_bytes().map(|l| l.into_owned()));
        if let Some(ps) = pax_size.take()
            && ps != size
        {
            return Err(UnpackError::Invalid(format!(
                "the archive's entry {:?} has a PAX size that differs from its header's \
                 (entries over 8 GiB in PAX form are not supported); nothing was unpacked",
                shown(&raw_name)
            )));
        }
        let name_shown = shown(&raw_name);
        let parts = clean(&raw_name, "entry")?;
        let mode = h.mode().unwrap_or(0o644) & 0o777;
        // PAX keeps the time's fraction (the header only its rounded seconds).
        let (mtime, mnsec) = pax_mtime.take().unwrap_or_else(|| {
            (
                h.mtime()
                    .map(|t| t.min(i64::MAX as u64) as i64)
                    .unwrap_or(-1),
                0,
            )
        });
        let refuse = |why: &str| {
            UnpackError::Invalid(format!(
                "the archive's entry {name_shown:?} {why}; nothing was unpacked"
            ))
        };
        let no_data = |what: &str| -> Result<(), UnpackError> {
            if size > 0 {
                return Err(refuse(&format!("is a {what} with {size} bytes of data")));
            }
            Ok(())
        };
        let Some((last, parents)) = parts.split_last() else {
            // The archive's own top ("./"): its mode is the target's, if it is made.
            if kind == tar::EntryType::Directory {
                no_data("folder")?;
                root_meta = Some((mode, mtime, mnsec));
                continue;
            }
            return Err(refuse("has no name"));
        };
        done.entries += 1;
        if done.entries > MAX_ENTRIES {
            return Err(UnpackError::Invalid(format!(
                "the archive holds more than {MAX_ENTRIES} entries; nothing was unpacked"
            )));
        }
        match kind {
            tar::EntryType::Char | tar::EntryType::Block => {
                return Err(refuse("is a device node, which is never unpacked"));
            }
            tar::EntryType::Fifo => return Err(refuse("is a FIFO, which is never unpacked")),
            tar::EntryType::GNUSparse => {
                return Err(refuse("is a sparse file, which is not supported"));
            }
            tar::EntryType::Regular
            | tar::EntryType::Continuous
            | tar::EntryType::Directory
            | tar::EntryType::Symlink
            | tar::EntryType::Link => {}
            other => {
                return Err(refuse(&format!(
                    "has the entry type {:?}, which is not unpacked",
                    other.as_byte() as char
                )));
            }
        }
        let parent = open_parts(stage, parents, Some(&mut dirs), &name_shown)?;
        let name = cstr(last)?;
        match kind {
            tar::EntryType::Directory => {
                no_data("folder")?;
                match nix::sys::stat::mkdirat(
                    &parent,
                    name.as_c_str(),
                    Mode::from_bits_truncate(0o700),
                ) {
                    Ok(()) => {}
                    Err(Errno::EEXIST) => {
                        let st = fstatat(&parent, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)?;
                        if !is_dir(&st) {
                            return Err(refuse(
                                "is a folder, and a file or symlink earlier in the archive",
                            ));
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
                // A folder named twice is set twice, the later entry last (the sort
                // below is stable), as tar does; no search through the list.

                dirs.push(DirMeta {
                    parts: parts.clone(),
                    mode,
                    mtime,
                    mnsec,
                });
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                done.bytes = done.bytes.saturating_add(size);
                if done.bytes > o.max_bytes {
                    return Err(UnpackError::TooLarge(format!(
                        "the archive unpacks to more than {} bytes of files (--max-file-bytes), \
                         {name_shown:?} passing it; nothing was unpacked",
                        o.max_bytes
                    )));
                }
                clear_for(parent.as_fd(), &name, &name_shown)?;
                let fd = openat(
                    &parent,
                    name.as_c_str(),
                    OFlag::O_CREAT
                        | OFlag::O_EXCL
                        | OFlag::O_WRONLY
                        | OFlag::O_NOFOLLOW
                        | OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(0o600),
                )?;
                let mut f = File::from(fd);
                let copied = io::copy(&mut (&mut entry).take(size), &mut f)?;
                if copied != size {
                    return Err(UnpackError::Io(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("the archive ends inside {name_shown:?}"),
                    )));
                }
                nix::sys::stat::fchmod(&f, Mode::from_bits_truncate(mode))?;
                if mtime >= 0 {
                    let t = TimeSpec::new(mtime, mnsec);
                    let _ = nix::sys::stat::futimens(&f, &t, &t);
                }
            }
            tar::EntryType::Symlink => {
                no_data("symlink")?;
                let target = raw_link
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| refuse("is a symlink without a target"))?;
                if target.len() > MAX_NAME {
                    return Err(refuse(&format!(
                        "is a symlink whose target is over {MAX_NAME} bytes"
                    )));
                }
                clear_for(parent.as_fd(), &name, &name_shown)?;
                let t =
                    cstr(&target).map_err(|_| refuse("is a symlink whose target holds a NUL"))?;
                nix::unistd::symlinkat(t.as_c_str(), &parent, name.as_c_str())?;
                set_time(parent.as_fd(), &name, mtime, mnsec);
            }
            tar::EntryType::Link => {
                no_data("hard link")?;
                let target = raw_link.ok_or_else(|| refuse("is a hard link without a target"))?;
                let tparts = clean(&target, "hard link target")?;
                let Some((tlast, tparents)) = tparts.split_last() else {
                    return Err(refuse("is a hard link to the archive's top"));
                };
                let outside = || {
                    refuse(&format!(
                        "is a hard link to {:?}, which is not a file earlier in the archive",
                        shown(&target)
                    ))
                };
                let tdir = open_parts(stage, tparents, None, &name_shown).map_err(|_| outside())?;
                let tname = cstr(tlast)?;
                match fstatat(&tdir, tname.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                    Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG => {}
                    _ => return Err(outside()),
                }
                clear_for(parent.as_fd(), &name, &name_shown)?;
                nix::unistd::linkat(
                    &tdir,
                    tname.as_c_str(),
                    &parent,
                    name.as_c_str(),
                    AtFlags::empty(),
                )?;
            }
            _ => unreachable!("entry types are sorted above"),
        }
    }
    if long_name.is_some() || long_link.is_some() || pax_path.is_some() {
        return Err(UnpackError::Invalid(
            "the archive ends with a header that names an entry that never comes; nothing was \
             unpacked"
                .into(),
        ));
    }
    // The crate stops at a zero block or at the end of the input: only the first is a
    // whole archive (an archive cut between two entries reads as a shorter one).
    if at.get() < next_header + 512 {
        return Err(UnpackError::Invalid(
            "the archive is cut short: it has no end-of-archive marker; nothing was unpacked"
                .into(),
        ));
    }
    // The rest is padding to the writer's record size; reading it to its end checks the
    // gzip trailer and that the body ended as announced.
    let mut rest = ar.into_inner();
    let mut buf = [0u8; 8192];
    let mut trailer = 0u64;
    loop {
        let n = rest.read(&mut buf)?;
        if n == 0 {
            break;
        }
        trailer += n as u64;
        if trailer > MAX_TRAILER || buf[..n].iter().any(|&b| b != 0) {
            return Err(UnpackError::Invalid(
                "there is data after the end of the archive; send one archive; nothing was \
                 unpacked"
                    .into(),
            ));
        }
    }
    Ok((done, root_meta, dirs))
}

/// One folder of a merge: the staged folder, the target's, and the staged names.
struct Pair {
    stage: OwnedFd,
    target: OwnedFd,
    rel: Vec<u8>,
    names: std::vec::IntoIter<CString>,
}

fn pair(stage: OwnedFd, target: OwnedFd, rel: Vec<u8>) -> io::Result<Pair> {
    let l = level(stage, rel)?;
    Ok(Pair {
        stage: l.fd,
        target,
        rel: l.rel,
        names: l.names,
    })
}

/// What to do with one staged entry.
enum Step {
    /// Nothing there: move it in.
    Move,
    /// A file or symlink there: replace it.
    Replace,
    /// Both are folders: merge them.
    Descend(OwnedFd, OwnedFd),
}

fn step(guard: &Guard, p: &Pair, name: &CStr) -> Result<Step, UnpackError> {
    let rel = shown(&join(&p.rel, name.to_bytes()));
    let staged = fstatat(&p.stage, name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
    let there = match fstatat(&p.target, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Err(Errno::ENOENT) => return Ok(Step::Move),
        Err(e) => return Err(e.into()),
        Ok(st) => st,
    };
    let name_c = name.to_owned();
    // A folder merged into is entered (the state root's parents may be); anything else
    // there is replaced.
    let intent = if is_dir(&staged) && is_dir(&there) {
        Intent::Use
    } else {
        Intent::MoveOrRemove
    };
    if guard
        .check_entry(p.target.as_fd(), &name_c, &there, intent)
        .is_err()
    {
        return Err(UnpackError::Forbidden(format!(
            "the archive's entry {rel:?} would land in the agent's state root, which is never \
             written; nothing was unpacked"
        )));
    }
    match (is_dir(&staged), is_dir(&there)) {
        (false, false) => Ok(Step::Replace),
        (true, true) => {
            let s = openat(&p.stage, name, READ_DIR, Mode::empty())?;
            let t = openat(&p.target, name, READ_DIR, Mode::empty())?;
            if id_of(&fstat(&t)?) != id_of(&there) {
                return Err(Errno::ESTALE.into());
            }
            Ok(Step::Descend(s, t))
        }
        (true, false) if there.st_mode & libc::S_IFMT == libc::S_IFLNK => {
            Err(UnpackError::Invalid(format!(
                "the archive's entry {rel:?} is a folder, and the target has a symlink there, \
                 which is never followed; nothing was unpacked"
            )))
        }
        (true, false) => Err(UnpackError::Conflict(format!(
            "the archive's entry {rel:?} is a folder, and the target has a file there; remove \
             it first; nothing was unpacked"
        ))),
        (false, true) => Err(UnpackError::Conflict(format!(
            "the archive's entry {rel:?} is not a folder, and the target has a folder there; \
             remove it first; nothing was unpacked"
        ))),
    }
}

/// Checks that the staged tree can be merged into the target: no clash of a folder with
/// a file, no symlink where a folder goes, nothing into the state root.
fn merge_check(
    guard: &Guard,
    stage: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
) -> Result<(), UnpackError> {
    let mut stack = vec![pair(
        stage.try_clone_to_owned()?,
        target.try_clone_to_owned()?,
        Vec::new(),
    )?];
    while let Some(p) = stack.last_mut() {
        let Some(name) = p.names.next() else {
            stack.pop();
            continue;
        };
        if let Step::Descend(s, t) = step(guard, p, &name)? {
            let rel = join(&p.rel, name.as_bytes());
            stack.push(pair(s, t, rel)?);
        }
    }
    Ok(())
}

/// One rename of a merge, as it is undone.
enum Done {
    /// Moved in where nothing was: moved back.
    Moved(usize, CString),
    /// Swapped with the target's file, whose old one is now staged: swapped back.
    Swapped(usize, CString),
}

/// Moves the staged tree into the target (checked by [`merge_check`]): each entry with
/// nothing there by one rename, each file over a file by an exchange (the old one lands
/// in the staging folder, removed with it), folders merged. Should a rename fail (the
/// target changed meanwhile, a mount point in it), every rename done is undone, in
/// reverse, and the target is as it was; what could not be put back is named.
fn merge(stage: BorrowedFd<'_>, target: BorrowedFd<'_>) -> Result<(), UnpackError> {
    // The folders merged into, by their names below the top, and the renames done in
    // them: what an undo needs (names, not descriptors: a tree may hold more folders
    // than a process may hold open files).
    let mut folders: Vec<Vec<Vec<u8>>> = vec![Vec::new()];
    let mut done: Vec<Done> = Vec::new();
    let r = merge_into(stage, target, &mut folders, &mut done);
    let Err(e) = r else {
        return Ok(());
    };
    let mut left = Vec::new();
    for d in done.into_iter().rev() {
        let (i, name, how) = match d {
            Done::Moved(i, n) => (i, n, Rename::NoReplace),
            Done::Swapped(i, n) => (i, n, Rename::Exchange),
        };
        let back = (|| -> Result<(), UnpackError> {
            let s = open_parts(stage, &folders[i], None, "")?;
            let t = open_parts(target, &folders[i], None, "")?;
            Ok(sys::renameat2(t.as_fd(), &name, s.as_fd(), &name, how)?)
        })();
        if back.is_err() {
            let mut rel = folders[i].join(&b'/');
            rel = join(&rel, name.as_bytes());
            left.push(shown(&rel));
        }
    }
    if left.is_empty() {
        return Err(e);
    }
    let more = if left.len() > 5 {
        format!(" and {} more", left.len() - 5)
    } else {
        String::new()
    };
    left.truncate(5);
    Err(UnpackError::Conflict(format!(
        "moving the archive into place failed ({}), and these entries could not be put back \
         (the target changed meanwhile): {}{more}; they hold the archive's version",
        describe(&e),
        left.join(", ")
    )))
}

fn describe(e: &UnpackError) -> String {
    match e {
        UnpackError::Invalid(m)
        | UnpackError::TooLarge(m)
        | UnpackError::Forbidden(m)
        | UnpackError::Conflict(m) => m.clone(),
        UnpackError::Body(e) | UnpackError::Io(e) => e.to_string(),
    }
}

fn merge_into(
    stage: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    folders: &mut Vec<Vec<Vec<u8>>>,
    done: &mut Vec<Done>,
) -> Result<(), UnpackError> {
    let mut stack = vec![(
        pair(
            stage.try_clone_to_owned()?,
            target.try_clone_to_owned()?,
            Vec::new(),
        )?,
        0usize,
    )];
    while let Some((p, at)) = stack.last_mut() {
        let at = *at;
        let Some(name) = p.names.next() else {
            stack.pop();
            continue;
        };
        let rel = || shown(&join(&p.rel, name.as_bytes()));
        let staged = fstatat(&p.stage, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)?;
        let there = match fstatat(&p.target, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Some(st),
            Err(Errno::ENOENT) => None,
            Err(e) => return Err(e.into()),
        };
        let how = match &there {
            None => Rename::NoReplace,
            Some(t) if !is_dir(&staged) && !is_dir(t) => Rename::Exchange,
            Some(t) if is_dir(&staged) && is_dir(t) => {
                let s = openat(&p.stage, name.as_c_str(), READ_DIR, Mode::empty())?;
                let tt = openat(&p.target, name.as_c_str(), READ_DIR, Mode::empty())?;
                let mut parts = folders[at].clone();
                parts.push(name.as_bytes().to_vec());
                folders.push(parts);
                let child = pair(s, tt, join(&p.rel, name.as_bytes()))?;
                stack.push((child, folders.len() - 1));
                continue;
            }
            Some(_) => {
                return Err(UnpackError::Conflict(format!(
                    "{:?} changed while the archive was moved into place; retry",
                    rel()
                )));
            }
        };
        match sys::renameat2(p.stage.as_fd(), &name, p.target.as_fd(), &name, how) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                return Err(UnpackError::Conflict(format!(
                    "{:?} is on another file system than the target (a mount point in it): \
                     an archive is moved into place by renames, which cannot cross one; \
                     unpack into the mounted folder on its own; nothing was unpacked",
                    shown(&p.rel)
                )));
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                return Err(UnpackError::Conflict(format!(
                    "{:?} appeared while the archive was moved into place; retry",
                    rel()
                )));
            }
            Err(e) => return Err(e.into()),
        }
        done.push(match how {
            Rename::Exchange => Done::Swapped(at, name),
            _ => Done::Moved(at, name),
        });
    }
    Ok(())
}

/// True if `name` is one of our staging folders' names.
pub fn is_staging_name(name: &[u8]) -> bool {
    name.strip_prefix(STAGING_PREFIX.as_bytes())
        .is_some_and(|r| r.len() == 16 && r.iter().all(u8::is_ascii_hexdigit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_cleaned_or_refused() {
        assert_eq!(
            clean(b"./a//b/./c", "entry").unwrap(),
            vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
        );
        assert!(clean(b"./", "entry").unwrap().is_empty());
        for bad in [&b"/etc/passwd"[..], b"a/../../x", b"..", &[b'a'; 300][..]] {
            assert!(
                matches!(clean(bad, "entry"), Err(UnpackError::Invalid(_))),
                "{bad:?}"
            );
        }
        assert!(is_staging_name(b".gitterm-unpack-0123456789abcdef"));
        assert_eq!(pax_time("12.5"), Some((12, 500_000_000)));
        assert_eq!(pax_time("12"), Some((12, 0)));
        assert_eq!(pax_time("-1"), None);
        assert!(!is_staging_name(b".gitterm-unpack-x"));
    }
}
