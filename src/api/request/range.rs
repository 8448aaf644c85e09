//! The `Range` header (RFC 9110 §14): one byte range of a body whose length is known.

/// What a request's `Range` header asks of a body of a known length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanted {
    /// All of it: no `Range`, or one in a unit other than `bytes` (ignored, as RFC 9110
    /// says).
    Whole,
    /// The bytes from `start` to `end`, both included (`end` < the length).
    Part { start: u64, end: u64 },
    /// Nothing that can be sent (answered 416), and why: a range past the end, a malformed
    /// one, or more than one range (a multipart answer is never made).
    Unsatisfiable(String),
}

/// Reads the `Range` header values of a request (`values`: each header line given) against
/// a body of `len` bytes. One range is answered: `bytes=A-B`, `bytes=A-` and `bytes=-N`
/// (the last N bytes), with `B` past the end (or `N` over the length) cut to the end.
pub fn byte_range(values: &[&str], len: u64) -> Wanted {
    let v = match values {
        [] => return Wanted::Whole,
        [v] => v.trim(),
        _ => {
            return Wanted::Unsatisfiable(
                "the Range header is given more than once; ask for one range".into(),
            );
        }
    };
    let Some((unit, set)) = v.split_once('=') else {
        return malformed(v);
    };
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        // Not a unit this server knows, nor one it must refuse.
        if unit.trim().is_empty() || unit.trim().contains(char::is_whitespace) {
            return malformed(v);
        }
        return Wanted::Whole;
    }
    let ranges: Vec<&str> = set
        .split(',')
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .collect();
    let spec = match ranges[..] {
        [one] => one,
        [] => return malformed(v),
        _ => {
            return Wanted::Unsatisfiable(format!(
                "{} ranges were asked for; this server sends one range at a time (no multipart answers)",
                ranges.len()
            ));
        }
    };
    let Some((first, last)) = spec.split_once('-') else {
        return malformed(v);
    };
    let num = |s: &str| -> Option<u64> {
        (!s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let past_end = || {
        Wanted::Unsatisfiable(format!(
            "the range {spec} is outside the log, which has {len} bytes"
        ))
    };
    match (first, last) {
        ("", n) => match num(n) {
            None => malformed(v),
            Some(0) => past_end(),
            Some(_) if len == 0 => past_end(),
            Some(n) => Wanted::Part {
                start: len.saturating_sub(n),
                end: len - 1,
            },
        },
        (a, "") => match num(a) {
            None => malformed(v),
            Some(a) if a >= len => past_end(),
            Some(a) => Wanted::Part {
                start: a,
                end: len - 1,
            },
        },
        (a, b) => match (num(a), num(b)) {
            (Some(a), Some(b)) if a <= b => {
                if a >= len {
                    past_end()
                } else {
                    Wanted::Part {
                        start: a,
                        end: b.min(len - 1),
                    }
                }
            }
            _ => malformed(v),
        },
    }
}

fn malformed(v: &str) -> Wanted {
    let shown: String = v.chars().take(64).filter(|c| !c.is_control()).collect();
    Wanted::Unsatisfiable(format!(
        "malformed Range {shown:?}: expected bytes=A-B, bytes=A- or bytes=-N"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(start: u64, end: u64) -> Wanted {
        Wanted::Part { start, end }
    }

    fn refused(w: Wanted) -> bool {
        matches!(w, Wanted::Unsatisfiable(_))
    }

    #[test]
    fn the_three_forms_of_one_range() {
        let r = |v: &str| byte_range(&[v], 100);
        assert_eq!(byte_range(&[], 100), Wanted::Whole);
        assert_eq!(r("bytes=0-9"), part(0, 9));
        assert_eq!(r("bytes=10-10"), part(10, 10));
        assert_eq!(r("bytes=90-1000"), part(90, 99));
        assert_eq!(r("bytes=0-"), part(0, 99));
        assert_eq!(r("bytes=99-"), part(99, 99));
        assert_eq!(r("bytes=-1"), part(99, 99));
        assert_eq!(r("bytes=-30"), part(70, 99));
        assert_eq!(r("bytes=-500"), part(0, 99));
        // Spaces around the parts and an empty list element are allowed; the unit's case
        // is not significant.
        assert_eq!(r(" Bytes = 5-6 , "), part(5, 6));
    }

    #[test]
    fn past_the_end_malformed_or_several_is_refused() {
        let r = |v: &str| byte_range(&[v], 100);
        for v in [
            "bytes=100-",
            "bytes=100-200",
            "bytes=-0",
            "bytes=9-3",
            "bytes=a-b",
            "bytes=1-2x",
            "bytes=+1-2",
            "bytes=--1",
            "bytes=5",
            "bytes=",
            "bytes=,",
            "bytes=99999999999999999999999-",
            "bytes 0-1",
            "=0-1",
            "bytes=0-1,5-6",
            "bytes=0-1, -5",
        ] {
            assert!(refused(r(v)), "{v}: {:?}", r(v));
        }
        assert!(refused(byte_range(&["bytes=0-1", "bytes=2-3"], 100)));
        // An empty body has no satisfiable range at all.
        for v in ["bytes=0-", "bytes=0-0", "bytes=-1"] {
            assert!(refused(byte_range(&[v], 0)), "{v}");
        }
        let Wanted::Unsatisfiable(why) = r("bytes=0-1,5-6") else {
            unreachable!()
        };
        assert!(why.contains("one range at a time"), "{why}");
    }

    #[test]
    fn another_unit_is_ignored() {
        assert_eq!(byte_range(&["items=0-1"], 100), Wanted::Whole);
    }
}
