//! Streaming secret redaction over sanitized text. Pure; no I/O.
//!
//! # What is masked
//!
//! Every occurrence of a secret value, or of one of its *base64 cores*, in any spelling the
//! rule below allows.
//!
//! * **Base64 cores.** Standard (`+/`) and URL-safe (`-_`) alphabets, at each of the three
//!   byte alignments the value can have inside a longer encoded blob. For alignment `p` (0,
//!   1 or 2 bytes before the value in its 3-byte group) only the *stable core* is searched:
//!   the characters of `base64([0; p] ++ value)` whose six bits all come from the value, so
//!   they are the same whatever surrounds the value. A core is used only if it is at least
//!   [`MIN_BASE64_CORE`] characters long (48 bits of the secret), so short cores do not mask
//!   ordinary words; in practice values shorter than 6 bytes have no base64 forms and a
//!   6-byte value only its aligned one.
//! * **Spellings, character by character.** A value or core is read as a row of characters
//!   (UTF-8 characters; a byte that is not UTF-8 stands alone). ASCII letters and digits,
//!   `-`, `.` and `_` are always themselves: no encoder escapes them. Every other
//!   character may be written, each independently of the others, as
//!   - itself;
//!   - percent-encoded: each of its UTF-8 bytes as `%XX`, each hex digit in either case; a
//!     space also as `+`;
//!   - JSON-escaped: `\uXXXX`, each hex digit in either case (above U+FFFF as a surrogate
//!     pair), or its two-character escape (`\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`,
//!     `\t`).
//!
//!   One rule thus covers what encoders really print, and any mixture of it: Python's
//!   `quote` (which keeps `/`: `a/b%20c`) and `quote_plus` (`a%2Fb+c`), JavaScript's
//!   `encodeURIComponent`, Java's `URLEncoder`, hex digits in both cases in one value
//!   (`%2f` and `%2F`, even `%c3%A4`); `json.dumps` with and without `ensure_ascii`
//!   (`\u00e4`), Go's `json.Marshal` and Gson, which escape `<`, `>`, `&` (Gson also `=`
//!   and `'`) and U+2028/U+2029 as `\u003c` … (`MQ\u003d\u003d` for a base64 value's
//!   padding), PHP's `json_encode` (`\/` together with `\u00e4`), upper-case `\u00E4`;
//!   and a base64 core carried in any of them (`%2B`, `\/`).
//! * **Wrapped base64.** A core of at least 64 characters (every core of a value of 49
//!   bytes or more) may also be broken by a line break, `\n` or `\r\n`, between any two of
//!   its characters, as `base64`, Python's `encodebytes`, MIME (76 columns) and PEM (64)
//!   write it. Such an occurrence counts if one of its lines holds at least 32 of its bytes,
//!   which is always so at a wrap width of 32 or more (two breaks enclose a whole line; one
//!   leaves a part of at least half the core). The breaks stay where they are: each line's
//!   part of the occurrence becomes its own `[redacted]`.
//!
//! Values shorter than [`MIN_SECRET_LEN`] bytes are ignored (the caller never passes them:
//! they would mask ordinary text). Occurrences that overlap, nest or touch are merged into
//! a single `[redacted]`: every byte of every occurrence is covered and nothing else is
//! (but the line breaks inside a wrapped one).
//!
//! ## Out of reach
//!
//! A program can always print a secret in a form no rule foresees; these are the ones not
//! searched: hex (`xxd`, `%02x`), base32, base58 and other radices; a value reversed,
//! case-changed or rotated (ROT13); other Unicode normalisations of it (NFD writes `ä` as
//! `a` + U+0308; NFKC folds width and ligatures); two layers of escaping (`%252F`,
//! `\\u003d`, JSON inside a JSON string), HTML entities (`&amp;`, `&#x2F;`), JavaScript's
//! legacy `escape()` (`%u20AC`, Latin-1 `%E4`), escaped letters and digits (`%41`,
//! `\u0041`); base64 of an encoded form (of the URL-encoded value, say); base64 cores
//! under 8 characters; the base64 of a value under 49 bytes where a line break cuts it,
//! wrapped lines that are indented or prefixed (`> `), or wrapped so narrow that no line
//! holds 32 bytes of it; and a value the program cuts apart itself with other text
//! between. Compression and encryption, of course.
//!
//! # Streaming
//!
//! Matching runs on the stream as it comes; only a tail that is a proper prefix of an
//! occurrence is held back (at most `longest occurrence - 1` bytes), since only it can
//! still be the start of one: an occurrence starting earlier is whole in what is there. So
//! a secret 30 MB into a line without a newline is caught in bounded memory, and text that
//! cannot become a secret goes out at once. The longest occurrence is
//! the sum over the characters of their longest spelling: one byte for a letter or digit,
//! at most six for another ASCII character (`\u002f`), at most twelve for any character
//! (`%F0%9F%98%80`), plus two per possible line break in a wrapped core. Only wrapped
//! base64 spans lines; everything else is matched line by line in practice, and the
//! sanitizer in front hands over whole lines, which is what catches a secret written a
//! byte at a time, coloured, or rewritten after `\r`. A wrapped occurrence is found whole;
//! its lines that lie past the boundary of the step that found it are masked in the next.
//!
//! # Matching
//!
//! Patterns whose occurrences take 8 bytes or more (all but values under 8 bytes) go in a
//! sampled q-gram index (q = 4), in the manner of Wu–Manber: with the shortest occurrence
//! of any of them `m` bytes long (its characters each in their shortest spelling), every
//! occurrence contains one of the text positions `0, s, 2s, …` for `s = m - 3` at an offset
//! below `s`. So the index holds, for each pattern, every 4-gram that some choice of
//! spellings (and of hex-digit cases) puts at offsets `0..s` of an occurrence, each with
//! the character and the spelling it begins in; the text is probed only at every `s`-th
//! position, and a probe whose gram is indexed is matched exactly, from that spelling
//! outwards, one character at a time over the set of positions its spellings reach (so a
//! text that several spellings fit costs no more than one). This finds every occurrence,
//! overlapping ones included, and on text without secrets costs one probe per `s` bytes
//! (13 bytes for 16-byte secrets). Letters and digits having one spelling, escapes add
//! grams only around the other characters: 64 random secrets of 16–40 characters give
//! about 4,800 index entries. A gram inside an escape (`\u00` of `\u00e4`) belongs to
//! every pattern with such a character and turns up in text that has nothing to do with
//! them, so the entries that share a gram, its offset and the spelling it lies in are
//! checked as one group, against the first 8 bytes of that spelling in one comparison;
//! on JSON logs full of escapes this keeps the redactor within a quarter of its speed
//! without the spellings. A wrapped core may break anywhere, so all its grams are
//! indexed, the step is at most 29 bytes (so that a probe falls on a whole gram inside its
//! line of 32), and the probes for a step go on past its boundary by the longest wrapped
//! occurrence; 64 secrets of 49–98 characters give about 23,000 entries.
//!
//! A general Aho–Corasick automaton over a few hundred patterns has no usable prefilter and
//! scans at under 0.5 GB/s here (and could not take the spellings without expanding them,
//! exponentially); packed (Teddy) search reports only leftmost non-overlapping matches,
//! takes fewer than 128 patterns (64 secrets give 250 to 400) and its fingerprints fill up
//! long before that; 8-byte grams would shorten the step to `m - 7`. The index runs at
//! several GB/s.
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
//! Values under 8 bytes would force a probe at every byte, so they are searched apart: the
//! values themselves with Aho–Corasick (overlapping search, which reports every
//! occurrence), whose prefilter handles a small set well, and their other spellings from
//! the bytes that begin an escape (`%`, `\`, and `+` where a value holds a space), found
//! with `memchr`: every spelling but the value itself holds one.
//!
//! # Files
//!
//! `spell.rs`: the spelling rule and the matching of one pattern from a spelling outwards;
//! `index.rs`: the sampled index; `short.rs`: values under 8 bytes; this file: the
//! patterns of the secrets and the streaming.

