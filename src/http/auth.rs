//! What the servers of the agent share to authenticate a request: comparing secrets in
//! constant time, single-use tickets for pages that cannot send a header, and origins
//! as browsers send them (to allow some pages, or to refuse a request from another one).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Head;
use crate::model::error::{Error, Result};
/// Constant-time comparison of secrets; one function for every server and the grants.
pub use crate::model::preview::ct_eq;

/// How long a ticket is valid.
pub const TICKET_TTL: Duration = Duration::from_secs(60);
/// The most tickets outstanding at once.
const MAX_TICKETS: usize = 1024;

/// Single-use credentials that open one request each, for a browser: neither a WebSocket
/// nor an `EventSource` can set the bearer header. Each names the one request path it
/// opens and carries the access of the token that minted it, never more. Kept in memory
/// only: a restart of the server forgets them all (a page mints another).
pub struct Tickets<A> {
    live: Mutex<Vec<Ticket<A>>>,
}

struct Ticket<A> {
    value: String,
    /// The request path it opens, as sent (`/v1/events`, `/v1/jobs/{id}/log`, ...).
    path: String,
    access: A,
    expires: Instant,
}

/// What a live ticket opens, and with what access.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TicketFor<A> {
    pub path: String,
    pub access: A,
}

impl<A> Default for Tickets<A> {
    fn default() -> Self {
        Tickets {
            live: Mutex::new(Vec::new()),
        }
    }
}

impl<A> std::fmt::Debug for Tickets<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tickets([redacted])")
    }
}

impl<A: Copy> Tickets<A> {
    /// A new ticket for `path` (256 random bits as hex, single use, valid [`TICKET_TTL`]
    /// from `now`) with `access`, and when it expires.
    pub fn issue(&self, path: String, access: A, now: Instant) -> Result<(String, Instant)> {
        let mut random = [0u8; 32];
        crate::os::proc::random_bytes(&mut random).map_err(|e| Error::io("random ticket", e))?;
        let value = crate::model::id::hex(&random);
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|t| t.expires > now);
        if live.len() >= MAX_TICKETS {
            return Err(Error::RateLimited(format!(
                "{MAX_TICKETS} tickets are outstanding, the most at once; use some or let them \
                 expire ({} s)",
                TICKET_TTL.as_secs()
            )));
        }
        let expires = now + TICKET_TTL;
        live.push(Ticket {
            value: value.clone(),
            path,
            access,
            expires,
        });
        Ok((value, expires))
    }

    /// What the ticket `given` opens, if it is live at `now`; it stays live (see
    /// [`Tickets::take`]), so that a request refused for anything else does not use it up.
    pub fn peek(&self, given: &str, now: Instant) -> Option<TicketFor<A>> {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let i = find(&live, given, now)?;
        Some(TicketFor {
            path: live[i].path.clone(),
            access: live[i].access,
        })
    }

    /// Uses the ticket `given` up; false if it is not live at `now` (a concurrent request
    /// took it first, or it expired meanwhile).
    pub fn take(&self, given: &str, now: Instant) -> bool {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|t| t.expires > now);
        match find(&live, given, now) {
            Some(i) => {
                live.swap_remove(i);
                true
            }
            None => false,
        }
    }
}

/// The index of the live ticket `given`. Every ticket is compared, each in constant time,
/// so the time taken tells nothing about how close a guess came.
fn find<A>(live: &[Ticket<A>], given: &str, now: Instant) -> Option<usize> {
    let mut hit = None;
    for (i, t) in live.iter().enumerate() {
        if ct_eq(t.value.as_bytes(), given.as_bytes()) && t.expires > now {
            hit = Some(i);
        }
    }
    hit
}

/// The browser origins allowed to use tickets and CORS, each as a browser serializes it
/// (`scheme://host[:port]`, lowercase, without a default port).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origins(Vec<String>);

impl Origins {
    /// Parses the values of the flag `flag`; a value that is not an origin is refused
    /// with what is wrong, so a typo does not silently lock every page out.
    pub fn parse(values: &[String], flag: &str) -> Result<Origins> {
        let mut list = Vec::new();
        for v in values {
            let o = normalize_origin(v).map_err(|why| {
                Error::Invalid(format!(
                    "{flag} {}: {why}; write it as a browser sends it, e.g. \
                     https://app.example.com or http://127.0.0.1:8080",
                    shown(v)
                ))
            })?;
            if !list.contains(&o) {
                list.push(o);
            }
        }
        Ok(Origins(list))
    }

