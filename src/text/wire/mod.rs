//! The terminal wire: a terminal job's raw output as viewers get it, escapes kept and every
//! secret that a terminal would draw masked. Pure; no I/O.
//!
//! # Why not the byte redactor
//!
//! A terminal draws cells, not bytes: `sk-` ESC`[01;31m` `live`, `s` BS `sk-live`, `sk-liXX`
//! CSI`2D` CSI`K` `ve…` all draw a secret whose bytes never stand together in the stream.
//! So the wire follows the screen as a terminal would, with a small model of its rows
//! (cells with a cursor, horizontal and relative vertical moves, erasing, inserting and
//! deleting characters, autowrap at the terminal's width), and masks *cells*: every
//! character that a terminal would draw as part of a secret (any spelling the redactor
//! masks) is sent as `*`, one per cell, so that full-screen programs keep their layout.
//!
//! # Live, and never more than the deciding bytes late
//!
//! Bytes are sent as soon as nothing they draw can still become part of a secret. What
//! waits is only the characters from the start of a proper prefix of an occurrence that
//! ends at the cursor (say `sk-li` of `sk-live…` just typed at a prompt), and what follows
//! them, in order, so that colours and moves stay where they were. A prompt after a secret,
//! or any output without a prefix at its end, goes out in the same step.
//!
//! When output completes a secret out of cells that were already sent (the cursor moved
//! back over text shown a moment before, or onto the row above), the step that completes
//! it also repaints those cells with `*`, with relative cursor moves there and back, so a
//! terminal never shows the whole value. Cells of an occurrence that scrolled further away
//! than the terminal's height are not repainted.
//!
//! # Out of reach
//!
//! Whatever the model cannot follow makes it forget: absolute positioning (`CSI H`), saving
//! and restoring the cursor, scrolling regions, the alternate screen, a reset, and C1
//! controls start a blank model at an unknown column, so a secret assembled across them is
//! not recognised (nor is one built from `CSI b` repeats, double-width characters counted as
//! one cell, or rows the terminal drew before the job's output that the model never saw).
//! A secret written whole in the stream is masked all the same: those sequences only
//! separate what the model sees.

use std::collections::{HashSet, VecDeque};

use crate::text::redact::Spotter;

/// What a masked cell shows.
const MASK: u8 = b'*';
/// The most bytes held back, whatever they are: beyond this a held prefix goes out as it
/// is (and is repainted if it is completed later).
const HOLD_MAX: usize = 16 * 1024;
/// Rows kept above and below the cursor's.
const ROWS_KEPT: usize = 64;
/// A sequence longer than this goes out in pieces (string payloads have no effect).
const PIECE_MAX: usize = 4096;
/// The widest terminal the model follows.
const COLS_MAX: usize = 4096;

/// One cell: a character (`len` bytes of `ch`; 0 is blank), the step that put it there,
/// and whether a viewer sees it as it is.
#[derive(Clone, Copy)]
struct Cell {
    ch: [u8; 4],
    len: u8,
    inst: u64,
    clear: bool,
}

const BLANK: Cell = Cell {
    ch: [b' ', 0, 0, 0],
    len: 0,
    inst: 0,
    clear: false,
};

impl Cell {
    fn text(&self) -> &[u8] {
        if self.len == 0 {
            b" "
        } else {
            &self.ch[..usize::from(self.len)]
        }
    }
}

#[derive(Clone, Default)]
struct Row {
    cells: Vec<Cell>,
    /// Continues the row above (autowrap): one line for the eye.
    wrapped: bool,
}

/// What a token does to the model.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Print,
    Cr,
    Lf,
    Bs,
    Tab,
    /// A CSI sequence the model follows: final byte and first two parameters (0 if absent).
    Csi(u8, u16, u16),
    /// No effect on cells or the cursor (colours, titles, modes).
    Inert,
    /// An effect the model does not follow: it forgets.
    Forget,
    /// Insert mode on or off (`CSI 4 h` / `CSI 4 l`).
    Insert(bool),
}

/// A token waiting to be sent.
struct Tok {
    end: usize,
    op: Op,
    seq: u64,
    /// For a printed character: the cell it was written to and that cell's instance.
    cell: Option<(i64, usize, u64)>,
    /// Where the cursor was after it (row, column, and whether the next character wraps).
    at: (i64, usize, bool),
    /// Insert mode was on after it.
    insert: bool,
}

