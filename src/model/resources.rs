//! A job's resource limits and usage, the sandbox's figures, and the shell quoting of an
//! argv: the pure part of the contract's "Job resources" and "Process control".

use serde::{Deserialize, Serialize};

use super::error::{Error, Result};

/// The smallest memory limit accepted: below it not even a shell starts.
pub const MIN_MEMORY_BYTES: u64 = 1 << 20;
/// The smallest CPU share accepted: the kernel's smallest quota is 1 ms per 100 ms period.
pub const MIN_CPUS: f64 = 0.01;
/// The largest CPU count accepted (a unit mistake beyond it).
pub const MAX_CPUS: f64 = 4096.0;
/// The largest pids limit accepted (the kernel's own pid ceiling).
pub const MAX_PIDS: u64 = 4_194_304;
/// The CPU period a `cpus` limit is enforced over, in microseconds.
pub const CPU_PERIOD_US: u64 = 100_000;

/// Per-job limits, enforced on the job's cgroup. Absent fields: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
}

impl Limits {
    /// True when no limit is set.
    pub fn is_empty(&self) -> bool {
        self.memory_bytes.is_none() && self.cpus.is_none() && self.pids.is_none()
    }

    /// Refuses values no kernel would take or that are surely a unit mistake.
    pub fn check(&self) -> Result<()> {
        if let Some(m) = self.memory_bytes
            && m < MIN_MEMORY_BYTES
        {
            return Err(Error::Invalid(format!(
                "limits.memoryBytes must be at least {MIN_MEMORY_BYTES} (1 MiB), got {m}: \
                 it counts bytes (512 MiB is 536870912)"
            )));
        }
        if let Some(c) = self.cpus
            && !(c.is_finite() && (MIN_CPUS..=MAX_CPUS).contains(&c))
        {
            return Err(Error::Invalid(format!(
                "limits.cpus must be a number of cores from {MIN_CPUS} to {MAX_CPUS} \
                 (1.5 is one and a half cores), got {c}"
            )));
        }
        if let Some(p) = self.pids
            && !(1..=MAX_PIDS).contains(&p)
        {
            return Err(Error::Invalid(format!(
                "limits.pids must be from 1 to {MAX_PIDS} (processes and threads), got {p}"
            )));
        }
        Ok(())
    }

    /// The CFS quota for `cpus`, in microseconds per [`CPU_PERIOD_US`].
    pub fn cpu_quota_us(cpus: f64) -> u64 {
        ((cpus * CPU_PERIOD_US as f64).round() as u64).max(1000)
    }

    /// A short description for a reason, e.g. `64 MiB`.
    pub fn show_bytes(b: u64) -> String {
        const UNITS: [(&str, u64); 4] = [
            ("TiB", 1 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ];
        for (name, size) in UNITS {
            if b >= size && b.is_multiple_of(size) {
                return format!("{} {name}", b / size);
            }
        }
        format!("{b} bytes")
    }
}

/// Which limits the sandbox can enforce (`GET /v1/sandbox` `limits`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    pub memory: bool,
    pub cpu: bool,
    pub pids: bool,
}

/// What a job used, for the whole job (every process it started). A figure the sandbox
/// cannot measure is `None` (`null`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    #[serde(default)]
    pub cpu_seconds: Option<f64>,
    #[serde(default)]
    pub memory_peak_bytes: Option<u64>,
    #[serde(default)]
    pub io_read_bytes: Option<u64>,
    #[serde(default)]
    pub io_write_bytes: Option<u64>,
}

impl Usage {
    /// Each figure of `self`, or `other`'s where `self` has none.
    pub fn or(self, other: Usage) -> Usage {
        Usage {
            cpu_seconds: self.cpu_seconds.or(other.cpu_seconds),
            memory_peak_bytes: self.memory_peak_bytes.or(other.memory_peak_bytes),
            io_read_bytes: self.io_read_bytes.or(other.io_read_bytes),
            io_write_bytes: self.io_write_bytes.or(other.io_write_bytes),
        }
    }
}

/// Parses a size as the CLI takes it: bytes, or a number with `K`, `M`, `G` or `T`
/// (powers of 1024; `KiB`, `MB`, `m` and the like mean the same), e.g. `512M`, `1.5G`.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("expected a size such as 512M or 1G, got {s:?}"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {s:?}: use K, M, G or T (e.g. 512M)"
            ));
        }
    };
    let bytes = n * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 / 2.0 {
        return Err(format!("size {s:?} is out of range"));
    }
    Ok(bytes.round() as u64)
}

/// Quotes `argv` so that pasting the result into a POSIX shell runs exactly those words:
/// words made only of safe characters stay bare, others are single-quoted (a `'` inside
/// becomes `'\''`).
pub fn shell_quote(argv: &[String]) -> String {
    argv.iter()
        .map(|w| quote_word(w))
        .collect::<Vec<_>>()
        .join(" ")
}

fn quote_word(w: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_./:@%+=,".contains(c);
    // `=` is safe only after the first character: a leading word like `A=b` would be read
    // as an assignment.
    if !w.is_empty() && w.chars().all(safe) && (!w.contains('=') || w.starts_with('-')) {
        return w.to_string();
    }
    format!("'{}'", w.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_the_usual_units() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5g").unwrap(), 3 << 29);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size(" 2K ").unwrap(), 2048);
        assert!(parse_size("12X").unwrap_err().contains("unit"));
        assert!(parse_size("").is_err());
        assert!(parse_size("-5M").is_err());
        assert!(parse_size("0").is_err());
    }

    #[test]
    fn limits_refuse_unit_mistakes() {
        let ok = Limits {
            memory_bytes: Some(64 << 20),
            cpus: Some(0.5),
            pids: Some(20),
        };
        ok.check().unwrap();
        for bad in [
            Limits {
                memory_bytes: Some(512),
                ..Default::default()
            },
            Limits {
                cpus: Some(0.0),
                ..Default::default()
            },
            Limits {
                cpus: Some(f64::NAN),
                ..Default::default()
            },
            Limits {
                pids: Some(0),
                ..Default::default()
            },
        ] {
            let e = bad.check().unwrap_err();
            assert!(e.message().contains("limits."), "{}", e.message());
        }
        assert_eq!(Limits::cpu_quota_us(1.5), 150_000);
        assert_eq!(Limits::cpu_quota_us(0.01), 1000);
    }

    #[test]
    fn unknown_limit_fields_are_refused() {
        assert!(serde_json::from_str::<Limits>(r#"{"memory": 5}"#).is_err());
        let l: Limits = serde_json::from_str(r#"{"pids": 5}"#).unwrap();
        assert_eq!(l.pids, Some(5));
    }

    #[test]
    fn shell_quoting_round_trips_through_sh() {
        let words: Vec<String> = [
            "printf", "%s|", "*", "$HOME", "a b", "it's", "", "A=b", "--x=y", "\\n", "é",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let line = shell_quote(&words);
        assert!(
            line.starts_with("printf '%s|' '*' '$HOME' 'a b' 'it'\\''s' '' 'A=b' --x=y"),
            "{line}"
        );
        // The shell splits it back into the same words.
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(&line)
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            "*|$HOME|a b|it's||A=b|--x=y|\\n|é|"
        );
    }

    #[test]
    fn bytes_are_shown_in_their_unit() {
        assert_eq!(Limits::show_bytes(64 << 20), "64 MiB");
        assert_eq!(Limits::show_bytes(1000), "1000 bytes");
    }
}
