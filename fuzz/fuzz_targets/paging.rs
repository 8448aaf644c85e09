//! Output pages always start and end on character boundaries and reassemble the log.
#![no_main]
use gitterm_agent::text::utf8::utf8_window;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((limit, text)) = data.split_first() else { return };
    let limit = *limit as usize + 1;
    let log = String::from_utf8_lossy(text).into_owned();
    let bytes = log.as_bytes();
    let mut off = 0;
    let mut joined = Vec::new();
    while off < bytes.len() {
        let (skip, take) = utf8_window(&bytes[off..], limit);
        assert_eq!(skip, 0, "pages from a page end start on a boundary");
        assert!(take > 0, "a page always makes progress");
        let page = &bytes[off..off + take];
        assert!(std::str::from_utf8(page).is_ok());
        assert!(take <= limit.max(4));
        joined.extend_from_slice(page);
        off += take;
    }
    assert_eq!(joined, bytes);
});