/// Splits the stream into tokens, keeping every byte.
#[derive(Default)]
struct Lexer {
    buf: Vec<u8>,
    state: Lex,
    /// First two parameters of the CSI being read.
    params: [u16; 2],
    nparam: usize,
    /// The CSI has no private marker and no intermediate.
    plain: bool,
    /// The CSI has a private marker (`?`, `>`, …).
    private: bool,
    /// ESC then `#` (line attributes, the alignment test that fills the screen).
    hash: bool,
    utf8_need: usize,
}

/// What a byte did.
enum Lexed {
    /// Nothing yet.
    More,
    /// A token ends with it (its bytes are in `buf`).
    Tok(Op),
    /// A token ends before it: the byte is to be read again.
    Before(Op),
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum Lex {
    #[default]
    Ground,
    Utf8,
    Esc,
    EscInter,
    Csi,
    /// A string sequence (OSC, DCS, SOS, PM, APC); `true` for OSC, which BEL ends.
    Str(bool),
}

/// The masked wire of one terminal.
pub struct WireMasker {
    spot: Option<Spotter>,
    /// The values masked.
    values: Vec<Vec<u8>>,
    lex: Lexer,
    /// Bytes of the tokens applied to the model but not sent yet.
    held: Vec<u8>,
    toks: VecDeque<Tok>,
    seq: u64,
    rows: VecDeque<Row>,
    /// Absolute number of `rows[0]`.
    top: i64,
    row: i64,
    col: usize,
    /// `col` is the terminal's column (not only relative to where the model began).
    known: bool,
    /// The cursor's row on the screen, where the model knows it: a terminal's own
    /// screen begins with the job (its first row at the top), and absolute positioning
    /// says where it is again after the model lost track.
    screen: Option<usize>,
    insert: bool,
    /// The last character went into the last column: the next one wraps first.
    wrap_next: bool,
    cols: usize,
    lines: usize,
    /// Rows changed since the last check.
    dirty: Vec<i64>,
    /// Instances found to be part of a secret by the last check.
    secret: HashSet<u64>,
    /// Part of a string sequence was sent, not its end yet.
    mid_string: bool,
}

impl WireMasker {
    /// A masker for these secret values on a terminal of `cols` x `rows`.
    pub fn new(secrets: &[&[u8]], cols: u16, rows: u16) -> Self {
        let mut m = WireMasker {
            spot: Spotter::new(secrets),
            values: secrets.iter().map(|v| v.to_vec()).collect(),
            lex: Lexer::default(),
            held: Vec::new(),
            toks: VecDeque::new(),
            seq: 1,
            rows: VecDeque::new(),
            top: 0,
            row: 0,
            col: 0,
            known: true,
            screen: Some(0),
            insert: false,
            wrap_next: false,
            cols: 80,
            lines: 24,
            dirty: Vec::new(),
            secret: HashSet::new(),
            mid_string: false,
        };
        m.rows.push_back(Row::default());
        m.resize(cols, rows);
        m
    }

    /// Masks these values too from now on (the ones it has stay masked).
    pub fn add_secrets(&mut self, more: &[&[u8]]) {
        if self.spot.is_none() {
            // The screen was not followed while there was nothing to mask.
            self.forget();
        }
        self.values.extend(more.iter().map(|v| v.to_vec()));
        let all: Vec<&[u8]> = self.values.iter().map(|v| v.as_slice()).collect();
        self.spot = Spotter::new(&all);
    }

    /// The terminal was resized.
    pub fn resize(&mut self, cols: u16, rows: u16) {
        self.cols = usize::from(cols).clamp(1, COLS_MAX);
        self.lines = usize::from(rows).max(1);
        self.screen = self.screen.map(|s| s.min(self.lines - 1));
    }

    /// Whether bytes are held back (a proper prefix of a secret at the cursor).
    pub fn holding(&self) -> usize {
        self.held.len() + self.lex.buf.len()
    }

    /// Whether the stream sent so far ends between two sequences (a safe place for a
    /// replay to begin): only a long string sequence is sent in pieces.
    pub fn at_rest(&self) -> bool {
        !self.mid_string
    }

    /// Masks `raw`, appending to `out` what can be sent now.
    pub fn feed(&mut self, raw: &[u8], out: &mut Vec<u8>) {
        if self.spot.is_none() && self.held.is_empty() && self.lex.buf.is_empty() {
            // Nothing to mask: the stream as it is (the model is not needed).
            out.extend_from_slice(raw);
            return;
        }
        for &b in raw {
            match self.lex.push(b) {
                Lexed::More => {
                    if self.lex.buf.len() >= PIECE_MAX && self.lex.piece_ok() {
                        // A long string payload has no effect: it goes out in pieces.
                        self.token(Op::Inert, out);
                        self.mid_string = true;
                    }
                }
                Lexed::Tok(op) => {
                    self.mid_string = false;
                    self.token(op, out);
                }
                Lexed::Before(op) => {
                    self.mid_string = false;
                    self.token(op, out);
                    if let Lexed::Tok(op) = self.lex.push(b) {
                        self.token(op, out);
                    }
                }
            }
        }
        self.settle(false, out);
    }

