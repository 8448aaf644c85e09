//! The sanitizer as a whole: the line model, sequences, UTF-8 repair, streaming, and
//! agreement with a reference built on `vte`.

use super::*;
use proptest::prelude::*;

fn run_chunks(mut s: Sanitizer, chunks: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in chunks {
        s.feed(c, &mut out);
    }
    s.finish(&mut out);
    out
}

fn san(input: &[u8]) -> String {
    String::from_utf8(run_chunks(Sanitizer::new(), &[input])).unwrap()
}

fn san_limit(input: &[u8], limit: usize) -> Vec<u8> {
    run_chunks(Sanitizer::with_line_limit(limit), &[input])
}

/// Every split into two writes, and one byte per write, give the one-shot result.
fn assert_split_invariant(input: &[u8], limit: usize) {
    let whole = san_limit(input, limit);
    for i in 0..=input.len() {
        let (a, b) = input.split_at(i);
        let split = run_chunks(Sanitizer::with_line_limit(limit), &[a, b]);
        assert_eq!(
            split,
            whole,
            "split at {i} of {:?}",
            String::from_utf8_lossy(input)
        );
    }
    let bytes: Vec<&[u8]> = input.chunks(1).collect();
    assert_eq!(run_chunks(Sanitizer::with_line_limit(limit), &bytes), whole);
}

#[test]
fn plain_text_passes_through() {
    assert_eq!(
        san(b"hello world\nsecond line\n"),
        "hello world\nsecond line\n"
    );
    assert_eq!(
        san("tabs\tand ünïcödé 😀\n".as_bytes()),
        "tabs\tand ünïcödé 😀\n"
    );
    assert_eq!(san(b""), "");
}

#[test]
fn last_line_is_stored_as_is() {
    assert_eq!(san(b"no newline"), "no newline");
    assert_eq!(san(b"a\nb"), "a\nb");
    assert_eq!(san(b"trailing spaces   "), "trailing spaces   ");
}

#[test]
fn crlf_is_a_line_end() {
    assert_eq!(san(b"one\r\ntwo\r\n"), "one\ntwo\n");
    assert_eq!(san(b"text\r\r\n"), "text\n");
}

#[test]
fn progress_bar_keeps_last_frame() {
    assert_eq!(san(b"10%\r20%\r100%\n"), "100%\n");
    assert_eq!(
        san(b"[##  ] 50%\r[####] 100%\ndone\n"),
        "[####] 100%\ndone\n"
    );
    // A shorter frame over a longer one: the terminal still shows the old tail.
    assert_eq!(san(b"loading...\rok\n"), "okading...\n");
}

#[test]
fn overstrike_reads_the_last_character() {
    assert_eq!(san(b"N\x08NA\x08AM\x08ME\x08E\n"), "NAME\n");
    assert_eq!(san(b"_\x08O_\x08K\n"), "OK\n");
    assert_eq!(san("é\x08x\n".as_bytes()), "x\n");
    // Backspace stops at column 0.
    assert_eq!(san(b"\x08\x08ab\n"), "ab\n");
}

#[test]
fn erase_in_line() {
    assert_eq!(san(b"abcdef\x08\x08\x1b[K\n"), "abcd\n");
    assert_eq!(san(b"abcdef\x08\x08\x1b[0K\n"), "abcd\n");
    assert_eq!(san(b"abcdef\r\x1b[Knew\n"), "new\n");
    // 1K blanks from the start through the cursor; text after it keeps its column.
    assert_eq!(san(b"abcdef\x08\x08\x1b[1K\n"), "     f\n");
    assert_eq!(san(b"abcdef\x08\x08\x1b[1Kxy\n"), "    xy\n");
    assert_eq!(san(b"abc\x1b[1K\n"), "\n");
    assert_eq!(san(b"abc\x1b[1Kd\n"), "   d\n");
    // 2K blanks the line, the cursor stays.
    assert_eq!(san(b"abc\x1b[2K\n"), "\n");
    assert_eq!(san(b"abc\x1b[2Kdef\n"), "   def\n");
    assert_eq!(san(b"abc\r\x1b[2Kdef\n"), "def\n");
    assert_eq!(san("äöü\x1b[2K€".as_bytes()), "   €");
    // Erased cells at the end are not stored, also without a newline.
    assert_eq!(san(b"abc\x1b[2K"), "");
    // Only the first parameter counts; others are not erase-in-line.
    assert_eq!(san(b"abc\x1b[1;5K\n"), "\n");
    assert_eq!(san(b"abc\x1b[3K\n"), "abc\n");
    assert_eq!(san(b"abc\x1b[?2K\n"), "abc\n");
    assert_eq!(san(b"abc\x1b[ K\n"), "abc\n");
}

