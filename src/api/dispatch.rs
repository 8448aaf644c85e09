//! Dispatch: every request's checks on its head (admission), then the route table's
//! handler for it, and the server's side of the HTTP layer (the request log, the error
//! answers of the connection loop).
//!
//! Browsers: a CORS preflight is answered before anything else (it never carries a
//! token; see [`super::cors`]), and the answers of the browser routes get their CORS
//! headers here. A ticket (`?ticket=T`, for a page that cannot send the bearer header)
//! stands in for the token: it is checked where the token would be, and used up only
//! once every other check has passed, so a request refused for anything leaves it unused.
//!
//! Order of checks for each request, all before its body is read: a public route
//! (`GET /v1/health`) needs nothing; everything else is authenticated first (so an
//! unauthenticated client learns nothing, not even which routes exist), then routed
//! (unknown path: 404 `not_found`; known path, wrong method: 400 `invalid` with an `Allow`
//! header; `HEAD` is routed as `GET`, and answered without the body), then the scoped
//! token's limits apply (403 `forbidden`), then the query string is parsed. Only then is
//! the body read and the route's handler called.

use std::time::Duration;

use serde_json::{Value, json};

use super::answer::{error_response, json_response};
use super::app::App;
use super::auth::Access;
use super::cors;
use super::handlers::{Call, Handle};
use super::request::Query;
use super::routes::{Matched, Route, Scope};
use crate::http::{Fault, Handler, Head, Request, Response};
use crate::model::JobId;
use crate::model::error::Error;

/// A request that passed every check on its head.
#[derive(Debug)]
pub struct Admitted {
    route: Route,
    /// Whether the caller used the scoped token.
    scoped: bool,
    /// Whether the request carried a valid token (a public route needs none).
    trusted: bool,
    /// The path's `{id}` segment, as sent.
    id: Option<String>,
    query: Query,
}

impl App {
    /// Checks the ticket `given` for `head` without using it up: it must be live, for
    /// this very path and a GET, and a browser's page must be of an allowed origin.
    fn check_ticket(&self, given: &str, head: &Head) -> Result<Access, Error> {
        let Some(ticket) = self.tickets.peek(given, std::time::Instant::now()) else {
            return Err(Error::Auth(
                "the ticket is unknown, used or expired (tickets are single use, valid 60 s, \
                 and a restart of serve forgets them): get a new one from the route that made it"
                    .into(),
            ));
        };
        if ticket.path != head.path || head.method != "GET" {
            return Err(Error::Auth(format!(
                "this ticket opens GET {} only, not {} {}",
                ticket.path,
                shown_method(&head.method),
                shown_path(&head.path)
            )));
        }
        if let Some(origin) = head.header("origin")
            && !self.allowed_origins.allows(origin)
        {
            return Err(Error::Forbidden(cors::refused(
                origin,
                "use tickets (this one is not used up)",
            )));
        }
        Ok(ticket.access)
    }

    /// What a ticket may open on `route`: one stream, the form a browser makes.
    fn ticket_form(route: Route, head: &Head, query: &Query) -> Result<(), Error> {
        match route {
            Route::Events if !super::handlers::events::accepts_stream(head) => Err(Error::Invalid(
                "an events ticket opens the event stream: send Accept: text/event-stream \
                     (EventSource does); a long-poll takes the bearer header"
                    .into(),
            )),
            Route::JobLog if !query.flag("follow")?.unwrap_or(false) => Err(Error::Invalid(
                "a log ticket opens the followed log: add follow=true; the whole log takes the \
                 bearer header"
                    .into(),
            )),
            _ => Ok(()),
        }
    }

