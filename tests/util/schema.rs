//! Live answers against `docs/openapi.json`.
//!
//! For each answer: the schema documented for its route and status (`$ref`s resolved,
//! `allOf` merged, `oneOf`/`anyOf` tried in turn), applied all the way down nested objects
//! and arrays. A field the schema marks `required` must be there, every field that is
//! there must be one the schema names (or be allowed by an `additionalProperties`
//! *schema*: `additionalProperties: true` does not excuse an undocumented field in a
//! live answer), and `type`, `const` and `enum` must hold.

use std::sync::OnceLock;

use serde_json::Value;

use super::http::Resp;

/// The parsed `docs/openapi.json`.
pub fn spec() -> &'static Value {
    static SPEC: OnceLock<Value> = OnceLock::new();
    SPEC.get_or_init(|| {
        serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/openapi.json"
        )))
        .expect("docs/openapi.json parses")
    })
}

/// `#/components/schemas/<name>`.
pub fn named(name: &str) -> &'static Value {
    let s = &spec()["components"]["schemas"][name];
    assert!(s.is_object(), "no schema {name} in docs/openapi.json");
    s
}

/// The documented path (`/v1/jobs/{id}`) a request target falls under, if any.
pub fn route(target: &str) -> Option<&'static str> {
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    let got: Vec<&str> = path.split('/').collect();
    spec()["paths"].as_object()?.keys().find_map(|template| {
        let want: Vec<&str> = template.split('/').collect();
        let same = want.len() == got.len()
            && want.iter().zip(&got).all(|(w, g)| {
                if w.starts_with('{') && w.ends_with('}') {
                    !g.is_empty()
                } else {
                    w == g
                }
            });
        same.then_some(template.as_str())
    })
}

/// Checks an answer to `METHOD TARGET` against the documentation: `Ok(Some(what))` names
/// the documented answer it matched, `Ok(None)` means there was no JSON to check.
pub fn check_answer(method: &str, target: &str, r: &Resp) -> Result<Option<String>, String> {
    if r.body.is_empty() {
        return Ok(None);
    }
    let v: Value = match serde_json::from_slice(&r.body) {
        Ok(v) => v,
        Err(_) if r.header("content-type") != Some("application/json") => return Ok(None),
        Err(e) => {
            return Err(format!(
                "a JSON answer that does not parse ({e}): {}",
                r.text()
            ));
        }
    };
    let op = route(target).and_then(|t| Some((t, spec()["paths"][t].get(method.to_lowercase())?)));
    let (what, schema) = match op {
        Some((template, op)) => {
            let status = r.status.to_string();
            let responses = &op["responses"];
            let Some(answer) = responses.get(&status).or_else(|| responses.get("default")) else {
                return Err(format!(
                    "answered {status}, which docs/openapi.json does not list for \
                     {method} {template}: {v}"
                ));
            };
            let Some(schema) = resolve(answer).pointer("/content/application~1json/schema") else {
                return Err(format!(
                    "{method} {template} {status} is documented without a JSON body, \
                     but answered {v}"
                ));
            };
            (format!("{method} {template} {status}"), schema)
        }
        // Not a documented operation (an unknown path or a wrong method): an error answer.
        None if r.status >= 400 => ("Error".to_string(), named("Error")),
        None => return Err(format!("{} to an undocumented route: {v}", r.status)),
    };
    let errors = check(schema, &v);
    if errors.is_empty() {
        Ok(Some(what))
    } else {
        Err(format!(
            "the answer does not match docs/openapi.json ({what}):\n  {}\nanswer: {v:#}",
            errors.join("\n  ")
        ))
    }
}

/// Every way `v` differs from `schema`, each as `at: what`.
pub fn check(schema: &Value, v: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    check_at(schema, v, "$", &mut errors);
    errors
}

/// Follows `$ref`s (within docs/openapi.json) to the schema they name.
fn resolve(mut s: &Value) -> &Value {
    for _ in 0..32 {
        let Some(r) = s.get("$ref").and_then(Value::as_str) else {
            return s;
        };
        let pointer = r
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("only local $refs are supported, not {r}"));
        s = spec()
            .pointer(pointer)
            .unwrap_or_else(|| panic!("$ref {r} names nothing in docs/openapi.json"));
    }
    panic!("a $ref cycle in docs/openapi.json");
}