#[test]
fn horizontal_cursor_moves() {
    // npm's spinner: each frame is followed by "to column 1, erase to the end".
    assert_eq!(
        san("⠙\x1b[1G\x1b[0K⠹\x1b[1G\x1b[0Knpmproj@1.0.0 /app\n".as_bytes()),
        "npmproj@1.0.0 /app\n"
    );
    // To a column, counted from 1; a missing or 0 count is 1.
    assert_eq!(san(b"abcdef\x1b[3GX\n"), "abXdef\n");
    assert_eq!(san(b"abcdef\x1b[3`X\n"), "abXdef\n");
    assert_eq!(san(b"abcdef\x1b[GX\x1b[0GY\n"), "Ybcdef\n");
    assert_eq!(san("äöü€\x1b[3Gx".as_bytes()), "äöx€");
    // Right and left, in characters.
    assert_eq!(san(b"abcdef\r\x1b[2CX\x1b[CY\x1b[0CZ\n"), "abXdYfZ\n");
    assert_eq!(san(b"abcdef\x1b[2DX\x1b[DY\x1b[0DZ\n"), "abcdZf\n");
    assert_eq!(san("é€😀\x1b[2DX".as_bytes()), "éX😀");
    assert_eq!(san(b"ab\x1b[99DX\n"), "Xb\n");
    // Past the end: erased cells, spaces once text follows, dropped at the end.
    assert_eq!(san(b"ab\x1b[3CX\n"), "ab   X\n");
    assert_eq!(san(b"ab\x1b[6GX\n"), "ab   X\n");
    assert_eq!(san(b"ab\x1b[5C\n"), "ab\n");
    assert_eq!(san(b"ab\x1b[10G"), "ab");
    assert_eq!(san(b"\x1b[4Gx\x1b[1Gy\n"), "y  x\n");
    // Only the first parameter counts; marked or intermediate forms are other sequences.
    assert_eq!(san(b"abc\x1b[2;9GX\n"), "aXc\n");
    assert_eq!(san(b"abc\x1b[?1GX\x1b[ 1DY\x1b[>CZ\n"), "abcXYZ\n");
    // Moves split across reads.
    assert_split_invariant(b"ab\x1b[12CX\x1b[3D\x1b[1Ky\x1b[G\x1b[2Kz\n", LINE_LIMIT);
    assert_split_invariant(b"ab\x1b[12CX\x1b[3D\x1b[1Ky\x1b[G\x1b[2Kz\n", 5);
}

#[test]
fn a_huge_move_right_stops_at_the_line_bound() {
    let mut s = Sanitizer::new();
    let mut out = Vec::new();
    for _ in 0..64 {
        s.feed(b"\x1b[65535C\x1b[99999999999C", &mut out);
        assert!(s.line.held().len() <= LINE_LIMIT);
        assert!(s.line.held().capacity() <= 2 * LINE_LIMIT);
    }
    assert!(out.is_empty());
    // Text after it: the blanks before the cursor are final (spaces), the text is held.
    s.feed(b"x\x1b[65535Cy\n", &mut out);
    s.finish(&mut out);
    let expected = " ".repeat(LINE_LIMIT) + "x" + &" ".repeat(65535) + "y\n";
    assert!(out == expected.as_bytes());
}

#[test]
fn csi_sequences_are_removed() {
    assert_eq!(san(b"\x1b[01;34mdir\x1b[0m\n"), "dir\n");
    assert_eq!(san(b"\x1b[38;2;255;0;0mred\x1b[m\n"), "red\n");
    assert_eq!(san(b"\x1b[?25l\x1b[2J\x1b[H\x1b[10;20Hx\x1b[5Ay\n"), "xy\n");
    assert_eq!(san(b"\x1b[1 q\x1b[>0c\x1b[4:3mz\n"), "z\n");
}

