//! Routing and the handlers of every route: JSON in, JSON out, the contract's error codes.
//!
//! Order of checks for each request: `GET /v1/health` needs nothing; everything else is
//! authenticated first (so an unauthenticated client learns nothing, not even which routes
//! exist), then routed (unknown path: 404 `not_found`; known path, wrong method: 400
//! `invalid` with an `Allow` header), then the scoped token's limits apply (403
//! `forbidden`), and only then is the body read.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::auth::{Access, Tokens};
use super::http::{Fault, Handler, Head, Request, Response};
use super::request::{self, Query, Wait};
use super::watch::{Hub, Kind};
use crate::job::launch;
use crate::model::error::{Error, Result};
use crate::model::spec::Config;
use crate::model::{JobId, JobRecord, Status};
use crate::state::sandbox::SandboxStart;
use crate::state::store::{Listed, Store};

/// Every route the server answers, as (method, path template). `docs/openapi.json` lists
/// exactly these (a test checks it).
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/v1/health"),
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs"),
    ("GET", "/v1/jobs/{id}"),
    ("GET", "/v1/jobs/{id}/output"),
    ("POST", "/v1/jobs/{id}/cancel"),
    ("GET", "/v1/env"),
    ("POST", "/v1/env"),
    ("GET", "/v1/sandbox"),
    ("POST", "/v1/previews"),
    ("GET", "/v1/ports"),
];

const HEALTH: &str = "/v1/health";

/// What a path and method resolve to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matched<'a> {
    /// A route template, and the `{id}` segment if it has one.
    Route(&'static str, Option<&'a str>),
    /// The path exists, with these methods only.
    WrongMethod(Vec<&'static str>),
    NotFound,
}

/// Resolves a request path (raw, not decoded: a valid job id needs no escapes, so an
/// escaped one is simply not found).
pub fn match_route<'a>(method: &str, path: &'a str) -> Matched<'a> {
    let mut allowed = Vec::new();
    for &(m, template) in ROUTES {
        let Some(id) = match_template(template, path) else {
            continue;
        };
        if m == method {
            return Matched::Route(template, id);
        }
        allowed.push(m);
    }
    if allowed.is_empty() {
        Matched::NotFound
    } else {
        Matched::WrongMethod(allowed)
    }
}

/// `Some(id segment)` if `path` fits `template`.
fn match_template<'a>(template: &str, path: &'a str) -> Option<Option<&'a str>> {
    let mut id = None;
    let mut t = template.split('/');
    let mut p = path.split('/');
    loop {
        match (t.next(), p.next()) {
            (None, None) => return Some(id),
            (Some("{id}"), Some(seg)) if !seg.is_empty() => id = Some(seg),
            (Some(a), Some(b)) if a == b => {}
            _ => return None,
        }
    }
}

/// The server's handler: the store, limits and tokens.
pub struct App {
    store: Store,
    cfg: Config,
    tokens: Tokens,
    sandbox: SandboxStart,
    hub: Arc<Hub>,
}

/// An error answer, optionally with more fields next to `code` and `message`.
struct Failure {
    err: Error,
    extra: serde_json::Map<String, Value>,
}

impl From<Error> for Failure {
    fn from(err: Error) -> Failure {
        Failure {
            err,
            extra: Default::default(),
        }
    }
}

type Reply = std::result::Result<Value, Failure>;

fn json_response(status: u16, v: &Value) -> Response {
    let mut body = serde_json::to_vec(v).unwrap_or_default();
    body.push(b'\n');
    Response {
        status,
        headers: vec![
            ("Content-Type", "application/json".into()),
            ("Cache-Control", "no-store".into()),
        ],
        body,
        close: false,
        route: "",
        job_id: None,
    }
}

fn error_response(f: Failure) -> Response {
    let mut v = f.err.to_json();
    if let Some(obj) = v.get_mut("error").and_then(Value::as_object_mut) {
        for (k, x) in f.extra {
            obj.entry(k).or_insert(x);
        }
    }
    let mut resp = json_response(f.err.http_status(), &v);
    if matches!(f.err, Error::Auth(_)) {
        resp.headers.push(("WWW-Authenticate", "Bearer".into()));
    }
    resp
}

