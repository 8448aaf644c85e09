//! Preview grants: `POST /v1/previews/grants` (mint, scoped token too: publishing a port
//! is part of a job's work), `POST /v1/previews/grants/{id}/tokens`, `GET
//! /v1/previews/grants` and `POST /v1/previews/grants/{id}/revoke` (full token only:
//! taking a preview away is the operator's call). The gate itself is `crate::gate`.

use serde_json::{Value, json};

use super::{Call, Reply};
use crate::api::app::App;
use crate::api::request::{grant_body, no_body};
use crate::model::error::Error;
use crate::model::preview;
use crate::state::grants::{Grant, Grants, Issued};

fn grants(app: &App) -> Result<&Grants, Error> {
    app.grants.as_deref().ok_or_else(|| {
        Error::Internal("previews are not set up in this server (no grants store)".into())
    })
}

fn id<'a>(call: &Call<'a>) -> Result<&'a str, Error> {
    call.id.filter(|i| preview::is_grant_id(i)).ok_or_else(|| {
        Error::NotFound(format!(
            "no preview grant {}; ids are pv_ + 26 lowercase letters and digits 2-7, and \
             GET /v1/previews/grants lists them",
            crate::http::auth::shown(call.id.unwrap_or(""))
        ))
    })
}

fn grant_json(g: &Grant) -> Value {
    serde_json::to_value(g).unwrap_or_default()
}

fn token_json(t: &Issued) -> Value {
    json!({
        "token": t.token,
        "tokenExpiresAt": crate::text::timefmt::rfc3339(
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(t.expires_at)
        ),
    })
}

/// Mints a grant (or returns the live one with the same key) and a token for it.
pub fn mint(app: &App, call: &Call<'_>) -> Reply {
    let m = grant_body(call.body)?;
    let (g, t) = grants(app)?.mint(m)?;
    let mut v = grant_json(&g);
    if let (Value::Object(o), Value::Object(t)) = (&mut v, token_json(&t)) {
        o.extend(t);
    }
    Ok(v)
}

/// Another token for a live grant.
pub fn token(app: &App, call: &Call<'_>) -> Reply {
    no_body(call.body)?;
    let t = grants(app)?.token(id(call)?)?;
    Ok(token_json(&t))
}

/// Every grant kept, with its open connections; never a token.
pub fn list(app: &App, _call: &Call<'_>) -> Reply {
    let all: Vec<Value> = grants(app)?.list().iter().map(grant_json).collect();
    Ok(json!({ "grants": all }))
}

/// Revokes a grant for good; its open connections close.
pub fn revoke(app: &App, call: &Call<'_>) -> Reply {
    no_body(call.body)?;
    let g = grants(app)?.revoke(id(call)?)?;
    Ok(grant_json(&g))
}
