//! The redactor against an oracle that states the rule again the plain way (every spelling
//! as a string, every start position, a search over the units), against encoders written
//! again here, and against test vectors from real encoders (`testdata/encodings.py`).

use super::*;
use proptest::prelude::*;
use std::collections::BTreeSet;

fn run(secrets: &[&[u8]], chunks: &[&[u8]]) -> Vec<u8> {
    let mut r = Redactor::new(secrets);
    let mut out = Vec::new();
    for c in chunks {
        r.feed(c, &mut out);
    }
    r.finish(&mut out);
    out
}

fn red(secrets: &[&str], input: &str) -> String {
    let secrets: Vec<&[u8]> = secrets.iter().map(|s| s.as_bytes()).collect();
    String::from_utf8(run(&secrets, &[input.as_bytes()])).unwrap()
}

/// `input` fed in pieces of the given sizes, taken in turn.
fn run_sized(secrets: &[&[u8]], input: &[u8], sizes: &[usize]) -> Vec<u8> {
    let mut chunks = Vec::new();
    let mut rest = input;
    for &n in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (a, b) = rest.split_at(n.clamp(1, rest.len()));
        chunks.push(a);
        rest = b;
    }
    run(secrets, &chunks)
}

/// Whether `needle` occurs in `out` somewhere that does not overlap a marker.
fn survives(out: &[u8], needle: &[u8]) -> bool {
    let markers: Vec<usize> = (0..out.len().saturating_sub(MARKER.len() - 1))
        .filter(|&i| out[i..].starts_with(MARKER))
        .collect();
    (0..out.len().saturating_sub(needle.len().saturating_sub(1)))
        .filter(|&i| !needle.is_empty() && out[i..].starts_with(needle))
        .any(|at| {
            !markers
                .iter()
                .any(|&m| m < at + needle.len() && at < m + MARKER.len())
        })
}

// ---- the oracle ---------------------------------------------------------------------------

/// Every case of the hex digits in `s` (which is all upper-case).
fn cases(s: &str) -> Vec<Vec<u8>> {
    let mut all = vec![Vec::new()];
    for b in s.bytes() {
        let options = if (b'A'..=b'F').contains(&b) {
            vec![b, b.to_ascii_lowercase()]
        } else {
            vec![b]
        };
        all = all
            .iter()
            .flat_map(|p| {
                options.iter().map(move |&o| {
                    let mut p = p.clone();
                    p.push(o);
                    p
                })
            })
            .collect();
    }
    all
}

/// Every string a character (`bytes`, and `c` unless they are not UTF-8) may be written
/// as: the rule of the module doc, written out.
fn oracle_spellings(bytes: &[u8], c: Option<char>) -> Vec<Vec<u8>> {
    let mut out = vec![bytes.to_vec()];
    if let [b] = bytes
        && (b.is_ascii_alphanumeric() || b"-._".contains(b))
    {
        return out;
    }
    let pct: String = bytes.iter().map(|b| format!("%{b:02X}")).collect();
    out.extend(cases(&pct));
    if bytes == b" " {
        out.push(b"+".to_vec());
    }
    if let Some(c) = c {
        let short = match c {
            '"' => "\\\"",
            '\\' => "\\\\",
            '/' => "\\/",
            '\u{8}' => "\\b",
            '\u{c}' => "\\f",
            '\n' => "\\n",
            '\r' => "\\r",
            '\t' => "\\t",
            _ => "",
        };
        if !short.is_empty() {
            out.push(short.as_bytes().to_vec());
        }
        let u: String = c
            .encode_utf16(&mut [0; 2])
            .iter()
            .map(|w| format!("\\u{w:04X}"))
            .collect();
        out.extend(cases(&u));
    }
    out
}

struct OraclePattern {
    units: Vec<Vec<Vec<u8>>>,
    wraps: bool,
}

fn oracle_pattern(text: &[u8], wraps: bool) -> OraclePattern {
    let mut units = Vec::new();
    for chunk in text.utf8_chunks() {
        for c in chunk.valid().chars() {
            units.push(oracle_spellings(c.to_string().as_bytes(), Some(c)));
        }
        for &b in chunk.invalid() {
            units.push(oracle_spellings(&[b], None));
        }
    }
    OraclePattern { units, wraps }
}

