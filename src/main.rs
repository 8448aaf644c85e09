//! The one binary: the local commands, the server, and the (hidden) supervisor entry,
//! dispatched here so that no front end needs to know another.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use gitterm_agent::cli;

#[derive(Parser)]
#[command(
    name = "gitterm-agent",
    version = gitterm_agent::VERSION,
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
    Serve(gitterm_agent::api::ServeArgs),
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
        Err(e) => {
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
        Command::Serve(args) => gitterm_agent::api::serve_main(args),
    };
    std::process::exit(match result {
        Ok(code) => code,
        Err(e) => {
            cli::diagnostic(&e);
            e.exit_status()
        }
    });
}
