//! The integration tests: one binary, one harness ([`util`]).
//!
//! Each area has its module; every test that runs processes does so in a [`util::Sandbox`],
//! whose guard fails the test if it leaves any process behind. A test that cannot run here
//! says so through [`util::skip`]. What belongs in each module:

/// The harness: sandboxes and their guard, serve, the client, job users, records, polling.
mod util;

/// The HTTP API's routes over real sockets: jobs, env, secrets, sandbox, ports, previews.
mod api;
/// Floods: silent and trickling connections, long-polls by the hundred, readers that never read.
mod api_flood;
/// `GET`/`PUT /v1/files/archive`: folders as one tar stream, and hostile archives refused whole.
mod archives;
/// The command line's bad input, its status table and corrupt records.
mod cli;
/// The command line's help, suggestions, exit statuses and status tails.
mod cli_help;
/// The CLI's stdin and terminal as a user at a shell meets them: `exec`, `attach`.
mod cli_io;
/// Terminal recordings stored exactly as expected, however the bytes are split.
mod corpus;
/// Boot changes, corrupt records, output caps, full disks, pruning, older formats, killed CLIs.
mod durability;
/// The events journal, `GET /v1/events`, the `events` command and `GET /v1/metrics`.
mod events;
/// `/v1/files/...` as a caller uses it: reads, uploads, folders, job users' files.
mod files;
/// The files API against its attackers: deep trees, racing uploads, mounts and links.
mod files_attacks;
/// The preview gate over raw sockets: exchange, cookies, smuggling, streams, upgrades, revoke.
mod gate;
/// The harness itself: the leak guard, polling, timestamps, skips.
mod harness;
/// Hostile jobs and callers: job users reaching for the agent, stopped supervisors, bombs.
mod hostile;
/// Jobs against each other, and the scoped caller against the full one.
mod isolation;
/// The supervision core: exit facts, timeouts, cancel, `lost`, output capture, records.
mod jobs;
/// `GET /v1/jobs/{id}/log`: the whole log, byte ranges and `?follow=true`.
mod log;
/// `docs/openapi.json` against the routes served and the answers given.
mod openapi;
/// `pending`: the line a job is writing, as a terminal shows it, redacted.
mod pending;
/// HTTP/1.1 and WebSocket conformance as a strict client sees it.
mod protocol;
/// Interactive jobs: stdin through the supervisor, terminals, their size, refusals.
mod pty;
/// Unknown body fields and query parameters refused, naming the closest known one.
mod refusals;
/// Job resources and process control: limits, usage, OOM kills, signals, argv, stderr apart.
mod resources;
/// Jobs and callers that try to wedge or fool the agent: unread input, killed supervisors.
mod robust;
/// Sessions: the folder and variables carried between commands, each command a job.
mod sessions;
/// Tickets and CORS, as pages of this and other origins and scoped callers use them.
mod tickets;
/// `/v1/files/watches`: changes by cursor, kept while nobody reads, never a silent gap.
mod watches;