/// Base64 with padding, six bits at a time.
fn b64(bytes: &[u8], url: bool) -> String {
    let alphabet: Vec<char> = if url {
        ('A'..='Z')
            .chain('a'..='z')
            .chain('0'..='9')
            .chain(['-', '_'])
            .collect()
    } else {
        ('A'..='Z')
            .chain('a'..='z')
            .chain('0'..='9')
            .chain(['+', '/'])
            .collect()
    };
    let mut bits: Vec<bool> = bytes
        .iter()
        .flat_map(|b| (0..8).rev().map(move |i| b >> i & 1 == 1))
        .collect();
    while !bits.len().is_multiple_of(6) {
        bits.push(false);
    }
    let mut s: String = bits
        .chunks(6)
        .map(|c| alphabet[c.iter().fold(0, |n, &b| n * 2 + usize::from(b))])
        .collect();
    while !s.len().is_multiple_of(4) {
        s.push('=');
    }
    s
}

/// The characters of `b64(blob)` whose bits all lie in `blob[at..at + len]`.
fn core_range(at: usize, len: usize) -> (usize, usize) {
    ((8 * at).div_ceil(6), 8 * (at + len) / 6)
}

fn oracle_patterns(secrets: &[&[u8]]) -> Vec<OraclePattern> {
    let mut pats = Vec::new();
    for &s in secrets.iter().filter(|s| s.len() >= MIN_SECRET_LEN) {
        pats.push(oracle_pattern(s, false));
        for pad in 0..3 {
            for url in [false, true] {
                let mut blob = vec![0; pad];
                blob.extend_from_slice(s);
                let (a, b) = core_range(pad, s.len());
                let enc = b64(&blob, url);
                let core = &enc.as_bytes()[a..b];
                if core.len() >= MIN_BASE64_CORE {
                    pats.push(oracle_pattern(core, core.len() >= 64));
                }
            }
        }
    }
    pats
}

/// Where occurrences of `p` that start at `at` can end, reached from unit `w` at `pos`.
fn oracle_ends(
    p: &OraclePattern,
    hay: &[u8],
    w: usize,
    pos: usize,
    seen: &mut BTreeSet<(usize, usize)>,
    ends: &mut BTreeSet<usize>,
) {
    if !seen.insert((w, pos)) {
        return;
    }
    if w == p.units.len() {
        ends.insert(pos);
        return;
    }
    let mut from = vec![pos];
    if p.wraps && w > 0 {
        if hay[pos..].starts_with(b"\n") {
            from.push(pos + 1);
        }
        if hay[pos..].starts_with(b"\r\n") {
            from.push(pos + 2);
        }
    }
    for q in from {
        for sp in &p.units[w] {
            if hay[q..].starts_with(sp) {
                oracle_ends(p, hay, w + 1, q + sp.len(), seen, ends);
            }
        }
    }
}