#[test]
fn string_sequences_are_removed_with_payload() {
    // OSC titles, hyperlinks and clipboard, ended by BEL or ST.
    assert_eq!(san(b"\x1b]0;window title\x07text\n"), "text\n");
    assert_eq!(san(b"\x1b]2;title\x1b\\text\n"), "text\n");
    assert_eq!(
        san(b"\x1b]8;;https://example.com/\x1b\\link\x1b]8;;\x1b\\\n"),
        "link\n"
    );
    assert_eq!(san(b"\x1b]52;c;c2VjcmV0\x07\n"), "\n");
    // DCS (sixel, tmux passthrough), SOS, PM and APC (kitty graphics).
    assert_eq!(san(b"\x1bPq#0;2;0;0;0#0!6~\x1b\\after\n"), "after\n");
    assert_eq!(san(b"\x1bPtmux;\x1b\x1b]0;x\x07\x1b\\y\n"), "y\n");
    assert_eq!(
        san(b"\x1bXsos payload\x1b\\a\x1b^pm payload\x1b\\b\n"),
        "ab\n"
    );
    assert_eq!(san(b"\x1b_Gf=100;AAAA\x1b\\img\n"), "img\n");
    // Controls inside string payloads do nothing, not even `\n`.
    assert_eq!(san(b"\x1b]0;a\nb\rc\x07d\n"), "d\n");
    assert_eq!(san(b"\x1b_x\ny\x07z\x1b\\w\n"), "w\n");
    // 0x9C ends a DCS payload (vte's 8-bit ST).
    assert_eq!(san(b"\x1bPq\x9cok\n"), "ok\n");
}

#[test]
fn can_and_sub_abort_sequences() {
    assert_eq!(san(b"\x1b[31\x18m\n"), "m\n");
    assert_eq!(san(b"\x1b]0;title\x1aok\n"), "ok\n");
    assert_eq!(san(b"\x1bPq payload\x18ok\n"), "ok\n");
    assert_eq!(san(b"\x1b\x18x\n"), "x\n");
}

#[test]
fn other_escape_sequences_are_removed() {
    assert_eq!(
        san(b"\x1b(B\x1b)0\x1b=\x1b>\x1b7\x1b8\x1b#8\x1bMx\n"),
        "x\n"
    );
    assert_eq!(san(b"a\x1b\x1bb\n"), "a\n");
    assert_eq!(san(b"a\x1b\x1b[mb\n"), "ab\n");
}

#[test]
fn controls_are_removed() {
    assert_eq!(san(b"a\x00\x01\x07\x0b\x0c\x0e\x1f\x7fb\n"), "ab\n");
    // C1 characters, as UTF-8; U+009B is not a CSI here.
    assert_eq!(
        san("a\u{85}b\u{9b}31mc\u{80}\u{9f}\n".as_bytes()),
        "ab31mc\n"
    );
    // C0 controls act inside CSI and ESC sequences, as in vte.
    assert_eq!(san(b"x\x1b[3\n1my\n"), "x\ny\n");
    assert_eq!(san(b"abc\x1b[\r1mX\n"), "Xbc\n");
    // ... and a final byte right after them ends the sequence.
    assert_eq!(san(b"abc\x1b[\rX\n"), "abc\n");
    assert_eq!(san(b"abc\x1b(\x08B\n"), "abc\n");
}

#[test]
fn invalid_utf8_matches_from_utf8_lossy() {
    let cases: &[&[u8]] = &[
        b"\xff",
        b"a\x80b",
        b"\x80\x9f\xa0",
        b"\xc0\x80",
        b"\xc1\xbf",
        b"\xe2\x82",
        b"\xe2\x82a",
        b"\xe2\x82\xe2\x82\xac",
        b"\xed\xa0\x80",
        b"\xe0\x80\xaf",
        b"\xf0\x9f\x98",
        b"\xf0\x9f\x98 ",
        b"\xf4\x90\x80\x80",
        b"\xf5\x80",
        b"\xf8\x88\x80\x80\x80",
        b"a\xc3",
        b"\xc3\x28",
    ];
    for &case in cases {
        assert_eq!(san(case), String::from_utf8_lossy(case), "{case:?}");
    }
    // An incomplete character cut off by ESC.
    assert_eq!(san(b"\xe2\x82\x1b[mx"), "\u{FFFD}x");
}

