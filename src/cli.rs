//! The command line. (Skeleton.)

/// Runs the CLI and returns the exit status.
pub fn main() -> i32 {
    0
}