impl App {
    /// A handler over `store`.
    pub fn new(
        store: Store,
        cfg: Config,
        tokens: Tokens,
        sandbox: SandboxStart,
        hub: Arc<Hub>,
    ) -> App {
        App {
            store,
            cfg,
            tokens,
            sandbox,
            hub,
        }
    }

    /// Authenticates, routes and checks scope; `Err` is the answer when the request may
    /// not go on.
    fn admit<'a>(
        &self,
        head: &'a Head,
    ) -> std::result::Result<(&'static str, Option<&'a str>), Response> {
        let path_is_health = head.path == HEALTH;
        let access = if path_is_health {
            Access::Full
        } else {
            let auth: Vec<&str> = head.all("authorization").collect();
            self.tokens
                .check(&auth, &head.query)
                .map_err(|e| error_response(e.into()))?
        };
        let (template, id) = match match_route(&head.method, &head.path) {
            Matched::Route(t, id) => (t, id),
            Matched::WrongMethod(allowed) => {
                let mut resp = error_response(
                    Error::Invalid(format!(
                        "{} does not accept {}; use {}",
                        head.path,
                        shown_method(&head.method),
                        allowed.join(" or ")
                    ))
                    .into(),
                );
                resp.status = 400;
                resp.headers.push(("Allow", allowed.join(", ")));
                return Err(resp);
            }
            Matched::NotFound => {
                return Err(error_response(
                    Error::NotFound(format!(
                        "no route {} {}; see docs/openapi.json",
                        shown_method(&head.method),
                        shown_path(&head.path)
                    ))
                    .into(),
                ));
            }
        };
        if access == Access::Scoped && !super::auth::scoped_allows(&head.method, template) {
            let mut resp = error_response(
                Error::Forbidden(format!(
                    "the scoped token may not use {} {template}",
                    head.method
                ))
                .into(),
            );
            resp.route = template;
            return Err(resp);
        }
        Ok((template, id))
    }

    fn dispatch(&self, template: &'static str, id: Option<&str>, req: &Request) -> Reply {
        let head = &req.head;
        let query = Query::parse(&head.query)?;
        let job = || {
            id.map_or(
                Err(Error::Internal("route without an id".into())),
                Store::parse_id,
            )
        };
        match (head.method.as_str(), template) {
            ("GET", "/v1/health") => Ok(json!({"ok": true, "version": crate::VERSION})),
            ("POST", "/v1/jobs") => self.start_job(req),
            ("GET", "/v1/jobs") => self.list_jobs(&query),
            ("GET", "/v1/jobs/{id}") => self.get_job(&job()?, &query),
            ("GET", "/v1/jobs/{id}/output") => self.output(&job()?, &query),
            ("POST", "/v1/jobs/{id}/cancel") => self.cancel(&job()?),
            ("GET", "/v1/env") => Ok(json!({"names": self.env().names()?})),
            ("POST", "/v1/env") => self.set_env(&req.body),
            ("GET", "/v1/sandbox") => Ok(self.sandbox()?),
            ("POST", "/v1/previews") => self.preview(req),
            ("GET", "/v1/ports") => Ok(json!({"ports": crate::os::ports::listening()})),
            _ => Err(Error::Internal(format!("route {template} has no handler")).into()),
        }
    }

    fn env(&self) -> crate::state::envstore::EnvStore {
        crate::state::envstore::EnvStore::open(self.store.root())
    }

    fn start_job(&self, req: &Request) -> Reply {
        let key = idempotency_key(&req.head)?;
        let body = request::start_body(&req.body, key)?;
        let mut start = body.req;
        // Files first, then secretEnv: a name in both takes the secretEnv value.
        let mut secrets = Vec::new();
        for path in &body.secret_files {
            for var in crate::os::privfile::load_file(path)? {
                secrets.retain(|s: &crate::model::secret::SecretVar| s.name != var.name);
                secrets.push(var);
            }
        }
        for var in std::mem::take(&mut start.secrets) {
            secrets.retain(|s| s.name != var.name);
            secrets.push(var);
        }
        start.secrets = secrets;
        let (rec, events) = launch::start_watched(&self.store, &self.cfg, start)?;
        let rec = match (body.wait, events) {
            (Wait::Background, _) => rec,
            (Wait::Seconds(s), Some(ev)) => self.wait_end_events(&rec.id.clone(), ev, s)?,
            (Wait::Seconds(s), None) => self.wait_end(&rec.id.clone(), s)?,
        };
        Ok(self.store.view(&rec))
    }

    /// [`App::wait_end`] for a job this request started, over the supervisor's own change
    /// channel: it tells of the end at once, with no folder watch to set up and tear down.
    fn wait_end_events(
        &self,
        id: &JobId,
        mut ev: launch::JobEvents,
        seconds: f64,
    ) -> Result<JobRecord> {
        let deadline = Instant::now() + Duration::from_secs_f64(seconds);
        let mut instant_wakes = 0;
        loop {
            let rec = crate::job::settle::load(&self.store, id)?;
            let now = Instant::now();
            if rec.status.is_final() || now >= deadline || self.hub.stopping() {
                return Ok(rec);
            }
            // A closed channel wakes at once every time; should that happen before the
            // record is final, the folder watch takes over rather than spinning.
            if instant_wakes >= 3 {
                return self.wait_end(id, (deadline - now).as_secs_f64());
            }
            ev.wait((deadline - now).min(super::watch::RECHECK));
            if now.elapsed() < Duration::from_millis(1) {
                instant_wakes += 1;
            } else {
                instant_wakes = 0;
            }
        }
    }

    /// The latest record, after waiting up to `seconds` for the job to end.
    fn wait_end(&self, id: &JobId, seconds: f64) -> Result<JobRecord> {
        if seconds <= 0.0 {
            return crate::job::settle::load(&self.store, id);
        }
        let deadline = Instant::now() + Duration::from_secs_f64(seconds);
        let w = self.hub.watch(&self.store.job_dir(id), id);
        loop {
            let seen = w.marks();
            let rec = crate::job::settle::load(&self.store, id)?;
            if rec.status.is_final() || Instant::now() >= deadline || self.hub.stopping() {
                return Ok(rec);
            }
            w.wait(seen, Kind::Record, deadline);
        }
    }

    fn list_jobs(&self, q: &Query) -> Reply {
        let status = q
            .get("status")
            .map(|s| {
                Status::parse(s).ok_or_else(|| {
                    Error::Invalid(format!(
                        "status must be one of {}, got {s:?}",
                        Status::ALL.map(|s| s.as_str()).join(", ")
                    ))
                })
            })
            .transpose()?;
        let limit = q
            .uint("limit", 1, request::MAX_LIST_LIMIT as u64)?
            .map_or(usize::MAX, |n| n as usize);
        let jobs: Vec<Value> = crate::job::settle::list(&self.store)
            .into_iter()
            .filter(|l| match (l, status) {
                (_, None) => true,
                (Listed::Job(r), Some(s)) => r.status == s,
                (Listed::Corrupt { .. }, Some(_)) => false,
            })
            .take(limit)
            .map(|l| match l {
                Listed::Job(r) => serde_json::to_value(&*r).unwrap_or_default(),
                Listed::Corrupt { id, error } => json!({"id": id, "corrupt": true, "error": error}),
            })
            .collect();
        Ok(json!({ "jobs": jobs }))
    }

    fn get_job(&self, id: &JobId, q: &Query) -> Reply {
        let wait = q.seconds("waitSeconds", request::MAX_WAIT_SECONDS)?;
        let rec = self.wait_end(id, wait.unwrap_or(0.0))?;
        Ok(self.store.view(&rec))
    }

    fn output(&self, id: &JobId, q: &Query) -> Reply {
        let offset = q.uint("offset", 0, u64::MAX)?.unwrap_or(0);
        let limit = q
            .uint("limit", 1, crate::state::layout::MAX_PAGE as u64)?
            .map_or(crate::state::layout::MAX_PAGE, |n| n as usize);
        let wait = q
            .seconds("waitSeconds", request::MAX_WAIT_SECONDS)?
            .unwrap_or(0.0);
        let deadline = Instant::now() + Duration::from_secs_f64(wait);
        let w = (wait > 0.0).then(|| self.hub.watch(&self.store.job_dir(id), id));
        loop {
            let seen = w.as_ref().map(|w| w.marks());
            // The record first: once it says "ended", all output is already on disk.
            let rec = crate::job::settle::load(&self.store, id)?;
            let page = self.store.read_page(id, offset, limit)?;
            let done = rec.status.is_final() && page.eof;
            let stop = !page.data.is_empty()
                || rec.status.is_final()
                || Instant::now() >= deadline
                || self.hub.stopping();
            if let (false, Some(w), Some(seen)) = (stop, &w, seen) {
                w.wait(seen, Kind::Any, deadline);
                continue;
            }
            return Ok(json!({
                "offset": page.offset,
                "nextOffset": page.next_offset,
                "data": page.data,
                "eof": page.eof,
                "done": done,
            }));
        }
    }

    fn cancel(&self, id: &JobId) -> Reply {
        // The grace period, plus a margin for the supervisor to write the final record.
        let wait = Duration::from_secs_f64(self.cfg.grace_seconds + 5.0);
        let rec = launch::cancel(&self.store, id, wait)?;
        Ok(self.store.view(&rec))
    }

    fn set_env(&self, body: &[u8]) -> Reply {
        let b = request::env_body(body)?;
        let names = self.env().apply(&b.set, &b.unset, b.replace)?;
        Ok(json!({ "names": names }))
    }

    fn sandbox(&self) -> Result<Value> {
        let mut counts: BTreeMap<&str, usize> =
            Status::ALL.iter().map(|s| (s.as_str(), 0)).collect();
        let mut corrupt = 0;
        for l in crate::job::settle::list(&self.store) {
            match l {
                Listed::Job(r) => *counts.entry(r.status.as_str()).or_default() += 1,
                Listed::Corrupt { .. } => corrupt += 1,
            }
        }
        let mut jobs = serde_json::to_value(counts).unwrap_or_default();
        jobs["corrupt"] = corrupt.into();
        let s = &self.sandbox;
        Ok(json!({
            "version": crate::VERSION,
            "bootId": s.boot_id,
            "previousBootId": s.previous_boot_id,
            "resumed": s.resumed,
            "agentStartedAt": s.agent_started_at,
            "envNames": self.env().names()?,
            "jobs": jobs,
        }))
    }

    fn preview(&self, req: &Request) -> Reply {
        let started = Instant::now();
        let key = idempotency_key(&req.head)?;
        let b = request::preview_body(&req.body, key)?;
        let deadline = started + Duration::from_secs_f64(b.wait_seconds);
        let port = b.port;
        let ready = |left: Duration| {
            crate::os::probe::ready(port, &b.probe, left.min(Duration::from_secs(2)))
        };
        let answer = |job: Option<String>| {
            let job = job.or_else(|| {
                crate::os::ports::listening()
                    .into_iter()
                    .find(|l| l.port == port)
                    .and_then(|l| l.job_id)
            });
            json!({
                "port": port,
                "ready": true,
                "jobId": job,
                "waitedMs": started.elapsed().as_millis() as u64,
            })
        };
        // Something already listening means the server is up (or starting): no new job.
        let listening =
            crate::os::probe::ready(port, &crate::os::probe::Probe::Tcp, Duration::from_secs(1));
        let job = match b.start {
            Some(start) if !listening => Some(launch::start(&self.store, &self.cfg, start)?.id),
            _ => None,
        };
        let w = job
            .as_ref()
            .map(|id| self.hub.watch(&self.store.job_dir(id), id));
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let seen = w.as_ref().map(|w| w.marks());
            if ready(left.max(Duration::from_millis(100))) {
                return Ok(answer(job.as_ref().map(|j| j.to_string())));
            }
            if let Some(id) = &job {
                let rec = crate::job::settle::load(&self.store, id)?;
                if rec.status.is_final() {
                    return Err(ended_first(&self.store, &rec, port));
                }
            }
            if Instant::now() >= deadline || self.hub.stopping() {
                let mut f = Failure::from(Error::Timeout(match &job {
                    Some(id) => format!(
                        "nothing answered on port {port} within {} s; its server job {id} is still running (cancel it, or call again without a command to keep waiting)",
                        b.wait_seconds
                    ),
                    None => format!(
                        "nothing answered on port {port} within {} s",
                        b.wait_seconds
                    ),
                }));
                if let Some(id) = &job {
                    f.extra.insert("jobId".into(), id.to_string().into());
                }
                return Err(f);
            }
            let nap = Instant::now() + Duration::from_millis(100);
            match (&w, seen) {
                (Some(w), Some(seen)) => w.wait(seen, Kind::Record, nap.min(deadline)),
                _ => {
                    std::thread::sleep(nap.min(deadline).saturating_duration_since(Instant::now()))
                }
            }
        }
    }
}

