//! Terminal-output sanitizer: strips escape sequences and controls and applies the line
//! model of the contract (cursor, `\r`, backspace, erase-in-line). Pure; no I/O.
//!
//! # What is stored
//!
//! * Escape sequences are removed whole, payload included. Where a sequence ends follows the
//!   VT500 state machine as the `vte` crate (0.15) implements it: ESC ends any string
//!   sequence, CAN and SUB abort any sequence, C0 controls inside CSI and plain ESC sequences
//!   still act (a `\n` in the middle of `ESC [ 3 1 m` ends the line), bytes `>= 0x80` inside
//!   a sequence belong to it, and a `0x9C` byte ends a DCS payload. The transitions are
//!   re-implemented here rather than driving `vte::Parser`: with its default `std` feature
//!   that parser keeps every OSC payload byte in an unbounded `Vec` (its const-generic
//!   buffer size only applies without `std`), so `ESC ]` followed by 100 MB would hold
//!   100 MB. This state machine holds no payload at all; the tests check it against `vte`.
//! * Every C0 control but `\n` and `\t`, DEL, and the C1 characters U+0080–U+009F are
//!   removed as single characters. Invalid UTF-8 becomes one U+FFFD per maximal invalid
//!   subpart, as `String::from_utf8_lossy` does; that includes a lone byte `0x80..=0x9F`
//!   (which `vte` would treat as a C1 control). A character split across reads is kept whole.
//!
//! # Line model
//!
//! A line is a row of cells with a cursor, counted in characters (no wide-character width).
//! Printable characters and `\t` are written at the cursor, overwriting or appending; `\r`
//! moves the cursor to column 0, backspace one column left (not past 0), and `CSI K` /
//! `CSI 0 K` / `CSI 1 K` / `CSI 2 K` erase to the end, from the start through the cursor, or
//! the whole line, without moving the cursor. `\n` stores the line. Every other control and
//! sequence is dropped without effect (no cursor movement, no tab stops).
//!
//! Erased cells are blank: blank cells followed by text in the same line are stored as
//! spaces (that is what a terminal shows), blank cells at the end of a line are not stored.
//!
//! A line is held until it ends, up to [`LINE_LIMIT`] bytes. When writing a character makes
//! the held part longer than that, the part before the cursor is streamed out and only the
//! rest stays held; later cursor movement and erasing act on the held part alone. Nothing is
//! ever inserted: no marker, no line break. The streaming points depend only on the bytes,
//! never on how they were split into reads.
//!
//! At the end of the stream the held line is stored as it is, without a newline; an
//! unfinished escape sequence is dropped and an unfinished UTF-8 character becomes U+FFFD.
//!
//! # Speed
//!
//! In the ground state, runs of printable ASCII, `\t`, `\n` and well-formed non-C1 UTF-8 are
//! found with a block scan and copied wholesale: complete lines go straight to the output
//! when nothing of the line is held. Plain `CSI` sequences other than `K` (SGR colours) are
//! skipped in one step; everything else goes through the byte-wise state machine.

/// The most bytes of one line held before its finished part is streamed out.
pub const LINE_LIMIT: usize = 64 * 1024;

/// An erased cell inside the held line. NUL never reaches the line (it is a C0 control), so
/// it is free to mark blanks; blanks become spaces or are dropped when a line is stored.
const BLANK: u8 = 0;

/// vte keeps at most this many parameters and subparameters; one more makes it ignore the
/// sequence, which then has no effect.
const MAX_PARAMS: u8 = 32;

/// The states of the VT500 parser, as `vte` names them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    #[default]
    Ground,
    Escape,
    EscapeIntermediate,
    CsiEntry,
    CsiParam,
    CsiIntermediate,
    CsiIgnore,
    DcsEntry,
    DcsParam,
    DcsIntermediate,
    DcsPassthrough,
    DcsIgnore,
    OscString,
    SosPmApcString,
}

/// A streaming sanitizer; parser state carries across `feed` calls.
pub struct Sanitizer {
    state: State,
    /// The CSI being parsed can still be a plain erase-in-line (no intermediates or private
    /// markers, no parameter overflow).
    csi_plain: bool,
    /// Parameters and subparameters completed so far in the current CSI.
    csi_params: u8,
    /// The parameter being accumulated.
    csi_param: u16,
    /// The first completed parameter: the only one erase-in-line reads.
    csi_first: u16,
    /// Bytes of an unfinished UTF-8 character (ground state only).
    utf8: [u8; 4],
    utf8_len: u8,
    /// The held part of the current line: UTF-8 text with `BLANK` cells.
    line: Vec<u8>,
    /// Byte offset of the cursor in `line`, always at a cell boundary.
    cursor: usize,
    /// `line` may contain `BLANK` cells.
    blanks: bool,
    limit: usize,
}

impl Default for Sanitizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Sanitizer {
    /// A sanitizer in the ground state with an empty line.
    pub fn new() -> Self {
        Self::with_line_limit(LINE_LIMIT)
    }

    /// A sanitizer that holds at most `limit` bytes of a line (tests use small limits).
    pub(crate) fn with_line_limit(limit: usize) -> Self {
        Sanitizer {
            state: State::Ground,
            csi_plain: true,
            csi_params: 0,
            csi_param: 0,
            csi_first: 0,
            utf8: [0; 4],
            utf8_len: 0,
            line: Vec::new(),
            cursor: 0,
            blanks: false,
            limit,
        }
    }

