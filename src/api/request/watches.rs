//! The body of `POST /v1/files/watches`.

use super::{Fields, Shape, object};
use crate::model::error::{Error, Result};

/// The fields of a `POST /v1/files/watches` body.
pub const WATCH_FIELDS: &[&str] = &["path", "recursive"];
const WATCH: Shape = Shape {
    known: WATCH_FIELDS,
    required: &["path"],
};

/// A parsed `POST /v1/files/watches` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchBody {
    pub path: String,
    pub recursive: bool,
}

/// Parses a `POST /v1/files/watches` body.
pub fn watch_body(body: &[u8]) -> Result<WatchBody> {
    let map = object(body)?;
    let f = Fields::new(&map, &WATCH)?;
    Ok(WatchBody {
        path: f
            .string("path")?
            .ok_or_else(|| Error::Invalid("path is missing".into()))?
            .to_string(),
        recursive: f.boolean("recursive")?.unwrap_or(false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies() {
        let b = watch_body(br#"{"path": "w", "recursive": true}"#).unwrap();
        assert_eq!((b.path.as_str(), b.recursive), ("w", true));
        assert!(!watch_body(br#"{"path": "w"}"#).unwrap().recursive);
        assert!(watch_body(br#"{"recursive": true}"#).is_err());
        assert!(watch_body(br#"{"path": "w", "recurse": true}"#).is_err());
    }
}
