//! The integration tests: one binary, one harness ([`util`]).
//!
//! Each area has its module; every test that runs processes does so in a [`util::Sandbox`],
//! whose guard fails the test if it leaves any process behind.

mod util;

mod api;
mod cli;
mod corpus;
mod durability;
mod files;
mod harness;
mod jobs;
mod openapi;
