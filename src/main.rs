//! The one binary: the local commands, the server, and the (hidden) supervisor entry,
//! dispatched here so that no front end needs to know another.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use gitterm_agent::cli;

/// `--version`: the release, and the commit it was built from (see build.rs).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("GITTERM_BUILD"), ")");

#[derive(Parser)]
#[command(
    name = "gitterm-agent",
    version = VERSION,
    about = "Runs and supervises jobs inside a sandbox.",
    long_about = None,
    after_help = cli::after_help()
)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
#[command(defer = true)]
enum Command {
    #[command(flatten)]
    Local(cli::Cmd),
    /// Serve the HTTP/JSON control endpoint
    #[command(after_help = cli::ENVIRONMENT)]
    Serve(gitterm_agent::serve::ServeArgs),
    /// (internal) supervise one job
    #[command(hide = true)]
    Supervise {
        /// The state root the job is in
        #[arg(long)]
        root: PathBuf,
        /// The job's id
        id: String,
    },
}

fn main() {
    gitterm_agent::os::alloc::init();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(mut e) => {
            hint_the_separator(&mut e);
            let _ = e.print();
            std::process::exit(match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => 0,
                _ => 2,
            });
        }
    };
    let result = match cli.cmd {
        Command::Supervise { root, id } => {
            std::process::exit(gitterm_agent::job::supervisor::main(&root, &id))
        }
        Command::Local(cmd) => cli::main(cmd),
        Command::Serve(args) => gitterm_agent::serve::serve_main(args),
    };
    std::process::exit(match result {
        Ok(code) => code,
        Err(e) => {
            cli::diagnostic(&e);
            e.exit_status()
        }
    });
}

/// `exec true`, `exec ls -la`: a word clap does not take, where the command was meant;
/// the usage line alone does not tell a newcomer that the command follows `--`.
fn hint_the_separator(e: &mut clap::Error) {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument || std::env::args().nth(1).as_deref() != Some("exec")
    {
        return;
    }
    let Some(ContextValue::String(word)) = e.get(ContextKind::InvalidArg) else {
        return;
    };
    if word.starts_with('-') {
        return;
    }
    let tip =
        format!("the command goes after `--`, as in 'gitterm-agent exec [OPTIONS] -- {word} ...'");
    let mut tips = match e.get(ContextKind::Suggested) {
        Some(ContextValue::StyledStrs(t)) => t.clone(),
        _ => Vec::new(),
    };
    tips.push(tip.into());
    e.insert(ContextKind::Suggested, ContextValue::StyledStrs(tips));
}
