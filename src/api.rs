//! The HTTP/JSON control endpoint (`serve`). (Skeleton.)
