//! Cutting stored text on character boundaries.

/// How many bytes at the start of `buf` continue a character begun before it (at most 3).
pub fn leading_continuations(buf: &[u8]) -> usize {
    buf.iter()
        .take(3)
        .take_while(|&&b| b & 0xC0 == 0x80)
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
    while end > 0 && body[end] & 0xC0 == 0x80 {
        end -= 1;
    }
    if end == 0 {
        end = 1;
        while end < body.len() && body[end] & 0xC0 == 0x80 {
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
