//! The wire against a reference terminal built on `vte`'s parser: whatever the masked
//! bytes draw must not show a secret, and bytes wait only while they may become one.

use super::*;
use proptest::prelude::*;

/// A small terminal: rows of characters, a cursor, autowrap; the moves and erases the
/// masker follows, and the ones it forgets (absolute positioning, save and restore).
struct Term {
    rows: Vec<Vec<char>>,
    wrapped: Vec<bool>,
    /// The screen's first row in `rows` (rows above it scrolled off).
    top: usize,
    row: usize,
    col: usize,
    cols: usize,
    saved: (usize, usize),
    wrap_next: bool,
    insert: bool,
}

impl Term {
    fn new(cols: usize) -> Self {
        Term {
            rows: vec![Vec::new()],
            wrapped: vec![false],
            top: 0,
            row: 0,
            col: 0,
            cols,
            saved: (0, 0),
            wrap_next: false,
            insert: false,
        }
    }

    /// A line feed: down a row, scrolling at the screen's bottom.
    fn lf(&mut self) {
        if self.row + 1 - self.top >= LINES {
            self.top += 1;
        }
        self.row += 1;
        self.line();
    }

    fn line(&mut self) -> &mut Vec<char> {
        while self.rows.len() <= self.row {
            self.rows.push(Vec::new());
            self.wrapped.push(false);
        }
        &mut self.rows[self.row]
    }

    /// Each line as the eye reads it: rows joined where they wrapped.
    fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (i, r) in self.rows.iter().enumerate() {
            let s: String = r.iter().collect();
            if self.wrapped.get(i) == Some(&true) && !out.is_empty() {
                out.last_mut().unwrap().push_str(&s);
            } else {
                out.push(s);
            }
        }
        out
    }
}

impl vte::Perform for Term {
    fn print(&mut self, c: char) {
        if self.wrap_next {
            self.wrap_next = false;
            self.lf();
            self.col = 0;
            self.wrapped[self.row] = true;
        }
        let (col, insert, cols) = (self.col, self.insert, self.cols);
        let l = self.line();
        if insert && col < l.len() {
            l.insert(col, ' ');
            l.truncate(cols);
        }
        if l.len() <= col {
            l.resize(col + 1, ' ');
        }
        l[col] = c;
        if col + 1 >= cols {
            self.wrap_next = true;
        } else {
            self.col += 1;
        }
    }

    fn execute(&mut self, b: u8) {
        self.wrap_next = false;
        match b {
            b'\r' => self.col = 0,
            b'\n' | 0x0B | 0x0C => self.lf(),
            0x08 => self.col = self.col.min(self.cols - 1).saturating_sub(1),
            b'\t' => self.col = ((self.col / 8 + 1) * 8).min(self.cols - 1),
            _ => {}
        }
    }

