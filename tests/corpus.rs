//! Real terminal recordings (`*.raw`) must be stored exactly as `*.expected`, however the
//! bytes are split into reads.
//!
//! The recordings are the project's own, in `tests/data/corpus`; a further corpus named by
//! `GITTERM_EXTRA_CORPUS` (the test command sets it to the contract's shared corpus where
//! that sits beside the repository) is checked as well.

use gitterm_agent::text::pipeline::Pipeline;
use gitterm_agent::text::sanitize::Sanitizer;
use std::path::{Path, PathBuf};

/// The project's own recordings; always there.
const OWN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/corpus");

/// Names a further corpus folder to check (set by `scripts/test.sh` where one exists).
const EXTRA: &str = "GITTERM_EXTRA_CORPUS";

/// Every `(name, raw, expected)` of one corpus folder (at least one).
fn read_corpus(dir: &Path) -> Vec<(String, Vec<u8>, Vec<u8>)> {
    let mut raws: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("corpus at {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "raw"))
        .collect();
    raws.sort();
    assert!(!raws.is_empty(), "no *.raw files in {}", dir.display());
    raws.into_iter()
        .map(|raw| {
            let name = format!(
                "{}/{}",
                dir.display(),
                raw.file_stem().unwrap().to_string_lossy()
            );
            let expected = std::fs::read(raw.with_extension("expected"))
                .unwrap_or_else(|e| panic!("{name}.expected: {e}"));
            (name, std::fs::read(&raw).unwrap(), expected)
        })
        .collect()
}

/// Every recording: the project's own, and the shared corpus where it exists.
fn corpus() -> Vec<(String, Vec<u8>, Vec<u8>)> {
    let mut all = read_corpus(Path::new(OWN));
    match std::env::var_os(EXTRA).filter(|d| !d.is_empty()) {
        Some(extra) => all.extend(read_corpus(Path::new(&extra))),
        None => eprintln!("note: no {EXTRA} set; checked {OWN} only"),
    }
    all
}

#[test]
fn the_projects_own_corpus_is_there() {
    let own = read_corpus(Path::new(OWN));
    for (name, _, expected) in &own {
        assert!(
            std::str::from_utf8(expected).is_ok(),
            "{name}.expected is not UTF-8"
        );
    }
}

fn sanitize(chunks: &mut dyn Iterator<Item = &[u8]>) -> Vec<u8> {
    let mut s = Sanitizer::new();
    let mut out = Vec::new();
    for c in chunks {
        s.feed(c, &mut out);
    }
    s.finish(&mut out);
    out
}

fn pipeline(secrets: &[&[u8]], chunks: &mut dyn Iterator<Item = &[u8]>) -> Vec<u8> {
    let mut p = Pipeline::new(secrets);
    let mut out = Vec::new();
    for c in chunks {
        p.feed(c, &mut out);
    }
    p.finish(&mut out);
    out
}

/// Splits at pseudo-random points (a fixed xorshift sequence, so failures reproduce).
fn random_chunks(data: &[u8], seed: u64, max: usize) -> Vec<&[u8]> {
    let mut state = seed | 1;
    let mut chunks = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let n = 1 + (state % max as u64) as usize;
        let (a, b) = rest.split_at(n.min(rest.len()));
        chunks.push(a);
        rest = b;
    }
    chunks
}

/// Secrets that never occur in the corpus: masking must change nothing.
const ABSENT: &[&[u8]] = &[b"Zx9-never-in-corpus-4f1c", b"another absent value"];

#[test]
fn whole_recordings_become_the_expected_text() {
    for (name, raw, expected) in corpus() {
        let out = sanitize(&mut std::iter::once(raw.as_slice()));
        assert!(
            out == expected,
            "{name}: sanitized output differs from {name}.expected"
        );
        let out = pipeline(&[], &mut std::iter::once(raw.as_slice()));
        assert!(out == expected, "{name}: pipeline without secrets differs");
        let out = pipeline(ABSENT, &mut std::iter::once(raw.as_slice()));
        assert!(
            out == expected,
            "{name}: pipeline with absent secrets differs"
        );
    }
}

