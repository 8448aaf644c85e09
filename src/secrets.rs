//! Secret files (`NAME=value` lines) and the rules they must follow; a value type that never
//! prints itself.
//!
//! Every message here names the file, line or variable at fault but never a value: these
//! messages reach logs and HTTP clients.

use crate::error::{Error, Result};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// The largest private file [`read_private_file`] reads.
pub const MAX_PRIVATE_FILE_BYTES: u64 = 1024 * 1024;
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

/// Reads a file that only its owner may read: a regular file (symlinks are not followed),
/// owned by the effective uid, with no group or other permission bits, at most
/// [`MAX_PRIVATE_FILE_BYTES`]. `what` ("secret file", "token file") starts every message.
pub fn read_private_file(path: &Path, what: &str) -> Result<Vec<u8>> {
    let shown = path.display();
    let refuse = |problem: &str| Error::Invalid(format!("{what} {shown}: {problem}"));
    // lstat first so that a FIFO or device is refused without ever being opened (opening
    // some devices has side effects); the fstat below closes the race with a swap.
    let before = std::fs::symlink_metadata(path).map_err(|e| refuse(&io_problem(&e)))?;
    check_type(&before.file_type()).map_err(|p| refuse(&p))?;
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| refuse(&io_problem(&e)))?;
    let meta = file
        .metadata()
        .map_err(|e| refuse(&format!("cannot inspect it ({e})")))?;
    check_type(&meta.file_type()).map_err(|p| refuse(&p))?;
    if (meta.dev(), meta.ino()) != (before.dev(), before.ino()) {
        return Err(refuse(
            "it was replaced while being opened; it must stay in place",
        ));
    }
    let euid = nix::unistd::geteuid().as_raw();
    if meta.uid() != euid {
        return Err(refuse(&format!(
            "it is owned by uid {}; it must be owned by the agent's user (uid {euid})",
            meta.uid()
        )));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(refuse(&format!(
            "its mode is {mode:04o}; it must be readable by its owner only (0600 or 0400)"
        )));
    }
    if meta.len() > MAX_PRIVATE_FILE_BYTES {
        return Err(too_large(what, path, meta.len()));
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    read_capped(&mut file, &mut data).map_err(|e| refuse(&format!("cannot read it ({e})")))?;
    if data.len() as u64 > MAX_PRIVATE_FILE_BYTES {
        return Err(too_large(what, path, data.len() as u64));
    }
    Ok(data)
}

fn read_capped(file: &mut File, data: &mut Vec<u8>) -> io::Result<()> {
    // One byte past the cap tells a file that grew after the fstat from one at the cap.
    file.take(MAX_PRIVATE_FILE_BYTES + 1).read_to_end(data)?;
    Ok(())
}

fn too_large(what: &str, path: &Path, len: u64) -> Error {
    Error::TooLarge(format!(
        "{what} {}: it holds {len} bytes; the limit is {MAX_PRIVATE_FILE_BYTES} bytes",
        path.display()
    ))
}

fn check_type(t: &std::fs::FileType) -> std::result::Result<(), String> {
    let kind = if t.is_file() {
        return Ok(());
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    };
    Err(format!(
        "it is {kind}; it must be a regular file (symbolic links are not followed)"
    ))
}

fn io_problem(e: &io::Error) -> String {
    match e.raw_os_error() {
        // O_NOFOLLOW reports a symlink swapped in after the lstat as ELOOP.
        Some(libc::ELOOP) => {
            "it is a symbolic link; it must be a regular file (symbolic links are not followed)"
                .to_string()
        }
        _ => format!("cannot open it ({e})"),
    }
}

