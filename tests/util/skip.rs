//! Skipped tests say so. A test that cannot run here calls [`skip`] (something optional is
//! missing: a tool, a kernel feature) or [`skip_root`] (it needs what root has) and returns.
//! Either writes `SKIPPED <test>: <reason>` to the real stderr, past the runner's capture
//! of a passing test's output, and appends the line to the file `GITTERM_SKIP_LOG` names,
//! which `scripts/test.sh` prints and counts at the end. Under `GITTERM_REQUIRE_ALL=1`
//! (CI, which runs as root) [`skip_root`] fails the test instead: there nothing that needs
//! root may be skipped.

use std::io::Write;

/// The environment variable naming the file that collects the skip lines.
pub const SKIP_LOG: &str = "GITTERM_SKIP_LOG";

/// The environment variable that, set to `1`, makes a root-only test's skip a failure.
pub const REQUIRE_ALL: &str = "GITTERM_REQUIRE_ALL";

/// Records that the running test skips (all of itself, or the part `reason` names) because
/// something optional is missing here.
pub fn skip(reason: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("<unnamed thread>")
        .to_string();
    let line = format!("SKIPPED {test}: {reason}\n");
    // Straight to the stream, not through eprintln!, which the runner captures.
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(path) = std::env::var_os(SKIP_LOG).filter(|p| !p.is_empty()) {
        // One write per line on an O_APPEND file, so tests on parallel threads (and the
        // unit-test binaries beside this one) do not interleave.
        let logged = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = logged {
            panic!("cannot append the skip line to {path:?} (from ${SKIP_LOG}): {e}");
        }
    }
}

/// [`skip`] for what needs root (job users, mounts, namespaces, signalling the agent's own
/// processes); with `GITTERM_REQUIRE_ALL=1` it fails the test instead.
pub fn skip_root(reason: &str) {
    if std::env::var(REQUIRE_ALL).is_ok_and(|v| v == "1") {
        panic!("{REQUIRE_ALL}=1, but this root-only test would skip: {reason}");
    }
    skip(reason);
}
