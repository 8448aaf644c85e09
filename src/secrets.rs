//! Secret files (`NAME=value` lines) and the rules they must follow; a value type that never
//! prints itself. (Skeleton: rules land with the secrets work.)

use crate::error::{Error, Result};
use std::fmt;
use std::path::Path;

/// A secret value. `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value (validate it first with [`validate_value`]).
    pub fn new(v: String) -> Secret {
        Secret(v)
    }
    /// The value itself: only for the job's environment and the redactor.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// One secret environment variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretVar {
    pub name: String,
    pub value: Secret,
}

/// Loads a secret file after checking every rule; the error names the file and the rule.
pub fn load_file(path: &Path) -> Result<Vec<SecretVar>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Invalid(format!("secret file {}: {e}", path.display())))?;
    parse(&text).map_err(|m| Error::Invalid(format!("secret file {}: {m}", path.display())))
}

/// Parses `NAME=value` lines (blank lines and `#` comments skipped; last duplicate wins).
pub fn parse(text: &str) -> std::result::Result<Vec<SecretVar>, String> {
    let mut out: Vec<SecretVar> = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let (n, v) = line.split_once('=').ok_or("a line without NAME=")?;
        out.retain(|s| s.name != n);
        out.push(SecretVar {
            name: n.to_string(),
            value: Secret(v.to_string()),
        });
    }
    Ok(out)
}

/// Serializes secrets for the job's own 0600 secrets file.
pub fn serialize(vars: &[SecretVar]) -> String {
    vars.iter()
        .map(|v| format!("{}={}\n", v.name, v.value.expose()))
        .collect()
}