#[test]
fn two_and_three_byte_sequences_match_lossy_without_c1() {
    let expect = |b: &[u8]| -> String {
        String::from_utf8_lossy(b)
            .chars()
            .filter(|c| !('\u{80}'..='\u{9f}').contains(c))
            .collect()
    };
    let bytes: Vec<u8> = (0x80..=0xFF).chain([b'a']).collect();
    for &x in &bytes {
        for &y in &bytes {
            assert_eq!(san(&[x, y]), expect(&[x, y]));
        }
    }
    let leads = [
        0xC2, 0xC3, 0xDF, 0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF4, 0xF5,
    ];
    let conts = [0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0];
    for &x in &leads {
        for &y in &conts {
            for &z in &conts {
                for w in [0x80, b'a'] {
                    let input = [x, y, z, w];
                    assert_eq!(san(&input), expect(&input).replace('\x7f', ""));
                }
            }
        }
    }
}

#[test]
fn utf8_split_across_reads_is_kept_whole() {
    let text = "é€😀\u{85}x".as_bytes();
    for size in 1..=4 {
        let chunks: Vec<&[u8]> = text.chunks(size).collect();
        assert_eq!(run_chunks(Sanitizer::new(), &chunks), "é€😀x".as_bytes());
    }
    // Unfinished at the end of the stream: one replacement.
    assert_eq!(san(b"ab\xf0\x9f"), "ab\u{FFFD}");
}

#[test]
fn unterminated_osc_holds_no_memory() {
    let mut s = Sanitizer::new();
    let mut out = Vec::new();
    s.feed(b"before\x1b]0;", &mut out);
    let chunk = vec![b'x'; 64 * 1024];
    for _ in 0..128 {
        s.feed(&chunk, &mut out);
        assert!(out.is_empty());
        assert!(s.line.held().capacity() < 1024);
    }
    s.feed(b"\x07after\n", &mut out);
    assert_eq!(out, b"beforeafter\n");
    // Likewise for DCS and APC payloads.
    let mut s = Sanitizer::new();
    s.feed(b"\x1bP1$q", &mut out);
    for _ in 0..16 {
        s.feed(&chunk, &mut out);
    }
    s.feed(b"\x1b_", &mut out);
    for _ in 0..16 {
        s.feed(&chunk, &mut out);
    }
    assert!(s.line.held().capacity() < 1024);
}

#[test]
fn long_line_streams_out_intact() {
    let expected = "abcdefghij€".repeat(80_000);
    let line = expected.as_bytes();
    let mut s = Sanitizer::new();
    let mut out = Vec::new();
    // Feed in uneven reads; the held part never passes the bound.
    for chunk in line.chunks(4093) {
        s.feed(chunk, &mut out);
        assert!(s.line.held().len() <= LINE_LIMIT);
    }
    assert!(out.len() > line.len() - LINE_LIMIT - 4);
    s.finish(&mut out);
    assert_eq!(String::from_utf8(out).unwrap(), expected);
    // In one read too.
    assert_eq!(san(line), expected);
}

#[test]
fn long_line_cursor_moves_act_on_the_held_part() {
    // Writing the 9th byte overflows a limit of 8: the first 9 bytes are final.
    assert_eq!(san_limit(b"0123456789\rab\n", 8), b"012345678ab\n");
    assert_eq!(san_limit(b"0123456789\x1b[2K\n", 8), b"012345678\n");
    assert_eq!(san_limit(b"01234567\rab\n", 8), b"ab234567\n");
    // Moves count from the start of the held part, and stop at the bound.
    assert_eq!(san_limit(b"0123456789\x1b[1GX\n", 8), b"012345678X\n");
    assert_eq!(san_limit(b"ab\x1b[20Cx\n", 8), b"ab      x\n");
    // Overwriting with wider characters grows the bytes: the part before the cursor
    // streams, the rest stays held.
    assert_eq!(
        san_limit("abcdefgh\r€€€\rX\n".as_bytes(), 8),
        "€€Xdefgh\n".as_bytes()
    );
    for input in [
        &b"0123456789\rab\n"[..],
        "abcdefgh\r€€€\rX\n".as_bytes(),
        b"0123456789abcdefghij\x08\x08\x1b[1Kxy\nz",
        "0123456789\x1b[3G€€\x1b[20Cx\x1b[9Dy\x1b[65535Cz\n".as_bytes(),
    ] {
        assert_split_invariant(input, 8);
    }
}

