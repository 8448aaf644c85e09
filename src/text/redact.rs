//! Streaming secret redaction over sanitized text. Pure; no I/O.
//!
//! # What is masked
//!
//! Every occurrence of a secret value, and of these encoded forms of it where the form
//! differs from the value itself:
//!
//! * base64, standard (`+/`) and URL-safe (`-_`) alphabets, at each of the three byte
//!   alignments the value can have inside a longer encoded blob. For alignment `p` (0, 1 or
//!   2 bytes before the value in its 3-byte group) only the *stable core* is searched: the
//!   characters of `base64([0; p] ++ value)` whose six bits all come from the value, so they
//!   are the same whatever surrounds the value. A core is used only if it is at least
//!   [`MIN_BASE64_CORE`] characters long (48 bits of the secret), so short cores do not mask
//!   ordinary words; in practice values shorter than 6 bytes have no base64 forms and a
//!   6-byte value only its aligned one.
//! * percent-encoding (RFC 3986: unreserved characters kept, every other byte `%XX`), with
//!   upper-case hex and with lower-case hex.
//! * JSON string escaping: `"` and `\` escaped, controls as `\b \f \n \r \t` or `\u00XX`;
//!   also the variant that escapes `/` as `\/`, and the ASCII-only variant that writes every
//!   non-ASCII character as `\uXXXX` (surrogate pairs above U+FFFF).
//!
//! Percent and JSON forms are never shorter than the value and contain an escape, so they
//! need no length rule. Values shorter than 4 bytes are ignored (the caller never passes
//! them: they would mask ordinary text).
//!
//! Occurrences that overlap, nest or touch are merged into a single `[redacted]`: every
//! byte of every occurrence is covered and nothing else is.
//!
//! # Streaming
//!
//! Matching runs on the stream as it comes; only the last `longest pattern - 1` bytes are
//! held back, since only they can still be the start of an occurrence, so a secret 30 MB into
//! a line without a newline is caught in bounded memory. No pattern contains `\n`, so in
//! practice matching is line by line; the sanitizer in front hands over whole lines, which
//! is what catches a secret written a byte at a time, coloured, or rewritten after `\r`.
//!
//! # Matching
//!
//! Patterns of 8 bytes or more (in practice all but short raw values) go in a sampled
//! q-gram index (q = 4), in the manner of Wu–Manber: with the shortest of them `m` bytes
//! long, every occurrence contains one of the text positions `0, s, 2s, …` for `s = m - 3`
//! at an offset below `s` in the pattern. So the index holds, for each pattern, its 4-grams
//! at offsets `0..s`; the text is probed only at every `s`-th position, and the rare probes
//! whose gram may be indexed are checked exactly. This finds every occurrence, overlapping
//! ones included, and on text without secrets costs one probe per `s` bytes (13 bytes for
//! 16-byte secrets). A general Aho–Corasick automaton over a few hundred patterns has no
//! usable prefilter and scans at under 0.5 GB/s here; packed (Teddy) search reports only
//! leftmost non-overlapping matches, takes fewer than 128 patterns (64 secrets give 250 to
//! 400) and its fingerprints fill up long before that; 8-byte grams would shorten the step
//! to `m - 7`. The index runs at several GB/s.
//!
//! The probe filter is a blocked Bloom filter: each indexed gram sets two bits, both in one
//! 64-bit word chosen by the same hash, with about 128 bits per gram. A probe loads one
//! word and tests one bit; only if it is set (0.2–2% of probes on the benchmark's log
//! texts) is the second bit tested, and only if both are (0.1% at most) are the grams of
//! that word compared whole, from a list grouped by word, before the patterns themselves.
//! Real gram matches are rarer still: encoded forms add grams, but on lower-case log words
//! at most 0.04% of probes find one. With a single bit per gram, 1–2% of probes passed
//! falsely (skewed by a text's few frequent grams), and each paid a binary search over all
//! grams: together about as much time as the probing itself.
//!
//! The few shorter patterns would force a probe at every byte, so they are searched with
//! Aho–Corasick instead (overlapping search, which reports every occurrence), whose
//! prefilter handles a small set well.

