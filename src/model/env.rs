//! Environment variables a caller gives a job: the one place their names and values are
//! checked. The API's bodies, the CLI's `--env`, the launcher, the persisted environment
//! and secret names all call here, so a rule changes in one place.

use std::collections::BTreeMap;

use super::error::{Error, Result};

/// Environment variable every job process carries, naming its job (for sweeps and ports).
pub const JOB_ENV_MARKER: &str = "GITTERM_JOB_ID";

/// The longest single argument the kernel passes to a program (MAX_ARG_STRLEN, 32 pages,
/// including the terminating NUL): the command is one argument of `sh -c`, and each
/// variable one `NAME=value` string.
pub const MAX_ARG_BYTES: usize = 32 * 4096 - 1;

/// The name rule, for a message that must not echo the name (it may be part of a secret).
pub const NAME_RULE: &str = "the variable name is invalid; names must match [A-Za-z_][A-Za-z0-9_]* (letters, digits, '_', not starting with a digit)";

/// Whether a name matches `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_valid_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Checks an environment variable name against `[A-Za-z_][A-Za-z0-9_]*`.
pub fn check_name(name: &str) -> Result<()> {
    if is_valid_name(name) {
        return Ok(());
    }
    let mut shown: String = name.chars().take(64).collect();
    if shown.len() < name.len() {
        shown.push('…');
    }
    Err(Error::Invalid(format!(
        "variable name {shown:?} is invalid; names must match [A-Za-z_][A-Za-z0-9_]* (letters, digits, '_', not starting with a digit)"
    )))
}

/// Checks a variable name a caller may give a job (env or secret): valid, and not the
/// job marker, which sweeping and port attribution trust.
pub fn check_job_name(name: &str) -> Result<()> {
    check_name(name)?;
    if name == JOB_ENV_MARKER {
        return Err(Error::Invalid(format!(
            "{JOB_ENV_MARKER} is set by the agent for every job process; a job may not set it"
        )));
    }
    Ok(())
}

/// Checks an environment variable for a job.
pub fn check(name: &str, value: &str) -> Result<()> {
    check_job_name(name)?;
    if value.contains('\0') {
        return Err(Error::Invalid(format!(
            "environment variable {name} holds a NUL byte"
        )));
    }
    if name.len() + 1 + value.len() > MAX_ARG_BYTES {
        return Err(Error::Invalid(format!(
            "environment variable {name} is {} bytes; the kernel passes at most \
             {MAX_ARG_BYTES} bytes in one NAME=value string: put a large value in a file",
            name.len() + 1 + value.len()
        )));
    }
    Ok(())
}

/// Checks every variable of a job's environment, stopping at the first bad one.
pub fn check_all(env: &BTreeMap<String, String>) -> Result<()> {
    env.iter().try_for_each(|(k, v)| check(k, v))
}

/// Parses and checks one `NAME=value` assignment, as the CLI's `--env` takes it.
pub fn parse_assignment(kv: &str) -> Result<(String, String)> {
    let (k, v) = kv
        .split_once('=')
        .ok_or_else(|| Error::Invalid(format!("--env {kv:?} is malformed: use NAME=value")))?;
    check(k, v)?;
    Ok((k.to_string(), v.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_rule() {
        for good in ["A", "_", "_a1", "PATH", "a_B_9"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "1", "A B", "A=B", "Ä", "a-b", "a.b"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_job_marker_cannot_be_forged() {
        for f in [
            check(JOB_ENV_MARKER, "job_0123456789abcdef0123"),
            check_job_name(JOB_ENV_MARKER),
        ] {
            let Err(Error::Invalid(m)) = f else {
                panic!("marker accepted")
            };
            assert!(m.contains(JOB_ENV_MARKER), "{m}");
        }
        assert!(check("OTHER", "x").is_ok());
        let long = "x".repeat(MAX_ARG_BYTES);
        assert!(matches!(check("V", &long), Err(Error::Invalid(_))));
    }

    #[test]
    fn assignments_split_at_the_first_equals_sign() {
        assert_eq!(
            parse_assignment("A=b=c").unwrap(),
            ("A".to_string(), "b=c".to_string())
        );
        assert_eq!(parse_assignment("A=").unwrap(), ("A".into(), "".into()));
        let Err(Error::Invalid(m)) = parse_assignment("A") else {
            panic!("no '=' accepted")
        };
        assert!(m.contains("NAME=value"), "{m}");
        assert!(parse_assignment("1A=x").is_err());
        assert!(parse_assignment(&format!("{JOB_ENV_MARKER}=x")).is_err());
    }

    #[test]
    fn a_whole_environment_is_refused_at_its_first_bad_variable() {
        let mut env = BTreeMap::from([("A".to_string(), "1".to_string())]);
        assert!(check_all(&env).is_ok());
        env.insert("B".into(), "x\0y".into());
        let Err(Error::Invalid(m)) = check_all(&env) else {
            panic!("NUL accepted")
        };
        assert!(m.contains("B holds a NUL"), "{m}");
    }
}
