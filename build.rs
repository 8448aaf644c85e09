//! Embeds the commit the binary is built from in `--version` (`GITTERM_BUILD`: the short
//! commit and its date, or "unknown" when the source is not a git checkout, as in a
//! tarball). Only git itself is asked; without it the build goes on.

use std::path::Path;
use std::process::Command;

/// What `git ARGS` printed (trimmed), if it ran and succeeded.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_string())
}

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    // A source tree unpacked inside some other repository is not that repository's commit.
    let ours = git(&["rev-parse", "--show-toplevel"]).is_some_and(|top| {
        Path::new(&top).canonicalize().ok() == Path::new(&manifest).canonicalize().ok()
    });
    let commit = ours
        .then(|| git(&["rev-parse", "--short", "HEAD"]))
        .flatten();
    let build = match &commit {
        Some(c) => match git(&["log", "-1", "--format=%cs"]) {
            Some(date) => format!("{c} {date}"),
            None => c.clone(),
        },
        None => "unknown".to_string(),
    };
    println!("cargo:rustc-env=GITTERM_BUILD={build}");
    // Built again when HEAD moves (a commit, a checkout), not on every change.
    println!("cargo:rerun-if-changed=build.rs");
    if commit.is_some() {
        let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
        watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
        for name in watched {
            if let Some(path) = git(&["rev-parse", "--git-path", &name])
                && Path::new(&path).exists()
            {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
}
