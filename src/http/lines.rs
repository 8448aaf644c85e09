//! The line grammar request and response heads share: where a head ends, how it splits
//! into lines, and what one header line holds.

/// The index just past the blank line ending a head, searching from `from`.
pub(super) fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(p) = memchr::memchr(b'\n', &buf[i..]) {
        let nl = i + p;
        let rest = &buf[nl + 1..];
        if rest.first() == Some(&b'\n') {
            return Some(nl + 2);
        }
        if rest.starts_with(b"\r\n") {
            return Some(nl + 3);
        }
        i = nl + 1;
    }
    None
}

/// The lines of a head, each ended by LF or CRLF, without their ends.
pub(super) fn head_lines(raw: &[u8]) -> impl Iterator<Item = &[u8]> {
    raw.split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
}

/// What makes a header line unreadable; each side words it for its own message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LineFault {
    /// It starts with whitespace (obsolete line folding).
    Folded,
    /// It has no `:`.
    NoColon,
    /// Its name is empty or holds a byte `name_ok` refuses.
    BadName,
    /// Its value holds NUL or CR.
    Control,
}

/// Splits one non-empty header line into its name and its value (trimmed of spaces and
/// tabs), judging each byte of the name with `name_ok`.
pub(super) fn header_line(
    l: &[u8],
    name_ok: impl Fn(u8) -> bool,
) -> Result<(String, String), LineFault> {
    if l[0] == b' ' || l[0] == b'\t' {
        return Err(LineFault::Folded);
    }
    let colon = memchr::memchr(b':', l).ok_or(LineFault::NoColon)?;
    let name = &l[..colon];
    if name.is_empty() || !name.iter().copied().all(name_ok) {
        return Err(LineFault::BadName);
    }
    let value = String::from_utf8_lossy(&l[colon + 1..])
        .trim_matches([' ', '\t'])
        .to_string();
    // A line never holds LF (heads are split at it); NUL and CR are what remain to refuse.
    if value.bytes().any(|b| b == 0 || b == b'\r') {
        return Err(LineFault::Control);
    }
    Ok((String::from_utf8_lossy(name).into_owned(), value))
}