#[test]
fn every_split_gives_the_same_result() {
    let inputs: &[&[u8]] = &[
        b"\x1b[01;34mdir\x1b[0m\r\nnext\x1b]0;t\x07\r\n",
        b"\x1b]8;;http://x\x1b\\l\x1b]8;;\x1b\\ \x1bPq#0\x1b\\\x1b_G;A\x1b\\z",
        b"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xc2\x85\xff\xc2\x9b",
        b"\xe2\x82\x1b[mx\xf0\x9f\x98",
        b"abcdef\x08\x08\x1b[1Kxy\rq\x1b[K\n_\x08O",
        b"abc\x1b[3\n1;2;3Kd\x1b[\x18e\x1b(Bf\x1b\x1bg",
    ];
    for input in inputs {
        assert_split_invariant(input, LINE_LIMIT);
        assert_split_invariant(input, 5);
    }
}

/// The line model written the obvious way on top of `vte::Parser`, fed one byte at a
/// time. Fed like that, vte reports a lone byte 0x80..=0x9F through `execute` and a
/// complete C1 character through `print`, which tells them apart.
struct Reference {
    cells: Vec<Option<char>>,
    cursor: usize,
    limit: usize,
    out: String,
}

impl Reference {
    fn run(input: &[u8], limit: usize) -> String {
        let mut r = Reference {
            cells: Vec::new(),
            cursor: 0,
            limit,
            out: String::new(),
        };
        let mut parser = vte::Parser::new();
        for &b in input {
            parser.advance(&mut r, &[b]);
        }
        r.store(false);
        r.out
    }

    fn put(&mut self, c: char) {
        if self.cursor == self.cells.len() {
            self.cells.push(Some(c));
        } else {
            self.cells[self.cursor] = Some(c);
        }
        self.cursor += 1;
        let held: usize = self.cells.iter().map(|c| c.map_or(1, char::len_utf8)).sum();
        if held > self.limit {
            let part: Vec<_> = self.cells.drain(..self.cursor).collect();
            self.out.extend(part.into_iter().map(|c| c.unwrap_or(' ')));
            self.cursor = 0;
        }
    }

    /// Right by `n`, past the end with erased cells, but the held bytes at most `limit`.
    fn move_right(&mut self, n: usize) {
        let target = self.cursor + n;
        if target > self.cells.len() {
            let held: usize = self.cells.iter().map(|c| c.map_or(1, char::len_utf8)).sum();
            let pad = (target - self.cells.len()).min(self.limit.saturating_sub(held));
            self.cells.resize(self.cells.len() + pad, None);
            self.cursor = self.cells.len();
        } else {
            self.cursor = target;
        }
    }

    fn store(&mut self, newline: bool) {
        while self.cells.last() == Some(&None) {
            self.cells.pop();
        }
        self.out
            .extend(self.cells.drain(..).map(|c| c.unwrap_or(' ')));
        self.cursor = 0;
        if newline {
            self.out.push('\n');
        }
    }
}

impl vte::Perform for Reference {
    fn print(&mut self, c: char) {
        if !('\u{7f}'..='\u{9f}').contains(&c) {
            self.put(c);
        }
    }

    fn execute(&mut self, b: u8) {
        match b {
            b'\n' => self.store(true),
            b'\r' => self.cursor = 0,
            0x08 => self.cursor = self.cursor.saturating_sub(1),
            b'\t' => self.put('\t'),
            0x80..=0x9F => self.put('\u{FFFD}'),
            _ => {}
        }
    }

    fn csi_dispatch(&mut self, params: &vte::Params, inter: &[u8], ignore: bool, c: char) {
        if ignore || !inter.is_empty() {
            return;
        }
        let len = self.cells.len();
        let first = params.iter().next().map_or(0, |p| p[0]);
        let n = usize::from(first.max(1));
        match (c, first) {
            ('K', 0) => self.cells.truncate(self.cursor),
            ('K', 1) => self.cells[..(self.cursor + 1).min(len)].fill(None),
            ('K', 2) => self.cells.fill(None),
            ('G' | '`', _) => {
                self.cursor = 0;
                self.move_right(n - 1);
            }
            ('C', _) => self.move_right(n),
            ('D', _) => self.cursor = self.cursor.saturating_sub(n),
            _ => {}
        }
    }
}

