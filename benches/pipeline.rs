//! Throughput of the output pipeline: `cargo bench --bench pipeline`.
//!
//! Inputs: ~128 MB of plain log lines, ~100 MB of colour-heavy text (the corpus `git log`
//! recording repeated: one SGR sequence every ~18 bytes), ~64 MB of text in non-Latin
//! scripts, and ~64 MB of log lines of short random lower-case words ("logwords", the
//! worst case for a q-gram filter over letter secrets). All are fed in 64 KiB reads, as
//! from a pipe. Secrets are 64 random 16–40 character strings (letters only for
//! "logwords"), a few of them (raw and encoded) planted in the input. Each input is run
//! through the redactor alone and through the whole pipeline, with no secrets and with the
//! 64; the pipeline both into one growing buffer and, as the supervisor runs it ("capture"),
//! into a buffer emptied after each read, where output stays in cache and the redactor's
//! share shows. Figures are input MB (10^6 bytes) per second, best of a few runs.

use gitterm_agent::text::pipeline::Pipeline;
use gitterm_agent::text::redact::Redactor;
use gitterm_agent::text::sanitize::Sanitizer;
use std::hint::black_box;
use std::time::{Duration, Instant};

const READ: usize = 64 * 1024;
const RUNS: usize = 3;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn plain_text(rng: &mut Rng, size: usize) -> Vec<u8> {
    const LEVELS: &[&str] = &["INFO", "DEBUG", "WARN", "INFO", "ERROR", "TRACE"];
    const MODULES: &[&str] = &["api::jobs", "store", "supervise", "http::server", "launch"];
    const WORDS: &[&str] = &[
        "request",
        "completed",
        "in",
        "ms",
        "job",
        "started",
        "with",
        "pid",
        "user",
        "path",
        "/v1/jobs/8f3a/output",
        "connection",
        "closed",
        "by",
        "peer",
        "retrying",
        "after",
        "bytes",
        "written",
        "to",
        "output.log",
        "status=200",
        "method=GET",
        "cache",
        "hit",
    ];
    let mut out = Vec::with_capacity(size + 256);
    let mut n = 0u64;
    while out.len() < size {
        n += 1;
        let line = format!(
            "2025-11-29T12:{:02}:{:02}.{:06}Z {:5} {}: ",
            n / 60 % 60,
            n % 60,
            rng.below(1_000_000),
            LEVELS[rng.below(LEVELS.len())],
            MODULES[rng.below(MODULES.len())],
        );
        out.extend_from_slice(line.as_bytes());
        for i in 0..4 + rng.below(10) {
            if i > 0 {
                out.push(b' ');
            }
            if rng.below(5) == 0 {
                out.extend_from_slice(rng.below(100_000).to_string().as_bytes());
            } else {
                out.extend_from_slice(WORDS[rng.below(WORDS.len())].as_bytes());
            }
        }
        out.push(b'\n');
    }
    out
}

/// Log lines in several scripts: mostly non-ASCII characters.
fn unicode_text(rng: &mut Rng, size: usize) -> Vec<u8> {
    const WORDS: &[&str] = &[
        "größe",
        "überprüfung",
        "fehlgeschlagen",
        "ошибка",
        "соединение",
        "закрыто",
        "データベース",
        "接続",
        "失敗しました",
        "服务器",
        "已启动",
        "🚀",
        "✓",
        "ok",
        "42",
    ];
    let mut out = Vec::with_capacity(size + 256);
    while out.len() < size {
        for i in 0..4 + rng.below(12) {
            if i > 0 {
                out.push(b' ');
            }
            out.extend_from_slice(WORDS[rng.below(WORDS.len())].as_bytes());
        }
        out.push(b'\n');
    }
    out
}

/// Log lines of ten words drawn from a vocabulary of 500 random lower-case words of 2–9
/// letters.
fn logwords_text(rng: &mut Rng, size: usize) -> Vec<u8> {
    let words: Vec<Vec<u8>> = (0..500)
        .map(|_| {
            let len = 2 + rng.below(8);
            (0..len).map(|_| b'a' + rng.below(26) as u8).collect()
        })
        .collect();
    let mut out = Vec::with_capacity(size + 256);
    let mut i = 0;
    while out.len() < size {
        let line = format!("2026-11-29T12:00:{:02}Z INFO worker[{}]", i % 60, i % 7);
        out.extend_from_slice(line.as_bytes());
        for _ in 0..10 {
            out.push(b' ');
            out.extend_from_slice(&words[rng.below(words.len())]);
        }
        out.push(b'\n');
        i += 1;
    }
    out
}

