//! The preview grant body: `POST /v1/previews/grants`.

use serde_json::Value;

use super::{Fields, Shape, object, wrong_type};
use crate::model::error::{Error, Result};
use crate::state::grants::{Identity, MAX_TTL_SECONDS, Mint};

/// The fields of a `POST /v1/previews/grants` body.
pub const GRANT_FIELDS: &[&str] = &["port", "gatePort", "identity", "public", "ttlSeconds"];
const GRANT: Shape = Shape {
    known: GRANT_FIELDS,
    required: &["port", "gatePort"],
};

/// Longest `identity.scope` and `identity.id`.
const MAX_IDENTITY_CHARS: usize = 256;

fn port(f: &Fields<'_>, name: &str) -> Result<u16> {
    match f.get(name) {
        None => Err(Error::Invalid(format!(
            "{name} is missing: port is where the dev server listens on 127.0.0.1, gatePort \
             where the gate listens (the port the provider publishes)"
        ))),
        Some(Value::Number(n)) => n
            .as_u64()
            .filter(|p| (1..=65535).contains(p))
            .map(|p| p as u16)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "{name} must be a whole number from 1 to 65535, got {n}"
                ))
            }),
        Some(v) => Err(wrong_type(name, "a number", v)),
    }
}

/// Parses a `POST /v1/previews/grants` body.
pub fn grant_body(body: &[u8]) -> Result<Mint> {
    let map = object(body)?;
    let f = Fields::new(&map, &GRANT)?;
    let identity = match f.object("identity")? {
        None => None,
        Some(m) => {
            let field = |k: &str| match m.get(k) {
                Some(Value::String(s))
                    if !s.is_empty()
                        && s.chars().count() <= MAX_IDENTITY_CHARS
                        && !s.chars().any(char::is_control) =>
                {
                    Ok(s.clone())
                }
                Some(Value::String(_)) => Err(Error::Invalid(format!(
                    "identity.{k} must be 1 to {MAX_IDENTITY_CHARS} characters without control characters"
                ))),
                None | Some(Value::Null) => Err(Error::Invalid(format!(
                    "identity.{k} is missing: identity is {{\"scope\", \"id\"}}, e.g. \
                     {{\"scope\": \"user\", \"id\": \"u_412\"}}"
                ))),
                Some(v) => Err(wrong_type(&format!("identity.{k}"), "a string", v)),
            };
            if let Some(k) = m.keys().find(|k| *k != "scope" && *k != "id") {
                return Err(Error::Invalid(format!(
                    "identity has no field {k:?}: it is {{\"scope\", \"id\"}}"
                )));
            }
            Some(Identity {
                scope: field("scope")?,
                id: field("id")?,
            })
        }
    };
    let ttl_seconds = match f.number("ttlSeconds")? {
        None => MAX_TTL_SECONDS,
        Some(n) if n.fract() == 0.0 && (1.0..=MAX_TTL_SECONDS as f64).contains(&n) => n as u64,
        Some(n) => {
            return Err(Error::Invalid(format!(
                "ttlSeconds must be a whole number from 1 to {MAX_TTL_SECONDS}, got {n}"
            )));
        }
    };
    Ok(Mint {
        port: port(&f, "port")?,
        gate_port: port(&f, "gatePort")?,
        identity,
        public: f.boolean("public")?.unwrap_or(false),
        ttl_seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_bodies() {
        let m = grant_body(br#"{"port": 5173, "gatePort": 8080}"#).unwrap();
        assert_eq!(
            (m.port, m.gate_port, m.public, m.ttl_seconds),
            (5173, 8080, false, 86400)
        );
        assert!(m.identity.is_none());
        let m = grant_body(
            br#"{"port": 1, "gatePort": 2, "identity": {"scope": "user", "id": "u_1"}, "public": true, "ttlSeconds": 60}"#,
        )
        .unwrap();
        assert_eq!(m.identity.unwrap().id, "u_1");
        assert!(m.public);
        for bad in [
            &br#"{"port": 1}"#[..],
            br#"{"port": 0, "gatePort": 2}"#,
            br#"{"port": 1, "gatePort": 70000}"#,
            br#"{"port": 1, "gatePort": 2, "ttlSeconds": 0}"#,
            br#"{"port": 1, "gatePort": 2, "ttlSeconds": 86401}"#,
            br#"{"port": 1, "gatePort": 2, "ttlSeconds": 1.5}"#,
            br#"{"port": 1, "gatePort": 2, "identity": {"scope": "user"}}"#,
            br#"{"port": 1, "gatePort": 2, "identity": {"scope": "", "id": "x"}}"#,
            br#"{"port": 1, "gatePort": 2, "identity": {"scope": "a", "id": "x", "z": 1}}"#,
            br#"{"port": 1, "gatePort": 2, "token": "x"}"#,
        ] {
            assert!(grant_body(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
