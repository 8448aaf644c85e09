//! Secret files (`NAME=value` lines) and the rules they must follow; a value type that never
//! prints itself.
//!
//! Every message here names the file, line or variable at fault but never a value: these
//! messages reach logs and HTTP clients.

use crate::model::env::{NAME_RULE, check_name, is_valid_name};
use crate::model::error::{Error, Result};
use std::fmt;

/// The shortest secret value, in characters: masking shorter values would mangle ordinary
/// output and hide next to nothing.
pub const MIN_VALUE_CHARS: usize = 4;

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

impl fmt::Display for SecretVar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.value)
    }
}

/// Parses `NAME=value` lines. Blank lines and lines whose first non-blank character is `#`
/// are skipped. Nothing is trimmed or unquoted: the value is everything after the first `=`.
/// When a name repeats, the last line wins. At least one variable is required. The error
/// names the line, never its value.
pub fn parse(text: &str) -> std::result::Result<Vec<SecretVar>, String> {
    let mut out: Vec<SecretVar> = Vec::new();
    // Split on '\n' only: `str::lines` would silently drop the '\r' of CRLF files, and a
    // value holding '\r' must be refused, not quietly changed.
    for (i, line) in text.split('\n').enumerate() {
        let n = i + 1;
        let blank = line.trim();
        if blank.is_empty() || blank.starts_with('#') {
            continue;
        }
        let (name, value) = line
            .split_once('=')
            .ok_or_else(|| format!("line {n} has no '='; each line must be NAME=value"))?;
        if !is_valid_name(name) {
            // The text before '=' could be part of a pasted secret: do not echo it.
            return Err(format!("line {n}: {NAME_RULE}"));
        }
        value_rule(value).map_err(|rule| format!("line {n}: the value of {name} {rule}"))?;
        out.retain(|s| s.name != name);
        out.push(SecretVar {
            name: name.to_string(),
            value: Secret(value.to_string()),
        });
    }
    if out.is_empty() {
        return Err("it holds no variables; it needs at least one NAME=value line".to_string());
    }
    Ok(out)
}

/// Serializes secrets for the job's own 0600 secrets file.
pub fn serialize(vars: &[SecretVar]) -> String {
    vars.iter()
        .map(|v| format!("{}={}\n", v.name, v.value.expose()))
        .collect()
}

/// Builds secrets from the API's `secretEnv` object: string values only, and the same name
/// and value rules as files. Messages name the variable, never the value.
pub fn from_map(map: &serde_json::Map<String, serde_json::Value>) -> Result<Vec<SecretVar>> {
    let mut out = Vec::with_capacity(map.len());
    for (name, value) in map {
        check_name(name).map_err(|e| Error::Invalid(format!("secretEnv: {e}")))?;
        let serde_json::Value::String(value) = value else {
            return Err(Error::Invalid(format!(
                "secretEnv.{name} must be a string; secret values are strings"
            )));
        };
        validate_value(name, value).map_err(|e| Error::Invalid(format!("secretEnv.{e}")))?;
        out.push(SecretVar {
            name: name.clone(),
            value: Secret(value.clone()),
        });
    }
    Ok(out)
}

/// Checks a secret value: at least [`MIN_VALUE_CHARS`] characters, and no CR, LF or NUL
/// (the job's secrets file is line-based, and NUL cannot reach an environment). The message
/// names `name`, never the value.
pub fn validate_value(name: &str, value: &str) -> Result<()> {
    value_rule(value).map_err(|rule| Error::Invalid(format!("{name}: its value {rule}")))
}

fn value_rule(value: &str) -> std::result::Result<(), String> {
    if value.is_empty() {
        return Err("is empty; secret values must not be empty".to_string());
    }
    if value.contains('\r') {
        return Err("holds a carriage return (\\r); secret values must be one line".to_string());
    }
    if value.contains('\n') {
        return Err("holds a line feed (\\n); secret values must be one line".to_string());
    }
    if value.contains('\0') {
        return Err("holds a NUL byte; environment values cannot".to_string());
    }
    let chars = value.chars().count();
    if chars < MIN_VALUE_CHARS {
        return Err(format!(
            "is {chars} characters long; secret values must be at least {MIN_VALUE_CHARS} characters"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_rules_name_the_line_but_never_the_value() {
        let cases = [
            ("", "no variables"),
            ("# only a comment\n\n", "no variables"),
            ("A=abc\n", "at least 4"),
            ("A=\n", "empty"),
            ("A=abcd\r\n", "carriage return"),
            ("A=abcd\nsupersecretvalue\n", "line 2 has no '='"),
            ("1A=abcd\n", "name is invalid"),
            ("A-B=abcd\n", "name is invalid"),
            ("=abcd\n", "name is invalid"),
            (" A=abcd\n", "name is invalid"),
        ];
        for (text, want) in cases {
            let m = parse(text).unwrap_err();
            assert!(m.contains(want), "{text:?}: {m}");
            assert!(!m.contains("abc") && !m.contains("supersecret"), "{m}");
        }
        // Four characters, not four bytes.
        assert!(parse("A=éééé").is_ok());
    }

    #[test]
    fn from_map_applies_the_same_rules() {
        let map = |v: serde_json::Value| v.as_object().unwrap().clone();
        let v = from_map(&map(serde_json::json!({"B": "bbbb", "A": "aaaa"}))).unwrap();
        assert_eq!(v.len(), 2);
        for (bad, want) in [
            (serde_json::json!({"A": 1234}), "must be a string"),
            (serde_json::json!({"A": "abc"}), "at least 4"),
            (serde_json::json!({"A": "abcd\rx"}), "carriage return"),
            (serde_json::json!({"A": "abcd\nx"}), "line feed"),
            (serde_json::json!({"A": "abcd\0x"}), "NUL"),
            (serde_json::json!({"A": ""}), "empty"),
            (serde_json::json!({"9A": "abcd"}), "invalid"),
        ] {
            match from_map(&map(bad.clone())) {
                Err(Error::Invalid(m)) => {
                    assert!(m.contains(want), "{bad}: {m}");
                    assert!(m.contains("secretEnv"), "{m}");
                    assert!(!m.contains("abc"), "{m}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn printing_never_shows_the_value() {
        let v = SecretVar {
            name: "TOKEN".into(),
            value: Secret::new("hunter2-very-secret".into()),
        };
        for shown in [
            format!("{v:?}"),
            format!("{v}"),
            format!("{:?}", v.value),
            format!("{}", v.value),
            format!("{:#?}", vec![v.clone()]),
        ] {
            assert!(!shown.contains("hunter2"), "{shown}");
        }
        assert!(format!("{v}").contains("TOKEN"));
    }
}
