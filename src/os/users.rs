//! The user database, read from `/etc/passwd` and `/etc/group` directly: the static build
//! has no NSS plugins, and a sandbox image's users live in those files.

use std::fs;

use crate::model::error::{Error, Result};
use crate::model::spec::JobUser;

/// Where the files are read (tests point these elsewhere).
const PASSWD: &str = "/etc/passwd";
const GROUP: &str = "/etc/group";

/// Looks up `name` in the system's user database.
pub fn lookup(name: &str) -> Result<JobUser> {
    let passwd = fs::read_to_string(PASSWD)
        .map_err(|e| Error::Invalid(format!("cannot read {PASSWD} to find user {name:?}: {e}")))?;
    let group = fs::read_to_string(GROUP).unwrap_or_default();
    lookup_in(name, &passwd, &group)
}

/// [`lookup`] over the files' contents (pure, for tests).
pub fn lookup_in(name: &str, passwd: &str, group: &str) -> Result<JobUser> {
    if name.is_empty() || name.contains([':', '\n', '\0']) {
        return Err(Error::Invalid(format!("{name:?} is not a user name")));
    }
    let entry = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 7 && f[0] == name)
        .ok_or_else(|| {
            Error::Invalid(format!(
                "no user {name:?} in {PASSWD}; create it (useradd {name}) or name another"
            ))
        })?;
    let num = |s: &str, what: &str| {
        s.parse::<u32>().map_err(|_| {
            Error::Invalid(format!(
                "user {name:?} in {PASSWD} has a malformed {what} {s:?}"
            ))
        })
    };
    let uid = num(entry[2], "uid")?;
    let gid = num(entry[3], "gid")?;
    let mut groups = vec![gid];
    for l in group.lines() {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() >= 4
            && f[3].split(',').any(|m| m == name)
            && let Ok(g) = f[2].parse::<u32>()
            && !groups.contains(&g)
        {
            groups.push(g);
        }
    }
    Ok(JobUser {
        name: name.to_string(),
        uid,
        gid,
        groups,
        home: if entry[5].is_empty() {
            "/".into()
        } else {
            entry[5].to_string()
        },
        shell: if entry[6].is_empty() {
            "/bin/sh".into()
        } else {
            entry[6].to_string()
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PW: &str = "root:x:0:0:root:/root:/bin/bash\nalice:x:1001:1001:Alice:/home/alice:/bin/zsh\nbad:x:zz:1:::\n";
    const GR: &str =
        "root:x:0:\nalice:x:1001:\ndocker:x:999:bob,alice\nwheel:x:10:alice\nother:x:5:bob\n";

    #[test]
    fn users_get_their_groups_home_and_shell() {
        let u = lookup_in("alice", PW, GR).unwrap();
        assert_eq!((u.uid, u.gid), (1001, 1001));
        assert_eq!(u.groups, vec![1001, 999, 10]);
        assert_eq!(
            (u.home.as_str(), u.shell.as_str()),
            ("/home/alice", "/bin/zsh")
        );
    }

    #[test]
    fn missing_and_malformed_users_are_named() {
        for (n, want) in [
            ("carol", "useradd carol"),
            ("bad", "malformed uid"),
            ("a:b", "not a user"),
        ] {
            let Err(Error::Invalid(m)) = lookup_in(n, PW, GR) else {
                panic!("{n}")
            };
            assert!(m.contains(want), "{m}");
        }
    }
}
