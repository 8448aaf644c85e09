//! `session`: make, list and remove sessions (a folder and variables that carry from one
//! command to the next; run their commands with `exec --session ID -- COMMAND`).

use std::path::PathBuf;

use super::print::{print_json, print_line};
use crate::job::session::{self, NewSession};
use crate::model::error::Result;
use crate::model::session::Shell;
use crate::model::spec::Config;

/// Flags of `session`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// Make a session; prints its id (run its commands with `exec --session ID -- CMD`)
    New {
        /// The folder its first command starts in (default: this one)
        #[arg(long, value_name = "DIR")]
        cwd: Option<PathBuf>,
        /// The shell its commands run in: sh (the default) or bash (functions and aliases
        /// carry too)
        #[arg(long, value_name = "SHELL", value_parser = ["sh", "bash"], default_value = "sh")]
        shell: String,
        /// An exported variable its commands start with (repeatable)
        #[arg(long = "env", value_name = "NAME=VALUE")]
        env: Vec<String>,
        /// Run its commands as this user (from /etc/passwd) when the agent runs as root
        #[arg(long, value_name = "NAME", env = "GITTERM_JOB_USER")]
        job_user: Option<String>,
        /// Print the session as JSON instead of its id
        #[arg(long)]
        json: bool,
    },
    /// List the sessions: id, shell, running command, folder
    List {
        /// Print them as JSON
        #[arg(long)]
        json: bool,
    },
    /// Remove a session (its running command is cancelled)
    Rm {
        /// The session's id
        id: String,
    },
}

pub fn run(a: Args) -> Result<i32> {
    let store = super::open_store()?;
    match a.what {
        What::New {
            cwd,
            shell,
            env,
            job_user,
            json,
        } => {
            let mut new = NewSession {
                cwd: cwd.map(|c| c.to_string_lossy().into_owned()),
                shell: Shell::parse(&shell).unwrap_or_default(),
                user: job_user,
                ..NewSession::default()
            };
            for kv in env {
                let (k, v) = crate::model::env::parse_assignment(&kv)?;
                new.env.insert(k, v);
            }
            let v = session::create(&store, &Config::default(), new)?;
            if json {
                print_json(&v);
            } else {
                print_line(v["id"].as_str().unwrap_or_default());
            }
        }
        What::List { json } => {
            let all = session::list(&store);
            if json {
                print_json(&serde_json::json!({ "sessions": all }));
            } else {
                print_line(format!(
                    "{:<24}  {:<5}  {:<24}  CWD",
                    "ID", "SHELL", "RUNNING"
                ));
                for s in all {
                    let text = |k: &str| s[k].as_str().unwrap_or("-").to_string();
                    print_line(super::print::shown(&format!(
                        "{:<24}  {:<5}  {:<24}  {}",
                        text("id"),
                        text("shell"),
                        text("busy"),
                        text("cwd")
                    )));
                }
            }
        }
        What::Rm { id } => {
            let id = session::parse_id(&id)?;
            session::remove(&store, &Config::default(), &id)?;
            print_line(format!("removed {id}"));
        }
    }
    Ok(0)
}