mod index;
mod short;
mod spell;
mod spot;
#[cfg(test)]
mod tests;

use index::{GramIndex, SAMPLED_MIN_LEN};
use short::ShortPatterns;
use spell::{Pattern, WRAP_MIN_CORE, Walk};
use spot::Prefixes;
pub use spot::Spotter;

/// Shortest base64 core (in characters) that is searched for.
pub const MIN_BASE64_CORE: usize = 8;

/// Shortest secret value that is masked.
pub const MIN_SECRET_LEN: usize = 4;

/// What replaces each merged region of secret bytes.
const MARKER: &[u8] = b"[redacted]";

/// Replaces every occurrence of any secret value (and its encoded forms) with `[redacted]`.
pub struct Redactor {
    /// `None` when there is nothing to mask: then the redactor passes text through.
    finder: Option<Finder>,
    /// What the finder searches (values and base64 cores, each wrapped or not), sorted and
    /// without duplicates: kept so that [`Redactor::add_secrets`] can extend it.
    patterns: Vec<(Vec<u8>, bool)>,
    /// What tells which tail of the stream may still become an occurrence.
    prefixes: Option<Prefixes>,
    /// The tail of the stream that could still start an occurrence: from the first place
    /// where the rest is a proper prefix of one, so a text that ends in no such prefix is
    /// all handed out.
    held: Vec<u8>,
    /// Stream offset of `held[0]`.
    pos: u64,
    /// Stream offset where the last `[redacted]` region ends: an occurrence starting at or
    /// before it extends that region instead of starting a new one.
    region_end: Option<u64>,
    /// Lines of a wrapped occurrence that start past the last step's boundary (stream
    /// offsets): the occurrence was found whole, so they are masked in the next step.
    pending: Vec<(u64, u64)>,
    found: Vec<(usize, usize)>,
    walk: Walk,
    scratch: Vec<u8>,
    /// `[redacted]` markers written so far (each one merged region of occurrences).
    masked: u64,
}

