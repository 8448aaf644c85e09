//! Bearer tokens: where they come from, and whether a request carries one.
//!
//! Two tokens at most: the full one (from `--token-file`, or generated once into
//! `<root>/agent.token`), and an optional scoped one that may only read the sandbox, start
//! and read jobs, and read or set the env. The check is strict on purpose: exactly one
//! `Authorization: Bearer <token>` header, compared in constant time, and never a token in
//! the URL (URLs end up in logs and shell histories). A browser, which cannot set that
//! header on a WebSocket or an `EventSource`, gets [`crate::http::auth::Tickets`] instead: single use, short
//! lived, for one request path.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

pub use crate::http::auth::ct_eq;
use crate::model::error::{Error, Result};

/// The generated token's file name under the state root.
pub const TOKEN_FILE: &str = crate::state::layout::TOKEN_FILE;
/// Shortest token accepted from a file, in characters.
pub const MIN_TOKEN_CHARS: usize = 16;
/// Longest token accepted from a file, in characters.
pub const MAX_TOKEN_CHARS: usize = 4096;

/// What a valid token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Everything.
    Full,
    /// The routes whose [`Scope`](super::Scope) is `Scoped` only.
    Scoped,
}

/// Query parameter names that look like someone putting a credential in the URL.
const CREDENTIAL_PARAMS: &[&str] = &[
    "token",
    "access_token",
    "auth",
    "authorization",
    "bearer",
    "api_key",
    "apikey",
];

/// The tokens this server accepts. `Debug` never shows them.
pub struct Tokens {
    full: Vec<u8>,
    scoped: Option<Vec<u8>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tokens([redacted])")
    }
}

impl Tokens {
    /// Tokens from their values (tests and [`Tokens::load`]).
    pub fn new(full: Vec<u8>, scoped: Option<Vec<u8>>) -> Result<Tokens> {
        if scoped.as_ref().is_some_and(|s| ct_eq(s, &full)) {
            return Err(Error::Invalid(
                "the scoped token is the same as the full token; give it its own value".into(),
            ));
        }
        Ok(Tokens { full, scoped })
    }

    /// Loads the full token from `token_file` (or the generated one under `root`, creating
    /// it on first start) and the scoped one from `scoped_file`.
    pub fn load(
        root: &Path,
        token_file: Option<&Path>,
        scoped_file: Option<&Path>,
    ) -> Result<Tokens> {
        let full = match token_file {
            Some(p) => read_token_file(p, "token file")?,
            None => load_or_create(&root.join(TOKEN_FILE))?,
        };
        let scoped = scoped_file
            .map(|p| read_token_file(p, "scoped token file"))
            .transpose()?;
        Tokens::new(full, scoped)
    }

    /// Checks a request's credentials: `authorization` holds every `Authorization` header
    /// value, `query` the raw query string.
    pub fn check(&self, authorization: &[&str], query: &str) -> Result<Access> {
        if let Some(why) = self.credential_in_query(query) {
            return Err(Error::Auth(why));
        }
        let value = match authorization {
            [] => {
                return Err(Error::Auth(
                    "missing credentials: send the header Authorization: Bearer <token>".into(),
                ));
            }
            [v] => *v,
            _ => {
                return Err(Error::Auth(
                    "the Authorization header is given more than once; send it once".into(),
                ));
            }
        };
        let Some(given) = value.strip_prefix("Bearer ") else {
            return Err(Error::Auth(
                "the Authorization header must read: Bearer <token>".into(),
            ));
        };
        let given = given.as_bytes();
        // Both comparisons always run, so the time taken does not tell which token matched.
        let full = ct_eq(given, &self.full);
        let scoped = self.scoped.as_deref().is_some_and(|s| ct_eq(given, s));
        if full {
            Ok(Access::Full)
        } else if scoped {
            Ok(Access::Scoped)
        } else {
            Err(Error::Auth("the token is wrong".into()))
        }
    }

    fn credential_in_query(&self, query: &str) -> Option<String> {
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let name = super::request::percent_decode(name).unwrap_or_default();
            let value = super::request::percent_decode(value).unwrap_or_default();
            let looks_like_one = CREDENTIAL_PARAMS
                .iter()
                .any(|c| name.eq_ignore_ascii_case(c));
            let is_one = ct_eq(value.as_bytes(), &self.full)
                || self
                    .scoped
                    .as_deref()
                    .is_some_and(|s| ct_eq(value.as_bytes(), s));
            if looks_like_one || is_one {
                return Some(
                    "credentials are not accepted in the URL; send the header Authorization: Bearer <token> (and consider this token leaked)"
                        .into(),
                );
            }
        }
        None
    }
}

/// Reads a token from a file that follows the secret-file rules (regular, owned by the
/// agent's user, 0600 or 0400); surrounding whitespace is dropped.
pub fn read_token_file(path: &Path, what: &str) -> Result<Vec<u8>> {
    let data = crate::os::privfile::read_private_file(path, what)?;
    let token = data.trim_ascii();
    check_token(token)
        .map_err(|rule| Error::Invalid(format!("{what} {}: {rule}", path.display())))?;
    Ok(token.to_vec())
}

/// The rule a token must follow to travel in a header; the message never shows it.
pub fn check_token(token: &[u8]) -> std::result::Result<(), String> {
    if token.len() < MIN_TOKEN_CHARS {
        return Err(format!(
            "the token is {} characters long; use at least {MIN_TOKEN_CHARS}",
            token.len()
        ));
    }
    if token.len() > MAX_TOKEN_CHARS {
        return Err(format!("the token is over {MAX_TOKEN_CHARS} characters"));
    }
    if !token.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(
            "the token holds spaces, control or non-ASCII characters; use printable ASCII".into(),
        );
    }
    Ok(())
}

