//! Pure text processing: the output pipeline (sanitize, then redact) and time formats.

pub mod pipeline;
pub mod redact;
pub mod sanitize;
pub mod timefmt;
pub mod utf8;
pub mod wire;