impl Redactor {
    /// How many `[redacted]` markers the stream has had so far.
    pub fn masked(&self) -> u64 {
        self.masked
    }

    /// A redactor for these secret values.
    pub fn new(secrets: &[&[u8]]) -> Self {
        let mut patterns = Vec::new();
        push_patterns(secrets, &mut patterns);
        patterns.sort_unstable();
        patterns.dedup();
        Redactor {
            finder: (!patterns.is_empty()).then(|| Finder::new(&patterns)),
            prefixes: (!patterns.is_empty()).then(|| Prefixes::new(&patterns)),
            patterns,
            held: Vec::new(),
            pos: 0,
            region_end: None,
            pending: Vec::new(),
            found: Vec::new(),
            walk: Walk::default(),
            scratch: Vec::new(),
            masked: 0,
        }
    }

    /// Masks these values too from now on, keeping the stream's state: the held tail (which
    /// the new values are searched in as well, so a value whose start is still held is
    /// caught), the region being masked, and the count. Text already handed out stays as
    /// it was. Values already known, or too short, change nothing; returns whether any
    /// was new. Rebuilding the index costs about as much as [`Redactor::new`] for all the
    /// values together, so call it when the set changed, not per write.
    pub fn add_secrets(&mut self, secrets: &[&[u8]]) -> bool {
        let mut added = Vec::new();
        push_patterns(secrets, &mut added);
        added.retain(|p| self.patterns.binary_search(p).is_err());
        if added.is_empty() {
            return false;
        }
        self.patterns.extend(added);
        self.patterns.sort_unstable();
        self.patterns.dedup();
        // The held tail is a proper prefix of an old occurrence, so at most the old longest
        // occurrence less one byte, which is never more than the new: nothing held needs to
        // be handed out first.
        self.finder = Some(Finder::new(&self.patterns));
        self.prefixes = Some(Prefixes::new(&self.patterns));
        true
    }

