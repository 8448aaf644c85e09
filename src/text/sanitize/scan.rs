//! The fast paths of the ground state: runs of plain text found with a block scan, and
//! inert CSI sequences (SGR colours) skipped in one step; and, for a line that is only
//! appended to, [`copy_ground`], which copies text straight to the output and drops colours
//! and other sequences without effect there, a 64-byte window at a time.

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

/// Index of the first byte of `block` for which `keep` is false (16 if none). Written as a
/// mask of whole bytes read as one number, which compiles to a vector compare and a bit
/// scan without a branch per byte.
#[inline(always)]
fn first_not(block: &[u8; 16], keep: impl Fn(u8) -> bool) -> usize {
    stop_bytes(block, keep).trailing_zeros() as usize / 8
}

/// One byte `0xFF` for each byte of `block` for which `keep` is false, zero for the rest.
#[inline(always)]
fn stop_bytes(block: &[u8; 16], keep: impl Fn(u8) -> bool) -> u128 {
    let mut stop = [0u8; 16];
    for (s, &c) in stop.iter_mut().zip(block) {
        *s = if keep(c) { 0 } else { 0xFF };
    }
    u128::from_le_bytes(stop)
}

/// A CSI parameter byte (digits, `:`, `;` and the private markers `<=>?`).
#[inline(always)]
fn is_param(c: u8) -> bool {
    c & 0xF0 == 0x30
}

/// Copies the ground-state text of `input[i..]` to `out` for a line whose cursor is at its
/// end, nothing of it held in the line (it is at the end of `out`), and returns the index of
/// the first byte that needs the state machine (or `input.len()`). What it takes has the
/// same effect there as stepping through it: plain text is appended, `\r\n` ends the line
/// like `\n`, CSI sequences that do nothing at the end of a line (colours and `CSI K`) and
/// controls without effect vanish.
///
/// Colour output alternates ~15 bytes of text with a short sequence, so each piece is
/// handled in a few fixed steps: text is copied in fixed-size pieces, past its end if need
/// be, and `out` is cut back to where it ends (no call into memcpy for a short run). Most
/// of it goes through [`copy_windows`]; this loop takes what a window cannot (the last
/// bytes of a read, sequences cut by a window, UTF-8) one piece at a time.
pub(super) fn copy_ground(input: &[u8], mut i: usize, out: &mut Vec<u8>) -> usize {
    // Slack for the copies past a run's end: no reallocation in the loop.
    out.reserve(input.len() - i + WINDOW + AHEAD);
    loop {
        i = copy_windows(input, i, out);
        while let Some(block) = input.get(i..i + 16) {
            let block: &[u8; 16] = block.try_into().unwrap();
            out.extend_from_slice(block);
            let stop = stop_bytes(block, is_plain_ascii);
            // A branch, not `i += k`: the next block's load must not wait for this one's
            // scan.
            if stop == 0 {
                i += 16;
                continue;
            }
            let k = stop.trailing_zeros() as usize / 8;
            i += k;
            out.truncate(out.len() - (16 - k));
            break;
        }
        if input.len() - i < 16 {
            let tail = &input[i..];
            let k = tail
                .iter()
                .position(|&c| !is_plain_ascii(c))
                .unwrap_or(tail.len());
            out.extend_from_slice(&tail[..k]);
            i += k;
            if i == input.len() {
                return i;
            }
        }
        let c = input[i];
        match c {
            0x1B => match csi_at_end_len(&input[i..]) {
                Some(len) => i += len,
                None => return i,
            },
            b'\r' if input.get(i + 1) == Some(&b'\n') => {
                out.push(b'\n');
                i += 2;
            }
            // Backspace and `\r` move the cursor; the other C0 controls and DEL do nothing
            // in the ground state.
            0x08 | b'\r' => return i,
            0x00..=0x1F | 0x7F => i += 1,
            _ => {
                let run = plain_len(&input[i..]);
                if run == 0 {
                    return i;
                }
                out.extend_from_slice(&input[i..i + run]);
                i += run;
            }
        }
    }
}

/// Bytes looked at as one window by [`copy_windows`].
const WINDOW: usize = 64;
/// Bytes it may read (and copy) past a window.
const AHEAD: usize = 32;

