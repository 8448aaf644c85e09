//! Where an entry stands in a job listing, and the cursor that names it between pages.

use std::cmp::Reverse;

use crate::model::JobId;
use crate::model::error::{Error, Result};

/// An entry's place in `GET /v1/jobs`: readable records newest first (by `createdAt`,
/// ties by id), then the corrupt ones by id. A page's `next` is the cursor of its last
/// entry and the next page starts just after that place, so following `next` never repeats
/// an entry nor skips one that was there all along, even if the entry it names is gone.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Place {
    Job(Reverse<String>, JobId),
    Corrupt(JobId),
}

impl Place {
    /// A readable record's place.
    pub fn job(created_at: &str, id: JobId) -> Place {
        Place::Job(Reverse(created_at.to_string()), id)
    }

    /// The cursor naming this place: `CREATED_AT~ID` for a record, the bare id for a
    /// corrupt one. Only characters that need no escape in a query string, for the
    /// records the agent writes.
    pub fn cursor(&self) -> String {
        match self {
            Place::Job(Reverse(at), id) => format!("{at}~{id}"),
            Place::Corrupt(id) => id.to_string(),
        }
    }

    /// Parses a cursor that [`Place::cursor`] made.
    pub fn parse(s: &str) -> Result<Place> {
        let bad = || {
            let shown: String = s.chars().take(64).collect();
            Error::Invalid(format!(
                "cursor {shown:?} is not one this server gave: pass back a listing's `next` as it is"
            ))
        };
        let (at, id) = match s.rsplit_once('~') {
            Some((at, id)) => (Some(at), id),
            None => (None, s),
        };
        let id = JobId::parse(id).ok_or_else(bad)?;
        match at {
            Some(at) if at.len() > 64 || at.chars().any(char::is_control) => Err(bad()),
            Some(at) => Ok(Place::job(at, id)),
            None => Ok(Place::Corrupt(id)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> JobId {
        JobId::parse(&format!("job_{n:020x}")).unwrap()
    }

    #[test]
    fn newest_first_ties_by_id_then_corrupt_ones() {
        let mut v = vec![
            Place::Corrupt(id(2)),
            Place::job("2026-01-01T00:00:00.000Z", id(3)),
            Place::Corrupt(id(1)),
            Place::job("2026-01-02T00:00:00.000Z", id(9)),
            Place::job("2026-01-01T00:00:00.000Z", id(1)),
        ];
        v.sort();
        assert_eq!(
            v,
            [
                Place::job("2026-01-02T00:00:00.000Z", id(9)),
                Place::job("2026-01-01T00:00:00.000Z", id(1)),
                Place::job("2026-01-01T00:00:00.000Z", id(3)),
                Place::Corrupt(id(1)),
                Place::Corrupt(id(2)),
            ]
        );
    }

    #[test]
    fn cursors_round_trip_and_strangers_are_invalid() {
        for p in [
            Place::job("2026-01-02T03:04:05.678Z", id(7)),
            Place::job("", id(7)),
            Place::Corrupt(id(7)),
        ] {
            assert_eq!(Place::parse(&p.cursor()).unwrap(), p);
        }
        assert_eq!(
            Place::job("2026-01-02T03:04:05.678Z", id(7)).cursor(),
            "2026-01-02T03:04:05.678Z~job_00000000000000000007"
        );
        for bad in [
            "",
            "~",
            "bogus",
            "2026~job_x",
            "2026~job_00000000000000000007~",
            "job_0000000000000000000G",
            &format!("{}~job_00000000000000000007", "1".repeat(65)),
            "a\u{1}~job_00000000000000000007",
        ] {
            assert!(
                matches!(Place::parse(bad), Err(Error::Invalid(_))),
                "{bad:?}"
            );
        }
    }
}
