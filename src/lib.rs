//! gitterm-agent: runs and supervises jobs inside a sandbox.
//!
//! Layers are folders; each imports only the ones listed before it:
//! 1. [`model`]: ids, records, specs, requests, limits, errors (pure data, no I/O)
//! 2. [`text`]: the output pipeline (sanitize, redact), time formats (pure)
//! 3. [`os`]: processes, pidfds, cgroups, polling, sockets (the only home of `unsafe`)
//! 4. [`state`]: the state root on disk (layout, atomic writes, records, env, sandbox)
//! 5. [`job`]: one job's life: launch, the supervisor, cancel, settling lost jobs
//! 6. [`http`]: HTTP/1.1 over TCP and Unix sockets, for every server of the agent
//! 7. front ends, which never import each other: [`cli`], [`api`] and [`gate`]
//! 8. [`serve`]: `gitterm-agent serve`, which starts the servers of one process

#![deny(unsafe_code)]

pub mod api;
pub mod cli;
pub mod gate;
pub mod http;
pub mod job;
#[cfg(test)]
mod layering;
pub mod model;
pub mod os;
pub mod serve;
pub mod state;
pub mod text;

/// The agent's version, as reported by `--version` and `GET /v1/health`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