/// The core of [`copy_ground`]: for each window of 64 bytes, one bit mask of the bytes that
/// end a run of text and one of CSI parameter bytes; then each piece of text and each CSI
/// sequence inside the window is found with a bit scan. Unlike a byte-by-byte search, this
/// keeps the chain from one sequence's start to the next down to a few register operations
/// (loads and compares only decide branches, which are predicted). Returns at anything
/// else (including a sequence the window cuts), leaving it to the caller.
fn copy_windows(input: &[u8], mut i: usize, out: &mut Vec<u8>) -> usize {
    // After a window of plain text the next is likely plain too: test that first, which is
    // cheaper than the masks (and a waste on colour text).
    let mut plain = false;
    while let Some(ahead) = input.get(i..i + WINDOW + AHEAD) {
        let ahead: &[u8; WINDOW + AHEAD] = ahead.try_into().unwrap();
        let w: &[u8; WINDOW] = ahead[..WINDOW].try_into().unwrap();
        if plain && w.iter().fold(true, |ok, &c| ok & is_plain_ascii(c)) {
            out.extend_from_slice(w);
            i += WINDOW;
            continue;
        }
        let stops = mask(w, |c| !is_plain_ascii(c));
        plain = stops == 0;
        if plain {
            out.extend_from_slice(w);
            i += WINDOW;
            continue;
        }
        let params = mask(w, is_param);
        // The window goes out whole, its first piece of text already in place; each later
        // piece is moved down over what was removed, in fixed-size copies that may run
        // past its end (the next piece overwrites that). `out` is cut back at the end.
        let base = out.len();
        out.extend_from_slice(ahead);
        let dst: &mut [u8; WINDOW + AHEAD] = (&mut out[base..]).try_into().unwrap();
        // `j`: the start of the text not yet taken, `o`: where it goes in `dst`.
        let (mut j, mut o) = (0, 0);
        // The stops not yet dealt with. Only the first byte of a sequence or `\r\n` is a
        // stop, so each takes one off the bottom: finding the next one does not wait for
        // where this one ends.
        let mut rest = stops;
        // Ends with how far the window was taken, and whether what follows is left to the
        // caller; a sequence or `\r\n` that the window cuts starts the next window.
        let (taken, done) = loop {
            let k = rest.trailing_zeros() as usize;
            // Copying a piece that is already in place does no harm.
            dst[o..o + 32].copy_from_slice(&ahead[j..j + 32]);
            if k - j > 32 {
                // It started in the first half.
                dst[o + 32..o + 64].copy_from_slice(&ahead[j + 32..j + 64]);
            }
            o += k - j;
            if k == WINDOW {
                break (k, false);
            }
            if w[k] == 0x1B {
                if k + 2 >= WINDOW {
                    break (k, false);
                }
                if w[k + 1] != b'[' {
                    break (k, true);
                }
                let fin = (!params & (u64::MAX << (k + 2))).trailing_zeros() as usize;
                if fin == WINDOW {
                    break (k, false);
                }
                if !csi_does_nothing_at_end(w[fin], &w[k + 2..fin]) {
                    break (k, true);
                }
                j = fin + 1;
            } else if w[k] == b'\r' {
                if k + 1 == WINDOW {
                    break (k, false);
                }
                if w[k + 1] != b'\n' {
                    break (k, true);
                }
                dst[o] = b'\n';
                o += 1;
                j = k + 2;
            } else {
                break (k, true);
            }
            rest &= rest - 1;
        };
        out.truncate(base + o);
        i += taken;
        // Nothing taken: a sequence longer than the window.
        if done || taken == 0 {
            return i;
        }
    }
    i
}

/// A mask of the bytes of `w` for which `f` holds, bit `n` for byte `n`. Per eight bytes,
/// the byte flags are made in vector registers; a multiply gathers one bit of each.
#[inline(always)]
fn mask(w: &[u8; WINDOW], f: impl Fn(u8) -> bool) -> u64 {
    let mut flags = [0u8; WINDOW];
    for (flag, &c) in flags.iter_mut().zip(w) {
        *flag = if f(c) { 0xFF } else { 0 };
    }
    let mut m = 0;
    for (n, eight) in flags.chunks_exact(8).enumerate() {
        // Bit `n` of byte `n`, then all eight summed into the top byte (no carries).
        let x = u64::from_le_bytes(eight.try_into().unwrap()) & 0x8040_2010_0804_0201;
        m |= (x.wrapping_mul(0x0101_0101_0101_0101) >> 56) << (8 * n);
    }
    m
}

/// Whether a CSI sequence with these parameter bytes and final byte `fin` has no effect
/// with the cursor at the end of the line: any final but the moves, and `K` without
/// parameters or with `0` (nothing to the right to erase).
#[inline(always)]
fn csi_does_nothing_at_end(fin: u8, params: &[u8]) -> bool {
    match fin {
        b'K' => params.is_empty() || params == b"0",
        b'G' | b'`' | b'C' | b'D' => false,
        _ => (0x40..=0x7E).contains(&fin),
    }
}

/// If `b` starts with a complete CSI sequence that has no effect with the cursor at the end
/// of the line, its length: an inert one (see [`inert_csi_len`]), or `CSI K` / `CSI 0 K`,
/// which erase nothing there.
#[inline]
fn csi_at_end_len(b: &[u8]) -> Option<usize> {
    if b.get(1) != Some(&b'[') {
        return None;
    }
    let Some(block) = b.get(2..18) else {
        return inert_csi_len(b).or_else(|| erase_nothing_len(b));
    };
    let params = first_not(block.try_into().unwrap(), is_param);
    if params == 16 {
        // Longer than any colour: not worth a fast path.
        return None;
    }
    let fin = block[params];
    let inert = match fin {
        b'K' => params == 0 || (params == 1 && block[0] == b'0'),
        b'G' | b'`' | b'C' | b'D' => false,
        _ => (0x40..=0x7E).contains(&fin),
    };
    inert.then_some(params + 3)
}

/// `CSI K` or `CSI 0 K` at the start of `b`: its length.
fn erase_nothing_len(b: &[u8]) -> Option<usize> {
    if b.starts_with(b"\x1b[K") {
        Some(3)
    } else if b.starts_with(b"\x1b[0K") {
        Some(4)
    } else {
        None
    }
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
