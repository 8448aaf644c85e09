//! Cross-origin requests from pages of the origins named by `--allowed-origin` (the
//! Fetch standard's CORS protocol), on the few routes a browser page needs: the event
//! stream, a followed log, and the routes that mint their tickets and the terminal's.
//!
//! - An answer on one of those routes to a request whose `Origin` is allowed carries
//!   `Access-Control-Allow-Origin` with that origin (errors too, so a page can read why it
//!   was refused); every answer on them carries `Vary: Origin`. No credentials mode: the
//!   agent uses no cookies, so `Access-Control-Allow-Credentials` is never sent.
//! - A preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) needs no
//!   token, since a browser never sends one on it: from an allowed origin, for the route's
//!   own method and headers of [`ALLOWED_HEADERS`], it is answered 200 with the grants; any
//!   other is refused with a JSON error that says why (the browser then sends nothing).
//!
//! `EventSource` and a plain `fetch` GET are "simple" requests (no preflight): only
//! `Last-Event-ID`, set by an `EventSource` reconnecting, may make a browser ask first. A
//! `fetch` that sends `Authorization` (minting a ticket) always asks first.

use super::routes::{Matched, Route};
use crate::http::auth::{Origins, shown};
use crate::http::{Head, Response};
use crate::model::error::Error;

/// The request headers a page may send on these routes.
pub const ALLOWED_HEADERS: &[&str] = &[
    "authorization",
    "content-type",
    "accept",
    "last-event-id",
    "cache-control",
];
/// The answer headers a page may read beyond the CORS-safelisted ones.
const EXPOSED_HEADERS: &str = "Retry-After, Content-Range, WWW-Authenticate";
/// How long a browser may keep a preflight's grant, in seconds.
const MAX_AGE: u32 = 600;

/// True for the routes that answer pages from allowed origins.
pub fn for_browsers(route: Route) -> bool {
    matches!(
        route,
        Route::Events | Route::EventsTicket | Route::JobLog | Route::LogTicket | Route::PtyTicket
    )
}

/// The route a request's method and path name, if one (`HEAD` is its `GET`'s).
fn route_of(method: &str, path: &str) -> Option<Route> {
    let method = if method == "HEAD" { "GET" } else { method };
    match Route::find(method, path) {
        Matched::Route(r, _) => Some(r),
        _ => None,
    }
}

/// True if `head` is a CORS preflight: `OPTIONS` with `Origin` and
/// `Access-Control-Request-Method`.
pub fn is_preflight(head: &Head) -> bool {
    head.method == "OPTIONS"
        && head.header("origin").is_some()
        && head.header("access-control-request-method").is_some()
}

/// The answer to a preflight (see [`is_preflight`]); no token is asked for.
pub fn preflight(origins: &Origins, head: &Head) -> Response {
    let origin = head.header("origin").unwrap_or_default();
    let method = head
        .header("access-control-request-method")
        .unwrap_or_default();
    let mut resp = match preflight_grant(origins, head, origin, method) {
        Ok(route) => {
            let mut resp = Response::new(
                200,
                vec![
                    ("Access-Control-Allow-Origin", origin.to_string()),
                    ("Access-Control-Allow-Methods", route.method().to_string()),
                    ("Access-Control-Allow-Headers", ALLOWED_HEADERS.join(", ")),
                    ("Access-Control-Max-Age", MAX_AGE.to_string()),
                ],
                Vec::new(),
            );
            // Chromium's Private Network Access: a public page asking for an agent on a
            // loopback or private address.
            if head
                .header("access-control-request-private-network")
                .is_some_and(|v| v.eq_ignore_ascii_case("true"))
            {
                resp.headers
                    .push(("Access-Control-Allow-Private-Network", "true".into()));
            }
            resp.route = route.template();
            resp
        }
        Err((e, route)) => {
            let mut resp = super::answer::error_response(e.into());
            resp.route = route.map_or("", Route::template);
            resp
        }
    };
    resp.headers.push((
        "Vary",
        "Origin, Access-Control-Request-Method, Access-Control-Request-Headers".into(),
    ));
    resp
}

