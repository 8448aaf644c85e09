//! `GET /v1/metrics`: the Prometheus text format, version 0.0.4. Job counters come from
//! the events journal (as the server follows it, rebuilt from what is kept at its start),
//! request counters from the server itself, the process figures from `/proc/self`: a
//! scrape never scans the job folders.

use std::fmt::Write;

use super::{Answer, Call};
use crate::api::app::App;
use crate::api::journal::BUCKETS;
use crate::http::Response;
use crate::model::Status;

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Quotes a label value as the format wants.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Bytes of resident memory and open fds of this process.
fn process() -> (u64, u64) {
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024;
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    (rss, fds)
}

/// The job CPU and OOM counters and the sandbox's gauges.
fn resources(out: &mut String, app: &App, jobs: &crate::api::journal::JobCounts) {
    family(
        out,
        "gitterm_job_cpu_seconds_total",
        "counter",
        "CPU seconds used by the jobs that ended (every process of each).",
    );
    let _ = writeln!(out, "gitterm_job_cpu_seconds_total {}", jobs.cpu_seconds);
    family(
        out,
        "gitterm_job_oom_kills_total",
        "counter",
        "Jobs that ended with one of their processes ended by the kernel's OOM killer.",
    );
    let _ = writeln!(out, "gitterm_job_oom_kills_total {}", jobs.oom_kills);
    let r = crate::os::resources::sandbox(app.store.root());
    let gauges: [(&str, &str, Option<f64>); 6] = [
        (
            "gitterm_sandbox_cpus",
            "CPUs the agent may run on.",
            Some(r.cpus as f64),
        ),
        (
            "gitterm_sandbox_memory_total_bytes",
            "The sandbox's memory (MemTotal).",
            r.memory_total_bytes.map(|v| v as f64),
        ),
        (
            "gitterm_sandbox_memory_available_bytes",
            "Memory available without swapping (MemAvailable).",
            r.memory_available_bytes.map(|v| v as f64),
        ),
        (
            "gitterm_sandbox_disk_total_bytes",
            "Size of the state root's filesystem.",
            r.disk_total_bytes.map(|v| v as f64),
        ),
        (
            "gitterm_sandbox_disk_free_bytes",
            "Free space on the state root's filesystem (for unprivileged users).",
            r.disk_free_bytes.map(|v| v as f64),
        ),
        (
            "gitterm_sandbox_load1",
            "The 1-minute load average.",
            r.load1,
        ),
    ];
    for (name, help, v) in gauges {
        if let Some(v) = v {
            family(out, name, "gauge", help);
            let _ = writeln!(out, "{name} {v}");
        }
    }
}

/// `GET /v1/metrics`: the scrape's text.
pub fn get(app: &App, _: &Call<'_>) -> Answer {
    app.feed.follow();
    let (jobs, http) = app.feed.snapshot();
    let running = std::fs::read_dir(app.store.running_dir()).map_or(0, |d| d.count());
    let mut out = String::with_capacity(4096);
    family(
        &mut out,
        "gitterm_jobs_started_total",
        "counter",
        "Jobs started.",
    );
    let _ = writeln!(out, "gitterm_jobs_started_total {}", jobs.started);
    family(
        &mut out,
        "gitterm_jobs_ended_total",
        "counter",
        "Jobs ended, by final status.",
    );
    for s in Status::ALL.iter().filter(|s| s.is_final()) {
        let n = jobs.ended.get(s.as_str()).copied().unwrap_or(0);
        let _ = writeln!(
            out,
            "gitterm_jobs_ended_total{{status=\"{}\"}} {n}",
            s.as_str()
        );
    }
    family(
        &mut out,
        "gitterm_jobs_running",
        "gauge",
        "Jobs running now.",
    );
    let _ = writeln!(out, "gitterm_jobs_running {running}");
    family(
        &mut out,
        "gitterm_job_output_bytes_total",
        "counter",
        "Bytes of output stored by the jobs that ended.",
    );
    let _ = writeln!(out, "gitterm_job_output_bytes_total {}", jobs.output_bytes);
    family(
        &mut out,
        "gitterm_redactions_total",
        "counter",
        "Secret occurrences masked in the output of the jobs that ended.",
    );
    let _ = writeln!(out, "gitterm_redactions_total {}", jobs.redactions);
    resources(&mut out, app, &jobs);
    family(
        &mut out,
        "gitterm_http_requests_total",
        "counter",
        "HTTP requests answered, by route template and status code.",
    );
    for (route, r) in &http {
        for (code, n) in &r.codes {
            let _ = writeln!(
                out,
                "gitterm_http_requests_total{{route=\"{}\",code=\"{code}\"}} {n}",
                label(route)
            );
        }
    }
    family(
        &mut out,
        "gitterm_http_request_duration_seconds",
        "histogram",
        "Time from a request's head to the end of its answer, by route template.",
    );
    for (route, r) in &http {
        let route = label(route);
        let mut cum = 0;
        for (i, b) in BUCKETS.iter().enumerate() {
            cum += r.buckets[i];
            let _ = writeln!(
                out,
                "gitterm_http_request_duration_seconds_bucket{{route=\"{route}\",le=\"{b}\"}} {cum}"
            );
        }
        let _ = writeln!(
            out,
            "gitterm_http_request_duration_seconds_bucket{{route=\"{route}\",le=\"+Inf\"}} {}\n\
             gitterm_http_request_duration_seconds_sum{{route=\"{route}\"}} {}\n\
             gitterm_http_request_duration_seconds_count{{route=\"{route}\"}} {}",
            r.count, r.sum, r.count
        );
    }
    if let Some(g) = app.grants.as_deref() {
        family(
            &mut out,
            "gitterm_gate_requests_total",
            "counter",
            "Requests the preview gate answered, by outcome (forwarded, exchanged, unauthorized, forbidden, unavailable, refused).",
        );
        for (outcome, n) in g.stats.all() {
            let _ = writeln!(
                out,
                "gitterm_gate_requests_total{{outcome=\"{outcome}\"}} {n}"
            );
        }
        family(
            &mut out,
            "gitterm_gate_connections",
            "gauge",
            "Connections open now through the preview gate to a grant.",
        );
        let _ = writeln!(out, "gitterm_gate_connections {}", g.live.total());
    }
    let (rss, fds) = process();
    family(
        &mut out,
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
    );
    let _ = writeln!(out, "process_resident_memory_bytes {rss}");
    family(
        &mut out,
        "process_open_fds",
        "gauge",
        "Number of open file descriptors.",
    );
    let _ = writeln!(out, "process_open_fds {fds}");
    Ok(Response::new(
        200,
        vec![
            (
                "Content-Type",
                "text/plain; version=0.0.4; charset=utf-8".into(),
            ),
            ("Cache-Control", "no-store".into()),
        ],
        out.into_bytes(),
    ))
}
