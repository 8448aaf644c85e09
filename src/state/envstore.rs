//! The persisted environment (`<root>/env.json`, 0600): variables every new job gets. It
//! lives in the state root so it survives agent restarts and snapshot/resume.
//!
//! Each variable remembers whether the scoped token set it. A scoped caller's jobs run as
//! the agent's job user, so what it persists may reach those jobs only: a `PATH` pointing
//! into a folder that user writes, an `LD_PRELOAD`, a `BASH_ENV`, must never reach a job
//! the full token starts as root or as another user. No list of dangerous names is ever
//! complete (`PATH`, `LD_*`, `BASH_ENV`, `ENV`, `PYTHONPATH`, `NODE_OPTIONS`, `GIT_*`,
//! `PERL5OPT`, `PROMPT_COMMAND`…), so the rule is by origin, not by name; and the scoped
//! token may not change or remove what the full token set, which those jobs do get.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::env;
use crate::model::error::{Error, Result};

/// The most variables the store holds.
pub const MAX_VARS: usize = 64;
/// The most bytes of values, all variables together.
pub const MAX_VALUE_BYTES: usize = 32 * 1024;

const FILE: &str = super::layout::ENV_FILE;
const LOCK: &str = super::layout::ENV_LOCK;
const FORMAT_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Stored {
    #[serde(default)]
    format_version: u32,
    #[serde(default)]
    vars: BTreeMap<String, String>,
    /// The names among `vars` that the scoped token set.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    scoped: BTreeSet<String>,
}

/// Who changes the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setter {
    /// The full token (or the operator's CLI).
    Full,
    /// The scoped token: what it sets reaches only jobs of the scoped token's own user.
    Scoped,
}

/// The stored variables, with where they came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Persisted {
    /// Every variable.
    pub vars: BTreeMap<String, String>,
    /// The names among `vars` that the scoped token set.
    pub scoped: BTreeSet<String>,
}

impl Persisted {
    /// The variables a job gets: all of them for a job of the scoped token's own user,
    /// else only those the full token set.
    pub fn for_job(&self, scoped_user: bool) -> BTreeMap<String, String> {
        let mut vars = self.vars.clone();
        if !scoped_user {
            vars.retain(|k, _| !self.scoped.contains(k));
        }
        vars
    }
}

/// Handle on `<root>/env.json`.
#[derive(Debug, Clone)]
pub struct EnvStore {
    root: PathBuf,
}

impl EnvStore {
    /// A handle on the environment under `root`; nothing is touched until it is used.
    pub fn open(root: &Path) -> EnvStore {
        EnvStore {
            root: root.to_path_buf(),
        }
    }

    fn file(&self) -> PathBuf {
        self.root.join(FILE)
    }

    /// The stored variables; a missing file is an empty environment.
    pub fn vars(&self) -> Result<BTreeMap<String, String>> {
        Ok(self.persisted()?.vars)
    }