/// The route a preflight may go on to, or why not.
fn preflight_grant(
    origins: &Origins,
    head: &Head,
    origin: &str,
    method: &str,
) -> std::result::Result<Route, (Error, Option<Route>)> {
    let browser_routes = || {
        let names: Vec<String> = Route::ALL
            .iter()
            .filter(|r| for_browsers(**r))
            .map(|r| format!("{} {}", r.method(), r.template()))
            .collect();
        names.join(", ")
    };
    let Some(route) = route_of(method, &head.path).filter(|r| for_browsers(*r)) else {
        return Err((
            Error::Forbidden(format!(
                "pages from other origins may call only {}; a preflight for {} {} is refused",
                browser_routes(),
                shown(method),
                shown(&head.path)
            )),
            None,
        ));
    };
    if !origins.allows(origin) {
        return Err((
            Error::Forbidden(refused(origin, "call this agent")),
            Some(route),
        ));
    }
    let asked = head
        .all("access-control-request-headers")
        .flat_map(|v| v.split(','))
        .map(|h| h.trim().to_ascii_lowercase())
        .filter(|h| !h.is_empty());
    for h in asked {
        if !ALLOWED_HEADERS.contains(&h.as_str()) {
            return Err((
                Error::Forbidden(format!(
                    "pages may not send the header {} on {} {}; they may send {}",
                    shown(&h),
                    route.method(),
                    route.template(),
                    ALLOWED_HEADERS.join(", ")
                )),
                Some(route),
            ));
        }
    }
    Ok(route)
}

/// Adds the CORS headers to `resp`, an answer to `head`, where they belong: `Vary:
/// Origin` on every answer of a browser route, and the grant when its `Origin` is allowed.
pub fn decorate(origins: &Origins, head: &Head, resp: &mut Response) {
    if head.method == "OPTIONS" || !route_of(&head.method, &head.path).is_some_and(for_browsers) {
        return;
    }
    resp.headers.push(("Vary", "Origin".into()));
    if let Some(origin) = head.header("origin")
        && origins.allows(origin)
    {
        resp.headers
            .push(("Access-Control-Allow-Origin", origin.trim().to_string()));
        resp.headers
            .push(("Access-Control-Expose-Headers", EXPOSED_HEADERS.into()));
    }
}

