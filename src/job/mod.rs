//! One job's life: starting it, its supervisor, cancelling it, and settling a job whose
//! supervisor is gone.

pub mod control;
pub mod handshake;
pub mod launch;
pub mod secrets;
pub mod session;
pub mod settle;
pub mod signal;
pub mod supervisor;