    /// Ends the stream: everything held goes out.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if !self.lex.buf.is_empty() {
            self.token(Op::Inert, out);
        }
        self.settle(true, out);
    }

    /// Applies one token (its bytes are `lex.buf`) to the model and queues it.
    fn token(&mut self, op: Op, out: &mut Vec<u8>) {
        if self.destroys(op) {
            self.check();
            self.send(self.toks.len(), out);
        }
        let seq = self.seq;
        self.seq += 1;
        let cell = self.apply(op, seq);
        self.held.extend_from_slice(&self.lex.buf);
        self.lex.buf.clear();
        self.toks.push_back(Tok {
            end: self.held.len(),
            op,
            seq,
            cell,
            at: (self.row, self.col, self.wrap_next),
            insert: self.insert,
        });
        if self.spot.is_none() || self.held.len() > HOLD_MAX {
            self.check();
            self.send(self.toks.len(), out);
        }
    }

    /// Checks what is queued and sends all but a tail that may still become a secret.
    fn settle(&mut self, last: bool, out: &mut Vec<u8>) {
        if self.toks.is_empty() {
            return;
        }
        self.check();
        let keep = if last { 0 } else { self.held_tokens() };
        self.send(self.toks.len() - keep, out);
    }

    /// How many queued tokens to hold: from the first one that wrote a cell of a proper
    /// prefix of a secret ending at the cursor.
    fn held_tokens(&self) -> usize {
        let Some(spot) = &self.spot else { return 0 };
        let Some(r) = self.row_ref(self.row) else {
            return 0;
        };
        let end = self.col.min(r.cells.len());
        let mut text = Vec::new();
        let mut offs = Vec::with_capacity(end);
        for c in &r.cells[..end] {
            offs.push(text.len());
            text.extend_from_slice(c.text());
        }
        let Some(s) = spot.prefix_start(&text, 0) else {
            return 0;
        };
        let first = offs.partition_point(|&o| o <= s).saturating_sub(1);
        let since = r.cells[first..end]
            .iter()
            .filter(|c| c.len > 0)
            .map(|c| c.inst)
            .min();
        let Some(since) = since else { return 0 };
        match self.toks.iter().position(|t| t.seq >= since) {
            Some(i) => self.toks.len() - i,
            None => 0,
        }
    }

    /// Sends the first `n` queued tokens, masking the characters found secret, then repaints
    /// cells of a secret that a viewer still sees as they are.
    fn send(&mut self, n: usize, out: &mut Vec<u8>) {
        let mut from = 0;
        let mut last_at = None;
        for _ in 0..n {
            let Some(t) = self.toks.pop_front() else {
                break;
            };
            let bytes = &self.held[from..t.end];
            if let (Op::Print, Some((row, col, inst))) = (t.op, t.cell) {
                let masked = self.secret.contains(&inst);
                if masked {
                    out.push(MASK);
                } else {
                    out.extend_from_slice(bytes);
                }
                if let Some(c) = self.cell_mut(row, col)
                    && c.inst == inst
                {
                    c.clear = !masked;
                }
            } else {
                out.extend_from_slice(bytes);
            }
            from = t.end;
            last_at = Some((t.at, t.insert));
        }
        self.held.drain(..from);
        for t in &mut self.toks {
            t.end -= from;
        }
        if let Some((at, insert)) = last_at {
            self.repaint(at, insert, out);
        }
        // What is still queued is checked again with what follows it: the rows it wrote,
        // and the row each token left the cursor on (an erase or a deletion that is held
        // changed that row, and may have made a secret of cells sent before).
        for t in &self.toks {
            for row in t.cell.map(|c| c.0).into_iter().chain([t.at.0]) {
                if !self.dirty.contains(&row) {
                    self.dirty.push(row);
                }
            }
        }
    }

    /// Overwrites with masks the cells of a found secret that a viewer sees in clear, from
    /// the cursor at `at` and back to it; `insert`: insert mode is on there (the masks must
    /// overwrite, not push the row right).
    fn repaint(&mut self, at: (i64, usize, bool), insert: bool, out: &mut Vec<u8>) {
        if self.secret.is_empty() {
            return;
        }
        let (row0, col0, wrap) = at;
        let (mut row, mut col) = (row0, col0);
        let mut moved = false;
        let lo = row0 - (self.lines as i64 - 1);
        for r in self.top..self.top + self.rows.len() as i64 {
            if r < lo || r > row0 {
                continue;
            }
            let Some(cells) = self.row_ref(r).map(|x| x.cells.len()) else {
                continue;
            };
            let mut c = 0;
            while c < cells {
                let show = self
                    .row_ref(r)
                    .map(|x| x.cells[c])
                    .is_some_and(|cell| cell.clear && self.secret.contains(&cell.inst));
                if !show {
                    c += 1;
                    continue;
                }
                if !moved && insert {
                    out.extend_from_slice(b"\x1b[4l");
                }
                move_to(out, (row, col), (r, c));
                moved = true;
                (row, col) = (r, c);
                while c < cells {
                    let secret = &self.secret;
                    let i = (r - self.top) as usize;
                    let Some(cell) = self.rows.get_mut(i).and_then(|x| x.cells.get_mut(c)) else {
                        break;
                    };
                    if !(cell.clear && secret.contains(&cell.inst)) {
                        break;
                    }
                    cell.clear = false;
                    out.push(MASK);
                    c += 1;
                    // At the last column the cursor stays (until the next character).
                    col = (col + 1).min(self.cols - 1);
                }
            }
        }
        if !moved {
            return;
        }
        move_to(out, (row, col), (row0, col0));
        if wrap {
            // The moves took away the wrap a character in the last column had left
            // pending: that character is drawn again, as the viewer sees it.
            let shown = self.row_ref(row0).and_then(|x| x.cells.get(col0)).map(|c| {
                if c.clear {
                    c.text().to_vec()
                } else {
                    vec![MASK]
                }
            });
            match shown {
                Some(t) => out.extend_from_slice(&t),
                None => out.push(b' '),
            }
        }
        if insert {
            out.extend_from_slice(b"\x1b[4h");
        }
    }

    /// Finds the secrets on the rows changed since the last check (and the lines they are
    /// part of), and remembers which cells' instances they cover.
    fn check(&mut self) {
        self.secret.clear();
        let Some(spot) = &self.spot else {
            self.dirty.clear();
            return;
        };
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        let reach = spot.max_len();
        let mut done_upto = i64::MIN;
        let mut found = Vec::new();
        for &r in &dirty {
            if r <= done_upto {
                continue;
            }
            // The rows around `r` within one occurrence's length: text with a `\n` between
            // rows that are not one wrapped line.
            let (mut a, mut b) = (r, r);
            let mut len = 0;
            while a > self.top && len < reach {
                len += self.row_len(a - 1) + 1;
                a -= 1;
            }
            let mut len = 0;
            while b + 1 < self.top + self.rows.len() as i64 && len < reach {
                len += self.row_len(b + 1) + 1;
                b += 1;
            }
            done_upto = b;
            let mut text = Vec::new();
            let mut map: Vec<(usize, i64, usize)> = Vec::new();
            for rr in a..=b {
                let Some(row) = self.row_ref(rr) else {
                    continue;
                };
                if rr > a && !row.wrapped {
                    text.push(b'\n');
                }
                for (ci, c) in row.cells.iter().enumerate() {
                    map.push((text.len(), rr, ci));
                    text.extend_from_slice(c.text());
                }
            }
            for (s, e) in spot.find(&text) {
                let i = map.partition_point(|&(o, _, _)| o < s);
                for &(o, rr, ci) in &map[i..] {
                    if o >= e {
                        break;
                    }
                    found.push((rr, ci));
                }
            }
        }
        for (rr, ci) in found {
            if let Some(c) = self.row_ref(rr).and_then(|x| x.cells.get(ci))
                && c.len > 0
            {
                self.secret.insert(c.inst);
            }
        }
    }

    fn row_len(&self, r: i64) -> usize {
        self.row_ref(r).map_or(0, |x| x.cells.len())
    }

    fn row_ref(&self, r: i64) -> Option<&Row> {
        usize::try_from(r - self.top)
            .ok()
            .and_then(|i| self.rows.get(i))
    }

    fn cell_mut(&mut self, r: i64, c: usize) -> Option<&mut Cell> {
        let i = usize::try_from(r - self.top).ok()?;
        self.rows.get_mut(i)?.cells.get_mut(c)
    }

    fn cur(&mut self) -> &mut Row {
        let i = (self.row - self.top) as usize;
        &mut self.rows[i]
    }

    /// Whether `op` may take away part of a secret already on the screen (so what is
    /// queued is checked first, while it is still whole).
    fn destroys(&self, op: Op) -> bool {
        let Some(r) = self.row_ref(self.row) else {
            return false;
        };
        let after = r.cells.get(self.col..).unwrap_or(&[]);
        let any = |cs: &[Cell]| cs.iter().any(|c| c.len > 0);
        match op {
            Op::Print => {
                let ch = self.lex.buf.as_slice();
                let overwrites = r
                    .cells
                    .get(self.col)
                    .is_some_and(|c| c.len > 0 && c.text() != ch);
                // Inserting pushes the rest of the row right (past the margin, maybe).
                (self.insert && any(after)) || self.wrap_next || overwrites
            }
            // What makes the model forget: the rows are checked while it still has them.
            Op::Forget => true,
            Op::Csi(b'H' | b'f' | b'd', _, _) => self.screen.is_none(),
            Op::Cr | Op::Bs | Op::Tab | Op::Csi(b'G' | b'`' | b'D' | b'Z', _, _) if !self.known => {
                true
            }
            Op::Csi(b'A' | b'B' | b'e' | b'E' | b'F', p, _) if usize::from(p) > ROWS_KEPT => true,
            Op::Csi(b'K' | b'J', 0, _) | Op::Csi(b'X', _, _) => any(after),
            Op::Csi(b'K' | b'J', _, _) => any(&r.cells),
            Op::Csi(b'@' | b'P', _, _) => any(after),
            _ => false,
        }
    }

    /// Carries out `op` on the model; for a printed character, says which cell it went to.
    fn apply(&mut self, op: Op, seq: u64) -> Option<(i64, usize, u64)> {
        let n = |p: u16| usize::from(p.max(1));
        match op {
            Op::Print => return Some(self.print(seq)),
            Op::Cr => {
                if !self.known {
                    self.forget();
                }
                self.col = 0;
                self.known = true;
            }
            Op::Lf => self.line_feed(),
            Op::Bs => {
                // At the last column a terminal's cursor stays there; from an unknown column
                // the margin is unknown and the model's column is relative.
                let at = if self.known {
                    self.col.min(self.cols - 1)
                } else {
                    self.col
                };
                if at > 0 {
                    self.col = at - 1;
                } else if !self.known {
                    self.forget();
                }
            }
            Op::Tab => {
                if self.known {
                    self.col = ((self.col / 8 + 1) * 8).min(self.cols - 1);
                } else {
                    self.forget();
                }
            }
            Op::Insert(on) => self.insert = on,
            Op::Inert => return None,
            Op::Forget => self.forget(),
            Op::Csi(f, p1, p2) => match f {
                b'G' | b'`' => {
                    if !self.known {
                        self.forget();
                        self.known = true;
                    }
                    self.col = (n(p1) - 1).min(self.cols - 1);
                }
                b'C' | b'a' => {
                    let right = self.col + n(p1);
                    self.col = if self.known {
                        right.min(self.cols - 1)
                    } else {
                        right.min(COLS_MAX - 1)
                    };
                }
                b'D' => {
                    let k = n(p1);
                    if self.col >= k {
                        self.col -= k;
                    } else if self.known {
                        self.col = 0;
                    } else {
                        self.forget();
                    }
                }
                b'A' => self.up(n(p1)),
                b'B' | b'e' => self.down(n(p1)),
                b'E' => {
                    self.down(n(p1));
                    self.col = 0;
                    self.known = true;
                }
                b'F' => {
                    self.up(n(p1));
                    self.col = 0;
                    self.known = true;
                }
                b'K' | b'J' => {
                    let col = self.col;
                    let cur = self.cur();
                    match p1 {
                        0 => cur.cells.truncate(col),
                        1 => {
                            let upto = (col + 1).min(cur.cells.len());
                            cur.cells[..upto].fill(BLANK);
                        }
                        _ => cur.cells.clear(),
                    }
                    self.mark_dirty();
                }
                b'X' => {
                    let (col, k) = (self.col, n(p1));
                    let cur = self.cur();
                    let end = (col + k).min(cur.cells.len());
                    if col < end {
                        cur.cells[col..end].fill(BLANK);
                    }
                    self.mark_dirty();
                }
                b'@' => {
                    let (col, k, cols) = (self.col, n(p1), self.cols);
                    let cur = self.cur();
                    if col < cur.cells.len() {
                        let k = k.min(cols);
                        cur.cells.splice(col..col, std::iter::repeat_n(BLANK, k));
                        cur.cells.truncate(cols);
                    }
                    self.mark_dirty();
                }
                b'P' => {
                    let (col, k) = (self.col, n(p1));
                    let cur = self.cur();
                    if col < cur.cells.len() {
                        let end = (col + k).min(cur.cells.len());
                        cur.cells.drain(col..end);
                    }
                    self.mark_dirty();
                }
                b'I' => {
                    for _ in 0..n(p1).min(COLS_MAX) {
                        self.apply(Op::Tab, seq);
                    }
                }
                b'Z' => {
                    if self.known {
                        for _ in 0..n(p1).min(COLS_MAX) {
                            self.col = self.col.saturating_sub(1) / 8 * 8;
                        }
                    } else {
                        self.forget();
                    }
                }
                b'd' => {
                    let (col, known) = (self.col, self.known);
                    self.go_to_screen_row(n(p1) - 1);
                    if self.known {
                        self.col = col;
                        self.known = known;
                    }
                }
                b'H' | b'f' => {
                    self.go_to_screen_row(n(p1) - 1);
                    self.col = (n(p2) - 1).min(self.cols - 1);
                    self.known = true;
                }
                _ => self.forget(),
            },
        }
        self.wrap_next = false;
        None
    }

    /// Writes the character in `lex.buf` at the cursor.
    fn print(&mut self, seq: u64) -> (i64, usize, u64) {
        if self.wrap_next {
            self.wrap_next = false;
            self.col = 0;
            self.line_feed();
            self.known = true;
            self.cur().wrapped = true;
        }
        let mut ch = [0u8; 4];
        let text: &[u8] = if self.lex.buf.len() <= 4 && std::str::from_utf8(&self.lex.buf).is_ok() {
            &self.lex.buf
        } else {
            "\u{FFFD}".as_bytes()
        };
        ch[..text.len()].copy_from_slice(text);
        let len = text.len() as u8;
        let (col, insert, cols) = (self.col, self.insert, self.cols);
        let cur = self.cur();
        if insert && col < cur.cells.len() {
            cur.cells.insert(col, BLANK);
            cur.cells.truncate(cols);
        }
        if cur.cells.len() <= col {
            cur.cells.resize(col + 1, BLANK);
        }
        let cell = &mut cur.cells[col];
        let inst = if cell.len == len && cell.ch == ch {
            cell.inst
        } else {
            *cell = Cell {
                ch,
                len,
                inst: seq,
                clear: false,
            };
            seq
        };
        let row = self.row;
        // Where the margin is, from an unknown column, is unknown: the row just goes on,
        // so that a secret is still seen whole (it is masked where it is written).
        if self.known && col + 1 >= self.cols {
            self.wrap_next = true;
        } else {
            self.col = (self.col + 1).min(COLS_MAX - 1);
        }
        self.mark_dirty();
        (row, col, inst)
    }

    fn mark_dirty(&mut self) {
        if self.dirty.last() != Some(&self.row) {
            self.dirty.push(self.row);
        }
    }

    /// `\n`: the next row; at the screen's bottom the screen scrolls, which moves every
    /// row the model has along with the cursor.
    fn line_feed(&mut self) {
        if let Some(s) = self.screen {
            self.screen = Some((s + 1).min(self.lines - 1));
        }
        self.move_rows(1);
    }

    /// Down `k` rows (a cursor move: it stops at the screen's bottom, where the model
    /// knows where that is).
    fn down(&mut self, k: usize) {
        let k = match self.screen {
            Some(s) => {
                let k = k.min(self.lines - 1 - s.min(self.lines - 1));
                self.screen = Some(s + k);
                k
            }
            None => k,
        };
        self.move_rows(k as i64);
    }

    /// Up `k` rows, stopping at the screen's top. Where the model does not know the
    /// cursor's screen row, it stops at the first row the model has (above it are rows
    /// the model never saw).
    fn up(&mut self, k: usize) {
        match self.screen {
            Some(s) => {
                let k = k.min(s);
                self.screen = Some(s - k);
                self.move_rows(-(k as i64));
            }
            None => self.row = (self.row - k as i64).max(self.top),
        }
    }

    /// To screen row `t` (from 0), as absolute positioning goes: a move where the model
    /// knows the cursor's screen row, else a fresh start on a row it now knows.
    fn go_to_screen_row(&mut self, t: usize) {
        let t = t.min(self.lines - 1);
        match self.screen {
            Some(s) => self.move_rows(t as i64 - s as i64),
            None => self.forget(),
        }
        self.screen = Some(t);
    }

    /// Moves the cursor `delta` rows, making the rows it reaches and keeping at most
    /// [`ROWS_KEPT`] on either side.
    fn move_rows(&mut self, delta: i64) {
        if delta.unsigned_abs() as usize > ROWS_KEPT {
            let screen = self.screen;
            self.forget();
            self.screen = screen;
            return;
        }
        self.row += delta;
        while self.row < self.top {
            self.rows.push_front(Row::default());
            self.top -= 1;
        }
        while self.row >= self.top + self.rows.len() as i64 {
            self.rows.push_back(Row::default());
        }
        while self.rows.len() > 2 * ROWS_KEPT {
            if self.row - self.top > ROWS_KEPT as i64 {
                self.rows.pop_front();
                self.top += 1;
            } else {
                self.rows.pop_back();
            }
        }
    }

    /// The model cannot follow the terminal: it starts over with one blank row at an
    /// unknown column.
    fn forget(&mut self) {
        self.screen = None;
        self.rows.clear();
        self.rows.push_back(Row::default());
        self.top = self.row;
        self.col = 0;
        self.known = false;
        self.wrap_next = false;
        self.dirty.clear();
    }
}