use aho_corasick::{AhoCorasick, MatchKind};

/// Shortest base64 core (in characters) that is searched for.
pub const MIN_BASE64_CORE: usize = 8;

/// Shortest secret value that is masked.
pub const MIN_SECRET_LEN: usize = 4;

/// What replaces each merged region of secret bytes.
const MARKER: &[u8] = b"[redacted]";

/// Gram length of the index.
const Q: usize = 4;

/// Patterns this long or longer go in the sampled index (probed every 5 bytes or sparser);
/// shorter ones would make it probe every byte.
const SAMPLED_MIN_LEN: usize = 8;

/// Replaces every occurrence of any secret value (and its encoded forms) with `[redacted]`.
pub struct Redactor {
    /// `None` when there is nothing to mask: then the redactor passes text through.
    finder: Option<Finder>,
    /// The tail of the stream that could still start an occurrence.
    held: Vec<u8>,
    /// Stream offset of `held[0]`.
    pos: u64,
    /// Stream offset where the last `[redacted]` region ends: an occurrence starting at or
    /// before it extends that region instead of starting a new one.
    region_end: Option<u64>,
    found: Vec<(usize, usize)>,
    scratch: Vec<u8>,
}

impl Redactor {
    /// A redactor for these secret values.
    pub fn new(secrets: &[&[u8]]) -> Self {
        let mut patterns: Vec<Vec<u8>> = Vec::new();
        for &value in secrets {
            if value.len() < MIN_SECRET_LEN {
                continue;
            }
            patterns.push(value.to_vec());
            patterns.extend(encoded_forms(value));
        }
        patterns.sort_unstable();
        patterns.dedup();
        Redactor {
            finder: (!patterns.is_empty()).then(|| Finder::new(patterns)),
            held: Vec::new(),
            pos: 0,
            region_end: None,
            found: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// Redacts `input`, appending to `out` what can no longer be part of a secret.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        if self.finder.is_none() {
            out.extend_from_slice(input);
            return;
        }
        let from = self.begin(out);
        out.extend_from_slice(input);
        self.end(out, from, false);
    }

