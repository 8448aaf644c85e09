#!/usr/bin/env node
// The browser test of the preview gate: `node preview-test.js BINARY`. It starts
// `BINARY serve` (gate ports on 127.0.0.1) and a real Vite dev server on 127.0.0.1 (no
// allowedHosts, no HMR settings), mints a grant, and drives a headless Chromium
// (playwright-core) at `http://app.localhost:<gatePort>/?preview_token=…` (Chromium resolves
// *.localhost to loopback and treats it as a secure context, so `__Host-` cookies work over
// plain HTTP). It checks:
// - the exchange lands on the path without the token, and the cookie, read over the
//   DevTools protocol, is HttpOnly, Secure, SameSite=Lax and host-only (no Domain);
// - the page and its module scripts load through the gate by cookie; a used token is 401;
// - a cookie of another gate port (set there under that port's name) is 401, and so is
//   one for another grant's port;
// - editing a module updates the page by HMR (no reload) over the gate's WebSocket;
// - a page of another origin (evil.localhost) that drives the preview with the person's
//   cookie (a credentialed POST) never reaches the dev server: the gate refuses it;
// - a revoke closes the HMR socket within 1 s, and the page then gets 401.
// Needs playwright-core on NODE_PATH and Vite at $VITE (run.sh installs both), Chromium at
// $CHROMIUM or /usr/bin/chromium. Every failure exits non-zero; every exit stops the
// servers. A screenshot goes to $ARTIFACTS/preview.png.
'use strict';
const { spawn } = require('child_process');
const fs = require('fs');
const http = require('http');
const net = require('net');
const os = require('os');
const path = require('path');

const lib = require('./lib');
const { artifacts } = lib;

const binary = lib.binaryArg('preview-test.js');
const vite = process.env.VITE;
const { waitFor } = lib;
const log = lib.logger('preview: ');

const work = fs.mkdtempSync(path.join(os.tmpdir(), 'gitterm-browser-'));
const home = path.join(work, 'home');
const app = path.join(work, 'app');
fs.mkdirSync(home);
fs.mkdirSync(app);
const serveLog = path.join(work, 'serve.log');
const viteLog = path.join(work, 'vite.log');
const state = { server: null, vite: null, address: null, token: null, context: null };

function writeState() {
  if (!process.env.STATE_FILE) return;
  const pid = state.server && state.server.pid;
  const pgid = state.vite && state.vite.pid;
  fs.writeFileSync(process.env.STATE_FILE, `${pid || '-'} ${state.address || '-'} - ${pgid || '-'} ${work}\n`);
}

const api = (method, route, body) => lib.api(state, method, route, body);

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.on('error', reject);
  });
}

function startServe() {
  return lib.startServe(binary, ['--listen', '127.0.0.1:0', '--preview-address', '127.0.0.1'], home, serveLog, state);
}

function answers(port) {
  return new Promise((resolve) => {
    const req = http.get({ host: '127.0.0.1', port, path: '/', timeout: 2000 }, (res) => { res.resume(); resolve(true); });
    req.on('error', () => resolve(false));
    req.on('timeout', () => { req.destroy(); resolve(false); });
  });
}

let cleaning = null;
function cleanup() {
  if (cleaning) return cleaning;
  cleaning = (async () => {
    if (state.context) await state.context.close().catch(() => {});
    for (const child of [state.vite, state.server]) {
      if (!child || child.exitCode !== null || child.signalCode !== null) continue;
      const gone = new Promise((r) => child.once('exit', r));
      try { process.kill(-child.pid, 'SIGTERM'); } catch (_) { child.kill('SIGTERM'); }
      const t = setTimeout(() => { try { process.kill(-child.pid, 'SIGKILL'); } catch (_) { /* gone */ } }, 10000);
      await gone;
      clearTimeout(t);
    }
    if (process.env.STATE_FILE) fs.rmSync(process.env.STATE_FILE, { force: true });
    fs.rmSync(work, { recursive: true, force: true });
  })();
  return cleaning;
}

let failed = false;
async function fail(e) {
  if (failed) return;
  failed = true;
  console.error(`browser-test: preview: FAILED: ${e && e.message ? e.message : e}`);
  for (const [name, f] of [['serve', serveLog], ['vite', viteLog]]) {
    try {
      const tail = fs.readFileSync(f, 'utf8').trim().split('\n').slice(-6);
      console.error(`browser-test: ${name}'s last log lines:\n  ${tail.join('\n  ')}`);
    } catch (_) { /* no log */ }
  }
  await Promise.race([cleanup(), new Promise((r) => setTimeout(r, 15000))]);
  process.exit(1);
}
const watchdog = lib.failOnFatal(fail);

