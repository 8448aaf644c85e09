//! gitterm-agent: runs and supervises jobs inside a sandbox.
//!
//! Layers, each using only those above it:
//! 1. pure logic: [`job`], [`timefmt`], [`sanitize`], [`redact`], [`secrets`], [`error`]
//! 2. storage: [`store`], [`envstore`]
//! 3. processes: [`proc`]
//! 4. one job's life: [`supervise`], started through [`launch`]
//! 5. front ends: [`cli`] and [`api`]

pub mod api;
pub mod cli;
pub mod envstore;
pub mod error;
pub mod job;
pub mod launch;
pub mod output;
pub mod ports;
pub mod probe;
pub mod proc;
pub mod redact;
pub mod sandbox;
pub mod sanitize;
pub mod secrets;
pub mod store;
pub mod supervise;
pub mod timefmt;

/// The agent's version, as reported by `--version` and `GET /v1/health`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
