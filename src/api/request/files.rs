//! File bodies: `POST /v1/files/mkdir` and `POST /v1/files/move`, and the octal mode they
//! and the upload's query take.

use super::{Fields, Shape, object, shown};
use crate::model::error::{Error, Result};

/// The fields of a `POST /v1/files/mkdir` body.
pub const MKDIR_FIELDS: &[&str] = &["path", "mode", "parents"];
const MKDIR: Shape = Shape {
    known: MKDIR_FIELDS,
    required: &["path"],
};

/// The fields of a `POST /v1/files/move` body.
pub const MOVE_FIELDS: &[&str] = &["from", "to", "overwrite"];
const MOVE: Shape = Shape {
    known: MOVE_FIELDS,
    required: &["from", "to"],
};

/// A parsed `POST /v1/files/mkdir` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MkdirBody {
    pub path: String,
    pub mode: Option<u32>,
    pub parents: bool,
}

/// Parses a `POST /v1/files/mkdir` body.
pub fn mkdir_body(body: &[u8]) -> Result<MkdirBody> {
    let map = object(body)?;
    let f = Fields::new(&map, &MKDIR)?;
    Ok(MkdirBody {
        path: f
            .string("path")?
            .ok_or_else(|| Error::Invalid("path is missing".into()))?
            .to_string(),
        mode: f.string("mode")?.map(file_mode).transpose()?,
        parents: f.boolean("parents")?.unwrap_or(false),
    })
}

/// A parsed `POST /v1/files/move` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveBody {
    pub from: String,
    pub to: String,
    pub overwrite: bool,
}

/// Parses a `POST /v1/files/move` body.
pub fn move_body(body: &[u8]) -> Result<MoveBody> {
    let map = object(body)?;
    let f = Fields::new(&map, &MOVE)?;
    let need = |n: &str| -> Result<String> {
        Ok(f.string(n)?
            .ok_or_else(|| Error::Invalid(format!("{n} is missing")))?
            .to_string())
    };
    Ok(MoveBody {
        from: need("from")?,
        to: need("to")?,
        overwrite: f.boolean("overwrite")?.unwrap_or(false),
    })
}

/// A file mode as octal digits (`"0644"`, `"755"`), at most `07777`.
pub fn file_mode(s: &str) -> Result<u32> {
    (!s.is_empty() && s.len() <= 5 && s.bytes().all(|b| (b'0'..=b'7').contains(&b)))
        .then(|| u32::from_str_radix(s, 8).ok())
        .flatten()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| {
            Error::Invalid(format!(
                "mode must be octal digits from 0 to 07777, got {}",
                shown(s)
            ))
        })
}
