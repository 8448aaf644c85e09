//! `POST /v1/jobs/{id}/signal` bodies.

use serde_json::Value;

use super::{Fields, Shape, object, shown, wrong_type};
use crate::job::signal::Target;
use crate::model::error::{Error, Result};

/// The fields of a `POST /v1/jobs/{id}/signal` body.
pub const SIGNAL_FIELDS: &[&str] = &["signal", "target"];
const SIGNAL: Shape = Shape {
    known: SIGNAL_FIELDS,
    required: &["signal"],
};

/// A parsed signal request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignalBody {
    pub signal: nix::sys::signal::Signal,
    pub target: Target,
}

/// Parses `{"signal": "SIGINT" | "INT" | 2, "target": "group" | "all"}`.
pub fn signal_body(body: &[u8]) -> Result<SignalBody> {
    let map = object(body)?;
    let f = Fields::new(&map, &SIGNAL)?;
    let given = match f.get("signal") {
        None => {
            return Err(Error::Invalid(
                "signal is missing: name one, e.g. \"SIGINT\", \"HUP\" or 15".into(),
            ));
        }
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(v) => return Err(wrong_type("signal", "a signal name or number", v)),
    };
    let signal = parse(&given).ok_or_else(|| {
        Error::Invalid(format!(
            "signal {} is not a signal this system knows: use a name such as SIGINT, INT, \
             SIGTERM, SIGHUP, SIGUSR1, or a number from 1 to 64",
            shown(&given)
        ))
    })?;
    let target = match f.string("target")? {
        None | Some("group") => Target::Group,
        Some("all") => Target::All,
        Some(other) => {
            return Err(Error::Invalid(format!(
                "target must be \"group\" (the job's process group, the default) or \"all\" \
                 (every process of the job), got {}",
                shown(other)
            )));
        }
    };
    Ok(SignalBody { signal, target })
}

/// A signal by name (`SIGINT`, `INT`, any case) or number; 0 and unknown ones are `None`.
fn parse(name: &str) -> Option<nix::sys::signal::Signal> {
    use nix::sys::signal::Signal;
    let t = name.trim();
    if let Ok(n) = t.parse::<i32>() {
        return Signal::try_from(n).ok();
    }
    let up = t.to_ascii_uppercase();
    let full = if up.starts_with("SIG") {
        up
    } else {
        format!("SIG{up}")
    };
    full.parse::<Signal>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::Signal;

    #[test]
    fn names_numbers_and_targets() {
        let b = signal_body(br#"{"signal": "SIGINT"}"#).unwrap();
        assert_eq!((b.signal, b.target), (Signal::SIGINT, Target::Group));
        let b = signal_body(br#"{"signal": "hup", "target": "all"}"#).unwrap();
        assert_eq!((b.signal, b.target), (Signal::SIGHUP, Target::All));
        assert_eq!(
            signal_body(br#"{"signal": 10}"#).unwrap().signal,
            Signal::SIGUSR1
        );
        for bad in [
            &br#"{"signal": "SIGNOPE"}"#[..],
            br#"{"signal": 0}"#,
            br#"{"signal": 99}"#,
            br#"{"signal": -9}"#,
            br#"{"signal": 2.5}"#,
            br#"{"signal": true}"#,
            br#"{}"#,
            br#"{"signal": "INT", "target": "some"}"#,
            br#"{"signal": "INT", "sig": 1}"#,
        ] {
            let e = signal_body(bad).unwrap_err();
            assert_eq!(e.code(), "invalid", "{}", String::from_utf8_lossy(bad));
        }
        let e = signal_body(br#"{"signal": "SIGNOPE"}"#).unwrap_err();
        assert!(e.message().contains("SIGNOPE"), "{}", e.message());
    }
}
