//! Every route the server answers, as one enum: each variant knows its method, its path
//! template, who may call it, the query parameters it reads and its handler, so no two
//! tables can disagree.
//! `docs/openapi.json` lists exactly these routes (a test checks it).

use super::handlers::{self, Handle};
use Handle::{Json, Stream, Text, Upgrade, Upload};

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Anyone: no token needed.
    Public,
    /// Either token: the full one or the scoped one.
    Scoped,
    /// The full token only.
    Full,
}

/// Declares [`Route`] and its table: one line a route, so that adding a route without
/// a method, template, scope, query parameters or handler, or leaving it out of
/// [`Route::ALL`], cannot compile.
macro_rules! routes {
    ($($(#[doc = $doc:literal])* $name:ident = $method:literal $template:literal, $scope:ident,
        [$($param:literal),*], $kind:ident($($handler:path),+);)*) => {
        /// A route the server answers.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Route {
            $($(#[doc = $doc])* $name,)*
        }

        impl Route {
            /// Every route, in the order requests are matched against them.
            pub const ALL: &'static [Route] = &[$(Route::$name),*];

            /// The HTTP method.
            pub const fn method(self) -> &'static str {
                match self {
                    $(Route::$name => $method,)*
                }
            }

            /// The path template; `{id}` stands for one path segment, a job id.
            pub const fn template(self) -> &'static str {
                match self {
                    $(Route::$name => $template,)*
                }
            }

            /// Who may call it.
            pub const fn scope(self) -> Scope {
                match self {
                    $(Route::$name => Scope::$scope,)*
                }
            }

            /// The query parameters it reads; any other is refused.
            pub const fn query(self) -> &'static [&'static str] {
                match self {
                    $(Route::$name => &[$($param),*],)*
                }
            }

            /// The function that answers it, and what kind of answer it makes.
            pub(super) fn handler(self) -> Handle {
                match self {
                    $(Route::$name => $kind($($handler),+),)*
                }
            }
        }

        /// Every route as (method, path template): [`Route::ALL`] as plain strings.
        pub const ROUTES: &[(&str, &str)] = &[$(($method, $template)),*];
    };
}

