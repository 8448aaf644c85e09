//! Real terminal recordings (`*.raw`) must be stored exactly as `*.expected`, however the
//! bytes are split into reads.
//!
//! The recordings are the project's own, in `tests/data/corpus`; where the shared corpus of
//! the contract sits beside the repository (`../shared/corpus`), it is checked as well.

use gitterm_agent::text::pipeline::Pipeline;
use gitterm_agent::text::sanitize::Sanitizer;
use std::path::{Path, PathBuf};

/// The project's own recordings; always there.
const OWN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/corpus");

/// The contract's shared corpus, beside the repository where it is checked out with it.
const SHARED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/corpus");

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
    let shared = Path::new(SHARED);
    if shared.is_dir() {
        all.extend(read_corpus(shared));
    } else {
        eprintln!(
            "note: no shared corpus at {}; checked {} only",
            shared.display(),
            OWN
        );
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
