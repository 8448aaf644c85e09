//! The output pipeline: sanitize, then redact, before a byte is stored.

use crate::redact::Redactor;
use crate::sanitize::Sanitizer;

/// Sanitizer followed by redactor, streaming.
pub struct Pipeline {
    sanitizer: Sanitizer,
    redactor: Redactor,
    mid: Vec<u8>,
}

impl Pipeline {
    /// A pipeline that masks these secret values.
    pub fn new(secrets: &[&[u8]]) -> Self {
        Pipeline {
            sanitizer: Sanitizer::new(),
            redactor: Redactor::new(secrets),
            mid: Vec::new(),
        }
    }

    /// Processes one read's worth of raw output, appending storable bytes to `out`.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        self.mid.clear();
        self.sanitizer.feed(input, &mut self.mid);
        self.redactor.feed(&self.mid, out);
    }

    /// Ends the stream, appending everything still held.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        self.mid.clear();
        self.sanitizer.finish(&mut self.mid);
        self.redactor.feed(&self.mid, out);
        self.redactor.finish(out);
    }
}