fn colour_text(size: usize) -> Vec<u8> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/corpus/git-log-color.raw"
    );
    let recording = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut out = Vec::with_capacity(size + recording.len());
    while out.len() < size {
        out.extend_from_slice(&recording);
    }
    out
}

fn random_secrets(rng: &mut Rng) -> Vec<Vec<u8>> {
    const ALPHABET: &[u8] =
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.+/=@!%";
    (0..64)
        .map(|_| {
            let len = 16 + rng.below(25);
            (0..len)
                .map(|_| ALPHABET[rng.below(ALPHABET.len())])
                .collect()
        })
        .collect()
}

/// 64 random 16–40 character strings of ASCII letters.
fn letter_secrets(rng: &mut Rng) -> Vec<Vec<u8>> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    (0..64)
        .map(|_| {
            let len = 16 + rng.below(25);
            (0..len)
                .map(|_| ALPHABET[rng.below(ALPHABET.len())])
                .collect()
        })
        .collect()
}

/// Overwrites a few spots (at line starts) with secrets, raw and base64-encoded.
fn plant(rng: &mut Rng, text: &mut [u8], secrets: &[&[u8]]) {
    for i in 0..24 {
        let secret = secrets[rng.below(secrets.len())];
        let form = if i % 3 == 0 {
            base64(secret)
        } else {
            secret.to_vec()
        };
        let at = rng.below(text.len() - 200);
        let at = at + memchr_nl(&text[at..]) + 1;
        text[at..at + form.len()].copy_from_slice(&form);
    }
}

fn memchr_nl(b: &[u8]) -> usize {
    b.iter().position(|&c| c == b'\n').unwrap_or(0)
}

fn base64(bytes: &[u8]) -> Vec<u8> {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..=c.len() {
            out.push(A[(n >> (18 - 6 * k) & 63) as usize]);
        }
    }
    out
}

/// Runs `f` over `input` in 64 KiB reads a few times; returns the best MB/s and the output
/// size of the last run.
fn measure(input: &[u8], mut f: impl FnMut(&[u8], &mut Vec<u8>)) -> (f64, usize) {
    let mut best = Duration::MAX;
    let mut produced = 0;
    let mut out = Vec::with_capacity(input.len() + (1 << 20));
    for _ in 0..RUNS {
        out.clear();
        let start = Instant::now();
        f(input, &mut out);
        best = best.min(start.elapsed());
        produced = black_box(&out).len();
    }
    (input.len() as f64 / 1e6 / best.as_secs_f64(), produced)
}

fn sanitize(input: &[u8], out: &mut Vec<u8>) {
    let mut s = Sanitizer::new();
    for read in input.chunks(READ) {
        s.feed(read, out);
    }
    s.finish(out);
}

