//! Starting a job: folder, record, supervisor. (Skeleton.)