#[test]
fn every_chunk_size_from_1_to_64_gives_the_same_text() {
    for (name, raw, expected) in corpus() {
        for size in 1..=64 {
            let out = sanitize(&mut raw.chunks(size));
            assert!(out == expected, "{name}: sanitizer, reads of {size} bytes");
            let out = pipeline(ABSENT, &mut raw.chunks(size));
            assert!(out == expected, "{name}: pipeline, reads of {size} bytes");
        }
    }
}

#[test]
fn random_splits_give_the_same_text() {
    for (name, raw, expected) in corpus() {
        for seed in 1..=8u64 {
            for max in [7, 300, 5000] {
                let chunks = random_chunks(&raw, seed * 7919 + max as u64, max);
                let out = pipeline(ABSENT, &mut chunks.iter().copied());
                assert!(
                    out == expected,
                    "{name}: random split seed {seed} max {max}"
                );
            }
        }
    }
}

#[test]
fn secrets_found_in_the_recordings_are_masked() {
    // Words that do occur: every occurrence is masked, and the rest of the text is intact.
    let secrets: &[&[u8]] = &[b"Compiling", b"README"];
    for (name, raw, expected) in corpus() {
        let whole = pipeline(secrets, &mut std::iter::once(raw.as_slice()));
        let mut masked = String::from_utf8(expected).unwrap();
        for s in secrets {
            masked = masked.replace(std::str::from_utf8(s).unwrap(), "[redacted]");
        }
        assert!(whole == masked.as_bytes(), "{name}: masked output differs");
        for size in [1, 3, 64, 4096] {
            let out = pipeline(secrets, &mut raw.chunks(size));
            assert!(out == whole, "{name}: masked, reads of {size} bytes");
        }
    }
}

// ---------------------------------------------------------------------------------------
// A differential test against a real terminal emulator: xterm.js's headless build, driven
// by `scripts/xterm-diff/xterm-lines.js`. It runs where `node` and `@xterm/headless` are
// installed (in `scripts/xterm-diff/node_modules` or on `NODE_PATH`) and skips with a note
// otherwise; `scripts/xterm-diff/run.sh [CASES]` installs the package and runs it.
// ---------------------------------------------------------------------------------------

/// The node script that prints a terminal's lines for each case.
const XTERM_SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/scripts/xterm-diff/xterm-lines.js"
);

/// Cases run when `XTERM_DIFF_CASES` does not say.
const XTERM_DEFAULT_CASES: usize = 2000;

/// A small seeded generator (xorshift64*), so a printed seed reproduces a run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

/// Characters one column wide in both models (no tab, no wide, combining or zero-width
/// character, no C1).
const NARROW: &[&str] = &[
    "é", "ü", "ß", "€", "Ŝ", "Ω", "ж", "✓", "─", "│", "⠙", "⠹", "…", "→", "¢",
];

/// Sequences that show nothing in both: colours, titles and links (ended by BEL or ST),
/// charset and keypad selections, cursor visibility.
const INERT: &[&str] = &[
    "\x1b[m",
    "\x1b[0m",
    "\x1b[1m",
    "\x1b[22m",
    "\x1b[31;42m",
    "\x1b[38;5;200m",
    "\x1b[48;2;1;2;3m",
    "\x1b[4:3m",
    "\x1b]0;a title\x07",
    "\x1b]2;title\x1b\\",
    "\x1b]8;;https://example.com/x\x1b\\",
    "\x1b]8;id=1;http://h/\x07",
    "\x1b]8;;\x1b\\",
    "\x1b]8;;\x07",
    "\x1b(B",
    "\x1b)0",
    "\x1b)B",
    "\x1b=",
    "\x1b>",
    "\x1b[?1h",
    "\x1b[?1l",
    "\x1b[?25l",
    "\x1b[?25h",
];