/// Appends relative cursor moves from `from` to `to` (row, column).
fn move_to(out: &mut Vec<u8>, from: (i64, usize), to: (i64, usize)) {
    let seq = |out: &mut Vec<u8>, n: u64, f: u8| {
        if n > 0 {
            out.extend_from_slice(format!("\x1b[{n}{}", f as char).as_bytes());
        }
    };
    if to.0 < from.0 {
        seq(out, (from.0 - to.0) as u64, b'A');
    } else {
        seq(out, (to.0 - from.0) as u64, b'B');
    }
    if to.1 < from.1 {
        seq(out, (from.1 - to.1) as u64, b'D');
    } else {
        seq(out, (to.1 - from.1) as u64, b'C');
    }
}

impl Lexer {
    /// Takes one byte.
    fn push(&mut self, b: u8) -> Lexed {
        match self.state {
            Lex::Ground => {
                self.buf.push(b);
                Lexed::Tok(match b {
                    0x1B => {
                        self.state = Lex::Esc;
                        self.hash = false;
                        return Lexed::More;
                    }
                    b'\r' => Op::Cr,
                    b'\n' | 0x0B | 0x0C => Op::Lf,
                    0x08 => Op::Bs,
                    b'\t' => Op::Tab,
                    0x00..=0x1F | 0x7F => Op::Inert,
                    0x20..=0x7E => Op::Print,
                    _ => match utf8_len(b) {
                        Some(n) => {
                            self.utf8_need = n - 1;
                            self.state = Lex::Utf8;
                            return Lexed::More;
                        }
                        None => Op::Print,
                    },
                })
            }
            Lex::Utf8 => {
                if !(0x80..=0xBF).contains(&b) {
                    // A cut character: drawn as one replacement; `b` is read afresh.
                    self.state = Lex::Ground;
                    return Lexed::Before(Op::Print);
                }
                self.buf.push(b);
                self.utf8_need -= 1;
                if self.utf8_need > 0 {
                    return Lexed::More;
                }
                self.state = Lex::Ground;
                // A C1 control written as a character: what a terminal makes of it is not
                // followed.
                if self.buf.len() == 2 && self.buf[0] == 0xC2 && self.buf[1] <= 0x9F {
                    Lexed::Tok(Op::Forget)
                } else {
                    Lexed::Tok(Op::Print)
                }
            }
            Lex::Esc => {
                if let Some(l) = self.control_inside(b) {
                    return l;
                }
                self.buf.push(b);
                match b {
                    b'[' => {
                        self.state = Lex::Csi;
                        self.params = [0, 0];
                        self.nparam = 0;
                        self.plain = true;
                        self.private = false;
                        Lexed::More
                    }
                    b']' => {
                        self.state = Lex::Str(true);
                        Lexed::More
                    }
                    b'P' | b'X' | b'^' | b'_' => {
                        self.state = Lex::Str(false);
                        Lexed::More
                    }
                    0x20..=0x2F => {
                        self.hash = b == b'#';
                        self.state = Lex::EscInter;
                        Lexed::More
                    }
                    _ => {
                        self.state = Lex::Ground;
                        // Keypad modes, saving the cursor and the string terminator change
                        // nothing on the screen; everything else (restoring the cursor,
                        // index, reverse index, reset…) moves what the model follows.
                        Lexed::Tok(if matches!(b, b'=' | b'>' | b'\\' | b'7') {
                            Op::Inert
                        } else {
                            Op::Forget
                        })
                    }
                }
            }
            Lex::EscInter => {
                if let Some(l) = self.control_inside(b) {
                    return l;
                }
                self.buf.push(b);
                match b {
                    0x30..=0x7E => {
                        self.state = Lex::Ground;
                        // Character sets are inert; `ESC # 8` fills the screen.
                        Lexed::Tok(if self.hash { Op::Forget } else { Op::Inert })
                    }
                    _ => Lexed::More,
                }
            }
            Lex::Csi => {
                if let Some(l) = self.control_inside(b) {
                    return l;
                }
                self.buf.push(b);
                match b {
                    b'0'..=b'9' => {
                        if self.nparam < 2 {
                            self.params[self.nparam] = self.params[self.nparam]
                                .saturating_mul(10)
                                .saturating_add(u16::from(b - b'0'));
                        }
                        Lexed::More
                    }
                    b';' | b':' => {
                        self.nparam += 1;
                        Lexed::More
                    }
                    0x3C..=0x3F => {
                        self.plain = false;
                        self.private = true;
                        Lexed::More
                    }
                    0x20..=0x2F => {
                        self.plain = false;
                        Lexed::More
                    }
                    0x40..=0x7E => {
                        self.state = Lex::Ground;
                        Lexed::Tok(self.csi_op(b))
                    }
                    _ => Lexed::More,
                }
            }
            Lex::Str(osc) => match b {
                // ESC ends the string and starts what follows (`ESC \` is ST).
                0x1B => {
                    self.state = Lex::Ground;
                    Lexed::Before(Op::Inert)
                }
                0x18 | 0x1A => {
                    self.buf.push(b);
                    self.state = Lex::Ground;
                    Lexed::Tok(Op::Inert)
                }
                0x07 if osc => {
                    self.buf.push(b);
                    self.state = Lex::Ground;
                    Lexed::Tok(Op::Inert)
                }
                _ => {
                    self.buf.push(b);
                    Lexed::More
                }
            },
        }
    }