async function main() {
  if (!vite || !fs.existsSync(vite)) throw new Error(`no Vite at $VITE (${vite})`);

  // The app: a page, a module that renders another module's message, and HMR for it.
  fs.writeFileSync(path.join(app, 'index.html'),
    '<!doctype html><html><head><title>preview</title></head><body><h1 id="msg">…</h1>' +
    '<script type="module" src="/main.js"></script></body></html>\n');
  fs.writeFileSync(path.join(app, 'main.js'), [
    "import { msg } from './msg.js';",
    'window.loads = (window.loads || 0) + 1;',
    "const render = (m) => { document.getElementById('msg').textContent = m; };",
    'render(msg);',
    "if (import.meta.hot) import.meta.hot.accept('./msg.js', (m) => render(m.msg));",
    '',
  ].join('\n'));
  fs.writeFileSync(path.join(app, 'msg.js'), "export const msg = 'first version';\n");

  const devPort = await freePort();
  const out = fs.openSync(viteLog, 'a');
  state.vite = spawn(process.execPath, [vite, '--host', '127.0.0.1', '--port', String(devPort), '--strictPort'], {
    cwd: app,
    env: { ...process.env, BROWSER: 'none', CI: 'true' },
    stdio: ['ignore', out, out],
    detached: true,
  });
  state.address = await startServe();
  state.token = fs.readFileSync(path.join(home, 'agent.token'), 'utf8').trim();
  writeState();
  await waitFor('Vite to answer', () => answers(devPort), 60000);
  log(`serve on ${state.address}, Vite on 127.0.0.1:${devPort}`);

  const gate = await freePort();
  const mint = await api('POST', '/v1/previews/grants', { port: devPort, gatePort: gate, identity: { scope: 'user', id: 'u_1' } });
  if (mint.status !== 200) throw new Error(`mint: HTTP ${mint.status} ${mint.text}`);
  const grant = mint.json;
  if (grant.bypassable !== false) throw new Error(`a dev server on 127.0.0.1 is listed bypassable: ${mint.text}`);
  await waitFor('the gate to listen', () => new Promise((r) => {
    const s = net.connect(gate, '127.0.0.1', () => { s.destroy(); r(true); });
    s.on('error', () => r(false));
  }));

  state.context = await lib.launch(path.join(work, 'profile'), { width: 900, height: 500 });
  // Every WebSocket the page opens, and when it closes (the page's clock is this one's).
  await state.context.addInitScript(() => {
    const Native = window.WebSocket;
    window.sockets = [];
    window.WebSocket = class extends Native {
      constructor(...a) {
        super(...a);
        const rec = { url: String(a[0]), opened: null, closed: null };
        window.sockets.push(rec);
        this.addEventListener('open', () => { rec.opened = Date.now(); });
        this.addEventListener('close', () => { rec.closed = Date.now(); });
      }
    };
  });
  const page = state.context.pages()[0] || await state.context.newPage();
  page.setDefaultTimeout(20000);
  const pageErrors = [];
  page.on('pageerror', (e) => pageErrors.push(String(e)));

  // 1. The exchange: the token is gone from the address, the cookie is as it must be.
  const base = `http://app.localhost:${gate}`;
  const first = await page.goto(`${base}/?preview_token=${grant.token}`);
  if (first.status() !== 200) throw new Error(`the exchange landed on HTTP ${first.status()}`);
  if (page.url() !== `${base}/`) throw new Error(`landed on ${page.url()}, not ${base}/`);
  const cdp = await state.context.newCDPSession(page);
  const { cookies } = await cdp.send('Network.getCookies', { urls: [`${base}/`] });
  const name = `__Host-gitterm-preview-${gate}`;
  const c = cookies.find((k) => k.name === name);
  if (!c) throw new Error(`no ${name} cookie: ${JSON.stringify(cookies)}`);
  const attrs = { httpOnly: c.httpOnly, secure: c.secure, sameSite: c.sameSite, domain: c.domain, path: c.path };
  if (!c.httpOnly || !c.secure || c.sameSite !== 'Lax' || c.domain !== 'app.localhost' || c.path !== '/') {
    throw new Error(`the cookie's attributes: ${JSON.stringify(attrs)}`);
  }
  log(`exchanged: landed on ${page.url()}, cookie ${JSON.stringify(attrs)}`);

  // 2. The page and its modules, by cookie.
  await page.waitForFunction(() => document.getElementById('msg').textContent === 'first version');
  const hmr = await waitFor('the HMR socket to open', async () => {
    const s = await page.evaluate(() => window.sockets);
    return s.find((x) => x.opened && !x.closed);
  });
  log(`page loaded through the gate; HMR socket open at ${hmr.url.replace(/token=[^&]*/, 'token=…')}`);

  // 3. A used token is 401, in another tab of the same browser too.
  const other = await state.context.newPage();
  const reused = await other.goto(`${base}/x?preview_token=${grant.token}`);
  if (reused.status() !== 401) throw new Error(`a used token answered HTTP ${reused.status()}`);

  // 4. The cookie taken to another gate port (under that port's name): 401. So is the
  //    request with no cookie there.
  const gate2 = await freePort();
  const g2 = await api('POST', '/v1/previews/grants', { port: devPort, gatePort: gate2, identity: { scope: 'user', id: 'u_2' } });
  if (g2.status !== 200) throw new Error(`second mint: HTTP ${g2.status} ${g2.text}`);
  await waitFor('the second gate port', () => new Promise((r) => {
    const s = net.connect(gate2, '127.0.0.1', () => { s.destroy(); r(true); });
    s.on('error', () => r(false));
  }));
  const base2 = `http://app.localhost:${gate2}`;
  const bare = await other.goto(`${base2}/`);
  if (bare.status() !== 401) throw new Error(`no cookie on another port answered HTTP ${bare.status()}`);
  await cdp.send('Network.setCookie', { name: `__Host-gitterm-preview-${gate2}`, value: c.value, url: `${base2}/`, path: '/', secure: true, httpOnly: true, sameSite: 'Lax' });
  const moved = await other.goto(`${base2}/`);
  if (moved.status() !== 401) throw new Error(`a cookie moved to another port answered HTTP ${moved.status()}`);
  await other.close();
  log('a used token, no cookie and a cookie moved to another port: 401');

  // 5. HMR: edit the module; the page changes without a reload.
  fs.writeFileSync(path.join(app, 'msg.js'), "export const msg = 'second version';\n");
  await page.waitForFunction(() => document.getElementById('msg').textContent === 'second version', null, { timeout: 30000 });
  const loads = await page.evaluate(() => window.loads);
  if (loads !== 1) throw new Error(`the page reloaded (${loads} loads) instead of updating by HMR`);
  log('edited msg.js: updated by HMR through the gate, no reload');
  fs.mkdirSync(artifacts, { recursive: true });
  await page.screenshot({ path: path.join(artifacts, 'preview.png') });

  // 6. A page of another origin drives the preview with the person's cookie: a POST with
  //    credentials. SameSite=Lax may keep the cookie back (then 401); if it is sent, the
  //    gate's origin check refuses it (403). Either way the gate's log says it was not
  //    forwarded.
  const evil = http.createServer((req, res) => {
    res.writeHead(200, { 'content-type': 'text/html' });
    res.end(`<!doctype html><script>
      window.done = fetch('${base}/drive', { method: 'POST', credentials: 'include', mode: 'no-cors', body: 'x' })
        .then(() => 'sent', (e) => String(e));
    </script>`);
  });
  await new Promise((r) => evil.listen(0, '127.0.0.1', r));
  const attacker = await state.context.newPage();
  await attacker.goto(`http://evil.localhost:${evil.address().port}/`);
  await attacker.evaluate(() => window.done);
  const refused = await waitFor('the gate to log the foreign POST', () => {
    const lines = fs.readFileSync(serveLog, 'utf8').split('\n').filter((l) => l.includes('"path":"/drive"'));
    return lines.length && lines.map((l) => JSON.parse(l));
  }, 10000);
  if (refused.some((l) => l.outcome === 'forwarded')) throw new Error(`a foreign page's POST was forwarded: ${JSON.stringify(refused)}`);
  await attacker.close();
  evil.close();
  log(`a page of another origin POSTing with the cookie: ${refused.map((l) => `${l.status} ${l.outcome}`).join(', ')}`);

  // 7. Revoke: the HMR socket closes within 1 s; the page then gets 401.
  const before = Date.now();
  const r = await api('POST', `/v1/previews/grants/${grant.id}/revoke`, {});
  if (r.status !== 200 || !r.json.revoked) throw new Error(`revoke: HTTP ${r.status} ${r.text}`);
  const closed = await waitFor('the HMR socket to close', async () => {
    const s = await page.evaluate(() => window.sockets);
    const x = s.find((k) => k.url === hmr.url && k.opened === hmr.opened);
    return x && x.closed;
  }, 5000);
  const took = closed - before;
  if (took > 1000) throw new Error(`the HMR socket closed ${took} ms after the revoke (over 1 s)`);
  log(`revoked: the HMR socket closed ${took} ms after the request`);
  const after = await page.goto(`${base}/`);
  if (after.status() !== 401) throw new Error(`after the revoke the page answered HTTP ${after.status()}`);
  const relevant = pageErrors.filter((e) => !/WebSocket|server connection lost/i.test(e));
  if (relevant.length) throw new Error(`page errors: ${relevant.join('; ')}`);
}

main()
  .then(async () => {
    clearTimeout(watchdog);
    log('passed');
    await cleanup();
    process.exit(0);
  })
  .catch(fail);
