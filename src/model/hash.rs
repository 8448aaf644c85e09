//! A hash the project fixes (FNV-1a, 128 bits), for names that must stay the same across
//! releases: std's `DefaultHasher` may change, and a retried start would then run twice.

const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

/// FNV-1a over `parts`, each followed by its length so that `("ab", "c")` and `("a", "bc")`
/// differ.
pub fn fnv1a_128(parts: &[&[u8]]) -> u128 {
    let mut h = OFFSET;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= b as u128;
            h = h.wrapping_mul(PRIME);
        }
    };
    for p in parts {
        eat(p);
        eat(&(p.len() as u64).to_le_bytes());
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_values_never_change() {
        // Pinned: a change here renames every idempotency file on disk.
        assert_eq!(
            format!("{:032x}", fnv1a_128(&[b"key-1"])),
            "9268b8f2efbf8341b4dabf6b5c739eeb"
        );
        assert_eq!(fnv1a_128(&[]), OFFSET);
        assert_ne!(fnv1a_128(&[b"ab", b"c"]), fnv1a_128(&[b"a", b"bc"]));
    }
}