/// One random case from the subset where the contract and a terminal agree: printable
/// text (with multi-byte characters), `\n`, `\r`, backspace, erase-in-line, the horizontal
/// moves and the inert sequences above. Lines stay far below the emulator's width.
fn xterm_case(rng: &mut Rng) -> Vec<u8> {
    let mut out = String::new();
    let tokens = 1 + rng.below(40);
    for _ in 0..tokens {
        match rng.below(20) {
            0..=4 => {
                for _ in 0..1 + rng.below(8) {
                    out.push(char::from(0x20 + rng.below(0x5F) as u8));
                }
            }
            5 | 6 => {
                for _ in 0..1 + rng.below(3) {
                    out.push_str(rng.pick(NARROW));
                }
            }
            7 => out.push('\n'),
            8 => out.push('\r'),
            9 => out.push('\x08'),
            10 | 11 => out.push_str(rng.pick(&["\x1b[K", "\x1b[0K", "\x1b[1K", "\x1b[2K"])),
            12..=15 => {
                let fin = rng.pick(&['G', '`', 'C', 'D']);
                let n = match rng.below(4) {
                    0 => String::new(),
                    1 => "0".to_owned(),
                    _ => rng.below(30).to_string(),
                };
                out.push_str(&format!("\x1b[{n}{fin}"));
            }
            _ => out.push_str(rng.pick(INERT)),
        }
    }
    out.into_bytes()
}

