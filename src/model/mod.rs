//! Pure data: ids, records, specs, requests, limits and errors. Nothing here does I/O.

pub mod env;
pub mod error;
pub mod hash;
pub mod id;
pub mod limits;
pub mod preview;
pub mod record;
pub mod resources;
pub mod secret;
pub mod session;
pub mod spec;

pub use id::JobId;
pub use record::{FORMAT_VERSION, JobRecord, Status};