    /// The stored variables and which of them the scoped token set.
    pub fn persisted(&self) -> Result<Persisted> {
        // No lock: the file is only ever replaced by rename, so a read sees a whole version.
        let path = self.file();
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Persisted::default()),
            Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
        };
        let corrupt = |why: String| {
            Error::Internal(format!(
                "the environment file {} is corrupt: {why}; fix or remove it",
                path.display()
            ))
        };
        let stored: Stored = serde_json::from_slice(&bytes)
            .map_err(|e| corrupt(format!("it does not parse ({e})")))?;
        // A hand-edited file must not smuggle in what `apply` would refuse.
        for (name, value) in &stored.vars {
            check_var(name, value).map_err(|e| corrupt(e.to_string()))?;
        }
        let mut vars = stored.vars;
        // Stored before `apply` refused it; every job's own marker replaces it anyway.
        vars.remove(crate::model::spec::JOB_ENV_MARKER);
        let scoped = stored
            .scoped
            .into_iter()
            .filter(|k| vars.contains_key(k))
            .collect();
        Ok(Persisted { vars, scoped })
    }

    /// The stored variable names, sorted.
    pub fn names(&self) -> Result<Vec<String>> {
        Ok(self.vars()?.into_keys().collect())
    }

    /// Sets the variables in `set` and removes those in `unset`, all or nothing; returns the
    /// sorted names afterwards. With `replace`, the result is exactly `set`: `unset` is
    /// still checked but has nothing left to remove. Unsetting an absent name is not an
    /// error. A name in both `set` and `unset` is refused, as is a result over
    /// [`MAX_VARS`] variables or [`MAX_VALUE_BYTES`] bytes of values; then nothing changes.
    /// A corrupt file is an error, except under `replace`, which never reads it: that is
    /// the way to recover. The scoped token ([`Setter::Scoped`]) may not set, unset or
    /// (by `replace`) remove a variable the full token set (`forbidden`); what it sets is
    /// marked as its own, and what the full token sets is the full token's.
    pub fn apply(
        &self,
        set: &BTreeMap<String, String>,
        unset: &[String],
        replace: bool,
        by: Setter,
    ) -> Result<Vec<String>> {
        for (name, value) in set {
            check_var(name, value)?;
            // Every job gets its own marker; a persisted one would be a forgery.
            env::check_job_name(name)?;
        }
        for name in unset {
            env::check_name(name)?;
            if set.contains_key(name) {
                return Err(Error::Invalid(format!(
                    "variable {name} is both set and unset; name it in one of them only"
                )));
            }
        }
        crate::state::fsutil::ensure_private_dir(&self.root).map_err(|e| {
            Error::io(
                format!("cannot create the state root {}", self.root.display()),
                e,
            )
        })?;
        // Held until the end of this function: serializes read-modify-write across threads
        // and processes (an flock per open file description).
        let _lock = self.lock()?;
        let old = if replace && by == Setter::Full {
            Persisted::default()
        } else {
            self.persisted()?
        };
        if by == Setter::Scoped {
            let full = |k: &String| old.vars.contains_key(k) && !old.scoped.contains(k);
            let touched: Vec<&String> = if replace {
                old.vars.keys().collect()
            } else {
                set.keys().chain(unset).collect()
            };
            if let Some(name) = touched.into_iter().find(|k| full(k)) {
                return Err(Error::Forbidden(format!(
                    "variable {name} was set with the full token, and jobs of every user get \
                     it; the scoped token may only change variables it set itself"
                )));
            }
        }
        let Persisted {
            mut vars,
            mut scoped,
        } = if replace { Persisted::default() } else { old };
        for name in unset {
            vars.remove(name);
            scoped.remove(name);
        }
        for (k, v) in set {
            vars.insert(k.clone(), v.clone());
            match by {
                Setter::Full => scoped.remove(k),
                Setter::Scoped => scoped.insert(k.clone()),
            };
        }
        check_limits(&vars)?;
        let stored = Stored {
            format_version: FORMAT_VERSION,
            vars,
            scoped,
        };
        let data = serde_json::to_vec_pretty(&stored)
            .map_err(|e| Error::Internal(format!("encoding the environment: {e}")))?;
        let path = self.file();
        crate::state::fsutil::write_atomic(&path, &data, 0o600)
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
        Ok(stored.vars.into_keys().collect())
    }

    fn lock(&self) -> Result<File> {
        let path = self.root.join(LOCK);
        let file = crate::state::fsutil::open_lock_file(&path)
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        file.lock()
            .map_err(|e| Error::io(format!("locking {}", path.display()), e))?;
        Ok(file)
    }
}

fn check_var(name: &str, value: &str) -> Result<()> {
    env::check_name(name)?;
    if value.contains('\0') {
        return Err(Error::Invalid(format!(
            "the value of {name} holds a NUL byte; environment values cannot"
        )));
    }
    Ok(())
}

