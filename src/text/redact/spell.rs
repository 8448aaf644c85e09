//! How a secret can be written. A pattern is a row of units, one per character of a secret
//! value or of one of its base64 cores; each unit has the spellings an encoder may give that
//! character, and an occurrence picks one spelling per unit (see the module doc for the
//! rule). Matching runs from a unit spelled at a known place outwards, over sets of
//! positions, so a text that several spellings fit costs no more than one per unit.

use memchr::memchr_iter;

/// One byte of a spelling: a byte, or either of two (the two cases of a hex digit).
pub(super) type Class = [u8; 2];

/// The most bytes a line break takes inside wrapped base64 (`\r\n`).
const BREAK_MAX: usize = 2;

/// A wrapped occurrence counts only if one of its lines holds at least this many of its
/// bytes: that is what the sampled search is sure to see.
pub(super) const WRAP_PIECE: usize = 32;

/// Cores at least this long may be wrapped: at any width of [`WRAP_PIECE`] or more, one of
/// their lines then holds `WRAP_PIECE` of their characters (two breaks enclose a whole line;
/// one splits the core in two, one of them at least half).
pub(super) const WRAP_MIN_CORE: usize = 2 * WRAP_PIECE;

/// A row of units with their spellings.
pub(super) struct Pattern {
    /// Every spelling's bytes, one spelling after another.
    classes: Vec<Class>,
    /// Each spelling's range in `classes`.
    spellings: Vec<(u32, u32)>,
    /// Each unit's range in `spellings`; the first is the character itself.
    units: Vec<(u32, u32)>,
    /// `prefix_min[u]`: the fewest bytes units `0..u` take (the last is the whole).
    prefix_min: Vec<usize>,
    /// A line break (`\n` or `\r\n`) may stand between two units: wrapped base64.
    pub(super) wraps: bool,
    /// The most bytes an occurrence takes.
    pub(super) max_len: usize,
}

impl Pattern {
    /// The pattern of `text` (a secret value or a base64 core), which may be wrapped.
    pub(super) fn new(text: &[u8], wraps: bool) -> Self {
        let mut p = Pattern {
            classes: Vec::new(),
            spellings: Vec::new(),
            units: Vec::new(),
            prefix_min: vec![0],
            wraps,
            max_len: 0,
        };
        for chunk in text.utf8_chunks() {
            for c in chunk.valid().chars() {
                p.push_unit(c.encode_utf8(&mut [0; 4]).as_bytes(), Some(c));
            }
            for &b in chunk.invalid() {
                p.push_unit(&[b], None);
            }
        }
        if wraps {
            p.max_len += BREAK_MAX * p.units.len().saturating_sub(1);
        }
        p
    }

