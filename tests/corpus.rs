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
