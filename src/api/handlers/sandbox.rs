//! `GET /v1/sandbox`: the agent and its sandbox (version, boot, resumed or not, env names,
//! job counts by status, which limits it can enforce, its CPUs, memory, disk and load).

use std::collections::BTreeMap;

use serde_json::json;

use super::{Call, Reply};
use crate::api::app::App;
use crate::model::Status;

pub fn get(app: &App, _: &Call<'_>) -> Reply {
    let mut counts: BTreeMap<&str, usize> = Status::ALL.iter().map(|s| (s.as_str(), 0)).collect();
    let mut corrupt = 0;
    // One record at a time: counting holds none of them.
    super::jobs::scan(app, |_, loaded| match loaded {
        Ok(r) => *counts.entry(r.status.as_str()).or_default() += 1,
        Err(_) => corrupt += 1,
    });
    let mut jobs = serde_json::to_value(counts).unwrap_or_default();
    jobs["corrupt"] = corrupt.into();
    let s = &app.sandbox;
    Ok(json!({
        "version": crate::VERSION,
        "bootId": s.boot_id,
        "previousBootId": s.previous_boot_id,
        "resumed": s.resumed,
        "agentStartedAt": s.agent_started_at,
        "envNames": app.env().names()?,
        "jobs": jobs,
        "isolation": crate::job::launch::isolation(&app.cfg)?,
        "limits": crate::os::cgroup::capabilities(),
        "resources": crate::os::resources::sandbox(app.store.root()),
    }))
}