fn base64(data: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= c.len() {
                s.push(char::from(ABC[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// The directory the node script runs in (its own, where `node_modules` may be).
fn xterm_dir() -> &'static Path {
    Path::new(XTERM_SCRIPT).parent().unwrap()
}

/// Whether `node` runs and finds `@xterm/headless`; prints why not.
fn xterm_available() -> bool {
    let probe = std::process::Command::new("node")
        .args(["-e", "require.resolve('@xterm/headless')"])
        .current_dir(xterm_dir())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    match probe {
        Ok(s) if s.success() => true,
        Ok(_) => {
            eprintln!(
                "note: skipped the comparison with xterm.js: node finds no @xterm/headless \
                 (install it in scripts/xterm-diff or on NODE_PATH; scripts/xterm-diff/run.sh does)"
            );
            false
        }
        Err(e) => {
            eprintln!("note: skipped the comparison with xterm.js: no node ({e})");
            false
        }
    }
}

/// Each case's lines as the headless terminal shows them.
fn xterm_lines(cases: &[Vec<u8>]) -> Vec<Vec<String>> {
    use std::io::Write;
    let mut child = std::process::Command::new("node")
        .arg(XTERM_SCRIPT)
        .current_dir(xterm_dir())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("node runs");
    let mut stdin = child.stdin.take().unwrap();
    let input: String = cases
        .iter()
        .map(|c| format!("\"{}\"\n", base64(c)))
        .collect();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().expect("node runs");
    writer.join().unwrap().expect("cases written to node");
    assert!(
        out.status.success(),
        "xterm-lines.js failed: {}",
        out.status
    );
    let text = String::from_utf8(out.stdout).expect("node prints UTF-8");
    let lines: Vec<Vec<String>> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON array of lines"))
        .collect();
    assert_eq!(lines.len(), cases.len(), "one answer per case");
    lines
}

/// Our stored text, as lines (a final line without `\n` is one too).
fn our_lines(case: &[u8]) -> Vec<String> {
    let out = sanitize(&mut std::iter::once(case));
    String::from_utf8(out)
        .unwrap()
        .split('\n')
        .map(str::to_owned)
        .collect()
}

fn escaped(b: &[u8]) -> String {
    b.escape_ascii().to_string()
}

#[test]
fn random_streams_read_as_xterm_shows_them() {
    if !xterm_available() {
        return;
    }
    let count = std::env::var("XTERM_DIFF_CASES")
        .ok()
        .map_or(XTERM_DEFAULT_CASES, |v| {
            v.parse().expect("XTERM_DIFF_CASES: a number")
        });
    let seed = std::env::var("XTERM_DIFF_SEED").ok().map_or_else(
        || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        },
        |v| v.parse().expect("XTERM_DIFF_SEED: a number"),
    );
    eprintln!("xterm-diff: {count} cases, seed {seed} (XTERM_DIFF_SEED={seed} repeats them)");
    let mut rng = Rng(seed | 1);
    let cases: Vec<Vec<u8>> = (0..count).map(|_| xterm_case(&mut rng)).collect();
    let theirs = xterm_lines(&cases);
    let mut failed = 0;
    for (i, (case, xterm)) in cases.iter().zip(&theirs).enumerate() {
        let ours = our_lines(case);
        if &ours != xterm {
            failed += 1;
            if failed <= 5 {
                eprintln!(
                    "case {i} (seed {seed}): {}\n  ours:  {ours:?}\n  xterm: {xterm:?}",
                    escaped(case)
                );
            }
        }
    }
    assert_eq!(failed, 0, "{failed} of {count} cases differ (seed {seed})");
}

/// A documented difference: its class, an input, what we store, what xterm.js shows.
type Difference = (&'static str, Vec<u8>, Vec<String>, Vec<String>);

/// The documented differences from a terminal, one example each: `(class, input, what we
/// store, what xterm.js shows)`. The random streams avoid all of them; these pin each
/// class, so a change on either side shows.
fn documented_differences() -> Vec<Difference> {
    let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        (
            "tabs are kept as \\t, a terminal moves to the next tab stop",
            b"a\tb".to_vec(),
            v(&["a\tb"]),
            v(&["a       b"]),
        ),
        (
            "every character is one column: wide characters take two in a terminal",
            "日本\x1b[2GX".as_bytes().to_vec(),
            v(&["日X"]),
            v(&[" X本"]),
        ),
        (
            "... and combining marks none",
            "ab\u{301}c\x1b[3GX".as_bytes().to_vec(),
            v(&["abXc"]),
            v(&["ab\u{301}X"]),
        ),
        (
            "C1 characters are removed alone; a terminal acts on them (U+009B is CSI)",
            "a\u{9b}31mb".as_bytes().to_vec(),
            v(&["a31mb"]),
            v(&["ab"]),
        ),
        (
            "invalid UTF-8 becomes U+FFFD; xterm.js drops it",
            b"a\xffb".to_vec(),
            v(&["a\u{FFFD}b"]),
            v(&["ab"]),
        ),
        (
            "other sequences have no effect: positioning and vertical moves",
            b"abc\x1b[1;1Hx".to_vec(),
            v(&["abcx"]),
            v(&["xbc"]),
        ),
        (
            "... erase and insert characters",
            b"abc\x1b[1G\x1b[2X\x1b[3@".to_vec(),
            v(&["abc"]),
            v(&["     c"]),
        ),
        (
            "... and charset shifts (the DEC line-drawing set)",
            b"a\x1b(0qx\x1b(B".to_vec(),
            v(&["aqx"]),
            v(&["a\u{2500}\u{2502}"]),
        ),
        (
            "no right margin: a move right stops at the 64 KiB line bound, a terminal at its last column",
            b"x\x1b[3000Cy".to_vec(),
            vec![format!("x{}y", " ".repeat(3000))],
            vec![format!("x{}y", " ".repeat(1998))],
        ),
    ]
}

#[test]
fn documented_differences_from_xterm_hold() {
    let cases = documented_differences();
    for (class, input, ours, _) in &cases {
        assert_eq!(&our_lines(input), ours, "ours, {class}");
    }
    if !xterm_available() {
        return;
    }
    let inputs: Vec<Vec<u8>> = cases.iter().map(|c| c.1.clone()).collect();
    for ((class, input, _, xterm), theirs) in cases.iter().zip(xterm_lines(&inputs)) {
        assert_eq!(&theirs, xterm, "xterm.js, {class}: {}", escaped(input));
    }
}

// ---------------------------------------------------------------------------------------
// The masked terminal wire, drawn by xterm.js: streams that draw a secret in the ways a
// terminal can, fed to the wire masker in random chunks; what xterm.js draws from the
// masked bytes must never show a secret, while the same bytes unmasked do.
// ---------------------------------------------------------------------------------------

use gitterm_agent::text::wire::WireMasker;

/// The terminal's height, as the node script has it.
const XTERM_ROWS: u16 = 24;

/// Each case's lines (wrapped rows joined) and how many rows scrolled off the screen, as
/// a headless terminal `cols` wide draws them.
fn xterm_joined(cases: &[Vec<u8>], cols: u16) -> Vec<(Vec<String>, u64)> {
    use std::io::Write;
    let mut child = std::process::Command::new("node")
        .arg(XTERM_SCRIPT)
        .args(["--cols", &cols.to_string(), "--join"])
        .current_dir(xterm_dir())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("node runs");
    let mut stdin = child.stdin.take().unwrap();
    let input: String = cases
        .iter()
        .map(|c| format!("\"{}\"\n", base64(c)))
        .collect();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().expect("node runs");
    writer.join().unwrap().expect("cases written to node");
    assert!(
        out.status.success(),
        "xterm-lines.js failed: {}",
        out.status
    );
    let text = String::from_utf8(out.stdout).expect("node prints UTF-8");
    let answers: Vec<(Vec<String>, u64)> = text
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON object");
            let lines = v["lines"]
                .as_array()
                .expect("lines")
                .iter()
                .map(|s| s.as_str().expect("a line").to_owned())
                .collect();
            (lines, v["scrolled"].as_u64().expect("scrolled"))
        })
        .collect();
    assert_eq!(answers.len(), cases.len(), "one answer per case");
    answers
}

/// A tty's ONLCR: the masker sees what the terminal gets.
fn onlcr(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    for &b in bytes {
        if b == b'\n' {
            out.push(b'\r');
        }
        out.push(b);
    }
    out
}

/// A secret value: `sk-` and letters and digits.
fn random_secret(rng: &mut Rng, len: usize) -> Vec<u8> {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut s = b"sk-".to_vec();
    while s.len() < len {
        s.push(ABC[rng.below(ABC.len())]);
    }
    s
}

/// Characters a secret never has, to write and take back.
fn junk(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.pick(b"#%&+=~^")).collect()
}

