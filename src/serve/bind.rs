//! Binding `--listen`: a TCP address, or a Unix socket file created 0600.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use super::DEFAULT_LISTEN;
use crate::http;
use crate::model::error::{Error, Result};

/// Binds `--listen`: `ADDR:PORT` or `unix:/path` (a 0600 socket file).
pub fn bind(listen: &str) -> Result<http::Listener> {
    if let Some(path) = listen.strip_prefix("unix:") {
        return bind_unix(Path::new(path)).map(|l| http::Listener::Unix(l, path.into()));
    }
    let addrs: Vec<std::net::SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(listen)
        .map_err(|e| {
            Error::Invalid(format!(
                "--listen {listen:?}: expected ADDR:PORT (e.g. {DEFAULT_LISTEN}) or unix:/path ({e})"
            ))
        })?
        .collect();
    let l = std::net::TcpListener::bind(&addrs[..])
        .map_err(|e| Error::io(format!("cannot listen on {listen}"), e))?;
    Ok(http::Listener::Tcp(l))
}

fn bind_unix(path: &Path) -> Result<UnixListener> {
    if path.as_os_str().is_empty() {
        return Err(Error::Invalid("--listen unix: needs a path".into()));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            // A socket left by a server that was killed: reuse the path, unless a server
            // still answers there.
            if UnixStream::connect(path).is_ok() {
                return Err(Error::Internal(format!(
                    "cannot listen on unix:{}: another server is answering there",
                    path.display()
                )));
            }
            std::fs::remove_file(path).map_err(|e| {
                Error::io(format!("removing the stale socket {}", path.display()), e)
            })?;
        }
        Ok(_) => {
            return Err(Error::Invalid(format!(
                "--listen unix:{}: the path exists and is not a socket; refusing to replace it",
                path.display()
            )));
        }
        Err(_) => {}
    }
    // The socket file is created 0600 from the start (not chmod-ed after, which would leave
    // a moment where anyone may connect). Still single-threaded here, so the process-wide
    // umask change affects nothing else.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let l = bound.map_err(|e| Error::io(format!("cannot listen on unix:{}", path.display()), e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::io(format!("chmod 0600 {}", path.display()), e))?;
    Ok(l)
}
