//! `previews`: the preview grants, as `status` lists jobs; `previews revoke ID` takes one
//! away for good (a running `serve` sees the change within a fraction of a second and
//! closes the grant's open connections).

use super::print::{print_json, shown};
use crate::model::error::{Error, Result};
use crate::model::preview;
use crate::state::grants::{Grant, Grants};

/// Flags of `previews`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Option<Action>,
    /// Print the grants as JSON: {"grants": [...]}
    #[arg(long)]
    json: bool,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Revoke a grant: its requests get 401 from then on, and its open connections close
    Revoke {
        /// The grant's id (pv_…), as `previews` lists it
        id: String,
        /// Print the revoked grant as JSON
        #[arg(long)]
        json: bool,
    },
}

/// A grant as the CLI shows it: the open connections are the server's to count.
fn listed(g: &Grant) -> serde_json::Value {
    let mut v = serde_json::to_value(g).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.remove("connections");
    }
    v
}

fn state(g: &Grant) -> &'static str {
    let expired = crate::text::timefmt::parse(&g.expires_at)
        .is_some_and(|t| t <= std::time::SystemTime::now());
    if g.revoked {
        "revoked"
    } else if expired {
        "expired"
    } else if g.suspended {
        "suspended"
    } else {
        "live"
    }
}

pub fn run(a: Args) -> Result<i32> {
    let grants = Grants::open(&crate::state::layout::default_root())?;
    match a.action {
        Some(Action::Revoke { id, json }) => {
            if !preview::is_grant_id(&id) {
                return Err(Error::NotFound(format!(
                    "{} is not a grant id (pv_ + 26 letters and digits 2-7); `gitterm-agent \
                     previews` lists them",
                    shown(&id)
                )));
            }
            let g = grants.revoke(&id)?;
            if json {
                print_json(&listed(&g));
            } else {
                println!(
                    "revoked {} (port {} behind gate port {})",
                    g.id, g.port, g.gate_port
                );
            }
        }
        None => {
            let all = grants.list();
            if a.json {
                let v: Vec<_> = all.iter().map(listed).collect();
                print_json(&serde_json::json!({ "grants": v }));
            } else if all.is_empty() {
                println!("no preview grants");
            } else {
                println!(
                    "{:<30} {:>5} {:>5} {:<9} {:<6} {:<24} IDENTITY",
                    "ID", "PORT", "GATE", "STATE", "PUBLIC", "EXPIRES"
                );
                for g in &all {
                    let who = g.identity.as_ref().map_or("-".to_string(), |i| {
                        format!("{}:{}", shown(&i.scope), shown(&i.id))
                    });
                    let mut st = state(g).to_string();
                    if g.bypassable {
                        st.push('!');
                    }
                    println!(
                        "{:<30} {:>5} {:>5} {:<9} {:<6} {:<24} {who}",
                        g.id,
                        g.port,
                        g.gate_port,
                        st,
                        if g.public { "yes" } else { "no" },
                        g.expires_at,
                    );
                }
                if all.iter().any(|g| g.bypassable) {
                    println!(
                        "! the dev server also listens beyond loopback: it can be reached \
                         without the gate (bind it to 127.0.0.1)"
                    );
                }
            }
        }
    }
    Ok(0)
}
