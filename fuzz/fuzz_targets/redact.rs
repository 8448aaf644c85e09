//! No secret survives the redactor, in any of the forms programs print it (percent- and
//! JSON-escaped as common encoders write them, base64, base64 broken across lines), for
//! any split of the input into writes; and clean input passes through unchanged.
#![no_main]
use gitterm_agent::text::redact::Redactor;
use libfuzzer_sys::fuzz_target;

const MARKER: &[u8] = b"[redacted]";

/// Percent-encoding; bytes in `keep` (and unreserved ones) stay, a space is `+` if `plus`.
fn percent(value: &[u8], keep: &[u8], plus: bool, lower: bool) -> Vec<u8> {
    let hex: &[u8; 16] = if lower { b"0123456789abcdef" } else { b"0123456789ABCDEF" };
    let mut out = Vec::new();
    for &b in value {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || keep.contains(&b) {
            out.push(b);
        } else if plus && b == b' ' {
            out.push(b'+');
        } else {
            out.extend_from_slice(&[b'%', hex[usize::from(b >> 4)], hex[usize::from(b & 15)]]);
        }
    }
    out
}

/// A JSON string body: `\u` for controls and the characters `escape` picks, in `upper` or
/// lower-case hex; `\/` if `slash`.
fn json(value: &str, escape: fn(char) -> bool, slash: bool, upper: bool) -> Vec<u8> {
    let mut out = String::new();
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '/' if slash => out.push_str("\\/"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c < ' ' || escape(c) => {
                for w in c.encode_utf16(&mut [0; 2]) {
                    if upper {
                        out.push_str(&format!("\\u{w:04X}"));
                    } else {
                        out.push_str(&format!("\\u{w:04x}"));
                    }
                }
            }
            c => out.push(c),
        }
    }
    out.into_bytes()
}

fn base64(bytes: &[u8], alphabet: &[u8; 64]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in bytes.chunks(3) {
        let n = u32::from(c[0]) << 16
            | u32::from(*c.get(1).unwrap_or(&0)) << 8
            | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..=c.len() {
            out.push(alphabet[(n >> (18 - 6 * k) & 63) as usize]);
        }
    }
    out
}

/// The forms of `secret` that must not survive.
fn forms(secret: &[u8]) -> Vec<Vec<u8>> {
    let mut forms = vec![
        secret.to_vec(),
        percent(secret, b"/", false, false),
        percent(secret, b"", true, false),
        percent(secret, b"", false, true),
        percent(secret, b"!'()*", false, false),
    ];
    if let Ok(s) = std::str::from_utf8(secret) {
        forms.push(json(s, |_| false, false, false));
        forms.push(json(s, |c| !c.is_ascii(), false, false));
        forms.push(json(s, |c| "<>&\u{2028}\u{2029}".contains(c), false, false));
        forms.push(json(s, |c| "<>&='\u{2028}\u{2029}".contains(c), false, false));
        forms.push(json(s, |c| !c.is_ascii(), true, false));
        forms.push(json(s, |c| !c.is_ascii() || "'+<>&`".contains(c), false, true));
    }
    for alphabet in [
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_",
    ] {
        for pad in 0..3 {
            let blob = [&[0, 0][..pad], secret].concat();
            let enc = base64(&blob, alphabet);
            let core = &enc[(8 * pad).div_ceil(6)..8 * (pad + secret.len()) / 6];
            if core.len() < 8 {
                continue;
            }
            forms.push(core.to_vec());
            if core.len() >= 64 {
                // Broken by a line break, with one line holding 32 characters of it.
                for k in 1..core.len() {
                    if k >= 32 || core.len() - k >= 32 {
                        forms.push([&core[..k], b"\n", &core[k..]].concat());
                        forms.push([&core[..k], b"\r\n", &core[k..]].concat());
                    }
                }
            }
        }
    }
    forms
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    // First byte: chunk size; second: secret length; then the secret, then the text.
    let split = data[0] as usize + 1;
    let len = (data[1] as usize % 80) + 4;
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
    // No occurrence of any form may lie wholly outside the `[redacted]` markers. (A value
    // that begins with `]` or ends with `[` can be spelled across a marker and the text
    // beside it; every byte of the original occurrence is still covered.) A broken form
    // survives as a marker per line; its line break is not part of it.
    let markers: Vec<usize> = (0..out.len().saturating_sub(MARKER.len() - 1))
        .filter(|&i| &out[i..i + MARKER.len()] == MARKER)
        .collect();
    for form in forms(secret) {
        let n = form.len();
        for at in (0..out.len().saturating_sub(n - 1)).filter(|&i| out[i..i + n] == form[..]) {
            let overlaps = markers.iter().any(|&m| m < at + n && at < m + MARKER.len());
            assert!(overlaps, "{:?} survived at {at}", String::from_utf8_lossy(&form));
        }
    }
    if !text.windows(secret.len()).any(|w| w == secret) && !text.is_empty() {
        // Encoded forms may still be masked; but output never grows without a match.
        assert!(out.len() <= text.len() + 10 * (out.len() / 10 + 1));
    }
});