/// Loads a secret file after checking every rule; the error names the file and the rule.
/// See [`read_private_file`] for the file rules and [`parse`] for the content rules.
pub fn load_file(path: &Path) -> Result<Vec<SecretVar>> {
    let data = read_private_file(path, "secret file")?;
    let text = std::str::from_utf8(&data).map_err(|_| {
        Error::Invalid(format!(
            "secret file {}: it is not UTF-8 text; it must hold NAME=value lines",
            path.display()
        ))
    })?;
    parse(text).map_err(|m| Error::Invalid(format!("secret file {}: {m}", path.display())))
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
        validate_name(name).map_err(|e| Error::Invalid(format!("secretEnv: {e}")))?;
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

const NAME_RULE: &str = "the variable name is invalid; names must match [A-Za-z_][A-Za-z0-9_]* (letters, digits, '_', not starting with a digit)";

fn is_valid_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Checks an environment variable name against `[A-Za-z_][A-Za-z0-9_]*`.
pub fn validate_name(name: &str) -> Result<()> {
    if is_valid_name(name) {
        return Ok(());
    }
    let mut shown: String = name.chars().take(64).collect();
    if shown.len() < name.len() {
        shown.push('…');
    }
    Err(Error::Invalid(format!(
        "variable name {shown:?} is invalid; names must match [A-Za-z_][A-Za-z0-9_]* (letters, digits, '_', not starting with a digit)"
    )))
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
    use std::fs;
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Duration, Instant};

    fn write(dir: &Path, name: &str, text: &str, mode: u32) -> std::path::PathBuf {
        let p = dir.join(name);
        fs::write(&p, text).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    fn invalid(r: Result<Vec<SecretVar>>) -> String {
        match r {
            Err(Error::Invalid(m)) => m,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn loads_a_good_file() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "s.env",
            "# comment\n\n  # indented comment\nA_KEY=abcd\n_b2=x=y=z\nA_KEY=last wins\n",
            0o600,
        );
        let v = load_file(&p).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].name, "_b2");
        assert_eq!(v[0].value.expose(), "x=y=z");
        assert_eq!(v[1].name, "A_KEY");
        assert_eq!(v[1].value.expose(), "last wins");
        assert_eq!(parse(&serialize(&v)).unwrap(), v);
    }

    #[test]
    fn mode_0400_is_accepted_and_group_or_other_bits_are_not() {
        let d = tempfile::tempdir().unwrap();
        let p = write(d.path(), "ro.env", "TOKEN=abcdef\n", 0o400);
        assert_eq!(load_file(&p).unwrap().len(), 1);
        for mode in [0o640, 0o604, 0o660, 0o644, 0o610] {
            let p = write(d.path(), &format!("m{mode:o}.env"), "TOKEN=abcdef\n", mode);
            let m = invalid(load_file(&p));
            assert!(m.contains(&p.display().to_string()), "{m}");
            assert!(
                m.contains(&format!("{mode:04o}")) && m.contains("0600"),
                "{m}"
            );
        }
    }

    #[test]
    fn symlinks_are_refused_even_to_good_files() {
        let d = tempfile::tempdir().unwrap();
        let good = write(d.path(), "good.env", "TOKEN=abcdef\n", 0o600);
        let link = d.path().join("link.env");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        let m = invalid(load_file(&link));
        assert!(m.contains("symbolic link") && m.contains("link.env"), "{m}");
    }

    #[test]
    fn fifo_is_refused_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("fifo");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let t = Instant::now();
        let m = invalid(load_file(&p));
        assert!(t.elapsed() < Duration::from_secs(1));
        assert!(m.contains("FIFO"), "{m}");
    }

    #[test]
    fn directories_devices_and_missing_files_are_refused() {
        let d = tempfile::tempdir().unwrap();
        assert!(invalid(load_file(d.path())).contains("directory"));
        let m = invalid(load_file(Path::new("/dev/null")));
        assert!(m.contains("device") && m.contains("/dev/null"), "{m}");
        let m = invalid(load_file(&d.path().join("missing")));
        assert!(m.contains("cannot open"), "{m}");
    }

    #[test]
    fn files_owned_by_someone_else_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = if nix::unistd::geteuid().is_root() {
            let p = write(d.path(), "theirs.env", "TOKEN=abcdef\n", 0o600);
            std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
            p
        } else {
            std::path::PathBuf::from("/etc/passwd") // root's, and readable
        };
        let m = invalid(read_private_file(&p, "token file").map(|_| Vec::new()));
        assert!(
            m.starts_with("token file ") && m.contains("owned by uid"),
            "{m}"
        );
    }

    #[test]
    fn oversized_files_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let big = "A".repeat(MAX_PRIVATE_FILE_BYTES as usize + 1);
        let p = write(d.path(), "big", &big, 0o600);
        match read_private_file(&p, "token file") {
            Err(Error::TooLarge(m)) => assert!(m.contains("token file") && m.contains("limit")),
            other => panic!("{other:?}"),
        }
    }

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
    fn load_file_wraps_content_errors_with_the_file() {
        let d = tempfile::tempdir().unwrap();
        let p = write(d.path(), "empty.env", "", 0o600);
        let m = invalid(load_file(&p));
        assert!(m.contains("empty.env") && m.contains("no variables"), "{m}");
        let p = d.path().join("bin.env");
        fs::write(&p, b"A=\xff\xfe\xfd\xfc\n").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(invalid(load_file(&p)).contains("UTF-8"));
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
    fn names_follow_the_rule() {
        for good in ["A", "_", "_a1", "PATH", "a_B_9"] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        for bad in ["", "1", "A B", "A=B", "Ä", "a-b", "a.b"] {
            assert!(validate_name(bad).is_err(), "{bad}");
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
