//! Terminal-output sanitizer: strips escape sequences and controls and applies the line
//! model of the contract (cursor, `\r`, backspace, erase-in-line, horizontal cursor
//! moves). Pure; no I/O.
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
//! the whole line, without moving the cursor. The horizontal moves place the cursor without
//! writing: `CSI n G` and `CSI n` + backquote to column `n` (counted from 1), `CSI n C` `n`
//! columns right, `CSI n D` `n` columns left (not past 0); a missing or 0 `n` is 1, and only
//! the first parameter counts (a private marker or an intermediate makes it another
//! sequence). A move past the end of the line leaves blank cells. `\n` stores the line.
//! Every other control and sequence is dropped without effect (no vertical movement, no tab
//! stops).
//!
//! Erased cells are blank: blank cells followed by text in the same line are stored as
//! spaces (that is what a terminal shows), blank cells at the end of a line are not stored.
//! A move right never makes the held part longer than [`LINE_LIMIT`] bytes: a larger `n`
//! (up to 65535, where parameters saturate) stops there, so it allocates nothing more.
//!
//! A line is held until it ends, up to [`LINE_LIMIT`] bytes. When writing a character makes
//! the held part longer than that, the part before the cursor is streamed out and only the
//! rest stays held; later cursor movement and erasing act on the held part alone (so
//! columns, for `\r` and `CSI n G` alike, count from the start of the held part). Nothing is
//! ever inserted: no marker, no line break. The streaming points depend only on the bytes,
//! never on how they were split into reads.
//!
//! At the end of the stream the held line is stored as it is, without a newline; an
//! unfinished escape sequence is dropped and an unfinished UTF-8 character becomes U+FFFD.
//!
//! # Speed
//!
//! In the ground state, runs of printable ASCII, `\t`, `\n` and well-formed non-C1 UTF-8 are
//! found with a block scan and copied wholesale. Plain `CSI` sequences other than `K` and
//! the moves (SGR colours) are skipped in one step; everything else goes through the
//! byte-wise state machine.
//!
//! While the cursor is at the end of a line without blanks (the common case), the held line
//! is lent to the output: its bytes move to the end of `out`, text is copied straight after
//! them, and when something needs the line model again (or the read ends) what is still the
//! held line (after the last `\n`, within [`LINE_LIMIT`]) is taken back. On that path SGR
//! colours, `CSI K` / `CSI 0 K` (nothing to erase there), `\r\n` (the same as `\n`) and
//! controls without effect are dropped without the state machine, found 64 bytes at a time
//! with bit masks (see `scan.rs`). Lending copies the held line, so a read lends at most as
//! many held bytes as it has; the rest of such a read takes the path above.
//!
//! # Layout
//!
//! `parser.rs` holds the VT500 state machine, `line.rs` the line model it drives, `scan.rs`
//! the ground-state fast paths; this file feeds each byte to whichever applies. The tests
//! (`tests.rs`) check the whole against `vte`.

mod line;
mod parser;
mod scan;
#[cfg(test)]
mod tests;

use line::Line;
use parser::Parser;

/// The most bytes of one line held before its finished part is streamed out.
pub const LINE_LIMIT: usize = 64 * 1024;

/// A streaming sanitizer; parser state carries across `feed` calls.
pub struct Sanitizer {
    parser: Parser,
    /// The held part of the current line.
    line: Line,
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
            parser: Parser::new(),
            line: Line::new(limit),
        }
    }

    /// Sanitizes `input`, appending every finished line (and any part of an over-long
    /// line that can no longer change) to `out`.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        // Lending the held line to `out` and taking it back copies it twice: at most as
        // many bytes as this read has in all, so that tiny reads of a long line stay cheap.
        let mut budget = input.len();
        let mut i = 0;
        while i < input.len() {
            if self.parser.at_rest() && self.line.appending() && self.line.len() <= budget {
                budget -= self.line.len();
                let start = self.line.lend(out);
                i = scan::copy_ground(input, i, out);
                self.line.take_back(out, start);
                if i == input.len() {
                    break;
                }
            } else if self.parser.at_rest() {
                let run = scan::plain_len(&input[i..]);
                if run > 0 {
                    self.line.put_run(&input[i..i + run], out);
                    i += run;
                    if i == input.len() {
                        break;
                    }
                }
                if input[i] == 0x1B
                    && let Some(len) = scan::inert_csi_len(&input[i..])
                {
                    i += len;
                    continue;
                }
            } else if let Some(skip) = self.parser.string_skip(&input[i..]) {
                // Payload bytes of a string sequence have no effect: skip to the next byte
                // that can end it.
                i += skip;
                if i == input.len() {
                    break;
                }
            }
            self.parser.step(input[i], &mut self.line, out);
            i += 1;
        }
    }

    /// Like [`feed`](Self::feed), but every byte through the state machine alone: what the
    /// fast paths must agree with.
    #[cfg(test)]
    fn feed_bytewise(&mut self, input: &[u8], out: &mut Vec<u8>) {
        for &b in input {
            self.parser.step(b, &mut self.line, out);
        }
    }

    /// The line being written, as it would be stored if it ended now (the held part of
    /// an over-long line).
    pub fn pending(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.line.shown(&mut out);
        out
    }

    /// Ends the stream: appends the held last line (without adding a newline).
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        self.parser.finish(&mut self.line, out);
        self.line.finish(out);
    }
}