routes! {
    /// `{"ok": true, "version"}`, for liveness probes.
    Health = "GET" "/v1/health", Public, [], Json(handlers::health::get);
    /// Start a job, and wait for its end unless told otherwise.
    StartJob = "POST" "/v1/jobs", Scoped, [], Json(handlers::jobs::start);
    /// A page of the job records, newest first.
    ListJobs = "GET" "/v1/jobs", Scoped, ["status", "limit", "cursor"], Json(handlers::jobs::list);
    /// One record plus its output tail; long-polls for the end on request.
    GetJob = "GET" "/v1/jobs/{id}", Scoped, ["waitSeconds"], Json(handlers::jobs::get);
    /// A page of a job's output.
    JobOutput = "GET" "/v1/jobs/{id}/output", Scoped, ["offset", "limit", "waitSeconds", "stream"],
        Json(handlers::output::page);
    /// The whole stored output as plain text, streamed; one byte range; or followed.
    JobLog = "GET" "/v1/jobs/{id}/log", Scoped, ["follow", "ticket", "stream"], Stream(handlers::log::get);
    /// A single-use ticket that opens this job's followed log without the bearer header.
    LogTicket = "POST" "/v1/jobs/{id}/log/tickets", Scoped, [], Json(handlers::log::ticket);
    /// TERM, then KILL, to the whole job.
    CancelJob = "POST" "/v1/jobs/{id}/cancel", Full, [], Json(handlers::jobs::cancel);
    /// Append the raw body to an interactive job's stdin (`close=true`: then close it).
    JobStdin = "POST" "/v1/jobs/{id}/stdin", Full, ["close"], Upload(handlers::interactive::stdin, handlers::interactive::max_input);
    /// A terminal job over a WebSocket.
    JobPty = "GET" "/v1/jobs/{id}/pty", Full, ["write", "ticket"], Upgrade(handlers::pty::switch);
    /// A single-use ticket that opens a terminal WebSocket without the bearer header.
    PtyTicket = "POST" "/v1/jobs/{id}/pty/tickets", Full, [], Json(handlers::pty::ticket);
    /// Resize a terminal job's terminal.
    JobResize = "POST" "/v1/jobs/{id}/resize", Full, [], Json(handlers::interactive::resize);
    /// The persisted env's names.
    GetEnv = "GET" "/v1/env", Scoped, [], Json(handlers::env::get);
    /// Change the persisted env.
    SetEnv = "POST" "/v1/env", Scoped, [], Json(handlers::env::set);
    /// The agent and its sandbox: version, boot, env names, job counts.
    Sandbox = "GET" "/v1/sandbox", Scoped, [], Json(handlers::sandbox::get);
    /// Start a server job if needed, and wait until its port answers.
    StartPreview = "POST" "/v1/previews", Full, [], Json(handlers::previews::start);
    /// The listening TCP ports.
    ListPorts = "GET" "/v1/ports", Full, [], Json(handlers::ports::list);
    /// A file's or folder's stat (lstat), as the job user.
    FileStat = "GET" "/v1/files/stat", Full, ["path"], Json(handlers::files::stat);
    /// A page of a folder's entries, names sorted.
    ListFiles = "GET" "/v1/files/list", Full, ["path", "limit", "cursor"], Json(handlers::files::list);
    /// A file's bytes, streamed (`Range` gives 206).
    ReadFile = "GET" "/v1/files/content", Full, ["path"], Stream(handlers::files::read);
    /// Replace or create a file atomically with the streamed body.
    WriteFile = "PUT" "/v1/files/content", Full, ["path", "mode", "createDirs", "overwrite"],
        Upload(handlers::files::write, handlers::files::max_upload);
    /// Create a folder.
    MakeDir = "POST" "/v1/files/mkdir", Full, [], Json(handlers::files::mkdir);
    /// Rename a file or folder.
    MoveFile = "POST" "/v1/files/move", Full, [], Json(handlers::files::rename);
    /// Remove a file or folder.
    DeleteFile = "DELETE" "/v1/files", Full, ["path", "recursive"], Json(handlers::files::delete);
    /// Job events after a cursor; long-polls, or streams them as Server-Sent Events.
    Events = "GET" "/v1/events", Full, ["after", "waitSeconds", "limit", "jobId", "ticket"],
        Stream(handlers::events::get);
    /// A single-use ticket that opens one event stream without the bearer header.
    EventsTicket = "POST" "/v1/events/tickets", Full, [], Json(handlers::events::ticket);
    /// Counters and gauges in the Prometheus text format.
    Metrics = "GET" "/v1/metrics", Full, [], Text(handlers::metrics::get);
    /// Mint a preview grant (or get the live one for the same port and identity) and a token.
    MintGrant = "POST" "/v1/previews/grants", Scoped, [], Json(handlers::grants::mint);
    /// Every preview grant, with its open connections.
    ListGrants = "GET" "/v1/previews/grants", Scoped, [], Json(handlers::grants::list);
    /// Another one-shot token for a live grant.
    GrantToken = "POST" "/v1/previews/grants/{id}/tokens", Scoped, [], Json(handlers::grants::token);
    /// Revoke a grant: its requests get 401 and its open connections close.
    RevokeGrant = "POST" "/v1/previews/grants/{id}/revoke", Full, [], Json(handlers::grants::revoke);
    /// Make a session: a folder and variables that carry from one command to the next.
    CreateSession = "POST" "/v1/sessions", Scoped, [], Json(handlers::sessions::create);
    /// Every session, names of its variables only.
    ListSessions = "GET" "/v1/sessions", Scoped, [], Json(handlers::sessions::list);
    /// One session.
    GetSession = "GET" "/v1/sessions/{id}", Scoped, [], Json(handlers::sessions::get);
    /// Remove a session, cancelling its running command.
    DeleteSession = "DELETE" "/v1/sessions/{id}", Full, [], Json(handlers::sessions::delete);
    /// Start the session's next command (one at a time), answered as a job start.
    StartSessionJob = "POST" "/v1/sessions/{id}/jobs", Scoped, [], Json(handlers::sessions::start);
    /// A signal to a running job's process group, or to every process of it.
    SignalJob = "POST" "/v1/jobs/{id}/signal", Full, [], Json(handlers::signal::send);
    /// A folder as one tar or tar.gz archive, streamed.
    GetArchive = "GET" "/v1/files/archive", Full, ["path", "format"], Stream(handlers::archive::get);
    /// Unpack a streamed tar or tar.gz archive into a folder, all or nothing.
    PutArchive = "PUT" "/v1/files/archive", Full, ["path", "format"],
        Upload(handlers::archive::put, handlers::archive::max_body);
    /// Start watching a folder (as the job user); its changes are kept in a journal.
    CreateWatch = "POST" "/v1/files/watches", Full, [], Json(handlers::watches::create);
    /// The file watches.
    ListWatches = "GET" "/v1/files/watches", Full, [], Json(handlers::watches::list);
    /// Stop a file watch and forget its journal.
    DeleteWatch = "DELETE" "/v1/files/watches/{id}", Full, [], Json(handlers::watches::delete);
    /// A watch's changes after a cursor; long-polls, or streams them as Server-Sent Events.
    WatchEvents = "GET" "/v1/files/watches/{id}/events", Full, ["after", "waitSeconds", "limit"],
        Stream(handlers::watches::events);
}

