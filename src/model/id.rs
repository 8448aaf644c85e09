//! Job ids: `job_` + 20 lowercase hex characters, the only form that ever reaches a path.

use serde::{Deserialize, Deserializer, Serialize};
use std::fmt;

/// A validated job id: `job_` + 20 lowercase hex characters. Nothing else ever reaches a path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct JobId(String);

impl JobId {
    /// Parses an id, refusing anything that is not exactly `job_` + 20 lowercase hex.
    pub fn parse(s: &str) -> Option<JobId> {
        let hex = s.strip_prefix("job_")?;
        (hex.len() == 20 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| JobId(s.to_string()))
    }

    /// The id made of 10 random bytes (the caller draws them from the kernel).
    pub fn from_random(bytes: [u8; 10]) -> JobId {
        JobId(format!("job_{}", hex(&bytes)))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl<'de> Deserialize<'de> for JobId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<JobId, D::Error> {
        let s = String::deserialize(d)?;
        JobId::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!("{s:?} is not a job id (job_ + 20 lowercase hex)"))
        })
    }
}

impl PartialEq<str> for JobId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_strict() {
        assert!(JobId::parse("job_0123456789abcdef0123").is_some());
        for bad in [
            "",
            "job_",
            "job_0123456789ABCDEF0123",
            "job_0123456789abcdef012",
            "job_0123456789abcdef01234",
            "../../etc",
            "job_0123456789abcdef012/",
            "job_..23456789abcdef0123",
            "job_0123456789abcdef012\0",
            "JOB_0123456789abcdef0123",
        ] {
            assert!(JobId::parse(bad).is_none(), "{bad:?}");
        }
        let id = JobId::from_random([0xab; 10]);
        assert_eq!(JobId::parse(id.as_str()), Some(id.clone()));
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(serde_json::from_str::<JobId>(&json).unwrap(), id);
        assert!(serde_json::from_str::<JobId>("\"../../etc\"").is_err());
    }
}
