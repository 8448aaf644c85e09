//! Interactive jobs: their stdin and their terminal's size, through the job's supervisor.

use serde_json::json;

use super::{Call, Reply};
use crate::api::app::App;
use crate::api::request;
use crate::job::control::Control;
use crate::model::error::Error;

/// `POST /v1/jobs/{id}/stdin[?close=true]`: the raw body, appended to the job's stdin.
pub fn stdin(app: &App, call: &Call<'_>) -> Reply {
    let id = call.job()?;
    let close = match call.query.get("close") {
        None | Some("false") => false,
        Some("true") => true,
        Some(v) => {
            return Err(Error::Invalid(format!("close must be true or false, got {v:?}")).into());
        }
    };
    let mut c = Control::connect(&app.store, &id)?;
    c.stdin(call.body, close)?;
    Ok(json!({"ok": true}).into())
}

/// `POST /v1/jobs/{id}/resize` `{"cols", "rows"}`.
pub fn resize(app: &App, call: &Call<'_>) -> Reply {
    let id = call.job()?;
    crate::job::settle::load(&app.store, &id)?;
    let size = request::resize_body(call.body)?;
    let mut c = Control::connect(&app.store, &id)?;
    c.resize(size.cols, size.rows)?;
    Ok(json!({"ok": true}).into())
}
