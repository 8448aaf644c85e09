//! The gate's open connections, by grant: what a revoke closes, what `connections`
//! counts, and the caps per grant and in total.

use std::collections::HashMap;
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard};

/// The open connections of every grant.
#[derive(Default)]
pub struct Live {
    inner: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next: u64,
    /// Grant id → connection id → its sockets (the browser's, and the dev server's while a
    /// request is forwarded).
    by_grant: HashMap<String, HashMap<u64, Vec<TcpStream>>>,
    total: usize,
}

/// Why a connection may not be counted to a grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Full {
    /// The grant has its most connections open.
    Grant(usize),
    /// The gate has its most connections open.
    Total(usize),
}

impl Live {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts `socket`'s connection to `grant`, within `per_grant` and `total` open
    /// connections; the connection is counted until the returned guard is dropped.
    pub fn register(
        self: &Arc<Live>,
        grant: &str,
        socket: TcpStream,
        per_grant: usize,
        total: usize,
    ) -> Result<Counted, Full> {
        let mut t = self.table();
        if t.total >= total {
            return Err(Full::Total(total));
        }
        let n = t.by_grant.get(grant).map_or(0, HashMap::len);
        if n >= per_grant {
            return Err(Full::Grant(per_grant));
        }
        t.next += 1;
        let id = t.next;
        t.by_grant
            .entry(grant.to_string())
            .or_default()
            .insert(id, vec![socket]);
        t.total += 1;
        Ok(Counted {
            live: Arc::clone(self),
            grant: grant.to_string(),
            id,
        })
    }

    /// Open connections of `grant`.
    pub fn count(&self, grant: &str) -> usize {
        self.table().by_grant.get(grant).map_or(0, HashMap::len)
    }

    /// Open connections of every grant.
    pub fn total(&self) -> usize {
        self.table().total
    }

    /// Shuts down every socket of every connection of `grant`: each connection's thread
    /// sees its reads and writes fail at once, and ends.
    pub fn close(&self, grant: &str) -> usize {
        let t = self.table();
        let Some(conns) = t.by_grant.get(grant) else {
            return 0;
        };
        for s in conns.values().flatten() {
            let _ = s.shutdown(Shutdown::Both);
        }
        conns.len()
    }

    /// The grants that have connections open.
    pub fn grants(&self) -> Vec<String> {
        self.table().by_grant.keys().cloned().collect()
    }
}

/// A connection counted to a grant (see [`Live::register`]).
pub struct Counted {
    live: Arc<Live>,
    grant: String,
    id: u64,
}

impl Counted {
    /// The grant it counts to.
    pub fn grant(&self) -> &str {
        &self.grant
    }

    /// Adds a socket that a revoke must close too (the dev server's side).
    pub fn add(&self, socket: TcpStream) {
        let mut t = self.live.table();
        if let Some(c) = t
            .by_grant
            .get_mut(&self.grant)
            .and_then(|m| m.get_mut(&self.id))
        {
            c.push(socket);
        }
    }

    /// Forgets every socket but the first (the browser's): the dev server's connection of
    /// a finished request is closed already.
    pub fn clear_upstream(&self) {
        let mut t = self.live.table();
        if let Some(c) = t
            .by_grant
            .get_mut(&self.grant)
            .and_then(|m| m.get_mut(&self.id))
        {
            c.truncate(1);
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut t = self.live.table();
        if let Some(m) = t.by_grant.get_mut(&self.grant)
            && m.remove(&self.id).is_some()
        {
            if m.is_empty() {
                t.by_grant.remove(&self.grant);
            }
            t.total -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn caps_counts_and_close() {
        let live = Arc::new(Live::default());
        let (a, mut a_peer) = pair();
        let (b, _b_peer) = pair();
        let (c, _c_peer) = pair();
        let ga = live.register("g1", a, 2, 3).unwrap();
        let _gb = live.register("g1", b.try_clone().unwrap(), 2, 3).unwrap();
        assert_eq!(
            live.register("g1", c.try_clone().unwrap(), 2, 3).err(),
            Some(Full::Grant(2))
        );
        let gc = live.register("g2", c.try_clone().unwrap(), 2, 3).unwrap();
        assert_eq!(
            live.register("g3", c.try_clone().unwrap(), 2, 3).err(),
            Some(Full::Total(3))
        );
        assert_eq!(
            (live.count("g1"), live.count("g2"), live.total()),
            (2, 1, 3)
        );
        assert_eq!(live.close("g1"), 2);
        let mut buf = [0u8; 1];
        assert_eq!(a_peer.read(&mut buf).unwrap(), 0);
        drop(ga);
        drop(gc);
        assert_eq!(
            (live.count("g1"), live.count("g2"), live.total()),
            (1, 0, 1)
        );
        assert_eq!(live.grants(), ["g1"]);
    }
}
