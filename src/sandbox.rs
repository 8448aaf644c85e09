//! Facts about the sandbox: the kernel boot id and whether this start is a resume.
//! (Skeleton.)

/// The kernel's boot id.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}
