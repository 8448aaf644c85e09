//! The integration tests: one binary, one harness ([`util`]).
//!
//! Each area has its module; every test that runs processes does so in a [`util::Sandbox`],
//! whose guard fails the test if it leaves any process behind.

mod util;

mod api;
mod api_flood;
mod cli;
mod cli_help;
mod corpus;
mod durability;
mod events;
mod files;
mod files_attacks;
mod harness;
mod hostile;
mod jobs;
mod log;
mod openapi;
mod pty;
mod refusals;
