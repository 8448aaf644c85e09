//! Pure request parsing: query strings, and JSON bodies turned into the agent's own types.
//! No I/O here, so every rule is unit tested next to it.
//!
//! Rules shared by every body: it must be a JSON object; a field it does not know is
//! `invalid` (a misspelt `timeout` must not quietly run with the default), and so is a
//! known field with the wrong type; the message names the field, and for an unknown one
//! the known field it most likely meant. `null` is the same as leaving a field out.
//! Query strings follow the same rule: each route names the parameters it reads. The
//! wording of those refusals, and the guess, live in `unknown.rs`. Each resource's bodies
//! have a file, as the handlers do (`jobs`, `env`, `files`, `previews`); what they share
//! (the object, its typed fields, the query string, the wait bound) is here.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::model::error::{Error, Result};

mod cursor;
mod env;
mod files;
mod grants;
mod jobs;
mod previews;
mod range;
mod sessions;
mod signal;
mod unknown;
mod watches;
pub use cursor::Place;
pub use env::{ENV_FIELDS, EnvBody, env_body};
pub use files::{MKDIR_FIELDS, MOVE_FIELDS, MkdirBody, MoveBody, file_mode, mkdir_body, move_body};
pub use grants::{GRANT_FIELDS, grant_body};
pub use jobs::{
    DEFAULT_LIST_LIMIT, DEFAULT_WAIT_SECONDS, LIST_PAGE_BYTES, MAX_LIST_LIMIT, RESIZE_FIELDS,
    START_FIELDS, StartBody, Wait, base64_decode, pty_size, resize_body, start_body,
};
pub use previews::{MAX_PREVIEW_WAIT_SECONDS, PREVIEW_FIELDS, PreviewBody, preview_body};
pub use range::{Wanted, byte_range};
pub use sessions::{SESSION_FIELDS, session_body, session_job_body, session_job_fields};
pub use signal::{SIGNAL_FIELDS, SignalBody, signal_body};
use unknown::{FIELD, QUERY_PARAMETER, unknown_names};
pub use watches::{WATCH_FIELDS, WatchBody, watch_body};

/// The longest any request may wait (starts and long-polls).
pub const MAX_WAIT_SECONDS: f64 = 600.0;

/// Decodes `%XX` escapes and `+` (a space, as forms send it); `None` for a broken escape or
/// text that is not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = b.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                if !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
                    return None;
                }
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// A parsed query string: each name at most once, and only names its route reads.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Query {
    map: BTreeMap<String, String>,
    known: &'static [&'static str],
}

impl Query {
    /// Parses `a=1&b=2` for a route that reads the parameters `known`. A name given twice,
    /// a name not in `known`, or a broken escape, is `invalid`.
    pub fn parse(q: &str, known: &'static [&'static str]) -> Result<Query> {
        let mut map = BTreeMap::new();
        for pair in q.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let bad = || Error::Invalid("the query string has a malformed %-escape".into());
            let name = percent_decode(name).ok_or_else(bad)?;
            let value = percent_decode(value).ok_or_else(bad)?;
            if map.contains_key(&name) {
                return Err(Error::Invalid(format!(
                    "query parameter {} is given more than once",
                    shown(&name)
                )));
            }
            map.insert(name, value);
        }
        let unknown: Vec<&str> = map
            .keys()
            .map(String::as_str)
            .filter(|n| !known.contains(n))
            .collect();
        if !unknown.is_empty() {
            return Err(Error::Invalid(unknown_names(
                &QUERY_PARAMETER,
                &unknown,
                known,
                &[],
            )));
        }
        Ok(Query { map, known })
    }

    /// A raw value.
    pub fn get(&self, name: &str) -> Option<&str> {
        debug_assert!(
            self.known.contains(&name),
            "{name} is not a known parameter"
        );
        self.map.get(name).map(String::as_str)
    }

    /// A whole number, within `min..=max`.
    pub fn uint(&self, name: &str, min: u64, max: u64) -> Result<Option<u64>> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let n = (!v.is_empty() && v.len() <= 20 && v.bytes().all(|b| b.is_ascii_digit()))
            .then(|| v.parse::<u64>().ok())
            .flatten()
            .filter(|n| (min..=max).contains(n));
        n.map(Some).ok_or_else(|| {
            Error::Invalid(format!(
                "{name} must be a whole number from {min} to {max}, got {}",
                shown(v)
            ))
        })
    }

    /// `true` or `false` (or `1` or `0`).
    pub fn flag(&self, name: &str) -> Result<Option<bool>> {
        match self.get(name) {
            None => Ok(None),
            Some("true" | "1") => Ok(Some(true)),
            Some("false" | "0") => Ok(Some(false)),
            Some(v) => Err(Error::Invalid(format!(
                "{name} must be true or false, got {}",
                shown(v)
            ))),
        }
    }

    /// A number of seconds to wait, from 0 to `max`.
    pub fn seconds(&self, name: &str, max: f64) -> Result<Option<f64>> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let n: f64 = v.trim().parse().map_err(|_| {
            Error::Invalid(format!(
                "{name} must be a number of seconds, got {}",
                shown(v)
            ))
        })?;
        check_wait(name, n, max).map(Some)
    }
}

