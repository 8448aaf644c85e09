//! The integration tests: one binary, one harness ([`util`]).
//!
//! Each area has its module; every test that runs processes does so in a [`util::Sandbox`],
//! whose guard fails the test if it leaves any process behind.

mod util;

mod api;
mod api_flood;
mod cli;
mod cli_help;
mod cli_io;
mod corpus;
mod durability;
mod events;
mod files;
mod files_attacks;
mod harness;
mod hostile;
mod isolation;
mod jobs;
mod log;
mod openapi;
mod pending;
mod protocol;
mod pty;
mod refusals;
mod robust;
mod tickets;