    /// Ends the stream: appends whatever was held back.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if self.finder.is_none() {
            return;
        }
        let from = self.begin(out);
        self.end(out, from, true);
    }

    /// Redacts a whole string at once (commands, error messages, log lines).
    pub fn redact_str(&self, s: &str) -> String {
        let Some(finder) = &self.finder else {
            return s.to_string();
        };
        let hay = s.as_bytes();
        let mut found = Vec::new();
        finder.find(hay, hay.len(), &mut found);
        if found.is_empty() {
            return s.to_string();
        }
        let mut out = Vec::with_capacity(hay.len());
        emit(hay, hay.len(), 0, &mut None, &mut found, &mut out);
        match String::from_utf8(out) {
            Ok(s) => s,
            // Only a value that is not itself UTF-8 can cut a character.
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    /// Starts a step in place: puts the held tail at the end of `out` and returns where it
    /// starts. The caller appends new text after it, then calls [`Redactor::end`].
    pub(crate) fn begin(&mut self, out: &mut Vec<u8>) -> usize {
        let from = out.len();
        out.extend_from_slice(&self.held);
        self.held.clear();
        from
    }

    /// Redacts `out[from..]` in place, moving back into the redactor the tail that could
    /// still start an occurrence (nothing if `last`).
    pub(crate) fn end(&mut self, out: &mut Vec<u8>, from: usize, last: bool) {
        let Some(finder) = &self.finder else {
            return;
        };
        let n = out.len() - from;
        let keep = if last { 0 } else { n.min(finder.max_len - 1) };
        let boundary = n - keep;
        self.found.clear();
        finder.find(&out[from..], boundary, &mut self.found);
        let continues = self.region_end.is_some_and(|e| e > self.pos);
        if self.found.is_empty() && !continues {
            self.held.extend_from_slice(&out[from + boundary..]);
            out.truncate(from + boundary);
        } else {
            self.scratch.clear();
            self.scratch.extend_from_slice(&out[from..]);
            out.truncate(from);
            emit(
                &self.scratch,
                boundary,
                self.pos,
                &mut self.region_end,
                &mut self.found,
                out,
            );
            self.held.extend_from_slice(&self.scratch[boundary..]);
        }
        self.pos += boundary as u64;
        if last {
            self.pos = 0;
            self.region_end = None;
        }
    }
}

/// Appends `hay[..boundary]` to `out` with the occurrences in `found` (spans in `hay`,
/// which starts at stream offset `pos`) merged and replaced, and the bytes of a region that
/// began before `hay` (up to `region_end`) dropped.
fn emit(
    hay: &[u8],
    boundary: usize,
    pos: u64,
    region_end: &mut Option<u64>,
    found: &mut [(usize, usize)],
    out: &mut Vec<u8>,
) {
    let rel = |abs: u64| usize::try_from(abs.saturating_sub(pos)).unwrap_or(usize::MAX);
    found.sort_unstable();
    let mut next = region_end.map_or(0, rel);
    for &(start, end) in found.iter() {
        let (abs_start, abs_end) = (pos + start as u64, pos + end as u64);
        match *region_end {
            Some(re) if abs_start <= re => *region_end = Some(re.max(abs_end)),
            _ => {
                out.extend_from_slice(&hay[next..start]);
                out.extend_from_slice(MARKER);
                *region_end = Some(abs_end);
            }
        }
        next = next.max(region_end.map_or(0, rel));
    }
    if next < boundary {
        out.extend_from_slice(&hay[next..boundary]);
    }
}

/// Finds every occurrence of every pattern (see the module doc).
struct Finder {
    /// Patterns of at least [`SAMPLED_MIN_LEN`] bytes.
    long: Option<GramIndex>,
    /// Shorter patterns: few, so a prefiltered Aho–Corasick search is fast on them.
    short: Option<AhoCorasick>,
    /// Longest of the short patterns.
    max_short: usize,
    max_len: usize,
}

impl Finder {
    fn new(patterns: Vec<Vec<u8>>) -> Self {
        let max_len = patterns.iter().map(Vec::len).max().unwrap_or(Q);
        let (long, short): (Vec<_>, Vec<_>) = patterns
            .into_iter()
            .partition(|p| p.len() >= SAMPLED_MIN_LEN);
        let max_short = short.iter().map(Vec::len).max().unwrap_or(0);
        let short = (!short.is_empty()).then(|| {
            AhoCorasick::builder()
                .match_kind(MatchKind::Standard)
                .build(&short)
                .expect("a few short literal patterns always build")
        });
        Finder {
            long: (!long.is_empty()).then(|| GramIndex::new(long)),
            short,
            max_short,
            max_len,
        }
    }

    /// Pushes the span of every occurrence of every pattern in `hay` that starts before
    /// `limit` (in no particular order).
    fn find(&self, hay: &[u8], limit: usize, found: &mut Vec<(usize, usize)>) {
        if let Some(long) = &self.long {
            long.find(hay, limit, found);
        }
        if let Some(short) = &self.short {
            // Overlapping search: one pass that reports every occurrence.
            let ends_before = hay.len().min(limit + self.max_short - 1);
            for m in short.find_overlapping_iter(&hay[..ends_before]) {
                if m.start() < limit {
                    found.push((m.start(), m.end()));
                }
            }
        }
    }
}

/// The sampled 4-gram index (see the module doc).
struct GramIndex {
    patterns: Vec<Vec<u8>>,
    /// Distance between probed text positions: shortest pattern length - 3.
    stride: usize,
    /// A blocked Bloom filter of the indexed grams: each gram sets two bits of one word
    /// (see [`slot`]).
    filter: Vec<u64>,
    /// `filter.len() - 1` (the length is a power of two).
    word_mask: usize,
    /// The entries whose gram falls in word `w` of `filter` are
    /// `entries[starts[w]..starts[w + 1]]`.
    starts: Vec<u32>,
    /// `(gram, pattern, offset)` for each pattern's grams at offsets `0..stride`, grouped
    /// by filter word.
    entries: Vec<(u32, u32, u32)>,
}

impl GramIndex {
    fn new(patterns: Vec<Vec<u8>>) -> Self {
        let min_len = patterns.iter().map(Vec::len).min().unwrap_or(Q);
        let stride = min_len + 1 - Q;
        let count = patterns.len() * stride;
        // 128 bits per gram, so about 1 bit in 64 is set: a random probe passes the first
        // test 1 time in 64 and both about 1 in 4000. 2^16 words (512 KiB) at most.
        let words = (count * 2).next_power_of_two().clamp(1 << 6, 1 << 16);
        let word_mask = words - 1;
        let mut entries = Vec::with_capacity(count);
        for (p, pat) in patterns.iter().enumerate() {
            for off in 0..stride {
                entries.push((gram_at(pat, off), p as u32, off as u32));
            }
        }
        entries.sort_unstable_by_key(|&(gram, p, off)| (slot(gram, word_mask).0, gram, p, off));
        let mut filter = vec![0u64; words];
        let mut starts = vec![0u32; words + 1];
        for &(gram, _, _) in &entries {
            let (w, a, b) = slot(gram, word_mask);
            filter[w] |= 1 << a | 1 << b;
            starts[w + 1] += 1;
        }
        for w in 0..words {
            starts[w + 1] += starts[w];
        }
        GramIndex {
            patterns,
            stride,
            filter,
            word_mask,
            starts,
            entries,
        }
    }

    /// Pushes the span of every occurrence that starts before `limit`.
    fn find(&self, hay: &[u8], limit: usize, found: &mut Vec<(usize, usize)>) {
        if hay.len() < Q || limit == 0 {
            return;
        }
        // An occurrence is seen at a probe at most `stride - 1` bytes after its start.
        let last = (hay.len() - Q).min(limit + self.stride - 2);
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
                self.verify(hay, j, gram, w, limit, found);
            }
            j += self.stride;
        }
    }

    /// Checks the patterns whose grams fall in filter word `w` against `hay`, given the
    /// gram at `j`.
    #[cold]
    fn verify(
        &self,
        hay: &[u8],
        j: usize,
        gram: u32,
        w: usize,
        limit: usize,
        found: &mut Vec<(usize, usize)>,
    ) {
        let bucket = &self.entries[self.starts[w] as usize..self.starts[w + 1] as usize];
        for &(g, p, off) in bucket {
            if g != gram {
                continue;
            }
            let Some(start) = j.checked_sub(off as usize) else {
                continue;
            };
            let pat = &self.patterns[p as usize];
            if start < limit && hay.get(start..start + pat.len()) == Some(pat.as_slice()) {
                found.push((start, start + pat.len()));
            }
        }
    }
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

