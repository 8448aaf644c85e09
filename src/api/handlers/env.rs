//! `GET` and `POST /v1/env`: the persisted environment every later job starts with. Names
//! only ever leave the agent, never values.

use serde_json::json;

use super::{Call, Reply};
use crate::api::app::App;
use crate::api::request;
use crate::state::envstore::Setter;

pub fn get(app: &App, _: &Call<'_>) -> Reply {
    Ok(json!({"names": app.env().names()?}))
}

pub fn set(app: &App, call: &Call<'_>) -> Reply {
    let b = request::env_body(call.body)?;
    let by = if call.scoped {
        Setter::Scoped
    } else {
        Setter::Full
    };
    let names = app.env().apply(&b.set, &b.unset, b.replace, by)?;
    Ok(json!({ "names": names }))
}
