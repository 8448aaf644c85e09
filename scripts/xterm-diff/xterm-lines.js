#!/usr/bin/env node
// Reads cases from stdin, one a line: a JSON string holding the case's bytes in base64.
// Feeds each to a fresh headless xterm.js terminal, wide enough that nothing wraps, with
// every `\n` turned into `\r\n` as a tty's ONLCR does, and prints, one line per case, a
// JSON array of the terminal's lines from the top to the cursor's row (or the last row
// showing anything, if lower), each as
// `translateToString(true)` shows it (cells never written or erased at the end dropped).
//
// `--cols N` sets another width (say 20, to exercise autowrap). `--join` prints, per case,
// `{"lines": [...], "scrolled": n}` instead: rows that xterm.js marks as wrapped
// (`isWrapped`) are joined to the row above, as the eye reads them (a row followed by a
// wrapped one keeps its trailing blanks), every row of the buffer, and `scrolled` says how
// many rows scrolled off the 24-row screen.
//
// `@xterm/headless` is found as node finds any package: in node_modules here or on
// NODE_PATH.
'use strict';

const { Terminal } = require('@xterm/headless');
const readline = require('readline');

const argv = process.argv.slice(2);
const colsAt = argv.indexOf('--cols');
const COLS = colsAt >= 0 ? Number(argv[colsAt + 1]) : 2000;
const JOIN = argv.includes('--join');
if (!Number.isInteger(COLS) || COLS < 2) {
  console.error('xterm-lines.js: --cols takes a width of at least 2, say --cols 20');
  process.exit(2);
}
const ROWS = 24;
const SCROLLBACK = 100000;

function onlcr(bytes) {
  let n = 0;
  for (const b of bytes) if (b === 0x0a) n++;
  const out = new Uint8Array(bytes.length + n);
  let j = 0;
  for (const b of bytes) {
    if (b === 0x0a) out[j++] = 0x0d;
    out[j++] = b;
  }
  return out;
}

function render(bytes) {
  return new Promise((resolve) => {
    const term = new Terminal({ cols: COLS, rows: ROWS, scrollback: SCROLLBACK, allowProposedApi: true });
    term.write(onlcr(bytes), () => {
      const buf = term.buffer.active;
      const lines = [];
      if (JOIN) {
        for (let y = 0; y < buf.length; y++) {
          const line = buf.getLine(y);
          const next = buf.getLine(y + 1);
          const text = line.translateToString(!(next && next.isWrapped));
          if (line.isWrapped && lines.length > 0) lines[lines.length - 1] += text;
          else lines.push(text);
        }
        const scrolled = buf.baseY;
        term.dispose();
        resolve({ lines, scrolled });
        return;
      }
      for (let y = 0; y < buf.length; y++) {
        lines.push(buf.getLine(y).translateToString(true));
      }
      // Down to the cursor's row, or the last row showing anything if that is lower.
      let last = buf.baseY + buf.cursorY;
      for (let y = lines.length - 1; y > last; y--) {
        if (lines[y] !== '') {
          last = y;
          break;
        }
      }
      lines.length = last + 1;
      term.dispose();
      resolve(lines);
    });
  });
}

async function main() {
  const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const text of rl) {
    if (text.trim() === '') continue;
    const bytes = Buffer.from(JSON.parse(text), 'base64');
    const lines = await render(bytes);
    process.stdout.write(JSON.stringify(lines) + '\n');
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
