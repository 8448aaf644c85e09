//! Listening TCP ports, from `/proc/net/tcp` and `tcp6`, mapped to pids and jobs.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::Serialize;

use crate::model::JobId;

/// One listening TCP socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Listener {
    pub port: u16,
    pub address: String,
    /// The lowest pid holding the socket, if any process we may inspect holds it.
    pub pid: Option<i32>,
    /// The job that process belongs to, if any.
    pub job_id: Option<String>,
}

/// The socket state `/proc/net/tcp` prints for LISTEN.
const TCP_LISTEN: &str = "0A";

/// Parses `/proc/net/tcp` (or `tcp6` when `v6`): the local address, port and socket inode
/// of every socket in LISTEN state. Malformed lines are skipped.
pub fn parse_proc_net_tcp(text: &str, v6: bool) -> Vec<(IpAddr, u16, u64)> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
            if f.len() < 10 || !f[0].ends_with(':') || f[3] != TCP_LISTEN {
                return None;
            }
            let (addr, port) = f[1].split_once(':')?;
            let addr = parse_addr(addr, v6)?;
            let port = u16::from_str_radix(port, 16).ok()?;
            let inode = f[9].parse().ok()?;
            Some((addr, port, inode))
        })
        .collect()
}

/// The kernel prints the address as 32-bit words, each in host byte order: reading each
/// word back as a native integer restores the bytes as they were in memory (network order).
fn parse_addr(hex: &str, v6: bool) -> Option<IpAddr> {
    let words = if v6 { 4 } else { 1 };
    if hex.len() != words * 8 || !hex.is_ascii() {
        return None;
    }
    let mut bytes = [0u8; 16];
    for i in 0..words {
        let w = u32::from_str_radix(&hex[i * 8..i * 8 + 8], 16).ok()?;
        bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
    }
    Some(if v6 {
        IpAddr::V6(Ipv6Addr::from(bytes))
    } else {
        IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
    })
}

/// Every listening TCP socket, IPv4 and IPv6, sorted by port then address; a port and
/// address held by several sockets (SO_REUSEPORT) is listed once.
pub fn listening() -> Vec<Listener> {
    let mut socks: Vec<(IpAddr, u16, u64)> = Vec::new();
    for (path, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        if let Ok(text) = fs::read_to_string(path) {
            socks.extend(parse_proc_net_tcp(&text, v6));
        }
    }
    let owners = socket_owners(&socks.iter().map(|s| s.2).collect());
    let mut found: Vec<(u16, IpAddr, Option<i32>)> = socks
        .into_iter()
        .map(|(addr, port, inode)| (port, addr, owners.get(&inode).copied()))
        .collect();
    // Among duplicates, the one with a known owner (then the lowest pid) sorts first.
    found.sort_by_key(|&(port, addr, pid)| (port, addr, pid.is_none(), pid));
    found.dedup_by_key(|&mut (port, addr, _)| (port, addr));
    found
        .into_iter()
        .map(|(port, addr, pid)| Listener {
            port,
            address: addr.to_string(),
            pid,
            job_id: pid.and_then(job_of_pid),
        })
        .collect()
}

/// Maps socket inodes to the lowest pid holding them, by reading `/proc/<pid>/fd` links.
/// Processes we may not inspect are skipped.
fn socket_owners(wanted: &HashSet<u64>) -> HashMap<u64, i32> {
    let mut owners = HashMap::new();
    if wanted.is_empty() {
        return owners;
    }
    let Ok(dir) = fs::read_dir("/proc") else {
        return owners;
    };
    let mut pids: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    // Ascending, so the first owner found is the lowest pid (a forking server's parent)
    // and the scan can stop as soon as every socket has one.
    pids.sort_unstable();
    for pid in pids {
        let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = fs::read_link(fd.path()) else {
                continue;
            };
            let Some(inode) = target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:[")?.strip_suffix(']'))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            if wanted.contains(&inode) {
                owners.entry(inode).or_insert(pid);
            }
        }
        if owners.len() == wanted.len() {
            break;
        }
    }
    owners
}

/// The job a process belongs to: from its cgroup (`…/gitterm/job_<id>`), else from the
/// `GITTERM_JOB_ID` it was started with. `None` for processes outside jobs or gone.
pub fn job_of_pid(pid: i32) -> Option<String> {
    if let Ok(text) = fs::read_to_string(format!("/proc/{pid}/cgroup"))
        && let Some(id) = job_from_cgroup(&text)
    {
        return Some(id);
    }
    job_from_environ(&fs::read(format!("/proc/{pid}/environ")).ok()?)
}