    /// Answers an admitted request: `body` is its whole body, or empty when `stream` is
    /// to be read instead (an upload).
    fn answer(
        &self,
        admitted: Admitted,
        head: &Head,
        body: &[u8],
        stream: &mut (dyn std::io::Read + Send),
    ) -> Response {
        let Admitted {
            route,
            scoped,
            id,
            query,
            ..
        } = admitted;
        let call = Call {
            scoped,
            head,
            body,
            query: &query,
            id: id.as_deref(),
        };
        // The route's one handler, by its kind; nothing else answers a route.
        let reply = match route.handler() {
            Handle::Json(f) => f(self, &call).map(|v| json_answer(route, &v)),
            Handle::Upload(f, _) => f(self, &call, stream).map(|v| json_answer(route, &v)),
            Handle::Text(f) | Handle::Stream(f) | Handle::Upgrade(f) => f(self, &call),
        };
        let job_id = id.as_deref().and_then(JobId::parse).map(|j| j.to_string());
        let mut resp = match reply {
            Ok(resp) => resp,
            Err(f) => {
                let named = f.extra.get("jobId").and_then(Value::as_str);
                let job_id = named.map(str::to_string);
                let close = f.close;
                let mut resp = error_response(f);
                resp.job_id = job_id;
                resp.close = close;
                resp
            }
        };
        resp.route = route.template();
        if resp.job_id.is_none() {
            resp.job_id = job_id;
        }
        resp
    }

    /// Authenticates, routes, checks scope and parses the query; `Err` is the answer when
    /// the request may not go on.
    fn admit(&self, head: &Head) -> Result<Admitted, Box<Response>> {
        // A browser sends no credentials on a preflight: it is answered before any.
        if cors::is_preflight(head) {
            return Err(cors::preflight(&self.allowed_origins, head).into());
        }
        let public = Route::is_public_path(&head.path);
        // The bearer header wins over a ticket (which is then not used).
        let ticket = ticket_in(&head.query)
            .filter(|_| !public && head.all("authorization").next().is_none());
        let access = if let Some(t) = ticket.as_deref() {
            self.check_ticket(t, head)
                .map_err(|e| error_response(e.into()))?
        } else if public {
            Access::Full
        } else {
            let auth: Vec<&str> = head.all("authorization").collect();
            self.tokens
                .check(&auth, &head.query)
                .map_err(|e| error_response(e.into()))?
        };
        // HEAD is GET without the body (RFC 9110 §9.3.2): the connection drops the body, so
        // everything else, the messages included, is the GET's.
        let method = match head.method.as_str() {
            "HEAD" => "GET",
            m => m,
        };
        let (route, id) = match Route::find(method, &head.path) {
            Matched::Route(route, id) => (route, id),
            Matched::WrongMethod(mut allowed) => {
                if allowed.contains(&"GET") {
                    allowed.push("HEAD");
                }
                let mut resp = error_response(
                    Error::Invalid(format!(
                        "{} does not accept {}; use {}",
                        head.path,
                        shown_method(method),
                        allowed.join(" or ")
                    ))
                    .into(),
                );
                resp.status = 400;
                resp.headers.push(("Allow", allowed.join(", ")));
                return Err(resp.into());
            }
            Matched::NotFound => {
                return Err(error_response(
                    Error::NotFound(format!(
                        "no route {} {}; see docs/openapi.json",
                        shown_method(method),
                        shown_path(&head.path)
                    ))
                    .into(),
                )
                .into());
            }
        };
        let refused = |e: Error| {
            let mut resp = error_response(e.into());
            resp.route = route.template();
            resp
        };
        if access == Access::Scoped && route.scope() == Scope::Full {
            return Err(refused(Error::Forbidden(format!(
                "the scoped token may not use {} {}",
                route.method(),
                route.template()
            )))
            .into());
        }
        let query = Query::parse(&head.query, route.query()).map_err(refused)?;
        // Only a request that a ticket admits uses it up: one refused for its Origin, its
        // form or its query string leaves it to the request that was meant.
        if let Some(t) = ticket.as_deref() {
            Self::ticket_form(route, head, &query).map_err(refused)?;
            if !self.tickets.take(t, std::time::Instant::now()) {
                return Err(refused(Error::Auth(
                    "the ticket was used by another request meanwhile, or expired: get a new one"
                        .into(),
                ))
                .into());
            }
        }
        Ok(Admitted {
            route,
            scoped: access == Access::Scoped,
            trusted: !public,
            id: id.map(str::to_string),
            query,
        })
    }
}

/// A JSON handler's answer; a start's names the job it started, for the request log.
fn json_answer(route: Route, v: &Value) -> Response {
    let mut resp = json_response(200, v);
    if route == Route::StartJob {
        resp.job_id = v.get("id").and_then(Value::as_str).map(str::to_string);
    }
    resp
}

/// The `ticket` query parameter, decoded.
fn ticket_in(query: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| *k == "ticket")
        .and_then(|(_, v)| crate::api::request::percent_decode(v))
}