fn redact<'a>(secrets: &'a [&'a [u8]]) -> impl FnMut(&[u8], &mut Vec<u8>) + 'a {
    move |input, out| {
        let mut r = Redactor::new(secrets);
        for read in input.chunks(READ) {
            r.feed(read, out);
        }
        r.finish(out);
    }
}

fn pipeline<'a>(secrets: &'a [&'a [u8]]) -> impl FnMut(&[u8], &mut Vec<u8>) + 'a {
    move |input, out| {
        let mut p = Pipeline::new(secrets);
        for read in input.chunks(READ) {
            p.feed(read, out);
        }
        p.finish(out);
    }
}

/// The pipeline as the supervisor drives it: each read's output is stored (here, counted)
/// and the buffer reused, so output stays in cache instead of streaming to memory.
fn capture<'a>(secrets: &'a [&'a [u8]]) -> impl FnMut(&[u8], &mut Vec<u8>) + 'a {
    move |input, _| {
        let mut p = Pipeline::new(secrets);
        let mut buf = Vec::with_capacity(2 * READ);
        let mut stored = 0;
        for read in input.chunks(READ) {
            buf.clear();
            p.feed(read, &mut buf);
            stored += black_box(&buf).len();
        }
        buf.clear();
        p.finish(&mut buf);
        black_box(stored + buf.len());
    }
}

/// What building the masking costs a supervisor: for its own secrets at start, and for the
/// other running jobs' secrets (16 each) before its first output, or when one more starts
/// (each add rebuilds the index for all values), and for values it already has.
fn building(rng: &mut Rng) {
    let jobs: Vec<Vec<Vec<u8>>> = (0..31)
        .map(|_| random_secrets(rng).into_iter().take(16).collect())
        .collect();
    let best = |f: &mut dyn FnMut()| {
        (0..5)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .min()
            .unwrap()
    };
    let refs = |js: &[Vec<Vec<u8>>]| -> Vec<Vec<u8>> { js.iter().flatten().cloned().collect() };
    let own = refs(&jobs[..1]);
    let own_refs: Vec<&[u8]> = own.iter().map(Vec::as_slice).collect();
    let all = refs(&jobs[1..]);
    let all_refs: Vec<&[u8]> = all.iter().map(Vec::as_slice).collect();
    let t_own = best(&mut || drop(black_box(Pipeline::new(&own_refs))));
    let t_add_all = best(&mut || {
        let mut p = Pipeline::new(&own_refs);
        p.add_secrets(&all_refs);
        black_box(p);
    });
    let t_rebuild_base = best(&mut || {
        let mut q = Pipeline::new(&own_refs);
        q.add_secrets(&all_refs[16..]);
        black_box(q);
    });
    let t_one_more = best(&mut || {
        let mut q = Pipeline::new(&own_refs);
        q.add_secrets(&all_refs[16..]);
        q.add_secrets(&all_refs[..16]);
        black_box(q);
    });
    let mut p = Pipeline::new(&own_refs);
    p.add_secrets(&all_refs);
    let t_known = best(&mut || {
        black_box(p.add_secrets(&all_refs[..16]));
    });
    println!(
        "building: own 16 secrets {:.2} ms; adding 30 other jobs' 480 {:.2} ms; one more job's 16 \
         onto 464 {:.2} ms; 16 already known {:.3} ms",
        t_own.as_secs_f64() * 1e3,
        t_add_all.saturating_sub(t_own).as_secs_f64() * 1e3,
        t_one_more.saturating_sub(t_rebuild_base).as_secs_f64() * 1e3,
        t_known.as_secs_f64() * 1e3,
    );
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this binary without it,
    // and a benchmark is no test: it then only checks that it builds.
    if !std::env::args().any(|a| a == "--bench") {
        println!("benchmark skipped: run it with cargo bench --bench pipeline");
        return;
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let secrets = random_secrets(&mut rng);
    let refs: Vec<&[u8]> = secrets.iter().map(Vec::as_slice).collect();
    // Its own generator, so the other inputs stay as they were.
    let mut words_rng = Rng(0x2545_F491_4F6C_DD1D);
    let letters = letter_secrets(&mut words_rng);
    let letter_refs: Vec<&[u8]> = letters.iter().map(Vec::as_slice).collect();

    building(&mut Rng(0x5851_F42D_4C95_7F2D));

    // `cargo bench --bench pipeline -- colour` runs only the inputs named.
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    for name in ["plain", "colour", "unicode", "logwords"] {
        if !only.is_empty() && !only.iter().any(|o| o == name) {
            continue;
        }
        let (mut input, refs) = match name {
            "plain" => (plain_text(&mut rng, 128 << 20), &refs),
            "colour" => (colour_text(100 << 20), &refs),
            "unicode" => (unicode_text(&mut rng, 64 << 20), &refs),
            _ => (logwords_text(&mut words_rng, 64 << 20), &letter_refs),
        };
        match name {
            "logwords" => plant(&mut words_rng, &mut input, refs),
            _ => plant(&mut rng, &mut input, refs),
        }
        let input = &input;
        println!("input {name}: {:.1} MB", input.len() as f64 / 1e6);
        let (rate, _) = measure(input, sanitize);
        println!("sanitize {name}: {rate:.0} MB/s");
        let (rate, _) = measure(input, redact(&[]));
        println!("redact {name} 0-secrets: {rate:.0} MB/s");
        let (rate, _) = measure(input, redact(refs));
        println!("redact {name} 64-secrets: {rate:.0} MB/s");
        let (rate, _) = measure(input, pipeline(&[]));
        println!("pipeline {name} 0-secrets: {rate:.0} MB/s");
        let (rate, len) = measure(input, pipeline(refs));
        let mut check = Vec::new();
        pipeline(refs)(input, &mut check);
        let masked = check.windows(10).filter(|w| w == b"[redacted]").count();
        assert_eq!(len, check.len());
        println!("pipeline {name} 64-secrets: {rate:.0} MB/s ({masked} masked)");
        let (rate, _) = measure(input, capture(&[]));
        println!("capture {name} 0-secrets: {rate:.0} MB/s");
        let (rate, _) = measure(input, capture(refs));
        println!("capture {name} 64-secrets: {rate:.0} MB/s");
    }
    spelling_cases(&only);
}

/// Two inputs for the redactor's spellings. "long": the plain log lines with 64 secrets of
/// 49–98 characters, whose base64 cores are also searched across line breaks (every gram
/// of them indexed, probes at most 29 bytes apart), a few planted as base64 wrapped at 76
/// columns. "jsonlog": JSON log lines full of escapes (`\"`, `\/`, `\u00fc`, `%2F`) with
/// 64 secrets drawn as for the other inputs, a few planted JSON- or percent-escaped.
fn spelling_cases(only: &[String]) {
    let mut rng = Rng(0x5851_F42D_4C95_7F2D);
    for name in ["long", "jsonlog"] {
        if !only.is_empty() && !only.iter().any(|o| o == name) {
            continue;
        }
        let (mut input, secrets) = if name == "long" {
            let secrets: Vec<Vec<u8>> = random_secrets(&mut rng)
                .into_iter()
                .map(|s| [s.clone(), s, b"-0123456789abcdef".to_vec()].concat())
                .map(|s| s[..s.len().min(98)].to_vec())
                .collect();
            (plain_text(&mut rng, 128 << 20), secrets)
        } else {
            (json_log_text(&mut rng, 64 << 20), random_secrets(&mut rng))
        };
        for i in 0..24 {
            let secret = &secrets[rng.below(secrets.len())];
            let form = match (name, i % 2) {
                ("long", _) => {
                    let enc = base64(secret);
                    let lines: Vec<&[u8]> = enc.chunks(76).collect();
                    lines.join(&b'\n')
                }
                (_, i) => escaped(secret, i == 0),
            };
            let at = rng.below(input.len() - 400);
            let at = at + memchr_nl(&input[at..]) + 1;
            input[at..at + form.len()].copy_from_slice(&form);
        }
        let refs: Vec<&[u8]> = secrets.iter().map(Vec::as_slice).collect();
        let input = &input;
        println!("input {name}: {:.1} MB", input.len() as f64 / 1e6);
        let (rate, _) = measure(input, redact(&refs));
        println!("redact {name} 64-secrets: {rate:.0} MB/s");
        let (rate, len) = measure(input, pipeline(&refs));
        let mut check = Vec::new();
        pipeline(&refs)(input, &mut check);
        let masked = check.windows(10).filter(|w| w == b"[redacted]").count();
        assert_eq!(len, check.len());
        println!("pipeline {name} 64-secrets: {rate:.0} MB/s ({masked} masked)");
        let (rate, _) = measure(input, capture(&refs));
        println!("capture {name} 64-secrets: {rate:.0} MB/s");
    }
}

/// `secret` as PHP's JSON writes it (`\/` for `/`), or percent-encoded.
fn escaped(secret: &[u8], json: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for &b in secret {
        if json && b == b'/' {
            out.extend_from_slice(b"\\/");
        } else if !json && !b.is_ascii_alphanumeric() && !b"-._~".contains(&b) {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        } else {
            out.push(b);
        }
    }
    out
}

/// JSON log lines, as structured loggers write them: quoted and escaped strings.
fn json_log_text(rng: &mut Rng, size: usize) -> Vec<u8> {
    const MSGS: &[&str] = &[
        r#"GET \"/v1/jobs/8f3a\" 200"#,
        r#"user \"j\u00fcrgen\" logged in"#,
        r#"path=C:\\Users\\build\\out.log"#,
        r#"redirect to https:\/\/example.com\/a%2Fb?q=x%20y"#,
        r#"retrying after 250ms"#,
        r#"<html> \u003cbody\u003e"#,
    ];
    let mut out = Vec::with_capacity(size + 256);
    let mut n = 0u64;
    while out.len() < size {
        n += 1;
        let line = format!(
            r#"{{"ts":"2025-11-29T12:{:02}:{:02}Z","level":"info","msg":"{}","id":{}}}"#,
            n / 60 % 60,
            n % 60,
            MSGS[rng.below(MSGS.len())],
            rng.below(1_000_000),
        );
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }
    out
}
