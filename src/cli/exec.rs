//! `exec`: runs a shell command as a job, streams its output, and exits with its status.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::exit::exit_status;
use super::follow::{Waiter, watch};
use super::print::{diagnostic, print_json, print_line};
use crate::job::launch;
use crate::model::error::Result;
use crate::model::limits::{LimitArgs, Seconds, SecondsOrZero};
use crate::model::spec::{self, Config, StartRequest};
use crate::model::{JobRecord, Status};
use crate::state::store::Store;

/// How `exec` exits (see [`exit_status`] and `Error::exit_status`).
const EXIT_STATUSES: &str = "\
Exit status:
  0      The job succeeded, or is still running when --wait ends
  1      The job was not started: too many jobs running, or --session names a
         session that is running another command (named) or that does not exist
  2      A usage error or bad input (e.g. --env, --cwd, --secret-file); nothing ran
  N      The job failed with exit code N (which may be one of these; --json tells)
  124    The job timed out (--timeout, --idle-timeout)
  125    The job could not be run or was lost (its supervisor died, the sandbox
         restarted), or the agent itself failed
  128+N  The job was killed by signal N; a cancelled job reports the signal that ended
         it (143 for TERM, 137 for KILL), else its own non-zero exit code
  130    The job was cancelled and exited 0 (it caught TERM) or left no status";

/// The end of `exec --help`.
pub fn after_help() -> String {
    format!("{EXIT_STATUSES}\n\n{}", super::ENVIRONMENT)
}

