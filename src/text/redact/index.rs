//! The sampled 4-gram index over the patterns of at least [`SAMPLED_MIN_LEN`] bytes (see
//! the module doc).

use super::spell::{Class, Pattern, WRAP_PIECE, Walk, spelled_at};
use std::collections::HashMap;

/// Gram length of the index.
const Q: usize = 4;

/// Patterns whose occurrences take at least this many bytes go in the sampled index (probed
/// every 5 bytes or sparser); shorter ones would make it probe every byte.
pub(super) const SAMPLED_MIN_LEN: usize = 8;

/// Where an indexed gram can stand in an occurrence: it begins at byte `offset` of
/// spelling `spelling` of unit `unit` of pattern `pattern`, whose bytes are `text` in
/// [`GramIndex::texts`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    gram: u32,
    offset: u16,
    text: u32,
    pattern: u32,
    unit: u32,
    spelling: u16,
}

/// The entries that share a gram, an offset and a spelling's text: one comparison with the
/// text checks them all. A gram inside an escape (`\u00` of `\u00e4`) is shared by every
/// pattern with such a character.
struct Group {
    gram: u32,
    offset: u16,
    text: u32,
    /// Its entries are `anchors[first..]`, up to the next group's `first`.
    first: u32,
    /// The text's first 8 bytes as a word, `bits` the bits that must be as in it (hex
    /// digits have both cases): one load and one comparison tell most texts apart.
    head: u64,
    bits: u64,
}

pub(super) struct GramIndex {
    patterns: Vec<Pattern>,
    /// Distance between probed text positions.
    stride: usize,
    /// How far past its start an occurrence may be first seen: the last probe for
    /// occurrences that start before `limit` is at `limit - 1 + reach`.
    reach: usize,
    /// A blocked Bloom filter of the indexed grams: each gram sets two bits of one word
    /// (see [`slot`]).
    filter: Vec<u64>,
    /// `filter.len() - 1` (the length is a power of two).
    word_mask: usize,
    /// The groups whose gram falls in word `w` of `filter` are
    /// `groups[starts[w]..starts[w + 1]]` (and one more group ends the last).
    starts: Vec<u32>,
    groups: Vec<Group>,
    /// `(pattern, unit, spelling)` of each entry, by group.
    anchors: Vec<(u32, u32, u16)>,
    /// The distinct spellings.
    texts: Vec<Vec<Class>>,
}

impl GramIndex {
    pub(super) fn new(patterns: Vec<Pattern>) -> Self {
        let wraps = patterns.iter().any(|p| p.wraps);
        let shortest = patterns.iter().map(Pattern::min_len).min().unwrap_or(Q);
        let mut stride = shortest + 1 - Q;
        if wraps {
            // A probe must fall on a whole gram inside every line of `WRAP_PIECE` bytes.
            stride = stride.min(WRAP_PIECE + 1 - Q);
        }
        let reach = patterns
            .iter()
            .filter(|p| p.wraps)
            .map(|p| p.max_len - Q)
            .fold(stride - 1, usize::max);
        let mut entries = Vec::new();
        let mut texts = Vec::new();
        let mut text_ids = HashMap::new();
        for (pi, p) in patterns.iter().enumerate() {
            index_pattern(p, stride, &mut |gram, unit, spelling, offset| {
                let sp = p.spelling(unit, spelling);
                let text = *text_ids.entry(sp).or_insert_with(|| {
                    texts.push(sp.to_vec());
                    texts.len() as u32 - 1
                });
                entries.push(Entry {
                    gram,
                    offset: offset as u16,
                    text,
                    pattern: pi as u32,
                    unit: unit as u32,
                    spelling: spelling as u16,
                });
            });
        }
        // 128 bits per gram, so about 1 bit in 64 is set: a random probe passes the first
        // test 1 time in 64 and both about 1 in 4000. 2^16 words (512 KiB) at most.
        let words = (entries.len() * 2)
            .next_power_of_two()
            .clamp(1 << 6, 1 << 16);
        let word_mask = words - 1;
        entries.sort_unstable_by_key(|e| (slot(e.gram, word_mask).0, *e));
        entries.dedup();
        let mut filter = vec![0u64; words];
        let mut starts = vec![0u32; words + 1];
        let mut groups: Vec<Group> = Vec::new();
        let mut anchors = Vec::with_capacity(entries.len());
        for e in &entries {
            let (w, a, b) = slot(e.gram, word_mask);
            filter[w] |= 1 << a | 1 << b;
            let same = groups
                .last()
                .is_some_and(|g| (g.gram, g.offset, g.text) == (e.gram, e.offset, e.text));
            if !same {
                let (head, bits) = head_of(&texts[e.text as usize]);
                groups.push(Group {
                    gram: e.gram,
                    offset: e.offset,
                    text: e.text,
                    first: anchors.len() as u32,
                    head,
                    bits,
                });
                starts[w + 1] += 1;
            }
            anchors.push((e.pattern, e.unit, e.spelling));
        }
        for w in 0..words {
            starts[w + 1] += starts[w];
        }
        groups.push(Group {
            gram: 0,
            offset: 0,
            text: 0,
            first: anchors.len() as u32,
            head: 0,
            bits: 0,
        });
        GramIndex {
            patterns,
            stride,
            reach,
            filter,
            word_mask,
            starts,
            groups,
            anchors,
            texts,
        }
    }

