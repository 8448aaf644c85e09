//! Listening TCP ports, from `/proc/net/tcp` and `tcp6`, mapped to pids and jobs. (Skeleton.)