/// Flags of `exec`.
#[derive(clap::Args)]
pub struct Args {
    /// Seconds before the job is ended as timed out (at most --max-job-seconds, which is
    /// also the default)
    #[arg(long, value_name = "S", allow_hyphen_values = true)]
    timeout: Option<Seconds>,
    /// End the job as timed out after this many seconds without output
    #[arg(long, value_name = "S", allow_hyphen_values = true)]
    idle_timeout: Option<Seconds>,
    /// Wait at most this many seconds for the end, then leave the job running (0: print
    /// its id and return at once); default: until it ends
    #[arg(long, value_name = "S", allow_hyphen_values = true)]
    wait: Option<SecondsOrZero>,
    /// Working folder of the job
    #[arg(long, value_name = "DIR")]
    cwd: Option<PathBuf>,
    /// An environment variable for the job (repeatable)
    #[arg(long = "env", value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// A 0600 file of NAME=value secrets (repeatable); values are redacted from output
    #[arg(long = "secret-file", value_name = "FILE")]
    secret_files: Vec<PathBuf>,
    /// Print the job record (with its output tail) as JSON instead of streaming output
    #[arg(long)]
    json: bool,
    /// Run the job on a pseudo-terminal and attach this terminal to it (raw mode; Ctrl-]
    /// then d detaches and leaves it running)
    #[arg(long, conflicts_with_all = ["json", "wait"])]
    tty: bool,
    /// Do not pass this stdin to the job (it gets /dev/null), as `ssh -n`: for a job in a
    /// `while read` loop, or one started to run on in the background
    #[arg(short = 'n', long)]
    no_stdin: bool,
    #[command(flatten)]
    limits: LimitArgs,
    /// Run the command in this session (see `session new`): in its folder, with its
    /// variables, and what it changes carries to the session's next command
    #[arg(long, value_name = "ID", conflicts_with_all = ["cwd", "tty", "argv"])]
    session: Option<String>,
    /// The job's memory limit (bytes, or with K, M, G: 512M), enforced on its cgroup
    #[arg(long, value_name = "SIZE", value_parser = crate::model::resources::parse_size)]
    memory: Option<u64>,
    /// The job's CPU limit, in cores (1.5: one and a half)
    #[arg(long, value_name = "N")]
    cpus: Option<f64>,
    /// The most processes and threads the job may have at once
    #[arg(long, value_name = "N")]
    pids: Option<u64>,
    /// Run the words after -- as the program and its arguments, without a shell (no
    /// globbing, no $VARIABLES: each word is passed exactly)
    #[arg(long)]
    argv: bool,
    /// The command; words are joined with single spaces (as ssh does)
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

pub fn run(a: Args) -> Result<i32> {
    let cfg = a.limits.config();
    let limits = crate::model::resources::Limits {
        memory_bytes: a.memory,
        cpus: a.cpus,
        pids: a.pids,
    };
    let mut req = StartRequest {
        command: if a.argv {
            crate::model::resources::shell_quote(&a.command)
        } else {
            a.command.join(" ")
        },
        argv: a.argv.then(|| a.command.clone()),
        limits: (!limits.is_empty()).then_some(limits),
        cwd: a.cwd.map(|c| c.to_string_lossy().into_owned()),
        timeout_seconds: a.timeout.map(|t| t.0),
        idle_timeout_seconds: a.idle_timeout.map(|t| t.0),
        ..Default::default()
    };
    let wait = a.wait.map(|w| w.0);
    for kv in a.env {
        let (k, v) = crate::model::env::parse_assignment(&kv)?;
        req.env.insert(k, v);
    }
    req.secrets = crate::job::secrets::gather(&a.secret_files, Vec::new())?;
    let store = super::open_store()?;
    if a.tty {
        let (cols, rows) = crate::os::term::size(std::io::stdout()).unwrap_or((80, 24));
        req.pty = Some(spec::PtySize { cols, rows });
        let rec = crate::job::launch::start(&store, &cfg, req)?;
        note_clamped(&rec);
        return super::attach::session(&store, &rec.id, true);
    }
    let stdin = if a.no_stdin { None } else { passed_stdin() };
    let session = a
        .session
        .as_deref()
        .map(crate::job::session::parse_id)
        .transpose()?;
    exec(&store, &cfg, req, stdin, wait, a.json, session)
}

/// This process's stdin, when the job should have it: a pipe, a file or a socket becomes
/// the job's stdin itself (as `ssh` passes its stdin on). Not a terminal: without `--tty`
/// its keys stay this user's, and the job reads /dev/null, as it always did; not
/// /dev/null or a closed stdin, which leave nothing to pass (one `fstat`: the start of a
/// job without input stays as fast).
fn passed_stdin() -> Option<std::fs::File> {
    use nix::sys::stat::{SFlag, fstat};
    use std::os::fd::AsFd;
    let fd = std::io::stdin();
    let fd = fd.as_fd();
    let st = fstat(fd).ok()?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFCHR
        && (st.st_rdev == libc::makedev(1, 3) || nix::unistd::isatty(fd).unwrap_or(false))
    {
        return None;
    }
    fd.try_clone_to_owned().ok().map(std::fs::File::from)
}

fn exec(
    store: &Store,
    cfg: &Config,
    req: StartRequest,
    stdin: Option<std::fs::File>,
    wait: Option<f64>,
    json: bool,
    session: Option<crate::model::session::SessionId>,
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
    let default_timeout = req.timeout_seconds.is_none();
    let (rec, events) = match &session {
        Some(s) => crate::job::session::start(store, cfg, s, req, stdin)?,
        None => launch::start_with_stdin(store, cfg, req, stdin)?,
    };
    note_clamped(&rec);
    let id = rec.id.clone();
    let mut waiter = match events {
        Some(e) => Waiter::Events(e),
        None => Waiter::files(store, &id),
    };
    // `--wait 0` returns at once with the job id: no output, which could only be the
    // little the job printed so far.
    let detached = wait == Some(0.0);
    let mut deadline = wait.map(|w| Instant::now() + Duration::from_secs_f64(w));
    let mut stream = !json && !detached;
    let mut off = 0;
    let mut first = Some(rec);
    let rec = loop {
        match watch(
            store,
            &id,
            first.take(),
            stream.then_some(&mut off),
            deadline,
            &interrupted,
            &mut waiter,
        )? {
            Some(rec) => break rec,
            None => {
                // Nobody reads the output any more (e.g. `| head -1`): like Ctrl-C, end
                // the job rather than leave it running unattended.
                interrupted.store(true, Ordering::Relaxed);
                (stream, deadline) = (false, None);
            }
        }
    };
    if json {
        print_json(&store.view(&rec));
    } else {
        if detached {
            print_line(&rec.id);
        }
        if let Some(note) = notice(&rec, default_timeout) {
            diagnostic(note);
        }
    }
    Ok(exit_status(&rec))
}

/// Says on stderr that the job's timeout is shorter than asked, and how to raise it.
fn note_clamped(rec: &JobRecord) {
    if rec.timeout_clamped {
        diagnostic(clamped_note(rec));
    }
}

/// The note of [`note_clamped`].
fn clamped_note(rec: &JobRecord) -> String {
    format!(
        "note: --timeout is over the cap, so job {} times out after {} s; \
         raise the cap with --max-job-seconds S",
        rec.id, rec.timeout_seconds
    )
}

/// What `exec` says on stderr about how a job ended (or that it goes on), if anything:
/// the reason when the exit status alone does not tell it. A job given no timeout that
/// ran into the cap is told where that limit came from (`default_timeout`).
fn notice(rec: &JobRecord, default_timeout: bool) -> Option<String> {
    let id = &rec.id;
    if rec.status == Status::Running {
        return Some(format!(
            "job {id} is still running; follow it with: gitterm-agent logs --follow {id}"
        ));
    }
    // An OOM kill is told even when the job went on and succeeded.
    let reason = rec
        .reason
        .as_deref()
        .filter(|_| rec.status != Status::Succeeded || rec.oom_killed)?;
    let cap = if default_timeout
        && rec.status == Status::TimedOut
        && reason.starts_with("timed out after")
    {
        " (no --timeout was given: that is the cap, which --max-job-seconds S raises)"
    } else {
        ""
    };
    (matches!(rec.status, Status::TimedOut | Status::Lost)
        || rec.oom_killed
        || rec.output_truncated
        || rec.exit_code.is_none())
    .then(|| format!("job {id} {}: {reason}{cap}", rec.status.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record of the given status, with `fields` set over the defaults.
    fn rec(status: &str, fields: serde_json::Value) -> JobRecord {
        let mut v = serde_json::json!({
            "id": "job_0123456789abcdef0123", "command": "true", "cwd": "/",
            "status": status, "exitCode": null, "signal": null,
            "createdAt": "2024-01-01T00:00:00.000Z", "startedAt": null, "endedAt": null,
            "timeoutSeconds": 60.0, "pid": null, "pgid": null, "outputBytes": 0,
        });
        for (k, x) in fields.as_object().unwrap() {
            v[k] = x.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn exit_statuses_are_the_ones_the_help_lists() {
        use serde_json::json;
        let cases = [
            ("succeeded", json!({"exitCode": 0}), 0),
            ("running", json!({}), 0),
            ("failed", json!({"exitCode": 3}), 3),
            ("failed", json!({"signal": "SIGKILL"}), 137),
            ("failed", json!({}), 125),
            ("timed_out", json!({"signal": "SIGTERM"}), 124),
            ("lost", json!({}), 125),
            ("cancelled", json!({"signal": "SIGTERM"}), 143),
            ("cancelled", json!({"exitCode": 4}), 4),
            ("cancelled", json!({"exitCode": 0}), 130),
            ("cancelled", json!({}), 130),
        ];
        for (status, fields, want) in cases {
            let r = rec(status, fields.clone());
            assert_eq!(exit_status(&r), want, "{status} {fields}");
        }
    }

    #[test]
    fn notice_names_the_job_and_why_when_the_status_does_not() {
        use serde_json::json;
        let id = "job_0123456789abcdef0123";
        let running = notice(&rec("running", json!({})), false).unwrap();
        assert!(
            running.contains(&format!("logs --follow {id}")),
            "{running}"
        );
        let timed_out = rec("timed_out", json!({"reason": "ran past 60 s"}));
        assert_eq!(
            notice(&timed_out, false).unwrap(),
            format!("job {id} timed_out: ran past 60 s")
        );
        // Without --timeout, the cap is named as the limit that ended it.
        let capped = rec("timed_out", json!({"reason": "timed out after 3600 s"}));
        let note = notice(&capped, true).unwrap();
        assert!(
            note.ends_with("that is the cap, which --max-job-seconds S raises)"),
            "{note}"
        );
        assert!(!notice(&capped, false).unwrap().contains("cap"));
        let idle = rec(
            "timed_out",
            json!({"reason": "no output for 5 s (idle timeout)"}),
        );
        assert!(!notice(&idle, true).unwrap().contains("cap"));
        // A plain failure says it all with its exit code; a success needs no word.
        let failed = rec("failed", json!({"exitCode": 1, "reason": "x"}));
        assert_eq!(notice(&failed, true), None);
        let ok = rec("succeeded", json!({"exitCode": 0, "reason": "x"}));
        assert_eq!(notice(&ok, true), None);
        let cut = rec(
            "failed",
            json!({"exitCode": 1, "reason": "output cap", "outputTruncated": true}),
        );
        assert!(notice(&cut, true).unwrap().ends_with("failed: output cap"));
    }
}