/// Marks every byte of every occurrence the slow way (line breaks of wrapped ones apart,
/// and only where one of their lines holds 32 bytes), then masks each covered run.
fn oracle(secrets: &[&[u8]], hay: &[u8]) -> (Vec<u8>, usize) {
    let mut covered = vec![false; hay.len()];
    for p in oracle_patterns(secrets) {
        for start in 0..hay.len() {
            let mut ends = BTreeSet::new();
            oracle_ends(&p, hay, 0, start, &mut BTreeSet::new(), &mut ends);
            for end in ends {
                let mut lines = Vec::new();
                let mut from = start;
                for i in start..end {
                    if hay[i] == b'\n' {
                        let cut = if i > from && hay[i - 1] == b'\r' {
                            i - 1
                        } else {
                            i
                        };
                        lines.push((from, cut));
                        from = i + 1;
                    }
                }
                lines.push((from, end));
                if lines.len() > 1 && lines.iter().all(|&(a, b)| b - a < 32) {
                    continue;
                }
                for (a, b) in lines {
                    covered[a..b].fill(true);
                }
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

// ---- encoders, written again ----------------------------------------------------------

#[derive(Clone, Copy)]
enum Hex {
    Upper,
    Lower,
    /// Alternating, digit by digit.
    Mixed,
}

/// Percent-encoding: bytes `keep` allows stay, a space becomes `+` if `plus`.
fn percent(value: &[u8], keep: &[u8], plus: bool, hex: Hex) -> Vec<u8> {
    let mut out = Vec::new();
    let mut flip = false;
    for &b in value {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || keep.contains(&b) {
            out.push(b);
        } else if plus && b == b' ' {
            out.push(b'+');
        } else {
            out.push(b'%');
            for d in format!("{b:02X}").bytes() {
                let lower = match hex {
                    Hex::Upper => false,
                    Hex::Lower => true,
                    Hex::Mixed => {
                        flip = !flip;
                        flip
                    }
                };
                out.push(if lower { d.to_ascii_lowercase() } else { d });
            }
        }
    }
    out
}

/// JSON string bodies as libraries write them.
#[derive(Clone, Copy)]
enum Json {
    /// serde_json, Python with `ensure_ascii=False`, JavaScript.
    Plain,
    /// Python's default: non-ASCII as `\u` (lower-case hex).
    Python,
    /// Go's `json.Marshal`: `<`, `>`, `&`, U+2028, U+2029 as `\u`.
    Go,
    /// Gson: Go's, and `=` and `'`.
    Gson,
    /// PHP's `json_encode`: `\/`, and non-ASCII as `\u`.
    Php,
    /// Non-ASCII and HTML-sensitive characters as `\u` in upper-case hex.
    Upper,
}

fn json(value: &str, style: Json) -> Vec<u8> {
    let mut out = String::new();
    for c in value.chars() {
        let short = match c {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '/' if matches!(style, Json::Php) => Some("\\/"),
            '\u{8}' => Some("\\b"),
            '\u{c}' => Some("\\f"),
            '\n' => Some("\\n"),
            '\r' => Some("\\r"),
            '\t' => Some("\\t"),
            _ => None,
        };
        let escape = match style {
            Json::Plain => c < ' ',
            Json::Python | Json::Php => c < ' ' || !c.is_ascii(),
            Json::Go => c < ' ' || "<>&\u{2028}\u{2029}".contains(c),
            Json::Gson => c < ' ' || "<>&='\u{2028}\u{2029}".contains(c),
            Json::Upper => c < ' ' || !c.is_ascii() || "\"'+<>&`".contains(c),
        };
        if let Some(s) = short.filter(|_| !(matches!(style, Json::Upper) && c == '"')) {
            out.push_str(s);
        } else if escape {
            for w in c.encode_utf16(&mut [0; 2]) {
                if matches!(style, Json::Upper) {
                    out.push_str(&format!("\\u{w:04X}"));
                } else {
                    out.push_str(&format!("\\u{w:04x}"));
                }
            }
        } else {
            out.push(c);
        }
    }
    out.into_bytes()
}

/// `s` cut into lines of `width`, each ended by `eol`.
fn wrapped(s: &str, width: usize, eol: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    chars
        .chunks(width)
        .map(|l| l.iter().collect::<String>() + eol)
        .collect()
}

/// The escaped forms of a secret: the whole of each is replaced.
fn escaped_forms(secret: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let mut forms = vec![
        ("raw", secret.to_vec()),
        ("quote", percent(secret, b"/", false, Hex::Upper)),
        ("quote-all", percent(secret, b"", false, Hex::Upper)),
        ("quote_plus", percent(secret, b"", true, Hex::Upper)),
        ("lower", percent(secret, b"", false, Hex::Lower)),
        ("mixed", percent(secret, b"/", true, Hex::Mixed)),
        (
            "encodeURIComponent",
            percent(secret, b"!'()*", false, Hex::Upper),
        ),
    ];
    if let Ok(s) = std::str::from_utf8(secret) {
        for (name, style) in [
            ("json", Json::Plain),
            ("python", Json::Python),
            ("go", Json::Go),
            ("gson", Json::Gson),
            ("php", Json::Php),
            ("upper", Json::Upper),
        ] {
            forms.push((name, json(s, style)));
        }
    }
    forms
}

/// Base64 forms of `blob`, in which the secret is at `at`: the text, and the secret's core
/// as that text spells it (if it is long enough to be searched).
fn base64_forms(blob: &[u8], at: usize, len: usize) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    let (a, b) = core_range(at, len);
    let searched = b - a >= MIN_BASE64_CORE;
    let mut forms = Vec::new();
    for url in [false, true] {
        let e = b64(blob, url);
        let core = &e[a..b];
        forms.push((
            e.clone().into_bytes(),
            searched.then(|| core.as_bytes().to_vec()),
        ));
        if !url {
            let php = |s: &str| json(s, Json::Php);
            let gson = |s: &str| json(s, Json::Gson);
            let quote = |s: &str| percent(s.as_bytes(), b"", true, Hex::Upper);
            for f in [php, gson, quote] {
                forms.push((f(&e), searched.then(|| f(core))));
            }
        }
    }
    forms
}

/// `b64(blob)` wrapped at `width`, and the same with each line's part of the core masked:
/// a core of 64 characters or more wherever it falls, a shorter one where no break cuts it.
fn wrapped_form(blob: &[u8], at: usize, len: usize, width: usize, eol: &str) -> (String, String) {
    let (c0, c1) = core_range(at, len);
    let masked = c1 - c0 >= 64 || (c1 - c0 >= MIN_BASE64_CORE && c0 / width == (c1 - 1) / width);
    let e = b64(blob, false);
    let mut text = String::new();
    let mut expected = String::new();
    for (i, line) in e.as_bytes().chunks(width).enumerate() {
        let (a, b) = (i * width, i * width + line.len());
        text.push_str(&e[a..b]);
        let (lo, hi) = (a.max(c0), b.min(c1));
        if masked && lo < hi {
            expected.push_str(&e[a..lo]);
            expected.push_str("[redacted]");
            expected.push_str(&e[hi..b]);
        } else {
            expected.push_str(&e[a..b]);
        }
        text.push_str(eol);
        expected.push_str(eol);
    }
    (text, expected)
}

// ---- examples -------------------------------------------------------------------------

#[test]
fn a_value_beginning_with_the_markers_end_can_be_spelled_across_it() {
    // Found by fuzzing: `]\\\` (a `]` and three backslashes) and its JSON form (six)
    // merge into one region; the marker's own `]` then meets the backslashes that
    // followed. Every byte of every occurrence is covered; what reads like the value
    // straddles the marker, which the contract fixes as `[redacted]`.
    let out = red(&["]\\\\\\"], "]\\\\\\\\\\\\\\\\\\\\");
    assert_eq!(out, "[redacted]\\\\\\\\");
    assert!(!survives(out.as_bytes(), "]\\\\\\".as_bytes()));
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
    let out = run(&[b"aaaaaaab"], &[b"xaaaaaaa", b"ab"]);
    assert_eq!(out, b"xa[redacted]");
    for i in 0..=10 {
        let (a, b) = b"xaaaaaaaab".split_at(i);
        assert_eq!(run(&[b"aaaaaaab"], &[a, b]), b"xa[redacted]");
    }
}

#[test]
fn adjacency_across_writes_still_merges() {
    let input = b"--secretsecret--";
    for i in 0..=input.len() {
        let (a, b) = input.split_at(i);
        assert_eq!(
            run(&[b"secret"], &[a, b]),
            b"--[redacted]--",
            "split at {i}"
        );
    }
}

#[test]
fn each_encoding_of_the_issue_is_masked() {
    let cases: &[(&str, &str)] = &[
        // Python's quote() keeps `/`; quote_plus() writes a space as `+`.
        ("a/b c+d&e", "a/b%20c%2Bd%26e"),
        ("a/b c+d&e", "a%2Fb+c%2Bd%26e"),
        // Both cases of hex in one value, even in one escape.
        ("a/b/c/d=", "a%2fb%2Fc%2Fd%3d"),
        ("tøk/en", "t%c3%B8k%2Fen"),
        // Go and Gson's HTML-safe escapes; on a base64 value's padding.
        ("a&b<c>d", "a\\u0026b\\u003cc\\u003ed"),
        ("c2VjcmV0X3Rva2VuMQ==", "c2VjcmV0X3Rva2VuMQ\\u003d\\u003d"),
        ("it's=ok", "it\\u0027s\\u003dok"),
        ("line\u{2028}sep", "line\\u2028sep"),
        // PHP's json_encode: `\/` together with `\u00e4`; upper-case `\u00E4`.
        ("k/ä/€/😀", "k\\/\\u00e4\\/\\u20ac\\/\\ud83d\\ude00"),
        ("k/ä/€/😀", "k/\\u00E4/\\u20AC/\\uD83D\\uDE00"),
        // The forms masked before: base64, full percent-encoding, three JSON variants.
        ("p@ss/w0rd", "cEBzcy93MHJk"),
        ("p@ss/w0rd", "p%40ss%2Fw0rd"),
        ("say \"hi\"\\", "say \\\"hi\\\"\\\\"),
    ];
    for &(secret, form) in cases {
        let out = red(&[secret], &format!("token: {form} end\n"));
        assert_eq!(out, "token: [redacted] end\n", "{secret:?} as {form:?}");
    }
}

#[test]
fn wrapped_base64_is_masked_line_by_line() {
    // 57 bytes: exactly one line of 76, so at an offset the value is broken across two.
    let secret = "a 57-byte secret value, as long as one base64 line: ok!!?";
    assert_eq!(secret.len(), 57);
    for (width, eol) in [(76, "\n"), (64, "\n"), (76, "\r\n")] {
        for pre in 0..4 {
            let blob = [&b"\x00\x01\x02"[..pre], secret.as_bytes()].concat();
            let (text, expected) = wrapped_form(&blob, pre, secret.len(), width, eol);
            let input = format!("-----BEGIN-----\n{text}-----END-----\n");
            let out = red(&[secret], &input);
            assert_eq!(out, format!("-----BEGIN-----\n{expected}-----END-----\n"));
        }
    }
    // Each line its own marker, breaks kept.
    let blob = [b"\x00".as_slice(), secret.as_bytes()].concat();
    let text = wrapped(&b64(&blob, false), 76, "\n");
    assert_eq!(red(&[secret], &text), "AG[redacted]\n[redacted]w==\n");
}

#[test]
fn wrapped_base64_split_anywhere_is_masked_the_same() {
    // The redactor's boundary falls on every byte of the blob in turn, with the breaks at
    // every place in the value: lines found with the occurrence but past the boundary are
    // masked in the next step, and a first line too short to be seen does not hide the
    // occurrence when the boundary falls right after its start.
    let secret = "a 57-byte secret value, as long as one base64 line: ok!!?";
    let mut r = Redactor::new(&[secret.as_bytes()]);
    for pre in 0..48 {
        // Probes fall at another phase for each offset.
        let filler = "x".repeat(300 + pre);
        let blob = [&[0x5a; 48][..pre], secret.as_bytes()].concat();
        let (text, expected) = wrapped_form(&blob, pre, secret.len(), 64, "\r\n");
        let input = format!("{filler}\n{text}{filler}");
        let whole = format!("{filler}\n{expected}{filler}");
        for i in 0..=input.len() {
            let (a, b) = input.as_bytes().split_at(i);
            let mut out = Vec::new();
            r.feed(a, &mut out);
            r.feed(b, &mut out);
            r.finish(&mut out);
            assert_eq!(
                String::from_utf8_lossy(&out),
                whole,
                "offset {pre}, split at {i}"
            );
        }
    }
}

#[test]
fn wrapped_lines_shorter_than_a_piece_are_not_an_occurrence() {
    // Broken every 16 characters, no line holds 32 of the core: not a form searched for.
    let secret = "a 57-byte secret value, as long as one base64 line: ok!!?";
    let text = wrapped(&b64(secret.as_bytes(), false), 16, "\n");
    assert_eq!(red(&[secret], &text), text);
    assert_eq!(
        oracle(&[secret.as_bytes()], text.as_bytes()).0,
        text.as_bytes()
    );
}

#[test]
fn encodings_from_real_encoders_are_masked() {
    let vectors = include_str!("../testdata/encodings.jsonl");
    let mut count = 0;
    for line in vectors.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let field = |k: &str| v[k].as_str().unwrap().as_bytes();
        let (secret, text, expected) = (field("secret"), field("text"), field("expected"));
        for sizes in [&[usize::MAX][..], &[1], &[7, 3], &[64]] {
            let out = run_sized(&[secret], text, sizes);
            assert!(
                out == expected,
                "{} of {:?}, reads of {sizes:?}:\n{}\nnot\n{}",
                v["encoder"],
                v["secret"],
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(expected),
            );
        }
        count += 1;
    }
    assert!(count > 500, "{count} vectors");
}

#[test]
fn base64_cores_are_the_stable_characters() {
    // 4 bytes give at most 5 stable base64 characters: below the minimum.
    assert!(base64_cores(b"abcd").is_empty());
    // 6 bytes give 8 characters at alignment 0 only.
    assert_eq!(base64_cores(b"abcdef"), vec![b"YWJjZGVm".to_vec()]);
    // Both alphabets, all three alignments.
    let value = b"p@ss/w0rd+\xc3\x9c";
    for pad in 0..3 {
        for url in [false, true] {
            let mut blob = vec![b'z'; pad];
            blob.extend_from_slice(value);
            let (a, b) = core_range(pad, value.len());
            let core = b64(&blob, url).as_bytes()[a..b].to_vec();
            assert!(base64_cores(value).contains(&core));
        }
    }
}

#[test]
fn short_values_are_found_through_their_escapes() {
    assert_eq!(
        red(&["pw 1"], "a pw+1 b pw%201 c pw 1 d"),
        "a [redacted] b [redacted] c [redacted] d"
    );
    assert_eq!(
        red(&["ä/ö"], "x\\u00e4\\/\\u00F6 %C3%A4/%c3%b6"),
        "x[redacted] [redacted]"
    );
    for i in 0..=12 {
        let input = b"<pw%201pw+1>";
        let (a, b) = input.split_at(i);
        assert_eq!(run(&[b"pw 1"], &[a, b]), b"<[redacted]>");
    }
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
        match next(5) {
            0 => text.extend_from_slice(s),
            1 => text.extend_from_slice(&s[next(s.len())..]),
            2 => text.extend_from_slice(b64(s, false).as_bytes()),
            3 => text.extend_from_slice(&percent(s, b"", false, Hex::Mixed)),
            _ => text.extend_from_slice(b" abcxy/ "),
        }
    }
    let (expected, regions) = oracle(&refs, &text);
    assert!(regions > 50, "{regions}");
    assert!(run_sized(&refs, &text, &[97]) == expected);
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

// ---- properties -----------------------------------------------------------------------

/// No bytes of "[redacted]" but `a`, `c`, `d`, `e` in hex escapes, so a marker can hardly
/// form part of an occurrence. The three-letter alphabet makes overlapping and
/// self-overlapping values common.
fn secret_strategy() -> impl Strategy<Value = Vec<u8>> {
    let wide: Vec<&str> = vec![
        "b", "x", "y", "z", "B", "X", "Y", "Z", "0", "1", "9", " ", "/", "+", "=", "%", "\"", "\\",
        "\t", "<", "&", "'", "~", "ä", "€", "😀", "\u{2028}",
    ];
    prop_oneof![
        prop::collection::vec(prop::sample::select(wide), 4..12)
            .prop_map(|v| v.concat().into_bytes()),
        prop::collection::vec(prop::sample::select(b"xy/".to_vec()), 4..10),
    ]
}

fn text_strategy(secrets: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let mut pieces: Vec<Vec<u8>> = [
        &b"b"[..],
        b"x",
        b"y",
        b"/",
        b" ",
        b"\n",
        b"%",
        b"Z",
        b"\\",
        b"+",
    ]
    .iter()
    .map(|p| p.to_vec())
    .collect();
    for s in &secrets {
        // Halves and shifted tails, so occurrences overlap and abut.
        pieces.push(s[..s.len() / 2].to_vec());
        pieces.push(s[s.len() / 2..].to_vec());
        pieces.push(s[1..].to_vec());
        pieces.extend(escaped_forms(s).into_iter().map(|(_, f)| f));
        for pad in 0..3 {
            let blob = [&b"\x00\x01"[..pad.min(2)], s].concat();
            pieces.extend(
                base64_forms(&blob, pad.min(2), s.len())
                    .into_iter()
                    .map(|(t, _)| t),
            );
        }
    }
    prop::collection::vec(prop::sample::select(pieces), 0..24).prop_map(|p| p.concat())
}

fn case() -> impl Strategy<Value = (Vec<Vec<u8>>, Vec<u8>, Vec<usize>)> {
    prop::collection::vec(secret_strategy(), 1..4).prop_flat_map(|secrets| {
        let text = text_strategy(secrets.clone());
        (Just(secrets), text, prop::collection::vec(1usize..40, 1..6))
    })
}

/// A secret of 49 bytes or more (every core at least 64 characters) in base64 wrapped at
/// 64 or 76 columns, with LF or CRLF, at a random offset in its blob, after enough lines
/// that the redactor's boundary falls inside it.
#[allow(clippy::type_complexity)]
fn wrapped_case() -> impl Strategy<Value = (Vec<u8>, Vec<u8>, usize, usize, bool, usize, Vec<usize>)>
{
    (
        prop::collection::vec(any::<u8>(), 49..90),
        prop::collection::vec(any::<u8>(), 0..80),
        0usize..4,
        prop::sample::select(vec![64usize, 76]),
        any::<bool>(),
        0usize..700,
        prop::collection::vec(1usize..300, 1..6),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn streaming_matches_the_oracle((secrets, text, sizes) in case()) {
        let refs: Vec<&[u8]> = secrets.iter().map(Vec::as_slice).collect();
        let (expected, regions) = oracle(&refs, &text);
        let out = run_sized(&refs, &text, &sizes);
        prop_assert_eq!(&out, &expected);
        // No escaped form survives, and the output is no longer than needed.
        for s in &refs {
            for (name, form) in escaped_forms(s) {
                prop_assert!(!survives(&out, &form), "{} form {:?}", name, String::from_utf8_lossy(&form));
            }
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
        let (expected, _) = oracle(&refs, &text);
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

    #[test]
    fn random_secrets_in_every_form_never_survive(
        secret in prop::collection::vec(prop::sample::select(
            "abXY09-_.~ /+=%&<>'\"\\\täé€😀\u{2028}".chars().collect::<Vec<_>>()), 4..40),
        pad in 0usize..3,
        sizes in prop::collection::vec(1usize..50, 1..6),
    ) {
        let secret: String = secret.into_iter().collect();
        let value = secret.as_bytes();
        for (name, form) in escaped_forms(value) {
            let text = [&b"|"[..], &form, b"|\n"].concat();
            let out = run_sized(&[value], &text, &sizes);
            prop_assert_eq!(out, b"|[redacted]|\n".to_vec(), "{} {:?}", name, String::from_utf8_lossy(&form));
        }
        let blob = [&b"\xff\xfe"[..pad], value, b"\xfd"].concat();
        for (form, core) in base64_forms(&blob, pad, value.len()) {
            let text = [&b"|"[..], &form, b"|\n"].concat();
            let out = run_sized(&[value], &text, &sizes);
            prop_assert_eq!(&out, &oracle(&[value], &text).0);
            if let Some(core) = core {
                prop_assert!(!survives(&out, &core), "{:?}", String::from_utf8_lossy(&out));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn wrapped_base64_never_survives(
        (secret, pre, post, width, crlf, filler, sizes) in wrapped_case()
    ) {
        let blob = [&pre[..], &secret, &b"\x01\x02\x03"[..post]].concat();
        let eol = if crlf { "\r\n" } else { "\n" };
        let (text, expected) = wrapped_form(&blob, pre.len(), secret.len(), width, eol);
        let before = "log line\n".repeat(filler / 9) + &"-".repeat(filler % 9);
        let input = format!("{before}\n{text}end\n{before}");
        let out = run_sized(&[&secret], input.as_bytes(), &sizes);
        prop_assert_eq!(String::from_utf8_lossy(&out), format!("{before}\n{expected}end\n{before}"));
        let (oracle_out, _) = oracle(&[&secret], input.as_bytes());
        prop_assert_eq!(&out, &oracle_out);
    }
}

// ---- secrets added to a running stream ------------------------------------------------------

/// Feeds `before` in pieces of `sizes`, adds `added`, feeds `after` likewise, finishes.
fn run_adding(
    first: &[&[u8]],
    added: &[&[u8]],
    before: &[u8],
    after: &[u8],
    sizes: &[usize],
) -> Vec<u8> {
    let mut r = Redactor::new(first);
    let mut out = Vec::new();
    let feed = |r: &mut Redactor, mut rest: &[u8], out: &mut Vec<u8>| {
        for &n in sizes.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (a, b) = rest.split_at(n.clamp(1, rest.len()));
            r.feed(a, out);
            rest = b;
        }
    };
    feed(&mut r, before, &mut out);
    r.add_secrets(added);
    feed(&mut r, after, &mut out);
    r.finish(&mut out);
    out
}

#[test]
fn an_added_secret_is_masked_from_the_held_tail_on() {
    let first: &[&[u8]] = &[b"s3cret-t0ken-1234"];
    // The first part of the new value is still held when it is added (held because it may
    // still become the first value).
    let out = run_adding(
        first,
        &[b"t0ken-99z"],
        b"ok\nlog s3cret-t0k",
        b"en-99z s3cret-t0ken-1234\n",
        &[3],
    );
    assert_eq!(out, b"ok\nlog s3cret-[redacted] [redacted]\n");
}

#[test]
fn a_redactor_without_secrets_takes_some_later() {
    let mut r = Redactor::new(&[]);
    let mut out = Vec::new();
    r.feed(b"hunter22 before\n", &mut out);
    assert!(r.add_secrets(&[b"hunter22"]));
    r.feed(b"after hunter22 and aHVudGVyMjI=\n", &mut out);
    r.finish(&mut out);
    assert_eq!(out, b"hunter22 before\nafter [redacted] and [redacted]I=\n");
    assert_eq!(r.masked(), 2);
}

#[test]
fn adding_known_or_short_values_changes_nothing() {
    let mut r = Redactor::new(&[b"hunter22"]);
    assert!(!r.add_secrets(&[b"hunter22", b"abc"]));
    assert!(r.add_secrets(&[b"another-one"]));
    assert!(!r.add_secrets(&[b"another-one"]));
    assert_eq!(
        r.redact_str("hunter22 another-one abc"),
        "[redacted] [redacted] abc"
    );
}

#[test]
fn finds_tells_whether_any_spelling_is_there() {
    let r = Redactor::new(&[b"pa ss/word"]);
    for hit in [
        "x pa%20ss%2Fword",
        "cGEgc3Mvd29yZA",
        "pa+ss\\/word",
        "pa ss/word",
    ] {
        assert!(r.finds(hit.as_bytes()), "{hit}");
    }
    for miss in ["pa ss", "password", ""] {
        assert!(!r.finds(miss.as_bytes()), "{miss}");
    }
    assert!(!Redactor::new(&[]).finds(b"anything"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn adding_keeps_chunking_invariance(
        (secrets, text, sizes) in case(),
        at in any::<prop::sample::Index>(),
    ) {
        let refs: Vec<&[u8]> = secrets.iter().map(Vec::as_slice).collect();
        let (first, added) = refs.split_at(1);
        let k = at.index(text.len() + 1);
        let (before, after) = text.split_at(k);
        let whole = run_adding(first, added, before, after, &[usize::MAX]);
        prop_assert_eq!(&run_adding(first, added, before, after, &sizes), &whole);
        prop_assert_eq!(&run_adding(first, added, before, after, &[1]), &whole);
        // Added before the first byte, it is as if it had been there from the start.
        if k == 0 {
            prop_assert_eq!(&whole, &oracle(&refs, &text).0);
        }
        // The first secrets stay masked throughout; the added ones from the add on.
        for s in first {
            prop_assert!(!survives(&whole, s), "{:?}", String::from_utf8_lossy(&whole));
        }
        let marked = [&text[..], b"|"].concat();
        for s in added {
            let tail = [&b"|"[..], s, b"|\n"].concat();
            let out = run_adding(first, added, &marked, &tail, &sizes);
            prop_assert!(out.ends_with(b"|[redacted]|\n"), "{:?}", String::from_utf8_lossy(&out));
        }
    }
}

#[test]
fn only_a_tail_that_may_still_become_a_secret_is_held() {
    let mut r = Redactor::new(&[b"s3cret-t0ken-1234", b"hunter22"]);
    let mut out = Vec::new();
    r.feed(b"a line\n$ ", &mut out);
    assert_eq!(out, b"a line\n$ ");
    r.feed(b"echo s3cret-t0", &mut out);
    assert_eq!(out, b"a line\n$ echo ");
    r.feed(b"ken-1234 and hunt", &mut out);
    assert_eq!(out, b"a line\n$ echo [redacted] and ");
    r.feed(b"er22\n", &mut out);
    r.finish(&mut out);
    assert_eq!(out, b"a line\n$ echo [redacted] and [redacted]\n");
}
