//! The kernel: processes, pidfds, cgroups, polling, sockets. The only layer allowed
//! `unsafe`, each block with the reason it is sound.

#![allow(unsafe_code)]

pub mod alloc;
pub mod cgroup;
pub mod files;
pub mod forkserver;
pub mod pidfd;
pub mod poll;
pub mod ports;
pub mod privfile;
pub mod probe;
pub mod proc;
pub mod pty;
pub mod rename;
pub mod resources;
pub mod spawn;
pub mod sweep;
pub mod term;
pub mod users;
pub mod watch;
