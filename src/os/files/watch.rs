//! File watches on inotify: one instance for every watch of the server, read by one
//! thread that holds the job user's file-system credentials, so that every folder it
//! adds (a new subfolder of a recursive watch) and every folder it scans is one the job
//! user may list. What it sees is turned into changes (created, modified, deleted,
//! moved, rescan) named below each watch's folder, and handed on in batches.
//!
//! - Recursive: a watch per folder. A folder created (or moved in) later gets its watch
//!   before it is scanned, and the scan reports what is already in it as created, so that
//!   a file made in it before its watch existed is not missed; a file seen by the scan and
//!   then by its own event is reported once (each scanned name absorbs one creation, until
//!   the queue was read empty once, which is past every event from before the scan).
//! - Moves are paired by cookie: both ends in one watch are one `moved`; a move out of the
//!   watch is a `deleted`, a move in a `created`.
//! - `modified`: a write, a truncation or a change of mode or times; writes to one file
//!   that reach the reader in one batch with nothing between them are one, and the close
//!   after writes (or after its creation) adds none.
//! - A full kernel queue (`IN_Q_OVERFLOW`) is a `rescan` for every watch, whose folders are
//!   then walked again to add what was missed.
//! - The state root and the roots of mounts of it are never watched, and the root's own
//!   entry in its parent is left out; the agent's temporary upload and staging names too.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use nix::sys::stat::{Mode, fstat, fstatat};

use super::guard::{FinalLink, Guard, Id, Intent, id_of, resolve};
use super::{archive, is_dir, is_temp_name, open_folder};

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Created,
    Modified,
    Deleted,
    Moved,
    Rescan,
}

impl Kind {
    /// The contract's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Created => "created",
            Kind::Modified => "modified",
            Kind::Deleted => "deleted",
            Kind::Moved => "moved",
            Kind::Rescan => "rescan",
        }
    }
}

/// One change, named below its watch's folder (`rel` empty: the folder itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub watch: u64,
    pub kind: Kind,
    pub rel: Vec<u8>,
    pub to: Option<Vec<u8>>,
    pub is_dir: bool,
    /// For a rescan: why (`overflow`); for a watch that stopped: why it did.
    pub note: Option<String>,
}

/// Why a watch could not be added.
#[derive(Debug)]
pub enum AddError {
    /// The kernel's limit on watches (`fs.inotify.max_user_watches`) was reached; nothing
    /// of this watch was kept.
    Exhausted(usize),
    Io(io::Error),
}

impl From<io::Error> for AddError {
    fn from(e: io::Error) -> AddError {
        AddError::Io(e)
    }
}

impl From<Errno> for AddError {
    fn from(e: Errno) -> AddError {
        AddError::Io(e.into())
    }
}

const MASK: AddWatchFlags = AddWatchFlags::IN_CREATE
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_MOVED_FROM)
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_MODIFY)
    .union(AddWatchFlags::IN_ATTRIB)
    .union(AddWatchFlags::IN_CLOSE_WRITE)
    .union(AddWatchFlags::IN_DELETE_SELF)
    .union(AddWatchFlags::IN_MOVE_SELF)
    .union(AddWatchFlags::IN_ONLYDIR);

const READ_DIR: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// How long an unpaired `IN_MOVED_FROM` waits for its other half once the queue is empty.
const PAIRING: Duration = Duration::from_millis(10);

/// A folder a kernel watch stands for, in one watch.
#[derive(Debug, Clone)]
struct Folder {
    watch: u64,
    rel: Vec<u8>,
}

struct Wd {
    id: Id,
    folders: Vec<Folder>,
}

struct WatchState {
    /// The folder as the client named it (absolute), for walking it again.
    path: Vec<u8>,
    recursive: bool,
    wds: HashSet<WatchDescriptor>,
    /// The last change handed on, and in which batch.
    last: Option<(Kind, Vec<u8>, u64)>,
    stopped: bool,
}

