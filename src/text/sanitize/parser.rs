//! The VT500 parser: `vte`'s state machine (0.15), without payload buffers. It decides what
//! each byte does; the [`Line`] carries it out.

use super::line::Line;
use crate::text::utf8::utf8_lead;

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

/// Parser state; it carries across reads.
pub(super) struct Parser {
    state: State,
    /// The CSI being parsed can still be a plain erase-in-line or cursor move (no
    /// intermediates or private markers, no parameter overflow).
    csi_plain: bool,
    /// Parameters and subparameters completed so far in the current CSI.
    csi_params: u8,
    /// The parameter being accumulated.
    csi_param: u16,
    /// The first completed parameter: the only one erase-in-line and the moves read.
    csi_first: u16,
    /// Bytes of an unfinished UTF-8 character (ground state only).
    utf8: [u8; 4],
    utf8_len: u8,
}

impl Parser {
    /// The ground state, no character begun.
    pub(super) fn new() -> Self {
        Parser {
            state: State::Ground,
            csi_plain: true,
            csi_params: 0,
            csi_param: 0,
            csi_first: 0,
            utf8: [0; 4],
            utf8_len: 0,
        }
    }

    /// In the ground state between characters: where plain runs and inert CSI sequences
    /// can be taken whole.
    pub(super) fn at_rest(&self) -> bool {
        self.state == State::Ground && self.utf8_len == 0
    }

    /// Ends the stream: an unfinished character becomes U+FFFD. (An unfinished sequence
    /// just ends.)
    pub(super) fn finish(&mut self, line: &mut Line, out: &mut Vec<u8>) {
        if self.utf8_len > 0 {
            line.put_char("\u{FFFD}".as_bytes(), out);
        }
        *self = Parser::new();
    }

    /// For string states, how many leading bytes cannot change the state.
    pub(super) fn string_skip(&self, bytes: &[u8]) -> Option<usize> {
        let ends: fn(u8) -> bool = match self.state {
            State::OscString => |b| matches!(b, 0x07 | 0x18 | 0x1A | 0x1B),
            State::DcsPassthrough => |b| matches!(b, 0x18 | 0x1A | 0x1B | 0x9C),
            State::SosPmApcString | State::DcsIgnore => |b| matches!(b, 0x18 | 0x1A | 0x1B),
            _ => return None,
        };
        Some(bytes.iter().position(|&b| ends(b)).unwrap_or(bytes.len()))
    }

    /// One byte through the state machine (mirrors `vte::Parser`'s transitions).
    pub(super) fn step(&mut self, b: u8, line: &mut Line, out: &mut Vec<u8>) {
        match self.state {
            State::Ground => self.ground_byte(b, line, out),
            State::Escape => match b {
                0x00..=0x17 | 0x19 | 0x1C..=0x1F => execute(b, line, out),
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
                0x00..=0x17 | 0x19 | 0x1C..=0x1F => execute(b, line, out),
                0x20..=0x2F | 0x7F => {}
                0x30..=0x7E => self.state = State::Ground,
                _ => self.anywhere(b),
            },
            State::CsiEntry => match b {
                0x00..=0x17 | 0x19 | 0x1C..=0x1F => execute(b, line, out),
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
                0x40..=0x7E => self.csi_dispatch(b, line),
                _ => self.anywhere(b),
            },
            State::CsiParam => match b {
                0x00..=0x17 | 0x19 | 0x1C..=0x1F => execute(b, line, out),
                0x20..=0x2F => {
                    self.csi_plain = false;
                    self.state = State::CsiIntermediate;
                }
                0x30..=0x39 => self.csi_digit(b),
                b':' | b';' => self.csi_separator(),
                0x3C..=0x3F => self.state = State::CsiIgnore,
                0x40..=0x7E => self.csi_dispatch(b, line),
                0x7F => {}
                _ => self.anywhere(b),
            },
            State::CsiIntermediate => match b {
                0x00..=0x17 | 0x19 | 0x1C..=0x1F => execute(b, line, out),
                0x20..=0x2F => {}
                0x30..=0x3F => self.state = State::CsiIgnore,
                0x40..=0x7E => self.csi_dispatch(b, line),
                _ => self.anywhere(b),
            },
            State::CsiIgnore => match b {
                0x00..=0x17 | 0x19 | 0x1C..=0x1F => execute(b, line, out),
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

    fn csi_dispatch(&mut self, b: u8, line: &mut Line) {
        self.state = State::Ground;
        if !matches!(b, b'K' | b'G' | b'`' | b'C' | b'D') {
            return;
        }
        if self.csi_params == MAX_PARAMS {
            self.csi_plain = false;
        } else {
            self.csi_push();
        }
        if !self.csi_plain {
            return;
        }
        // A missing or 0 count is 1 for the moves.
        let n = usize::from(self.csi_first.max(1));
        match (b, self.csi_first) {
            (b'K', 0) => line.erase_right(),
            (b'K', 1) => line.erase_left(),
            (b'K', 2) => line.erase_all(),
            (b'G' | b'`', _) => line.move_to(n - 1),
            (b'C', _) => line.move_right(n),
            (b'D', _) => line.move_left(n),
            _ => {}
        }
    }

    fn ground_byte(&mut self, b: u8, line: &mut Line, out: &mut Vec<u8>) {
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
                        line.put_char(&ch[..=need], out);
                    }
                }
                return;
            }
            // A maximal invalid subpart: one replacement, then look at `b` afresh.
            self.utf8_len = 0;
            line.put_char("\u{FFFD}".as_bytes(), out);
        }
        match b {
            0x20..=0x7E => line.put_char(&[b], out),
            0x1B => self.state = State::Escape,
            0x00..=0x1F => execute(b, line, out),
            0x7F => {}
            _ => {
                if utf8_lead(b).is_some() {
                    self.utf8[0] = b;
                    self.utf8_len = 1;
                } else {
                    line.put_char("\u{FFFD}".as_bytes(), out);
                }
            }
        }
    }
}

/// A control character that takes effect (in ground and in CSI / ESC sequences).
fn execute(b: u8, line: &mut Line, out: &mut Vec<u8>) {
    match b {
        b'\n' => line.store_line(out),
        b'\r' => line.carriage_return(),
        0x08 => line.backspace(),
        b'\t' => line.put_char(b"\t", out),
        _ => {}
    }
}
