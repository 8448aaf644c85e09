//! Patterns too short for the sampled index (values under 8 bytes): the values themselves
//! with Aho–Corasick, whose prefilter handles a small set well; their encoded spellings
//! from the bytes that begin an escape (`%`, `\`, and `+` where a value holds a space),
//! which every spelling but the value itself contains.

use super::spell::{Pattern, Walk};
use aho_corasick::{AhoCorasick, MatchKind};

pub(super) struct ShortPatterns {
    patterns: Vec<Pattern>,
    /// The values themselves, in the order of `patterns`.
    literal: AhoCorasick,
    /// Longest value.
    max_literal: usize,
    /// Most bytes an occurrence takes.
    max_len: usize,
    /// The bytes that begin an escape of some unit (at most three).
    needles: Vec<u8>,
    /// `(first byte, pattern, unit, spelling)` for every spelling but the literal one.
    anchors: Vec<(u8, usize, usize, usize)>,
}

impl ShortPatterns {
    pub(super) fn new(patterns: Vec<Pattern>) -> Self {
        let literals: Vec<Vec<u8>> = patterns.iter().map(Pattern::literal).collect();
        let literal = AhoCorasick::builder()
            .match_kind(MatchKind::Standard)
            .build(&literals)
            .expect("a few short literal patterns always build");
        let mut anchors = Vec::new();
        for (pi, p) in patterns.iter().enumerate() {
            for u in 0..p.len() {
                for (v, sp) in p.spellings(u).enumerate().skip(1) {
                    // Escapes begin with `%`, `\` or `+`: one byte, no case.
                    anchors.push((sp[0][0], pi, u, v));
                }
            }
        }
        anchors.sort_unstable();
        anchors.dedup();
        let mut needles: Vec<u8> = anchors.iter().map(|a| a.0).collect();
        needles.dedup();
        ShortPatterns {
            max_literal: literals.iter().map(Vec::len).max().unwrap_or(0),
            max_len: patterns.iter().map(|p| p.max_len).max().unwrap_or(0),
            patterns,
            literal,
            needles,
            anchors,
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
        // Overlapping search: one pass that reports every occurrence.
        let ends_before = hay.len().min(limit + self.max_literal - 1);
        for m in self.literal.find_overlapping_iter(&hay[..ends_before]) {
            if m.start() < limit {
                found.push((m.start(), m.end()));
            }
        }
        // An escape of an occurrence that starts before `limit` begins before this.
        let scan = &hay[..hay.len().min(limit + self.max_len - 1)];
        let mut at_escape = |e: usize| {
            let first = self.anchors.partition_point(|a| a.0 < hay[e]);
            for &(b, p, u, v) in &self.anchors[first..] {
                if b != hay[e] {
                    break;
                }
                self.patterns[p].find_through(hay, (u, v, e), limit, walk, found);
            }
        };
        match *self.needles.as_slice() {
            [] => {}
            [a] => memchr::memchr_iter(a, scan).for_each(&mut at_escape),
            [a, b] => memchr::memchr2_iter(a, b, scan).for_each(&mut at_escape),
            [a, b, c, ..] => memchr::memchr3_iter(a, b, c, scan).for_each(&mut at_escape),
        }
    }
}