/// `text` with sequences that draw nothing between some of its characters; `erase` allows
/// `ESC[K` too (right of the cursor is nothing of the secret yet).
fn sprinkle(rng: &mut Rng, text: &[u8], erase: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, &b) in text.iter().enumerate() {
        if i > 0 && rng.below(3) == 0 {
            let mut gaps = vec![
                "\x1b[m",
                "\x1b[1;31m",
                "\x1b[38;5;200m",
                "\x1b[4:3m",
                "\x1b]0;a title\x07",
                "\x1b]2;title\x1b\\",
                "\x1b]8;;https://example.com/x\x1b\\",
            ];
            if erase {
                gaps.extend(["\x1b[K", "\x1b[0K"]);
            }
            out.extend_from_slice(rng.pick(&gaps).as_bytes());
        }
        out.push(b);
    }
    out
}

/// `ESC [ n f` for a move by `n` (nothing for 0).
fn csi(n: usize, f: char) -> Vec<u8> {
    if n == 0 {
        Vec::new()
    } else {
        format!("\x1b[{n}{f}").into_bytes()
    }
}

/// One way to draw `s` with the cursor at column `p` (known to the stream), on a row
/// where at least `room` columns are left after `p + s.len()`: its name and its bytes.
fn draw_secret(rng: &mut Rng, s: &[u8], p: usize, kind: usize) -> (&'static str, Vec<u8>) {
    let l = s.len();
    let k = 1 + rng.below(l - 1);
    let (a, b) = s.split_at(k);
    let mut v = Vec::new();
    let name = match kind {
        0 => {
            v.extend_from_slice(s);
            "plain"
        }
        1 => {
            v = sprinkle(rng, s, true);
            "escapes between its characters"
        }
        2 => {
            let j = k + rng.below(l - k);
            v.extend_from_slice(&s[..k]);
            v.extend_from_slice(b"\x1b[01;31m\x1b[K");
            v.extend_from_slice(&s[k..j.max(k + 1)]);
            v.extend_from_slice(b"\x1b[m\x1b[K");
            v.extend_from_slice(&s[j.max(k + 1)..]);
            "grep --color"
        }
        3 => {
            if rng.below(2) == 0 {
                for &c in s {
                    match rng.below(3) {
                        0 => v.push(c),
                        1 => v.extend_from_slice(&[c, 8, c]),
                        _ => v.extend_from_slice(&[b'_', 8, c]),
                    }
                }
            } else {
                let n = 1 + rng.below(l - k);
                v.extend_from_slice(a);
                v.extend_from_slice(&junk(rng, n));
                v.extend(std::iter::repeat_n(8u8, n));
                v.extend_from_slice(b);
            }
            "backspace overstrike"
        }
        4 => {
            let n = 1 + rng.below(4);
            v.extend_from_slice(a);
            v.extend_from_slice(&junk(rng, n));
            v.extend(csi(n, 'D'));
            v.extend_from_slice(rng.pick(&[b"\x1b[K".as_slice(), b"\x1b[0K", b""]));
            if v.ends_with(b"D") {
                v.extend(csi(n, 'X'));
            }
            v.extend_from_slice(b);
            "erase in line in the middle"
        }
        5 => {
            v.extend(csi(a.len(), 'C'));
            v.extend(sprinkle(rng, b, false));
            match rng.below(4) {
                0 => v.extend(csi(l, 'D')),
                1 => {
                    v.push(b'\r');
                    v.extend(csi(p, 'C'));
                }
                2 => v.extend(format!("\x1b[{}G", p + 1).into_bytes()),
                _ => v.extend(format!("\x1b[{}`", p + 1).into_bytes()),
            }
            v.extend(sprinkle(rng, a, false));
            "second part first, then back"
        }
        6 => {
            let i = rng.below(l);
            v.extend_from_slice(&s[..i]);
            v.extend_from_slice(&s[i + 1..]);
            v.extend(csi(l - 1 - i, 'D'));
            if rng.below(2) == 0 {
                v.extend_from_slice(b"\x1b[@");
                v.push(s[i]);
            } else {
                v.extend_from_slice(b"\x1b[4h");
                v.push(s[i]);
                v.extend_from_slice(b"\x1b[4l");
            }
            "insert character"
        }
        7 => {
            let n = 1 + rng.below(3);
            v.extend_from_slice(a);
            v.extend_from_slice(&junk(rng, n));
            v.extend_from_slice(b);
            v.extend(csi(n + b.len(), 'D'));
            v.extend(csi(n, 'P'));
            "delete character"
        }
        _ => {
            let first_a = rng.below(2) == 0;
            if first_a {
                v.extend_from_slice(a);
            } else {
                v.extend(csi(a.len(), 'C'));
                v.extend_from_slice(b);
            }
            v.push(b'\n');
            for _ in 0..rng.below(10) {
                v.push(rng.pick(b"abc xyz.-"));
            }
            v.extend_from_slice(b"\x1b[A");
            let to = if first_a { p + a.len() } else { p };
            if rng.below(2) == 0 {
                v.extend(format!("\x1b[{}G", to + 1).into_bytes());
            } else {
                v.push(b'\r');
                v.extend(csi(to, 'C'));
            }
            v.extend_from_slice(if first_a { b } else { a });
            "up a row and back"
        }
    };
    (name, v)
}

