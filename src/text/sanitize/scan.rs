//! The fast paths of the ground state: runs of plain text found with a block scan, and
//! inert CSI sequences (SGR colours) skipped in one step.

use crate::text::utf8::{is_continuation, utf8_lead};

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
pub(super) fn plain_len(b: &[u8]) -> usize {
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

/// If `b` starts with a complete CSI sequence that has no effect here (anything but `K`
/// and the horizontal moves `G`, backquote, `C`, `D`, made only of parameter bytes), its
/// length. SGR colours are the common case.
pub(super) fn inert_csi_len(b: &[u8]) -> Option<usize> {
    if b.get(1) != Some(&b'[') {
        return None;
    }
    let params = b[2..].iter().position(|c| !(0x30..=0x3F).contains(c))?;
    let fin = b[2 + params];
    ((0x40..=0x7E).contains(&fin) && !matches!(fin, b'K' | b'G' | b'`' | b'C' | b'D'))
        .then_some(params + 3)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