/// Shows a caller's value in a message: quoted, and cut short.
fn shown(s: &str) -> String {
    let mut out: String = s.chars().take(64).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    format!("{out:?}")
}

fn check_wait(name: &str, n: f64, max: f64) -> Result<f64> {
    if !n.is_finite() || !(0.0..=max).contains(&n) {
        return Err(Error::Invalid(format!(
            "{name} must be from 0 to {max} seconds, got {n}"
        )));
    }
    Ok(n)
}

/// Parses a body as a JSON object.
pub fn object(body: &[u8]) -> Result<Map<String, Value>> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(Error::Invalid(
            "the request body is empty; send a JSON object".into(),
        ));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(Error::Invalid(
            "the request body must be a JSON object".into(),
        )),
        Err(e) => Err(Error::Invalid(format!(
            "the request body is not valid JSON: {e}"
        ))),
    }
}

/// The fields a body may hold, and which of them it must.
struct Shape {
    known: &'static [&'static str],
    required: &'static [&'static str],
}

/// A body for a route that reads none: empty, or a JSON object without fields.
pub fn no_body(body: &[u8]) -> Result<()> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(());
    }
    const NONE: Shape = Shape {
        known: &[],
        required: &[],
    };
    Fields::new(&object(body)?, &NONE).map(drop)
}

/// Typed access to an object's fields, once it is known to hold no others.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    known: &'static [&'static str],
}

fn wrong_type(name: &str, want: &str, got: &Value) -> Error {
    let got = match got {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    Error::Invalid(format!("{name} must be {want}, got {got}"))
}

impl<'a> Fields<'a> {
    /// The fields of `map`, refusing any that `shape` does not know.
    fn new(map: &'a Map<String, Value>, shape: &Shape) -> Result<Fields<'a>> {
        let unknown: Vec<&str> = map
            .keys()
            .map(String::as_str)
            .filter(|n| !shape.known.contains(n))
            .collect();
        if !unknown.is_empty() {
            let missing: Vec<&str> = shape
                .required
                .iter()
                .copied()
                .filter(|r| map.get(*r).is_none_or(Value::is_null))
                .collect();
            return Err(Error::Invalid(unknown_names(
                &FIELD,
                &unknown,
                shape.known,
                &missing,
            )));
        }
        Ok(Fields {
            map,
            known: shape.known,
        })
    }

    fn get(&self, name: &str) -> Option<&'a Value> {
        debug_assert!(self.known.contains(&name), "{name} is not a known field");
        self.map.get(name).filter(|v| !v.is_null())
    }

    fn string(&self, name: &str) -> Result<Option<&'a str>> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(wrong_type(name, "a string", v)),
        }
    }

    fn number(&self, name: &str) -> Result<Option<f64>> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(v) => Err(wrong_type(name, "a number", v)),
        }
    }

    fn boolean(&self, name: &str) -> Result<Option<bool>> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(wrong_type(name, "true or false", v)),
        }
    }

    fn object(&self, name: &str) -> Result<Option<&'a Map<String, Value>>> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(v) => Err(wrong_type(name, "an object", v)),
        }
    }

    /// An object whose values are all strings.
    fn string_map(&self, name: &str) -> Result<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        for (k, v) in self.object(name)?.into_iter().flatten() {
            match v {
                Value::String(s) => {
                    out.insert(k.clone(), s.clone());
                }
                v => return Err(wrong_type(&format!("{name}.{k}"), "a string", v)),
            }
        }
        Ok(out)
    }

    fn string_array(&self, name: &str) -> Result<Vec<String>> {
        match self.get(name) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(s.clone()),
                    v => Err(wrong_type(&format!("{name}[{i}]"), "a string", v)),
                })
                .collect(),
            Some(v) => Err(wrong_type(name, "an array of strings", v)),
        }
    }
}