#[derive(Default)]
struct Inner {
    wds: HashMap<WatchDescriptor, Wd>,
    /// The kernel's numbers of the watches in `wds` (an event read raw carries only that).
    by_raw: HashMap<i32, WatchDescriptor>,
    watches: HashMap<u64, WatchState>,
    /// Names a scan reported as created, per kernel watch: each absorbs one creation.
    scanned: HashMap<WatchDescriptor, HashSet<Vec<u8>>>,
    /// Changes not handed on yet.
    batch: Vec<Change>,
    batch_no: u64,
}

/// Bytes read from the kernel's queue at once: a burst is drained in fewer reads (and
/// fewer takings of the lock), so the queue overflows less often. An event is 16 bytes
/// and its name, padded: some 2,000 events of short names per read.
const READ_BLOCK: usize = 64 << 10;

/// One event as the kernel queues it (`struct inotify_event`), read from a raw block.
struct Event {
    /// The kernel's number of the watch (-1 for an overflow).
    wd: i32,
    mask: AddWatchFlags,
    cookie: u32,
    name: Option<Vec<u8>>,
}

impl Event {
    /// The first event of `block` and what follows it; `None` at its end (the kernel
    /// hands out whole events only).
    fn parse(block: &[u8]) -> Option<(Event, &[u8])> {
        const HEAD: usize = 16;
        let head = block.get(..HEAD)?;
        let word = |i: usize| u32::from_ne_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        let len = word(12) as usize;
        let name = block.get(HEAD..HEAD + len)?;
        let name = name.split(|&b| b == 0).next().unwrap_or_default();
        let ev = Event {
            wd: word(0) as i32,
            mask: AddWatchFlags::from_bits_truncate(word(4)),
            cookie: word(8),
            name: (!name.is_empty()).then(|| name.to_vec()),
        };
        Some((ev, &block[HEAD + len..]))
    }
}

/// The one inotify instance of the server's watches, and what it stands for.
pub struct Engine {
    ino: Inotify,
    inner: Mutex<Inner>,
    /// The state root's parent and the root's name there: the entry never reported.
    root_entry: Option<(Id, Vec<u8>)>,
}