    fn csi_dispatch(&mut self, params: &vte::Params, inter: &[u8], ignore: bool, c: char) {
        if ignore || !inter.is_empty() {
            return;
        }
        let ps: Vec<u16> = params.iter().map(|p| p[0]).collect();
        let p = |i: usize| usize::from(ps.get(i).copied().unwrap_or(0).max(1));
        let p0 = ps.first().copied().unwrap_or(0);
        self.wrap_next = false;
        let col = self.col;
        match c {
            'G' | '`' => self.col = (p(0) - 1).min(self.cols - 1),
            'C' | 'a' => self.col = (self.col + p(0)).min(self.cols - 1),
            'D' => self.col = self.col.min(self.cols - 1).saturating_sub(p(0)),
            'A' => self.row = self.row.saturating_sub(p(0)).max(self.top),
            'B' | 'e' => {
                self.row = (self.row + p(0)).min(self.top + LINES - 1);
                self.line();
            }
            'E' => {
                self.row = (self.row + p(0)).min(self.top + LINES - 1);
                self.col = 0;
                self.line();
            }
            'F' => {
                self.row = self.row.saturating_sub(p(0)).max(self.top);
                self.col = 0;
            }
            'H' | 'f' => {
                self.row = self.top + (p(0) - 1).min(LINES - 1);
                self.col = (p(1) - 1).min(self.cols - 1);
                self.line();
            }
            'd' => {
                self.row = self.top + (p(0) - 1).min(LINES - 1);
                self.line();
            }
            'K' => {
                let l = self.line();
                match p0 {
                    0 => l.truncate(col),
                    1 => {
                        for x in l.iter_mut().take(col + 1) {
                            *x = ' ';
                        }
                    }
                    _ => l.clear(),
                }
            }
            'X' => {
                let n = p(0);
                let l = self.line();
                for x in l.iter_mut().skip(col).take(n) {
                    *x = ' ';
                }
            }
            'P' => {
                let n = p(0);
                let l = self.line();
                if col < l.len() {
                    let end = (col + n).min(l.len());
                    l.drain(col..end);
                }
            }
            '@' => {
                let (n, cols) = (p(0), self.cols);
                let l = self.line();
                if col < l.len() {
                    for _ in 0..n.min(cols) {
                        l.insert(col, ' ');
                    }
                    l.truncate(cols);
                }
            }
            'h' | 'l' if p0 == 4 => self.insert = c == 'h',
            _ => {}
        }
    }

    fn esc_dispatch(&mut self, inter: &[u8], _ignore: bool, b: u8) {
        if !inter.is_empty() {
            return;
        }
        match b {
            b'7' => self.saved = (self.row, self.col),
            b'8' => (self.row, self.col) = self.saved,
            _ => {}
        }
    }
}

/// The reference terminal's height (the masker is told the same).
const LINES: usize = 24;

fn draw(bytes: &[u8], cols: usize) -> Vec<String> {
    let mut t = Term::new(cols);
    let mut p = vte::Parser::new();
    p.advance(&mut t, bytes);
    t.lines()
}

const SECRET: &str = "sk-live-4f9a2b7c";

fn mask(chunks: &[&[u8]], cols: u16) -> (Vec<u8>, Vec<usize>) {
    let mut m = WireMasker::new(&[SECRET.as_bytes()], cols, LINES as u16);
    let mut out = Vec::new();
    let mut held = Vec::new();
    for c in chunks {
        m.feed(c, &mut out);
        held.push(m.holding());
    }
    m.finish(&mut out);
    (out, held)
}

fn shows_secret(out: &[u8], cols: usize) -> Option<String> {
    draw(out, cols).into_iter().find(|l| l.contains(SECRET))
}

#[track_caller]
fn assert_masked(input: &[u8]) {
    let (out, _) = mask(&[input], 200);
    assert!(
        shows_secret(input, 200).is_some(),
        "the case must draw the secret: {:?}",
        String::from_utf8_lossy(input)
    );
    if let Some(l) = shows_secret(&out, 200) {
        panic!(
            "the wire draws the secret: {l:?}\n from {:?}",
            String::from_utf8_lossy(&out)
        );
    }
    for split in 1..input.len() {
        let (out, _) = mask(&[&input[..split], &input[split..]], 200);
        assert!(
            shows_secret(&out, 200).is_none(),
            "split at {split}: {:?}",
            String::from_utf8_lossy(&out)
        );
    }
}

#[test]
fn without_secrets_the_wire_is_the_stream() {
    let mut m = WireMasker::new(&[], 80, 24);
    let mut out = Vec::new();
    m.feed(b"\x1b[31mhi\x1b[0m\r\n$ ", &mut out);
    assert_eq!(out, b"\x1b[31mhi\x1b[0m\r\n$ ");
    assert_eq!(m.holding(), 0);
}

#[test]
fn output_without_a_prefix_goes_out_at_once() {
    let (out, held) = mask(&[b"$ echo hi\r\nhi\r\n$ ", b"x"], 80);
    assert_eq!(held, vec![0, 0]);
    assert_eq!(out, b"$ echo hi\r\nhi\r\n$ x");
}