/// Kinds of drawing in [`draw_secret`].
const DRAW_KINDS: usize = 9;

/// A case: the secrets configured, the bytes (as the terminal gets them), how the first
/// secret is drawn, and whether the stream surely leaves it on the screen.
struct WireCase {
    secrets: Vec<Vec<u8>>,
    bytes: Vec<u8>,
    how: &'static str,
    drawn: bool,
}

/// Noise from the sanitizer's generator; on a narrow terminal only short streams, so that
/// the screen rarely scrolls.
fn noise(rng: &mut Rng, cols: u16) -> Vec<u8> {
    loop {
        let n = xterm_case(rng);
        if cols >= 200 || n.len() <= 40 {
            return n;
        }
    }
}

fn wire_case(rng: &mut Rng, cols: u16) -> WireCase {
    let cols = usize::from(cols);
    let narrow = cols < 200;
    let len = if narrow {
        6 + rng.below(8)
    } else {
        6 + rng.below(24)
    };
    let mut secrets = vec![random_secret(rng, len)];
    for _ in 0..3 {
        let l = 6 + rng.below(20);
        secrets.push(random_secret(rng, l));
    }
    let s = secrets[0].clone();
    let mut bytes = Vec::new();
    if rng.below(4) != 0 {
        bytes.extend(noise(rng, cols as u16));
    }
    let wrap = narrow && rng.below(4) == 0;
    let kind = rng.below(DRAW_KINDS);
    let (how, drawing) = if wrap {
        // Across the right margin: the secret continues on the next row.
        let p = cols - len + 1 + rng.below(len - 1);
        bytes.extend_from_slice(b"\n");
        bytes.extend(format!("\x1b[{}G", p + 1).into_bytes());
        let v = if rng.below(2) == 0 {
            s.clone()
        } else {
            sprinkle(rng, &s, false)
        };
        ("autowrap", v)
    } else {
        // At a column the stream knows, with room to its right.
        let p = rng.below((cols - len - 4).min(40));
        bytes.extend_from_slice(rng.pick(&[b"\n".as_slice(), b"\r"]));
        match rng.below(3) {
            0 => {}
            1 => bytes.extend(csi(p, 'C')),
            _ => bytes.extend(format!("\x1b[{}G", p + 1).into_bytes()),
        }
        let p = if bytes.ends_with(b"\n") || bytes.ends_with(b"\r") {
            0
        } else {
            p
        };
        draw_secret(rng, &s, p, kind)
    };
    bytes.extend(drawing);
    let drawn = match rng.below(3) {
        0 => true,
        1 => {
            bytes.push(b'\n');
            bytes.extend(noise(rng, cols as u16));
            true
        }
        _ => {
            bytes.extend(noise(rng, cols as u16));
            false
        }
    };
    WireCase {
        secrets,
        bytes: onlcr(&bytes),
        how,
        drawn,
    }
}

