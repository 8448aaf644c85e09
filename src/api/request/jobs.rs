//! Job bodies: `POST /v1/jobs` (a start) and `POST /v1/jobs/{id}/resize`, and the listing's
//! page bounds.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{Map, Value};

use super::{Fields, MAX_WAIT_SECONDS, Shape, check_wait, object, shown, wrong_type};
use crate::model::error::{Error, Result};
use crate::model::spec::StartRequest;

/// `waitSeconds` when a start request gives none.
pub const DEFAULT_WAIT_SECONDS: f64 = 30.0;
/// The `limit` of a job listing page when none is given.
pub const DEFAULT_LIST_LIMIT: usize = 100;
/// The largest `limit` of a job listing page.
pub const MAX_LIST_LIMIT: usize = 1000;
/// A job listing page ends once its records pass this many bytes of JSON (it always holds
/// at least one), so that a page costs the server a bounded buffer however long the
/// commands in the records are.
pub const LIST_PAGE_BYTES: usize = 256 << 10;

/// The fields of a `POST /v1/jobs` body.
pub const START_FIELDS: &[&str] = &[
    "command",
    "cwd",
    "env",
    "stdin",
    "encoding",
    "secretEnv",
    "secretFiles",
    "timeoutSeconds",
    "idleTimeoutSeconds",
    "waitSeconds",
    "background",
    "user",
    "interactive",
    "pty",
    "limits",
    "argv",
    "separateStderr",
];
const START: Shape = Shape {
    known: START_FIELDS,
    required: &["command"],
};

/// The fields of a `POST /v1/jobs/{id}/resize` body.
pub const RESIZE_FIELDS: &[&str] = &["cols", "rows"];

/// A `POST /v1/jobs/{id}/resize` body: the terminal's new size.
pub fn resize_body(body: &[u8]) -> Result<crate::model::spec::PtySize> {
    pty_size(&object(body)?, "the body")
}

/// How long a start request waits for its job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Wait {
    /// `background: true`: answer as soon as the job runs.
    Background,
    /// Wait up to this many seconds for the end.
    Seconds(f64),
}

/// A parsed `POST /v1/jobs` body. Secret files are only named here; reading them is I/O.
#[derive(Debug)]
pub struct StartBody {
    pub req: StartRequest,
    pub secret_files: Vec<PathBuf>,
    pub wait: Wait,
}

/// Parses a `POST /v1/jobs` body (and the `Idempotency-Key` header, if any).
pub fn start_body(body: &[u8], idempotency_key: Option<&str>) -> Result<StartBody> {
    let map = object(body)?;
    let f = Fields::new(&map, &START)?;
    let argv = argv(&f)?;
    let command = match (f.get("command"), &argv) {
        (None, None) => {
            return Err(Error::Invalid(
                "command is missing: give the shell command to run (or argv, the program \
                 and its arguments)"
                    .into(),
            ));
        }
        (Some(_), Some(_)) => {
            return Err(Error::Invalid(
                "command and argv exclude each other: give the shell command, or the \
                 program and its arguments"
                    .into(),
            ));
        }
        (None, Some(words)) => crate::model::resources::shell_quote(words),
        (Some(Value::String(s)), None) => s.clone(),
        (Some(v), None) => return Err(wrong_type("command", "a string", v)),
    };
    let separate_stderr = f.boolean("separateStderr")?.unwrap_or(false);
    let req = StartRequest {
        command,
        cwd: f.string("cwd")?.map(str::to_string),
        env: job_env(&f)?,
        stdin: stdin(&f)?,
        secrets: match f.object("secretEnv")? {
            Some(m) => crate::model::secret::from_map(m)?,
            None => Vec::new(),
        },
        timeout_seconds: f.number("timeoutSeconds")?,
        idle_timeout_seconds: f.number("idleTimeoutSeconds")?,
        idempotency_key: idempotency_key.map(str::to_string),
        user: f.string("user")?.map(str::to_string),
        interactive: f.boolean("interactive")?.unwrap_or(false),
        pty: match f.object("pty")? {
            Some(m) => Some(pty_size(m, "pty")?),
            None => None,
        },
        session: None,
        limits: match f.object("limits")? {
            Some(m) => Some(limits(m)?),
            None => None,
        },
        argv,
        separate_stderr,
    };
    let secret_files = f
        .string_array("secretFiles")?
        .into_iter()
        .map(PathBuf::from)
        .collect();
    let wait_seconds = f
        .number("waitSeconds")?
        .map(|n| check_wait("waitSeconds", n, MAX_WAIT_SECONDS))
        .transpose()?;
    let wait = if f.boolean("background")?.unwrap_or(false) {
        Wait::Background
    } else {
        Wait::Seconds(wait_seconds.unwrap_or(DEFAULT_WAIT_SECONDS))
    };
    Ok(StartBody {
        req,
        secret_files,
        wait,
    })
}

/// `argv`: a non-empty array of strings, none holding a NUL byte.
fn argv(f: &Fields) -> Result<Option<Vec<String>>> {
    if f.get("argv").is_none() {
        return Ok(None);
    }
    let words = f.string_array("argv")?;
    if words.is_empty() || words[0].is_empty() {
        return Err(Error::Invalid(
            "argv must start with the program to run, e.g. [\"ls\", \"-la\"]".into(),
        ));
    }
    if let Some(i) = words.iter().position(|w| w.contains('\0')) {
        return Err(Error::Invalid(format!("argv[{i}] holds a NUL byte")));
    }
    Ok(Some(words))
}

