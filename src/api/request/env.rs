//! The persisted environment's body: `POST /v1/env`.

use std::collections::BTreeMap;

use super::{Fields, Shape, object};
use crate::model::error::Result;

/// The fields of a `POST /v1/env` body.
pub const ENV_FIELDS: &[&str] = &["set", "unset", "replace"];
const ENV: Shape = Shape {
    known: ENV_FIELDS,
    required: &[],
};

/// A parsed `POST /v1/env` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvBody {
    pub set: BTreeMap<String, String>,
    pub unset: Vec<String>,
    pub replace: bool,
}

/// Parses a `POST /v1/env` body.
pub fn env_body(body: &[u8]) -> Result<EnvBody> {
    let map = object(body)?;
    let f = Fields::new(&map, &ENV)?;
    Ok(EnvBody {
        set: f.string_map("set")?,
        unset: f.string_array("unset")?,
        replace: f.boolean("replace")?.unwrap_or(false),
    })
}
