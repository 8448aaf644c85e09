//! The state root on disk: where every file lives, atomic writes, records, the
//! persisted env and the sandbox record. Nothing here signals a process.

pub mod envstore;
pub mod events;
pub mod fsutil;
pub mod grants;
pub mod idempotency;
pub mod layout;
pub mod livesecrets;
pub mod sandbox;
pub mod sessions;
pub mod store;
pub mod unpacking;
pub mod watches;
