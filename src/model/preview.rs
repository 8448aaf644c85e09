//! The preview gate's pure rules: grant ids, the cookie and its MAC, token hashes, the
//! exchange's redirect target and the origin check. No I/O: the key and the randomness are
//! handed in.
//!
//! The cookie is `<grant id>.<expiry>.<mac>`, where the MAC is HMAC-SHA-256 under the
//! agent's key over the length-prefixed fields (grant id, gate port, expiry). Fields are
//! never joined into one string before the MAC: with a separator, `("a.b", 1)` and
//! `("a", "b.1")` could read alike; with a length before each, no two field lists share
//! their bytes. The gate port is MAC'd but not written in the value, so a cookie taken to
//! another port fails its check there.

use hmac::{KeyInit, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = hmac::Hmac<Sha256>;

/// The query parameter that carries a one-shot token to the gate (not `token`: Vite's HMR
/// socket uses that one).
pub const TOKEN_PARAM: &str = "preview_token";

/// The prefix of every gate cookie's name; the gate port follows.
pub const COOKIE_PREFIX: &str = "__Host-gitterm-preview-";

/// The name of the gate cookie on `gate_port`.
pub fn cookie_name(gate_port: u16) -> String {
    format!("{COOKIE_PREFIX}{gate_port}")
}

/// Bytes of the cookie key.
pub const KEY_BYTES: usize = 32;

/// Characters of a grant id after its `pv_` prefix: 26 base32 characters hold 130 bits.
const ID_CHARS: usize = 26;
const BASE32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// True if `s` is a grant id: `pv_` + 26 lowercase base32 characters.
pub fn is_grant_id(s: &str) -> bool {
    s.strip_prefix("pv_")
        .is_some_and(|rest| rest.len() == ID_CHARS && rest.bytes().all(|b| BASE32.contains(&b)))
}

/// The grant id made of 17 random bytes (the caller draws them from the kernel); the last
/// character uses the top bits of the final byte's share, so all 26 vary.
pub fn grant_id_from_random(bytes: [u8; 17]) -> String {
    let mut out = String::with_capacity(3 + ID_CHARS);
    out.push_str("pv_");
    let mut acc: u32 = 0;
    let mut bits = 0;
    let mut it = bytes.iter();
    while out.len() < 3 + ID_CHARS {
        if bits < 5 {
            acc = (acc << 8) | u32::from(*it.next().unwrap_or(&0));
            bits += 8;
        }
        bits -= 5;
        out.push(BASE32[((acc >> bits) & 31) as usize] as char);
    }
    out
}

/// A one-shot token made of 32 random bytes: `pvt_` + 64 hex characters.
pub fn token_from_random(bytes: [u8; 32]) -> String {
    format!("pvt_{}", super::id::hex(&bytes))
}

/// The SHA-256 of a token, in hex: what is stored in its place.
pub fn token_hash(token: &str) -> String {
    super::id::hex(&Sha256::digest(token.as_bytes()))
}

/// Compares two byte strings in time that depends on their lengths only, not on where
/// they differ.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    // Lengths are public (a token's length is no secret); the bytes are compared in full.
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    // Keeps the optimizer from turning the loop into an early exit.
    std::hint::black_box(diff) == 0
}

/// The MAC over the length-prefixed fields.
fn mac(key: &[u8], grant_id: &str, gate_port: u16, expiry: u64) -> [u8; 32] {
    // A key of any length is valid for HMAC; this cannot fail.
    let mut m = <HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
    for field in [
        grant_id.as_bytes(),
        &gate_port.to_be_bytes()[..],
        &expiry.to_be_bytes()[..],
    ] {
        m.update(&(field.len() as u32).to_be_bytes());
        m.update(field);
    }
    m.finalize().into_bytes().into()
}

/// The cookie value naming `grant_id` on `gate_port`, good until `expiry` (Unix seconds).
pub fn cookie_value(key: &[u8], grant_id: &str, gate_port: u16, expiry: u64) -> String {
    format!(
        "{grant_id}.{expiry}.{}",
        super::id::hex(&mac(key, grant_id, gate_port, expiry))
    )
}