    /// Adds the unit of one character (`ch`, its UTF-8 `bytes`) or of one byte that is not
    /// UTF-8 (`ch` is `None`).
    fn push_unit(&mut self, bytes: &[u8], ch: Option<char>) {
        let first = self.spellings.len();
        self.push_spelling(bytes.iter().map(|&b| [b, b]));
        let fixed =
            matches!(bytes, [b] if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
        if !fixed {
            self.push_spelling(
                bytes
                    .iter()
                    .flat_map(|&b| [[b'%'; 2], hex(b >> 4), hex(b & 15)]),
            );
            if bytes == b" " {
                self.push_spelling([[b'+'; 2]]);
            }
            if let Some(c) = ch {
                if let Some(e) = json_short(c) {
                    self.push_spelling([[b'\\'; 2], [e; 2]]);
                }
                let mut buf = [0u16; 2];
                let units = c.encode_utf16(&mut buf);
                self.push_spelling(units.iter().flat_map(|&w| {
                    let nibble = |shift: u16| hex((w >> shift & 15) as u8);
                    [
                        [b'\\'; 2],
                        [b'u'; 2],
                        nibble(12),
                        nibble(8),
                        nibble(4),
                        nibble(0),
                    ]
                }));
            }
        }
        let range = first as u32..self.spellings.len() as u32;
        let lens = range.clone().map(|v| {
            let (a, b) = self.spellings[v as usize];
            (b - a) as usize
        });
        let (min, max) = lens.fold((usize::MAX, 0), |(lo, hi), n| (lo.min(n), hi.max(n)));
        self.prefix_min.push(self.min_len() + min);
        self.units.push((range.start, range.end));
        self.max_len += max;
    }

    fn push_spelling(&mut self, classes: impl IntoIterator<Item = Class>) {
        let start = self.classes.len() as u32;
        self.classes.extend(classes);
        self.spellings.push((start, self.classes.len() as u32));
    }

    /// How many units.
    pub(super) fn len(&self) -> usize {
        self.units.len()
    }

    /// The fewest bytes an occurrence takes.
    pub(super) fn min_len(&self) -> usize {
        self.prefix_min[self.units.len()]
    }

    /// The fewest bytes before unit `u` in an occurrence.
    pub(super) fn earliest(&self, u: usize) -> usize {
        self.prefix_min[u]
    }

    /// The text itself: every unit spelled as the character it is.
    pub(super) fn literal(&self) -> Vec<u8> {
        (0..self.len())
            .flat_map(|u| self.spelling(u, 0).iter().map(|c| c[0]))
            .collect()
    }

    /// The spellings of unit `u`.
    pub(super) fn spellings(&self, u: usize) -> impl Iterator<Item = &[Class]> {
        let (a, b) = self.units[u];
        (a..b).map(|v| {
            let (s, e) = self.spellings[v as usize];
            &self.classes[s as usize..e as usize]
        })
    }

    /// Spelling `v` of unit `u`.
    pub(super) fn spelling(&self, u: usize, v: usize) -> &[Class] {
        let (s, e) = self.spellings[self.units[u].0 as usize + v];
        &self.classes[s as usize..e as usize]
    }

    /// Pushes the span of every occurrence in `hay` that starts before `limit` and has
    /// unit `u` written with its spelling `v` at `at`. A wrapped occurrence gives one span
    /// per line: its line breaks are not part of it.
    pub(super) fn find_through(
        &self,
        hay: &[u8],
        (u, v, at): (usize, usize, usize),
        limit: usize,
        walk: &mut Walk,
        found: &mut Vec<(usize, usize)>,
    ) {
        let sp = self.spelling(u, v);
        if !spelled_at(hay, at, sp) {
            return;
        }
        // Where units `0..u` can start, then where the units after `u` can end.
        let Walk { starts, ends, next } = walk;
        starts.clear();
        starts.push(at);
        if !self.spell_all(hay, (0..u).rev(), false, starts, next) {
            return;
        }
        starts.retain(|&t| t < limit);
        if starts.is_empty() {
            return;
        }
        ends.clear();
        ends.push(at + sp.len());
        if !self.spell_all(hay, u + 1..self.len(), true, ends, next) {
            return;
        }
        if self.wraps {
            for &t in starts.iter() {
                for &e in ends.iter() {
                    push_lines(hay, t, e, found);
                }
            }
        } else {
            // Every pair of a start and an end is an occurrence, and all of them hold the
            // spelling at `at`: together they cover one span.
            let t = starts.iter().min().copied().unwrap_or(at);
            let e = ends.iter().max().copied().unwrap_or(at);
            found.push((t, e));
        }
    }

    /// Whether `hay[at..]` (not empty) is a proper prefix of an occurrence: the text ends
    /// before the occurrence could, inside a spelling or between two units, with every byte
    /// so far fitting some choice of spellings.
    pub(super) fn is_prefix_at(&self, hay: &[u8], at: usize) -> bool {
        if at >= hay.len() {
            return false;
        }
        let mut set = vec![at];
        let mut next = Vec::new();
        for w in 0..self.len() {
            if set.contains(&hay.len()) {
                return true;
            }
            if self.wraps && w > 0 {
                // A break cut after its `\r` still fits.
                if set.iter().any(|&p| p + 1 == hay.len() && hay[p] == b'\r') {
                    return true;
                }
                breaks_forward(hay, &mut set);
                if set.contains(&hay.len()) {
                    return true;
                }
            }
            next.clear();
            for &p in &set {
                for sp in self.spellings(w) {
                    let rest = &hay[p..];
                    if rest.len() < sp.len() {
                        if rest.iter().zip(sp).all(|(&b, c)| b == c[0] || b == c[1]) {
                            return true;
                        }
                    } else if spelled_at(hay, p, sp) {
                        next.push(p + sp.len());
                    }
                }
            }
            next.sort_unstable();
            next.dedup();
            std::mem::swap(&mut set, &mut next);
            if set.is_empty() {
                return false;
            }
        }
        false
    }

    /// Spells `units` one after another from each position in `set`, forwards (after it)
    /// or backwards (before it), with a line break allowed between two units if the pattern
    /// wraps; leaves in `set` where they end, and says whether anywhere.
    fn spell_all(
        &self,
        hay: &[u8],
        units: impl Iterator<Item = usize>,
        forward: bool,
        set: &mut Vec<usize>,
        next: &mut Vec<usize>,
    ) -> bool {
        for w in units {
            if self.wraps {
                if forward {
                    breaks_forward(hay, set);
                } else {
                    breaks_back(hay, set);
                }
            }
            self.step(hay, w, set, forward, next);
            std::mem::swap(set, next);
            if set.is_empty() {
                return false;
            }
        }
        true
    }

    /// Puts in `next` the positions reached by spelling unit `w` from each of `from`:
    /// after it (`forward`) or before it.
    fn step(&self, hay: &[u8], w: usize, from: &[usize], forward: bool, next: &mut Vec<usize>) {
        next.clear();
        for &p in from {
            for sp in self.spellings(w) {
                let at = if forward {
                    p
                } else if let Some(at) = p.checked_sub(sp.len()) {
                    at
                } else {
                    continue;
                };
                if spelled_at(hay, at, sp) {
                    next.push(if forward { at + sp.len() } else { at });
                }
            }
        }
        if next.len() > 1 {
            next.sort_unstable();
            next.dedup();
        }
    }
}

/// The sets of positions a match goes through, kept to reuse their memory.
#[derive(Default)]
pub(super) struct Walk {
    starts: Vec<usize>,
    ends: Vec<usize>,
    next: Vec<usize>,
}

/// `0123456789ABCDEF`, upper- or lower-case.
fn hex(d: u8) -> Class {
    let c = b"0123456789ABCDEF"[usize::from(d)];
    [c, c.to_ascii_lowercase()]
}

/// The two-character JSON escape of `c`, if it has one.
fn json_short(c: char) -> Option<u8> {
    Some(match c {
        '"' => b'"',
        '\\' => b'\\',
        '/' => b'/',
        '\u{8}' => b'b',
        '\u{c}' => b'f',
        '\n' => b'n',
        '\r' => b'r',
        '\t' => b't',
        _ => return None,
    })
}

/// Whether `hay` holds spelling `sp` at `at`.
#[inline]
pub(super) fn spelled_at(hay: &[u8], at: usize, sp: &[Class]) -> bool {
    hay.get(at..at + sp.len())
        .is_some_and(|w| w.iter().zip(sp).all(|(&b, c)| b == c[0] || b == c[1]))
}

/// Adds to `ends` the positions after a line break that starts at one of them.
fn breaks_forward(hay: &[u8], ends: &mut Vec<usize>) {
    for i in 0..ends.len() {
        let p = ends[i];
        if hay.get(p) == Some(&b'\n') {
            ends.push(p + 1);
        } else if hay.get(p..p + 2) == Some(b"\r\n") {
            ends.push(p + 2);
        }
    }
}

/// Adds to `starts` the positions before a line break that ends at one of them.
fn breaks_back(hay: &[u8], starts: &mut Vec<usize>) {
    for i in 0..starts.len() {
        let p = starts[i];
        if p > 0 && hay[p - 1] == b'\n' {
            starts.push(p - 1);
            if p > 1 && hay[p - 2] == b'\r' {
                starts.push(p - 2);
            }
        }
    }
}

/// Pushes a wrapped occurrence `hay[t..e]` line by line, if one of its lines holds
/// [`WRAP_PIECE`] bytes of it (so that whether it counts never depends on where the probes
/// fell).
fn push_lines(hay: &[u8], t: usize, e: usize, found: &mut Vec<(usize, usize)>) {
    let mut lines = Vec::new();
    let mut from = t;
    for nl in memchr_iter(b'\n', &hay[t..e]) {
        let nl = t + nl;
        let end = if nl > from && hay[nl - 1] == b'\r' {
            nl - 1
        } else {
            nl
        };
        lines.push((from, end));
        from = nl + 1;
    }
    lines.push((from, e));
    if lines.len() == 1 || lines.iter().any(|&(a, b)| b - a >= WRAP_PIECE) {
        found.extend(lines);
    }
}
