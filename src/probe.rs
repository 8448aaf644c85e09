//! Readiness probes for previews: TCP connect or an HTTP request. (Skeleton.)