/// Feeds `case` to a masker in random chunks; checks after each that a chunk ending at
/// the start of a row, or after a character no secret's spelling has, leaves nothing
/// held.
fn mask_in_chunks(rng: &mut Rng, case: &WireCase, cols: u16) -> Result<Vec<u8>, String> {
    let secrets: Vec<&[u8]> = case.secrets.iter().map(|s| s.as_slice()).collect();
    let mut m = WireMasker::new(&secrets, cols, XTERM_ROWS);
    let max = rng.pick(&[1usize, 2, 3, 8, 64, 4096]);
    let mut out = Vec::new();
    let mut rest = case.bytes.as_slice();
    let mut fed = 0;
    while !rest.is_empty() {
        let n = (1 + rng.below(max)).min(rest.len());
        let (chunk, more) = rest.split_at(n);
        m.feed(chunk, &mut out);
        fed += n;
        rest = more;
        if matches!(chunk.last(), Some(b'\n' | b'\r')) && m.holding() != 0 {
            return Err(format!(
                "{} bytes held after {fed} bytes that end at the start of a row",
                m.holding()
            ));
        }
        // `~` and `^` are in no spelling of a secret (no escape or encoding makes them), and
        // the streams write them only as characters: the cursor is behind no prefix then
        // (unless a wrap is pending at the last column, which the wide terminal never has).
        if cols >= 200 && matches!(chunk.last(), Some(b'~' | b'^')) && m.holding() != 0 {
            return Err(format!(
                "{} bytes held after {fed} bytes that end in a character no secret has",
                m.holding()
            ));
        }
    }
    m.finish(&mut out);
    if m.holding() != 0 {
        return Err(format!("{} bytes held after finish", m.holding()));
    }
    Ok(out)
}