/// What a request's method and path resolve to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matched<'a> {
    /// A route, and its `{id}` segment if it has one.
    Route(Route, Option<&'a str>),
    /// The path exists, with these methods only.
    WrongMethod(Vec<&'static str>),
    NotFound,
}

impl Route {
    /// Resolves a request path (raw, not decoded: a valid job id needs no escapes, so an
    /// escaped one is simply not found).
    pub fn find<'a>(method: &str, path: &'a str) -> Matched<'a> {
        let mut allowed = Vec::new();
        for &route in Route::ALL {
            let Some(id) = fit(route.template(), path) else {
                continue;
            };
            if route.method() == method {
                return Matched::Route(route, id);
            }
            allowed.push(route.method());
        }
        if allowed.is_empty() {
            Matched::NotFound
        } else {
            Matched::WrongMethod(allowed)
        }
    }

    /// True if every route at `path` is public, so that a request there needs no token
    /// whatever its method (a wrong one learns only the methods of a public path).
    pub fn is_public_path(path: &str) -> bool {
        let mut at_path = Route::ALL
            .iter()
            .filter(|r| fit(r.template(), path).is_some())
            .peekable();
        at_path.peek().is_some() && at_path.all(|r| r.scope() == Scope::Public)
    }
}

/// `Some(id segment)` if `path` fits `template`.
fn fit<'a>(template: &str, path: &'a str) -> Option<Option<&'a str>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_match_templates() {
        assert_eq!(
            Route::find("GET", "/v1/health"),
            Matched::Route(Route::Health, None)
        );
        assert_eq!(
            Route::find("GET", "/v1/jobs/job_x/output"),
            Matched::Route(Route::JobOutput, Some("job_x"))
        );
        assert_eq!(
            Route::find("POST", "/v1/jobs/abc/cancel"),
            Matched::Route(Route::CancelJob, Some("abc"))
        );
        assert_eq!(
            Route::find("DELETE", "/v1/jobs"),
            Matched::WrongMethod(vec!["POST", "GET"])
        );
        assert_eq!(
            Route::find("GET", "/v1/jobs/x/cancel"),
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
            assert_eq!(Route::find("GET", p), Matched::NotFound, "{p}");
        }
    }

    #[test]
    fn every_route_is_found_at_its_own_template_and_listed_once() {
        for (i, &route) in Route::ALL.iter().enumerate() {
            let id = route.template().contains("{id}").then_some("job_x");
            let path = route.template().replace("{id}", "job_x");
            assert_eq!(
                Route::find(route.method(), &path),
                Matched::Route(route, id)
            );
            assert_eq!(ROUTES[i], (route.method(), route.template()));
            assert!(!Route::ALL[..i].contains(&route));
        }
        assert_eq!(ROUTES.len(), Route::ALL.len());
    }

    #[test]
    fn scopes() {
        assert!(Route::is_public_path("/v1/health"));
        for p in ["/v1/jobs", "/v1/nothing", "/v1/health/x", ""] {
            assert!(!Route::is_public_path(p), "{p}");
        }
        assert_eq!(Route::StartJob.scope(), Scope::Scoped);
        assert_eq!(Route::JobOutput.scope(), Scope::Scoped);
        assert_eq!(Route::CancelJob.scope(), Scope::Full);
        assert_eq!(Route::StartPreview.scope(), Scope::Full);
        assert_eq!(Route::ListPorts.scope(), Scope::Full);
        let scoped: Vec<_> = Route::ALL
            .iter()
            .filter(|r| r.scope() == Scope::Scoped)
            .map(|r| (r.method(), r.template()))
            .collect();
        // As the README and docs/openapi.json describe the scoped token.
        assert_eq!(
            scoped,
            [
                ("POST", "/v1/jobs"),
                ("GET", "/v1/jobs"),
                ("GET", "/v1/jobs/{id}"),
                ("GET", "/v1/jobs/{id}/output"),
                ("GET", "/v1/jobs/{id}/log"),
                ("POST", "/v1/jobs/{id}/log/tickets"),
                ("GET", "/v1/env"),
                ("POST", "/v1/env"),
                ("GET", "/v1/sandbox"),
                ("POST", "/v1/previews/grants"),
                ("GET", "/v1/previews/grants"),
                ("POST", "/v1/previews/grants/{id}/tokens"),
                ("POST", "/v1/sessions"),
                ("GET", "/v1/sessions"),
                ("GET", "/v1/sessions/{id}"),
                ("POST", "/v1/sessions/{id}/jobs"),
            ]
        );
    }

    /// The JSON body fields a route reads (`None`: it reads no body at all).
    fn body_fields(route: Route) -> Option<&'static [&'static str]> {
        use crate::api::request::{
            ENV_FIELDS, MKDIR_FIELDS, MOVE_FIELDS, PREVIEW_FIELDS, RESIZE_FIELDS, SIGNAL_FIELDS,
            START_FIELDS,
        };
        use crate::api::request::{SESSION_FIELDS, session_job_fields};
        match route {
            Route::StartJob => Some(START_FIELDS),
            Route::SetEnv => Some(ENV_FIELDS),
            Route::StartPreview => Some(PREVIEW_FIELDS),
            Route::MintGrant => Some(crate::api::request::GRANT_FIELDS),
            Route::GrantToken | Route::RevokeGrant => Some(&[]),
            Route::CancelJob => Some(&[]),
            Route::JobResize => Some(RESIZE_FIELDS),
            Route::SignalJob => Some(SIGNAL_FIELDS),
            Route::JobStdin | Route::JobPty => None,
            Route::PtyTicket | Route::LogTicket | Route::EventsTicket => Some(&[]),
            Route::MakeDir => Some(MKDIR_FIELDS),
            Route::MoveFile => Some(MOVE_FIELDS),
            Route::CreateSession => Some(SESSION_FIELDS),
            Route::StartSessionJob => Some(session_job_fields()),
            Route::DeleteSession => Some(&[]),
            Route::ListSessions | Route::GetSession => None,
            Route::FileStat
            | Route::ListFiles
            | Route::ReadFile
            | Route::WriteFile
            | Route::DeleteFile => None,
            Route::GetArchive | Route::PutArchive => None,
            Route::CreateWatch => Some(crate::api::request::WATCH_FIELDS),
            Route::ListWatches | Route::DeleteWatch | Route::WatchEvents => None,
            Route::Health
            | Route::ListJobs
            | Route::GetJob
            | Route::JobOutput
            | Route::JobLog
            | Route::GetEnv
            | Route::Sandbox
            | Route::ListPorts
            | Route::Events
            | Route::Metrics
            | Route::ListGrants => None,
        }
    }

    /// The request headers a route's handler reads beyond those of HTTP and auth (so that
    /// generated clients can send them, each is a documented header parameter).
    fn headers(route: Route) -> &'static [&'static str] {
        match route {
            Route::StartJob | Route::StartPreview | Route::StartSessionJob => &["Idempotency-Key"],
            Route::JobLog => &["Range", "If-Range"],
            Route::Events => &["Accept", "Last-Event-ID"],
            Route::WatchEvents => &["Accept", "Last-Event-ID"],
            Route::ReadFile => &["Range", "If-None-Match"],
            Route::WriteFile => &["If-Match"],
            _ => &[],
        }
    }

    #[test]
    fn query_parameters_and_body_fields_are_the_documented_ones() {
        let text =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json"))
                .unwrap();
        let spec: serde_json::Value = serde_json::from_str(&text).unwrap();
        for &route in Route::ALL {
            let op = &spec["paths"][route.template()][route.method().to_lowercase()];
            assert!(op.is_object(), "{route:?} is not documented");
            let documented: Vec<&str> = op["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["in"] == "query")
                .filter_map(|p| p["name"].as_str())
                .collect();
            assert_eq!(documented, route.query(), "{route:?}");
            let mut documented: Vec<&str> = op["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["in"] == "header")
                .filter_map(|p| p["name"].as_str())
                .collect();
            documented.sort();
            let mut read = headers(route).to_vec();
            read.sort();
            assert_eq!(documented, read, "{route:?}: header parameters");
            let schema = op
                .pointer("/requestBody/content/application~1json/schema/$ref")
                .and_then(|r| r.as_str())
                .and_then(|r| r.strip_prefix('#'))
                .and_then(|r| spec.pointer(r));
            match (body_fields(route), schema) {
                (Some(fields), Some(schema)) if !fields.is_empty() => {
                    let mut documented: Vec<&str> = schema["properties"]
                        .as_object()
                        .unwrap()
                        .keys()
                        .map(String::as_str)
                        .collect();
                    let mut fields = fields.to_vec();
                    documented.sort();
                    fields.sort();
                    assert_eq!(documented, fields, "{route:?}");
                    assert_eq!(schema["additionalProperties"], false, "{route:?}");
                }
                (None | Some([]), None) => {}
                (fields, schema) => panic!("{route:?}: reads {fields:?}, documents {schema:?}"),
            }
        }
    }
}
