//! Users for jobs that run as someone else: each made with `useradd` for one test and
//! removed with its home when the test ends, after a check that none of its processes
//! is left.

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::procs::{kill, proc_state};
use super::skip::skip_root;

/// One test at a time edits the user database (useradd locks it and fails when busy).
static USER_DB: Mutex<()> = Mutex::new(());
static SERIAL: AtomicUsize = AtomicUsize::new(0);

/// A user made for one test, with a home folder, `/bin/bash` as its shell and one
/// supplementary group. Dropping it fails the test (unless it is already failing) if any
/// process of the user is still alive, kills those, and removes the user, its home and
/// its group.
pub struct TestUser {
    pub name: String,
    pub uid: u32,
    /// Primary group.
    pub gid: u32,
    pub home: PathBuf,
    /// The supplementary group's name and id.
    pub group: String,
    pub group_id: u32,
}

/// True when the tests run as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Runs a user-database tool, retrying while another process holds its lock.
fn userdb(program: &str, args: &[&str]) -> Result<(), String> {
    let _one = USER_DB.lock().unwrap_or_else(|e| e.into_inner());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{program}: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        // Exit 1 and 10 are "cannot lock or update the file": someone else is at it.
        let busy = matches!(out.status.code(), Some(1) | Some(10)) && err.contains("lock");
        if !busy || Instant::now() >= deadline {
            return Err(format!("{program} {args:?}: {}: {err}", out.status));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The id (field 3) and the next field as a number (0 if it is not one) of the entry
/// `name` in a file like /etc/passwd or /etc/group.
fn ids(file: &str, name: &str) -> Option<(u32, u32)> {
    let text = fs::read_to_string(file).ok()?;
    let f: Vec<&str> = text
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 4 && f[0] == name)?;
    Some((f[2].parse().ok()?, f[3].parse().unwrap_or(0)))
}

impl TestUser {
    /// A fresh user whose name starts with `gt` and `tag` (a few lowercase letters), or
    /// `None` where the tests do not run as root or the tools are missing: then this has
    /// already called [`skip_root`] for the test, which returns (or skips the part that
    /// needs another user).
    pub fn create(tag: &str) -> Option<TestUser> {
        if !is_root() {
            skip_root("not root, so no job user can be made");
            return None;
        }
        let n = SERIAL.fetch_add(1, Ordering::Relaxed);
        let name = format!("gt{tag}{}x{n}", std::process::id());
        assert!(name.len() <= 32, "user name {name} is too long");
        let group = format!("{name}g");
        if let Err(e) = userdb("groupadd", &[&group]) {
            skip_root(&format!("cannot make a group for a job user ({e})"));
            return None;
        }
        if let Err(e) = userdb("useradd", &["-m", "-s", "/bin/bash", "-U", &name]) {
            let _ = userdb("groupdel", &[&group]);
            skip_root(&format!("cannot make a job user ({e})"));
            return None;
        }
        userdb("usermod", &["-aG", &group, &name]).expect("add the supplementary group");
        let (uid, gid) = ids("/etc/passwd", &name).expect("the new user in /etc/passwd");
        let (group_id, _) = ids("/etc/group", &group).expect("the new group in /etc/group");
        let home = PathBuf::from(format!("/home/{name}"));
        assert!(home.is_dir(), "useradd -m made no {}", home.display());
        Some(TestUser {
            name,
            uid,
            gid,
            home,
            group,
            group_id,
        })
    }

    /// A file in the user's home (where its jobs start and may write).
    pub fn file(&self, name: &str) -> PathBuf {
        self.home.join(name)
    }

    /// Live processes of this user.
    pub fn processes(&self) -> Vec<i32> {
        uid_processes(self.uid)
    }
}

/// Live (non-zombie, or zombie leader with a live thread) processes whose real or
/// effective uid is `uid`.
pub fn uid_processes(uid: u32) -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
                return false;
            };
            let of_uid = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .is_some_and(|ids| ids.split_whitespace().take(2).any(|u| u.parse() == Ok(uid)));
            of_uid && super::procs::group_alive(pid)
        })
        .collect()
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let mut left = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let now = self.processes();
            if now.is_empty() {
                break;
            }
            if left.is_empty() {
                left = now
                    .iter()
                    .map(|&p| {
                        let cmd = fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                        let state = proc_state(p).unwrap_or('?');
                        format!(
                            "{p} ({state}) {}",
                            String::from_utf8_lossy(&cmd).replace('\0', " ")
                        )
                    })
                    .collect();
            }
            for p in now {
                kill(p, libc::SIGKILL);
            }
            if Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let removed = userdb("userdel", &["-r", &self.name]);
        let _ = userdb("groupdel", &[&self.group]);
        if std::thread::panicking() {
            return;
        }
        assert!(
            left.is_empty(),
            "processes of job user {} (uid {}) outlived the test (now killed): {left:#?}",
            self.name,
            self.uid
        );
        // userdel -r complains about a mail spool it did not find; the user is gone all
        // the same.
        if let Err(e) = removed {
            assert!(
                ids("/etc/passwd", &self.name).is_none(),
                "user {} was not removed: {e}",
                self.name
            );
        }
    }
}
