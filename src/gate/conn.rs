//! One browser connection: its requests in turn (keep-alive), each checked in this order
//! before anything reaches the dev server: the head within 16 KiB and its time, one
//! `Host`, one framing (`Content-Length` and `Transfer-Encoding` together → 400); then a
//! `preview_token` is exchanged (302) or refused (401), else the gate cookie must open a
//! live grant of this port (401, or 503 for a suspended grant), the grant's connection cap
//! must have room, and an unsafe method or an upgrade must come from the request's own
//! origin (403). Only then is it forwarded.

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use super::answer::{self, Outcome};
use super::forward::{self, Upstream};
use super::{Gate, log};
use crate::http::auth::{origin_of, own_origin, shown};
use crate::http::{self, Fault, Framing, Head, Stream};
use crate::model::preview;
use crate::state::grants::{Counted, Denied, Full};

/// Serves one accepted connection until it closes.
pub(super) fn connection(gate: &Gate, gate_port: u16, client: TcpStream, peer: SocketAddr) {
    let accepted = Instant::now();
    let limits = &gate.cfg.http;
    let _ = client.set_write_timeout(Some(limits.write_timeout));
    let Ok(reading) = client.try_clone() else {
        return;
    };
    let mut r = BufReader::with_capacity(super::STREAM_BUFFER, Stream::from(reading));
    let mut w = client;
    let mut counted: Option<Counted> = None;
    let mut upstream: Option<Upstream> = None;
    let mut head_by = Some(accepted + limits.head_timeout);
    loop {
        let raw = match http::read_head(&mut r, limits, head_by.take()) {
            Ok(Some(raw)) => raw,
            Ok(None) => return,
            Err(f) => return refuse(gate, &mut w, gate_port, &f, None),
        };
        let started = Instant::now();
        let head = match http::parse_head(&raw, limits.max_headers) {
            Ok(h) => h,
            Err(f) => return refuse(gate, &mut w, gate_port, &f, None),
        };
        if let Err(f) = http::check_host(&head) {
            return refuse(gate, &mut w, gate_port, &f, Some(&head));
        }
        let framing = match http::framing(&head, u64::MAX) {
            Ok(f) => f,
            Err(f) => return refuse(gate, &mut w, gate_port, &f, Some(&head)),
        };
        let has_body = framing != Framing::None;
        // A refusal leaves the body unread: the connection closes after it.
        let close = head.wants_close() || has_body;
        let head_only = head.method == "HEAD";
        let done = |status: u16, outcome: Outcome, grant: Option<&str>| {
            gate.count(outcome);
            log(serde_json::json!({
                "event": "gate",
                "gatePort": gate_port,
                "method": shown(&head.method),
                "path": shown(&head.path),
                "status": status,
                "outcome": format!("{outcome:?}").to_ascii_lowercase(),
                "grant": grant,
                "ms": (started.elapsed().as_secs_f64() * 1000.0 * 10.0).round() / 10.0,
            }));
        };
        let say = |w: &mut TcpStream, bytes: &[u8]| w.write_all(bytes).is_ok();
        // Each answer of the gate's own is counted (and logged) before it is sent: a client
        // that has read it may look at the metrics next.

        if let Some(token) = preview::tokens_in(&head.query).first() {
            let ok = match gate.grants.exchange(gate_port, token) {
                Ok((adm, value)) => {
                    let location = preview::exchange_location(&head.path, &head.query);
                    let name = preview::cookie_name(gate_port);
                    done(302, Outcome::Exchanged, Some(&adm.grant));
                    say(&mut w, &answer::exchanged(&location, &name, &value, close))
                }
                // Only failures are limited: behind a provider's proxy every browser may
                // share one address, and a guesser there must not hold a real link off.
                Err(Denied::Unauthorized(_)) if gate.exchange_limited(peer.ip()) => {
                    done(429, Outcome::Refused, None);
                    say(
                        &mut w,
                        &answer::text(
                            429,
                            "Too many failed preview links from this address; wait a minute.\n",
                            true,
                            head_only,
                        ),
                    );
                    return;
                }
                Err(Denied::Unauthorized(msg)) => {
                    gate.exchange_failed(peer.ip());
                    done(401, Outcome::Unauthorized, None);
                    say(&mut w, &answer::text(401, msg, close, head_only))
                }
                Err(Denied::Suspended { .. }) => {
                    done(503, Outcome::Unavailable, None);
                    say(
                        &mut w,
                        &answer::text(503, answer::SUSPENDED, close, head_only),
                    )
                }
            };
            if !ok || close {
                return;
            }
            continue;
        }

        let name = preview::cookie_name(gate_port);
        let cookies: Vec<&str> = preview::cookies_named(head.all("cookie"), &name).collect();
        let adm = match gate.grants.admit(gate_port, &cookies) {
            Ok(a) => a,
            Err(Denied::Unauthorized(msg)) => {
                done(401, Outcome::Unauthorized, None);
                let ok = say(&mut w, &answer::text(401, msg, close, head_only));
                if !ok || close {
                    return;
                }
                continue;
            }
            Err(Denied::Suspended { .. }) => {
                done(503, Outcome::Unavailable, None);
                let ok = say(
                    &mut w,
                    &answer::text(503, answer::SUSPENDED, close, head_only),
                );
                if !ok || close {
                    return;
                }
                continue;
            }
        };

        // The connection counts to the grant of its latest request (a revoke closes it).
        if counted.as_ref().map(Counted::grant) != Some(adm.grant.as_str()) {
            drop(counted.take());
            let Ok(socket) = w.try_clone() else { return };
            match gate.grants.register(
                &adm.grant,
                socket,
                gate.cfg.max_per_grant,
                gate.cfg.max_connections,
            ) {
                Ok(c) => {
                    if let Some(s) = upstream.as_ref().and_then(Upstream::socket) {
                        c.add(s);
                    }
                    counted = Some(c);
                }
                Err(full) => {
                    let msg = match full {
                        Full::Grant(n) => format!(
                            "This preview has {n} connections open, the most at once; close some tabs.\n"
                        ),
                        Full::Total(n) => format!(
                            "The preview gate has {n} connections open, the most at once; retry shortly.\n"
                        ),
                    };
                    done(429, Outcome::Refused, Some(&adm.grant));
                    say(&mut w, &answer::text(429, &msg, true, head_only));
                    return;
                }
            }
        }
        let Some(c) = counted.as_ref() else { return };

        let upgrade = forward::is_upgrade(&head);
        if (upgrade || preview::is_unsafe_method(&head.method)) && !own_origin_or_none(&head) {
            done(403, Outcome::Forbidden, Some(&adm.grant));
            say(
                &mut w,
                &answer::text(
                    403,
                    "Forbidden: a page of another origin may not send this to the preview.\n",
                    close,
                    head_only,
                ),
            );
            if close {
                return;
            }
            continue;
        }

        let req = forward::Request {
            head: &head,
            framing,
            port: adm.port,
            peer,
            close: head.wants_close(),
        };
        let f = forward::forward(gate, &mut r, &mut w, &req, c, &mut upstream);
        done(f.status, f.outcome, Some(&adm.grant));
        if !f.keep {
            return;
        }
    }
}

