//! The sanitizer never stores ESC, C0 (but `\n`, `\t`), DEL or C1, always yields UTF-8,
//! and gives the same result however the input is split into reads.
#![no_main]
use gitterm_agent::text::sanitize::Sanitizer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (split, input) = match data.split_first() {
        Some((s, rest)) => (*s as usize + 1, rest),
        None => return,
    };
    let mut one = Vec::new();
    let mut s = Sanitizer::new();
    s.feed(input, &mut one);
    s.finish(&mut one);
    let text = std::str::from_utf8(&one).expect("sanitized output is UTF-8");
    for c in text.chars() {
        let bad = (c < ' ' && c != '\n' && c != '\t') || c == '\u{7f}' || ('\u{80}'..='\u{9f}').contains(&c);
        assert!(!bad, "control {c:?} survived");
    }
    let mut chunked = Vec::new();
    let mut s = Sanitizer::new();
    for chunk in input.chunks(split) {
        s.feed(chunk, &mut chunked);
    }
    s.finish(&mut chunked);
    assert_eq!(one, chunked, "chunking changed the result");
});