    /// Sanitizes `input`, appending every finished line (and any part of an over-long
    /// line that can no longer change) to `out`.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        let mut i = 0;
        while i < input.len() {
            if self.state == State::Ground && self.utf8_len == 0 {
                let run = plain_len(&input[i..]);
                if run > 0 {
                    self.put_run(&input[i..i + run], out);
                    i += run;
                    if i == input.len() {
                        break;
                    }
                }
                if input[i] == 0x1B
                    && let Some(len) = inert_csi_len(&input[i..])
                {
                    i += len;
                    continue;
                }
            } else if let Some(skip) = self.string_skip(&input[i..]) {
                // Payload bytes of a string sequence have no effect: skip to the next byte
                // that can end it.
                i += skip;
                if i == input.len() {
                    break;
                }
            }
            self.step(input[i], out);
            i += 1;
        }
    }

    /// Ends the stream: appends the held last line (without adding a newline).
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if self.utf8_len > 0 {
            self.utf8_len = 0;
            self.put_char("\u{FFFD}".as_bytes(), out);
        }
        self.emit_line(out);
        *self = Self::with_line_limit(self.limit);
    }

    /// For string states, how many leading bytes cannot change the state.
    fn string_skip(&self, bytes: &[u8]) -> Option<usize> {
        let ends: fn(u8) -> bool = match self.state {
            State::OscString => |b| matches!(b, 0x07 | 0x18 | 0x1A | 0x1B),
            State::DcsPassthrough => |b| matches!(b, 0x18 | 0x1A | 0x1B | 0x9C),
            State::SosPmApcString | State::DcsIgnore => |b| matches!(b, 0x18 | 0x1A | 0x1B),
            _ => return None,
        };
        Some(bytes.iter().position(|&b| ends(b)).unwrap_or(bytes.len()))
    }

    /// One byte through the state machine (mirrors `vte::Parser`'s transitions).
    fn step(&mut self, b: u8, out: &mut Vec<u8>) {
        match self.state {
            State::Ground => self.ground_byte(b, out),
            State::Escape => match b {
                0x00..=0x17 | 0x19 | 0x1C..=0x1F => self.execute(b, out),
                0x20..=0x2F => self.state = State::EscapeIntermediate,
                b'P' => self.state = State::DcsEntry,
                b'X' | b'^' | b'_' => self.state = State::SosPmApcString,
                b'[' => {
                    self.csi_plain = true;
                    self.csi_params = 0;
                    self.csi_param = 0;
                    self.csi_first = 0;
                    self.state = State::CsiEntry;
                }
                b']' => self.state = State::OscString,
                0x30..=0x7E => self.state = State::Ground,
                0x18 | 0x1A => self.state = State::Ground,
                _ => {}
            },
            State::EscapeIntermediate => match b {
                0x00..=0x17 | 0x19 | 0x1C..=0x1F => self.execute(b, out),
                0x20..=0x2F | 0x7F => {}
                0x30..=0x7E => self.state = State::Ground,
                _ => self.anywhere(b),
            },
            State::CsiEntry => match b {
                0x00..=0x17 | 0x19 | 0x1C..=0x1F => self.execute(b, out),
                0x20..=0x2F => {
                    self.csi_plain = false;
                    self.state = State::CsiIntermediate;
                }
                0x30..=0x39 => {
                    self.csi_digit(b);
                    self.state = State::CsiParam;
                }
                b':' | b';' => {
                    self.csi_separator();
                    self.state = State::CsiParam;
                }
                0x3C..=0x3F => {
                    self.csi_plain = false;
                    self.state = State::CsiParam;
                }
                0x40..=0x7E => self.csi_dispatch(b),
                _ => self.anywhere(b),
            },
            State::CsiParam => match b {
                0x00..=0x17 | 0x19 | 0x1C..=0x1F => self.execute(b, out),
                0x20..=0x2F => {
                    self.csi_plain = false;
                    self.state = State::CsiIntermediate;
                }
                0x30..=0x39 => self.csi_digit(b),
                b':' | b';' => self.csi_separator(),
                0x3C..=0x3F => self.state = State::CsiIgnore,
                0x40..=0x7E => self.csi_dispatch(b),
                0x7F => {}
                _ => self.anywhere(b),
            },
            State::CsiIntermediate => match b {
                0x00..=0x17 | 0x19 | 0x1C..=0x1F => self.execute(b, out),
                0x20..=0x2F => {}
                0x30..=0x3F => self.state = State::CsiIgnore,
                0x40..=0x7E => self.csi_dispatch(b),
                _ => self.anywhere(b),
            },
            State::CsiIgnore => match b {
                0x00..=0x17 | 0x19 | 0x1C..=0x1F => self.execute(b, out),
                0x20..=0x3F | 0x7F => {}
                0x40..=0x7E => self.state = State::Ground,
                _ => self.anywhere(b),
            },
            State::DcsEntry => match b {
                0x00..=0x17 | 0x19 | 0x1C..=0x1F | 0x7F => {}
                0x20..=0x2F => self.state = State::DcsIntermediate,
                0x30..=0x3F => self.state = State::DcsParam,
                0x40..=0x7E => self.state = State::DcsPassthrough,
                _ => self.anywhere(b),
            },
            State::DcsParam => match b {
                0x00..=0x17 | 0x19 | 0x1C..=0x1F | 0x7F | 0x30..=0x3B => {}
                0x20..=0x2F => self.state = State::DcsIntermediate,
                0x3C..=0x3F => self.state = State::DcsIgnore,
                0x40..=0x7E => self.state = State::DcsPassthrough,
                _ => self.anywhere(b),
            },
            State::DcsIntermediate => match b {
                0x00..=0x17 | 0x19 | 0x1C..=0x1F | 0x7F | 0x20..=0x2F => {}
                0x30..=0x3F => self.state = State::DcsIgnore,
                0x40..=0x7E => self.state = State::DcsPassthrough,
                _ => self.anywhere(b),
            },
            State::DcsPassthrough => match b {
                0x9C => self.state = State::Ground,
                _ => self.anywhere(b),
            },
            State::OscString => match b {
                0x07 => self.state = State::Ground,
                _ => self.anywhere(b),
            },
            State::DcsIgnore | State::SosPmApcString => self.anywhere(b),
        }
    }

    /// The transitions vte takes from any state: CAN/SUB abort, ESC starts over.
    fn anywhere(&mut self, b: u8) {
        match b {
            0x18 | 0x1A => self.state = State::Ground,
            0x1B => self.state = State::Escape,
            _ => {}
        }
    }

    fn csi_digit(&mut self, b: u8) {
        if self.csi_params == MAX_PARAMS {
            self.csi_plain = false;
        } else {
            self.csi_param = self
                .csi_param
                .saturating_mul(10)
                .saturating_add(u16::from(b - b'0'));
        }
    }

    fn csi_separator(&mut self) {
        if self.csi_params == MAX_PARAMS {
            self.csi_plain = false;
        } else {
            self.csi_push();
        }
    }

    fn csi_push(&mut self) {
        if self.csi_params == 0 {
            self.csi_first = self.csi_param;
        }
        self.csi_params += 1;
        self.csi_param = 0;
    }

    fn csi_dispatch(&mut self, b: u8) {
        self.state = State::Ground;
        if b != b'K' {
            return;
        }
        if self.csi_params == MAX_PARAMS {
            self.csi_plain = false;
        } else {
            self.csi_push();
        }
        if self.csi_plain {
            match self.csi_first {
                0 => self.erase_right(),
                1 => self.erase_left(),
                2 => self.erase_all(),
                _ => {}
            }
        }
    }

    /// A control character that takes effect (in ground and in CSI / ESC sequences).
    fn execute(&mut self, b: u8, out: &mut Vec<u8>) {
        match b {
            b'\n' => self.store_line(out),
            b'\r' => self.cursor = 0,
            0x08 if self.cursor > 0 => {
                self.cursor -= 1;
                while self.cursor > 0 && is_continuation(self.line[self.cursor]) {
                    self.cursor -= 1;
                }
            }
            b'\t' => self.put_char(b"\t", out),
            _ => {}
        }
    }

    fn ground_byte(&mut self, b: u8, out: &mut Vec<u8>) {
        if self.utf8_len > 0 {
            let n = usize::from(self.utf8_len);
            let (need, lo, hi) = utf8_lead(self.utf8[0]).unwrap_or((0, 0, 0));
            let (lo, hi) = if n == 1 { (lo, hi) } else { (0x80, 0xBF) };
            if (lo..=hi).contains(&b) {
                self.utf8[n] = b;
                self.utf8_len += 1;
                if n == need {
                    self.utf8_len = 0;
                    let ch = self.utf8;
                    if !(ch[0] == 0xC2 && ch[1] <= 0x9F) {
                        self.put_char(&ch[..=need], out);
                    }
                }
                return;
            }
            // A maximal invalid subpart: one replacement, then look at `b` afresh.
            self.utf8_len = 0;
            self.put_char("\u{FFFD}".as_bytes(), out);
        }
        match b {
            0x20..=0x7E => self.put_char(&[b], out),
            0x1B => self.state = State::Escape,
            0x00..=0x1F => self.execute(b, out),
            0x7F => {}
            _ => {
                if utf8_lead(b).is_some() {
                    self.utf8[0] = b;
                    self.utf8_len = 1;
                } else {
                    self.put_char("\u{FFFD}".as_bytes(), out);
                }
            }
        }
    }

    /// Writes a run of plain text (see [`plain_len`]) at the cursor.
    fn put_run(&mut self, mut run: &[u8], out: &mut Vec<u8>) {
        while !run.is_empty() {
            if self.cursor == self.line.len() {
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
            let len = utf8_lead(b).map_or(1, |(need, _, _)| need + 1);
            self.put_char(&run[..len], out);
            run = &run[len..];
        }
    }

    /// Appends whole characters (no `\n`) at the end of the line, the cursor being there,
    /// streaming out exactly where writing them one by one would.
    #[inline]
    fn append(&mut self, mut seg: &[u8], out: &mut Vec<u8>) {
        loop {
            let room = self.limit + 1 - self.line.len();
            if seg.len() < room {
                extend_short(&mut self.line, seg);
                self.cursor = self.line.len();
                return;
            }
            // The character holding byte `limit` of the line is the one that overflows it.
            let mut end = room;
            while end < seg.len() && is_continuation(seg[end]) {
                end += 1;
            }
            self.emit_cells(self.line.len(), out);
            out.extend_from_slice(&seg[..end]);
            self.line.clear();
            self.cursor = 0;
            self.blanks = false;
            seg = &seg[end..];
        }
    }

    /// Writes one character (its UTF-8 bytes) at the cursor.
    fn put_char(&mut self, ch: &[u8], out: &mut Vec<u8>) {
        if self.cursor == self.line.len() {
            self.line.extend_from_slice(ch);
            self.cursor = self.line.len();
        } else {
            let old = cell_len(self.line[self.cursor]);
            if old == ch.len() {
                self.line[self.cursor..self.cursor + old].copy_from_slice(ch);
            } else {
                self.line
                    .splice(self.cursor..self.cursor + old, ch.iter().copied());
            }
            self.cursor += ch.len();
        }
        if self.line.len() > self.limit {
            self.emit_cells(self.cursor, out);
            self.line.drain(..self.cursor);
            self.cursor = 0;
        }
    }

    /// `CSI K`: blank from the cursor to the end, which here means dropping those cells.
    fn erase_right(&mut self) {
        self.line.truncate(self.cursor);
    }

    /// `CSI 1 K`: blank from the start of the line through the cursor.
    fn erase_left(&mut self) {
        let col = self.column();
        let through = if self.cursor < self.line.len() {
            self.cursor + cell_len(self.line[self.cursor])
        } else {
            self.cursor
        };
        let cells = if self.cursor < self.line.len() {
            col + 1
        } else {
            col
        };
        self.line
            .splice(..through, std::iter::repeat_n(BLANK, cells));
        self.cursor = col;
        self.blanks = true;
    }

    /// `CSI 2 K`: blank the whole line; the cursor keeps its column.
    fn erase_all(&mut self) {
        let col = self.column();
        let cells = self.line.iter().filter(|&&b| !is_continuation(b)).count();
        self.line.clear();
        self.line.resize(cells, BLANK);
        self.cursor = col;
        self.blanks = true;
    }

    /// The cursor's column in the held line.
    fn column(&self) -> usize {
        self.line[..self.cursor]
            .iter()
            .filter(|&&b| !is_continuation(b))
            .count()
    }

    /// `\n`: stores the held line and starts a new one.
    fn store_line(&mut self, out: &mut Vec<u8>) {
        self.emit_line(out);
        out.push(b'\n');
    }

    /// Appends the held line as stored (trailing blanks dropped) and empties it.
    fn emit_line(&mut self, out: &mut Vec<u8>) {
        let end = if self.blanks {
            self.line
                .iter()
                .rposition(|&b| b != BLANK)
                .map_or(0, |p| p + 1)
        } else {
            self.line.len()
        };
        self.emit_cells(end, out);
        self.line.clear();
        self.cursor = 0;
        self.blanks = false;
    }

    /// Appends `line[..to]`, blanks as spaces.
    fn emit_cells(&self, to: usize, out: &mut Vec<u8>) {
        let cells = &self.line[..to];
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

fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

/// Bytes in the cell that starts with `b` (a blank, ASCII or a UTF-8 lead byte).
fn cell_len(b: u8) -> usize {
    utf8_lead(b).map_or(1, |(need, _, _)| need + 1)
}

/// For a UTF-8 lead byte: how many continuation bytes follow and the range allowed for the
/// first of them (the rest are `0x80..=0xBF`). These ranges exclude overlong forms,
/// surrogates and values past U+10FFFF, which makes the invalid subparts the same as
/// `String::from_utf8_lossy`'s.
fn utf8_lead(b: u8) -> Option<(usize, u8, u8)> {
    Some(match b {
        0xC2..=0xDF => (1, 0x80, 0xBF),
        0xE0 => (2, 0xA0, 0xBF),
        0xE1..=0xEC | 0xEE | 0xEF => (2, 0x80, 0xBF),
        0xED => (2, 0x80, 0x9F),
        0xF0 => (3, 0x90, 0xBF),
        0xF1..=0xF3 => (3, 0x80, 0xBF),
        0xF4 => (3, 0x80, 0x8F),
        _ => return None,
    })
}

/// Length of the well-formed, non-C1 character at the start of `b`, if it is complete.
fn plain_utf8_len(b: &[u8]) -> Option<usize> {
    let (need, lo, hi) = utf8_lead(b[0])?;
    if b.len() <= need || !(lo..=hi).contains(&b[1]) {
        return None;
    }
    if !b[2..=need].iter().all(|&c| is_continuation(c)) {
        return None;
    }
    if b[0] == 0xC2 && b[1] <= 0x9F {
        return None;
    }
    Some(need + 1)
}

/// Printable ASCII, `\t` or `\n`: bytes that are written as they are.
#[inline(always)]
fn is_plain_ascii(c: u8) -> bool {
    (c.wrapping_sub(0x20) < 0x5F) | (c == b'\n') | (c == b'\t')
}

/// Length of the leading run of plain text: printable ASCII, `\t`, `\n` and complete,
/// well-formed, non-C1 UTF-8 characters.
fn plain_len(b: &[u8]) -> usize {
    let mut i = 0;
    loop {
        if let Some(block) = b.get(i..i + 16) {
            // Branch-free, so that it compiles to vector compares.
            if block.iter().fold(true, |ok, &c| ok & is_plain_ascii(c)) {
                i += 16;
                continue;
            }
            i += first_not_plain(block.try_into().unwrap());
        } else {
            let tail = &b[i..];
            i += tail
                .iter()
                .position(|&c| !is_plain_ascii(c))
                .unwrap_or(tail.len());
            if i == b.len() {
                return i;
            }
        }
        // Non-ASCII characters come in runs (words): stay in this loop while they last.
        while let Some(&c) = b.get(i) {
            if c < 0x80 {
                if !is_plain_ascii(c) {
                    return i;
                }
                // A lone space or letter between non-ASCII words is taken here; a longer
                // ASCII run goes back to the block scan.
                if b.get(i + 1).is_none_or(|&d| d < 0x80) {
                    break;
                }
                i += 1;
                continue;
            }
            // The common two- and three-byte forms, whose first continuation byte may be
            // anything in 0x80..=0xBF; the rest (and C1) go the long way.
            let cont = |k: usize| b.get(i + k).is_some_and(|&d| is_continuation(d));
            i += match c {
                0xC3..=0xDF if cont(1) => 2,
                0xE1..=0xEC | 0xEE | 0xEF if cont(1) && cont(2) => 3,
                _ => match plain_utf8_len(&b[i..]) {
                    Some(len) => len,
                    None => return i,
                },
            };
        }
        if i == b.len() {
            return i;
        }
    }
}

/// Index of the first byte of `block` that is not plain ASCII (16 if none), eight bytes at a
/// time: the high bit of each byte lane says whether that byte is plain. No lane carries
/// into the next, so every lane is exact.
#[inline]
fn first_not_plain(block: &[u8; 16]) -> usize {
    const LOW7: u64 = 0x7F7F_7F7F_7F7F_7F7F;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    const fn lanes(b: u8) -> u64 {
        0x0101_0101_0101_0101 * b as u64
    }
    fn equal(x: u64, b: u8) -> u64 {
        let t = x ^ lanes(b);
        !(((t & LOW7) + LOW7) | t) & HIGH
    }
    for (half, word) in block.chunks_exact(8).enumerate() {
        let x = u64::from_le_bytes(word.try_into().unwrap());
        let low = x & LOW7;
        let at_least_space = (low + lanes(0x60)) & HIGH;
        let del = (low + lanes(0x01)) & HIGH;
        let printable = at_least_space & !del & !x;
        let bad = !(printable | equal(x, b'\n') | equal(x, b'\t')) & HIGH;
        if bad != 0 {
            return half * 8 + bad.trailing_zeros() as usize / 8;
        }
    }
    16
}

/// If `b` starts with a complete CSI sequence that has no effect here (anything but `K`,
/// made only of parameter bytes), its length. SGR colours are the common case.
fn inert_csi_len(b: &[u8]) -> Option<usize> {
    if b.get(1) != Some(&b'[') {
        return None;
    }
    let params = b[2..].iter().position(|c| !(0x30..=0x3F).contains(c))?;
    let fin = b[2 + params];
    ((0x40..=0x7E).contains(&fin) && fin != b'K').then_some(params + 3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run_chunks(mut s: Sanitizer, chunks: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for c in chunks {
            s.feed(c, &mut out);
        }
        s.finish(&mut out);
        out
    }

    fn san(input: &[u8]) -> String {
        String::from_utf8(run_chunks(Sanitizer::new(), &[input])).unwrap()
    }

    fn san_limit(input: &[u8], limit: usize) -> Vec<u8> {
        run_chunks(Sanitizer::with_line_limit(limit), &[input])
    }

    /// Every split into two writes, and one byte per write, give the one-shot result.
    fn assert_split_invariant(input: &[u8], limit: usize) {
        let whole = san_limit(input, limit);
        for i in 0..=input.len() {
            let (a, b) = input.split_at(i);
            let split = run_chunks(Sanitizer::with_line_limit(limit), &[a, b]);
            assert_eq!(
                split,
                whole,
                "split at {i} of {:?}",
                String::from_utf8_lossy(input)
            );
        }
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(run_chunks(Sanitizer::with_line_limit(limit), &bytes), whole);
    }

    #[test]
    fn block_scan_finds_the_first_byte_that_is_not_plain() {
        for c in 0..=255u8 {
            for k in 0..16 {
                let mut block = [b'a'; 16];
                block[k] = c;
                let expected = if is_plain_ascii(c) { 16 } else { k };
                assert_eq!(first_not_plain(&block), expected, "byte {c:#x} at {k}");
                // A later bad byte does not hide an earlier one.
                block[15] = 0x1B;
                assert_eq!(first_not_plain(&block), expected.min(15));
            }
        }
        let text = "0123456789abcdef\tline\nü\u{85}x".as_bytes();
        assert_eq!(plain_len(text), text.len() - 3);
        // A character cut off at the end is not plain (yet).
        assert_eq!(plain_len(&text[..23]), 22);
        assert_eq!(plain_len(b"\x1b[m"), 0);
        assert_eq!(plain_len(b"abc\xe2\x82"), 3);
    }

    #[test]
    fn plain_text_passes_through() {
        assert_eq!(
            san(b"hello world\nsecond line\n"),
            "hello world\nsecond line\n"
        );
        assert_eq!(
            san("tabs\tand ünïcödé 😀\n".as_bytes()),
            "tabs\tand ünïcödé 😀\n"
        );
        assert_eq!(san(b""), "");
    }

    #[test]
    fn last_line_is_stored_as_is() {
        assert_eq!(san(b"no newline"), "no newline");
        assert_eq!(san(b"a\nb"), "a\nb");
        assert_eq!(san(b"trailing spaces   "), "trailing spaces   ");
    }

    #[test]
    fn crlf_is_a_line_end() {
        assert_eq!(san(b"one\r\ntwo\r\n"), "one\ntwo\n");
        assert_eq!(san(b"text\r\r\n"), "text\n");
    }

    #[test]
    fn progress_bar_keeps_last_frame() {
        assert_eq!(san(b"10%\r20%\r100%\n"), "100%\n");
        assert_eq!(
            san(b"[##  ] 50%\r[####] 100%\ndone\n"),
            "[####] 100%\ndone\n"
        );
        // A shorter frame over a longer one: the terminal still shows the old tail.
        assert_eq!(san(b"loading...\rok\n"), "okading...\n");
    }

    #[test]
    fn overstrike_reads_the_last_character() {
        assert_eq!(san(b"N\x08NA\x08AM\x08ME\x08E\n"), "NAME\n");
        assert_eq!(san(b"_\x08O_\x08K\n"), "OK\n");
        assert_eq!(san("é\x08x\n".as_bytes()), "x\n");
        // Backspace stops at column 0.
        assert_eq!(san(b"\x08\x08ab\n"), "ab\n");
    }

    #[test]
    fn erase_in_line() {
        assert_eq!(san(b"abcdef\x08\x08\x1b[K\n"), "abcd\n");
        assert_eq!(san(b"abcdef\x08\x08\x1b[0K\n"), "abcd\n");
        assert_eq!(san(b"abcdef\r\x1b[Knew\n"), "new\n");
        // 1K blanks from the start through the cursor; text after it keeps its column.
        assert_eq!(san(b"abcdef\x08\x08\x1b[1K\n"), "     f\n");
        assert_eq!(san(b"abcdef\x08\x08\x1b[1Kxy\n"), "    xy\n");
        assert_eq!(san(b"abc\x1b[1K\n"), "\n");
        assert_eq!(san(b"abc\x1b[1Kd\n"), "   d\n");
        // 2K blanks the line, the cursor stays.
        assert_eq!(san(b"abc\x1b[2K\n"), "\n");
        assert_eq!(san(b"abc\x1b[2Kdef\n"), "   def\n");
        assert_eq!(san(b"abc\r\x1b[2Kdef\n"), "def\n");
        assert_eq!(san("äöü\x1b[2K€".as_bytes()), "   €");
        // Erased cells at the end are not stored, also without a newline.
        assert_eq!(san(b"abc\x1b[2K"), "");
        // Only the first parameter counts; others are not erase-in-line.
        assert_eq!(san(b"abc\x1b[1;5K\n"), "\n");
        assert_eq!(san(b"abc\x1b[3K\n"), "abc\n");
        assert_eq!(san(b"abc\x1b[?2K\n"), "abc\n");
        assert_eq!(san(b"abc\x1b[ K\n"), "abc\n");
    }

    #[test]
    fn csi_sequences_are_removed() {
        assert_eq!(san(b"\x1b[01;34mdir\x1b[0m\n"), "dir\n");
        assert_eq!(san(b"\x1b[38;2;255;0;0mred\x1b[m\n"), "red\n");
        assert_eq!(san(b"\x1b[?25l\x1b[2J\x1b[H\x1b[10;20Hx\x1b[5Ay\n"), "xy\n");
        assert_eq!(san(b"\x1b[1 q\x1b[>0c\x1b[4:3mz\n"), "z\n");
    }

    #[test]
    fn string_sequences_are_removed_with_payload() {
        // OSC titles, hyperlinks and clipboard, ended by BEL or ST.
        assert_eq!(san(b"\x1b]0;window title\x07text\n"), "text\n");
        assert_eq!(san(b"\x1b]2;title\x1b\\text\n"), "text\n");
        assert_eq!(
            san(b"\x1b]8;;https://example.com/\x1b\\link\x1b]8;;\x1b\\\n"),
            "link\n"
        );
        assert_eq!(san(b"\x1b]52;c;c2VjcmV0\x07\n"), "\n");
        // DCS (sixel, tmux passthrough), SOS, PM and APC (kitty graphics).
        assert_eq!(san(b"\x1bPq#0;2;0;0;0#0!6~\x1b\\after\n"), "after\n");
        assert_eq!(san(b"\x1bPtmux;\x1b\x1b]0;x\x07\x1b\\y\n"), "y\n");
        assert_eq!(
            san(b"\x1bXsos payload\x1b\\a\x1b^pm payload\x1b\\b\n"),
            "ab\n"
        );
        assert_eq!(san(b"\x1b_Gf=100;AAAA\x1b\\img\n"), "img\n");
        // Controls inside string payloads do nothing, not even `\n`.
        assert_eq!(san(b"\x1b]0;a\nb\rc\x07d\n"), "d\n");
        assert_eq!(san(b"\x1b_x\ny\x07z\x1b\\w\n"), "w\n");
        // 0x9C ends a DCS payload (vte's 8-bit ST).
        assert_eq!(san(b"\x1bPq\x9cok\n"), "ok\n");
    }

    #[test]
    fn can_and_sub_abort_sequences() {
        assert_eq!(san(b"\x1b[31\x18m\n"), "m\n");
        assert_eq!(san(b"\x1b]0;title\x1aok\n"), "ok\n");
        assert_eq!(san(b"\x1bPq payload\x18ok\n"), "ok\n");
        assert_eq!(san(b"\x1b\x18x\n"), "x\n");
    }

    #[test]
    fn other_escape_sequences_are_removed() {
        assert_eq!(
            san(b"\x1b(B\x1b)0\x1b=\x1b>\x1b7\x1b8\x1b#8\x1bMx\n"),
            "x\n"
        );
        assert_eq!(san(b"a\x1b\x1bb\n"), "a\n");
        assert_eq!(san(b"a\x1b\x1b[mb\n"), "ab\n");
    }

    #[test]
    fn controls_are_removed() {
        assert_eq!(san(b"a\x00\x01\x07\x0b\x0c\x0e\x1f\x7fb\n"), "ab\n");
        // C1 characters, as UTF-8; U+009B is not a CSI here.
        assert_eq!(
            san("a\u{85}b\u{9b}31mc\u{80}\u{9f}\n".as_bytes()),
            "ab31mc\n"
        );
        // C0 controls act inside CSI and ESC sequences, as in vte.
        assert_eq!(san(b"x\x1b[3\n1my\n"), "x\ny\n");
        assert_eq!(san(b"abc\x1b[\r1mX\n"), "Xbc\n");
        // ... and a final byte right after them ends the sequence.
        assert_eq!(san(b"abc\x1b[\rX\n"), "abc\n");
        assert_eq!(san(b"abc\x1b(\x08B\n"), "abc\n");
    }

    #[test]
    fn invalid_utf8_matches_from_utf8_lossy() {
        let cases: &[&[u8]] = &[
            b"\xff",
            b"a\x80b",
            b"\x80\x9f\xa0",
            b"\xc0\x80",
            b"\xc1\xbf",
            b"\xe2\x82",
            b"\xe2\x82a",
            b"\xe2\x82\xe2\x82\xac",
            b"\xed\xa0\x80",
            b"\xe0\x80\xaf",
            b"\xf0\x9f\x98",
            b"\xf0\x9f\x98 ",
            b"\xf4\x90\x80\x80",
            b"\xf5\x80",
            b"\xf8\x88\x80\x80\x80",
            b"a\xc3",
            b"\xc3\x28",
        ];
        for &case in cases {
            assert_eq!(san(case), String::from_utf8_lossy(case), "{case:?}");
        }
        // An incomplete character cut off by ESC.
        assert_eq!(san(b"\xe2\x82\x1b[mx"), "\u{FFFD}x");
    }

    #[test]
    fn two_and_three_byte_sequences_match_lossy_without_c1() {
        let expect = |b: &[u8]| -> String {
            String::from_utf8_lossy(b)
                .chars()
                .filter(|c| !('\u{80}'..='\u{9f}').contains(c))
                .collect()
        };
        let bytes: Vec<u8> = (0x80..=0xFF).chain([b'a']).collect();
        for &x in &bytes {
            for &y in &bytes {
                assert_eq!(san(&[x, y]), expect(&[x, y]));
            }
        }
        let leads = [
            0xC2, 0xC3, 0xDF, 0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF4, 0xF5,
        ];
        let conts = [0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0];
        for &x in &leads {
            for &y in &conts {
                for &z in &conts {
                    for w in [0x80, b'a'] {
                        let input = [x, y, z, w];
                        assert_eq!(san(&input), expect(&input).replace('\x7f', ""));
                    }
                }
            }
        }
    }

    #[test]
    fn utf8_split_across_reads_is_kept_whole() {
        let text = "é€😀\u{85}x".as_bytes();
        for size in 1..=4 {
            let chunks: Vec<&[u8]> = text.chunks(size).collect();
            assert_eq!(run_chunks(Sanitizer::new(), &chunks), "é€😀x".as_bytes());
        }
        // Unfinished at the end of the stream: one replacement.
        assert_eq!(san(b"ab\xf0\x9f"), "ab\u{FFFD}");
    }

    #[test]
    fn unterminated_osc_holds_no_memory() {
        let mut s = Sanitizer::new();
        let mut out = Vec::new();
        s.feed(b"before\x1b]0;", &mut out);
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..128 {
            s.feed(&chunk, &mut out);
            assert!(out.is_empty());
            assert!(s.line.capacity() < 1024);
        }
        s.feed(b"\x07after\n", &mut out);
        assert_eq!(out, b"beforeafter\n");
        // Likewise for DCS and APC payloads.
        let mut s = Sanitizer::new();
        s.feed(b"\x1bP1$q", &mut out);
        for _ in 0..16 {
            s.feed(&chunk, &mut out);
        }
        s.feed(b"\x1b_", &mut out);
        for _ in 0..16 {
            s.feed(&chunk, &mut out);
        }
        assert!(s.line.capacity() < 1024);
    }

    #[test]
    fn long_line_streams_out_intact() {
        let expected = "abcdefghij€".repeat(80_000);
        let line = expected.as_bytes();
        let mut s = Sanitizer::new();
        let mut out = Vec::new();
        // Feed in uneven reads; the held part never passes the bound.
        for chunk in line.chunks(4093) {
            s.feed(chunk, &mut out);
            assert!(s.line.len() <= LINE_LIMIT);
        }
        assert!(out.len() > line.len() - LINE_LIMIT - 4);
        s.finish(&mut out);
        assert_eq!(String::from_utf8(out).unwrap(), expected);
        // In one read too.
        assert_eq!(san(line), expected);
    }

    #[test]
    fn long_line_cursor_moves_act_on_the_held_part() {
        // Writing the 9th byte overflows a limit of 8: the first 9 bytes are final.
        assert_eq!(san_limit(b"0123456789\rab\n", 8), b"012345678ab\n");
        assert_eq!(san_limit(b"0123456789\x1b[2K\n", 8), b"012345678\n");
        assert_eq!(san_limit(b"01234567\rab\n", 8), b"ab234567\n");
        // Overwriting with wider characters grows the bytes: the part before the cursor
        // streams, the rest stays held.
        assert_eq!(
            san_limit("abcdefgh\r€€€\rX\n".as_bytes(), 8),
            "€€Xdefgh\n".as_bytes()
        );
        for input in [
            &b"0123456789\rab\n"[..],
            "abcdefgh\r€€€\rX\n".as_bytes(),
            b"0123456789abcdefghij\x08\x08\x1b[1Kxy\nz",
        ] {
            assert_split_invariant(input, 8);
        }
    }

    #[test]
    fn every_split_gives_the_same_result() {
        let inputs: &[&[u8]] = &[
            b"\x1b[01;34mdir\x1b[0m\r\nnext\x1b]0;t\x07\r\n",
            b"\x1b]8;;http://x\x1b\\l\x1b]8;;\x1b\\ \x1bPq#0\x1b\\\x1b_G;A\x1b\\z",
            b"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xc2\x85\xff\xc2\x9b",
            b"\xe2\x82\x1b[mx\xf0\x9f\x98",
            b"abcdef\x08\x08\x1b[1Kxy\rq\x1b[K\n_\x08O",
            b"abc\x1b[3\n1;2;3Kd\x1b[\x18e\x1b(Bf\x1b\x1bg",
        ];
        for input in inputs {
            assert_split_invariant(input, LINE_LIMIT);
            assert_split_invariant(input, 5);
        }
    }

    /// The line model written the obvious way on top of `vte::Parser`, fed one byte at a
    /// time. Fed like that, vte reports a lone byte 0x80..=0x9F through `execute` and a
    /// complete C1 character through `print`, which tells them apart.
    struct Reference {
        cells: Vec<Option<char>>,
        cursor: usize,
        limit: usize,
        out: String,
    }

    impl Reference {
        fn run(input: &[u8], limit: usize) -> String {
            let mut r = Reference {
                cells: Vec::new(),
                cursor: 0,
                limit,
                out: String::new(),
            };
            let mut parser = vte::Parser::new();
            for &b in input {
                parser.advance(&mut r, &[b]);
            }
            r.store(false);
            r.out
        }

        fn put(&mut self, c: char) {
            if self.cursor == self.cells.len() {
                self.cells.push(Some(c));
            } else {
                self.cells[self.cursor] = Some(c);
            }
            self.cursor += 1;
            let held: usize = self.cells.iter().map(|c| c.map_or(1, char::len_utf8)).sum();
            if held > self.limit {
                let part: Vec<_> = self.cells.drain(..self.cursor).collect();
                self.out.extend(part.into_iter().map(|c| c.unwrap_or(' ')));
                self.cursor = 0;
            }
        }

        fn store(&mut self, newline: bool) {
            while self.cells.last() == Some(&None) {
                self.cells.pop();
            }
            self.out
                .extend(self.cells.drain(..).map(|c| c.unwrap_or(' ')));
            self.cursor = 0;
            if newline {
                self.out.push('\n');
            }
        }
    }

    impl vte::Perform for Reference {
        fn print(&mut self, c: char) {
            if !('\u{7f}'..='\u{9f}').contains(&c) {
                self.put(c);
            }
        }

        fn execute(&mut self, b: u8) {
            match b {
                b'\n' => self.store(true),
                b'\r' => self.cursor = 0,
                0x08 => self.cursor = self.cursor.saturating_sub(1),
                b'\t' => self.put('\t'),
                0x80..=0x9F => self.put('\u{FFFD}'),
                _ => {}
            }
        }

        fn csi_dispatch(&mut self, params: &vte::Params, inter: &[u8], ignore: bool, c: char) {
            if c != 'K' || ignore || !inter.is_empty() {
                return;
            }
            let len = self.cells.len();
            match params.iter().next().map_or(0, |p| p[0]) {
                0 => self.cells.truncate(self.cursor),
                1 => self.cells[..(self.cursor + 1).min(len)].fill(None),
                2 => self.cells.fill(None),
                _ => {}
            }
        }
    }

    const TOKENS: &[&[u8]] = &[
        b"a",
        b"b",
        b"Z",
        b" ",
        b"0",
        b"1",
        b"2",
        b";",
        b":",
        b"?",
        b"K",
        b"m",
        b"(",
        b"P",
        b"X",
        b"^",
        b"_",
        b"]",
        b"[",
        b"\\",
        b"\n",
        b"\r",
        b"\t",
        b"\x08",
        b"\x1b",
        b"\x1b",
        b"\x1b[",
        b"\x1b]",
        b"\x1b[1K",
        b"\x1b[2K",
        b"\x1b[K",
        b"\x1b[31m",
        b"\x07",
        b"\x18",
        b"\x1a",
        b"\x7f",
        b"\x00",
        b"\x0c",
        "é".as_bytes(),
        "€".as_bytes(),
        "😀".as_bytes(),
        "\u{85}".as_bytes(),
        "\u{9c}".as_bytes(),
        "Ŝ".as_bytes(),
        "✓".as_bytes(),
        b"\x9c",
        b"\x85",
        b"\xff",
        b"\xe2",
        b"\xe2\x82",
        b"\xf0\x9f",
        b"\xc0",
        b"\xed\xa0",
    ];

    const INTRODUCERS: &[&[u8]] = &[
        b"\x1b[", b"\x1b]", b"\x1bP", b"\x1bX", b"\x1b^", b"\x1b_", b"\x1b(", b"\x1b\\", b"\x1b",
    ];

    /// Inputs rich in sequence introducers, parameter, intermediate and final bytes,
    /// terminators, controls and (broken) UTF-8.
    fn token_input() -> impl Strategy<Value = Vec<u8>> {
        let token = prop_oneof![
            4 => prop::sample::select(TOKENS).prop_map(<[u8]>::to_vec),
            2 => prop::sample::select(INTRODUCERS).prop_map(<[u8]>::to_vec),
            2 => (0x20u8..=0x7E).prop_map(|b| vec![b]),
            1 => any::<u8>().prop_map(|b| vec![b]),
        ];
        prop::collection::vec(token, 0..64).prop_map(|t| t.concat())
    }

    fn chunked(input: &[u8], sizes: &[usize]) -> Vec<Vec<u8>> {
        let mut chunks = Vec::new();
        let mut rest = input;
        for &n in sizes.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (a, b) = rest.split_at(n.min(rest.len()));
            chunks.push(a.to_vec());
            rest = b;
        }
        chunks
    }

    proptest! {
        // Cheap and the strongest check of the state machine: more cases than the rest.
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn agrees_with_vte_reference(input in token_input(), limit in prop::sample::select(vec![6usize, 9, 64])) {
            // A final newline settles an unfinished character the same way in both.
            let mut input = input;
            input.push(b'\n');
            let ours = String::from_utf8(san_limit(&input, limit)).unwrap();
            prop_assert_eq!(ours, Reference::run(&input, limit));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn chunking_does_not_matter(input in token_input(), sizes in prop::collection::vec(1usize..12, 1..8), limit in prop::sample::select(vec![6usize, 64])) {
            let whole = san_limit(&input, limit);
            let chunks = chunked(&input, &sizes);
            let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
            prop_assert_eq!(run_chunks(Sanitizer::with_line_limit(limit), &refs), whole);
        }

        #[test]
        fn output_is_clean_utf8(input in prop::collection::vec(any::<u8>(), 0..256), tokens in token_input()) {
            for input in [input, tokens] {
                let out = san_limit(&input, 16);
                let text = String::from_utf8(out).expect("valid UTF-8");
                prop_assert!(text.chars().all(|c| c == '\n' || c == '\t'
                    || !(c.is_control())), "{:?}", text);
            }
        }
    }
}