fn shown_method(m: &str) -> String {
    m.chars().take(16).collect()
}

fn shown_path(p: &str) -> String {
    let mut s: String = p.chars().take(80).filter(|c| !c.is_control()).collect();
    if p.len() > 80 {
        s.push('…');
    }
    s
}

impl Handler for App {
    type Admitted = Admitted;

    fn check(&self, head: &Head) -> Result<Admitted, Box<Response>> {
        self.admit(head).map_err(|mut resp| {
            cors::decorate(&self.allowed_origins, head, &mut resp);
            resp
        })
    }

    fn trusted(&self, admitted: &Admitted) -> bool {
        admitted.trusted
    }

    fn handle(&self, admitted: Admitted, req: Request) -> Response {
        let mut resp = self.answer(admitted, &req.head, &req.body, &mut &req.body[..]);
        cors::decorate(&self.allowed_origins, &req.head, &mut resp);
        resp
    }

    fn streamed_body(&self, head: &Head) -> Option<u64> {
        // An upload (a file, a job's input) goes on as it arrives: never held whole.
        match Route::find(&head.method, &head.path) {
            Matched::Route(route, _) => match route.handler() {
                Handle::Upload(_, limit) => Some(limit(self)),
                _ => None,
            },
            _ => None,
        }
    }

    fn handle_stream(
        &self,
        admitted: Admitted,
        head: &Head,
        body: &mut crate::http::BodyReader<'_>,
    ) -> Response {
        let mut resp = self.answer(admitted, head, &[], body);
        cors::decorate(&self.allowed_origins, head, &mut resp);
        resp
    }

    fn fault(&self, fault: &Fault) -> Response {
        let (status, err) = match fault {
            Fault::Malformed(m) => (400, Error::Invalid(format!("malformed request: {m}"))),
            Fault::TooLarge(m) => (413, Error::TooLarge(m.clone())),
            // The contract ties `timeout` to 504, whoever was slow.
            Fault::TooSlow(m) => (504, Error::Timeout(m.clone())),
            Fault::Busy(m) => (429, Error::RateLimited(m.clone())),
            Fault::Panic => (
                500,
                Error::Internal("the agent hit a bug handling this request; see its log".into()),
            ),
        };
        let mut resp = error_response(err.into());
        resp.status = status;
        resp
    }