#[test]
fn only_a_proper_prefix_waits_and_the_rest_of_the_secret_masks_it() {
    let mut m = WireMasker::new(&[SECRET.as_bytes()], 80, 24);
    let mut out = Vec::new();
    m.feed(b"token: sk-li", &mut out);
    assert_eq!(out, b"token: ");
    assert_eq!(m.holding(), 5);
    m.feed(b"ve-4f9a2b7c and then\r\n$ ", &mut out);
    assert_eq!(m.holding(), 0);
    assert_eq!(
        String::from_utf8_lossy(&out),
        format!("token: {} and then\r\n$ ", "*".repeat(SECRET.len()))
    );
    // A prefix that turns out to be something else goes out with the byte that decides it.
    let mut m = WireMasker::new(&[SECRET.as_bytes()], 80, 24);
    let mut out = Vec::new();
    m.feed(b"sk-li", &mut out);
    m.feed(b"x", &mut out);
    assert_eq!(out, b"sk-lix");
    assert_eq!(m.holding(), 0);
}

#[test]
fn a_secret_drawn_through_escapes_is_masked() {
    // grep --color highlighting part of it.
    assert_masked(b"key=sk-\x1b[01;31m\x1b[Klive-4f9a\x1b[m\x1b[K2b7c\r\n");
    // A colour change in the middle, a title in the middle.
    assert_masked(b"sk-live\x1b[1;32m-4f9a2b7c\x1b[0m\r\n");
    assert_masked(b"sk-live\x1b]0;title\x07-4f9a2b7c\r\n");
    // Backspace overstrike, as man does it.
    let mut over = Vec::new();
    for c in SECRET.bytes() {
        over.extend_from_slice(&[c, 8, c]);
    }
    over.extend_from_slice(b"\r\n");
    assert_masked(&over);
    // Erase-in-line in the middle.
    assert_masked(b"sk-liXX\x1b[2D\x1b[Kve-4f9a2b7c\r\n");
    // A cursor move back over it: the second half first.
    assert_masked(b"xxxxxve-4f9a2b7c\rsk-li\r\n");
    assert_masked(b"sk-lXve-4f9a2b7c\x1b[12Di\r\n");
    assert_masked(b"sk-lXve-4f9a2b7c\x1b[5G\x1b[Pive-4f9a2b7c\r\n");
    // Up a row and back into it.
    assert_masked(b"sk-li\r\nnext\x1b[1A\x1b[6Gve-4f9a2b7c\r\n\r\n");
    // Wrapped at the terminal's width.
    let mut m = WireMasker::new(&[SECRET.as_bytes()], 10, 24);
    let mut out = Vec::new();
    m.feed(format!("12345{SECRET}\r\n").as_bytes(), &mut out);
    m.finish(&mut out);
    assert!(
        shows_secret(&out, 10).is_none(),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
    // Insert mode and insert-character.
    assert_masked(b"sk-live4f9a2b7c\x1b[8G\x1b[4h-\x1b[4l\r\n");
    assert_masked(b"sk-live4f9a2b7c\x1b[8G\x1b[@-\r\n");
    // Encoded spellings.
    assert_masked(b"sk-live-4f9a2b7c\r\n");
}

#[test]
fn a_secret_added_later_is_masked_from_then_on() {
    let mut m = WireMasker::new(&[], 80, 24);
    let mut out = Vec::new();
    m.feed(b"before\r\n", &mut out);
    m.add_secrets(&[SECRET.as_bytes()]);
    m.feed(format!("{SECRET}\r\n").as_bytes(), &mut out);
    m.finish(&mut out);
    assert!(
        shows_secret(&out, 80).is_none(),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
}

#[test]
fn escapes_are_kept() {
    let (out, _) = mask(&[b"\x1b[1;31mred\x1b[0m \x1b]0;t\x07\x1b[?25l\r\n"], 80);
    assert_eq!(out, b"\x1b[1;31mred\x1b[0m \x1b]0;t\x07\x1b[?25l\r\n");
}

#[test]
fn what_waits_is_bounded() {
    let mut m = WireMasker::new(&[SECRET.as_bytes()], 80, 24);
    let mut out = Vec::new();
    m.feed(b"sk-li", &mut out);
    for _ in 0..10_000 {
        m.feed(b"\x1b[0m", &mut out);
    }
    assert!(m.holding() <= HOLD_MAX + 16, "{}", m.holding());
}

/// Pieces a stream is made of: text, the secret drawn in one of the ways a terminal can
/// draw it, and sequences the model forgets at.
fn piece() -> impl Strategy<Value = Vec<u8>> {
    let s = SECRET.as_bytes().to_vec();
    prop_oneof![
        "[a-z0-9 =:.-]{0,12}".prop_map(|t| t.into_bytes()),
        Just(b"\r\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\x1b[31m".to_vec()),
        Just(b"\x1b[K".to_vec()),
        Just(b"\x08".to_vec()),
        Just(b"\x1b[3D".to_vec()),
        Just(b"\x1b[1A".to_vec()),
        Just(b"\x1b[2C".to_vec()),
        Just(b"\x1b[P".to_vec()),
        Just(b"\x1b[5;3H".to_vec()),
        Just(b"\x1b7".to_vec()),
        Just(b"\x1b8".to_vec()),
        Just(s.clone()),
        // Escapes between its characters.
        (
            1usize..16,
            prop::sample::select(vec![&b"\x1b[1m"[..], b"\x1b[K", b"\x1b]0;x\x07", b"\x00"])
        )
            .prop_map({
                let s = s.clone();
                move |(at, e)| {
                    let at = at.min(s.len());
                    [&s[..at], e, &s[at..]].concat()
                }
            }),
        // The second part first, then back over it.
        (1usize..15).prop_map({
            let s = s.clone();
            move |at| {
                let mut v = vec![b'x'; at];
                v.extend_from_slice(&s[at..]);
                v.extend_from_slice(format!("\x1b[{}D", s.len()).as_bytes());
                v.extend_from_slice(&s[..at]);
                v.extend_from_slice(format!("\x1b[{}C", s.len() - at).as_bytes());
                v
            }
        }),
        // Overstrike.
        Just(s.iter().flat_map(|&c| [c, 8, c]).collect()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn the_masked_wire_never_draws_a_secret(
        pieces in prop::collection::vec(piece(), 1..12),
        cuts in prop::collection::vec(1usize..24, 0..8),
        cols in prop::sample::select(vec![12usize, 40, 200]),
    ) {
        let input = pieces.concat();
        let mut chunks = Vec::new();
        let mut at = 0;
        for c in cuts {
            let end = (at + c).min(input.len());
            chunks.push(&input[at..end]);
            at = end;
        }
        chunks.push(&input[at..]);
        let mut m = WireMasker::new(&[SECRET.as_bytes()], cols as u16, 24);
        let mut out = Vec::new();
        for c in &chunks {
            m.feed(c, &mut out);
            // At every step, what was sent draws no secret.
            let shown = draw(&out, cols);
            prop_assert!(
                !shown.iter().any(|l| l.contains(SECRET)),
                "sent so far draws it: {:?} (input {:?}, chunks {:?}, cols {})",
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&input),
                chunks.iter().map(|c| c.len()).collect::<Vec<_>>(),
                cols
            );
        }
        m.finish(&mut out);
        let shown = draw(&out, cols);
        prop_assert!(
            !shown.iter().any(|l| l.contains(SECRET)),
            "the wire draws it: {:?} (input {:?})",
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&input)
        );
    }

    #[test]
    fn text_without_secrets_passes_unchanged(input in "[ -~\r\n]{0,200}") {
        let (out, _) = mask(&[input.as_bytes()], 80);
        prop_assert_eq!(out, input.as_bytes());
    }
}

#[test]
fn from_an_unknown_column_a_backspace_moves_one_left_whatever_the_width() {
    // After a restored cursor the column is unknown: an overstruck secret far past the
    // terminal's width (as the model counts) is still seen whole.
    let mut over = b"\x1b8".to_vec();
    over.extend_from_slice(&[b'x'; 50]);
    for c in SECRET.bytes() {
        over.extend_from_slice(&[c, 8, c]);
    }
    let mut m = WireMasker::new(&[SECRET.as_bytes()], 40, 24);
    let mut out = Vec::new();
    m.feed(&over, &mut out);
    m.finish(&mut out);
    assert!(
        !String::from_utf8_lossy(&out).contains("7\u{8}7c"),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
    assert!(
        shows_secret(&out, 200).is_none(),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
}

/// The masked bytes, fed in these chunks, draw what the input draws with some cells shown
/// as `*`, and never the secret.
#[track_caller]
fn assert_same_screen_with_masks(chunks: &[&[u8]]) {
    let input = chunks.concat();
    let (out, _) = mask(chunks, 200);
    let (clear, shown) = (draw(&input, 200), draw(&out, 200));
    assert!(
        shows_secret(&out, 200).is_none(),
        "the wire draws it: {shown:?}"
    );
    let same = clear.len() == shown.len()
        && clear.iter().zip(&shown).all(|(a, b)| {
            a.chars().count() == b.chars().count()
                && a.chars().zip(b.chars()).all(|(x, y)| x == y || y == '*')
        });
    assert!(
        same,
        "clear {clear:?}\nshown {shown:?}\nfrom {:?}",
        String::from_utf8_lossy(&out)
    );
}

#[test]
fn absolute_positioning_is_followed_where_the_screen_row_is_known() {
    // Up from a row the cursor was put on: rows above it are the screen's.
    assert_masked(b"\x1b[5;3H\rsk-li\x1b[1B\rxx\x1b[1A\x1b[6Gve-4f9a2b7c\r\n");
    // The secret's halves put in place by absolute moves.
    assert_masked(b"\x1b[3;6Hve-4f9a2b7c\x1b[3;1Hsk-li\r\n");
    // Down at the screen's bottom does not move.
    let mut bottom = b"\x1b[24;1Hsk-li".to_vec();
    bottom.extend_from_slice(b"\x1b[1B\x1b[6Gve-4f9a2b7c");
    assert_masked(&bottom);
}

#[test]
fn a_deletion_that_joins_a_secret_and_waits_is_masked_when_it_goes_out() {
    // The deletion joins the halves with the cursor behind a prefix, so it waits; when
    // what follows sends it, the row it changed is checked with it.
    assert_masked(b"sk-live-XX4f9a2b7c\x1b[10D\x1b[2P\r\n");
    assert_same_screen_with_masks(&[b"sk-live-XX4f9a2b7c\x1b[10D\x1b[2P", b"\r\nnext\r\n"]);
    assert_same_screen_with_masks(&[b"sk-live-XX4f9a2b7c\x1b[10D\x1b[2P"]);
}

#[test]
fn a_repaint_in_insert_mode_overwrites() {
    // The character inserted last completes the secret out of cells already sent: the
    // repaint turns insert mode off for its masks and on again.
    assert_same_screen_with_masks(&[b"sk-live-4f9a2b7X\x1b[D\x1b[4hc", b"\x1b[4l\r\n"]);
    assert_same_screen_with_masks(&[b"sk-live-4f9a2b7X\x1b[D\x1b[4hc", b"d\x1b[4l\r\n"]);
}

#[test]
fn typing_in_insert_mode_at_the_end_of_a_row_still_waits() {
    let mut m = WireMasker::new(&[SECRET.as_bytes()], 80, 24);
    let mut out = Vec::new();
    m.feed(b"$ \x1b[4hsk-li", &mut out);
    assert_eq!(out, b"$ \x1b[4h");
    m.feed(b"ve-4f9a2b7c\x1b[4l\r\n", &mut out);
    assert_eq!(
        String::from_utf8_lossy(&out),
        format!("$ \x1b[4h{}\x1b[4l\r\n", "*".repeat(SECRET.len()))
    );
}