/// Why a cookie value does not open a grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CookieFault {
    /// Not of the cookie's form.
    Malformed,
    /// Its MAC is not the key's for these fields on this port.
    BadMac,
    /// Past its expiry.
    Expired,
}

/// Checks a cookie value on `gate_port` at `now` (Unix seconds): the grant id it names if
/// its MAC is right (compared in constant time) and it has not expired.
pub fn check_cookie(
    key: &[u8],
    value: &str,
    gate_port: u16,
    now: u64,
) -> Result<String, CookieFault> {
    let mut parts = value.split('.');
    let (Some(id), Some(expiry), Some(tag), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(CookieFault::Malformed);
    };
    if !is_grant_id(id)
        || expiry.is_empty()
        || expiry.len() > 20
        || !expiry.bytes().all(|b| b.is_ascii_digit())
        || tag.len() != 64
    {
        return Err(CookieFault::Malformed);
    }
    let expiry: u64 = expiry.parse().map_err(|_| CookieFault::Malformed)?;
    // The canonical spelling only: a leading zero would be another value for one MAC.
    if expiry.to_string().len() != value.split('.').nth(1).map_or(0, str::len) {
        return Err(CookieFault::Malformed);
    }
    let want = super::id::hex(&mac(key, id, gate_port, expiry));
    if !ct_eq(want.as_bytes(), tag.as_bytes()) {
        return Err(CookieFault::BadMac);
    }
    if now >= expiry {
        return Err(CookieFault::Expired);
    }
    Ok(id.to_string())
}

/// The values of cookie `name` in a request's `Cookie` header values.
pub fn cookies_named<'a>(
    headers: impl Iterator<Item = &'a str>,
    name: &'a str,
) -> impl Iterator<Item = &'a str> {
    headers.flat_map(|h| h.split(';')).filter_map(move |pair| {
        let (n, v) = pair.split_once('=')?;
        (n.trim() == name).then(|| v.trim().trim_matches('"'))
    })
}

