#!/usr/bin/env node
// The browser test of the terminal WebSocket: `node terminal-test.js BINARY`. It starts
// `BINARY serve` on a free loopback port with a temporary GITTERM_HOME, serves index.html and
// xterm.js from its own page server, starts a terminal job, and drives a headless Chromium
// through playwright-core: typing, fitting the page to a new size, reloading (replay and a
// new ticket), a reused ticket and a page from another origin. Every failure exits non-zero;
// every exit cancels the job and stops the server. Needs playwright-core and @xterm/xterm on
// NODE_PATH (run.sh installs them) and Chromium at $CHROMIUM or /usr/bin/chromium.
'use strict';
const crypto = require('crypto');
const fs = require('fs');
const http = require('http');
const os = require('os');
const path = require('path');

const lib = require('./lib');
const { artifacts } = lib;

const binary = lib.binaryArg('terminal-test.js');
const t0 = Date.now();
const log = lib.logger('');

const work = fs.mkdtempSync(path.join(os.tmpdir(), 'gitterm-browser-'));
const home = path.join(work, 'home');
fs.mkdirSync(home);
const serveLog = path.join(work, 'serve.log');
const state = { server: null, address: null, token: null, jobId: null, pgid: null, context: null };

function writeState() {
  // For run.sh's trap, should this process die without cleaning up.
  if (!process.env.STATE_FILE) return;
  const f = [state.server && state.server.pid, state.address, state.jobId, state.pgid].map((v) => v || '-');
  fs.writeFileSync(process.env.STATE_FILE, `${f.join(' ')} ${work}\n`);
}

const api = (method, route, body) => lib.api(state, method, route, body, {}, 15000);

// A WebSocket handshake by hand: 101 when the server upgrades, else its status.
function handshake(route, origin) {
  return new Promise((resolve, reject) => {
    const [host, port] = state.address.split(':');
    const headers = {
      connection: 'Upgrade',
      upgrade: 'websocket',
      'sec-websocket-version': '13',
      'sec-websocket-key': crypto.randomBytes(16).toString('base64'),
    };
    if (origin) headers.origin = origin;
    const req = http.request({ host, port, path: route, headers, timeout: 10000 });
    req.on('upgrade', (res, socket) => { socket.destroy(); resolve(res.statusCode); });
    req.on('response', (res) => { res.resume(); resolve(res.statusCode); });
    req.on('timeout', () => req.destroy(new Error(`handshake ${route}: timed out`)));
    req.on('error', reject);
    req.end();
  });
}

async function ticket() {
  const r = await api('POST', `/v1/jobs/${state.jobId}/pty/tickets`);
  if (r.status !== 200 || !r.json || !r.json.ticket) throw new Error(`ticket: HTTP ${r.status} ${r.text}`);
  return r.json.ticket;
}

