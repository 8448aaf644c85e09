//! The files API against its attackers: a job that makes a tree too deep for a recursive
//! walk, uploads racing with one ETag, a folder too big to sort per page, bind mounts and
//! hard links that name the state root's files elsewhere, the agent's own process in
//! /proc, and procfs files whose size the kernel makes up.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use crate::util::*;

use crate::util::{percent as enc, percent_path as q};

/// A folder on tmpfs where there is one (the shared disk's journal makes deep and wide
/// trees slow to make and remove, not harder for the agent), else in `beside`.
fn scratch(beside: &Path) -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir_in(beside))
        .unwrap()
}

/// VmHWM (peak resident set) of a process, in KiB.
fn peak_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A mount made by a test, unmounted when dropped (a failing test included).
struct Mount(PathBuf);

impl Mount {
    fn bind(from: &Path, at: &Path) -> Option<Mount> {
        let ok = Command::new("mount")
            .arg("--bind")
            .arg(from)
            .arg(at)
            .status()
            .is_ok_and(|st| st.success());
        if !ok {
            skip_root("the bind-mount case: mount --bind is not allowed here");
        }
        ok.then(|| Mount(at.to_path_buf()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// One GET on a connection of its own, its body read to the end whatever its framing
/// (the harness's client reads only `Content-Length` bodies): status, headers, body.
fn get_whole(s: &Server, target: &str) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut t = TcpStream::connect(&s.addr).unwrap();
    t.set_read_timeout(Some(LONG)).unwrap();
    write!(
        t,
        "GET {target} HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        s.token
    )
    .unwrap();
    let mut all = Vec::new();
    t.read_to_end(&mut all).unwrap();
    let end = all.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&all[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut rest = &all[end + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    if !chunked {
        return (status, headers, rest.to_vec());
    }
    let mut body = Vec::new();
    loop {
        let nl = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a chunk size line");
        let size =
            usize::from_str_radix(std::str::from_utf8(&rest[..nl]).unwrap().trim(), 16).unwrap();
        rest = &rest[nl + 2..];
        if size == 0 {
            break;
        }
        body.extend_from_slice(&rest[..size]);
        assert_eq!(&rest[size..size + 2], b"\r\n", "a chunk ends with CRLF");
        rest = &rest[size + 2..];
    }
    (status, headers, body)
}

#[test]
fn a_job_made_tree_ten_thousand_levels_deep_is_deleted_while_serve_answers() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let base = scratch(s.dir());
    let top = base.path().join("d");
    // The job makes the tree as any job can: 20 steps of 500 levels, each from the last.
    let cmd = format!(
        "cd '{}' && c=$(printf 'd/%.0s' $(seq 500)) && for i in $(seq 20); do mkdir -p \"$c\" && cd -P \"$c\" || exit 1; done && echo leaf > leaf && ln -s / up",
        base.path().display()
    );
    let r = c.post("/v1/jobs", &json!({"command": cmd, "waitSeconds": 300}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["exitCode"], 0, "{}", r.text());
    // Health is asked all along the delete on another connection.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (stop, addr) = (Arc::clone(&stop), s.addr.clone());
        std::thread::spawn(move || {
            let mut h = Client::connect(&addr);
            let mut seen = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                seen.push(h.get("/v1/health").status);
            }
            seen
        })
    };
    let r = c.send(
        "DELETE",
        &format!("/v1/files?path={}&recursive=true", q(&top)),
        &[],
        None,
    );
    stop.store(true, Ordering::SeqCst);
    let seen = watcher.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["deleted"], true);
    assert!(!top.exists(), "the tree is gone");
    assert!(
        !seen.is_empty() && seen.iter().all(|&st| st == 200),
        "{seen:?}"
    );
    assert!(alive(s.pid() as i64), "serve is up");
    let r = c.get(&format!("/v1/files/list?path={}", q(base.path())));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["entries"], json!([]));
    assert!(
        Path::new("/bin").exists(),
        "the symlink to / was removed, not followed"
    );
}

#[test]
fn of_uploads_racing_with_one_etag_exactly_one_wins_whole() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let f = s.dir().join("race.txt");
    std::fs::write(&f, "v0").unwrap();
    let n = 16;
    for round in 0..10 {
        let etag = c.get(&format!("/v1/files/stat?path={}", q(&f))).json()["etag"]
            .as_str()
            .unwrap()
            .to_string();
        let barrier = Arc::new(Barrier::new(n));
        let writers: Vec<_> = (0..n)
            .map(|i| {
                let (barrier, addr, token) =
                    (Arc::clone(&barrier), s.addr.clone(), s.token.clone());
                let (etag, target) = (etag.clone(), q(&f));
                std::thread::spawn(move || {
                    let mut w = Client::connect(&addr).token(&token);
                    let body = format!("round {round} writer {i};")
                        .repeat(2000)
                        .into_bytes();
                    barrier.wait();
                    let r = w.send(
                        "PUT",
                        &format!("/v1/files/content?path={target}"),
                        &[("If-Match", &etag)],
                        Some(&body),
                    );
                    (r.status, r.code(), body)
                })
            })
            .collect();
        let results: Vec<_> = writers.into_iter().map(|t| t.join().unwrap()).collect();
        let won: Vec<_> = results.iter().filter(|r| r.0 == 200).collect();
        assert_eq!(
            won.len(),
            1,
            "round {round}: {:?}",
            results.iter().map(|r| r.0).collect::<Vec<_>>()
        );
        for r in results.iter().filter(|r| r.0 != 200) {
            assert_eq!((r.0, r.1.as_str()), (409, "conflict"), "round {round}");
        }
        assert_eq!(
            std::fs::read(&f).unwrap(),
            won[0].2,
            "round {round}: the winner's body, whole"
        );
    }
    let left: Vec<_> = std::fs::read_dir(s.dir())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".gitterm-upload-")
        })
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn listing_a_200000_entry_folder_costs_the_page_not_the_folder() {
    let s = Server::start(&[]);
    let base = scratch(s.dir());
    let big = base.path().join("big");
    std::fs::create_dir(&big).unwrap();
    let pad = "n".repeat(60);
    let mut names: Vec<String> = (0..200_000u64)
        .map(|i| format!("{:06}-{pad}", (i * 7919) % 200_000))
        .collect();
    for n in &names {
        std::fs::File::create(big.join(n)).unwrap();
    }
    names.sort();
    let target = format!("/v1/files/list?path={}&limit=10", q(&big));
    let r = s.client().get(&target);
    assert_eq!(r.status, 200, "{}", r.text());
    let first: Vec<String> = r.json()["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            e["path"]
                .as_str()
                .unwrap()
                .rsplit('/')
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(first, names[..10]);
    let before = peak_kib(s.pid());
    let listers: Vec<_> = (0..12)
        .map(|i| {
            let (addr, token, target) = (s.addr.clone(), s.token.clone(), target.clone());
            let cursor = names[i * 1000]
                .bytes()
                .map(|b| format!("{b:02x}"))
                .collect::<String>();
            std::thread::spawn(move || {
                let mut c = Client::connect(&addr).token(&token);
                for t in [target.clone(), format!("{target}&cursor={cursor}")] {
                    let r = c.get(&t);
                    assert_eq!(r.status, 200, "{}", r.text());
                    assert_eq!(r.json()["entries"].as_array().unwrap().len(), 10);
                }
            })
        })
        .collect();
    for l in listers {
        l.join().unwrap();
    }
    let after = peak_kib(s.pid());
    eprintln!(
        "serve's peak RSS: {before} KiB before 12 concurrent listings of 200,000 entries, {after} KiB after"
    );
    // Sorting the whole folder per request took 50 MiB and more each; a page is a few KiB.
    assert!(after < before + 24 * 1024, "{before} KiB -> {after} KiB");
}

#[test]
fn paging_gives_every_name_once_and_in_order_while_the_folder_changes() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let dir = s.dir().join("pages");
    std::fs::create_dir(&dir).unwrap();
    let mut stable: Vec<String> = (0..1500)
        .map(|i| match i % 5 {
            0 => format!("s{i:04}"),
            1 => format!("S {i} +%"),
            2 => format!("é{i}"),
            3 => format!(".hidden{i}"),
            _ => format!("z{i}~"),
        })
        .collect();
    for n in &stable {
        std::fs::write(dir.join(n), "").unwrap();
    }
    stable.sort();
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (stop, dir) = (Arc::clone(&stop), dir.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let _ = std::fs::write(dir.join(format!("m{}", i % 997 * 13)), "");
                if i >= 40 {
                    let _ = std::fs::remove_file(dir.join(format!("m{}", (i - 40) % 997 * 13)));
                }
                i += 1;
            }
        })
    };
    let mut got: Vec<String> = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut t = format!("/v1/files/list?path={}&limit=7", q(&dir));
        if let Some(cur) = &cursor {
            t.push_str(&format!("&cursor={cur}"));
        }
        let r = c.get(&t);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let page = v["entries"].as_array().unwrap();
        assert!(page.len() <= 7);
        got.extend(page.iter().map(|e| {
            e["path"]
                .as_str()
                .unwrap()
                .rsplit('/')
                .next()
                .unwrap()
                .to_string()
        }));
        match v["next"].as_str() {
            Some(n) => cursor = Some(n.to_string()),
            None => break,
        }
    }
    stop.store(true, Ordering::SeqCst);
    churn.join().unwrap();
    assert!(
        got.windows(2).all(|w| w[0] < w[1]),
        "sorted, each name once"
    );
    let kept: Vec<&String> = got.iter().filter(|n| !n.starts_with('m')).collect();
    assert_eq!(
        kept,
        stable.iter().collect::<Vec<_>>(),
        "every name the folder kept"
    );
}