fn check_limits(vars: &BTreeMap<String, String>) -> Result<()> {
    if vars.len() > MAX_VARS {
        return Err(Error::Invalid(format!(
            "the environment would hold {} variables; the limit is {MAX_VARS}",
            vars.len()
        )));
    }
    let bytes: usize = vars.values().map(String::len).sum();
    if bytes > MAX_VALUE_BYTES {
        return Err(Error::Invalid(format!(
            "the environment's values would total {bytes} bytes; the limit is {MAX_VALUE_BYTES} bytes for all values together"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn invalid<T: std::fmt::Debug>(r: Result<T>) -> String {
        match r {
            Err(Error::Invalid(m)) => m,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn missing_file_is_empty() {
        let d = tempfile::tempdir().unwrap();
        let s = EnvStore::open(&d.path().join("nothing-here"));
        assert!(s.vars().unwrap().is_empty());
        assert!(s.names().unwrap().is_empty());
    }

    #[test]
    fn set_unset_replace_and_persist() {
        let d = tempfile::tempdir().unwrap();
        let s = EnvStore::open(d.path());
        let names = s
            .apply(&map(&[("B", "2"), ("A", "1")]), &[], false, Setter::Full)
            .unwrap();
        assert_eq!(names, ["A", "B"]);
        let names = s
            .apply(
                &map(&[("C", "3")]),
                &["A".into(), "GONE".into()],
                false,
                Setter::Full,
            )
            .unwrap();
        assert_eq!(names, ["B", "C"]);
        // A fresh handle (a restarted agent) sees the same.
        let again = EnvStore::open(d.path());
        assert_eq!(again.vars().unwrap(), map(&[("B", "2"), ("C", "3")]));
        let names = again
            .apply(&map(&[("Z", "")]), &["B".into()], true, Setter::Full)
            .unwrap();
        assert_eq!(names, ["Z"]);
        assert_eq!(again.vars().unwrap(), map(&[("Z", "")]));
        let mode = fs::metadata(d.path().join(FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn bad_input_changes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let s = EnvStore::open(d.path());
        s.apply(&map(&[("KEEP", "v")]), &[], false, Setter::Full)
            .unwrap();
        let before = s.vars().unwrap();
        assert!(invalid(s.apply(&map(&[("1X", "v")]), &[], false, Setter::Full)).contains("1X"));
        assert!(invalid(s.apply(&map(&[("X", "a\0b")]), &[], false, Setter::Full)).contains("NUL"));
        let m = invalid(s.apply(
            &map(&[("GITTERM_JOB_ID", "job_0")]),
            &[],
            false,
            Setter::Full,
        ));
        assert!(m.contains("GITTERM_JOB_ID"), "{m}");
        assert!(
            invalid(s.apply(&map(&[]), &["a b".into()], false, Setter::Full)).contains("invalid")
        );
        let m = invalid(s.apply(&map(&[("X", "v")]), &["X".into()], false, Setter::Full));
        assert!(m.contains("both set and unset"), "{m}");
        let m = invalid(s.apply(
            &map(&[("NEW", "v"), ("1BAD", "v")]),
            &[],
            true,
            Setter::Full,
        ));
        assert!(m.contains("1BAD"), "{m}");
        assert_eq!(s.vars().unwrap(), before);
    }

    #[test]
    fn limits_are_checked_on_the_result() {
        let d = tempfile::tempdir().unwrap();
        let s = EnvStore::open(d.path());
        let many: BTreeMap<String, String> = (0..MAX_VARS)
            .map(|i| (format!("V{i}"), "x".into()))
            .collect();
        s.apply(&many, &[], false, Setter::Full).unwrap();
        let m = invalid(s.apply(&map(&[("ONE_MORE", "x")]), &[], false, Setter::Full));
        assert!(m.contains("65") && m.contains("limit is 64"), "{m}");
        // Removing one makes room in the same call.
        s.apply(
            &map(&[("ONE_MORE", "x")]),
            &["V0".into()],
            false,
            Setter::Full,
        )
        .unwrap();
        assert_eq!(s.names().unwrap().len(), MAX_VARS);

        let big = "y".repeat(MAX_VALUE_BYTES / 2);
        let m = invalid(s.apply(
            &map(&[("A", &big), ("B", &big), ("C", "z")]),
            &[],
            true,
            Setter::Full,
        ));
        assert!(m.contains(&MAX_VALUE_BYTES.to_string()), "{m}");
        assert_eq!(s.names().unwrap().len(), MAX_VARS);
        s.apply(&map(&[("A", &big), ("B", &big)]), &[], true, Setter::Full)
            .unwrap();
    }

    #[test]
    fn corrupt_file_is_an_error_naming_it() {
        let d = tempfile::tempdir().unwrap();
        let s = EnvStore::open(d.path());
        for bad in [&b"{not json"[..], br#"{"vars":{"1X":"v"}}"#] {
            fs::write(d.path().join(FILE), bad).unwrap();
            match s.vars() {
                Err(Error::Internal(m)) => assert!(m.contains("env.json") && m.contains("corrupt")),
                other => panic!("{other:?}"),
            }
            assert!(matches!(
                s.apply(&map(&[("A", "1")]), &[], false, Setter::Full),
                Err(Error::Internal(_))
            ));
        }
        // Replacing does not need the old content.
        assert_eq!(
            s.apply(&map(&[("A", "1")]), &[], true, Setter::Full)
                .unwrap(),
            ["A"]
        );
    }

    #[test]
    fn what_the_scoped_token_sets_reaches_only_its_own_users_jobs() {
        let d = tempfile::tempdir().unwrap();
        let s = EnvStore::open(d.path());
        s.apply(&map(&[("LANG", "C.UTF-8")]), &[], false, Setter::Full)
            .unwrap();
        s.apply(
            &map(&[("PATH", "/home/u/bin:/usr/bin"), ("BASH_ENV", "/home/u/x")]),
            &[],
            false,
            Setter::Scoped,
        )
        .unwrap();
        let p = s.persisted().unwrap();
        assert_eq!(p.for_job(true).len(), 3);
        assert_eq!(p.for_job(false), map(&[("LANG", "C.UTF-8")]));
        // The scoped token may not change, remove or replace what the full token set.
        let forbidden = |r: Result<Vec<String>>| match r {
            Err(Error::Forbidden(m)) => assert!(m.contains("LANG"), "{m}"),
            other => panic!("expected Forbidden, got {other:?}"),
        };
        forbidden(s.apply(&map(&[("LANG", "x")]), &[], false, Setter::Scoped));
        forbidden(s.apply(&map(&[]), &["LANG".into()], false, Setter::Scoped));
        forbidden(s.apply(&map(&[("A", "1")]), &[], true, Setter::Scoped));
        assert_eq!(s.persisted().unwrap(), p);
        // It may change its own; once the full token sets a name, it is the full token's.
        s.apply(&map(&[]), &["BASH_ENV".into()], false, Setter::Scoped)
            .unwrap();
        s.apply(&map(&[("PATH", "/usr/bin")]), &[], false, Setter::Full)
            .unwrap();
        let p = s.persisted().unwrap();
        assert!(p.scoped.is_empty());
        assert_eq!(p.for_job(false).len(), 2);
        forbidden_path(s.apply(&map(&[("PATH", "/tmp")]), &[], false, Setter::Scoped));
        // A full replace starts over; a scoped one with only its own variables works.
        s.apply(&map(&[("MINE", "1")]), &[], true, Setter::Full)
            .unwrap();
        s.apply(&map(&[]), &["MINE".into()], false, Setter::Full)
            .unwrap();
        s.apply(&map(&[("S", "1")]), &[], false, Setter::Scoped)
            .unwrap();
        assert_eq!(
            s.apply(&map(&[("T", "2")]), &[], true, Setter::Scoped)
                .unwrap(),
            ["T"]
        );
        assert_eq!(s.persisted().unwrap().for_job(false), map(&[]));
    }

    fn forbidden_path(r: Result<Vec<String>>) {
        match r {
            Err(Error::Forbidden(m)) => assert!(m.contains("PATH"), "{m}"),
            other => panic!("expected Forbidden, got {other:?}"),
        }
    }

    #[test]
    fn concurrent_writers_lose_nothing() {
        let d = tempfile::tempdir().unwrap();
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let root = d.path().to_path_buf();
                std::thread::spawn(move || {
                    let s = EnvStore::open(&root);
                    for j in 0..4 {
                        s.apply(
                            &map(&[(&format!("T{i}_{j}"), "v")]),
                            &[],
                            false,
                            Setter::Full,
                        )
                        .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(EnvStore::open(d.path()).names().unwrap().len(), 32);
    }
}