/// `limits`: `{"memoryBytes", "cpus", "pids"}`, each optional.
pub fn limits(m: &Map<String, Value>) -> Result<crate::model::resources::Limits> {
    const KNOWN: [&str; 3] = ["memoryBytes", "cpus", "pids"];
    if let Some(k) = m.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(Error::Invalid(format!(
            "unknown field `{k}` in limits: it takes memoryBytes, cpus and pids"
        )));
    }
    let whole = |name: &str| -> Result<Option<u64>> {
        match m.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => n.as_u64().map(Some).ok_or_else(|| {
                Error::Invalid(format!(
                    "limits.{name} must be a whole number above 0, got {n}"
                ))
            }),
            Some(v) => Err(wrong_type(&format!("limits.{name}"), "a number", v)),
        }
    };
    let cpus = match m.get("cpus") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => n.as_f64(),
        Some(v) => return Err(wrong_type("limits.cpus", "a number", v)),
    };
    let l = crate::model::resources::Limits {
        memory_bytes: whole("memoryBytes")?,
        cpus,
        pids: whole("pids")?,
    };
    l.check()?;
    Ok(l)
}

/// A terminal size, `{"cols", "rows"}`, each 1 to 1000; `what` names it in errors.
pub fn pty_size(m: &Map<String, Value>, what: &str) -> Result<crate::model::spec::PtySize> {
    let max = crate::model::spec::MAX_PTY_SIDE;
    if let Some(k) = m.keys().find(|k| *k != "cols" && *k != "rows") {
        return Err(Error::Invalid(format!(
            "unknown field `{k}` in {what}: it takes cols and rows"
        )));
    }
    let side = |name: &str| -> Result<u16> {
        match m.get(name) {
            Some(Value::Number(n)) => match n.as_u64() {
                Some(v) if (1..=max as u64).contains(&v) => Ok(v as u16),
                _ => Err(Error::Invalid(format!(
                    "{what}.{name} must be a whole number from 1 to {max}, got {n}"
                ))),
            },
            None => Err(Error::Invalid(format!("{what}.{name} is missing"))),
            Some(v) => Err(wrong_type(&format!("{what}.{name}"), "a number", v)),
        }
    };
    Ok(crate::model::spec::PtySize {
        cols: side("cols")?,
        rows: side("rows")?,
    })
}

pub(super) fn job_env(f: &Fields) -> Result<BTreeMap<String, String>> {
    let env = f.string_map("env")?;
    crate::model::env::check_all(&env).map_err(|e| Error::Invalid(format!("env: {e}")))?;
    Ok(env)
}

fn stdin(f: &Fields) -> Result<Option<Vec<u8>>> {
    let encoding = f.string("encoding")?.unwrap_or("utf8");
    let base64 = match encoding {
        "utf8" | "utf-8" => false,
        "base64" => true,
        other => {
            return Err(Error::Invalid(format!(
                "encoding must be \"utf8\" or \"base64\", got {}",
                shown(other)
            )));
        }
    };
    let Some(text) = f.string("stdin")? else {
        return Ok(None);
    };
    if !base64 {
        return Ok(Some(text.as_bytes().to_vec()));
    }
    base64_decode(text)
        .map(Some)
        .map_err(|why| Error::Invalid(format!("stdin is not valid base64: {why}")))
}

/// Decodes standard base64 (`+/`, padding optional, ASCII whitespace ignored so wrapped
/// output of `base64` works). Refuses other characters, misplaced padding and non-zero
/// leftover bits.
pub fn base64_decode(s: &str) -> std::result::Result<Vec<u8>, String> {
    fn value(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let chars: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    let data_len = chars.iter().position(|&c| c == b'=').unwrap_or(chars.len());
    let padding = &chars[data_len..];
    if padding.len() > 2 || padding.iter().any(|&c| c != b'=') {
        return Err("padding '=' may only end the text, at most twice".into());
    }
    if !padding.is_empty() && !chars.len().is_multiple_of(4) {
        return Err("the padded length is not a multiple of 4".into());
    }
    let data = &chars[..data_len];
    if data.len() % 4 == 1 {
        return Err("the length is impossible (one character too many or too few)".into());
    }
    let mut out = Vec::with_capacity(data.len() / 4 * 3 + 2);
    for (i, group) in data.chunks(4).enumerate() {
        let mut acc: u32 = 0;
        for (j, &c) in group.iter().enumerate() {
            let v = value(c).ok_or_else(|| {
                format!(
                    "character {:?} at position {} is not in the base64 alphabet",
                    c as char,
                    i * 4 + j
                )
            })?;
            acc |= v << (18 - 6 * j);
        }
        let bytes = acc.to_be_bytes();
        let n = group.len() - 1; // 4 chars -> 3 bytes, 3 -> 2, 2 -> 1
        if n < 3 && acc & (0x00ff_ffff >> (8 * n)) != 0 {
            return Err("the last character carries stray bits".into());
        }
        out.extend_from_slice(&bytes[1..1 + n]);
    }
    Ok(out)
}