/// A `Cookie` header value without the gate's own cookies (any `__Host-gitterm-preview-*`):
/// they are for the gate, never the app. `None` when nothing is left.
pub fn strip_gate_cookies(value: &str) -> Option<String> {
    let kept: Vec<&str> = value
        .split(';')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .filter(|p| {
            !p.split('=')
                .next()
                .unwrap_or("")
                .trim()
                .starts_with(COOKIE_PREFIX)
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join("; "))
}

/// The token values of `preview_token` in a query string.
pub fn tokens_in(query: &str) -> Vec<&str> {
    query
        .split('&')
        .filter_map(|p| {
            let (n, v) = p.split_once('=').unwrap_or((p, ""));
            (n == TOKEN_PARAM).then_some(v)
        })
        .collect()
}

/// The query without its `preview_token` parameters, pairs otherwise kept as sent.
pub fn query_without_token(query: &str) -> String {
    query
        .split('&')
        .filter(|p| !p.is_empty() && p.split('=').next() != Some(TOKEN_PARAM))
        .collect::<Vec<_>>()
        .join("&")
}

/// Where the exchange's 302 sends the browser: the same path and query without
/// `preview_token`, always a path on this host. A path that begins with `//` or `\` (or
/// any run of them) would be read by a browser as another host (`//evil.example`), so the
/// run is collapsed to one `/`; a percent-encoded slash or backslash there is too, since
/// some servers decode before they redirect.
pub fn exchange_location(path: &str, query: &str) -> String {
    let mut rest = path;
    loop {
        let trimmed = rest.trim_start_matches(['/', '\\']);
        let lower = trimmed.get(..3).map(str::to_ascii_lowercase);
        match lower.as_deref() {
            Some("%2f" | "%5c") => rest = &trimmed[3..],
            _ => {
                rest = trimmed;
                break;
            }
        }
    }
    // Control characters and spaces have no place in a Location: they are escaped.
    let mut loc = String::with_capacity(path.len() + query.len() + 2);
    loc.push('/');
    for c in rest.chars() {
        if c.is_control() || c == ' ' {
            let mut b = [0u8; 4];
            for byte in c.encode_utf8(&mut b).bytes() {
                loc.push_str(&format!("%{byte:02X}"));
            }
        } else {
            loc.push(c);
        }
    }
    let q = query_without_token(query);
    if !q.is_empty() {
        loc.push('?');
        loc.push_str(&q);
    }
    loc
}

/// True for a method that may change state (RFC 9110 §9.2.1: all but GET, HEAD, OPTIONS
/// and TRACE).
pub fn is_unsafe_method(method: &str) -> bool {
    !matches!(method, "GET" | "HEAD" | "OPTIONS" | "TRACE")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
    const ID: &str = "pv_abcdefghijklmnopqrstuvwxyz";

    #[test]
    fn constant_time_compare_is_equality() {
        assert!(ct_eq(b"", b""));
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
        assert!(!ct_eq(b"ab", b"abc"));
        assert!(!ct_eq(b"", b"a"));
        // Lengths that differ by a multiple of 256 must not wrap to "equal".
        assert!(!ct_eq(&[0u8; 256], b""));
    }

    #[test]
    fn ids_are_pv_and_26_base32() {
        let id = grant_id_from_random([0xff; 17]);
        assert!(is_grant_id(&id), "{id}");
        assert_eq!(id, format!("pv_{}", "7".repeat(26)));
        assert!(is_grant_id(&grant_id_from_random([0; 17])));
        assert!(is_grant_id(ID));
        for bad in [
            "pv_abc",
            "pv_ABCDEFGHIJKLMNOPQRSTUVWXYZ",
            "pv_abcdefghijklmnopqrstuvwxy1",
            "px_abcdefghijklmnopqrstuvwxyz",
            "pv_abcdefghijklmnopqrstuvwxyza",
        ] {
            assert!(!is_grant_id(bad), "{bad}");
        }
    }

    #[test]
    fn a_cookie_opens_its_grant_on_its_port_until_it_expires() {
        let v = cookie_value(KEY, ID, 8080, 1000);
        assert_eq!(check_cookie(KEY, &v, 8080, 999), Ok(ID.to_string()));
        assert_eq!(check_cookie(KEY, &v, 8080, 1000), Err(CookieFault::Expired));
        assert_eq!(check_cookie(KEY, &v, 8081, 999), Err(CookieFault::BadMac));
        let other = b"fedcba9876543210fedcba9876543210";
        assert_eq!(check_cookie(other, &v, 8080, 999), Err(CookieFault::BadMac));
        // Another grant's id in front of this MAC, or a later expiry: both fail.
        let moved = v.replacen(ID, "pv_zzzzzzzzzzzzzzzzzzzzzzzzzz", 1);
        assert_eq!(
            check_cookie(KEY, &moved, 8080, 999),
            Err(CookieFault::BadMac)
        );
        let later = v.replacen(".1000.", ".9000.", 1);
        assert_eq!(
            check_cookie(KEY, &later, 8080, 999),
            Err(CookieFault::BadMac)
        );
        let padded = v.replacen(".1000.", ".01000.", 1);
        assert_eq!(
            check_cookie(KEY, &padded, 8080, 999),
            Err(CookieFault::Malformed)
        );
        for bad in ["", "x", &format!("{v}."), &v[1..], "a.b.c"] {
            assert!(check_cookie(KEY, bad, 8080, 0).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_mac_is_over_length_prefixed_fields() {
        // A joined string could not tell these apart; the prefixed fields do.
        assert_ne!(mac(KEY, "ab", 1, 2), mac(KEY, "a", 1, 2));
        assert_ne!(mac(KEY, ID, 0x0102, 3), mac(KEY, ID, 0x0201, 3));
    }

    #[test]
    fn token_hashes_are_sha256_hex() {
        assert_eq!(
            token_hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let t = token_from_random([7; 32]);
        assert!(t.starts_with("pvt_") && t.len() == 68);
    }

    #[test]
    fn the_redirect_stays_on_the_host() {
        for (path, query, want) in [
            ("/", "preview_token=x", "/"),
            ("/a/b", "preview_token=x&y=1", "/a/b?y=1"),
            ("/a", "y=1&preview_token=x&z=2", "/a?y=1&z=2"),
            ("//evil.example/x", "preview_token=x", "/evil.example/x"),
            ("/\\evil.example", "preview_token=x", "/evil.example"),
            ("\\\\evil.example", "", "/evil.example"),
            ("/%2f%2Fevil.example", "preview_token=x", "/evil.example"),
            ("/%5cevil.example", "preview_token=x", "/evil.example"),
            ("/a b\r\n", "preview_token=x", "/a%20b%0D%0A"),
            (
                "/ok",
                "preview_tokenx=1&preview_token",
                "/ok?preview_tokenx=1",
            ),
        ] {
            assert_eq!(exchange_location(path, query), want, "{path:?} {query:?}");
        }
    }

    #[test]
    fn gate_cookies_are_found_and_stripped() {
        let hs = [
            "a=1; __Host-gitterm-preview-8080=v1",
            "__Host-gitterm-preview-9=w; b=2",
        ];
        let got: Vec<&str> =
            cookies_named(hs.iter().copied(), "__Host-gitterm-preview-8080").collect();
        assert_eq!(got, ["v1"]);
        assert_eq!(strip_gate_cookies(hs[0]).as_deref(), Some("a=1"));
        assert_eq!(strip_gate_cookies(hs[1]).as_deref(), Some("b=2"));
        assert_eq!(strip_gate_cookies("__Host-gitterm-preview-1=x"), None);
    }

    #[test]
    fn unsafe_methods() {
        assert!(is_unsafe_method("POST") && is_unsafe_method("PATCH"));
        assert!(!is_unsafe_method("GET") && !is_unsafe_method("HEAD"));
    }

    proptest! {
        #[test]
        fn tampering_any_byte_fails(pos in 0usize..200, flip in 1u8..=255, port in 1u16..,
                                    expiry in 1_000u64..u64::MAX / 2) {
            let v = cookie_value(KEY, ID, port, expiry);
            let mut b = v.clone().into_bytes();
            let i = pos % b.len();
            b[i] ^= flip;
            if let Ok(s) = String::from_utf8(b) {
                prop_assert!(check_cookie(KEY, &s, port, 0).is_err());
            }
            prop_assert_eq!(check_cookie(KEY, &v, port, 0), Ok(ID.to_string()));
        }

        #[test]
        fn a_cookie_cannot_move_to_another_port_or_grant(a in 1u16.., b in 1u16.., r in any::<[u8; 17]>()) {
            let other = grant_id_from_random(r);
            let v = cookie_value(KEY, ID, a, u64::MAX);
            if a != b {
                prop_assert_eq!(check_cookie(KEY, &v, b, 0), Err(CookieFault::BadMac));
            }
            if other != ID {
                let moved = v.replacen(ID, &other, 1);
                prop_assert_eq!(check_cookie(KEY, &moved, a, 0), Err(CookieFault::BadMac));
            }
        }

        #[test]
        fn every_location_is_a_path_on_this_host(path in "[/\\\\%a-z2fF5c. ]{0,12}", query in "[a-z_=&]{0,20}") {
            let loc = exchange_location(&path, &query);
            prop_assert!(loc.starts_with('/'));
            prop_assert!(!loc.starts_with("//") && !loc.starts_with("/\\"));
            prop_assert!(!loc.contains(' '));
            let q = loc.split_once('?').map_or("", |(_, q)| q);
            prop_assert!(!q.split('&').any(|p| p.split('=').next() == Some(TOKEN_PARAM)));
        }
    }
}