    /// True if `origin` (an `Origin` header's value) is one of them.
    pub fn allows(&self, origin: &str) -> bool {
        normalize_origin(origin).is_ok_and(|o| self.0.contains(&o))
    }

    /// True when none is allowed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// An origin as browsers serialize it, or why `v` is not one.
pub fn normalize_origin(v: &str) -> std::result::Result<String, &'static str> {
    let v = v.trim().trim_end_matches('/').to_ascii_lowercase();
    if v == "null" {
        return Err("`null` is the origin of sandboxed and local pages, any of them anywhere");
    }
    if v == "*" {
        return Err("a wildcard would let every page in: name each origin");
    }
    let (scheme, rest) = v
        .split_once("://")
        .ok_or("an origin is scheme://host[:port]")?;
    if scheme.is_empty()
        || !scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        || !scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    {
        return Err("the scheme is not one");
    }
    if rest.contains(['/', '?', '#', '@']) {
        return Err("an origin has no path, query, fragment or user name");
    }
    // `[v6]` or a name, then `:port` or nothing.
    let (host, port) = if rest.starts_with('[') {
        let end = rest.find(']').map_or(rest.len(), |i| i + 1);
        let (h, p) = rest.split_at(end);
        match p {
            "" => (h, None),
            p => (h, Some(p.strip_prefix(':').ok_or("the host is not one")?)),
        }
    } else {
        match rest.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (rest, None),
        }
    };
    let host_ok = if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        !inner.is_empty()
            && inner
                .chars()
                .all(|c| c.is_ascii_hexdigit() || ":.".contains(c))
    } else {
        !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._~".contains(c))
    };
    if !host_ok {
        return Err("the host is not one");
    }
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => Some(n),
            _ => return Err("the port is not a number from 1 to 65535"),
        },
    };
    Ok(match (scheme, port) {
        ("http", Some(80)) | ("https", Some(443)) | (_, None) => format!("{scheme}://{host}"),
        (_, Some(p)) => format!("{scheme}://{host}:{p}"),
    })
}

/// The origin of the page a request says it comes from (its `Origin` header, once), if
/// any: `None` when absent, `Some(Err)` when sent twice or not an origin.
pub fn origin_of(head: &Head) -> Option<std::result::Result<String, &'static str>> {
    let mut all = head.all("origin");
    let first = all.next()?;
    if all.next().is_some() {
        return Some(Err("the Origin header is given more than once"));
    }
    Some(normalize_origin(first))
}

/// The request's own origin, `scheme://` + its `Host` (lowercase, without a default
/// port), for a server reached by `scheme`: what a page it served sends as `Origin`.
pub fn own_origin(head: &Head, scheme: &str) -> Option<String> {
    let mut hosts = head.all("host");
    let host = hosts.next()?;
    if hosts.next().is_some() {
        return None;
    }
    normalize_origin(&format!("{scheme}://{host}")).ok()
}