const TOKENS: &[&[u8]] = &[
    b"a",
    b"b",
    b"Z",
    b" ",
    b"0",
    b"1",
    b"2",
    b";",
    b":",
    b"?",
    b"K",
    b"m",
    b"(",
    b"P",
    b"X",
    b"^",
    b"_",
    b"]",
    b"[",
    b"\\",
    b"\n",
    b"\r",
    b"\t",
    b"\x08",
    b"\x1b",
    b"\x1b",
    b"\x1b[",
    b"\x1b]",
    b"\x1b[1K",
    b"\x1b[2K",
    b"\x1b[K",
    b"\x1b[31m",
    b"G",
    b"C",
    b"D",
    b"`",
    b"\x1b[G",
    b"\x1b[1G",
    b"\x1b[4G",
    b"\x1b[3`",
    b"\x1b[C",
    b"\x1b[0C",
    b"\x1b[3C",
    b"\x1b[9C",
    b"\x1b[D",
    b"\x1b[2D",
    b"\x1b[65535C",
    b"\x07",
    b"\x18",
    b"\x1a",
    b"\x7f",
    b"\x00",
    b"\x0c",
    "é".as_bytes(),
    "€".as_bytes(),
    "😀".as_bytes(),
    "\u{85}".as_bytes(),
    "\u{9c}".as_bytes(),
    "Ŝ".as_bytes(),
    "✓".as_bytes(),
    b"\x9c",
    b"\x85",
    b"\xff",
    b"\xe2",
    b"\xe2\x82",
    b"\xf0\x9f",
    b"\xc0",
    b"\xed\xa0",
];

const INTRODUCERS: &[&[u8]] = &[
    b"\x1b[", b"\x1b]", b"\x1bP", b"\x1bX", b"\x1b^", b"\x1b_", b"\x1b(", b"\x1b\\", b"\x1b",
];

/// Inputs rich in sequence introducers, parameter, intermediate and final bytes,
/// terminators, controls and (broken) UTF-8.
fn token_input() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        4 => prop::sample::select(TOKENS).prop_map(<[u8]>::to_vec),
        2 => prop::sample::select(INTRODUCERS).prop_map(<[u8]>::to_vec),
        2 => (0x20u8..=0x7E).prop_map(|b| vec![b]),
        1 => any::<u8>().prop_map(|b| vec![b]),
    ];
    prop::collection::vec(token, 0..64).prop_map(|t| t.concat())
}

fn chunked(input: &[u8], sizes: &[usize]) -> Vec<Vec<u8>> {
    let mut chunks = Vec::new();
    let mut rest = input;
    for &n in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (a, b) = rest.split_at(n.min(rest.len()));
        chunks.push(a.to_vec());
        rest = b;
    }
    chunks
}

