//! The line model: the held part of the current line, a row of cells with a cursor.

use crate::text::utf8::{is_continuation, utf8_lead};

/// An erased cell inside the held line. NUL never reaches the line (it is a C0 control), so
/// it is free to mark blanks; blanks become spaces or are dropped when a line is stored.
const BLANK: u8 = 0;

/// The held part of the current line.
pub(super) struct Line {
    /// UTF-8 text with `BLANK` cells.
    cells: Vec<u8>,
    /// Byte offset of the cursor in `cells`, always at a cell boundary.
    cursor: usize,
    /// `cells` may contain `BLANK` cells.
    blanks: bool,
    /// The most bytes held before the finished part is streamed out.
    limit: usize,
}

impl Line {
    pub(super) fn new(limit: usize) -> Self {
        Line {
            cells: Vec::new(),
            cursor: 0,
            blanks: false,
            limit,
        }
    }

    /// The bytes held (tests check their bound).
    #[cfg(test)]
    pub(super) fn held(&self) -> &Vec<u8> {
        &self.cells
    }

    /// Ends the stream: appends the held line as it is (without a newline) and starts
    /// afresh.
    pub(super) fn finish(&mut self, out: &mut Vec<u8>) {
        self.emit_line(out);
        *self = Line::new(self.limit);
    }

    /// `\r`: the cursor to column 0.
    pub(super) fn carriage_return(&mut self) {
        self.cursor = 0;
    }

    /// Backspace: the cursor one cell left, not past column 0.
    pub(super) fn backspace(&mut self) {
        if self.cursor > 0 {
            self.cursor -= 1;
            while self.cursor > 0 && is_continuation(self.cells[self.cursor]) {
                self.cursor -= 1;
            }
        }
    }

    /// `CSI n G` / `CSI n` + backquote: the cursor to column `col` (from 0) of the held part.
    pub(super) fn move_to(&mut self, col: usize) {
        self.cursor = 0;
        self.move_right(col);
    }

    /// `CSI n C`: the cursor `n` columns right. Past the end of the line it leaves erased
    /// cells, but never more than make the held part `limit` bytes long: a huge `n` stops
    /// there (writing a character then streams the part before it out).
    pub(super) fn move_right(&mut self, n: usize) {
        let mut left = n;
        while left > 0 && self.cursor < self.cells.len() {
            self.cursor += cell_len(self.cells[self.cursor]);
            left -= 1;
        }
        if left > 0 {
            let pad = left.min(self.limit.saturating_sub(self.cells.len()));
            if pad > 0 {
                self.cells.resize(self.cells.len() + pad, BLANK);
                self.cursor = self.cells.len();
                self.blanks = true;
            }
        }
    }

    /// `CSI n D`: the cursor `n` columns left, not past column 0.
    pub(super) fn move_left(&mut self, n: usize) {
        for _ in 0..n {
            if self.cursor == 0 {
                return;
            }
            self.backspace();
        }
    }

    /// Bytes held.
    pub(super) fn len(&self) -> usize {
        self.cells.len()
    }

    /// The cursor is at the end of a line without blanks: text is only appended, and the
    /// line may live at the end of `out` instead (see [`lend`](Self::lend)).
    pub(super) fn appending(&self) -> bool {
        self.cursor == self.cells.len() && !self.blanks
    }

    /// Moves the held line (which must be [`appending`](Self::appending)) to the end of
    /// `out`, so that text can be appended to it there directly; returns where it starts.
    /// [`take_back`](Self::take_back) undoes this.
    pub(super) fn lend(&mut self, out: &mut Vec<u8>) -> usize {
        let start = out.len();
        out.extend_from_slice(&self.cells);
        self.cells.clear();
        self.cursor = 0;
        start
    }

    /// Holds again what of `out[start..]` (written since [`lend`](Self::lend), whole
    /// characters appended at the cursor) is still the held line: what follows its last
    /// `\n`, less what appending it byte by byte would have streamed out.
    pub(super) fn take_back(&mut self, out: &mut Vec<u8>, start: usize) {
        let mut from = memchr::memrchr(b'\n', &out[start..]).map_or(start, |nl| start + nl + 1);
        // As in `append`: the character holding byte `limit` of the line overflows it.
        while out.len() - from > self.limit {
            let mut end = from + self.limit + 1;
            while end < out.len() && is_continuation(out[end]) {
                end += 1;
            }
            from = end;
        }
        self.cells.extend_from_slice(&out[from..]);
        self.cursor = self.cells.len();
        out.truncate(from);
    }

    /// Writes a run of plain text (see [`plain_len`](super::scan::plain_len)) at the
    /// cursor.
    pub(super) fn put_run(&mut self, mut run: &[u8], out: &mut Vec<u8>) {
        while !run.is_empty() {
            if self.cursor == self.cells.len() {
                let Some(nl) = find_newline(run) else {
                    self.append(run, out);
                    return;
                };
                self.append(&run[..nl], out);
                self.store_line(out);
                let rest = &run[nl + 1..];
                // The line is empty now: whole lines in between can go straight out.
                if let Some(last) = rfind_newline(rest) {
                    out.extend_from_slice(&rest[..=last]);
                    self.append(&rest[last + 1..], out);
                } else {
                    self.append(rest, out);
                }
                return;
            }
            let b = run[0];
            if b == b'\n' {
                self.store_line(out);
                run = &run[1..];
                continue;
            }
            let len = cell_len(b);
            self.put_char(&run[..len], out);
            run = &run[len..];
        }
    }

