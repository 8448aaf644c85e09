//! Sessions' bodies: `POST /v1/sessions`, and `POST /v1/sessions/{id}/jobs` (a job's
//! body, less `cwd` and `user`, which are the session's).

use super::{Fields, Shape, StartBody, object, start_body};
use crate::job::session::NewSession;
use crate::model::error::{Error, Result};
use crate::model::session::Shell;

/// The fields of a `POST /v1/sessions` body.
pub const SESSION_FIELDS: &[&str] = &["cwd", "env", "user", "shell"];
const SESSION: Shape = Shape {
    known: SESSION_FIELDS,
    required: &[],
};

/// Parses a `POST /v1/sessions` body (an empty body is an empty object).
pub fn session_body(body: &[u8]) -> Result<NewSession> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        &b"{}"[..]
    } else {
        body
    };
    let map = object(body)?;
    let f = Fields::new(&map, &SESSION)?;
    let shell = match f.string("shell")? {
        None => Shell::Sh,
        Some(s) => Shell::parse(s).ok_or_else(|| {
            Error::Invalid(format!("shell must be \"sh\" or \"bash\", got {s:?}"))
        })?,
    };
    Ok(NewSession {
        cwd: f.string("cwd")?.map(str::to_string),
        env: f.string_map("env")?,
        user: f.string("user")?.map(str::to_string),
        shell,
    })
}

/// The fields of a `POST /v1/sessions/{id}/jobs` body: a job's, less `cwd` and `user`
/// (derived, so a field a job's body gains is a session command's too).
pub fn session_job_fields() -> &'static [&'static str] {
    static FIELDS: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    FIELDS.get_or_init(|| {
        super::START_FIELDS
            .iter()
            .copied()
            .filter(|f| !matches!(*f, "cwd" | "user" | "argv"))
            .collect()
    })
}

/// Parses a `POST /v1/sessions/{id}/jobs` body.
pub fn session_job_body(body: &[u8], idempotency_key: Option<&str>) -> Result<StartBody> {
    let map = object(body)?;
    for field in ["cwd", "user"] {
        if map.contains_key(field) {
            return Err(Error::Invalid(format!(
                "{field} is not taken by a session's command: it runs in the session's folder \
                 as the session's user (cd in a command instead, or make another session)"
            )));
        }
    }
    // The session's state is restored and saved by the command's shell: a program run
    // without one could carry nothing.
    if map.contains_key("argv") {
        return Err(Error::Invalid(
            "argv is not taken by a session's command: its shell restores and saves the \
             session's state; send the words as a command, or start a plain job with argv"
                .into(),
        ));
    }
    start_body(body, idempotency_key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_checked() {
        let s = session_body(br#"{"cwd": "/tmp", "env": {"A": "1"}, "shell": "bash"}"#).unwrap();
        assert_eq!(s.shell, Shell::Bash);
        assert_eq!(s.env["A"], "1");
        assert_eq!(session_body(b"").unwrap().shell, Shell::Sh);
        assert!(session_body(br#"{"shell": "zsh"}"#).is_err());
        assert!(session_body(br#"{"cdw": "/"}"#).is_err());
        assert!(session_job_body(br#"{"command": "true", "cwd": "/"}"#, None).is_err());
        assert!(session_job_body(br#"{"command": "true", "user": "x"}"#, None).is_err());
        assert!(session_job_body(br#"{"command": "true"}"#, None).is_ok());
        let e = session_job_body(br#"{"argv": ["true"]}"#, None).unwrap_err();
        assert!(e.message().contains("argv is not taken"), "{}", e.message());
    }
}
