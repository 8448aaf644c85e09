#!/usr/bin/env node
// The browser test of the event stream and a followed log: `node events-test.js BINARY`.
// It starts `BINARY serve` on a free loopback port with a temporary GITTERM_HOME and
// `--allowed-origin` naming its own page server, loads events.html in a headless Chromium
// (playwright-core), gives the page the agent's address and token, and checks:
// - the page mints event tickets with fetch (a preflight, then the POST) and follows the
//   jobs the test starts with EventSource;
// - serve is stopped, a job runs while it is down (the CLI), serve starts again on the same
//   port, and the page, which opens a new EventSource with a fresh ticket and `after` set
//   to the last id it saw, ends up with exactly the journal's events: none missed, none
//   twice;
// - a page of another origin cannot mint a ticket even with the token (its preflight is
//   refused), nor open the stream with a ticket; that ticket, not used up, then opens the
//   stream from the allowed page;
// - the page follows a running job's log with a log ticket (fetch, streamed body) to the
//   job's end, and can read the 401 of the used ticket.
// Needs playwright-core on NODE_PATH (run.sh installs it) and Chromium at $CHROMIUM or
// /usr/bin/chromium. Every failure exits non-zero; every exit stops the server.
'use strict';
const { spawnSync } = require('child_process');
const fs = require('fs');
const http = require('http');
const os = require('os');
const path = require('path');

const lib = require('./lib');
const { artifacts } = lib;

const binary = lib.binaryArg('events-test.js');
const { waitFor } = lib;
const t0 = Date.now();
const log = lib.logger('events: ');

const work = fs.mkdtempSync(path.join(os.tmpdir(), 'gitterm-browser-'));
const home = path.join(work, 'home');
fs.mkdirSync(home);
const serveLog = path.join(work, 'serve.log');
const state = { server: null, address: null, token: null, jobs: [], context: null };

function writeState() {
  // For run.sh's trap, should this process die without cleaning up (no job outlives a
  // run of this test but the interactive one, listed first).
  if (!process.env.STATE_FILE) return;
  const f = [state.server && state.server.pid, state.address, state.jobs[0], '-'].map((v) => v || '-');
  fs.writeFileSync(process.env.STATE_FILE, `${f.join(' ')} ${work}\n`);
}

const api = (method, route, body, headers = {}) => lib.api(state, method, route, body, headers);

