//! UTF-8 byte classes, and cutting stored text on character boundaries.

/// A UTF-8 continuation byte (`10xxxxxx`).
pub(crate) fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

/// For a UTF-8 lead byte: how many continuation bytes follow and the range allowed for the
/// first of them (the rest are `0x80..=0xBF`). These ranges exclude overlong forms,
/// surrogates and values past U+10FFFF, which makes the invalid subparts the same as
/// `String::from_utf8_lossy`'s.
pub(crate) fn utf8_lead(b: u8) -> Option<(usize, u8, u8)> {
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

/// How many bytes at the start of `buf` continue a character begun before it (at most 3).
pub fn leading_continuations(buf: &[u8]) -> usize {
    buf.iter()
        .take(3)
        .take_while(|&&b| is_continuation(b))
        .count()
}

/// Where a page starts and ends inside `buf` so that both ends sit on character
/// boundaries: skips continuation bytes at the start, and cuts at most `limit` bytes,
/// backing off to a boundary (but keeping one whole character if `limit` is smaller).
pub fn utf8_window(buf: &[u8], limit: usize) -> (usize, usize) {
    let skip = leading_continuations(buf);
    let body = &buf[skip..];
    if body.len() <= limit {
        return (skip, buf.len());
    }
    let mut end = limit;
    while end > 0 && is_continuation(body[end]) {
        end -= 1;
    }
    if end == 0 {
        end = 1;
        while end < body.len() && is_continuation(body[end]) {
            end += 1;
        }
    }
    (skip, skip + end)
}

/// At most `max` characters of `s`, with an ellipsis when cut (for echoing bad input).
pub fn truncate(s: &str, max: usize) -> String {
    let mut out: String = s.chars().take(max).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_windows_never_split_characters() {
        let s = "aé€𝄞b".as_bytes(); // 1 + 2 + 3 + 4 + 1 bytes
        assert_eq!(utf8_window(s, 100), (0, s.len()));
        assert_eq!(utf8_window(s, 1), (0, 1));
        assert_eq!(utf8_window(s, 2), (0, 1));
        assert_eq!(utf8_window(s, 3), (0, 3));
        assert_eq!(utf8_window(&s[1..], 1), (0, 2)); // one whole char beats an empty page
        assert_eq!(utf8_window(&s[2..], 4), (1, 4)); // starts mid-character: skip to the next
        for limit in 1..12 {
            for start in 0..s.len() {
                let (a, b) = utf8_window(&s[start..], limit);
                assert!(std::str::from_utf8(&s[start + a..start + b]).is_ok());
            }
        }
    }
}
