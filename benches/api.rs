//! Benchmark of the HTTP endpoint (not a test; run with `scripts/bench-api.sh`).
//!
//! Prints: start-to-result latency of `true` through `POST /v1/jobs` (waitSeconds) over one
//! keep-alive connection, next to a bare spawn of `sh -c true` in the same run; the idle
//! server's RSS; and each supervisor's memory with 100 `sleep` jobs running.

#[path = "../tests/util/mod.rs"]
mod util;

use std::time::{Duration, Instant};
use util::*;
const RUNS: usize = 200;

fn stats(name: &str, mut v: Vec<Duration>) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let pick = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
    println!(
        "{name:<44} n={:<4} median {:>7.3} ms   p95 {:>7.3} ms   min {:>7.3} ms",
        v.len(),
        ms(pick(0.5)),
        ms(pick(0.95)),
        ms(v[0])
    );
}

/// (VmRSS, Pss) of a process, in KiB.
fn memory(pid: u32) -> (u64, u64) {
    let field = |file: &str, key: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/{file}"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with(key))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            })
            .unwrap_or(0)
    };
    (field("status", "VmRSS:"), field("smaps_rollup", "Pss:"))
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this binary without it,
    // and a benchmark is no test: it then only checks that it builds.
    if !std::env::args().any(|a| a == "--bench") {
        println!("benchmark skipped: run it with scripts/bench-api.sh (cargo bench --bench api)");
        return;
    }
    let s = Server::start(&[]);
    // Unchecked: the tests check answers against docs/openapi.json; timing that is not the
    // point here.
    let mut c = s.client().unchecked();
    std::thread::sleep(Duration::from_millis(300));
    let (rss, pss) = memory(s.pid());
    println!("serve idle: VmRSS {rss} KiB, Pss {pss} KiB");

    let body = json!({"command": "true", "waitSeconds": 30});
    for _ in 0..20 {
        c.post("/v1/jobs", &body);
    }
    let mut http = Vec::with_capacity(RUNS);
    let mut spawn = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        // Interleaved, so both see the same machine load.
        let t = Instant::now();
        let r = c.post("/v1/jobs", &body);
        http.push(t.elapsed());
        assert_eq!(r.json()["status"], "succeeded", "{}", r.text());
        let t = Instant::now();
        let st = std::process::Command::new("sh")
            .args(["-c", "true"])
            .status()
            .unwrap();
        spawn.push(t.elapsed());
        assert!(st.success());
    }
    stats("POST /v1/jobs `true` (keep-alive, waited)", http);
    stats("bare spawn of `sh -c true` (std Command)", spawn);

    let mut health = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let t = Instant::now();
        c.get("/v1/health");
        health.push(t.elapsed());
    }
    stats("GET /v1/health (keep-alive)", health);

    let mut cli = Vec::with_capacity(50);
    for _ in 0..50 {
        let t = Instant::now();
        let st = std::process::Command::new(BIN)
            .args(["exec", "--json", "--", "true"])
            .env("GITTERM_HOME", &s.home)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        cli.push(t.elapsed());
        assert!(st.success());
    }
    stats("CLI `exec --json -- true` (for reference)", cli);
    let (rss, pss) = memory(s.pid());
    println!(
        "serve after {} jobs: VmRSS {rss} KiB, Pss {pss} KiB",
        RUNS + 70
    );

    let ids: Vec<String> = (0..100)
        .map(|_| {
            let r = c.post(
                "/v1/jobs",
                &json!({"command": "sleep 300", "background": true}),
            );
            r.json()["id"].as_str().unwrap().to_string()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let sups: Vec<u32> = ids
        .iter()
        .map(|id| {
            c.get(&format!("/v1/jobs/{id}")).json()["supervisorPid"]
                .as_u64()
                .unwrap() as u32
        })
        .collect();
    let mems: Vec<(u64, u64)> = sups.iter().map(|&p| memory(p)).collect();
    let n = mems.len() as u64;
    let rss: u64 = mems.iter().map(|m| m.0).sum();
    let pss: u64 = mems.iter().map(|m| m.1).sum();
    println!(
        "100 sleep jobs: per supervisor VmRSS {} KiB, Pss {} KiB (all 100: Pss {} KiB)",
        rss / n,
        pss / n,
        pss
    );
    let (rss, pss) = memory(s.pid());
    println!("serve with 100 running: VmRSS {rss} KiB, Pss {pss} KiB");
    let t = Instant::now();
    for id in &ids {
        c.post(&format!("/v1/jobs/{id}/cancel"), &json!({}));
    }
    println!(
        "cancelled 100 jobs one by one in {:.0} ms",
        t.elapsed().as_secs_f64() * 1000.0
    );
}