#[test]
fn masked_wire_drawn_by_xterm_never_shows_a_secret() {
    if !xterm_available() {
        return;
    }
    let count = std::env::var("XTERM_DIFF_CASES")
        .ok()
        .map_or(XTERM_DEFAULT_CASES, |v| {
            v.parse().expect("XTERM_DIFF_CASES: a number")
        });
    let seed = std::env::var("XTERM_DIFF_SEED").ok().map_or_else(
        || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        },
        |v| v.parse().expect("XTERM_DIFF_SEED: a number"),
    );
    eprintln!(
        "xterm-diff: masked wire, {count} cases at 2000 and at 20 columns, seed {seed} \
         (XTERM_DIFF_SEED={seed} repeats them)"
    );
    let mut failed = Vec::new();
    let mut skipped = 0;
    let mut drawn_checked = 0;
    for cols in [2000u16, 20] {
        let mut rng = Rng((seed ^ u64::from(cols)) | 1);
        let cases: Vec<WireCase> = (0..count).map(|_| wire_case(&mut rng, cols)).collect();
        let mut masked = Vec::new();
        for (i, c) in cases.iter().enumerate() {
            match mask_in_chunks(&mut rng, c, cols) {
                Ok(out) => masked.push(out),
                Err(e) => {
                    failed.push(format!(
                        "case {i} at {cols} columns ({}): {e}: {}",
                        c.how,
                        escaped(&c.bytes)
                    ));
                    masked.push(c.bytes.clone());
                }
            }
        }
        let mut both: Vec<Vec<u8>> = cases.iter().map(|c| c.bytes.clone()).collect();
        both.extend(masked.iter().cloned());
        let drawn = xterm_joined(&both, cols);
        let (plain, hidden) = drawn.split_at(count);
        for (i, c) in cases.iter().enumerate() {
            let ((clear, up1), (shown, up2)) = (&plain[i], &hidden[i]);
            if *up1 > 0 || *up2 > 0 {
                // The screen scrolled: its top is no longer the rows the stream drew.
                skipped += 1;
                continue;
            }
            let say = |what: &str| {
                format!(
                    "case {i} at {cols} columns ({}): {what}\n  input:  {}\n  masked: {}\n  \
                     clear:  {clear:?}\n  shown:  {shown:?}",
                    c.how,
                    escaped(&c.bytes),
                    escaped(&masked[i]),
                )
            };
            let text = |s: &[u8]| String::from_utf8(s.to_vec()).unwrap();
            let s0 = text(&c.secrets[0]);
            drawn_checked += usize::from(c.drawn);
            if c.drawn && !clear.iter().any(|l| l.contains(&s0)) {
                failed.push(say("the unmasked stream does not draw the secret"));
            }
            for s in &c.secrets {
                let s = text(s);
                if shown.iter().any(|l| l.contains(&s)) {
                    failed.push(say(&format!("the masked stream draws {s}")));
                }
            }
            // The masked screen is the clear one with some cells shown as `*`.
            let same_layout = clear.len() == shown.len()
                && clear.iter().zip(shown).all(|(a, b)| {
                    a.chars().count() == b.chars().count()
                        && a.chars().zip(b.chars()).all(|(x, y)| x == y || y == '*')
                });
            if !same_layout {
                failed.push(say("the masked screen is not the clear one with masks"));
            }
        }
    }
    for f in failed.iter().take(8) {
        eprintln!("{f}");
    }
    eprintln!(
        "xterm-diff: masked wire: {} cases, {drawn_checked} checked to draw the secret in \
         clear, {skipped} skipped as scrolled",
        2 * count
    );
    assert!(
        skipped <= count / 2,
        "{skipped} of {} cases scrolled: the generator no longer keeps to the screen",
        2 * count
    );
    assert!(
        failed.is_empty(),
        "{} failures in {} cases (seed {seed}; {skipped} skipped as scrolled)",
        failed.len(),
        2 * count
    );
}