/// Reads the generated token at `path`, or creates it (32 random bytes as 64 hex
/// characters, 0600). Two servers starting at once end up with the same token: the file
/// is written beside its place and linked in, which fails if another got there first.
pub fn load_or_create(path: &Path) -> Result<Vec<u8>> {
    match fs::symlink_metadata(path) {
        Ok(_) => return read_token_file(path, "token file"),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(format!("token file {}", path.display()), e)),
    }
    let mut raw = [0u8; 32];
    crate::os::proc::random_bytes(&mut raw).map_err(|e| Error::io("random token", e))?;
    let token = crate::model::id::hex(&raw);
    let tmp = temp_beside(path)?;
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(format!("{token}\n").as_bytes())?;
        f.sync_all()?;
        fs::hard_link(&tmp, path)
    })();
    let _ = fs::remove_file(&tmp);
    match written {
        Ok(()) => {
            if let Some(dir) = path.parent() {
                let _ = fs::File::open(dir).and_then(|d| d.sync_all());
            }
            Ok(token.into_bytes())
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => read_token_file(path, "token file"),
        Err(e) => Err(Error::io(
            format!("creating the token file {}", path.display()),
            e,
        )),
    }
}

fn temp_beside(path: &Path) -> Result<PathBuf> {
    let mut rnd = [0u8; 6];
    crate::os::proc::random_bytes(&mut rnd).map_err(|e| Error::io("random name", e))?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("token");
    Ok(path.with_file_name(format!(".{name}.{}.tmp", crate::model::id::hex(&rnd))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const FULL: &str = "0123456789abcdef0123456789abcdef";
    const SCOPED: &str = "scoped-token-0123456789";

    fn tokens() -> Tokens {
        Tokens::new(FULL.into(), Some(SCOPED.into())).unwrap()
    }

    #[test]
    fn accepts_exactly_one_bearer_header() {
        let t = tokens();
        let ok = format!("Bearer {FULL}");
        assert_eq!(t.check(&[&ok], ""), Ok(Access::Full));
        assert_eq!(
            t.check(&[&format!("Bearer {SCOPED}")], "limit=5"),
            Ok(Access::Scoped)
        );
        let upper = FULL.to_uppercase();
        let refused = [
            vec![],
            vec![ok.as_str(), ok.as_str()],
            vec!["Bearer"],
            vec!["Bearer "],
            vec![FULL],
            vec!["bearer 0123456789abcdef0123456789abcdef"],
            vec!["BEARER 0123456789abcdef0123456789abcdef"],
            vec!["Basic 0123456789abcdef0123456789abcdef"],
            vec!["Bearer  0123456789abcdef0123456789abcdef"],
            vec!["Bearer 0123456789abcdef0123456789abcde"],
            vec!["Bearer 0123456789abcdef0123456789abcdef0"],
            vec!["Bearer 0123456789"],
        ];
        for auth in refused {
            let r = t.check(&auth, "");
            assert!(matches!(r, Err(Error::Auth(_))), "{auth:?} -> {r:?}");
        }
        assert!(t.check(&[&format!("Bearer {upper}")], "").is_err());
    }

    #[test]
    fn refuses_tokens_in_the_url() {
        let t = tokens();
        let ok = format!("Bearer {FULL}");
        for q in [
            format!("token={FULL}"),
            "access_token=x".to_string(),
            "limit=1&TOKEN=x".to_string(),
            format!("x={SCOPED}"),
            format!("a=b&c={}", FULL.replace('0', "%30")),
            "api_key".to_string(),
        ] {
            let r = t.check(&[&ok], &q);
            assert!(
                matches!(r, Err(Error::Auth(ref m)) if m.contains("URL")),
                "{q}: {r:?}"
            );
            let r = t.check(&[], &q);
            assert!(matches!(r, Err(Error::Auth(_))), "{q}: {r:?}");
        }
        assert!(t.check(&[&ok], "status=running&limit=3").is_ok());
    }

    #[test]
    fn messages_never_show_a_token() {
        let t = tokens();
        for auth in [format!("Bearer {FULL}x"), format!("Bearer {SCOPED}")] {
            if let Err(e) = t.check(&[&auth], &format!("token={FULL}")) {
                assert!(!e.message().contains(FULL) && !e.message().contains(SCOPED));
            }
        }
        assert!(!format!("{t:?}").contains(FULL));
    }

    #[test]
    fn the_two_tokens_differ() {
        assert!(Tokens::new(FULL.into(), Some(FULL.into())).is_err());
    }

    #[test]
    fn generated_token_is_private_and_reused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(TOKEN_FILE);
        let a = load_or_create(&p).unwrap();
        assert_eq!(a.len(), 64);
        assert!(a.iter().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(load_or_create(&p).unwrap(), a);
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(load_or_create(&p), Err(Error::Invalid(_))));
    }

    #[test]
    fn token_files_follow_the_rules() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t");
        let write = |data: &str, mode: u32| {
            fs::write(&p, data).unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        };
        write(&format!("  {FULL}\n"), 0o600);
        assert_eq!(read_token_file(&p, "token file").unwrap(), FULL.as_bytes());
        write("short\n", 0o600);
        assert!(read_token_file(&p, "token file").is_err());
        write("has a space in the middle of it\n", 0o600);
        assert!(read_token_file(&p, "token file").is_err());
        write(FULL, 0o640);
        let e = read_token_file(&p, "token file").unwrap_err();
        assert!(!e.message().contains(FULL));
    }
}