const BASE64_STD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const BASE64_URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Base64 without padding.
fn base64(bytes: &[u8], alphabet: &[u8; 64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for k in 0..=chunk.len() {
            out.push(alphabet[(n >> (18 - 6 * k) & 63) as usize]);
        }
    }
    out
}

/// The encoded forms of `value` that are searched besides the value itself.
pub(crate) fn encoded_forms(value: &[u8]) -> Vec<Vec<u8>> {
    let mut forms = Vec::new();
    for alphabet in [BASE64_STD, BASE64_URL] {
        for pad in 0..3 {
            let mut bytes = vec![0; pad];
            bytes.extend_from_slice(value);
            let enc = base64(&bytes, alphabet);
            // Characters whose six bits lie wholly inside the value's bits.
            let core = &enc[(8 * pad).div_ceil(6)..8 * (pad + value.len()) / 6];
            if core.len() >= MIN_BASE64_CORE {
                forms.push(core.to_vec());
            }
        }
    }
    for hex in [b"0123456789ABCDEF", b"0123456789abcdef"] {
        let mut enc = Vec::new();
        for &b in value {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                enc.push(b);
            } else {
                enc.extend_from_slice(&[b'%', hex[usize::from(b >> 4)], hex[usize::from(b & 15)]]);
            }
        }
        forms.push(enc);
    }
    forms.push(json_escape(value, false, false));
    forms.push(json_escape(value, true, false));
    forms.push(json_escape(value, false, true));
    forms.retain(|f| f.as_slice() != value);
    forms.sort_unstable();
    forms.dedup();
    forms
}

