//! The sanitizer never stores ESC, C0 (but `\n`, `\t`), DEL or C1, always yields UTF-8,
//! gives the same result however the input is split into reads, and holds a bounded line.
//!
//! The first byte picks the read size; if its high bit is set, every later byte picks a
//! token (the horizontal moves, erase-in-line, huge counts, introducers, text) instead of
//! standing for itself, so short inputs reach deep into the line model.
#![no_main]
use gitterm_agent::text::sanitize::Sanitizer;
use libfuzzer_sys::fuzz_target;

const TOKENS: &[&[u8]] = &[
    b"\x1b[G", b"\x1b[1G", b"\x1b[7G", b"\x1b[0`", b"\x1b[40`", b"\x1b[C", b"\x1b[3C",
    b"\x1b[65535C", b"\x1b[99999999C", b"\x1b[D", b"\x1b[5D", b"\x1b[65535D", b"\x1b[2;3G",
    b"\x1b[?5C", b"\x1b[ D", b"\x1b[K", b"\x1b[1K", b"\x1b[2K", b"\x1b[31m", b"\x1b]0;t\x07",
    b"\x1b]8;;u\x1b\\", b"\x1bP", b"\x1b", b"\x1b[", b"\r", b"\n", b"\x08", b"\t", b"a",
    b"xyz", "é".as_bytes(), "€".as_bytes(), "😀".as_bytes(), b"\xe2\x82", b"\xff", b"\x18",
];

fn sanitize<'a>(chunks: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut s = Sanitizer::new();
    for chunk in chunks {
        s.feed(chunk, &mut out);
    }
    s.finish(&mut out);
    out
}

fuzz_target!(|data: &[u8]| {
    let (first, rest) = match data.split_first() {
        Some((s, rest)) => (*s, rest),
        None => return,
    };
    let split = usize::from(first & 0x7F) + 1;
    let input: Vec<u8> = if first & 0x80 != 0 {
        rest.iter()
            .flat_map(|&b| TOKENS[usize::from(b) % TOKENS.len()].iter().copied())
            .collect()
    } else {
        rest.to_vec()
    };
    let one = sanitize(std::iter::once(input.as_slice()));
    let text = std::str::from_utf8(&one).expect("sanitized output is UTF-8");
    for c in text.chars() {
        let bad = (c < ' ' && c != '\n' && c != '\t') || c == '\u{7f}' || ('\u{80}'..='\u{9f}').contains(&c);
        assert!(!bad, "control {c:?} survived");
    }
    // Moves never write more than the input asks for: blanks come only from moves right,
    // at most the line bound per move, so the output stays within that of the input.
    assert!(one.len() <= (input.len() + 1) * (64 * 1024 + 4), "output grew beyond bound");
    let chunked = sanitize(input.chunks(split));
    assert_eq!(one, chunked, "chunking changed the result");
});
