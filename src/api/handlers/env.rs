//! `GET` and `POST /v1/env`: the persisted environment every later job starts with. Names
//! only ever leave the agent, never values.

use serde_json::json;

use super::{Call, Reply};
use crate::api::app::App;
use crate::api::request;

pub fn get(app: &App, _: &Call<'_>) -> Reply {
    Ok(json!({"names": app.env().names()?}).into())
}

pub fn set(app: &App, call: &Call<'_>) -> Reply {
    let b = request::env_body(call.body)?;
    let names = app.env().apply(&b.set, &b.unset, b.replace)?;
    Ok(json!({ "names": names }).into())
}
