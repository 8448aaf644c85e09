//! Terminal-output sanitizer: strips escape sequences and controls and applies the line
//! model of the contract (cursor, `\r`, backspace, erase-in-line). Pure; no I/O.
//! (Skeleton: the streaming implementation lands with the output pipeline.)

/// A streaming sanitizer; parser state carries across `feed` calls.
#[derive(Default)]
pub struct Sanitizer {}

impl Sanitizer {
    /// A sanitizer in the ground state with an empty line.
    pub fn new() -> Self {
        Sanitizer {}
    }

    /// Sanitizes `input`, appending every finished line (and any part of an over-long
    /// line that can no longer change) to `out`.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(input);
    }

    /// Ends the stream: appends the held last line (without adding a newline).
    pub fn finish(&mut self, _out: &mut Vec<u8>) {}
}
