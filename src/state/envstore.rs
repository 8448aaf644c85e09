//! The persisted environment (`<root>/env.json`, 0600): variables every new job gets. It
//! lives in the state root so it survives agent restarts and snapshot/resume.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::error::{Error, Result};
use crate::model::secret::validate_name;

/// The most variables the store holds.
pub const MAX_VARS: usize = 64;
/// The most bytes of values, all variables together.
pub const MAX_VALUE_BYTES: usize = 32 * 1024;

const FILE: &str = "env.json";
const LOCK: &str = "env.lock";
const FORMAT_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Stored {
    #[serde(default)]
    format_version: u32,
    #[serde(default)]
    vars: BTreeMap<String, String>,
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
        // No lock: the file is only ever replaced by rename, so a read sees a whole version.
        let path = self.file();
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
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
        Ok(stored.vars)
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
    /// the way to recover.
    pub fn apply(
        &self,
        set: &BTreeMap<String, String>,
        unset: &[String],
        replace: bool,
    ) -> Result<Vec<String>> {
        for (name, value) in set {
            check_var(name, value)?;
        }
        for name in unset {
            validate_name(name)?;
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
        let mut vars = if replace {
            BTreeMap::new()
        } else {
            self.vars()?
        };
        for name in unset {
            vars.remove(name);
        }
        vars.extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
        check_limits(&vars)?;
        let stored = Stored {
            format_version: FORMAT_VERSION,
            vars,
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
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        file.lock()
            .map_err(|e| Error::io(format!("locking {}", path.display()), e))?;
        Ok(file)
    }
}

fn check_var(name: &str, value: &str) -> Result<()> {
    validate_name(name)?;
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
            .apply(&map(&[("B", "2"), ("A", "1")]), &[], false)
            .unwrap();
        assert_eq!(names, ["A", "B"]);
        let names = s
            .apply(&map(&[("C", "3")]), &["A".into(), "GONE".into()], false)
            .unwrap();
        assert_eq!(names, ["B", "C"]);
        // A fresh handle (a restarted agent) sees the same.
        let again = EnvStore::open(d.path());
        assert_eq!(again.vars().unwrap(), map(&[("B", "2"), ("C", "3")]));
        let names = again
            .apply(&map(&[("Z", "")]), &["B".into()], true)
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
        s.apply(&map(&[("KEEP", "v")]), &[], false).unwrap();
        let before = s.vars().unwrap();
        assert!(invalid(s.apply(&map(&[("1X", "v")]), &[], false)).contains("1X"));
        assert!(invalid(s.apply(&map(&[("X", "a\0b")]), &[], false)).contains("NUL"));
        assert!(invalid(s.apply(&map(&[]), &["a b".into()], false)).contains("invalid"));
        let m = invalid(s.apply(&map(&[("X", "v")]), &["X".into()], false));
        assert!(m.contains("both set and unset"), "{m}");
        let m = invalid(s.apply(&map(&[("NEW", "v"), ("1BAD", "v")]), &[], true));
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
        s.apply(&many, &[], false).unwrap();
        let m = invalid(s.apply(&map(&[("ONE_MORE", "x")]), &[], false));
        assert!(m.contains("65") && m.contains("limit is 64"), "{m}");
        // Removing one makes room in the same call.
        s.apply(&map(&[("ONE_MORE", "x")]), &["V0".into()], false)
            .unwrap();
        assert_eq!(s.names().unwrap().len(), MAX_VARS);

        let big = "y".repeat(MAX_VALUE_BYTES / 2);
        let m = invalid(s.apply(&map(&[("A", &big), ("B", &big), ("C", "z")]), &[], true));
        assert!(m.contains(&MAX_VALUE_BYTES.to_string()), "{m}");
        assert_eq!(s.names().unwrap().len(), MAX_VARS);
        s.apply(&map(&[("A", &big), ("B", &big)]), &[], true)
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
                s.apply(&map(&[("A", "1")]), &[], false),
                Err(Error::Internal(_))
            ));
        }
        // Replacing does not need the old content.
        assert_eq!(s.apply(&map(&[("A", "1")]), &[], true).unwrap(), ["A"]);
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
                        s.apply(&map(&[(&format!("T{i}_{j}"), "v")]), &[], false)
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