/// A `true`/`false` query value.
pub fn query_bool(q: &Query, name: &str) -> Result<Option<bool>> {
    match q.get(name) {
        None => Ok(None),
        Some("true") => Ok(Some(true)),
        Some("false") => Ok(Some(false)),
        Some(v) => Err(Error::Invalid(format!(
            "{name} must be true or false, got {}",
            shown(v)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::unknown::closest;
    use super::*;
    use crate::os::probe::Probe;
    use proptest::prelude::*;
    use std::path::PathBuf;

    /// Every refusal of a body is a client error, never an internal one.
    fn client_error<T>(r: Result<T>) -> bool {
        !matches!(r, Err(e) if !matches!(e, Error::Invalid(_) | Error::TooLarge(_)))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        // The fuzz target `request`'s invariants, on stable: no panic, no internal error.
        #[test]
        fn arbitrary_bodies_never_panic_nor_fail_internally(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            prop_assert!(client_error(start_body(&data, None)));
            prop_assert!(client_error(env_body(&data)));
            prop_assert!(client_error(preview_body(&data, None)));
            prop_assert!(client_error(no_body(&data)));
            if let Ok(s) = std::str::from_utf8(&data) {
                prop_assert!(client_error(Query::parse(s, &["offset", "limit"])));
                let _ = percent_decode(s);
                let _ = base64_decode(s);
            }
        }

        #[test]
        fn json_shaped_bodies_never_panic_nor_fail_internally(
            command in proptest::option::of(".{0,20}"),
            wait in proptest::option::of(any::<f64>()),
            timeout in proptest::option::of(any::<i64>()),
            encoding in proptest::option::of("(utf8|base64|[a-z]{0,6})"),
            stdin in proptest::option::of("[A-Za-z0-9+/=]{0,12}"),
            env_name in "[A-Za-z_0-9=]{0,6}",
        ) {
            let mut body = serde_json::Map::new();
            if let Some(c) = command { body.insert("command".into(), c.into()); }
            if let Some(w) = wait { body.insert("waitSeconds".into(), serde_json::json!(w)); }
            if let Some(t) = timeout { body.insert("timeoutSeconds".into(), t.into()); }
            if let Some(e) = encoding { body.insert("encoding".into(), e.into()); }
            if let Some(s) = stdin { body.insert("stdin".into(), s.into()); }
            body.insert("env".into(), serde_json::json!({ env_name.clone(): "v" }));
            let bytes = serde_json::to_vec(&body).unwrap();
            prop_assert!(client_error(start_body(&bytes, Some("k"))));
            body.retain(|k, _| PREVIEW_FIELDS.contains(&k.as_str()));
            body.insert("port".into(), 8080.into());
            let bytes = serde_json::to_vec(&body).unwrap();
            prop_assert!(client_error(preview_body(&bytes, None)));
            let env = serde_json::to_vec(&serde_json::json!({"set": { env_name: "v" }})).unwrap();
            prop_assert!(client_error(env_body(&env)));
        }

        #[test]
        fn unknown_names_are_always_refused_and_known_ones_never(
            name in "\\PC{0,80}",
            known in proptest::sample::subsequence(START_FIELDS.to_vec(), 0..=START_FIELDS.len()),
        ) {
            let mut body = serde_json::Map::new();
            body.insert(name.clone(), Value::Null);
            let bytes = serde_json::to_vec(&body).unwrap();
            let r = start_body(&bytes, None);
            if START_FIELDS.contains(&name.as_str()) {
                prop_assert!(!matches!(&r, Err(Error::Invalid(m)) if m.starts_with("unknown")));
            } else {
                prop_assert!(invalid(r).starts_with("unknown field `"));
            }
            // A suggestion is always one of the known names, and a known name is its own.
            if let Some(g) = closest(&name, &known) {
                prop_assert!(known.contains(&g));
            }
            for k in &known {
                prop_assert_eq!(closest(k, &known), Some(*k));
            }
        }
    }

    fn invalid<T: std::fmt::Debug>(r: Result<T>) -> String {
        match r {
            Err(Error::Invalid(m)) => m,
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%20b+c").as_deref(), Some("a b c"));
        assert_eq!(percent_decode("%2e%2E").as_deref(), Some(".."));
        assert_eq!(percent_decode("%C3%A9").as_deref(), Some("é"));
        assert_eq!(percent_decode("%00").as_deref(), Some("\0"));
        for bad in ["%", "%2", "%zz", "%ff", "%+1"] {
            assert_eq!(percent_decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn query_strings() {
        let q = Query::parse(
            "status=running&limit=5&x",
            &["status", "limit", "x", "nope"],
        )
        .unwrap();
        assert_eq!(q.get("status"), Some("running"));
        assert_eq!(q.get("x"), Some(""));
        assert_eq!(q.uint("limit", 1, 10).unwrap(), Some(5));
        assert_eq!(q.uint("nope", 1, 10).unwrap(), None);
        assert!(invalid(Query::parse("a=1&a=2", &["a"])).contains("more than once"));
        assert!(Query::parse("a=%zz", &["a"]).is_err());
        for v in [
            "0",
            "11",
            "-1",
            "1.5",
            "",
            " 5",
            "99999999999999999999999",
            "0x5",
        ] {
            let q = Query::parse(&format!("limit={v}"), &["limit"]).unwrap();
            assert!(invalid(q.uint("limit", 1, 10)).contains("limit"), "{v}");
        }
        let q = Query::parse("waitSeconds=2.5", &["waitSeconds"]).unwrap();
        assert_eq!(q.seconds("waitSeconds", 600.0).unwrap(), Some(2.5));
        for v in ["-1", "601", "nan", "inf", "x", ""] {
            let q = Query::parse(&format!("waitSeconds={v}"), &["waitSeconds"]).unwrap();
            assert!(
                invalid(q.seconds("waitSeconds", 600.0)).contains("waitSeconds"),
                "{v}"
            );
        }
    }

    #[test]
    fn start_bodies() {
        let b = start_body(
            br#"{"command":"echo hi","cwd":"/tmp","env":{"A":"1"},"stdin":"aGk=","encoding":"base64",
                "secretEnv":{"TOKEN":"s3cret"},"secretFiles":["/x/y"],"timeoutSeconds":5,
                "idleTimeoutSeconds":1.5,"waitSeconds":0}"#,
            Some("key-1"),
        )
        .unwrap();
        assert_eq!(b.req.command, "echo hi");
        assert_eq!(b.req.cwd.as_deref(), Some("/tmp"));
        assert_eq!(b.req.env["A"], "1");
        assert_eq!(b.req.stdin.as_deref(), Some(&b"hi"[..]));
        assert_eq!(b.req.secrets.len(), 1);
        assert_eq!(b.req.secrets[0].name, "TOKEN");
        assert_eq!(b.req.timeout_seconds, Some(5.0));
        assert_eq!(b.req.idle_timeout_seconds, Some(1.5));
        assert_eq!(b.req.idempotency_key.as_deref(), Some("key-1"));
        assert_eq!(b.secret_files, vec![PathBuf::from("/x/y")]);
        assert_eq!(b.wait, Wait::Seconds(0.0));

        let b = start_body(br#"{"command":"x","stdin":"h\u00e9","cwd":null}"#, None).unwrap();
        assert_eq!(b.req.stdin.as_deref(), Some("hé".as_bytes()));
        assert_eq!(b.req.cwd, None);
        assert_eq!(b.wait, Wait::Seconds(DEFAULT_WAIT_SECONDS));
        let b = start_body(
            br#"{"command":"x","background":true,"waitSeconds":5}"#,
            None,
        )
        .unwrap();
        assert_eq!(b.wait, Wait::Background);
    }

    #[test]
    fn start_body_errors_name_the_field() {
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            ("not json", "JSON"),
            ("[1]", "object"),
            ("{\"command\":\"x\"", "JSON"),
            ("{}", "command"),
            ("{\"command\":null}", "command"),
            ("{\"command\":5}", "command must be a string"),
            ("{\"command\":\"x\",\"cwd\":1}", "cwd"),
            ("{\"command\":\"x\",\"env\":[]}", "env"),
            ("{\"command\":\"x\",\"env\":{\"A\":1}}", "env.A"),
            ("{\"command\":\"x\",\"env\":{\"1A\":\"v\"}}", "1A"),
            ("{\"command\":\"x\",\"env\":{\"A-B\":\"v\"}}", "A-B"),
            ("{\"command\":\"x\",\"stdin\":5}", "stdin"),
            (
                "{\"command\":\"x\",\"encoding\":\"hex\",\"stdin\":\"a\"}",
                "encoding",
            ),
            (
                "{\"command\":\"x\",\"encoding\":\"base64\",\"stdin\":\"!!\"}",
                "base64",
            ),
            ("{\"command\":\"x\",\"secretEnv\":\"A=b\"}", "secretEnv"),
            ("{\"command\":\"x\",\"secretEnv\":{\"A\":5}}", "secretEnv"),
            ("{\"command\":\"x\",\"secretFiles\":\"/a\"}", "secretFiles"),
            ("{\"command\":\"x\",\"secretFiles\":[1]}", "secretFiles[0]"),
            (
                "{\"command\":\"x\",\"timeoutSeconds\":\"5\"}",
                "timeoutSeconds",
            ),
            (
                "{\"command\":\"x\",\"idleTimeoutSeconds\":true}",
                "idleTimeoutSeconds",
            ),
            ("{\"command\":\"x\",\"waitSeconds\":\"5\"}", "waitSeconds"),
            ("{\"command\":\"x\",\"waitSeconds\":601}", "waitSeconds"),
            ("{\"command\":\"x\",\"waitSeconds\":-1}", "waitSeconds"),
            ("{\"command\":\"x\",\"background\":\"yes\"}", "background"),
        ];
        for (body, needle) in cases {
            let m = invalid(start_body(body.as_bytes(), None));
            assert!(m.contains(needle), "{body}: {m}");
        }
        let deep = "[".repeat(100_000);
        assert!(invalid(start_body(deep.as_bytes(), None)).contains("JSON"));
    }

    #[test]
    fn secret_values_stay_out_of_messages() {
        let m = invalid(start_body(
            br#"{"command":"x","secretEnv":{"A":"abc\ndef-secret"}}"#,
            None,
        ));
        assert!(!m.contains("def-secret"), "{m}");
    }

    #[test]
    fn base64() {
        let cases: &[(&str, &[u8])] = &[
            ("", b""),
            ("Zg==", b"f"),
            ("Zg", b"f"),
            ("Zm8=", b"fo"),
            ("Zm9v", b"foo"),
            ("Zm9vYmFy", b"foobar"),
            ("Zm9v\nYmFy\n", b"foobar"),
            ("/+8=", &[0xff, 0xef]),
            ("AAEC", &[0, 1, 2]),
        ];
        for (text, want) in cases {
            assert_eq!(base64_decode(text).as_deref(), Ok(*want), "{text}");
        }
        for bad in [
            "Z", "Zg=", "Zg===", "Z=g=", "Zh==", "Zm9=", "Zm9v!", "Zm-_", "=", "Zm9vY",
        ] {
            assert!(base64_decode(bad).is_err(), "{bad}");
        }
        // Round trip against a plain encoder over every length up to 64.
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        for len in 0..64u8 {
            let data: Vec<u8> = (0..len)
                .map(|i| i.wrapping_mul(37).wrapping_add(11))
                .collect();
            let mut enc = String::new();
            for c in data.chunks(3) {
                let n = (c[0] as u32) << 16
                    | (*c.get(1).unwrap_or(&0) as u32) << 8
                    | *c.get(2).unwrap_or(&0) as u32;
                for k in 0..=c.len() {
                    enc.push(A[(n >> (18 - 6 * k) & 63) as usize] as char);
                }
                for _ in c.len()..3 {
                    enc.push('=');
                }
            }
            assert_eq!(base64_decode(&enc).unwrap(), data, "{enc}");
        }
    }

    #[test]
    fn env_bodies() {
        let b = env_body(br#"{"set":{"A":"1"},"unset":["B"],"replace":true}"#).unwrap();
        assert_eq!(b.set["A"], "1");
        assert_eq!(b.unset, vec!["B"]);
        assert!(b.replace);
        let b = env_body(b"{}").unwrap();
        assert!(b.set.is_empty() && b.unset.is_empty() && !b.replace);
        for (body, needle) in [
            (r#"{"set":[]}"#, "set"),
            (r#"{"set":{"A":1}}"#, "set.A"),
            (r#"{"unset":"A"}"#, "unset"),
            (r#"{"unset":[1]}"#, "unset[0]"),
            (r#"{"replace":"true"}"#, "replace"),
        ] {
            assert!(
                invalid(env_body(body.as_bytes())).contains(needle),
                "{body}"
            );
        }
    }

    #[test]
    fn preview_bodies() {
        let b = preview_body(br#"{"port":8080}"#, None).unwrap();
        assert_eq!(
            (b.port, b.wait_seconds, &b.probe),
            (8080, 60.0, &Probe::Tcp)
        );
        assert!(b.start.is_none());
        let b = preview_body(
            br#"{"port":3000,"command":"npm start","cwd":"/app","env":{"PORT":"3000"},
                "waitSeconds":5,"probe":"http","path":"/health"}"#,
            Some("k"),
        )
        .unwrap();
        let s = b.start.unwrap();
        assert_eq!(s.command, "npm start");
        assert_eq!(s.env["PORT"], "3000");
        assert_eq!(s.idempotency_key.as_deref(), Some("k"));
        assert_eq!(
            b.probe,
            Probe::Http {
                path: "/health".into()
            }
        );
        for (body, needle) in [
            (r#"{}"#, "port"),
            (r#"{"port":"80"}"#, "port"),
            (r#"{"port":0}"#, "port"),
            (r#"{"port":65536}"#, "port"),
            (r#"{"port":80.5}"#, "port"),
            (r#"{"port":80,"waitSeconds":61}"#, "waitSeconds"),
            (r#"{"port":80,"probe":"udp"}"#, "probe"),
            (r#"{"port":80,"path":"/x"}"#, "path"),
            (r#"{"port":80,"command":7}"#, "command"),
            (r#"{"port":80,"cwd":"/"}"#, "cwd"),
        ] {
            assert!(
                invalid(preview_body(body.as_bytes(), None)).contains(needle),
                "{body}"
            );
        }
    }

    const START_LIST: &str = "the fields are command, cwd, env, stdin, encoding, secretEnv, secretFiles, timeoutSeconds, idleTimeoutSeconds, waitSeconds, background, user, interactive, pty, limits, argv, separateStderr";

    #[test]
    fn unknown_body_fields_are_refused_naming_the_closest_known_one() {
        let start = |b: &str| invalid(start_body(b.as_bytes(), None));
        let cases: &[(&str, &str)] = &[
            (
                r#"{"command":"sleep 1","timeout":5}"#,
                "unknown field `timeout`; did you mean `timeoutSeconds`?",
            ),
            (
                r#"{"command":"x","timout":5}"#,
                "unknown field `timout`; did you mean `timeoutSeconds`?",
            ),
            (
                r#"{"command":"x","timeout_seconds":5}"#,
                "unknown field `timeout_seconds`; did you mean `timeoutSeconds`?",
            ),
            (
                r#"{"command":"x","idleTimeout":5}"#,
                "unknown field `idleTimeout`; did you mean `idleTimeoutSeconds`?",
            ),
            (
                r#"{"command":"x","WaitSeconds":5}"#,
                "unknown field `WaitSeconds`; did you mean `waitSeconds`?",
            ),
            (
                r#"{"command":"x","secret_env":{}}"#,
                "unknown field `secret_env`; did you mean `secretEnv`?",
            ),
            (
                r#"{"command":"x","environment":{}}"#,
                "unknown field `environment`; did you mean `env`?",
            ),
            // null does not make a field known.
            (
                r#"{"command":"x","timeout":null}"#,
                "unknown field `timeout`; did you mean `timeoutSeconds`?",
            ),
            // A misspelt required field: the refusal says it is also missing.
            (
                r#"{"comand":"ls"}"#,
                "unknown field `comand`; did you mean `command`? (command is missing)",
            ),
            (
                r#"{"nocommand":true}"#,
                "unknown field `nocommand`; did you mean `command`? (command is missing)",
            ),
        ];
        for (body, want) in cases {
            assert_eq!(start(body), *want, "{body}");
        }
        // Nothing close: no guess, and the known fields in full.
        for (body, name) in [
            (r#"{"command":"x","frobnicate":"bob"}"#, "frobnicate"),
            (r#"{"command":"x","detach":true}"#, "detach"),
            (r#"{"command":"x","zzzzzzzz":1}"#, "zzzzzzzz"),
        ] {
            assert_eq!(
                start(body),
                format!("unknown field `{name}`; {START_LIST}"),
                "{body}"
            );
        }
        assert_eq!(
            start(r#"{"foo":1,"comand":"x"}"#),
            format!(
                "unknown fields `comand` (did you mean `command`?), `foo`; {START_LIST} (command is missing)"
            )
        );
        let many: serde_json::Map<String, Value> =
            (0..7).map(|i| (format!("x{i}"), Value::Null)).collect();
        let m = start(&serde_json::to_string(&many).unwrap());
        assert!(
            m.starts_with(
                "unknown fields `x0`, `x1`, `x2`, `x3`, `x4`, and 2 more; the fields are"
            ),
            "{m}"
        );
        // A hostile name is shown escaped and cut short.
        let long = format!("{}\n", "a".repeat(100));
        let m = start(&serde_json::json!({ long: 1, "command": "x" }).to_string());
        assert!(
            m.starts_with(&format!("unknown field `{}…`;", "a".repeat(64))),
            "{m}"
        );
        let m = start(r#"{"command":"x","a\nb\u0000":1}"#);
        assert!(m.starts_with("unknown field `a\\nb\\0`;"), "{m}");

        let env = |b: &str| invalid(env_body(b.as_bytes()));
        assert_eq!(
            env(r#"{"sett":{"A":"1"}}"#),
            "unknown field `sett`; did you mean `set`?"
        );
        assert_eq!(
            env(r#"{"unset":[],"remove":["A"]}"#),
            "unknown field `remove`; the fields are set, unset, replace"
        );
        let preview = |b: &str| invalid(preview_body(b.as_bytes(), None));
        assert_eq!(
            preview(r#"{"prot":80}"#),
            "unknown field `prot`; did you mean `port`? (port is missing)"
        );
        assert_eq!(
            preview(r#"{"port":80,"wait":5}"#),
            "unknown field `wait`; did you mean `waitSeconds`?"
        );
        assert!(
            preview(r#"{"port":80,"command":"x","stdin":"y"}"#)
                .starts_with("unknown field `stdin`; the fields are port, command,")
        );
    }

    #[test]
    fn a_route_without_a_body_takes_an_empty_one_or_an_empty_object() {
        for ok in ["", " \r\n", "{}", " { } "] {
            assert!(no_body(ok.as_bytes()).is_ok(), "{ok:?}");
        }
        assert_eq!(
            invalid(no_body(br#"{"force":true}"#)),
            "unknown field `force`: this request's body takes none"
        );
        assert!(invalid(no_body(b"[]")).contains("JSON object"));
        assert!(invalid(no_body(b"force")).contains("not valid JSON"));
    }

    #[test]
    fn unknown_query_parameters_are_refused_naming_the_closest_known_one() {
        const OUTPUT: &[&str] = &["offset", "limit", "waitSeconds"];
        let q = |s: &str, known: &'static [&'static str]| invalid(Query::parse(s, known));
        assert_eq!(
            q("ofset=10", OUTPUT),
            "unknown query parameter `ofset`; did you mean `offset`?"
        );
        assert_eq!(
            q("offset=0&wait=5", OUTPUT),
            "unknown query parameter `wait`; did you mean `waitSeconds`?"
        );
        assert_eq!(
            q("waitseconds=5", OUTPUT),
            "unknown query parameter `waitseconds`; did you mean `waitSeconds`?"
        );
        assert_eq!(
            q("limit=1&follow=true", OUTPUT),
            "unknown query parameter `follow`; the query parameters are offset, limit, waitSeconds"
        );
        assert_eq!(
            q("statuss=running&lmit=2", &["status", "limit"]),
            "unknown query parameters `lmit` (did you mean `limit`?), `statuss` (did you mean `status`?)"
        );
        assert_eq!(
            q("x=1", &[]),
            "unknown query parameter `x`: this route takes none"
        );
        // Decoded before the check: %6Fffset is offset.
        assert!(Query::parse("%6Fffset=1&limit=2", OUTPUT).is_ok());
        assert!(Query::parse("", &[]).is_ok() && Query::parse("&&", &[]).is_ok());
    }
}
