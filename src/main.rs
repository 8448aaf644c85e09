//! The one binary: the local commands, the server, and the (hidden) supervisor entry,
//! dispatched here so that no front end needs to know another.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "gitterm-agent",
    version = gitterm_agent::VERSION,
    about = "Runs and supervises jobs inside a sandbox.",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Local(gitterm_agent::cli::Cmd),
    /// Serve the HTTP/JSON control endpoint
    Serve(gitterm_agent::api::ServeArgs),
    /// (internal) supervise one job
    #[command(hide = true)]
    Supervise {
        #[arg(long)]
        root: PathBuf,
        id: String,
    },
}

fn main() {
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
        Command::Local(cmd) => gitterm_agent::cli::main(cmd),
        Command::Serve(args) => gitterm_agent::api::serve_main(args),
    };
    std::process::exit(match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gitterm-agent: {e}");
            e.exit_status()
        }
    });
}
