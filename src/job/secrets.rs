//! A job's secrets, gathered from the files a caller names and the values it passes: one
//! rule for the API's `secretFiles` + `secretEnv` and the CLI's `--secret-file`.

use std::path::PathBuf;

use crate::model::error::Result;
use crate::model::secret::SecretVar;
use crate::os::privfile;

/// Loads `files` in order, then adds `given`; a later name replaces an earlier one, so a
/// later file wins over an earlier one and a given value over every file. Each file must
/// pass the private-file rules ([`privfile::load_file`]); the first that does not is the
/// error, naming the file.
pub fn gather(files: &[PathBuf], given: Vec<SecretVar>) -> Result<Vec<SecretVar>> {
    let mut secrets: Vec<SecretVar> = Vec::new();
    for f in files {
        for var in privfile::load_file(f)? {
            secrets.retain(|s| s.name != var.name);
            secrets.push(var);
        }
    }
    for var in given {
        secrets.retain(|s| s.name != var.name);
        secrets.push(var);
    }
    Ok(secrets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::error::Error;
    use crate::model::secret::Secret;
    use std::os::unix::fs::PermissionsExt;

    fn file(dir: &std::path::Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    fn shown(v: &[SecretVar]) -> Vec<(String, String)> {
        v.iter()
            .map(|s| (s.name.clone(), s.value.expose().to_string()))
            .collect()
    }

    #[test]
    fn later_files_and_given_values_win() {
        let d = tempfile::tempdir().unwrap();
        let one = file(d.path(), "one", "A=aaaa\nB=bbbb\n", 0o600);
        let two = file(d.path(), "two", "B=cccc\n", 0o400);
        let given = vec![SecretVar {
            name: "A".into(),
            value: Secret::new("dddd".into()),
        }];
        let got = gather(&[one, two], given).unwrap();
        let want = [("B", "cccc"), ("A", "dddd")].map(|(n, v)| (n.to_string(), v.to_string()));
        assert_eq!(shown(&got), want);
        assert!(gather(&[], Vec::new()).unwrap().is_empty());
    }

    #[test]
    fn a_file_others_can_read_is_refused_by_name() {
        let d = tempfile::tempdir().unwrap();
        let good = file(d.path(), "good", "A=aaaa\n", 0o600);
        let open = file(d.path(), "open", "B=bbbb\n", 0o644);
        let Err(Error::Invalid(m)) = gather(&[good, open.clone()], Vec::new()) else {
            panic!("a world-readable secret file was read")
        };
        assert!(m.contains(&open.display().to_string()), "{m}");
        assert!(!m.contains("bbbb"), "{m}");
    }
}