proptest! {
    // Cheap and the strongest check of the state machine: more cases than the rest.
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn agrees_with_vte_reference(input in token_input(), limit in prop::sample::select(vec![6usize, 9, 64])) {
        // A final newline settles an unfinished character the same way in both.
        let mut input = input;
        input.push(b'\n');
        let ours = String::from_utf8(san_limit(&input, limit)).unwrap();
        prop_assert_eq!(ours, Reference::run(&input, limit));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn chunking_does_not_matter(input in token_input(), sizes in prop::collection::vec(1usize..12, 1..8), limit in prop::sample::select(vec![6usize, 64])) {
        let whole = san_limit(&input, limit);
        let chunks = chunked(&input, &sizes);
        let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
        prop_assert_eq!(run_chunks(Sanitizer::with_line_limit(limit), &refs), whole);
    }

    #[test]
    fn output_is_clean_utf8(input in prop::collection::vec(any::<u8>(), 0..256), tokens in token_input()) {
        for input in [input, tokens] {
            let out = san_limit(&input, 16);
            let text = String::from_utf8(out).expect("valid UTF-8");
            prop_assert!(text.chars().all(|c| c == '\n' || c == '\t'
                || !(c.is_control())), "{:?}", text);
        }
    }
}

/// Pieces of colour-heavy terminal output: SGR sequences between short runs of text, with
/// the controls, erases, moves and (broken) UTF-8 that the fast paths must get right too.
fn colour_piece() -> impl Strategy<Value = Vec<u8>> {
    const SEQUENCES: &[&[u8]] = &[
        b"\x1b[m",
        b"\x1b[0m",
        b"\x1b[32m",
        b"\x1b[1;33m",
        b"\x1b[01;34m",
        b"\x1b[38;5;208m",
        b"\x1b[38;2;255;255;255m",
        b"\x1b[0;1;2;3;4;5;6;7;8;9;10;11m",
        b"\x1b[?25l",
        b"\x1b[>0c",
        b"\x1b[4:3m",
        b"\x1b[K",
        b"\x1b[0K",
        b"\x1b[00K",
        b"\x1b[1K",
        b"\x1b[2K",
        b"\x1b[0;5K",
        b"\x1b[?K",
        b"\x1b[G",
        b"\x1b[5G",
        b"\x1b[3`",
        b"\x1b[C",
        b"\x1b[4C",
        b"\x1b[D",
        b"\x1b[2D",
        b"\x1b[ m",
        b"\x1b[3\x7fm",
        b"\x1b[3\nm",
        b"\x1b[",
        b"\x1b",
        b"\x1b]0;title\x07",
        b"\x1b]8;;http://x\x1b\\",
        b"\x1b(B",
        b"\r",
        b"\r\n",
        b"\n",
        b"\n\n",
        b"\t",
        b"\x08",
        b"\x07",
        b"\x00",
        b"\x18",
        b"\x7f",
        "é".as_bytes(),
        "€uro".as_bytes(),
        "😀".as_bytes(),
        "\u{85}".as_bytes(),
        b"\xe2\x82",
        b"\xf0\x9f\x98",
        b"\xac",
        b"\xff",
        b"\xc2\x9b",
    ];
    prop_oneof![
        6 => prop::sample::select(SEQUENCES).prop_map(<[u8]>::to_vec),
        1 => (0usize..80, prop::sample::select(b"mKGC".to_vec()))
            .prop_map(|(n, fin)| [&b"\x1b["[..], &b"1;".repeat(n), &[fin]].concat()),
        4 => (0usize..24, any::<u8>()).prop_map(|(n, c)| vec![b'a' + c % 26; n]),
        1 => (24usize..200).prop_map(|n| (0..n).map(|k| b' ' + (k % 95) as u8).collect()),
    ]
}

fn colour_input() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(colour_piece(), 0..300).prop_map(|p| p.concat())
}

/// The sanitizer with every byte through the state machine alone.
fn run_bytewise(input: &[u8], limit: usize) -> Vec<u8> {
    let mut s = Sanitizer::with_line_limit(limit);
    let mut out = Vec::new();
    s.feed_bytewise(input, &mut out);
    s.finish(&mut out);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn fast_paths_agree_with_the_state_machine(
        input in colour_input(),
        sizes in prop::collection::vec(prop_oneof![1usize..8, 8usize..200, 200usize..5000], 1..6),
        limit in prop::sample::select(vec![5usize, 17, 64, 300, LINE_LIMIT]),
    ) {
        let expected = run_bytewise(&input, limit);
        prop_assert_eq!(&san_limit(&input, limit), &expected);
        let chunks = chunked(&input, &sizes);
        let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
        prop_assert_eq!(&run_chunks(Sanitizer::with_line_limit(limit), &refs), &expected);
        // The held part never passes the bound.
        let mut s = Sanitizer::with_line_limit(limit);
        let mut out = Vec::new();
        for c in &refs {
            s.feed(c, &mut out);
            prop_assert!(s.line.held().len() <= limit);
        }
    }
}

#[test]
fn recordings_agree_with_the_state_machine() {
    let recordings: &[&[u8]] = &[
        include_bytes!("../../../tests/data/corpus/git-log-color.raw"),
        include_bytes!("../../../tests/data/corpus/ls-color.raw"),
        include_bytes!("../../../tests/data/corpus/grep-color.raw"),
        include_bytes!("../../../tests/data/corpus/man-ls-overstrike.raw"),
        include_bytes!("../../../tests/data/corpus/cargo-build-tty.raw"),
        include_bytes!("../../../tests/data/corpus/vim-edit-session.raw"),
    ];
    for (n, &recording) in recordings.iter().enumerate() {
        // As the benchmark repeats it.
        let input = recording.repeat(2);
        for limit in [40, 300, LINE_LIMIT] {
            let expected = run_bytewise(&input, limit);
            for size in [1, 7, 100, 4093, 65_536] {
                let chunks: Vec<&[u8]> = input.chunks(size).collect();
                let ours = run_chunks(Sanitizer::with_line_limit(limit), &chunks);
                assert!(
                    ours == expected,
                    "recording {n}, limit {limit}, reads of {size}"
                );
            }
        }
    }
}