    /// Whether the bytes read so far can go out alone without changing what they mean.
    fn piece_ok(&self) -> bool {
        matches!(self.state, Lex::Str(_))
    }

    /// C0 controls inside an escape or CSI sequence act at once (as in vte), CAN and SUB
    /// abort it, ESC starts another; `None` for any other byte.
    fn control_inside(&mut self, b: u8) -> Option<Lexed> {
        let op = match b {
            0x18 | 0x1A => {
                self.buf.push(b);
                self.state = Lex::Ground;
                return Some(Lexed::Tok(Op::Inert));
            }
            // The unfinished sequence goes out as it is (it has no effect).
            0x1B => {
                self.state = Lex::Ground;
                return Some(Lexed::Before(Op::Inert));
            }
            b'\r' => Op::Cr,
            b'\n' | 0x0B | 0x0C => Op::Lf,
            0x08 => Op::Bs,
            b'\t' => Op::Tab,
            0x00..=0x1F => {
                self.buf.push(b);
                return Some(Lexed::More);
            }
            _ => return None,
        };
        // The sequence so far goes out with the control, which a terminal reads the same
        // way; the sequence then goes on.
        self.buf.push(b);
        Some(Lexed::Tok(op))
    }

    fn csi_op(&self, f: u8) -> Op {
        let (p1, p2) = (self.params[0], self.params[1]);
        if !self.plain {
            return match f {
                b'm' | b'n' | b'c' | b't' | b'q' | b'u' | b'x' => Op::Inert,
                b'h' | b'l' if self.private && !matches!(p1, 3 | 6 | 47 | 1047 | 1048 | 1049) => {
                    Op::Inert
                }
                _ => Op::Forget,
            };
        }
        match f {
            b'm' | b'n' | b'c' | b't' | b'q' | b'x' | b'g' | b'i' | b's' => Op::Inert,
            b'h' | b'l' if p1 == 4 => Op::Insert(f == b'h'),
            b'h' | b'l' => Op::Inert,
            b'K' | b'J' | b'G' | b'`' | b'C' | b'a' | b'D' | b'A' | b'B' | b'e' | b'E' | b'F'
            | b'X' | b'@' | b'P' | b'I' | b'Z' | b'd' | b'H' | b'f' => Op::Csi(f, p1, p2),
            _ => Op::Forget,
        }
    }
}

/// The length of the UTF-8 character that `b` begins, if it can begin one.
fn utf8_len(b: u8) -> Option<usize> {
    match b {
        0xC2..=0xDF => Some(2),
        0xE0..=0xEF => Some(3),
        0xF0..=0xF4 => Some(4),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