/// A `MOVED_FROM` waiting for its `MOVED_TO`: each watch's name of what left.
struct Pending {
    cookie: u32,
    from: Vec<(u64, Vec<u8>)>,
    is_dir: bool,
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

fn below(path: &[u8], top: &[u8]) -> bool {
    path == top || (path.starts_with(top) && path.get(top.len()) == Some(&b'/'))
}

/// True for the names the agent makes for a moment (an upload's temporary file, an
/// unpack's staging folder): never reported.
fn ours(name: &[u8]) -> bool {
    is_temp_name(std::ffi::OsStr::from_bytes(name)) || archive::is_staging_name(name)
}

impl Engine {
    /// Starts the instance and its reader, which takes `user`'s file-system credentials
    /// (`None`: the agent's own); batches of changes go to `sink`.
    pub fn start(
        user: Option<(u32, u32, Vec<u32>)>,
        root: &std::path::Path,
        sink: Sender<Vec<Change>>,
    ) -> io::Result<Arc<Engine>> {
        let ino = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)?;
        // Made with the agent's eyes, before the reader's credentials change.
        let guard = Guard::new(root, None)?;
        let engine = Arc::new(Engine {
            ino,
            inner: Mutex::new(Inner::default()),
            root_entry: guard.root_entry(),
        });
        let e = Arc::clone(&engine);
        let (ready, started) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("fswatch".into())
            .stack_size(512 << 10)
            .spawn(move || {
                if let Some((uid, gid, groups)) = &user
                    && let Err(err) = super::sys::thread_fs_creds(*uid, *gid, groups)
                {
                    let _ = ready.send(Err(err));
                    return;
                }
                let _ = ready.send(Ok(()));
                e.run(&guard, &sink);
            })?;
        // A reader without the job user's credentials would watch nothing it should:
        // no engine at all, then.
        started
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("the watch reader did not start")))?;
        Ok(engine)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Watches the folder `top` (opened by the caller with the job user's credentials,
    /// which must be this thread's) as watch `watch`, every folder below it too if
    /// `recursive`. All or nothing: on an error nothing of it stays.
    pub fn add(
        &self,
        guard: &Guard,
        watch: u64,
        path: &[u8],
        top: OwnedFd,
        recursive: bool,
    ) -> Result<(), AddError> {
        let mut inner = self.lock();
        inner.watches.insert(
            watch,
            WatchState {
                path: path.to_vec(),
                recursive,
                wds: HashSet::new(),
                last: None,
                stopped: false,
            },
        );
        match self.add_tree(&mut inner, guard, watch, top, Vec::new(), false, true) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.drop_watch(&mut inner, watch);
                Err(e)
            }
        }
    }

    /// Stops watch `watch`.
    pub fn remove(&self, watch: u64) {
        let mut inner = self.lock();
        self.drop_watch(&mut inner, watch);
    }

    fn drop_watch(&self, inner: &mut Inner, watch: u64) {
        let Some(w) = inner.watches.remove(&watch) else {
            return;
        };
        for wd in w.wds {
            self.forget(inner, wd, |f| f.watch == watch);
        }
    }

    /// Takes the folders that `gone` picks off the kernel watch `wd`, and the kernel
    /// watch itself once it stands for none.
    fn forget(&self, inner: &mut Inner, wd: WatchDescriptor, gone: impl Fn(&Folder) -> bool) {
        let Some(w) = inner.wds.get_mut(&wd) else {
            return;
        };
        w.folders.retain(|f| !gone(f));
        if w.folders.is_empty() {
            inner.wds.remove(&wd);
            inner.by_raw.remove(&wd.as_raw());
            inner.scanned.remove(&wd);
            let _ = self.ino.rm_watch(wd);
        }
    }

    /// Adds a kernel watch for the folder `fd` (named `rel` in `watch`) and, for a
    /// recursive watch, for every folder below it; with `scan`, what is in them is
    /// reported as created. `strict`: an unreadable folder is an error (the watch's own
    /// folder), not left out (a subfolder the job user may not list: nothing in it could
    /// be listed either).
    #[allow(clippy::too_many_arguments)]
    fn add_tree(
        &self,
        inner: &mut Inner,
        guard: &Guard,
        watch: u64,
        fd: OwnedFd,
        rel: Vec<u8>,
        scan: bool,
        strict: bool,
    ) -> Result<(), AddError> {
        let recursive = inner.watches.get(&watch).is_some_and(|w| w.recursive);
        let mut todo = vec![(fd, rel)];
        let mut first = true;
        // Each folder once per walk, however it is reached (a bind mount of a folder
        // above it makes a cycle).
        let mut seen: HashSet<Id> = HashSet::new();
        while let Some((fd, rel)) = todo.pop() {
            let st = fstat(&fd)?;
            if guard.hides(&st) || !seen.insert(id_of(&st)) {
                first = false;
                continue;
            }
            let at = format!("/proc/self/fd/{}", fd.as_raw_fd());
            let wd = match self.ino.add_watch(at.as_str(), MASK) {
                Ok(wd) => wd,
                Err(Errno::ENOSPC) => {
                    return Err(AddError::Exhausted(inner.wds.len()));
                }
                Err(e) if first && strict => return Err(e.into()),
                Err(_) => {
                    first = false;
                    continue;
                }
            };
            first = false;
            inner.by_raw.insert(wd.as_raw(), wd);
            let entry = inner.wds.entry(wd).or_insert(Wd {
                id: id_of(&st),
                folders: Vec::new(),
            });
            // Watched already (a walk again after an overflow): its folders are looked
            // at all the same, for those made meanwhile.
            if !entry.folders.iter().any(|f| f.watch == watch) {
                entry.folders.push(Folder {
                    watch,
                    rel: rel.clone(),
                });
            }
            if let Some(w) = inner.watches.get_mut(&watch) {
                w.wds.insert(wd);
            }
            if !scan && !recursive {
                continue;
            }
            let Ok(mut dir) = nix::dir::Dir::openat(&fd, ".", READ_DIR, Mode::empty()) else {
                continue;
            };
            let here = id_of(&st);
            let mut names = Vec::new();
            for e in dir.iter().flatten() {
                let n = e.file_name().to_bytes();
                if n == b"." || n == b".." || ours(n) || self.is_root_entry(here, n) {
                    continue;
                }
                names.push(n.to_vec());
            }
            names.sort_unstable();
            for n in names {
                let Ok(c) = CString::new(n.clone()) else {
                    continue;
                };
                let Ok(cst) = fstatat(&fd, c.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
                    continue;
                };
                let child_dir = is_dir(&cst);
                let name = join(&rel, &n);
                if scan {
                    inner.scanned.entry(wd).or_default().insert(n.clone());
                    self.emit(inner, watch, Kind::Created, name.clone(), None, child_dir);
                }
                if recursive
                    && child_dir
                    && let Ok(cfd) = openat(&fd, c.as_c_str(), READ_DIR, Mode::empty())
                {
                    todo.push((cfd, name));
                }
            }
        }
        Ok(())
    }

    fn is_root_entry(&self, dir: Id, name: &[u8]) -> bool {
        self.root_entry
            .as_ref()
            .is_some_and(|(up, n)| *up == dir && n == name)
    }

    fn emit(
        &self,
        inner: &mut Inner,
        watch: u64,
        kind: Kind,
        rel: Vec<u8>,
        to: Option<Vec<u8>>,
        is_dir: bool,
    ) {
        let batch = inner.batch_no;
        if let Some(w) = inner.watches.get_mut(&watch) {
            w.last = match kind {
                Kind::Created | Kind::Modified => Some((kind, rel.clone(), batch)),
                _ => None,
            };
        }
        inner.batch.push(Change {
            watch,
            kind,
            rel,
            to,
            is_dir,
            note: None,
        });
    }

    /// Opens the folder `rel` of watch `watch` again, by its path, as the job user.
    fn reopen(&self, inner: &Inner, guard: &Guard, watch: u64, rel: &[u8]) -> Option<OwnedFd> {
        let w = inner.watches.get(&watch)?;
        let full = join(&w.path, rel);
        let full = if rel.is_empty() { w.path.clone() } else { full };
        let p = resolve(guard, &full, FinalLink::Keep, Intent::Use).ok()?;
        open_folder(&p).ok()
    }

    /// The reader's loop.
    fn run(&self, guard: &Guard, sink: &Sender<Vec<Change>>) {
        let mut pending: Vec<Pending> = Vec::new();
        let mut buf = vec![0u8; READ_BLOCK];
        loop {
            let wait = if pending.is_empty() {
                Duration::from_secs(1)
            } else {
                PAIRING
            };
            let ready = crate::os::poll::readable(&self.ino, wait).unwrap_or(false);
            if !ready {
                if !pending.is_empty() {
                    let mut inner = self.lock();
                    for p in pending.drain(..) {
                        self.moved_out(&mut inner, p);
                    }
                }
                self.flush(sink);
                continue;
            }
            loop {
                match nix::unistd::read(&self.ino, &mut buf) {
                    Ok(n) if n > 0 => {
                        let mut inner = self.lock();
                        let mut at = &buf[..n];
                        while let Some((ev, rest)) = Event::parse(at) {
                            at = rest;
                            self.one(&mut inner, guard, ev, &mut pending);
                        }
                    }
                    // Read empty: every event from before the last scan is past.
                    Ok(_) | Err(Errno::EAGAIN) => {
                        self.lock().scanned.clear();
                        break;
                    }
                    Err(Errno::EINTR) => {}
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(100));
                        break;
                    }
                }
            }
            if pending.is_empty() {
                self.flush(sink);
            }
        }
    }

    fn flush(&self, sink: &Sender<Vec<Change>>) {
        let mut inner = self.lock();
        inner.batch_no += 1;
        if inner.batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut inner.batch);
        drop(inner);
        let _ = sink.send(batch);
    }

    fn one(&self, inner: &mut Inner, guard: &Guard, ev: Event, pending: &mut Vec<Pending>) {
        let m = ev.mask;
        // The two halves of a rename are queued one after the other: a `MOVED_FROM` that
        // is followed by anything but its `MOVED_TO` was a move out, reported in its place.
        let pairs =
            m.contains(AddWatchFlags::IN_MOVED_TO) && pending.iter().any(|p| p.cookie == ev.cookie);
        if !pairs {
            for p in pending.drain(..) {
                self.moved_out(inner, p);
            }
        }
        if m.contains(AddWatchFlags::IN_Q_OVERFLOW) {
            self.overflow(inner, guard, pending);
            return;
        }
        // A kernel watch already forgotten (its last events, its IN_IGNORED): nothing
        // of ours any more.
        let Some(&ev_wd) = inner.by_raw.get(&ev.wd) else {
            return;
        };
        if m.contains(AddWatchFlags::IN_IGNORED) {
            inner.by_raw.remove(&ev.wd);
            if let Some(w) = inner.wds.remove(&ev_wd) {
                for f in w.folders {
                    if let Some(ws) = inner.watches.get_mut(&f.watch) {
                        ws.wds.remove(&ev_wd);
                    }
                }
            }
            inner.scanned.remove(&ev_wd);
            return;
        }
        let Some(wd) = inner.wds.get(&ev_wd) else {
            return;
        };
        let folders = wd.folders.clone();
        let here = wd.id;
        if m.intersects(AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF) {
            for f in folders.iter().filter(|f| f.rel.is_empty()) {
                if inner.watches.get(&f.watch).is_some_and(|w| w.stopped) {
                    continue;
                }
                self.emit(inner, f.watch, Kind::Deleted, Vec::new(), None, true);
                if let Some(c) = inner.batch.last_mut() {
                    c.note = Some("the watched folder was deleted or moved away".into());
                }
                if let Some(w) = inner.watches.get_mut(&f.watch) {
                    w.stopped = true;
                }
            }
            return;
        }
        let Some(name) = ev.name else {
            return;
        };
        if ours(&name) || self.is_root_entry(here, &name) {
            return;
        }
        let is_dir = m.contains(AddWatchFlags::IN_ISDIR);
        if m.contains(AddWatchFlags::IN_MOVED_FROM) {
            pending.push(Pending {
                cookie: ev.cookie,
                from: folders
                    .iter()
                    .map(|f| (f.watch, join(&f.rel, &name)))
                    .collect(),
                is_dir,
            });
            return;
        }
        if m.contains(AddWatchFlags::IN_MOVED_TO) {
            let from = pending
                .iter()
                .position(|p| p.cookie == ev.cookie)
                .map(|i| pending.remove(i));
            self.moved_in(inner, guard, ev_wd, &folders, &name, is_dir, from);
            return;
        }
        for f in &folders {
            let full = join(&f.rel, &name);
            if m.contains(AddWatchFlags::IN_CREATE) {
                let absorbed = inner
                    .scanned
                    .get_mut(&ev_wd)
                    .is_some_and(|s| s.remove(&name));
                // A name the scan reported was also watched and scanned by it (a folder,
                // with all below it): following it again would report its files twice.
                if !absorbed {
                    self.emit(inner, f.watch, Kind::Created, full.clone(), None, is_dir);
                    self.follow_new(inner, guard, f.watch, &full, is_dir);
                }
            } else if m.contains(AddWatchFlags::IN_DELETE) {
                if let Some(s) = inner.scanned.get_mut(&ev_wd) {
                    s.remove(&name);
                }
                self.emit(inner, f.watch, Kind::Deleted, full, None, is_dir);
            } else if m.intersects(AddWatchFlags::IN_MODIFY | AddWatchFlags::IN_ATTRIB) {
                let batch = inner.batch_no;
                let same = inner.watches.get(&f.watch).is_some_and(|w| {
                    w.last
                        .as_ref()
                        .is_some_and(|(k, p, b)| *k == Kind::Modified && *p == full && *b == batch)
                });
                if !same {
                    self.emit(inner, f.watch, Kind::Modified, full, None, is_dir);
                }
            } else if m.contains(AddWatchFlags::IN_CLOSE_WRITE) {
                let told = inner.watches.get(&f.watch).is_some_and(|w| {
                    w.last.as_ref().is_some_and(|(k, p, _)| {
                        matches!(k, Kind::Modified | Kind::Created) && *p == full
                    })
                });
                if !told {
                    self.emit(inner, f.watch, Kind::Modified, full, None, is_dir);
                }
            }
        }
    }

    /// A folder that appeared in a recursive watch: watched, then scanned.
    fn follow_new(&self, inner: &mut Inner, guard: &Guard, watch: u64, rel: &[u8], is_dir: bool) {
        if !is_dir
            || !inner
                .watches
                .get(&watch)
                .is_some_and(|w| w.recursive && !w.stopped)
        {
            return;
        }
        if let Some(fd) = self.reopen(inner, guard, watch, rel)
            && let Err(AddError::Exhausted(n)) =
                self.add_tree(inner, guard, watch, fd, rel.to_vec(), true, false)
        {
            self.stop(
                inner,
                watch,
                format!(
                    "the kernel's limit on inotify watches (fs.inotify.max_user_watches, {n} \
                     in use here) was reached, so changes below {} are no longer seen; raise \
                     the limit, then delete this watch and create it again",
                    String::from_utf8_lossy(rel)
                ),
            );
        }
    }

    /// A watch that can no longer see everything: one rescan saying why, and no more.
    fn stop(&self, inner: &mut Inner, watch: u64, why: String) {
        self.emit(inner, watch, Kind::Rescan, Vec::new(), None, true);
        if let Some(c) = inner.batch.last_mut() {
            c.note = Some(why);
        }
        if let Some(w) = inner.watches.get_mut(&watch) {
            w.stopped = true;
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn moved_in(
        &self,
        inner: &mut Inner,
        guard: &Guard,
        _wd: WatchDescriptor,
        folders: &[Folder],
        name: &[u8],
        is_dir: bool,
        from: Option<Pending>,
    ) {
        let mut from = from.map(|p| p.from).unwrap_or_default();
        for f in folders {
            let to = join(&f.rel, name);
            match from.iter().position(|(w, _)| *w == f.watch) {
                Some(i) => {
                    let (_, old) = from.remove(i);
                    // A folder moved before its watch was added (made and renamed at once)
                    // is watched and scanned where it went, as a new one would be.
                    let unwatched = is_dir
                        && !inner
                            .wds
                            .values()
                            .any(|w| w.folders.iter().any(|g| g.watch == f.watch && g.rel == old));
                    if is_dir {
                        // Its folders keep their kernel watches: only their names change.
                        for wd in inner.wds.values_mut() {
                            for g in wd.folders.iter_mut().filter(|g| g.watch == f.watch) {
                                if below(&g.rel, &old) {
                                    let mut r = to.clone();
                                    r.extend_from_slice(&g.rel[old.len()..]);
                                    g.rel = r;
                                }
                            }
                        }
                    }
                    self.emit(inner, f.watch, Kind::Moved, old, Some(to.clone()), is_dir);
                    if unwatched {
                        self.follow_new(inner, guard, f.watch, &to, is_dir);
                    }
                }
                None => {
                    self.emit(inner, f.watch, Kind::Created, to.clone(), None, is_dir);
                    self.follow_new(inner, guard, f.watch, &to, is_dir);
                }
            }
        }
        // What left watches that do not hold where it went.
        self.moved_out(
            inner,
            Pending {
                cookie: 0,
                from,
                is_dir,
            },
        );
    }

    /// A move out of a watch: deleted there, and its folders no longer watched by it.
    fn moved_out(&self, inner: &mut Inner, p: Pending) {
        for (watch, old) in p.from {
            if p.is_dir {
                let wds: Vec<WatchDescriptor> = inner
                    .wds
                    .iter()
                    .filter(|(_, w)| {
                        w.folders
                            .iter()
                            .any(|f| f.watch == watch && below(&f.rel, &old))
                    })
                    .map(|(wd, _)| *wd)
                    .collect();
                for wd in wds {
                    self.forget(inner, wd, |f| f.watch == watch && below(&f.rel, &old));
                    if let Some(w) = inner.watches.get_mut(&watch) {
                        w.wds.remove(&wd);
                    }
                }
            }
            self.emit(inner, watch, Kind::Deleted, old, None, p.is_dir);
        }
    }

    /// The kernel dropped events: every watch gets a rescan, and its folders are walked
    /// again to watch those made meanwhile.
    fn overflow(&self, inner: &mut Inner, guard: &Guard, pending: &mut Vec<Pending>) {
        pending.clear();
        inner.scanned.clear();
        let watches: Vec<u64> = inner
            .watches
            .iter()
            .filter(|(_, w)| !w.stopped)
            .map(|(k, _)| *k)
            .collect();
        for watch in watches {
            self.emit(inner, watch, Kind::Rescan, Vec::new(), None, true);
            if let Some(c) = inner.batch.last_mut() {
                c.note = Some("overflow".into());
            }
            if let Some(w) = inner.watches.get_mut(&watch) {
                w.last = None;
            }
            if inner.watches.get(&watch).is_some_and(|w| w.recursive)
                && let Some(fd) = self.reopen(inner, guard, watch, b"")
                && let Err(AddError::Exhausted(n)) =
                    self.add_tree(inner, guard, watch, fd, Vec::new(), false, false)
            {
                self.stop(
                    inner,
                    watch,
                    format!(
                        "the kernel's limit on inotify watches (fs.inotify.max_user_watches, \
                         {n} in use here) was reached; raise it, then delete this watch and \
                         create it again"
                    ),
                );
            }
        }
    }

    /// True once the watch can no longer see everything.
    pub fn stopped(&self, watch: u64) -> bool {
        self.lock().watches.get(&watch).is_none_or(|w| w.stopped)
    }

    /// Kernel watches held now.
    pub fn kernel_watches(&self) -> usize {
        self.lock().wds.len()
    }
}

impl AsFd for Engine {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.ino.as_fd()
    }
}

