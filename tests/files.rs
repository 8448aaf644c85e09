//! `/v1/files/...` on a real server: real files, real users, real mounts (these tests run
//! as root, as the agent does in its sandbox).

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::util::http::{Client, Resp};
use crate::util::sandbox::Sandbox;
use crate::util::server::Server;
use crate::util::users::TestUser;

use crate::util::{percent as enc, percent_path as p};

fn put(c: &mut Client, path: &Path, extra: &str, body: &[u8]) -> Resp {
    c.send(
        "PUT",
        &format!("/v1/files/content?path={}{extra}", p(path)),
        &[],
        Some(body),
    )
}

fn get(c: &mut Client, path: &Path) -> Resp {
    c.get(&format!("/v1/files/content?path={}", p(path)))
}

/// A mount made by a test, unmounted when dropped (a failing test included).
struct Mount(PathBuf);

impl Mount {
    fn new(args: &[&str], at: &Path) -> Option<Mount> {
        let ok = Command::new("mount")
            .args(args)
            .arg(at)
            .status()
            .is_ok_and(|st| st.success());
        ok.then(|| Mount(at.to_path_buf()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn temps_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(".gitterm-upload-"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn every_route_answers_and_refuses_as_documented() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let d = s.dir().join("f");
    std::fs::create_dir(&d).unwrap();
    let f = d.join("a.txt");

    // Create, read, stat.
    let r = put(&mut c, &f, "", b"hello");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["type"], "file");
    assert_eq!(r.json()["size"], 5);
    assert_eq!(r.json()["mode"], "0644");
    assert_eq!(std::fs::read(&f).unwrap(), b"hello");
    let r = get(&mut c, &f);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"hello"[..]));
    assert_eq!(r.header("content-length"), Some("5"));
    let etag = r.header("etag").unwrap().to_string();
    let st = c.get(&format!("/v1/files/stat?path={}", p(&f))).json();
    assert_eq!(st["etag"], etag.as_str());
    assert_eq!(st["symlinkTarget"], serde_json::Value::Null);

    // Range.
    let r = c.send(
        "GET",
        &format!("/v1/files/content?path={}", p(&f)),
        &[("Range", "bytes=1-3")],
        None,
    );
    assert_eq!((r.status, r.body.as_slice()), (206, &b"ell"[..]));
    assert_eq!(r.header("content-range"), Some("bytes 1-3/5"));
    let r = c.send(
        "GET",
        &format!("/v1/files/content?path={}", p(&f)),
        &[("Range", "bytes=9-")],
        None,
    );
    assert_eq!(r.status, 416, "{}", r.text());

    // If-Match, overwrite=false, mode, relative paths (HOME is the sandbox folder).
    let r = c.send(
        "PUT",
        &format!("/v1/files/content?path={}", p(&f)),
        &[("If-Match", "\"stale\"")],
        Some(b"x"),
    );
    assert_eq!((r.status, r.code()), (409, "conflict".into()));
    let r = c.send(
        "PUT",
        &format!("/v1/files/content?path={}&mode=0600", p(&f)),
        &[("If-Match", &etag)],
        Some(b"world"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["mode"], "0600");
    let r = put(&mut c, &f, "&overwrite=false", b"no");
    assert_eq!((r.status, r.code()), (409, "conflict".into()));
    assert_eq!(std::fs::read(&f).unwrap(), b"world");
    let r = c.send("PUT", "/v1/files/content?path=f/rel.txt", &[], Some(b"r"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(std::fs::read(d.join("rel.txt")).unwrap(), b"r");
    let r = put(&mut c, &d.join("x/y/z.txt"), "", b"z");
    assert_eq!(r.code(), "not_found", "{}", r.text());
    let r = put(&mut c, &d.join("x/y/z.txt"), "&createDirs=true", b"z");
    assert_eq!(r.status, 200, "{}", r.text());

    // Listing: sorted, paged.
    for i in 0..5 {
        std::fs::write(d.join(format!("n{i}")), "").unwrap();
    }
    std::os::unix::fs::symlink("a.txt", d.join("link")).unwrap();
    let mut names = Vec::new();
    let mut cursor = String::new();
    loop {
        let r = c.get(&format!(
            "/v1/files/list?path={}&limit=3&cursor={cursor}",
            p(&d)
        ));
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        for e in v["entries"].as_array().unwrap() {
            names.push(
                e["path"]
                    .as_str()
                    .unwrap()
                    .rsplit('/')
                    .next()
                    .unwrap()
                    .to_string(),
            );
            if e["type"] == "symlink" {
                assert_eq!(e["symlinkTarget"], "a.txt");
            }
        }
        match v["next"].as_str() {
            Some(n) => cursor = n.to_string(),
            None => break,
        }
    }
    assert_eq!(
        names,
        [
            "a.txt", "link", "n0", "n1", "n2", "n3", "n4", "rel.txt", "x"
        ]
    );

    // mkdir, move, delete.
    let r = c.post(
        "/v1/files/mkdir",
        &serde_json::json!({"path": d.join("m").display().to_string(), "mode": "0750"}),
    );
    assert_eq!(
        (r.status, r.json()["mode"].clone()),
        (200, "0750".into()),
        "{}",
        r.text()
    );
    let r = c.post(
        "/v1/files/mkdir",
        &serde_json::json!({"path": d.join("m").display().to_string()}),
    );
    assert_eq!(r.code(), "conflict");
    let r = c.post(
        "/v1/files/mkdir",
        &serde_json::json!({"path": d.join("m/1/2").display().to_string(), "parents": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = c.post(
        "/v1/files/move",
        &serde_json::json!({"from": f.display().to_string(), "to": d.join("n0").display().to_string()}),
    );
    assert_eq!(r.code(), "conflict");
    let r = c.post(
        "/v1/files/move",
        &serde_json::json!({"from": f.display().to_string(), "to": d.join("b.txt").display().to_string()}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!f.exists() && d.join("b.txt").exists());
    let r = c.send(
        "DELETE",
        &format!("/v1/files?path={}", p(&d.join("m"))),
        &[],
        None,
    );
    assert_eq!(r.code(), "conflict");
    let r = c.send(
        "DELETE",
        &format!("/v1/files?path={}&recursive=true", p(&d.join("m"))),
        &[],
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!d.join("m").exists());

    // Errors.
    assert_eq!(get(&mut c, &d.join("nope")).code(), "not_found");
    assert_eq!(get(&mut c, &d).code(), "invalid");
    for bad in ["", "a%00b", &"x".repeat(4097)] {
        let r = c.get(&format!("/v1/files/stat?path={bad}"));
        assert_eq!(r.code(), "invalid", "{bad:?}: {}", r.text());
    }
    assert_eq!(c.get("/v1/files/stat?path=/&bogus=1").code(), "invalid");
    let r = c.post(
        "/v1/files/move",
        &serde_json::json!({"from": "a", "to": "b", "x": 1}),
    );
    assert_eq!(r.code(), "invalid");
    assert!(temps_in(&d).is_empty());
}

#[test]
fn the_state_root_is_refused_however_it_is_named() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let home = s.home.clone();
    let token = home.join("agent.token");
    let d = s.dir().join("w");
    std::fs::create_dir(&d).unwrap();
    std::os::unix::fs::symlink(&token, d.join("tok")).unwrap();
    std::os::unix::fs::symlink(&home, d.join("root")).unwrap();
    let bind = s.dir().join("bind");
    std::fs::create_dir(&bind).unwrap();
    let home_arg = home.display().to_string();
    let mount = Mount::new(&["--bind", &home_arg], &bind);
    let bound = mount.is_some();
    let mut spellings = vec![
        token.display().to_string(),
        home.display().to_string(),
        format!("{}/../root/agent.token", d.display()),
        format!("{}/work/../root/agent.token", s.dir().display()),
        d.join("tok").display().to_string(),
        format!("{}/root/agent.token", d.display()),
        format!("/proc/self/root{}", token.display()),
        format!("/proc/{}/root{}", s.pid(), token.display()),
        "root/agent.token".to_string(),
    ];
    if bound {
        spellings.push(bind.join("agent.token").display().to_string());
        spellings.push(bind.display().to_string());
    }
    let link = d.join("tok").display().to_string();
    for sp in &spellings {
        let q = enc(sp);
        // A symlink to the token may itself be removed or moved (lstat: the link is
        // outside the state root); what it points to is refused.
        let link_itself = *sp == link;
        for (m, path) in [
            ("GET", format!("/v1/files/content?path={q}")),
            ("GET", format!("/v1/files/list?path={q}")),
            ("PUT", format!("/v1/files/content?path={q}")),
            ("DELETE", format!("/v1/files?path={q}&recursive=true")),
        ] {
            if link_itself && m == "DELETE" {
                continue;
            }
            let body = (m == "PUT").then_some(&b"pwned"[..]);
            let r = c.send(m, &path, &[], body);
            assert!(
                r.status == 403 || (m == "GET" && path.contains("list") && r.status == 400),
                "{m} {sp}: {} {}",
                r.status,
                r.text()
            );
            assert_ne!(r.status, 200, "{m} {sp}");
        }
        if !link_itself {
            let r = c.post(
                "/v1/files/move",
                &serde_json::json!({"from": sp, "to": d.join("stolen").display().to_string()}),
            );
            assert_ne!(r.status, 200, "move {sp}: {}", r.text());
        }
        let r = c.post(
            "/v1/files/mkdir",
            &serde_json::json!({"path": format!("{sp}/sub"), "parents": true}),
        );
        assert_ne!(r.status, 200, "mkdir {sp}: {}", r.text());
    }
    // Moving something into it, or deleting a folder above it, is refused too.
    std::fs::write(d.join("plain"), "p").unwrap();
    let r = c.post(
        "/v1/files/move",
        &serde_json::json!({"from": d.join("plain").display().to_string(), "to": home.join("x").display().to_string()}),
    );
    assert_eq!(r.code(), "forbidden", "{}", r.text());
    let r = c.send(
        "DELETE",
        &format!("/v1/files?path={}&recursive=true", p(s.dir())),
        &[],
        None,
    );
    assert_eq!(r.code(), "forbidden", "{}", r.text());
    drop(mount);
    let t = std::fs::read_to_string(&token).unwrap();
    assert!(!t.contains("pwned") && !t.is_empty());
    assert!(s.dir().join("w").exists() && s.dir().join("work").exists());
    assert!(!d.join("stolen").exists());
}

#[test]
fn a_symlink_swapped_in_a_loop_never_reaches_the_state_root() {
    let s = Server::start(&[]);
    let d = s.dir().join("race");
    std::fs::create_dir(&d).unwrap();
    let safe = d.join("safe");
    std::fs::create_dir(&safe).unwrap();
    std::fs::write(safe.join("agent.token"), "decoy").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (stop, d, home) = (Arc::clone(&stop), d.clone(), s.home.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let tmp = d.join(format!("l{i}"));
                let target: &Path = if i.is_multiple_of(2) {
                    &home
                } else {
                    &d.join("safe")
                };
                let _ = std::os::unix::fs::symlink(target, &tmp);
                let _ = std::fs::rename(&tmp, d.join("link"));
                i += 1;
            }
        })
    };
    let mut c = s.client();
    let q = enc(&d.join("link/agent.token").display().to_string());
    let real = std::fs::read(s.home.join("agent.token")).unwrap();
    for i in 0..300u32 {
        let r = if i.is_multiple_of(2) {
            c.get(&format!("/v1/files/content?path={q}"))
        } else {
            c.send(
                "PUT",
                &format!("/v1/files/content?path={q}"),
                &[],
                Some(b"decoy"),
            )
        };
        assert!(r.body != real, "the token leaked");
        assert!(
            r.status == 200 || r.status == 403 || r.status == 404,
            "{} {}",
            r.status,
            r.text()
        );
    }
    stop.store(true, Ordering::SeqCst);
    swapper.join().unwrap();
    assert_eq!(std::fs::read(s.home.join("agent.token")).unwrap(), real);
    assert!(temps_in(&s.home).is_empty());
}

#[test]
fn a_job_users_files_are_its_own_and_the_kernel_decides() {
    let Some(u) = TestUser::create("files") else {
        return;
    };
    let s = Server::start(&["--job-user", &u.name]);
    let mut c = s.client();
    let (uid, gid) = (u.uid, u.gid);
    // Relative to the user's HOME, owned by the user.
    let r = c.send("PUT", "/v1/files/content?path=mine.txt", &[], Some(b"m"));
    assert_eq!(r.status, 200, "{}", r.text());
    let m = std::fs::metadata(u.home.join("mine.txt")).unwrap();
    assert_eq!((m.uid(), m.gid()), (uid, gid));
    let r = c.post(
        "/v1/files/mkdir",
        &serde_json::json!({"path": "sub/deeper", "parents": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        std::fs::metadata(u.home.join("sub/deeper")).unwrap().uid(),
        uid
    );
    // Root's files: not writable, not readable when 0600, not deletable.
    let theirs = u.home.join("roots.txt");
    std::fs::write(&theirs, "root's").unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(get(&mut c, &theirs).code(), "forbidden");
    let in_etc = PathBuf::from(format!("/etc/{}-test", u.name));
    let r = put(&mut c, &in_etc, "", b"x");
    assert_eq!(r.code(), "forbidden", "{}", r.text());
    assert!(!in_etc.exists());
    let r = put(&mut c, Path::new("/root/x"), "", b"x");
    assert_eq!(r.code(), "forbidden", "{}", r.text());
    // Replacing a root-owned file in the user's own folder is the kernel's call (it
    // allows it: the folder is the user's), and the new file is the user's.
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(get(&mut c, &theirs).body, b"root's");
    let r = put(&mut c, &theirs, "", b"replaced");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(std::fs::metadata(&theirs).unwrap().uid(), uid);
    assert!(temps_in(&u.home).is_empty());
}

#[test]
fn over_the_cap_is_413_and_leaves_nothing() {
    let s = Server::start(&["--max-file-bytes", "1000"]);
    let d = s.dir().join("cap");
    std::fs::create_dir(&d).unwrap();
    let f = d.join("big");
    let mut c = s.client();
    let r = put(&mut c, &f, "", &[b'x'; 1000]);
    assert_eq!(r.status, 200, "{}", r.text());
    let r = put(&mut s.client(), &f, "", &[b'y'; 1001]);
    assert_eq!(
        (r.status, r.code()),
        (413, "too_large".into()),
        "{}",
        r.text()
    );
    assert!(r.text().contains("--max-file-bytes"), "{}", r.text());
    // Chunked: refused once it passes the cap.
    let mut c = s.client();
    let head = format!(
        "PUT /v1/files/content?path={} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\nTransfer-Encoding: chunked\r\n\r\n",
        p(&d.join("chunked")),
        s.token
    );
    let mut raw = head.into_bytes();
    for _ in 0..3 {
        raw.extend_from_slice(b"190\r\n");
        raw.extend_from_slice(&[b'z'; 400]);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    c.write_raw(&raw).unwrap();
    let r = c.read_response().unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(std::fs::read(&f).unwrap(), vec![b'x'; 1000]);
    assert!(!d.join("chunked").exists());
    assert!(temps_in(&d).is_empty());
}

#[test]
fn a_full_disk_is_507_and_the_original_stays() {
    let s = Server::start(&[]);
    let m = s.dir().join("small");
    std::fs::create_dir(&m).unwrap();
    let mount = Mount::new(&["-t", "tmpfs", "-o", "size=1m", "tmpfs"], &m);
    assert!(mount.is_some(), "mount -t tmpfs (root is needed)");
    let f = m.join("orig");
    std::fs::write(&f, "original").unwrap();
    let mut c = s.client();
    let r = put(&mut c, &f, "", &vec![b'q'; 2 << 20]);
    let left = temps_in(&m);
    let content = std::fs::read(&f).unwrap();
    drop(mount);
    assert_eq!(
        (r.status, r.code()),
        (507, "no_space".into()),
        "{}",
        r.text()
    );
    assert_eq!(content, b"original");
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_reader_sees_only_whole_old_or_whole_new_content() {
    let s = Server::start(&[]);
    let d = s.dir().join("atomic");
    std::fs::create_dir(&d).unwrap();
    let f = d.join("f");
    let version = |i: u8| vec![b'a' + i; 256 << 10];
    std::fs::write(&f, version(0)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, addr, token, f) = (
            Arc::clone(&stop),
            s.addr.clone(),
            s.token.clone(),
            f.clone(),
        );
        std::thread::spawn(move || {
            let mut c = Client::connect(&addr).token(&token);
            let mut reads = 0;
            while !stop.load(Ordering::SeqCst) {
                let r = get(&mut c, &f);
                assert_eq!(r.status, 200);
                assert_eq!(r.body.len(), 256 << 10);
                assert!(r.body.iter().all(|&b| b == r.body[0]), "a torn read");
                let direct = std::fs::read(&f).unwrap();
                assert!(direct.len() == 256 << 10 && direct.iter().all(|&b| b == direct[0]));
                reads += 1;
            }
            reads
        })
    };
    let mut c = s.client();
    for i in 1..=20 {
        let r = put(&mut c, &f, "", &version(i));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    stop.store(true, Ordering::SeqCst);
    assert!(reader.join().unwrap() > 0);
    assert_eq!(std::fs::read(&f).unwrap(), version(20));
}

/// Streams `len` bytes of a repeating pattern as one PUT, through `w`.
fn send_pattern(w: &mut impl Write, len: u64) -> std::io::Result<()> {
    let block: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 % 251) as u8).collect();
    let mut left = len;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        w.write_all(&block[..n])?;
        left -= n as u64;
    }
    Ok(())
}

#[test]
fn a_server_killed_mid_upload_leaves_the_target_as_it_was() {
    let sb = Arc::new(Sandbox::new());
    let mut s = Server::start_in(Arc::clone(&sb), "127.0.0.1:0", &[]);
    let d = s.dir().join("crash");
    std::fs::create_dir(&d).unwrap();
    let f = d.join("target");
    std::fs::write(&f, "before").unwrap();
    let mut conn = std::net::TcpStream::connect(&s.addr).unwrap();
    let len: u64 = 256 << 20;
    write!(
        conn,
        "PUT /v1/files/content?path={} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\nContent-Length: {len}\r\n\r\n",
        p(&f),
        s.token
    )
    .unwrap();
    send_pattern(&mut conn, 32 << 20).unwrap();
    // Killed once the upload fills its (unnamed, or else named) file beside the target.
    crate::util::eventually(
        crate::util::PROMPT,
        "serve to open the upload's file",
        || {
            let open = crate::util::open_files(s.pid());
            open.iter().any(|f| f.starts_with(&d)).then_some(())
        },
    );
    s.kill9();
    drop(conn);
    assert_eq!(std::fs::read(&f).unwrap(), b"before");
    assert!(temps_in(&d).is_empty(), "{:?}", temps_in(&d));
    // A restarted server serves the old content.
    let s = Server::start_in(sb, "127.0.0.1:0", &[]);
    assert_eq!(get(&mut s.client(), &f).body, b"before");
}

/// The resident memory of `pid` in KiB.
fn rss_kib(pid: u32) -> u64 {
    crate::util::rss_bytes(pid) >> 10
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn a_1_gib_upload_keeps_memory_flat_and_round_trips() {
    let s = Server::start(&[]);
    let d = s.dir().join("big");
    std::fs::create_dir(&d).unwrap();
    let src = d.join("src");
    send_pattern(&mut std::fs::File::create(&src).unwrap(), 1 << 30).unwrap();
    let dst = d.join("dst");
    let before = rss_kib(s.pid());
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, pid) = (Arc::clone(&stop), s.pid());
        std::thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(Ordering::SeqCst) {
                peak = peak.max(rss_kib(pid));
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        })
    };
    let url = format!("http://{}/v1/files/content?path={}", s.addr, p(&dst));
    let auth = format!("Authorization: Bearer {}", s.token);
    let t = Instant::now();
    let up = Command::new("curl")
        .args(["-sS", "-f", "-T"])
        .arg(&src)
        .args(["-H", &auth, &url])
        .output()
        .unwrap();
    let up_s = t.elapsed().as_secs_f64();
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let back = d.join("back");
    let t = Instant::now();
    let down = Command::new("curl")
        .args(["-sS", "-f", "-o"])
        .arg(&back)
        .args(["-H", &auth, &url])
        .output()
        .unwrap();
    let down_s = t.elapsed().as_secs_f64();
    stop.store(true, Ordering::SeqCst);
    let peak = sampler.join().unwrap();
    assert!(
        down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    let sum = sha256(&src);
    assert_eq!(sha256(&dst), sum);
    assert_eq!(sha256(&back), sum);
    let growth = peak.saturating_sub(before);
    eprintln!(
        "1 GiB: upload {:.0} MB/s, download {:.0} MB/s, RSS {before} KiB before, peak {peak} KiB",
        1024.0 / up_s,
        1024.0 / down_s
    );
    assert!(growth < 32 << 10, "RSS grew by {growth} KiB");
    let mut head = [0u8; 4];
    std::fs::File::open(&dst)
        .unwrap()
        .read_exact(&mut head)
        .unwrap();
    assert!(temps_in(&d).is_empty());
}