#[test]
fn bind_mounts_and_hard_links_of_the_state_root_are_refused() {
    if !is_root() {
        return skip_root("not root, so no bind mount can be made");
    }
    // Root mode: the files thread may read anything, so only the guard stands between a
    // client and the state root.
    let s = Server::start(&[]);
    let mut c = s.client();
    let r = c.post("/v1/jobs", &json!({"command": "echo x", "waitSeconds": 30}));
    let id = r.json()["id"].as_str().unwrap().to_string();
    let elsewhere = s.dir().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let refused = |what: &str, r: Resp| {
        assert_eq!(r.code(), "forbidden", "{what}: {} {}", r.status, r.text());
        assert!(
            r.text().contains("state root"),
            "{what}: the guard said it: {}",
            r.text()
        );
    };

    let view = elsewhere.join("jobs-view");
    std::fs::create_dir(&view).unwrap();
    if let Some(_m) = Mount::bind(&s.home.join("jobs"), &view) {
        let r = c.get(&format!("/v1/files/list?path={}", q(&view)));
        refused("list of the bound jobs/", r);
        let rec = view.join(&id).join("job.json");
        let r = c.get(&format!("/v1/files/content?path={}", q(&rec)));
        refused("a job record through the bind mount", r);
        let r = c.send(
            "PUT",
            &format!("/v1/files/content?path={}", q(&view.join("planted"))),
            &[],
            Some(b"x"),
        );
        refused("a write into the bound jobs/", r);
        let r = c.send(
            "DELETE",
            &format!("/v1/files?path={}&recursive=true", q(&view.join(&id))),
            &[],
            None,
        );
        refused("a delete inside the bound jobs/", r);
        let r = c.post(
            "/v1/files/mkdir",
            &json!({"path": view.join("a/b").display().to_string(), "parents": true}),
        );
        refused("mkdir inside the bound jobs/", r);
        assert!(!s.home.join("jobs/planted").exists() && s.home.join("jobs").join(&id).exists());
    }

    let tok_view = elsewhere.join("token-view");
    std::fs::write(&tok_view, "").unwrap();
    if let Some(_m) = Mount::bind(&s.home.join("agent.token"), &tok_view) {
        let r = c.get(&format!("/v1/files/content?path={}", q(&tok_view)));
        refused("the bound agent.token", r);
        let r = c.get(&format!("/v1/files/stat?path={}", q(&tok_view)));
        refused("stat of the bound agent.token", r);
    }

    let home_user = TestUser::create("fhard");
    let link_dir = home_user
        .as_ref()
        .map_or(elsewhere.clone(), |u| u.home.clone());
    let link = link_dir.join("token.link");
    match std::fs::hard_link(s.home.join("agent.token"), &link) {
        Ok(()) => {
            let r = c.get(&format!("/v1/files/content?path={}", q(&link)));
            refused("a hard link to agent.token", r);
            let r = c.send(
                "PUT",
                &format!("/v1/files/content?path={}", q(&link)),
                &[],
                Some(b"pwned"),
            );
            refused("a write through a hard link to agent.token", r);
            std::fs::remove_file(&link).unwrap();
        }
        Err(e) => skip(&format!(
            "the hard-link case: no hard link across devices here ({e})"
        )),
    }
    // A file of one's own with two names is served as ever.
    std::fs::write(elsewhere.join("a"), "mine").unwrap();
    std::fs::hard_link(elsewhere.join("a"), elsewhere.join("b")).unwrap();
    let r = c.get(&format!(
        "/v1/files/content?path={}",
        q(&elsewhere.join("b"))
    ));
    assert_eq!((r.status, r.body.as_slice()), (200, &b"mine"[..]));
    assert_eq!(
        std::fs::read_to_string(s.home.join("agent.token"))
            .unwrap()
            .trim(),
        s.token
    );
}