/// Why pages of `origin` may not do `what`, and what to do about it.
pub fn refused(origin: &str, what: &str) -> String {
    if origin.trim().eq_ignore_ascii_case("null") {
        format!(
            "pages of an opaque origin (`Origin: null`: sandboxed frames, file: pages) may not \
             {what}; serve the page from an origin named by --allowed-origin"
        )
    } else {
        let o = shown(origin);
        format!("pages from origin {o} may not {what}: start serve with --allowed-origin {o}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::parse_head;

    fn head(raw: &str) -> Head {
        parse_head(raw.as_bytes(), 100).unwrap()
    }

    fn header<'a>(resp: &'a Response, name: &str) -> Option<&'a str> {
        resp.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn origins() -> Origins {
        Origins::parse(
            &[
                "https://App.example/".into(),
                "http://127.0.0.1:8080".into(),
            ],
            "--allowed-origin",
        )
        .unwrap()
    }

    #[test]
    fn only_browser_routes_get_headers_and_only_for_allowed_origins() {
        let o = origins();
        let answer = |raw: &str| {
            let mut resp = Response::new(200, vec![], vec![]);
            decorate(&o, &head(raw), &mut resp);
            resp
        };
        let ok = answer("GET /v1/events HTTP/1.1\r\nOrigin: https://app.example\r\n\r\n");
        assert_eq!(
            header(&ok, "access-control-allow-origin"),
            Some("https://app.example")
        );
        assert_eq!(header(&ok, "vary"), Some("Origin"));
        assert!(header(&ok, "access-control-allow-credentials").is_none());
        let head_of = answer(
            "HEAD /v1/jobs/job_00000000000000000000/log HTTP/1.1\r\nOrigin: https://app.example\r\n\r\n",
        );
        assert_eq!(
            header(&head_of, "access-control-allow-origin"),
            Some("https://app.example")
        );
        let other = answer("GET /v1/events HTTP/1.1\r\nOrigin: https://evil.example\r\n\r\n");
        assert!(header(&other, "access-control-allow-origin").is_none());
        assert_eq!(header(&other, "vary"), Some("Origin"));
        for raw in [
            "GET /v1/jobs HTTP/1.1\r\nOrigin: https://app.example\r\n\r\n",
            "POST /v1/jobs/job_00000000000000000000/cancel HTTP/1.1\r\nOrigin: https://app.example\r\n\r\n",
            "GET /v1/jobs/job_00000000000000000000/pty HTTP/1.1\r\nOrigin: https://app.example\r\n\r\n",
        ] {
            let r = answer(raw);
            assert!(r.headers.is_empty(), "{raw}: {:?}", r.headers);
        }
        for raw in [
            "POST /v1/events/tickets HTTP/1.1\r\nOrigin: http://127.0.0.1:8080\r\n\r\n",
            "GET /v1/jobs/job_00000000000000000000/log?follow=true HTTP/1.1\r\nOrigin: http://127.0.0.1:8080\r\n\r\n",
            "POST /v1/jobs/job_00000000000000000000/log/tickets HTTP/1.1\r\nOrigin: http://127.0.0.1:8080\r\n\r\n",
            "POST /v1/jobs/job_00000000000000000000/pty/tickets HTTP/1.1\r\nOrigin: http://127.0.0.1:8080\r\n\r\n",
        ] {
            let r = answer(raw);
            assert_eq!(
                header(&r, "access-control-allow-origin"),
                Some("http://127.0.0.1:8080"),
                "{raw}"
            );
        }
    }

    #[test]
    fn preflights_grant_allowed_origins_and_refuse_the_rest_clearly() {
        let o = origins();
        let pre = |extra: &str, target: &str| {
            preflight(
                &o,
                &head(&format!(
                    "OPTIONS {target} HTTP/1.1\r\nOrigin: https://app.example\r\n{extra}\r\n"
                )),
            )
        };
        let ok = pre(
            "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization,Content-Type\r\n",
            "/v1/events/tickets",
        );
        assert_eq!(ok.status, 200);
        assert_eq!(
            header(&ok, "access-control-allow-origin"),
            Some("https://app.example")
        );
        assert_eq!(header(&ok, "access-control-allow-methods"), Some("POST"));
        assert!(
            header(&ok, "access-control-allow-headers")
                .unwrap()
                .contains("authorization")
        );
        assert!(header(&ok, "access-control-allow-private-network").is_none());
        let pna = pre(
            "Access-Control-Request-Method: GET\r\nAccess-Control-Request-Headers: last-event-id\r\nAccess-Control-Request-Private-Network: true\r\n",
            "/v1/events?ticket=x",
        );
        assert_eq!(pna.status, 200);
        assert_eq!(
            header(&pna, "access-control-allow-private-network"),
            Some("true")
        );
        let refused = |r: Response, needle: &str| {
            assert_eq!(r.status, 403, "{needle}");
            assert!(header(&r, "access-control-allow-origin").is_none());
            let text = String::from_utf8_lossy(&r.body);
            assert!(text.contains(needle), "{text}");
        };
        refused(
            pre(
                "Access-Control-Request-Method: POST\r\n",
                "/v1/jobs/job_00000000000000000000/cancel",
            ),
            "may call only",
        );
        refused(
            pre("Access-Control-Request-Method: DELETE\r\n", "/v1/events"),
            "DELETE /v1/events is refused",
        );
        refused(
            pre(
                "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: x-custom\r\n",
                "/v1/events/tickets",
            ),
            "header x-custom",
        );
        let evil = preflight(
            &o,
            &head(
                "OPTIONS /v1/events/tickets HTTP/1.1\r\nOrigin: https://evil.example\r\nAccess-Control-Request-Method: POST\r\n\r\n",
            ),
        );
        refused(evil, "--allowed-origin https://evil.example");
    }
}