/// True if the request has no `Origin`, or the one of its own host (by http or https:
/// behind a provider's TLS the gate cannot tell which the page used).
fn own_origin_or_none(head: &Head) -> bool {
    match origin_of(head) {
        None => true,
        Some(Err(_)) => false,
        Some(Ok(o)) => ["https", "http"]
            .iter()
            .any(|s| own_origin(head, s).as_deref() == Some(o.as_str())),
    }
}

/// Answers an HTTP-level fault (431 for a head over 16 KiB, 408 for a slow one, 400 for
/// the rest) and closes.
fn refuse(gate: &Gate, w: &mut TcpStream, gate_port: u16, f: &Fault, head: Option<&Head>) {
    let status = match f {
        Fault::TooLarge(m) if m.contains("head") || m.contains("header") => 431,
        Fault::TooLarge(_) => 413,
        Fault::TooSlow(_) => 408,
        Fault::Busy(_) => 503,
        Fault::Malformed(_) | Fault::Panic => 400,
    };
    let _ = w.write_all(&answer::text(status, &format!("{f}\n"), true, false));
    // The client may still be sending (the rest of a 20 KiB head): closing at once could
    // reset the connection before it reads the answer, so drain a little first.
    let _ = w.shutdown(std::net::Shutdown::Write);
    let _ = w.set_read_timeout(Some(std::time::Duration::from_millis(300)));
    let until = Instant::now() + std::time::Duration::from_secs(1);
    let mut buf = [0u8; 16 << 10];
    while Instant::now() < until {
        match std::io::Read::read(w, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    gate.count(Outcome::Refused);
    log(serde_json::json!({
        "event": "gate",
        "gatePort": gate_port,
        "method": head.map(|h| shown(&h.method)),
        "path": head.map(|h| shown(&h.path)),
        "status": status,
        "outcome": "refused",
        "error": f.to_string(),
    }));
}
