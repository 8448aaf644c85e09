//! One job's life: the supervisor process. (Skeleton.)

/// Environment variable every job process carries, naming its job (for sweeps and ports).
pub const JOB_ENV_MARKER: &str = "GITTERM_JOB_ID";