    /// Pushes the span of every occurrence that starts before `limit`.
    pub(super) fn find(
        &self,
        hay: &[u8],
        limit: usize,
        walk: &mut Walk,
        found: &mut Vec<(usize, usize)>,
    ) {
        if hay.len() < Q || limit == 0 {
            return;
        }
        let last = (hay.len() - Q).min(limit - 1 + self.reach);
        // Sliced to `word_mask + 1` words, so the compiler sees `filter[w]` needs no check.
        let filter = &self.filter[..=self.word_mask];
        let mut j = 0;
        while j <= last {
            let gram = gram_at(hay, j);
            let (w, a, b) = slot(gram, self.word_mask);
            let word = filter[w];
            // Two branches: the second is reached only on the rare probes that pass the
            // first, so most probes cost a single well-predicted one.
            if word & 1 << a != 0 && word & 1 << b != 0 {
                self.verify(hay, (j, gram, w), limit, walk, found);
            }
            j += self.stride;
        }
    }

    /// Checks the groups of filter word `w` whose gram is the one at `j`.
    #[cold]
    fn verify(
        &self,
        hay: &[u8],
        (j, gram, w): (usize, u32, usize),
        limit: usize,
        walk: &mut Walk,
        found: &mut Vec<(usize, usize)>,
    ) {
        let (first, end) = (self.starts[w] as usize, self.starts[w + 1] as usize);
        for (g, next) in self.groups[first..end]
            .iter()
            .zip(&self.groups[first + 1..])
        {
            if g.gram != gram {
                continue;
            }
            let Some(at) = j.checked_sub(usize::from(g.offset)) else {
                continue;
            };
            let head = hay
                .get(at..at + 8)
                .map(|w| u64::from_le_bytes(w.try_into().unwrap()));
            if head.is_some_and(|h| h & g.bits != g.head) {
                continue;
            }
            if !spelled_at(hay, at, &self.texts[g.text as usize]) {
                continue;
            }
            for &(p, u, v) in &self.anchors[g.first as usize..next.first as usize] {
                let anchor = (u as usize, usize::from(v), at);
                self.patterns[p as usize].find_through(hay, anchor, limit, walk, found);
            }
        }
    }
}

/// Calls `add(gram, unit, spelling, offset)` for every gram an occurrence of `p` can show
/// at a probe: with probes `stride` bytes apart, one falls within the first `stride` bytes
/// of every occurrence, so for a pattern that is not wrapped the grams that begin there are
/// enough. A wrapped one may be broken anywhere: a probe is sure to fall only inside its
/// longest line, so every gram of it is indexed.
fn index_pattern(p: &Pattern, stride: usize, add: &mut impl FnMut(u32, usize, usize, usize)) {
    for u in 0..p.len() {
        let earliest = p.earliest(u);
        if !p.wraps && earliest >= stride {
            break;
        }
        for (v, sp) in p.spellings(u).enumerate() {
            for k in 0..sp.len() {
                if !p.wraps && earliest + k >= stride {
                    break;
                }
                let mut row = [[0; 2]; Q];
                let n = (sp.len() - k).min(Q);
                row[..n].copy_from_slice(&sp[k..k + n]);
                continue_row(p, u + 1, &mut row, n, &mut |gram| add(gram, u, v, k));
            }
        }
    }
}

/// Fills `row[n..]` with every way units `w..` can continue it, and reports each gram.
fn continue_row(p: &Pattern, w: usize, row: &mut [Class; Q], n: usize, add: &mut impl FnMut(u32)) {
    if n == Q {
        // Every choice of case for the hex digits in the gram.
        for mask in 0..1u32 << Q {
            if (0..Q).any(|i| mask >> i & 1 == 1 && row[i][0] == row[i][1]) {
                continue;
            }
            let bytes = std::array::from_fn(|i| row[i][(mask >> i & 1) as usize]);
            add(u32::from_le_bytes(bytes));
        }
        return;
    }
    if w == p.len() {
        return;
    }
    for sp in p.spellings(w) {
        let m = sp.len().min(Q - n);
        row[n..n + m].copy_from_slice(&sp[..m]);
        continue_row(p, w + 1, row, n + m, add);
    }
}

/// The first 8 bytes of `text` as a word, and the bits of it that must match: all of a
/// byte with one spelling, all but the case bit of a hex digit, none past the text.
fn head_of(text: &[Class]) -> (u64, u64) {
    let (mut head, mut bits) = (0u64, 0u64);
    for (i, c) in text.iter().take(8).enumerate() {
        let mask: u8 = if c[0] == c[1] {
            0xFF
        } else if c[0] ^ c[1] == 0x20 {
            0xDF
        } else {
            0
        };
        head |= u64::from(c[0] & mask) << (8 * i);
        bits |= u64::from(mask) << (8 * i);
    }
    (head, bits)
}

/// Where `gram` goes in a filter of `word_mask + 1` words: the word and its two bits in it.
/// All from the upper half of a multiplicative hash, which depends on every bit of the
/// gram; fixed shifts only, since a shift by a variable count is slow on baseline x86-64.
#[inline(always)]
fn slot(gram: u32, word_mask: usize) -> (usize, u32, u32) {
    let h = u64::from(gram).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    (
        (h >> 12) as usize & word_mask,
        (h & 63) as u32,
        (h >> 6 & 63) as u32,
    )
}

#[inline(always)]
fn gram_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}
