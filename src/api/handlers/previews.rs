//! `POST /v1/previews`: start a server job unless something already listens on the port,
//! then wait until the port answers.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{Call, Failure, Reply};
use crate::api::app::App;
use crate::api::request;
use crate::api::waits::Kind;
use crate::job::launch;
use crate::model::JobRecord;
use crate::model::error::Error;
use crate::os::probe::{self, Probe};
use crate::state::store::Store;

pub fn start(app: &App, call: &Call<'_>) -> Reply {
    let started = Instant::now();
    let key = call.idempotency_key()?;
    let b = request::preview_body(call.body, key)?;
    // Waiting for the port holds the connection as a long-poll does.
    let _slot = app.wait_slot("call again later")?;
    let deadline = started + Duration::from_secs_f64(b.wait_seconds);
    let port = b.port;
    let ready = |left: Duration| probe::ready(port, &b.probe, left.min(Duration::from_secs(2)));
    let answer = |job: Option<String>| {
        let job = job.or_else(|| {
            crate::os::ports::listening()
                .into_iter()
                .find(|l| l.port == port)
                .and_then(|l| l.job_id)
        });
        json!({
            "port": port,
            "ready": true,
            "jobId": job,
            "waitedMs": started.elapsed().as_millis() as u64,
        })
    };
    // Something already listening means the server is up (or starting): no new job.
    let listening = probe::ready(port, &Probe::Tcp, Duration::from_secs(1));
    // Without a timeoutSeconds the server job's timeout is the operator's cap
    // (--max-job-seconds), as any job's: it lives as long as the agent lets a job live.
    let job = match b.start {
        Some(start) if !listening => Some(launch::start(&app.store, &app.cfg, start)?.id),
        _ => None,
    };
    let w = job
        .as_ref()
        .map(|id| app.hub.watch(&app.store.job_dir(id), id));
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let seen = w.as_ref().map(|w| w.marks());
        if ready(left.max(Duration::from_millis(100))) {
            return Ok(answer(job.as_ref().map(|j| j.to_string())));
        }
        if let Some(id) = &job {
            let rec = crate::job::settle::settle_and_load(&app.store, id)?;
            if rec.status.is_final() {
                return Err(ended_first(&app.store, &rec, port));
            }
        }
        if Instant::now() >= deadline || app.hub.stopping() {
            let mut f = Failure::from(Error::Timeout(match &job {
                Some(id) => format!(
                    "nothing answered on port {port} within {} s; its server job {id} is still running (cancel it, or call again without a command to keep waiting)",
                    b.wait_seconds
                ),
                None => format!(
                    "nothing answered on port {port} within {} s",
                    b.wait_seconds
                ),
            }));
            if let Some(id) = &job {
                f.extra.insert("jobId".into(), id.to_string().into());
            }
            return Err(f);
        }
        let nap = Instant::now() + Duration::from_millis(100);
        match (&w, seen) {
            (Some(w), Some(seen)) => w.wait(seen, Kind::Record, nap.min(deadline)),
            _ => std::thread::sleep(nap.min(deadline).saturating_duration_since(Instant::now())),
        }
    }
}

/// The conflict answer when a preview's server job ended before its port answered.
fn ended_first(store: &Store, rec: &JobRecord, port: u16) -> Failure {
    let tail = store.tail(&rec.id);
    let how = match (rec.exit_code, &rec.signal) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => "no exit code".into(),
    };
    let short: String = {
        let chars: Vec<char> = tail.chars().collect();
        chars[chars.len().saturating_sub(1000)..].iter().collect()
    };
    let mut f = Failure::from(Error::Conflict(format!(
        "the preview's server job {} ended ({}, {how}) before port {port} answered; its last output:\n{short}",
        rec.id,
        rec.status.as_str()
    )));
    f.extra.insert("jobId".into(), rec.id.as_str().into());
    f.extra.insert("status".into(), rec.status.as_str().into());
    f.extra.insert("exitCode".into(), rec.exit_code.into());
    f.extra.insert("output".into(), tail.into());
    f
}
