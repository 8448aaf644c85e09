//! The preview body: `POST /v1/previews`.

use serde_json::Value;

use super::jobs::job_env;
use super::{Fields, Shape, check_wait, object, wrong_type};
use crate::model::error::{Error, Result};
use crate::model::spec::StartRequest;
use crate::os::probe::Probe;

/// The longest, and default, wait for a preview.
pub const MAX_PREVIEW_WAIT_SECONDS: f64 = 60.0;

/// The fields of a `POST /v1/previews` body.
pub const PREVIEW_FIELDS: &[&str] = &[
    "port",
    "command",
    "cwd",
    "env",
    "timeoutSeconds",
    "waitSeconds",
    "probe",
    "path",
];
const PREVIEW: Shape = Shape {
    known: PREVIEW_FIELDS,
    required: &["port"],
};

/// A parsed `POST /v1/previews` body.
#[derive(Debug)]
pub struct PreviewBody {
    pub port: u16,
    /// The server to start when nothing answers yet (cwd, env, timeouts as for a job).
    pub start: Option<StartRequest>,
    pub wait_seconds: f64,
    pub probe: Probe,
}

/// Parses a `POST /v1/previews` body.
pub fn preview_body(body: &[u8], idempotency_key: Option<&str>) -> Result<PreviewBody> {
    let map = object(body)?;
    let f = Fields::new(&map, &PREVIEW)?;
    let port = match f.get("port") {
        None => return Err(Error::Invalid("port is missing".into())),
        Some(Value::Number(n)) => {
            n.as_u64()
                .filter(|p| (1..=65535).contains(p))
                .ok_or_else(|| {
                    Error::Invalid(format!(
                        "port must be a whole number from 1 to 65535, got {n}"
                    ))
                })? as u16
        }
        Some(v) => return Err(wrong_type("port", "a number", v)),
    };
    let start = match f.string("command")? {
        Some(command) => Some(StartRequest {
            command: command.to_string(),
            cwd: f.string("cwd")?.map(str::to_string),
            env: job_env(&f)?,
            timeout_seconds: f.number("timeoutSeconds")?,
            idempotency_key: idempotency_key.map(str::to_string),
            ..Default::default()
        }),
        None => {
            for only_with_command in ["cwd", "env", "timeoutSeconds"] {
                if f.get(only_with_command).is_some() {
                    return Err(Error::Invalid(format!(
                        "{only_with_command} applies only with a command"
                    )));
                }
            }
            None
        }
    };
    let wait_seconds = f
        .number("waitSeconds")?
        .map(|n| check_wait("waitSeconds", n, MAX_PREVIEW_WAIT_SECONDS))
        .transpose()?
        .unwrap_or(MAX_PREVIEW_WAIT_SECONDS);
    let probe = crate::os::probe::parse_probe(f.string("probe")?, f.string("path")?)?;
    Ok(PreviewBody {
        port,
        start,
        wait_seconds,
        probe,
    })
}