/// The conflict answer when a preview's server job ended before its port answered.
fn ended_first(store: &Store, rec: &JobRecord, port: u16) -> Failure {
    let tail = store.tail(&rec.id);
    let how = match (rec.exit_code, &rec.signal) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => "no exit code".into(),
    };
    let short: String = {
        let chars: Vec<char> = tail.chars().collect();
        chars[chars.len().saturating_sub(1000)..].iter().collect()
    };
    let mut f = Failure::from(Error::Conflict(format!(
        "the preview's server job {} ended ({}, {how}) before port {port} answered; its last output:\n{short}",
        rec.id,
        rec.status.as_str()
    )));
    f.extra.insert("jobId".into(), rec.id.as_str().into());
    f.extra.insert("status".into(), rec.status.as_str().into());
    f.extra.insert("exitCode".into(), rec.exit_code.into());
    f.extra.insert("output".into(), tail.into());
    f
}

fn idempotency_key(head: &Head) -> Result<Option<&str>> {
    let mut keys = head.all("idempotency-key");
    let first = keys.next();
    if keys.next().is_some() {
        return Err(Error::Invalid(
            "the Idempotency-Key header is given more than once".into(),
        ));
    }
    Ok(first)
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
    fn check(&self, head: &Head) -> Option<Response> {
        self.admit(head).err()
    }

    fn handle(&self, req: Request) -> Response {
        let (template, id) = match self.admit(&req.head) {
            Ok(x) => x,
            Err(resp) => return resp,
        };
        let reply = self.dispatch(template, id, &req);
        let mut job_id = id.and_then(JobId::parse).map(|j| j.to_string());
        let mut resp = match reply {
            Ok(v) => {
                if template == "/v1/jobs" && req.head.method == "POST" {
                    job_id = v.get("id").and_then(Value::as_str).map(str::to_string);
                }
                json_response(200, &v)
            }
            Err(f) => {
                if job_id.is_none() {
                    job_id = f
                        .extra
                        .get("jobId")
                        .and_then(Value::as_str)
                        .map(str::to_string);
                }
                error_response(f)
            }
        };
        resp.route = template;
        resp.job_id = job_id;
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
        if matches!(fault, Fault::Busy(_)) {
            resp.headers.push(("Retry-After", "1".into()));
        }
        resp
    }

    fn done(&self, head: Option<&Head>, resp: &Response, elapsed: Duration) {
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
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_match_templates() {
        assert_eq!(
            match_route("GET", "/v1/health"),
            Matched::Route("/v1/health", None)
        );
        assert_eq!(
            match_route("GET", "/v1/jobs/job_x/output"),
            Matched::Route("/v1/jobs/{id}/output", Some("job_x"))
        );
        assert_eq!(
            match_route("POST", "/v1/jobs/abc/cancel"),
            Matched::Route("/v1/jobs/{id}/cancel", Some("abc"))
        );
        assert_eq!(
            match_route("DELETE", "/v1/jobs"),
            Matched::WrongMethod(vec!["POST", "GET"])
        );
        assert_eq!(
            match_route("GET", "/v1/jobs/x/cancel"),
            Matched::WrongMethod(vec!["POST"])
        );
        for p in [
            "/",
            "/v1",
            "/v1/",
            "/v1/jobs/",
            "//v1/jobs",
            "/v1/jobs//output",
            "/v1/jobs/a/b",
            "/v1/jobs/a/output/",
            "/v2/jobs",
            "/v1/healthz",
        ] {
            assert_eq!(match_route("GET", p), Matched::NotFound, "{p}");
        }
    }

    #[test]
    fn every_route_has_a_handler_and_a_scope_decision() {
        // dispatch() falls through to an internal error for a template it does not know;
        // keep the two lists in step by construction.
        for &(m, t) in ROUTES {
            assert_eq!(
                match_route(m, &t.replace("{id}", "job_x")),
                Matched::Route(t, t.contains("{id}").then_some("job_x"))
            );
        }
        for &(m, t) in super::super::auth::SCOPED_ROUTES {
            assert!(ROUTES.contains(&(m, t)), "{m} {t}");
        }
    }
}
