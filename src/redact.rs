//! Streaming secret redaction over sanitized text. Pure; no I/O.
//! (Skeleton: the implementation lands with the output pipeline.)

/// Replaces every occurrence of any secret value (and its encoded forms) with `[redacted]`.
pub struct Redactor {}

impl Redactor {
    /// A redactor for these secret values.
    pub fn new(_secrets: &[&[u8]]) -> Self {
        Redactor {}
    }

    /// Redacts `input`, appending to `out` what can no longer be part of a secret.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(input);
    }

    /// Ends the stream: appends whatever was held back.
    pub fn finish(&mut self, _out: &mut Vec<u8>) {}

    /// Redacts a whole string at once (commands, error messages, log lines).
    pub fn redact_str(&self, s: &str) -> String {
        s.to_string()
    }
}