// The page server: index.html, xterm.js from the installed package, and POST /ticket, which
// asks the agent (with the token) for a fresh ticket, so the token never reaches the page.
const xtermDir = path.dirname(require.resolve('@xterm/xterm/package.json'));
const files = {
  '/': [path.join(__dirname, 'index.html'), 'text/html; charset=utf-8'],
  '/xterm/xterm.js': [path.join(xtermDir, 'lib', 'xterm.js'), 'text/javascript'],
  '/xterm/xterm.css': [path.join(xtermDir, 'css', 'xterm.css'), 'text/css'],
};
function pageServer() {
  const server = http.createServer(async (req, res) => {
    try {
      if (req.method === 'POST' && req.url === '/ticket') {
        const t = await ticket();
        res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'no-store' });
        res.end(JSON.stringify({ ticket: t, jobId: state.jobId, address: state.address }));
        return;
      }
      const f = req.method === 'GET' && files[req.url.split('?')[0]];
      if (!f) {
        res.writeHead(404);
        res.end();
        return;
      }
      res.writeHead(200, { 'content-type': f[1], 'cache-control': 'no-store' });
      res.end(fs.readFileSync(f[0]));
    } catch (e) {
      res.writeHead(502, { 'content-type': 'text/plain' });
      res.end(String(e));
    }
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

function startServe(allowedOrigin) {
  return lib.startServe(binary, ['--listen', '127.0.0.1:0', '--allowed-origin', allowedOrigin], home, serveLog, state);
}

const waitFor = (what, fn, timeoutMs = 15000) => lib.waitFor(what, fn, timeoutMs);

const lines = (page) => page.evaluate(() => {
  const b = window.term.buffer.active;
  const out = [];
  for (let i = 0; i < b.length; i++) out.push(b.getLine(i).translateToString(true));
  return out;
});
const pageState = (page) => page.evaluate(() => ({ ...window.gitterm, cols: window.term.cols, rows: window.term.rows }));

async function waitLine(page, want, what) {
  try {
    return await waitFor(what, async () => (await lines(page)).some((l) => l.trim() === want));
  } catch (e) {
    const seen = (await lines(page)).filter((l) => l.trim()).slice(-12);
    throw new Error(`${e.message}; the terminal shows:\n    ${seen.join('\n    ')}`);
  }
}

async function type(page, text) {
  await page.evaluate(() => window.term.focus());
  await page.keyboard.type(text);
  await page.keyboard.press('Enter');
}

async function waitOpen(page, what) {
  await waitFor(what, async () => {
    const s = await pageState(page);
    if (s.error || s.status === 'closed' || s.status === 'failed') {
      throw new Error(`${what}: the page's WebSocket ${s.status} (${s.error || 'close ' + s.closeCode})`);
    }
    return s.status === 'open' && s.sent.length > 0;
  });
  return pageState(page);
}

async function sttySize(page, s, what) {
  const want = `${s.rows} ${s.cols}`;
  const marker = `size-${crypto.randomBytes(3).toString('hex')}`;
  await type(page, `echo ${marker} $(stty size)`);
  await waitLine(page, `${marker} ${want}`, `${what}: stty size to print ${want}`);
}

let cleaning = null;
function cleanup() {
  if (cleaning) return cleaning;
  cleaning = (async () => {
    if (state.context) await state.context.close().catch(() => {});
    let ended = !state.jobId;
    if (state.jobId && state.address) {
      const r = await api('POST', `/v1/jobs/${state.jobId}/cancel`).catch((e) => ({ status: String(e) }));
      ended = r.status === 200 || r.status === 409;
      if (!ended) log(`note: cancel answered ${r.status}`);
    }
    if (!ended && state.pgid > 1) {
      // The server could not cancel it: end the job's process group directly.
      try { process.kill(-state.pgid, 'SIGKILL'); ended = true; } catch (e) { ended = e.code === 'ESRCH'; }
    }
    const child = state.server;
    if (child && child.exitCode === null && child.signalCode === null) {
      const gone = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 3000);
      await gone;
      clearTimeout(t);
    }
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
  console.error(`browser-test: FAILED: ${e && e.message ? e.message : e}`);
  try {
    const tail = fs.readFileSync(serveLog, 'utf8').trim().split('\n').slice(-5);
    console.error(`browser-test: serve's last log lines:\n  ${tail.join('\n  ')}`);
  } catch (_) { /* no log */ }
  await Promise.race([cleanup(), new Promise((r) => setTimeout(r, 10000))]);
  process.exit(1);
}
const watchdog = lib.failOnFatal(fail);

async function main() {
  const page1 = await pageServer();
  const pagePort = page1.address().port;
  const origin = `http://127.0.0.1:${pagePort}`;
  const other = await pageServer();
  const otherOrigin = `http://127.0.0.1:${other.address().port}`;

  state.address = await startServe(origin);
  state.token = fs.readFileSync(path.join(home, 'agent.token'), 'utf8').trim();
  writeState();
  log(`serve listens on ${state.address}, allowing the page origin ${origin}`);

  const shell = fs.existsSync('/bin/bash') ? 'exec bash --norc -i' : 'exec sh -i';
  const job = await api('POST', '/v1/jobs', {
    command: shell,
    pty: { cols: 80, rows: 24 },
    env: { PS1: '$ ' },
    background: true,
    timeoutSeconds: 300,
  });
  if (job.status >= 300 || !job.json || !job.json.id) throw new Error(`POST /v1/jobs: HTTP ${job.status} ${job.text}`);
  state.jobId = job.json.id;
  state.pgid = job.json.pgid;
  writeState();
  log(`terminal job ${state.jobId} runs \`${shell}\``);

  const profile = path.join(work, 'profile');
  state.context = await lib.launch(profile, { width: 800, height: 600 });
  const page = state.context.pages()[0] || await state.context.newPage();
  page.setDefaultTimeout(15000);
  const consoleErrors = [];
  page.on('pageerror', (e) => consoleErrors.push(String(e)));
  log(`Chromium ${state.context.browser() ? state.context.browser().version() : ''} started`);

  // 1. Type into the terminal.
  await page.goto(origin + '/');
  let s = await waitOpen(page, 'the page to open the terminal');
  log(`page open at 800x600: the terminal fitted to ${s.cols}x${s.rows} and sent ${JSON.stringify(s.sent[s.sent.length - 1])}`);
  await type(page, 'echo hi');
  await waitLine(page, 'hi', 'a line "hi" after typing `echo hi`');
  log('typed `echo hi`: the terminal shows a line "hi"');
  await sttySize(page, s, 'at 800x600');
  log(`stty size in the terminal prints ${s.rows} ${s.cols}`);
  const firstTicket = s.ticket;

  // 2. A new page size: the page fits the terminal and sends a resize frame.
  await page.setViewportSize({ width: 1200, height: 800 });
  const before = s;
  s = await waitFor('the page to send a resize after 1200x800', async () => {
    const n = await pageState(page);
    const last = n.sent[n.sent.length - 1];
    return last && (last.cols !== before.cols || last.rows !== before.rows) && last.cols === n.cols && last.rows === n.rows && n;
  });
  if (!(s.cols > before.cols && s.rows > before.rows)) throw new Error(`1200x800 gave ${s.cols}x${s.rows}, not larger than ${before.cols}x${before.rows}`);
  await sttySize(page, s, 'at 1200x800');
  log(`resized to 1200x800: the page sent ${JSON.stringify(s.sent[s.sent.length - 1])} and stty size prints ${s.rows} ${s.cols}`);

  // 3. Reload: a new ticket, the replay redraws the earlier output, the shell is live.
  await page.reload();
  s = await waitOpen(page, 'the reloaded page to open the terminal');
  if (s.ticket === firstTicket) throw new Error('the reloaded page reused its first ticket');
  await waitLine(page, 'hi', 'the replay to show the earlier "hi" after a reload');
  log('reloaded with a new ticket: the replay shows the earlier "hi"');
  await type(page, 'echo again');
  await waitLine(page, 'again', 'a line "again" after typing `echo again` on the reloaded page');
  log('typed `echo again` after the reload: the terminal shows "again"');

  fs.mkdirSync(artifacts, { recursive: true });
  const shot = path.join(artifacts, 'terminal.png');
  await page.screenshot({ path: shot });
  log(`screenshot: ${shot}`);

  // 4. A ticket used a second time is refused: in the browser, and by hand.
  const reuse = await page.evaluate((url) => new Promise((resolve) => {
    const w = new WebSocket(url);
    let opened = false;
    w.onopen = () => { opened = true; w.close(); };
    w.onclose = (ev) => resolve({ opened, code: ev.code });
    setTimeout(() => resolve({ opened, code: 'timeout' }), 10000);
  }), s.url);
  if (reuse.opened) throw new Error('a ticket used a second time opened the WebSocket in the browser');
  const used = new URL(s.url);
  const reuseStatus = await handshake(used.pathname + used.search, origin);
  if (reuseStatus === 101) throw new Error('a ticket used a second time was accepted by the handshake');
  log(`a reused ticket is refused: the browser saw close ${reuse.code}, the handshake HTTP ${reuseStatus}`);

  // 5. A page from another origin is refused; the same request from the allowed one is not.
  const page2 = await state.context.newPage();
  await page2.goto(otherOrigin + '/');
  const o = await waitFor('the other-origin page to finish', async () => {
    const n = await pageState(page2);
    return (n.status === 'closed' || n.status === 'failed' || n.opened) && n;
  });
  if (o.opened) throw new Error(`a page from ${otherOrigin} opened the terminal`);
  await page2.close();
  const route = `/v1/jobs/${state.jobId}/pty?ticket=`;
  const otherStatus = await handshake(route + encodeURIComponent(await ticket()), otherOrigin);
  if (otherStatus !== 403) throw new Error(`a fresh ticket with Origin ${otherOrigin}: HTTP ${otherStatus}, not 403`);
  const allowedStatus = await handshake(route + encodeURIComponent(await ticket()), origin);
  if (allowedStatus !== 101) throw new Error(`a fresh ticket with Origin ${origin}: HTTP ${allowedStatus}, not 101`);
  log(`a page from ${otherOrigin} is refused (the browser saw close ${o.closeCode}; the handshake HTTP ${otherStatus}; the allowed origin gets ${allowedStatus})`);

  // 6. The shell's exit arrives as the exit frame.
  await type(page, 'exit 7');
  const ex = await waitFor('the exit frame after `exit 7`', async () => (await pageState(page)).exit);
  if (ex.exitCode !== 7) throw new Error(`the exit frame says ${JSON.stringify(ex)}, not exit code 7`);
  log(`typed \`exit 7\`: the page got ${JSON.stringify(ex)}`);
  if (consoleErrors.length) throw new Error(`the page threw: ${consoleErrors.join('; ')}`);

  page1.close();
  other.close();
  clearTimeout(watchdog);
  await cleanup();
  log(`passed in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  console.log(`browser-test: screenshot ${shot}`);
  process.exit(0);
}
main().catch(fail);
