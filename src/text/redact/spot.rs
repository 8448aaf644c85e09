//! Secret occurrences in a whole text, and the tails that may still become one: what the
//! terminal wire needs, which masks cells of a drawn line rather than a byte stream.

use super::spell::{Pattern, Walk};
use super::{Finder, push_patterns};

/// The tails of a text that may still turn into an occurrence (a proper prefix of one).
pub(crate) struct Prefixes {
    patterns: Vec<Pattern>,
    /// For each byte, the patterns whose occurrences can begin with it.
    by_first: Vec<Vec<u32>>,
    max_len: usize,
}

impl Prefixes {
    /// The prefixes of these patterns (values and base64 cores, each wrapped or not).
    pub(crate) fn new(texts: &[(Vec<u8>, bool)]) -> Self {
        let patterns: Vec<Pattern> = texts.iter().map(|(t, w)| Pattern::new(t, *w)).collect();
        let mut by_first = vec![Vec::new(); 256];
        for (i, p) in patterns.iter().enumerate() {
            let mut seen = [false; 256];
            for sp in p.spellings(0) {
                for &b in &sp[0] {
                    if !seen[usize::from(b)] {
                        seen[usize::from(b)] = true;
                        by_first[usize::from(b)].push(i as u32);
                    }
                }
            }
        }
        let max_len = patterns.iter().map(|p| p.max_len).max().unwrap_or(1);
        Prefixes {
            patterns,
            by_first,
            max_len,
        }
    }

    /// The earliest `s >= from` such that `hay[s..]` is a proper prefix of an occurrence:
    /// from there on, the text may still turn into a secret. Only the last (longest
    /// occurrence − 1) bytes can be one.
    pub(crate) fn start(&self, hay: &[u8], from: usize) -> Option<usize> {
        let lo = from.max(hay.len().saturating_sub(self.max_len - 1));
        (lo..hay.len()).find(|&s| {
            self.by_first[usize::from(hay[s])]
                .iter()
                .any(|&p| self.patterns[p as usize].is_prefix_at(hay, s))
        })
    }
}

/// Finds secret occurrences (every spelling the redactor masks) in a text given whole.
pub struct Spotter {
    finder: Finder,
    prefixes: Prefixes,
}

impl Spotter {
    /// A spotter for these secret values; `None` when none of them is masked.
    pub fn new(secrets: &[&[u8]]) -> Option<Spotter> {
        let mut texts: Vec<(Vec<u8>, bool)> = Vec::new();
        push_patterns(secrets, &mut texts);
        texts.sort_unstable();
        texts.dedup();
        if texts.is_empty() {
            return None;
        }
        Some(Spotter {
            finder: Finder::new(&texts),
            prefixes: Prefixes::new(&texts),
        })
    }

    /// The most bytes one occurrence takes.
    pub fn max_len(&self) -> usize {
        self.finder.max_len
    }

    /// The byte span of every occurrence in `hay` (a wrapped one as one span per line),
    /// sorted, possibly overlapping.
    pub fn find(&self, hay: &[u8]) -> Vec<(usize, usize)> {
        let mut found = Vec::new();
        self.finder
            .find(hay, hay.len(), &mut Walk::default(), &mut found);
        found.sort_unstable();
        found
    }

    /// The earliest `s >= from` such that `hay[s..]` is a proper prefix of an occurrence:
    /// from there on, the text may still turn into a secret.
    pub fn prefix_start(&self, hay: &[u8], from: usize) -> Option<usize> {
        self.prefixes.start(hay, from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_in_any_spelling_are_found_and_others_are_not() {
        let s = Spotter::new(&[b"sk-live/1234"]).unwrap();
        assert_eq!(s.prefix_start(b"echo sk-li", 0), Some(5));
        assert_eq!(s.prefix_start(b"echo sk-live%2", 0), Some(5));
        assert_eq!(s.prefix_start(b"echo sk-live\\u00", 0), Some(5));
        assert_eq!(s.prefix_start(b"echo hi", 0), None);
        assert_eq!(s.prefix_start(b"echo sk-lx", 0), None);
        // A whole occurrence is not a proper prefix.
        assert_eq!(s.prefix_start(b"sk-live/1234", 0), None);
        assert_eq!(s.find(b"a sk-live%2F1234 b"), vec![(2, 16)]);
        assert_eq!(s.prefix_start(b"ss", 0), Some(1));
    }

    #[test]
    fn no_secrets_no_spotter() {
        assert!(Spotter::new(&[b"abc"]).is_none());
        assert!(Spotter::new(&[]).is_none());
    }
}
