//! `POST /v1/jobs/{id}/signal`: a signal to a running job's process group or to every
//! process of it.

use super::{Call, Reply};
use crate::api::app::App;
use crate::api::request;

pub fn send(app: &App, call: &Call<'_>) -> Reply {
    let id = call.job()?;
    // An unknown job is 404 before its body is looked at, as for every job route.
    app.store.read_raw(&id)?;
    let body = request::signal_body(call.body)?;
    let (rec, _sent) = crate::job::signal::send(&app.store, &id, body.signal, body.target)?;
    Ok(app.store.view(&rec))
}