function pageServer() {
  const page = fs.readFileSync(path.join(__dirname, 'events.html'));
  const server = http.createServer((req, res) => {
    if (req.method === 'GET' && req.url.split('?')[0] === '/') {
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' });
      res.end(page);
      return;
    }
    res.writeHead(404);
    res.end();
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

// Starts serve on `listen`; resolves with the address from its first log line.
function startServe(listen, allowedOrigin) {
  return lib.startServe(binary, ['--listen', listen, '--allowed-origin', allowedOrigin], home, serveLog, state);
}

async function stopServe() {
  const child = state.server;
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  const gone = new Promise((r) => child.once('exit', r));
  child.kill('SIGTERM');
  const t = setTimeout(() => child.kill('SIGKILL'), 10000);
  await gone;
  clearTimeout(t);
}

async function startJob(command, extra = {}) {
  const r = await api('POST', '/v1/jobs', { command, waitSeconds: 60, ...extra });
  if (r.status !== 200 || !r.json || !r.json.id) throw new Error(`POST /v1/jobs: HTTP ${r.status} ${r.text}`);
  return r.json.id;
}

// Every event the journal holds, through the long-poll with the bearer header.
async function journal() {
  const all = [];
  let after = '';
  for (;;) {
    const r = await api('GET', `/v1/events?limit=1000${after ? `&after=${encodeURIComponent(after)}` : ''}`);
    if (r.status !== 200) throw new Error(`GET /v1/events: HTTP ${r.status} ${r.text}`);
    all.push(...r.json.events);
    if (r.json.events.length === 0) return all;
    after = r.json.next;
  }
}

const pageState = (page) => page.evaluate(() => JSON.parse(JSON.stringify(window.gitterm)));
const describe = (evs) => evs.map((e) => `${e.type} ${e.jobId}`).join(', ');

let cleaning = null;
function cleanup() {
  if (cleaning) return cleaning;
  cleaning = (async () => {
    if (state.context) await state.context.close().catch(() => {});
    let ended = true;
    if (state.address && state.server && state.server.exitCode === null) {
      for (const id of state.jobs) {
        const r = await api('POST', `/v1/jobs/${id}/cancel`, {}).catch((e) => ({ status: String(e) }));
        if (r.status !== 200 && r.status !== 409) { ended = false; log(`note: cancel ${id} answered ${r.status}`); }
      }
    } else if (state.jobs.length) {
      // No server to ask: the CLI cancels through the same state root.
      for (const id of state.jobs) {
        const r = spawnSync(binary, ['cancel', id], { env: { ...process.env, GITTERM_HOME: home }, timeout: 30000 });
        if (r.status !== 0) ended = false;
      }
    }
    await stopServe();
    if (ended) {
      if (process.env.STATE_FILE) fs.rmSync(process.env.STATE_FILE, { force: true });
      fs.rmSync(work, { recursive: true, force: true });
    }
  })();
  return cleaning;
}

let failed = false;
async function fail(e) {
  if (failed) return;
  failed = true;
  console.error(`browser-test: events: FAILED: ${e && e.message ? e.message : e}`);
  try {
    const tail = fs.readFileSync(serveLog, 'utf8').trim().split('\n').slice(-5);
    console.error(`browser-test: serve's last log lines:\n  ${tail.join('\n  ')}`);
  } catch (_) { /* no log */ }
  await Promise.race([cleanup(), new Promise((r) => setTimeout(r, 15000))]);
  process.exit(1);
}
const watchdog = lib.failOnFatal(fail);

async function main() {
  const pages = await pageServer();
  const origin = `http://127.0.0.1:${pages.address().port}`;
  const others = await pageServer();
  const otherOrigin = `http://127.0.0.1:${others.address().port}`;

  state.address = await startServe('127.0.0.1:0', origin);
  state.token = fs.readFileSync(path.join(home, 'agent.token'), 'utf8').trim();
  writeState();
  log(`serve listens on ${state.address}, allowing the page origin ${origin}`);

  state.context = await lib.launch(path.join(work, 'profile'), { width: 900, height: 700 });
  const page = state.context.pages()[0] || await state.context.newPage();
  page.setDefaultTimeout(20000);
  const pageErrors = [];
  page.on('pageerror', (e) => pageErrors.push(String(e)));
  log(`Chromium ${state.context.browser() ? state.context.browser().version() : ''} started`);

  // 1. Follow, and see the jobs the test starts.
  await page.goto(origin + '/');
  const a = await startJob('true');
  await page.evaluate(([addr, tok]) => window.follow(addr, tok), [state.address, state.token]);
  const b = await startJob('exit 3');
  let s = await waitFor('the page to see both jobs start and end', async () => {
    const n = await pageState(page);
    return n.events.filter((e) => e.jobId === b).length === 2 && n;
  });
  const before = s.events.length;
  log(`the page follows with EventSource: ${describe(s.events)}`);
  if (!s.events.some((e) => e.jobId === a && e.type === 'job.ended')) throw new Error(`the page missed ${a}'s end: ${describe(s.events)}`);
  const lastBefore = s.lastId;

  // 2. Restart serve, with a job while it is down and one after.
  await stopServe();
  const down = spawnSync(binary, ['exec', '--', 'echo', 'while-down'], { env: { ...process.env, GITTERM_HOME: home }, timeout: 60000, encoding: 'utf8' });
  if (down.status !== 0) throw new Error(`exec while serve is down: exit ${down.status} ${down.stderr}`);
  s = await pageState(page);
  log(`serve stopped; a job ran through the CLI meanwhile; the page is ${s.status}`);
  const port = state.address.split(':')[1];
  const again = await startServe(`127.0.0.1:${port}`, origin);
  if (again !== state.address) throw new Error(`serve came back on ${again}, not ${state.address}`);
  writeState();
  const c = await startJob('true');
  s = await waitFor('the page to see the jobs after the restart', async () => {
    const n = await pageState(page);
    return n.events.filter((e) => e.jobId === c).length === 2 && n;
  });
  const want = await journal();
  const got = s.events;
  const ids = got.map((e) => e.id);
  if (new Set(ids).size !== ids.length) throw new Error(`the page saw an event twice: ${ids.join(' ')}`);
  if (JSON.stringify(ids) !== JSON.stringify(want.map((e) => e.cursor))) {
    throw new Error(`the page saw ${describe(got)}; the journal holds ${describe(want.map((e) => ({ type: e.type, jobId: e.jobId })))}`);
  }
  const resumed = s.urls[s.urls.length - 1];
  if (new URL(resumed).searchParams.get('after') !== lastBefore) throw new Error(`the new EventSource did not resume after ${lastBefore}: ${resumed}`);
  const tickets = s.urls.map((u) => new URL(u).searchParams.get('ticket'));
  if (new Set(tickets).size !== tickets.length) throw new Error('a ticket was used for two streams');
  // The browser asks before a POST with Authorization (playwright does not show
  // preflights; serve's request log does).
  const preflights = fs.readFileSync(serveLog, 'utf8').split('\n').filter((l) => l.includes('"method":"OPTIONS"') && l.includes('"route":"/v1/events/tickets"') && l.includes('"status":200'));
  if (preflights.length < 1) throw new Error('serve answered no preflight for POST /v1/events/tickets');
  log(`after the restart the page resumed after ${lastBefore.slice(-12)} with a fresh ticket (${s.opens} streams, ${s.mintFailures.length} mint tries failed while serve was down): ` +
    `${got.length} events (${got.length - before} new), exactly the journal's, none twice; serve answered ${preflights.length} preflights`);

  // 3. Another origin: no ticket even with the token; a ticket it was handed does not
  //    open the stream, and is not used up by trying.
  const other = await state.context.newPage();
  await other.goto(otherOrigin + '/');
  const m = await other.evaluate(([addr, tok]) => window.mintOnce(addr, tok, '/v1/events/tickets'), [state.address, state.token]);
  if (!m.error) throw new Error(`a page of ${otherOrigin} minted a ticket: ${JSON.stringify(m)}`);
  const t = await api('POST', '/v1/events/tickets', {});
  const tried = await other.evaluate(([addr, tk]) => window.tryTicket(addr, tk), [state.address, t.json.ticket]);
  if (tried.opened || tried.event) throw new Error(`a page of ${otherOrigin} opened the stream: ${JSON.stringify(tried)}`);
  const ok = await page.evaluate(([addr, tk]) => window.tryTicket(addr, tk), [state.address, t.json.ticket]);
  if (!ok.opened || !ok.event) throw new Error(`the allowed page could not use the ticket the other origin was refused: ${JSON.stringify(ok)}`);
  await other.close();
  log(`a page of ${otherOrigin} could not mint (${m.error.slice(0, 60)}) nor open the stream; the same ticket then opened it from ${origin}`);

  // 4. Follow a running job's log with a log ticket.
  const r = await api('POST', '/v1/jobs', { command: 'echo one; read x; echo "two $x"', interactive: true, background: true });
  if (r.status !== 200) throw new Error(`POST /v1/jobs: HTTP ${r.status} ${r.text}`);
  const job = r.json.id;
  state.jobs.push(job);
  writeState();
  page.evaluate(([addr, tok, id]) => window.followLog(addr, tok, id), [state.address, state.token, job]);
  await waitFor('the page to show the first line of the followed log', async () => (await pageState(page)).log.text === 'one\n');
  const w = await api('POST', `/v1/jobs/${job}/stdin`, Buffer.from('typed\n'), { 'content-type': 'application/octet-stream' });
  if (w.status !== 200) throw new Error(`stdin: HTTP ${w.status} ${w.text}`);
  const L = await waitFor('the followed log to end', async () => {
    const l = (await pageState(page)).log;
    if (l.error) throw new Error(`following the log: ${l.error}`);
    return l.done && l.reuse && l;
  });
  if (L.status !== 200 || L.text !== 'one\ntwo typed\n') throw new Error(`the followed log: HTTP ${L.status} ${JSON.stringify(L.text)}`);
  if (L.reuse.status !== 401 || !L.reuse.body.error) throw new Error(`the used log ticket: ${JSON.stringify(L.reuse)}`);
  state.jobs = [];
  log(`the page followed ${job}'s log with a log ticket to its end (${JSON.stringify(L.text)}); the used ticket read as ${L.reuse.status} ${L.reuse.body.error.code}`);

  fs.mkdirSync(artifacts, { recursive: true });
  const shot = path.join(artifacts, 'events.png');
  await page.screenshot({ path: shot });
  if (pageErrors.length) throw new Error(`the page threw: ${pageErrors.join('; ')}`);
  pages.close();
  others.close();
  clearTimeout(watchdog);
  await cleanup();
  log(`passed in ${((Date.now() - t0) / 1000).toFixed(1)} s; screenshot ${shot}`);
  process.exit(0);
}
main().catch(fail);
