//! The refusal of names a body or query string does not know, and the guess at the known
//! name each most likely stands for.

/// What kind of names a refusal is about.
pub(super) struct NameKind {
    one: &'static str,
    many: &'static str,
    none_here: &'static str,
}

pub(super) const FIELD: NameKind = NameKind {
    one: "field",
    many: "fields",
    none_here: "this request's body takes none",
};

pub(super) const QUERY_PARAMETER: NameKind = NameKind {
    one: "query parameter",
    many: "query parameters",
    none_here: "this route takes none",
};

/// At most this many unknown names are spelt out in one message.
const MAX_NAMED: usize = 5;

/// The refusal of `unknown` names: each with the known one it most likely meant, when one
/// is close; the known ones in full when some unknown one has none close; and the required
/// ones that are `missing` (a misspelt required field is also a missing one).
pub(super) fn unknown_names(
    kind: &NameKind,
    unknown: &[&str],
    known: &[&str],
    missing: &[&str],
) -> String {
    let guesses: Vec<Option<&str>> = unknown.iter().map(|n| closest(n, known)).collect();
    let mut msg = match (unknown, guesses.as_slice()) {
        ([name], [guess]) => {
            let mut m = format!("unknown {} {}", kind.one, quoted(name));
            if let Some(g) = guess {
                m.push_str(&format!("; did you mean `{g}`?"));
            }
            m
        }
        _ => {
            let mut listed: Vec<String> = unknown
                .iter()
                .zip(&guesses)
                .take(MAX_NAMED)
                .map(|(name, guess)| match guess {
                    Some(g) => format!("{} (did you mean `{g}`?)", quoted(name)),
                    None => quoted(name),
                })
                .collect();
            if unknown.len() > MAX_NAMED {
                listed.push(format!("and {} more", unknown.len() - MAX_NAMED));
            }
            format!("unknown {} {}", kind.many, listed.join(", "))
        }
    };
    if known.is_empty() {
        msg.push_str(&format!(": {}", kind.none_here));
    } else if guesses.iter().any(Option::is_none) {
        msg.push_str(&format!("; the {} are {}", kind.many, known.join(", ")));
    }
    if !missing.is_empty() {
        let verb = if missing.len() == 1 { "is" } else { "are" };
        msg.push_str(&format!(" ({} {verb} missing)", missing.join(", ")));
    }
    msg
}

/// A caller's name in a message: between backticks, escaped, and cut short.
fn quoted(name: &str) -> String {
    let mut out: String = name.chars().take(64).flat_map(char::escape_debug).collect();
    if name.chars().nth(64).is_some() {
        out.push('…');
    }
    format!("`{out}`")
}

/// The known name that `name` most likely stands for, if one is close: the same but for
/// case, `_` and `-` (`timeout_seconds`), a few edits away (`ofset`), or so from the start
/// of the other (`timeout`, `timout` for `timeoutSeconds`; `commandLine` for `command`).
/// Whole-name matches go first, then the fewest edits, then the first known.
pub(super) fn closest<'k>(name: &str, known: &[&'k str]) -> Option<&'k str> {
    let norm = |s: &str| -> Vec<char> {
        s.chars()
            .filter(|c| !matches!(c, '_' | '-'))
            .flat_map(char::to_lowercase)
            .collect()
    };
    let a = norm(name);
    if a.len() > 64 {
        return None;
    }
    let max = a.len().max(3) / 3;
    known
        .iter()
        .filter_map(|&k| {
            let b = norm(k);
            let e = edits(&a, &b);
            let whole = e.whole <= max;
            let short = a.len().min(b.len());
            (whole || (short >= 3 && e.to_start <= short / 3))
                .then_some(((!whole, e.to_start, e.whole), k))
        })
        .min_by_key(|&(rank, _)| rank)
        .map(|(_, k)| k)
}

/// Edits (insert, delete, substitute, swap two neighbours) between two names.
struct Edits {
    /// From one to the other.
    whole: usize,
    /// From the shorter to the closest start of the longer.
    to_start: usize,
}

fn edits(a: &[char], b: &[char]) -> Edits {
    let (a, b) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    // Three rows of the optimal-string-alignment table: two back, one back, this one.
    let mut rows = [
        vec![0; b.len() + 1],
        (0..=b.len()).collect::<Vec<_>>(),
        vec![0; b.len() + 1],
    ];
    for i in 1..=a.len() {
        rows[2][0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (rows[1][j] + 1)
                .min(rows[2][j - 1] + 1)
                .min(rows[1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(rows[0][j - 2] + 1);
            }
            rows[2][j] = d;
        }
        rows.rotate_left(1);
    }
    let last = &rows[1];
    Edits {
        whole: last[b.len()],
        to_start: last.iter().copied().min().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guesses_are_close_or_none() {
        const KNOWN: &[&str] = &["offset", "limit", "waitSeconds", "status"];
        for (name, want) in [
            ("offset", Some("offset")),
            ("OFFSET", Some("offset")),
            ("ofset", Some("offset")),
            ("offest", Some("offset")),
            ("offsets", Some("offset")),
            ("limt", Some("limit")),
            ("lim", Some("limit")),
            ("wait", Some("waitSeconds")),
            ("wait_seconds", Some("waitSeconds")),
            ("waitSecond", Some("waitSeconds")),
            ("statusCode", Some("status")),
            ("state", Some("status")),
            ("", None),
            ("o", None),
            ("of", None),
            ("xyz", None),
            ("cursor", None),
            ("timeout", None),
            ("after", None),
        ] {
            assert_eq!(closest(name, KNOWN), want, "{name}");
        }
        assert_eq!(closest(&"offset".repeat(20), KNOWN), None);
    }
}
