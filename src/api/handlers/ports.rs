//! `GET /v1/ports`: the sandbox's listening TCP ports, and the jobs that hold them.

use serde_json::json;

use super::{Call, Reply};
use crate::api::app::App;

pub fn list(_: &App, _: &Call<'_>) -> Reply {
    Ok(json!({"ports": crate::os::ports::listening()}))
}