/// JSON string-body escaping; `slash` also escapes `/`, `ascii` writes non-ASCII as `\u`.
fn json_escape(value: &[u8], slash: bool, ascii: bool) -> Vec<u8> {
    let mut out = Vec::new();
    if ascii && let Ok(text) = std::str::from_utf8(value) {
        for c in text.chars() {
            if c.is_ascii() {
                json_byte(&mut out, c as u8, slash);
            } else {
                for unit in c.encode_utf16(&mut [0; 2]) {
                    out.extend_from_slice(format!("\\u{unit:04x}").as_bytes());
                }
            }
        }
        return out;
    }
    for &b in value {
        json_byte(&mut out, b, slash);
    }
    out
}

fn json_byte(out: &mut Vec<u8>, b: u8, slash: bool) {
    match b {
        b'"' => out.extend_from_slice(b"\\\""),
        b'\\' => out.extend_from_slice(b"\\\\"),
        b'/' if slash => out.extend_from_slice(b"\\/"),
        0x08 => out.extend_from_slice(b"\\b"),
        0x0C => out.extend_from_slice(b"\\f"),
        b'\n' => out.extend_from_slice(b"\\n"),
        b'\r' => out.extend_from_slice(b"\\r"),
        b'\t' => out.extend_from_slice(b"\\t"),
        0x00..=0x1F => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
        _ => out.push(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(secrets: &[&str], chunks: &[&[u8]]) -> Vec<u8> {
        let secrets: Vec<&[u8]> = secrets.iter().map(|s| s.as_bytes()).collect();
        let mut r = Redactor::new(&secrets);
        let mut out = Vec::new();
        for c in chunks {
            r.feed(c, &mut out);
        }
        r.finish(&mut out);
        out
    }

    fn red(secrets: &[&str], input: &str) -> String {
        String::from_utf8(run(secrets, &[input.as_bytes()])).unwrap()
    }

    /// Every pattern searched for these secrets.
    fn all_patterns(secrets: &[&[u8]]) -> Vec<Vec<u8>> {
        let mut pats = Vec::new();
        for &s in secrets.iter().filter(|s| s.len() >= MIN_SECRET_LEN) {
            pats.push(s.to_vec());
            pats.extend(encoded_forms(s));
        }
        pats
    }

    /// Marks every byte of every occurrence the slow way, then masks each covered run.
    fn naive(secrets: &[&[u8]], hay: &[u8]) -> (Vec<u8>, usize) {
        let mut covered = vec![false; hay.len()];
        for p in all_patterns(secrets) {
            for i in 0..hay.len() {
                if hay[i..].starts_with(&p) {
                    covered[i..i + p.len()].fill(true);
                }
            }
        }
        let (mut out, mut regions) = (Vec::new(), 0);
        for (i, &b) in hay.iter().enumerate() {
            if !covered[i] {
                out.push(b);
            } else if i == 0 || !covered[i - 1] {
                out.extend_from_slice(MARKER);
                regions += 1;
            }
        }
        (out, regions)
    }

    fn contains(hay: &[u8], needle: &[u8]) -> bool {
        hay.windows(needle.len()).any(|w| w == needle)
    }

    #[test]
    fn a_value_beginning_with_the_markers_end_can_be_spelled_across_it() {
        // Found by fuzzing: `]\\\` (a `]` and three backslashes) and its JSON form (six)
        // merge into one region; the marker's own `]` then meets the backslashes that
        // followed. Every byte of every occurrence is covered; what reads like the value
        // straddles the marker, which the contract fixes as `[redacted]`.
        let out = red(&["]\\\\\\"], "]\\\\\\\\\\\\\\\\\\\\");
        assert_eq!(out, "[redacted]\\\\\\\\");
        let secret = "]\\\\\\";
        let marker_end = "[redacted]".len();
        for (at, _) in out.match_indices(secret) {
            assert!(
                at < marker_end,
                "an occurrence lies wholly outside the marker: {out:?}"
            );
        }
    }

    #[test]
    fn replaces_a_secret() {
        assert_eq!(red(&["hunter22"], "pw=hunter22 ok\n"), "pw=[redacted] ok\n");
        assert_eq!(red(&["hunter22"], "hunter22"), "[redacted]");
        assert_eq!(
            red(&["hunter22"], "hunter2 hunter 22\n"),
            "hunter2 hunter 22\n"
        );
    }

    #[test]
    fn no_secrets_passes_through() {
        assert_eq!(red(&[], "anything at all\n"), "anything at all\n");
        let r = Redactor::new(&[]);
        assert_eq!(r.redact_str("x"), "x");
        assert!(r.finder.is_none());
        // Values too short to mask ordinary text are left out.
        assert_eq!(red(&["abc", ""], "abc abc\n"), "abc abc\n");
    }

    #[test]
    fn overlapping_nested_and_adjacent_occurrences_merge() {
        assert_eq!(
            red(&["abcdefgh", "efghijkl"], "<abcdefghijkl>"),
            "<[redacted]>"
        );
        assert_eq!(
            red(&["secret", "secret123"], "a secret123 b secret c"),
            "a [redacted] b [redacted] c"
        );
        assert_eq!(
            red(&["secret"], "secretsecret secret"),
            "[redacted] [redacted]"
        );
        assert_eq!(red(&["abab"], "abababab!"), "[redacted]!");
    }

    #[test]
    fn short_and_long_values_overlapping_merge() {
        // `abcde` is searched apart from the longer values; coverage still merges.
        assert_eq!(
            red(&["abcde", "cdefghijkl"], "<abcdefghijkl>"),
            "<[redacted]>"
        );
        assert_eq!(
            red(&["abcde", "fghijklm"], "abcdefghijklm abcde"),
            "[redacted] [redacted]"
        );
        assert_eq!(red(&["wxyz"], "wxyzwxyz-wxy-xyzw"), "[redacted]-wxy-xyzw");
        assert_eq!(red(&["abcd", "cdef"], "<abcdef>"), "<[redacted]>");
        assert_eq!(red(&["aaab"], "aaaab"), "a[redacted]");
    }

    #[test]
    fn self_overlapping_value_split_across_writes() {
        // Eight `a`s then `b`: the occurrence starts at the second `a`, which a matcher that
        // restarted after the first failed `b` would miss.
        let out = run(&["aaaaaaab"], &[b"xaaaaaaa", b"ab"]);
        assert_eq!(out, b"xa[redacted]");
        for i in 0..=10 {
            let (a, b) = b"xaaaaaaaab".split_at(i);
            assert_eq!(run(&["aaaaaaab"], &[a, b]), b"xa[redacted]");
        }
    }

    #[test]
    fn adjacency_across_writes_still_merges() {
        let input = b"--secretsecret--";
        for i in 0..=input.len() {
            let (a, b) = input.split_at(i);
            assert_eq!(run(&["secret"], &[a, b]), b"--[redacted]--", "split at {i}");
        }
    }

    #[test]
    fn encoded_forms_are_masked() {
        let secret = "p@ss/w0rd+Ünïcode\"\\x";
        let value = secret.as_bytes();
        let mut cases: Vec<String> = Vec::new();
        // base64 at every alignment, both alphabets, with other bytes around it.
        for pad in 0..3 {
            for tail in 0..3 {
                let mut blob = b"xyz"[..pad].to_vec();
                blob.extend_from_slice(value);
                blob.extend_from_slice(&b"uvw"[..tail]);
                for alphabet in [BASE64_STD, BASE64_URL] {
                    cases.push(String::from_utf8(base64(&blob, alphabet)).unwrap());
                }
            }
        }
        cases.push("p%40ss%2Fw0rd%2B%C3%9Cn%C3%AFcode%22%5Cx".into());
        cases.push("p%40ss%2fw0rd%2b%c3%9cn%c3%afcode%22%5cx".into());
        cases.push(serde_json::to_string(secret).unwrap());
        cases.push(r#""p@ss\/w0rd+Ünïcode\"\\x""#.into());
        cases.push(r#""p@ss/w0rd+\u00dcn\u00efcode\"\\x""#.into());
        for case in cases {
            let out = red(&[secret], &format!("token: {case} end"));
            assert!(out.starts_with("token: ") && out.ends_with(" end"), "{out}");
            assert!(out.contains("[redacted]"), "{case} -> {out}");
            for form in encoded_forms(value) {
                assert!(!contains(out.as_bytes(), &form), "{case} -> {out}");
            }
        }
    }

    #[test]
    fn short_base64_cores_are_not_searched() {
        // 4 bytes give at most 5 stable base64 characters: below the minimum.
        let forms = encoded_forms(b"abcd");
        assert!(forms.is_empty(), "{forms:?}");
        // 6 bytes give 8 characters at alignment 0 only.
        assert_eq!(encoded_forms(b"abcdef"), vec![b"YWJjZGVm".to_vec()]);
    }

    #[test]
    fn secret_deep_in_a_huge_line_is_caught() {
        let secret = "Zq8-deep-secret-value";
        let mut r = Redactor::new(&[secret.as_bytes()]);
        let filler = vec![b'x'; 64 * 1024];
        let mut out = Vec::new();
        let mut total = 0;
        for i in 0..64 {
            if i == 48 {
                r.feed(&filler[..1000], &mut out);
                r.feed(&secret.as_bytes()[..7], &mut out);
                r.feed(&secret.as_bytes()[7..], &mut out);
                total += 1000;
            }
            r.feed(&filler, &mut out);
            total += filler.len();
            assert!(r.held.len() < 64, "held {}", r.held.len());
        }
        r.finish(&mut out);
        assert_eq!(out.len(), total + MARKER.len());
        let at = 48 * filler.len() + 1000;
        assert_eq!(&out[at..at + MARKER.len()], MARKER);
        assert!(out.iter().all(|&b| b == b'x' || MARKER.contains(&b)));
    }

    #[test]
    fn many_secrets_sharing_grams_are_all_found() {
        // Hundreds of values over a few letters: most grams belong to several patterns at
        // several offsets, so filter words and their entry lists are crowded.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        let secrets: Vec<Vec<u8>> = (0..300)
            .map(|_| (0..8 + next(20)).map(|_| b"abcxy/"[next(6)]).collect())
            .collect();
        let refs: Vec<&[u8]> = secrets.iter().map(Vec::as_slice).collect();
        let mut text = Vec::new();
        for _ in 0..400 {
            let s = &secrets[next(secrets.len())];
            match next(4) {
                0 => text.extend_from_slice(s),
                1 => text.extend_from_slice(&s[next(s.len())..]),
                2 => text.extend_from_slice(&base64(s, BASE64_STD)),
                _ => text.extend_from_slice(b" abcxy/ "),
            }
        }
        let (expected, regions) = naive(&refs, &text);
        assert!(regions > 50, "{regions}");
        let mut r = Redactor::new(&refs);
        let mut out = Vec::new();
        for chunk in text.chunks(97) {
            r.feed(chunk, &mut out);
        }
        r.finish(&mut out);
        assert!(out == expected);
    }

    #[test]
    fn redact_str_masks_everything() {
        let r = Redactor::new(&[b"hunter22", b"tok-123456"]);
        assert_eq!(
            r.redact_str("git push https://u:hunter22@h tok-123456tok-123456"),
            "git push https://u:[redacted]@h [redacted]"
        );
        assert_eq!(r.redact_str(""), "");
    }

    fn secret_strategy() -> impl Strategy<Value = Vec<u8>> {
        // No bytes of "[redacted]", so a marker can never form part of a pattern. The
        // three-letter alphabet makes overlapping and self-overlapping values common.
        let wide: Vec<u8> = b"bxyzBXYZ019 /+=%\"\\\t".to_vec();
        prop_oneof![
            prop::collection::vec(prop::sample::select(wide), 4..12),
            prop::collection::vec(prop::sample::select(b"xy/".to_vec()), 4..10),
        ]
    }

    fn text_strategy(secrets: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
        let mut pieces: Vec<Vec<u8>> = vec![
            b"b".to_vec(),
            b"x".to_vec(),
            b"y".to_vec(),
            b"/".to_vec(),
            b" ".to_vec(),
            b"\n".to_vec(),
            b"%".to_vec(),
            b"Z".to_vec(),
        ];
        for s in &secrets {
            pieces.push(s.clone());
            // Halves and shifted tails, so occurrences overlap and abut.
            pieces.push(s[..s.len() / 2].to_vec());
            pieces.push(s[s.len() / 2..].to_vec());
            pieces.push(s[1..].to_vec());
            pieces.extend(encoded_forms(s));
        }
        prop::collection::vec(prop::sample::select(pieces), 0..24).prop_map(|p| p.concat())
    }

    fn case() -> impl Strategy<Value = (Vec<Vec<u8>>, Vec<u8>, Vec<usize>)> {
        prop::collection::vec(secret_strategy(), 1..4).prop_flat_map(|secrets| {
            let text = text_strategy(secrets.clone());
            (Just(secrets), text, prop::collection::vec(1usize..40, 1..6))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn streaming_matches_the_naive_masking((secrets, text, sizes) in case()) {
            let refs: Vec<&[u8]> = secrets.iter().map(Vec::as_slice).collect();
            let (expected, regions) = naive(&refs, &text);
            let mut r = Redactor::new(&refs);
            let mut out = Vec::new();
            let mut rest = text.as_slice();
            for &n in sizes.iter().cycle() {
                if rest.is_empty() {
                    break;
                }
                let (a, b) = rest.split_at(n.min(rest.len()));
                r.feed(a, &mut out);
                rest = b;
            }
            r.finish(&mut out);
            prop_assert_eq!(&out, &expected);
            // Nothing survives, and the output is no longer than needed.
            for p in all_patterns(&refs) {
                prop_assert!(!contains(&out, &p));
            }
            prop_assert!(out.len() <= text.len() + MARKER.len() * regions);
            if regions == 0 {
                prop_assert_eq!(&out, &text);
            }
            if let Ok(s) = std::str::from_utf8(&text) {
                let once = Redactor::new(&refs).redact_str(s);
                prop_assert_eq!(once.as_bytes(), expected.as_slice());
            }
        }

        #[test]
        fn every_two_way_split_is_the_same((secrets, text, _sizes) in case()) {
            let refs: Vec<&[u8]> = secrets.iter().map(Vec::as_slice).collect();
            let (expected, _) = naive(&refs, &text);
            // One redactor for all splits: `finish` leaves it ready for a new stream.
            let mut r = Redactor::new(&refs);
            for i in 0..=text.len() {
                let (a, b) = text.split_at(i);
                let mut out = Vec::new();
                r.feed(a, &mut out);
                r.feed(b, &mut out);
                r.finish(&mut out);
                prop_assert_eq!(&out, &expected);
            }
        }
    }
}
