//! The persisted environment (`<root>/env.json`, 0600). (Skeleton.)

use crate::error::Result;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The persisted environment of a state root.
pub struct EnvStore {
    #[allow(dead_code)]
    path: PathBuf,
}

impl EnvStore {
    /// The env store of `root`.
    pub fn open(root: &Path) -> EnvStore {
        EnvStore {
            path: root.join("env.json"),
        }
    }
    /// All variables.
    pub fn vars(&self) -> Result<BTreeMap<String, String>> {
        Ok(BTreeMap::new())
    }
}