#[cfg(test)]
mod read_tests {
    use super::*;

    fn raw(wd: i32, mask: u32, cookie: u32, name: &[u8], len: usize) -> Vec<u8> {
        let mut v = Vec::new();
        for w in [wd as u32, mask, cookie, len as u32] {
            v.extend_from_slice(&w.to_ne_bytes());
        }
        let mut n = name.to_vec();
        n.resize(len, 0);
        v.extend_from_slice(&n);
        v
    }

    #[test]
    fn a_raw_block_is_read_event_by_event_and_a_torn_one_is_not_read() {
        let mut block = raw(3, libc::IN_CREATE, 0, b"a.txt", 16);
        block.extend(raw(-1, libc::IN_Q_OVERFLOW, 0, b"", 0));
        block.extend(raw(4, libc::IN_MOVED_TO, 9, b"b", 16));
        let (a, rest) = Event::parse(&block).unwrap();
        assert_eq!(
            (a.wd, a.cookie, a.name.as_deref()),
            (3, 0, Some(&b"a.txt"[..]))
        );
        assert!(a.mask.contains(AddWatchFlags::IN_CREATE));
        let (o, rest) = Event::parse(rest).unwrap();
        assert_eq!((o.wd, o.name), (-1, None));
        assert!(o.mask.contains(AddWatchFlags::IN_Q_OVERFLOW));
        let (b, rest) = Event::parse(rest).unwrap();
        assert_eq!((b.wd, b.cookie, b.name.as_deref()), (4, 9, Some(&b"b"[..])));
        assert!(rest.is_empty() && Event::parse(rest).is_none());
        // A name longer than what is there: not read past the block.
        let torn = raw(5, libc::IN_CREATE, 0, b"c", 16);
        assert!(Event::parse(&torn[..20]).is_none());
    }
}