#[test]
fn the_job_users_files_api_sees_no_more_of_serve_than_the_job_user_and_reads_proc_whole() {
    let Some(u) = TestUser::create("fproc") else {
        return;
    };
    let s = Server::start(&["--job-user", &u.name]);
    let mut c = s.client();
    let me = s.pid();
    for (route, path) in [
        ("list", format!("/proc/{me}/fd")),
        ("list", format!("/proc/{me}/map_files")),
        ("list", format!("/proc/{me}/task/{me}/fd")),
        ("list", format!("/proc/{me}/fdinfo")),
        ("content", format!("/proc/{me}/environ")),
        ("content", format!("/proc/{me}/maps")),
        ("list", "/proc/self/fd".to_string()),
        ("list", "/proc/thread-self/fd".to_string()),
        ("content", "/proc/self/environ".to_string()),
    ] {
        let r = c.get(&format!("/v1/files/{route}?path={}", enc(&path)));
        assert_eq!(
            r.code(),
            "forbidden",
            "{route} {path}: {} {}",
            r.status,
            r.text()
        );
    }
    // What the job user may read of its own job is served, whole, though procfs says
    // its size is 0.
    let big = "v".repeat(20_000);
    let r = c.post(
        "/v1/jobs",
        &json!({"command": "sleep 60", "background": true, "env": {"BIG": big}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let job = r.json();
    let pid = int(&job, "pid");
    let environ = format!("/proc/{pid}/environ");
    let want = std::fs::read(&environ).unwrap();
    assert!(want.len() > 20_000);
    let (status, _, body) = get_whole(&s, &format!("/v1/files/content?path={}", enc(&environ)));
    assert_eq!(status, 200);
    assert_eq!(body, want, "the job's environ, whole");
    let (status, _, body) = get_whole(&s, "/v1/files/content?path=/proc/cpuinfo");
    assert_eq!(status, 200);
    let cpus = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .lines()
            .filter(|l| l.starts_with("processor"))
            .count()
    };
    let direct = std::fs::read("/proc/cpuinfo").unwrap();
    assert!(
        cpus(&direct) > 0 && cpus(&body) == cpus(&direct),
        "{} bytes",
        body.len()
    );
    let online = "/sys/devices/system/cpu/online";
    if let Ok(want) = std::fs::read(online) {
        let (status, _, body) = get_whole(&s, &format!("/v1/files/content?path={online}"));
        assert_eq!((status, body), (200, want));
    }
    let id = job["id"].as_str().unwrap();
    c.post(&format!("/v1/jobs/{id}/cancel"), &json!({}));
}
