//! The command line: `exec`, `status`, `logs`, `cancel`, `serve`, `prune`, and the internal
//! `supervise`. Local commands read and write the same state root as the server.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use clap::Subcommand;

use crate::job::launch;
use crate::model::error::{Error, Result};
use crate::model::limits::{LimitArgs, Seconds, SecondsOrZero};
use crate::model::spec::{self, Config, StartRequest};
use crate::model::{JobId, JobRecord, Status};
use crate::state::store::{Listed, Store};

/// The local commands, for the person debugging inside the sandbox.
#[derive(Subcommand)]
pub enum Cmd {
    /// Run a shell command as a job; stream its output and exit with its status
    Exec {
        /// Seconds before the job is ended as timed out (capped by --max-job-seconds)
        #[arg(long, value_name = "S", allow_hyphen_values = true)]
        timeout: Option<Seconds>,
        /// End the job as timed out after this many seconds without output
        #[arg(long, value_name = "S", allow_hyphen_values = true)]
        idle_timeout: Option<Seconds>,
        /// Wait at most this many seconds for the end (0: return at once); default: until it ends
        #[arg(long, value_name = "S", allow_hyphen_values = true)]
        wait: Option<SecondsOrZero>,
        /// Working folder of the job
        #[arg(long, value_name = "DIR")]
        cwd: Option<PathBuf>,
        /// An environment variable for the job (repeatable)
        #[arg(long = "env", value_name = "K=V")]
        env: Vec<String>,
        /// A 0600 file of NAME=value secrets (repeatable); values are redacted from output
        #[arg(long = "secret-file", value_name = "F")]
        secret_files: Vec<PathBuf>,
        /// Print the job record (with its output tail) as JSON instead of streaming output
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        limits: LimitArgs,
        /// The command; words are joined with single spaces (as ssh does)
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// List jobs, or show one job's record and output tail
    Status {
        /// A job id
        id: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Print a job's stored output
    Logs {
        id: String,
        /// Start at this byte offset
        #[arg(long, default_value = "0")]
        offset: u64,
        /// Keep printing new output until the job ends
        #[arg(long, short)]
        follow: bool,
    },
    /// Cancel a job: TERM, then KILL after the grace period, to all its processes
    Cancel {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Remove ended jobs past the retention limits
    Prune {
        /// Keep at most this many ended jobs (newest first)
        #[arg(long, default_value = "1000")]
        keep_jobs: usize,
        /// Remove ended jobs older than this many days
        #[arg(long, default_value = "7")]
        keep_days: f64,
        #[arg(long)]
        json: bool,
    },
}

/// Runs one local command; `Err` is reported by the caller.
pub fn main(cmd: Cmd) -> Result<i32> {
    if matches!(
        cmd,
        Cmd::Status { .. } | Cmd::Logs { .. } | Cmd::Prune { .. }
    ) {
        // `status | head` should end quietly, as other Unix tools do, not panic in
        // println!. (`exec` keeps SIGPIPE ignored: a closed reader cancels its job.)
        crate::os::spawn::default_sigpipe();
    }
    run(cmd)
}

fn open_store() -> Result<Store> {
    Store::open(&crate::state::layout::default_root())
}

fn run(cmd: Cmd) -> Result<i32> {
    match cmd {
        Cmd::Exec {
            timeout,
            idle_timeout,
            wait,
            cwd,
            env,
            secret_files,
            json,
            limits,
            command,
        } => {
            let cfg = limits.config();
            let mut req = StartRequest {
                command: command.join(" "),
                cwd: cwd.map(|c| c.to_string_lossy().into_owned()),
                timeout_seconds: timeout.map(|t| t.0),
                idle_timeout_seconds: idle_timeout.map(|t| t.0),
                ..Default::default()
            };
            let wait = wait.map(|w| w.0);
            for kv in env {
                let (k, v) = kv.split_once('=').ok_or_else(|| {
                    Error::Invalid(format!("--env {kv:?} is malformed: use NAME=value"))
                })?;
                spec::check_env(k, v)?;
                req.env.insert(k.to_string(), v.to_string());
            }
            for f in &secret_files {
                for var in crate::os::privfile::load_file(f)? {
                    req.secrets.retain(|s| s.name != var.name);
                    req.secrets.push(var);
                }
            }
            let store = open_store()?;
            exec(&store, &cfg, req, wait, json)
        }
        Cmd::Status { id: Some(id), json } => {
            let store = open_store()?;
            let id = Store::parse_id(&id)?;
            let rec = crate::job::settle::load(&store, &id)?;
            if json {
                print_json(&store.view(&rec));
            } else {
                print_record(&store, &rec);
            }
            Ok(0)
        }
        Cmd::Status { id: None, json } => {
            let store = open_store()?;
            let list = crate::job::settle::list(&store);
            if json {
                print_json(
                    &serde_json::json!({"jobs": list.iter().map(listed_json).collect::<Vec<_>>()}),
                );
            } else {
                print_table(&list);
            }
            Ok(0)
        }
        Cmd::Logs { id, offset, follow } => {
            let store = open_store()?;
            let id = Store::parse_id(&id)?;
            crate::job::settle::load(&store, &id)?;
            let mut off = offset;
            let stop = Arc::new(AtomicBool::new(false));
            let mut waiter = Waiter::files(&store, &id);
            follow_output(&store, &id, &mut off, follow, None, &stop, &mut waiter)?;
            Ok(0)
        }
        Cmd::Cancel { id, json } => {
            let store = open_store()?;
            let id = Store::parse_id(&id)?;
            let rec = launch::cancel(&store, &id, Duration::from_secs(30))?;
            if json {
                print_json(&store.view(&rec));
            } else {
                println!("{} {}", rec.id, rec.status.as_str());
            }
            Ok(0)
        }
        Cmd::Prune {
            keep_jobs,
            keep_days,
            json,
        } => {
            let store = open_store()?;
            if !keep_days.is_finite() || keep_days < 0.0 {
                return Err(Error::Invalid(format!(
                    "--keep-days must be 0 or more, got {keep_days}"
                )));
            }
            let removed = crate::job::settle::prune(
                &store,
                keep_jobs,
                Duration::from_secs_f64(keep_days * 86_400.0),
            );
            if json {
                print_json(&serde_json::json!({"removed": removed}));
            } else if removed.is_empty() {
                println!("nothing to prune");
            } else {
                for r in &removed {
                    println!("removed {r}");
                }
                println!("{} jobs removed", removed.len());
            }
            Ok(0)
        }
    }
}

fn exec(
    store: &Store,
    cfg: &Config,
    req: StartRequest,
    wait: Option<f64>,
    json: bool,
) -> Result<i32> {
    // Ctrl-C (or TERM/HUP) cancels the job rather than orphaning it. Registered before
    // the start, so an interrupt during the start is not lost (it cancels the new job).
    let interrupted = Arc::new(AtomicBool::new(false));
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        let _ = signal_hook::flag::register(sig, Arc::clone(&interrupted));
    }
    let (rec, events) = launch::start_watched(store, cfg, req)?;
    let id = rec.id.clone();
    let mut waiter = match events {
        Some(e) => Waiter::Events(e),
        None => Waiter::files(store, &id),
    };
    let deadline = wait.map(|w| Instant::now() + Duration::from_secs_f64(w));
    let rec = if json {
        wait_end(store, &id, deadline, &interrupted, &mut waiter)?
    } else {
        let mut off = 0;
        let reader_gone = follow_output(
            store,
            &id,
            &mut off,
            true,
            deadline,
            &interrupted,
            &mut waiter,
        )?;
        if reader_gone {
            // Nobody reads the output any more (e.g. `| head -1`): like Ctrl-C, end the
            // job rather than leave it running unattended.
            interrupted.store(true, Ordering::Relaxed);
            wait_end(store, &id, None, &interrupted, &mut waiter)?
        } else {
            crate::job::settle::load(store, &id)?
        }
    };
    if json {
        print_json(&store.view(&rec));
    } else if rec.status == Status::Running {
        eprintln!(
            "gitterm-agent: job {} is still running; follow it with: gitterm-agent logs --follow {}",
            rec.id, rec.id
        );
    } else if let Some(reason) = rec
        .reason
        .as_deref()
        .filter(|_| rec.status != Status::Succeeded)
        && (matches!(rec.status, Status::TimedOut | Status::Lost)
            || rec.output_truncated
            || rec.exit_code.is_none())
    {
        {
            eprintln!(
                "gitterm-agent: job {} {}: {reason}",
                rec.id,
                rec.status.as_str()
            );
        }
    }
    Ok(exit_status(&rec))
}

/// How a waiting command learns that a job changed.
enum Waiter {
    /// The change channel of a job this process started.
    Events(launch::JobEvents),
    /// Watching the job's folder.
    Files(Option<crate::os::watch::Watcher>),
}

impl Waiter {
    fn files(store: &Store, id: &JobId) -> Waiter {
        Waiter::Files(crate::os::watch::Watcher::new(&store.job_dir(id)))
    }

    fn wait(&mut self, d: Duration) {
        match self {
            Waiter::Events(e) => {
                e.wait(d);
            }
            Waiter::Files(w) => crate::os::watch::nap(w.as_ref(), d),
        }
    }
}

fn wait_end(
    store: &Store,
    id: &JobId,
    deadline: Option<Instant>,
    interrupted: &AtomicBool,
    waiter: &mut Waiter,
) -> Result<JobRecord> {
    let mut cancel_sent = false;
    loop {
        let rec = crate::job::settle::load(store, id)?;
        let now = Instant::now();
        if rec.status.is_final() || deadline.is_some_and(|d| now >= d) {
            return Ok(rec);
        }
        if interrupted.load(Ordering::Relaxed) && !cancel_sent {
            cancel_sent = true;
            request_cancel(&rec);
        }
        let nap = deadline.map_or(Duration::from_millis(250), |d| {
            (d - now).min(Duration::from_millis(250))
        });
        waiter.wait(nap);
    }
}

fn request_cancel(rec: &JobRecord) {
    if let (Some(pid), Some(start)) = (rec.supervisor_pid, rec.supervisor_start) {
        crate::os::pidfd::signal_verified(pid, start, nix::sys::signal::Signal::SIGUSR1);
    }
}

/// Prints output from `*off`; with `follow`, keeps going until the job has ended and all
/// its output is printed (or `deadline` passes). Returns true if stdout was closed.
fn follow_output(
    store: &Store,
    id: &JobId,
    off: &mut u64,
    follow: bool,
    deadline: Option<Instant>,
    interrupted: &AtomicBool,
    waiter: &mut Waiter,
) -> Result<bool> {
    let mut stdout = std::io::stdout().lock();
    let mut cancel_sent = false;
    loop {
        // Read the record before the output: if it says "ended", all output is on disk.
        let rec = crate::job::settle::load(store, id)?;
        loop {
            let page = store.read_page(id, *off, crate::state::layout::MAX_PAGE)?;
            if !page.data.is_empty() && stdout.write_all(page.data.as_bytes()).is_err() {
                return Ok(true); // reader went away (e.g. `| head`)
            }
            *off = page.next_offset;
            if page.eof {
                break;
            }
        }
        let _ = stdout.flush();
        if !follow || rec.status.is_final() || deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(false);
        }
        if interrupted.load(Ordering::Relaxed) && !cancel_sent {
            cancel_sent = true;
            request_cancel(&rec);
        }
        let nap = deadline.map_or(Duration::from_millis(250), |d| {
            d.saturating_duration_since(Instant::now())
                .min(Duration::from_millis(250))
        });
        waiter.wait(nap);
    }
}

/// The CLI exit status for a job: its own code, 128+signal, 124 timed out, 125 lost.
pub fn exit_status(rec: &JobRecord) -> i32 {
    let by_signal = || {
        rec.signal
            .as_deref()
            .and_then(|s| s.parse::<nix::sys::signal::Signal>().ok())
            .map(|s| 128 + s as i32)
    };
    match rec.status {
        Status::Running => 0,
        Status::Succeeded => 0,
        Status::TimedOut => 124,
        Status::Lost => 125,
        Status::Failed if rec.exit_code.is_none() && rec.signal.is_none() => 125,
        Status::Failed => rec.exit_code.or_else(by_signal).unwrap_or(125),
        // A cancelled job never reports success, even if it trapped TERM and exited 0.
        Status::Cancelled => by_signal()
            .or(rec.exit_code.filter(|&c| c != 0))
            .unwrap_or(130),
    }
}

fn print_json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

fn listed_json(l: &Listed) -> serde_json::Value {
    match l {
        Listed::Job(r) => serde_json::to_value(r.as_ref()).unwrap_or_default(),
        Listed::Corrupt { id, error } => {
            serde_json::json!({"id": id, "corrupt": true, "error": error})
        }
    }
}

fn since(ts: Option<&str>, until: SystemTime) -> Option<Duration> {
    until.duration_since(crate::text::timefmt::parse(ts?)?).ok()
}

/// A short human duration: `850ms`, `12s`, `5m`, `3h`, `2d`.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        1..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

fn print_table(list: &[Listed]) {
    let now = SystemTime::now();
    println!(
        "{:<24}  {:<9}  {:>5}  {:>8}  {:>7}  COMMAND",
        "ID", "STATUS", "AGE", "DURATION", "EXIT"
    );
    for l in list {
        match l {
            Listed::Job(r) => {
                let end = r
                    .ended_at
                    .as_deref()
                    .and_then(crate::text::timefmt::parse)
                    .unwrap_or(now);
                let dur = since(r.started_at.as_deref(), end)
                    .map(human)
                    .unwrap_or_else(|| "-".into());
                let age = since(Some(&r.created_at), now)
                    .map(human)
                    .unwrap_or_else(|| "-".into());
                let exit = match (&r.exit_code, &r.signal) {
                    (Some(c), _) => c.to_string(),
                    (None, Some(s)) => s.clone(),
                    _ => "-".into(),
                };
                let cmd: String = r
                    .command
                    .chars()
                    .map(|c| if c.is_control() { ' ' } else { c })
                    .take(60)
                    .collect();
                println!(
                    "{:<24}  {:<9}  {:>5}  {:>8}  {:>7}  {cmd}",
                    r.id,
                    r.status.as_str(),
                    age,
                    dur,
                    exit
                );
            }
            Listed::Corrupt { id, error } => println!("{id:<24}  {:<9}  {error}", "corrupt"),
        }
    }
}

fn print_record(store: &Store, rec: &JobRecord) {
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    println!("id:        {}", rec.id);
    println!("status:    {}", rec.status.as_str());
    if let Some(r) = &rec.reason {
        println!("reason:    {r}");
    }
    println!("command:   {}", rec.command);
    println!("cwd:       {}", rec.cwd);
    println!(
        "exit:      {}",
        rec.exit_code
            .map(|c| c.to_string())
            .or(rec.signal.clone())
            .unwrap_or_else(|| "-".into())
    );
    println!("created:   {}", rec.created_at);
    println!("started:   {}", opt(&rec.started_at));
    println!("ended:     {}", opt(&rec.ended_at));
    println!("timeout:   {} s", rec.timeout_seconds);
    println!(
        "pid/pgid:  {}/{}",
        rec.pid.map_or("-".into(), |p| p.to_string()),
        rec.pgid.map_or("-".into(), |p| p.to_string())
    );
    let id = Some(rec.id.clone());
    let bytes = if rec.status == Status::Running {
        store.output_size(&rec.id)
    } else {
        rec.output_bytes
    };
    println!(
        "output:    {bytes} bytes{}",
        if rec.output_truncated {
            " (truncated)"
        } else {
            ""
        }
    );
    if let Some(id) = id {
        let tail = store.tail(&id);
        if !tail.is_empty() {
            println!("--- output tail ---");
            print!("{tail}");
            if !tail.ends_with('\n') {
                println!();
            }
        }
    }
}