fn job_from_cgroup(text: &str) -> Option<String> {
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    let parts: Vec<&str> = path.split('/').collect();
    // The last match: a job's own sub-cgroups sit below its folder.
    parts
        .windows(2)
        .rev()
        .find(|w| w[0] == "gitterm" && JobId::parse(w[1]).is_some())
        .map(|w| w[1].to_string())
}

fn job_from_environ(environ: &[u8]) -> Option<String> {
    let prefix = format!("{}=", crate::model::spec::JOB_ENV_MARKER);
    environ.split(|&b| b == 0).find_map(|var| {
        let id = std::str::from_utf8(var.strip_prefix(prefix.as_bytes())?).ok()?;
        JobId::parse(id).map(|id| id.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1111 1 0000000000000000 100 0 0 10 0
   1: 0100007F:0BB8 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 2222 1 0000000000000000 100 0 0 10 0
   2: 0100007F:0BB8 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 3333 1 0000000000000000 20 4 30 10 -1
   3: 0A01A8C0:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1 0000000000000000 100 0 0 10 0
";

    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F91 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 5555 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000001000000:0016 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 6666 1 0000000000000000 100 0 0 10 0
   2: 00000000000000000000000001000000:0016 00000000000000000000000001000000:D431 01 00000000:00000000 00:00000000 00000000     0        0 7777 1 0000000000000000 20 4 30 10 -1
   3: 000080FE00000000FF0E0A02FE1BA3C8:1389 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 8888 1 0000000000000000 100 0 0 10 0
";

    #[test]
    #[cfg(target_endian = "little")] // the samples were printed by a little-endian kernel
    fn parses_ipv4_listeners_only() {
        let got = parse_proc_net_tcp(TCP, false);
        let want: Vec<(IpAddr, u16, u64)> = vec![
            ("0.0.0.0".parse().unwrap(), 8080, 1111),
            ("127.0.0.1".parse().unwrap(), 3000, 2222),
            ("192.168.1.10".parse().unwrap(), 80, 4444),
        ];
        assert_eq!(got, want);
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn parses_ipv6_listeners_only() {
        let got = parse_proc_net_tcp(TCP6, true);
        let want: Vec<(IpAddr, u16, u64)> = vec![
            ("::".parse().unwrap(), 8081, 5555),
            ("::1".parse().unwrap(), 22, 6666),
            ("fe80::20a:eff:c8a3:1bfe".parse().unwrap(), 5001, 8888),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn skips_garbage_and_mismatched_families() {
        assert!(parse_proc_net_tcp("", false).is_empty());
        assert!(parse_proc_net_tcp("nonsense\n   0: zz:zz 0 0A", false).is_empty());
        // A v6 line read as v4 (and back) has the wrong address width.
        assert!(parse_proc_net_tcp(TCP6, false).is_empty());
        assert!(parse_proc_net_tcp(TCP, true).is_empty());
    }

    #[test]
    fn job_ids_from_cgroup_and_environ() {
        let id = "job_0123456789abcdef0123";
        assert_eq!(
            job_from_cgroup(&format!("0::/user.slice/gitterm/{id}\n")).as_deref(),
            Some(id)
        );
        assert_eq!(
            job_from_cgroup(&format!("12:pids:/x\n0::/gitterm/{id}/sub\n")).as_deref(),
            Some(id)
        );
        assert_eq!(job_from_cgroup(&format!("0::/other/{id}\n")), None);
        assert_eq!(job_from_cgroup("0::/gitterm/job_nothex\n"), None);
        assert_eq!(job_from_cgroup("0::/\n"), None);

        let env = format!("PATH=/bin\0GITTERM_JOB_ID={id}\0HOME=/root\0");
        assert_eq!(job_from_environ(env.as_bytes()).as_deref(), Some(id));
        assert_eq!(job_from_environ(b"GITTERM_JOB_ID=job_bad\0"), None);
        assert_eq!(
            job_from_environ(b"XGITTERM_JOB_ID=job_0123456789abcdef0123"),
            None
        );
        assert_eq!(job_from_environ(b""), None);
    }

    #[test]
    fn lists_our_own_listener() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let all = listening();
        let ours = all
            .iter()
            .find(|x| x.port == port && x.address == "127.0.0.1")
            .unwrap_or_else(|| panic!("port {port} not in {all:?}"));
        assert_eq!(ours.pid, Some(std::process::id() as i32));
        let keys: Vec<_> = all.iter().map(|x| (x.port, x.address.clone())).collect();
        let mut sorted = keys.clone();
        sorted.dedup();
        assert_eq!(keys, sorted, "duplicates");
        assert!(all.windows(2).all(|w| w[0].port <= w[1].port));
        let json = serde_json::to_value(ours).unwrap();
        assert!(json.get("jobId").is_some());
    }

    #[test]
    fn no_job_for_a_missing_pid() {
        assert_eq!(job_of_pid(i32::MAX), None);
    }
}
