//! Throughput of the terminal wire's masker: `cargo bench --bench wire`.
//!
//! Inputs (~16 MB each, in 4 KiB reads as from a pty, output emptied after each read as a
//! viewer's socket does): an `ls --color` listing, a progress bar redrawn with `\r` and
//! `ESC[K`, and plain log lines, each with a few occurrences of the secrets planted. Each
//! goes through a plain copy, the byte redactor (`text::redact::Redactor`) and the wire
//! masker (`text::wire::WireMasker`, 200 x 50), the last two with 4 secrets of 20–40
//! characters. Figures are input MB (10^6 bytes) per second, best of 3 runs, and the
//! masker's as a share of the redactor's and the copy's.

use gitterm_agent::text::redact::Redactor;
use gitterm_agent::text::wire::WireMasker;
use std::hint::black_box;
use std::time::Instant;

const READ: usize = 4096;
const SIZE: usize = 16 << 20;
const RUNS: usize = 3;

/// Makes one input.
type Make = fn(&mut Rng) -> Vec<u8>;

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

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const NAMES: &[&str] = &[
    "Cargo.toml",
    "README.md",
    "src",
    "target",
    "build.rs",
    "main.rs",
    "lib.rs",
    "tests",
    "notes.txt",
    "run.sh",
    "data.json",
    "image.png",
    "archive.tar.gz",
    "docs",
    "LICENSE",
];

fn ls_color(rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(SIZE + 256);
    while out.len() < SIZE {
        for _ in 0..4 {
            let name = rng.pick(NAMES);
            let colour = match name {
                "src" | "target" | "tests" | "docs" => "01;34",
                "run.sh" => "01;32",
                "image.png" => "01;35",
                "archive.tar.gz" => "01;31",
                _ => "",
            };
            if colour.is_empty() {
                out.extend_from_slice(format!("{name:<18}").as_bytes());
            } else {
                out.extend_from_slice(
                    format!(
                        "\x1b[0m\x1b[{colour}m{name}\x1b[0m{:<1$}",
                        "",
                        18 - name.len()
                    )
                    .as_bytes(),
                );
            }
        }
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn progress(rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(SIZE + 256);
    let mut pct = 0;
    while out.len() < SIZE {
        pct = (pct + 1 + rng.below(3)) % 101;
        let bar = "#".repeat(pct * 40 / 100);
        out.extend_from_slice(
            format!(
                "\r\x1b[K\x1b[32m[{bar:<40}]\x1b[0m {pct:>3}% {}/5000 eta {}s",
                pct * 50,
                100 - pct
            )
            .as_bytes(),
        );
        if pct == 100 {
            out.extend_from_slice(b"\r\n");
        }
    }
    out
}

fn log_lines(rng: &mut Rng) -> Vec<u8> {
    const LEVELS: &[&str] = &["INFO", "DEBUG", "WARN", "ERROR"];
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
        "bytes",
        "written",
    ];
    let mut out = Vec::with_capacity(SIZE + 256);
    let mut n = 0u64;
    while out.len() < SIZE {
        n += 1;
        out.extend_from_slice(
            format!(
                "2026-12-01T22:{:02}:{:02}.{:03}Z {:<5} ",
                n / 60_000 % 60,
                n / 1000 % 60,
                n % 1000,
                rng.pick(LEVELS)
            )
            .as_bytes(),
        );
        for _ in 0..4 + rng.below(10) {
            out.extend_from_slice(rng.pick(WORDS).as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn secrets(rng: &mut Rng) -> Vec<Vec<u8>> {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    (0..4)
        .map(|_| {
            let len = 20 + rng.below(21);
            (0..len).map(|_| ABC[rng.below(ABC.len())]).collect()
        })
        .collect()
}

/// A few occurrences, each at the start of a line, so the streams stay what they are.
fn plant(rng: &mut Rng, input: &mut Vec<u8>, secrets: &[Vec<u8>]) {
    for i in 0..16 {
        let at = rng.below(input.len());
        let at = at + input[at..].iter().position(|&b| b == b'\n').unwrap_or(0) + 1;
        if at >= input.len() {
            continue;
        }
        let mut line = b"token ".to_vec();
        line.extend_from_slice(&secrets[i % secrets.len()]);
        line.extend_from_slice(b"\r\n");
        input.splice(at..at, line);
    }
}

/// Best input MB/s of `RUNS` runs of `run` over `input`.
fn measure(input: &[u8], mut run: impl FnMut(&[u8]) -> usize) -> f64 {
    let mut best = 0f64;
    for _ in 0..RUNS {
        let t = Instant::now();
        black_box(run(input));
        best = best.max(input.len() as f64 / 1e6 / t.elapsed().as_secs_f64());
    }
    best
}

fn copy(input: &[u8]) -> usize {
    let mut out = Vec::with_capacity(2 * READ);
    let mut n = 0;
    for c in input.chunks(READ) {
        out.extend_from_slice(black_box(c));
        n += out.len();
        out.clear();
    }
    n
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this binary without it,
    // and a benchmark is no test: it then only checks that it builds.
    if !std::env::args().any(|a| a == "--bench") {
        println!("benchmark skipped: run it with cargo bench --bench wire");
        return;
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let secrets = secrets(&mut rng);
    let refs: Vec<&[u8]> = secrets.iter().map(Vec::as_slice).collect();
    let inputs: [(&str, Make); 3] = [
        ("ls-color", ls_color),
        ("progress", progress),
        ("log", log_lines),
    ];
    for (name, make) in inputs {
        let mut input = make(&mut rng);
        plant(&mut rng, &mut input, &secrets);
        let input = input.as_slice();
        let plain = measure(input, copy);
        let redact = measure(input, |input| {
            let mut r = Redactor::new(&refs);
            let mut out = Vec::with_capacity(2 * READ);
            let mut n = 0;
            for c in input.chunks(READ) {
                r.feed(c, &mut out);
                n += out.len();
                out.clear();
            }
            r.finish(&mut out);
            n + out.len()
        });
        let wire = measure(input, |input| {
            let mut m = WireMasker::new(&refs, 200, 50);
            let mut out = Vec::with_capacity(2 * READ);
            let mut n = 0;
            for c in input.chunks(READ) {
                m.feed(c, &mut out);
                n += out.len();
                out.clear();
            }
            m.finish(&mut out);
            n + out.len()
        });
        println!(
            "{name:<9} {:>5.1} MB: copy {plain:>7.0} MB/s, redactor {redact:>6.0} MB/s, \
             wire masker {wire:>5.0} MB/s ({:.2}% of the redactor's, {:.3}% of the copy's)",
            input.len() as f64 / 1e6,
            100.0 * wire / redact,
            100.0 * wire / plain
        );
    }
}