/// At most 80 characters of a value sent by a client, without controls.
pub fn shown(v: &str) -> String {
    let mut s: String = v.chars().take(80).filter(|c| !c.is_control()).collect();
    if v.chars().count() > 80 {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::parse_head;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Access {
        Full,
        Scoped,
    }

    const FLAG: &str = "--allowed-origin";

    #[test]
    fn origins_are_normalized_as_browsers_send_them() {
        let o = Origins::parse(
            &[
                "https://App.example/".into(),
                "http://127.0.0.1:8080".into(),
            ],
            FLAG,
        )
        .unwrap();
        assert!(o.allows("https://app.example"));
        assert!(o.allows("https://APP.example:443"));
        assert!(o.allows("http://127.0.0.1:8080"));
        for no in [
            "http://app.example",
            "https://app.example:8443",
            "https://app.example.evil",
            "http://127.0.0.1",
            "null",
            "",
            "https://app.example/x",
        ] {
            assert!(!o.allows(no), "{no}");
        }
        let v6 = Origins::parse(&["http://[::1]:3000".into()], FLAG).unwrap();
        assert!(v6.allows("http://[::1]:3000"));
        assert!(!v6.allows("http://[::1]"));
        assert_eq!(
            Origins::parse(&["http://x:80".into(), "http://x".into()], FLAG).unwrap(),
            Origins(vec!["http://x".into()])
        );
    }

    #[test]
    fn values_that_are_not_origins_are_refused_clearly() {
        for (bad, why) in [
            ("app.example", "scheme://host"),
            ("https://app.example/path", "no path"),
            ("https://user@app.example", "no path"),
            ("https://app.example:0", "port"),
            ("https://app.example:99999", "port"),
            ("https://app.example:+1", "port"),
            ("https://", "host"),
            ("https://a b", "host"),
            ("null", "sandboxed"),
            ("*", "wildcard"),
            ("1http://x", "scheme"),
        ] {
            let e = Origins::parse(&[bad.into()], FLAG).unwrap_err();
            assert!(e.message().contains(why), "{bad}: {}", e.message());
            assert!(e.message().contains("--allowed-origin"), "{bad}");
        }
    }

    #[test]
    fn tickets_are_single_use_and_expire() {
        let t = Tickets::<Access>::default();
        let now = Instant::now();
        let (a, expires) = t.issue("/v1/events".into(), Access::Full, now).unwrap();
        assert_eq!(expires - now, TICKET_TTL);
        assert!(TICKET_TTL <= Duration::from_secs(60));
        assert_eq!(a.len(), 64);
        let (b, _) = t
            .issue("/v1/jobs/x/log".into(), Access::Scoped, now)
            .unwrap();
        assert_ne!(a, b);
        // Looking does not use it up; taking does, once.
        let want = TicketFor {
            path: "/v1/events".into(),
            access: Access::Full,
        };
        assert_eq!(t.peek(&a, now), Some(want.clone()));
        assert_eq!(t.peek(&a, now), Some(want));
        assert!(t.take(&a, now));
        assert!(!t.take(&a, now));
        assert_eq!(t.peek(&a, now), None);
        assert_eq!(t.peek(&b, now).unwrap().access, Access::Scoped);
        // Expired: neither seen nor taken, at the very instant it expires.
        let later = now + TICKET_TTL;
        assert_eq!(t.peek(&b, later), None);
        assert!(!t.take(&b, later));
        assert!(t.peek(&b, later - Duration::from_millis(1)).is_none());
        // Near misses are not tickets.
        let (c, _) = t.issue("/v1/events".into(), Access::Full, now).unwrap();
        for near in [&c[..63], &format!("{c}0"), &c.to_uppercase(), ""] {
            assert_eq!(t.peek(near, now), None, "{near}");
        }
    }

    #[test]
    fn outstanding_tickets_are_bounded() {
        let t = Tickets::<Access>::default();
        let now = Instant::now();
        for _ in 0..MAX_TICKETS {
            t.issue("/v1/events".into(), Access::Full, now).unwrap();
        }
        let e = t.issue("/v1/events".into(), Access::Full, now).unwrap_err();
        assert!(matches!(e, Error::RateLimited(_)), "{e:?}");
        // Expired ones make room.
        assert!(
            t.issue("/v1/events".into(), Access::Full, now + TICKET_TTL)
                .is_ok()
        );
        assert!(!format!("{t:?}").contains('0'));
    }

    #[test]
    fn a_request_names_its_origin_once_and_its_own_by_host() {
        let head = |raw: &str| parse_head(raw.as_bytes(), 100).unwrap();
        let h = head(
            "GET / HTTP/1.1\r\nHost: App.Localhost:8080\r\nOrigin: http://app.localhost:8080\r\n\r\n",
        );
        assert_eq!(origin_of(&h), Some(Ok("http://app.localhost:8080".into())));
        assert_eq!(
            own_origin(&h, "http").as_deref(),
            Some("http://app.localhost:8080")
        );
        assert_eq!(
            own_origin(&h, "https").as_deref(),
            Some("https://app.localhost:8080")
        );
        let twice =
            head("GET / HTTP/1.1\r\nHost: a\r\nOrigin: http://a\r\nOrigin: http://b\r\n\r\n");
        assert!(matches!(origin_of(&twice), Some(Err(_))));
        let none = head("GET / HTTP/1.1\r\nHost: a:80\r\n\r\n");
        assert_eq!(origin_of(&none), None);
        assert_eq!(own_origin(&none, "http").as_deref(), Some("http://a"));
        let two_hosts = head("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n");
        assert_eq!(own_origin(&two_hosts, "http"), None);
        let bad = head("GET / HTTP/1.1\r\nHost: a/b\r\n\r\n");
        assert_eq!(own_origin(&bad, "http"), None);
    }
}
