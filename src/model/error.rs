//! The one error type of the agent's boundaries, mapped once to the contract's error codes
//! (HTTP) and to CLI exit statuses.

use std::fmt;

/// An error that reaches a caller: an HTTP client or a CLI user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// Bad input: the message names the field and the rule.
    Invalid(String),
    /// No such job (or a malformed id, which is treated the same).
    NotFound(String),
    /// The request conflicts with the state (e.g. a preview's server job died first).
    Conflict(String),
    /// A body or value over its size limit.
    TooLarge(String),
    /// What the request names is no longer kept (an events cursor from before the kept
    /// window or from another boot).
    Gone(String),
    /// Too many running jobs.
    RateLimited(String),
    /// Nothing happened in time.
    Timeout(String),
    /// Missing or wrong credentials.
    Auth(String),
    /// Credentials valid but not allowed to do this.
    Forbidden(String),
    /// The agent itself failed (I/O, spawn); the message says what and where.
    Internal(String),
    /// The filesystem is full (or a quota is reached); nothing was changed.
    NoSpace(String),
}

impl Error {
    /// The contract's error code.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Invalid(_) => "invalid",
            Error::NotFound(_) => "not_found",
            Error::Conflict(_) => "conflict",
            Error::TooLarge(_) => "too_large",
            Error::Gone(_) => "gone",
            Error::RateLimited(_) => "rate_limited",
            Error::Timeout(_) => "timeout",
            Error::Auth(_) => "auth",
            Error::Forbidden(_) => "forbidden",
            Error::Internal(_) => "internal",
            Error::NoSpace(_) => "no_space",
        }
    }

    /// The HTTP status that goes with [`Error::code`].
    pub fn http_status(&self) -> u16 {
        match self {
            Error::Invalid(_) => 400,
            Error::Auth(_) => 401,
            Error::Forbidden(_) => 403,
            Error::NotFound(_) => 404,
            Error::Conflict(_) => 409,
            Error::Gone(_) => 410,
            Error::TooLarge(_) => 413,
            Error::RateLimited(_) => 429,
            Error::Internal(_) => 500,
            Error::Timeout(_) => 504,
            Error::NoSpace(_) => 507,
        }
    }

    /// The CLI exit status: 125 when the agent itself failed, 2 for bad input, 1 otherwise.
    pub fn exit_status(&self) -> i32 {
        match self {
            Error::Internal(_) => 125,
            Error::Invalid(_) | Error::TooLarge(_) => 2,
            _ => 1,
        }
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        match self {
            Error::Invalid(m)
            | Error::NotFound(m)
            | Error::Conflict(m)
            | Error::TooLarge(m)
            | Error::Gone(m)
            | Error::RateLimited(m)
            | Error::Timeout(m)
            | Error::Auth(m)
            | Error::Forbidden(m)
            | Error::Internal(m)
            | Error::NoSpace(m) => m,
        }
    }

    /// Wraps an I/O error with what the agent was doing.
    pub fn io(what: impl fmt::Display, err: std::io::Error) -> Error {
        Error::Internal(format!("{what}: {err}"))
    }

    /// The contract's JSON error body.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"error": {"code": self.code(), "message": self.message()}})
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for Error {}

/// Shorthand for results at the agent's boundaries.
pub type Result<T> = std::result::Result<T, Error>;