    fn done(&self, head: Option<&Head>, resp: &Response, elapsed: Duration) {
        let route = if resp.route.is_empty() {
            "unmatched"
        } else {
            resp.route
        };
        self.feed.request(route, resp.status, elapsed);
        // Only the route template is logged, never the path or query: a token or secret
        // pasted into a URL must not reach the log.
        let mut line = json!({
            "ts": crate::text::timefmt::now(),
            "method": head.map(|h| shown_method(&h.method)),
            "route": (!resp.route.is_empty()).then_some(resp.route),
            "status": resp.status,
            "ms": (elapsed.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0,
        });
        if let Some(id) = &resp.job_id {
            line["jobId"] = id.as_str().into();
        }
        if resp.status >= 400
            && let Ok(v) = serde_json::from_slice::<Value>(&resp.body)
            && let Some(code) = v.pointer("/error/code")
        {
            line["error"] = code.clone();
        }
        super::log(line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::auth::Tokens;
    use crate::api::waits::Hub;
    use crate::http::parse_head;
    use crate::model::spec::Config;
    use crate::state::store::Store;

    const FULL: &str = "full-token-0123456789abcdef";
    const SCOPED: &str = "scoped-token-0123456789abcdef";
    const UNKNOWN_JOB: &str = "job_00000000000000000000";

    /// A server over an empty state root (kept while the folder lives).
    fn app() -> (tempfile::TempDir, App) {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        let store = Store::open(root).unwrap();
        let tokens = Tokens::new(FULL.into(), Some(SCOPED.into())).unwrap();
        let sandbox = crate::state::sandbox::record_start_with(root, "boot-a").unwrap();
        let grants = crate::state::grants::Grants::open_with(root, "boot-a").unwrap();
        let app =
            App::new(store, Config::default(), tokens, sandbox, Hub::start()).with_grants(grants);
        (d, app)
    }

    /// A request to `route`'s own template with the given token and query (and an empty
    /// JSON object as the body of a POST), answered by `app` as the connection loop would:
    /// check, then handle.
    fn send(app: &App, route: Route, token: Option<&str>, query: &str) -> Response {
        let body = if route.method() == "POST" { "{}" } else { "" };
        let path = route.template().replace("{id}", UNKNOWN_JOB) + query;
        let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        let raw = format!("{} {path} HTTP/1.1\r\n{auth}\r\n", route.method());
        let head = parse_head(raw.as_bytes(), 100).unwrap();
        match app.check(&head) {
            Ok(admitted) => app.handle(
                admitted,
                Request {
                    head,
                    body: body.as_bytes().to_vec(),
                },
            ),
            Err(resp) => *resp,
        }
    }

    fn error_code(resp: &Response) -> Option<String> {
        let v: Value = serde_json::from_slice(&resp.body).ok()?;
        v.pointer("/error/code")?.as_str().map(str::to_string)
    }

    /// What each route answers in an empty sandbox to a request with an empty JSON body:
    /// its handler's own answer (a job's route: the job is unknown; a start: the body
    /// lacks what it needs), never a routing answer nor an internal error.
    fn expected(route: Route) -> (u16, &'static str) {
        match route {
            Route::Health => (200, "\"ok\":true"),
            Route::StartJob => (400, "command is missing"),
            Route::ListJobs => (200, "\"jobs\":[]"),
            Route::GetJob | Route::JobOutput | Route::JobLog | Route::CancelJob => (404, "no job"),
            Route::JobStdin
            | Route::JobResize
            | Route::JobPty
            | Route::PtyTicket
            | Route::LogTicket
            | Route::SignalJob => (404, "no job"),
            Route::EventsTicket => (200, "\"ticket\":"),
            Route::GetEnv | Route::SetEnv => (200, "\"names\":[]"),
            Route::Sandbox => (200, "\"bootId\":\"boot-a\""),
            Route::StartPreview => (400, "port is missing"),
            Route::ListPorts => (200, "\"ports\":["),
            Route::FileStat
            | Route::ListFiles
            | Route::ReadFile
            | Route::WriteFile
            | Route::MakeDir
            | Route::DeleteFile
            | Route::GetArchive
            | Route::PutArchive
            | Route::CreateWatch => (400, "path is missing"),
            Route::ListWatches => (200, "\"watches\":[]"),
            Route::DeleteWatch | Route::WatchEvents => (404, "no such file watch"),
            Route::MoveFile => (400, "from"),
            Route::Events => (200, "\"events\":[]"),
            Route::Metrics => (200, "gitterm_jobs_started_total 0"),
            Route::MintGrant => (400, "port is missing"),
            Route::ListGrants => (200, "\"grants\":[]"),
            Route::GrantToken | Route::RevokeGrant => (404, "no preview grant"),
            Route::CreateSession => (200, "\"id\":\"ses_"),
            Route::ListSessions => (200, "\"sessions\":["),
            Route::GetSession | Route::DeleteSession | Route::StartSessionJob => {
                (404, "no session")
            }
        }
    }

    #[test]
    fn every_route_is_dispatched_to_its_handler() {
        let (_d, app) = app();
        for &route in Route::ALL {
            let resp = send(&app, route, Some(FULL), "");
            let text = String::from_utf8_lossy(&resp.body);
            let (status, needle) = expected(route);
            assert_eq!(resp.status, status, "{route:?}: {text}");
            assert!(text.contains(needle), "{route:?}: {text}");
            assert_eq!(resp.route, route.template(), "{route:?}");
            assert!(resp.headers.iter().all(|(k, _)| *k != "Allow"), "{route:?}");
        }
    }

    #[test]
    fn head_is_routed_to_every_get_route_and_answered_as_its_get() {
        let (_d, app) = app();
        let answer = |method: &str, route: Route| {
            let path = route.template().replace("{id}", UNKNOWN_JOB);
            let raw = format!("{method} {path} HTTP/1.1\r\nAuthorization: Bearer {FULL}\r\n\r\n");
            let head = parse_head(raw.as_bytes(), 100).unwrap();
            match app.check(&head) {
                Ok(admitted) => app.handle(admitted, Request { head, body: vec![] }),
                Err(resp) => *resp,
            }
        };
        for &route in Route::ALL {
            let head = answer("HEAD", route);
            if route.method() == "GET" {
                let get = answer("GET", route);
                assert_eq!(head.status, get.status, "{route:?}");
                assert_eq!(head.route, route.template(), "{route:?}");
                // The same answer, less the body: its length, where the answer is the same
                // from one call to the next (listening ports, metrics and the sandbox's
                // counts change on a busy machine).
                if !matches!(route, Route::ListPorts | Route::Metrics | Route::Sandbox) {
                    assert_eq!(head.body.len(), get.body.len(), "{route:?}");
                }
            } else if !Route::ALL
                .iter()
                .any(|r| r.method() == "GET" && r.template() == route.template())
            {
                // A path no GET serves: refused as a GET would be, naming what it takes.
                let allow = head.headers.iter().find(|(k, _)| *k == "Allow");
                assert_eq!(head.status, 400, "{route:?}");
                assert!(allow.is_some_and(|(_, v)| !v.contains("HEAD")), "{route:?}");
            }
        }
    }

    #[test]
    fn every_route_admits_by_its_scope() {
        let (_d, app) = app();
        for &route in Route::ALL {
            let anon = send(&app, route, None, "");
            let scoped = send(&app, route, Some(SCOPED), "");
            let (status, _) = expected(route);
            match route.scope() {
                Scope::Public => assert_eq!(anon.status, status, "{route:?}"),
                _ => assert_eq!(error_code(&anon).as_deref(), Some("auth"), "{route:?}"),
            }
            match route.scope() {
                Scope::Full => {
                    assert_eq!(
                        error_code(&scoped).as_deref(),
                        Some("forbidden"),
                        "{route:?}"
                    );
                    assert_eq!(scoped.route, route.template());
                }
                _ => assert_eq!(scoped.status, status, "{route:?}"),
            }
        }
    }

    #[test]
    fn every_route_refuses_query_parameters_it_does_not_read() {
        let (_d, app) = app();
        for &route in Route::ALL {
            let resp = send(&app, route, Some(FULL), "?bogus=1");
            let text = String::from_utf8_lossy(&resp.body);
            assert_eq!(resp.status, 400, "{route:?}: {text}");
            assert!(
                text.contains("unknown query parameter `bogus`"),
                "{route:?}: {text}"
            );
            assert_eq!(resp.route, route.template());
            // Each parameter it does read is admitted (its value is the handler's to judge).
            let known: Vec<String> = route.query().iter().map(|p| format!("{p}=")).collect();
            let resp = send(&app, route, Some(FULL), &format!("?{}", known.join("&")));
            let text = String::from_utf8_lossy(&resp.body);
            assert!(
                !text.contains("unknown query parameter"),
                "{route:?}: {text}"
            );
        }
    }

    #[test]
    fn a_ticket_gives_no_more_than_the_token_that_minted_it() {
        let (_d, app) = app();
        let admit = |ticket: &str, path: &str| {
            let raw = format!(
                "GET {path}?follow=true&ticket={ticket} HTTP/1.1\r\nAccept: text/event-stream\r\n\r\n"
            );
            app.check(&parse_head(raw.as_bytes(), 100).unwrap())
        };
        let path = format!("/v1/jobs/{UNKNOWN_JOB}/log");
        for scoped in [true, false] {
            let (t, _) = app.issue_ticket(path.clone(), scoped).unwrap();
            let a = admit(&t, &path).unwrap();
            assert_eq!(
                (a.route, a.scoped, a.trusted),
                (Route::JobLog, scoped, true)
            );
            // Single use.
            let again = admit(&t, &path).unwrap_err();
            assert_eq!(error_code(&again).as_deref(), Some("auth"));
        }
        // A scoped ticket for a route of the full token only is refused, and stays unused.
        let (t, _) = app.issue_ticket("/v1/events".into(), true).unwrap();
        let raw =
            format!("GET /v1/events?ticket={t} HTTP/1.1\r\nAccept: text/event-stream\r\n\r\n");
        let head = parse_head(raw.as_bytes(), 100).unwrap();
        let r = app.check(&head).unwrap_err();
        assert_eq!(error_code(&r).as_deref(), Some("forbidden"));
        assert!(app.tickets.peek(&t, std::time::Instant::now()).is_some());
    }
}