    /// Whether `text` holds an occurrence of any secret, in any spelling that is masked.
    pub fn finds(&self, text: &[u8]) -> bool {
        let Some(finder) = &self.finder else {
            return false;
        };
        let mut found = Vec::new();
        finder.find(text, text.len(), &mut Walk::default(), &mut found);
        !found.is_empty()
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

    /// Where `text` (given whole) begins a tail that may still turn into an occurrence (a
    /// proper prefix of one): the same test that decides what the stream holds back.
    pub fn prefix_start(&self, text: &[u8]) -> Option<usize> {
        self.prefixes.as_ref().and_then(|p| p.start(text, 0))
    }

    /// Redacts a whole text at once.
    pub fn redact_bytes(&self, hay: &[u8]) -> Vec<u8> {
        let Some(finder) = &self.finder else {
            return hay.to_vec();
        };
        let mut found = Vec::new();
        finder.find(hay, hay.len(), &mut Walk::default(), &mut found);
        if found.is_empty() {
            return hay.to_vec();
        }
        let mut out = Vec::with_capacity(hay.len());
        let _ = emit(hay, hay.len(), 0, &mut None, &mut found, &mut out);
        out
    }

    /// Redacts a whole string at once (commands, error messages, log lines).
    pub fn redact_str(&self, s: &str) -> String {
        let out = self.redact_bytes(s.as_bytes());
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
        // Only a tail that is a proper prefix of an occurrence is held: an occurrence that
        // starts before it is whole in what is here (or it would be such a tail itself).
        let keep = match (&self.prefixes, last) {
            (_, true) => 0,
            (Some(p), false) => p.start(&out[from..], 0).map_or(0, |s| n - s),
            (None, false) => n.min(finder.max_len - 1),
        };
        let boundary = n - keep;
        self.found.clear();
        finder.find(&out[from..], boundary, &mut self.walk, &mut self.found);
        // Lines of a wrapped occurrence left from the last step; lines past this boundary.
        let pos = self.pos;
        for (s, e) in self.pending.drain(..) {
            self.found.push(((s - pos) as usize, (e - pos) as usize));
        }
        if self.found.iter().any(|&(s, _)| s >= boundary) {
            let pending = &mut self.pending;
            self.found.retain(|&(s, e)| {
                s < boundary || {
                    pending.push((pos + s as u64, pos + e as u64));
                    false
                }
            });
        }
        let continues = self.region_end.is_some_and(|e| e > self.pos);
        if self.found.is_empty() && !continues {
            self.held.extend_from_slice(&out[from + boundary..]);
            out.truncate(from + boundary);
        } else {
            self.scratch.clear();
            self.scratch.extend_from_slice(&out[from..]);
            out.truncate(from);
            self.masked += emit(
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

/// Appends the patterns of these values (each value and its base64 cores) to `patterns`.
fn push_patterns(secrets: &[&[u8]], patterns: &mut Vec<(Vec<u8>, bool)>) {
    for &value in secrets {
        if value.len() < MIN_SECRET_LEN {
            continue;
        }
        patterns.push((value.to_vec(), false));
        for core in base64_cores(value) {
            let wraps = core.len() >= WRAP_MIN_CORE;
            patterns.push((core, wraps));
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
) -> u64 {
    let mut markers = 0;
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
                markers += 1;
                *region_end = Some(abs_end);
            }
        }
        next = next.max(region_end.map_or(0, rel));
    }
    if next < boundary {
        out.extend_from_slice(&hay[next..boundary]);
    }
    markers
}

/// Finds every occurrence of every pattern (see the module doc).
struct Finder {
    /// Patterns whose occurrences take at least [`SAMPLED_MIN_LEN`] bytes.
    long: Option<GramIndex>,
    /// Shorter ones: values under 8 bytes.
    short: Option<ShortPatterns>,
    /// The most bytes an occurrence takes.
    max_len: usize,
}

impl Finder {
    /// A finder for these texts (values and base64 cores), each wrapped or not.
    fn new(texts: &[(Vec<u8>, bool)]) -> Self {
        let patterns: Vec<Pattern> = texts.iter().map(|(t, w)| Pattern::new(t, *w)).collect();
        let max_len = patterns.iter().map(|p| p.max_len).max().unwrap_or(1);
        let (long, short): (Vec<_>, Vec<_>) = patterns
            .into_iter()
            .partition(|p| p.min_len() >= SAMPLED_MIN_LEN);
        Finder {
            long: (!long.is_empty()).then(|| GramIndex::new(long)),
            short: (!short.is_empty()).then(|| ShortPatterns::new(short)),
            max_len,
        }
    }

    /// Pushes the span of every occurrence of every pattern in `hay` that starts before
    /// `limit` (in no particular order; a wrapped occurrence as one span per line, of which
    /// only the first need start before `limit`).
    fn find(&self, hay: &[u8], limit: usize, walk: &mut Walk, found: &mut Vec<(usize, usize)>) {
        if let Some(long) = &self.long {
            long.find(hay, limit, walk, found);
        }
        if let Some(short) = &self.short {
            short.find(hay, limit, walk, found);
        }
    }
}

const BASE64_STD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const BASE64_URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Base64 without padding.
pub(crate) fn base64(bytes: &[u8], alphabet: &[u8; 64]) -> Vec<u8> {
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

/// The base64 cores of `value` (see the module doc): for each alphabet and each of the three
/// byte alignments, the characters whose six bits all come from the value.
fn base64_cores(value: &[u8]) -> Vec<Vec<u8>> {
    let mut cores = Vec::new();
    for alphabet in [BASE64_STD, BASE64_URL] {
        for pad in 0..3 {
            let mut bytes = vec![0; pad];
            bytes.extend_from_slice(value);
            let enc = base64(&bytes, alphabet);
            let core = &enc[(8 * pad).div_ceil(6)..8 * (pad + value.len()) / 6];
            if core.len() >= MIN_BASE64_CORE {
                cores.push(core.to_vec());
            }
        }
    }
    cores.sort_unstable();
    cores.dedup();
    cores
}