/// The schema and, recursively, every member of its `allOf`s, resolved.
fn parts(s: &Value) -> Vec<&Value> {
    let s = resolve(s);
    let mut all = vec![s];
    if let Some(members) = s.get("allOf").and_then(Value::as_array) {
        for m in members {
            all.extend(parts(m));
        }
    }
    all
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn has_type(v: &Value, t: &str) -> bool {
    match t {
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        "number" => v.is_number(),
        other => type_name(v) == other,
    }
}

fn check_at(schema: &Value, v: &Value, at: &str, errors: &mut Vec<String>) {
    let parts = parts(schema);
    for s in &parts {
        // Alternatives: oneOf needs exactly one to fit, anyOf at least one.
        for (key, exactly_one) in [("oneOf", true), ("anyOf", false)] {
            let Some(alts) = s.get(key).and_then(Value::as_array) else {
                continue;
            };
            let tries: Vec<Vec<String>> = alts
                .iter()
                .map(|a| {
                    let mut e = Vec::new();
                    check_at(a, v, at, &mut e);
                    e
                })
                .collect();
            let fits = tries.iter().filter(|e| e.is_empty()).count();
            if fits == 0 || (exactly_one && fits > 1) {
                let why: Vec<String> = tries
                    .iter()
                    .enumerate()
                    .map(|(i, e)| format!("[{i}] {}", e.join("; ")))
                    .collect();
                errors.push(format!(
                    "{at}: fits {fits} of the {} alternatives of {key}: {}",
                    alts.len(),
                    why.join(" | ")
                ));
            }
        }
        match s.get("type") {
            Some(Value::String(t)) if !has_type(v, t) => {
                errors.push(format!(
                    "{at}: a {} where the schema says {t}",
                    type_name(v)
                ));
            }
            Some(Value::Array(ts))
                if !ts
                    .iter()
                    .any(|t| t.as_str().is_some_and(|t| has_type(v, t))) =>
            {
                errors.push(format!(
                    "{at}: a {} where the schema says one of {}",
                    type_name(v),
                    Value::Array(ts.clone())
                ));
            }
            _ => {}
        }
        if let Some(c) = s.get("const")
            && c != v
        {
            errors.push(format!("{at}: {v} where the schema says {c}"));
        }
        if let Some(e) = s.get("enum").and_then(Value::as_array)
            && !e.contains(v)
        {
            errors.push(format!(
                "{at}: {v} is not one of {}",
                Value::Array(e.clone())
            ));
        }
    }
    // The object shape is the union of the parts' (as allOf means).
    let shaped = parts.iter().any(|s| {
        s.get("properties").is_some()
            || s.get("required").is_some()
            || s.get("additionalProperties").is_some()
            || s.get("type").and_then(Value::as_str) == Some("object")
    });
    if let (Some(obj), true) = (v.as_object(), shaped) {
        for s in &parts {
            for name in s
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let name = name.as_str().unwrap_or_default();
                if !obj.contains_key(name) {
                    errors.push(format!("{at}: the required field {name:?} is missing"));
                }
            }
        }
        for (k, val) in obj {
            let field = format!("{at}.{k}");
            let documented = parts
                .iter()
                .find_map(|s| s.get("properties")?.get(k))
                .or_else(|| {
                    parts
                        .iter()
                        .filter_map(|s| s.get("additionalProperties"))
                        .find(|a| a.is_object())
                });
            match documented {
                Some(sub) => check_at(sub, val, &field, errors),
                None => errors.push(format!("{field}: not in the schema")),
            }
        }
    }
    if let Some(items) = v.as_array()
        && let Some(item_schema) = parts.iter().find_map(|s| s.get("items"))
    {
        for (i, item) in items.iter().enumerate() {
            check_at(item_schema, item, &format!("{at}[{i}]"), errors);
        }
    }
}
