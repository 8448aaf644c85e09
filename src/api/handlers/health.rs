//! `GET /v1/health`: liveness, for anyone; it tells nothing but the version.

use serde_json::json;

use super::{Call, Reply};
use crate::api::app::App;

pub fn get(_: &App, _: &Call<'_>) -> Reply {
    Ok(json!({"ok": true, "version": crate::VERSION}))
}