    /// Appends whole characters (no `\n`) at the end of the line, the cursor being there,
    /// streaming out exactly where writing them one by one would.
    #[inline]
    fn append(&mut self, mut seg: &[u8], out: &mut Vec<u8>) {
        loop {
            let room = self.limit + 1 - self.cells.len();
            if seg.len() < room {
                extend_short(&mut self.cells, seg);
                self.cursor = self.cells.len();
                return;
            }
            // The character holding byte `limit` of the line is the one that overflows it.
            let mut end = room;
            while end < seg.len() && is_continuation(seg[end]) {
                end += 1;
            }
            self.emit_cells(self.cells.len(), out);
            out.extend_from_slice(&seg[..end]);
            self.cells.clear();
            self.cursor = 0;
            self.blanks = false;
            seg = &seg[end..];
        }
    }

    /// Writes one character (its UTF-8 bytes) at the cursor.
    pub(super) fn put_char(&mut self, ch: &[u8], out: &mut Vec<u8>) {
        if self.cursor == self.cells.len() {
            self.cells.extend_from_slice(ch);
            self.cursor = self.cells.len();
        } else {
            let old = cell_len(self.cells[self.cursor]);
            if old == ch.len() {
                self.cells[self.cursor..self.cursor + old].copy_from_slice(ch);
            } else {
                self.cells
                    .splice(self.cursor..self.cursor + old, ch.iter().copied());
            }
            self.cursor += ch.len();
        }
        if self.cells.len() > self.limit {
            self.emit_cells(self.cursor, out);
            self.cells.drain(..self.cursor);
            self.cursor = 0;
        }
    }

    /// `CSI K`: blank from the cursor to the end, which here means dropping those cells.
    pub(super) fn erase_right(&mut self) {
        self.cells.truncate(self.cursor);
    }

    /// `CSI 1 K`: blank from the start of the line through the cursor.
    pub(super) fn erase_left(&mut self) {
        let col = self.column();
        let through = if self.cursor < self.cells.len() {
            self.cursor + cell_len(self.cells[self.cursor])
        } else {
            self.cursor
        };
        let blanked = if self.cursor < self.cells.len() {
            col + 1
        } else {
            col
        };
        self.cells
            .splice(..through, std::iter::repeat_n(BLANK, blanked));
        self.cursor = col;
        self.blanks = true;
    }

    /// `CSI 2 K`: blank the whole line; the cursor keeps its column.
    pub(super) fn erase_all(&mut self) {
        let col = self.column();
        let count = self.cells.iter().filter(|&&b| !is_continuation(b)).count();
        self.cells.clear();
        self.cells.resize(count, BLANK);
        self.cursor = col;
        self.blanks = true;
    }

    /// The cursor's column in the held line.
    fn column(&self) -> usize {
        self.cells[..self.cursor]
            .iter()
            .filter(|&&b| !is_continuation(b))
            .count()
    }

    /// `\n`: stores the held line and starts a new one.
    pub(super) fn store_line(&mut self, out: &mut Vec<u8>) {
        self.emit_line(out);
        out.push(b'\n');
    }

    /// Appends the held line as stored (trailing blanks dropped) and empties it.
    fn emit_line(&mut self, out: &mut Vec<u8>) {
        self.shown(out);
        self.cells.clear();
        self.cursor = 0;
        self.blanks = false;
    }

    /// Appends the held line as it would be stored now, leaving it held.
    pub(super) fn shown(&self, out: &mut Vec<u8>) {
        let end = if self.blanks {
            self.cells
                .iter()
                .rposition(|&b| b != BLANK)
                .map_or(0, |p| p + 1)
        } else {
            self.cells.len()
        };
        self.emit_cells(end, out);
    }

    /// Appends `cells[..to]`, blanks as spaces.
    fn emit_cells(&self, to: usize, out: &mut Vec<u8>) {
        let cells = &self.cells[..to];
        if self.blanks {
            out.extend(cells.iter().map(|&b| if b == BLANK { b' ' } else { b }));
        } else {
            extend_short(out, cells);
        }
    }
}

/// Appends `src` to `dst` like `extend_from_slice`, but copies short runs in fixed 8-byte
/// pieces that the compiler turns into plain moves: between colour codes runs are ~20
/// bytes, and a call into libc's memcpy (musl's starts with `rep movsq`) costs more than
/// such a copy itself.
#[inline]
fn extend_short(dst: &mut Vec<u8>, src: &[u8]) {
    if src.len() >= 128 {
        dst.extend_from_slice(src);
        return;
    }
    dst.reserve(src.len());
    let mut chunks = src.chunks_exact(8);
    for c in &mut chunks {
        let piece: [u8; 8] = c.try_into().unwrap_or_default();
        dst.extend_from_slice(&piece);
    }
    for &b in chunks.remainder() {
        dst.push(b);
    }
}

/// Runs between colour codes are short: a plain loop beats memchr's set-up there.
#[inline]
fn find_newline(b: &[u8]) -> Option<usize> {
    if b.len() <= 32 {
        b.iter().position(|&c| c == b'\n')
    } else {
        memchr::memchr(b'\n', b)
    }
}

#[inline]
fn rfind_newline(b: &[u8]) -> Option<usize> {
    if b.len() <= 32 {
        b.iter().rposition(|&c| c == b'\n')
    } else {
        memchr::memrchr(b'\n', b)
    }
}

/// Bytes in the cell that starts with `b` (a blank, ASCII or a UTF-8 lead byte).
fn cell_len(b: u8) -> usize {
    utf8_lead(b).map_or(1, |(need, _, _)| need + 1)
}
