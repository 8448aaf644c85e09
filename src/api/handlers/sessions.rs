//! Sessions: make one (`POST /v1/sessions`), list them, read one, remove one, and start
//! a command in one (`POST /v1/sessions/{id}/jobs`, answered as `POST /v1/jobs` is).

use serde_json::json;

use super::jobs::{wait_end, wait_end_events};
use super::{Call, Reply};
use crate::api::app::App;
use crate::api::request::{self, Wait};
use crate::job::session;
use crate::model::error::Error;
use crate::model::session::SessionId;
use crate::model::spec::StartRequest;

fn session_id(call: &Call<'_>) -> crate::model::error::Result<SessionId> {
    session::parse_id(call.id.unwrap_or_default())
}

fn forbidden_user() -> Error {
    Error::Forbidden("the scoped token may not choose the user a session's commands run as".into())
}

pub fn create(app: &App, call: &Call<'_>) -> Reply {
    let new = request::session_body(call.body)?;
    if call.scoped && new.user.is_some() {
        return Err(forbidden_user().into());
    }
    Ok(session::create(&app.store, &app.cfg, new)?)
}

pub fn list(app: &App, _: &Call<'_>) -> Reply {
    Ok(json!({ "sessions": session::list(&app.store) }))
}

pub fn get(app: &App, call: &Call<'_>) -> Reply {
    Ok(session::get(&app.store, &session_id(call)?)?)
}

pub fn delete(app: &App, call: &Call<'_>) -> Reply {
    let id = session_id(call)?;
    request::no_body(call.body)?;
    session::remove(&app.store, &app.cfg, &id)?;
    Ok(json!({ "ok": true }))
}

pub fn start(app: &App, call: &Call<'_>) -> Reply {
    let id = session_id(call)?;
    let key = call.idempotency_key()?;
    let body = request::session_job_body(call.body, key)?;
    let mut start = body.req;
    if call.scoped {
        // The scoped token's commands run as the user its jobs run as, never as one a
        // full-token session was made for.
        let view = session::get(&app.store, &id)?;
        let own = crate::job::launch::resolve_user(&StartRequest::default(), &app.cfg)?;
        if view["user"].as_str() != own.as_ref().map(|u| u.name.as_str()) && !view["user"].is_null()
        {
            return Err(forbidden_user().into());
        }
        if !body.secret_files.is_empty() {
            return Err(Error::Forbidden(
                "the scoped token may not name secretFiles: pass the values in secretEnv".into(),
            )
            .into());
        }
    }
    start.secrets = crate::job::secrets::gather(&body.secret_files, start.secrets)?;
    let _slot = match body.wait {
        Wait::Seconds(s) if s > 0.0 => {
            Some(app.wait_slot("start the command with background: true")?)
        }
        _ => None,
    };
    let (rec, events) = session::start(&app.store, &app.cfg, &id, start, None)?;
    let rec = match (body.wait, events) {
        (Wait::Background, _) => rec,
        (Wait::Seconds(s), Some(ev)) => wait_end_events(app, &rec.id.clone(), ev, s)?,
        (Wait::Seconds(s), None) => wait_end(app, &rec.id.clone(), s)?,
    };
    Ok(app.store.view(&rec))
}
