// What the browser tests share: the binary argument, the agent API over loopback, polling,
// the headless Chromium they drive and the handlers that turn any fatal event into a
// failure, and the start of `serve`. Each test keeps its own cleanup and checks.
'use strict';
const { spawn } = require('child_process');
const fs = require('fs');
const http = require('http');
const readline = require('readline');

const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
const artifacts = process.env.ARTIFACTS || '/tmp/gitterm-browser-test';

// The BINARY argument of `node NAME BINARY`; exits 2 with the usage when it is missing.
function binaryArg(name) {
  const binary = process.argv[2];
  if (!binary) {
    console.error(`usage: ${name} BINARY`);
    process.exit(2);
  }
  return binary;
}

// A log line prefixed `browser-test: TAG[s]` with the seconds since the test began.
function logger(tag) {
  const t0 = Date.now();
  return (msg) => console.log(`browser-test: ${tag}[${((Date.now() - t0) / 1000).toFixed(2)}s] ${msg}`);
}

// One request to the agent at state.address with state.token: a JSON body (or a Buffer
// as given), answered as { status, headers, json, text }.
function api(state, method, route, body, headers = {}, timeout = 30000) {
  return new Promise((resolve, reject) => {
    const [host, port] = state.address.split(':');
    const data = body === undefined ? null : Buffer.isBuffer(body) ? body : Buffer.from(JSON.stringify(body));
    const h = { authorization: `Bearer ${state.token}`, ...headers };
    if (data) {
      h['content-type'] = h['content-type'] || 'application/json';
      h['content-length'] = data.length;
    }
    const req = http.request({ host, port, method, path: route, headers: h, timeout }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString();
        let json = null;
        try { json = JSON.parse(text); } catch (_) { /* not JSON */ }
        resolve({ status: res.statusCode, headers: res.headers, json, text });
      });
    });
    req.on('timeout', () => req.destroy(new Error(`${method} ${route}: timed out`)));
    req.on('error', reject);
    req.end(data);
  });
}

// Polls fn every 50 ms until it returns something truthy, which it returns.
async function waitFor(what, fn, timeoutMs = 20000) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs / 1000} s waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

// A headless Chromium with its profile in `profile`, of the viewport given.
function launch(profile, viewport) {
  const { chromium } = require('playwright-core');
  return chromium.launchPersistentContext(profile, {
    executablePath: chromiumPath,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport,
    timeout: 30000,
  });
}

// A signal, an unhandled rejection or a run over 180 s all end in fail(); the watchdog
// timer is returned for the test to clear.
function failOnFatal(fail) {
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
    process.on(sig, () => fail(new Error(`interrupted (${sig})`)));
  }
  process.on('unhandledRejection', fail);
  return setTimeout(() => fail(new Error('the whole test took over 180 s')), 180000);
}

// Starts `BINARY serve ARGS` with GITTERM_HOME=home in its own process group (a signal to
// ours, a timeout or ^C, must not stop it before its jobs are ended through it), its log
// appended to serveLog, kept as state.server; resolves to the address its first line,
// the listening line, names.
function startServe(binary, args, home, serveLog, state) {
  return new Promise((resolve, reject) => {
    const out = fs.openSync(serveLog, 'a');
    const child = spawn(binary, ['serve', ...args], {
      env: { ...process.env, GITTERM_HOME: home },
      stdio: ['ignore', out, 'pipe'],
      detached: true,
    });
    state.server = child;
    let first = true;
    const timer = setTimeout(() => reject(new Error('serve printed no listening line within 15 s')), 15000);
    readline.createInterface({ input: child.stderr }).on('line', (line) => {
      fs.appendFileSync(serveLog, line + '\n');
      if (!first) return;
      first = false;
      clearTimeout(timer);
      try {
        const ev = JSON.parse(line);
        if (ev.event !== 'listening' || !ev.address) throw new Error('not a listening line');
        resolve(ev.address);
      } catch (e) {
        reject(new Error(`serve's first line is not its listening line: ${line}`));
      }
    });
    child.on('error', (e) => { clearTimeout(timer); reject(e); });
    child.on('exit', (code, sig) => {
      clearTimeout(timer);
      if (first) reject(new Error(`serve exited (${code ?? sig}) before listening`));
    });
  });
}

module.exports = { api, artifacts, binaryArg, chromiumPath, failOnFatal, launch, logger, startServe, waitFor };
