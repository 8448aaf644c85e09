//! `GET`/`PUT /v1/files/archive`: folders out and in as one tar stream, judged by
//! Python's `tarfile` (tests/data/archive_tool.py), and every hostile archive refused
//! whole with the target exactly as it was.

use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::server::Server;
use crate::util::users::TestUser;
use crate::util::{Value, percent_path as p};

const TOOL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/archive_tool.py");

/// Runs the Python judge; its output lines as JSON values.
fn tool(args: &[&str]) -> Vec<Value> {
    let out = Command::new("python3")
        .arg(TOOL)
        .args(args)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "archive_tool {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn tree(dir: &Path) -> Vec<Value> {
    tool(&["tree", dir.to_str().unwrap()])
}

fn listing(archive: &Path) -> Vec<Value> {
    tool(&["list", archive.to_str().unwrap()])
}

/// `curl` streams both ways, as a client of a big archive would.
fn curl(s: &Server, args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "-o", "/dev/stdout", "-w", "\n%{http_code}"])
        .arg("-H")
        .arg(format!("Authorization: Bearer {}", s.token))
        .args(args)
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

fn get_archive(s: &Server, dir: &Path, format: &str, out: &Path) -> u16 {
    let url = format!(
        "http://{}/v1/files/archive?path={}&format={format}",
        s.addr,
        p(dir)
    );
    let o = Command::new("curl")
        .args(["-sS", "-o"])
        .arg(out)
        .args(["-w", "%{http_code}", "-H"])
        .arg(format!("Authorization: Bearer {}", s.token))
        .arg(url)
        .output()
        .expect("curl");
    String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

fn put_archive(s: &Server, dir: &Path, format: &str, file: &Path) -> (u16, Value) {
    let url = format!(
        "http://{}/v1/files/archive?path={}&format={format}",
        s.addr,
        p(dir)
    );
    let (code, body) = curl(s, &["-T", file.to_str().unwrap(), &url]);
    (code, serde_json::from_str(&body).unwrap_or(Value::Null))
}

fn staging_left(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(".gitterm-unpack-"))
                .collect()
        })
        .unwrap_or_default()
}

/// Entries without their mtime (folders' move as the test fills them).
fn without_dir_times(v: &[Value]) -> Vec<Value> {
    v.iter()
        .map(|e| {
            let mut e = e.clone();
            if e["type"] == "dir" {
                e["mtime"] = Value::Null;
            }
            e
        })
        .collect()
}

/// What an unpack keeps of a mode: setuid, setgid and sticky go.
fn unpacked_modes(v: &[Value]) -> Vec<Value> {
    v.iter()
        .map(|e| {
            let mut e = e.clone();
            if e["type"] != "symlink" {
                e["mode"] = (e["mode"].as_u64().unwrap() & 0o777).into();
            }
            e
        })
        .collect()
}

/// A tree with nested and empty folders, symlinks of every kind, modes, awkward and long
/// names, and one 100 MiB file.
fn build_tree(top: &Path) {
    let d = |rel: &str, mode: u32| {
        let p = top.join(rel);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    let f = |rel: &str, data: &[u8], mode: u32| {
        let p = top.join(rel);
        std::fs::write(&p, data).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    std::fs::create_dir_all(top).unwrap();
    d("a/b/c/d", 0o755);
    d("empty", 0o755);
    d("a/private", 0o700);
    d("a/empty-too", 0o750);
    f("a/b/c/d/deep.txt", b"deep\n", 0o644);
    f("a/private/secret.txt", b"only mine\n", 0o600);
    f("a/run.sh", b"#!/bin/sh\necho hi\n", 0o755);
    f("a/readonly.txt", b"do not touch\n", 0o444);
    f("a/setuid", b"not really a program\n", 0o4755);
    f("with space and \u{e9}.txt", b"unicode\n", 0o640);
    f("empty-file", b"", 0o644);
    let long = format!("{}/{}", "l".repeat(90), "n".repeat(120));
    std::fs::create_dir_all(top.join("l".repeat(90))).unwrap();
    f(&long, b"a name over 100 bytes\n", 0o644);
    symlink("b/c", top.join("a/rel-link")).unwrap();
    symlink("/etc/hostname", top.join("a/abs-link")).unwrap();
    symlink("does/not/exist", top.join("dangling")).unwrap();
    symlink(
        format!("{}/target", "t".repeat(150)),
        top.join("long-target"),
    )
    .unwrap();
    // 100 MiB of bytes that do not repeat in any short period.
    let mut big = Vec::with_capacity(100 << 20);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while big.len() < 100 << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        big.extend_from_slice(&x.to_le_bytes());
    }
    f("a/big.bin", &big, 0o644);
    std::fs::set_permissions(top.join("a/b"), std::fs::Permissions::from_mode(0o711)).unwrap();
}

#[test]
fn a_tree_round_trips_entry_by_entry_as_pythons_tarfile_reads_and_writes_it() {
    let s = Server::start(&[]);
    let src = s.dir().join("src");
    build_tree(&src);
    let want = tree(&src);
    assert!(want.len() > 20, "{want:?}");

    // Out: our archive, as tarfile reads it, is the tree entry by entry.
    for format in ["tar", "tar.gz"] {
        let file = s.dir().join(format!("out.{format}"));
        assert_eq!(get_archive(&s, &src, format, &file), 200, "{format}");
        assert_eq!(
            without_dir_times(&listing(&file)),
            without_dir_times(&want),
            "{format}: our archive"
        );
    }

    // In: tarfile's own archive, unpacked into a folder that does not exist yet.
    for format in ["tar", "tar.gz"] {
        let theirs = s.dir().join(format!("theirs.{format}"));
        let mut args = vec!["pack", src.to_str().unwrap(), theirs.to_str().unwrap()];
        if format == "tar.gz" {
            args.push("gz");
        }
        tool(&args);
        let dst = s.dir().join(format!("dst-{format}"));
        let (code, v) = put_archive(&s, &dst, format, &theirs);
        assert_eq!(code, 200, "{format}: {v}");
        assert_eq!(v["path"], dst.to_str().unwrap());
        assert_eq!(v["entries"].as_u64().unwrap() as usize, want.len());
        assert!(v["bytes"].as_u64().unwrap() > 100 << 20);
        assert_eq!(tree(&dst), unpacked_modes(&want), "{format}: unpacked");
        assert_eq!(
            std::fs::metadata(&dst).unwrap().mode() & 0o7777,
            std::fs::metadata(&src).unwrap().mode() & 0o7777,
            "the archive's top folder gives the new folder its mode"
        );
        assert!(staging_left(s.dir()).is_empty());
    }

    // Ours back in, merged into a folder that holds other things: they stay, what the
    // archive has replaces what was there.
    let merged = s.dir().join("merged");
    std::fs::create_dir_all(merged.join("a")).unwrap();
    std::fs::write(merged.join("keep.txt"), b"mine").unwrap();
    std::fs::write(merged.join("a/run.sh"), b"old").unwrap();
    symlink("/nowhere", merged.join("empty-file")).unwrap();
    let ours = s.dir().join("out.tar");
    let (code, v) = put_archive(&s, &merged, "tar", &ours);
    assert_eq!(code, 200, "{v}");
    assert_eq!(std::fs::read(merged.join("keep.txt")).unwrap(), b"mine");
    let got: Vec<Value> = tree(&merged)
        .into_iter()
        .filter(|e| e["name"] != "keep.txt")
        .collect();
    assert_eq!(
        without_dir_times(&got),
        without_dir_times(&unpacked_modes(&want))
    );
    assert!(staging_left(&merged).is_empty());
}

/// The target's entries and the bytes of its files, the outside folder's too.
fn snapshot(dirs: &[&Path]) -> Vec<Vec<Value>> {
    dirs.iter().map(|d| tree(d)).collect()
}

#[test]
fn every_hostile_archive_is_refused_whole_and_the_target_is_left_exactly_as_it_was() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let outside = s.dir().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("outside.txt"), b"not yours").unwrap();
    let target = s.dir().join("target");
    std::fs::create_dir_all(target.join("dir")).unwrap();
    std::fs::write(target.join("dir/kept.txt"), b"kept").unwrap();
    std::fs::write(target.join("fine.txt"), b"the old fine.txt").unwrap();
    symlink(&outside, target.join("there")).unwrap();
    let before = snapshot(&[&target, &outside]);

    let cases: &[(&str, u16, &str)] = &[
        ("dotdot", 400, "sub/../../escape.txt"),
        ("absolute", 400, "/tmp/gitterm-absolute-escape.txt"),
        ("through-own-symlink", 400, "out/gitterm-through-link.txt"),
        ("through-own-symlink-dotdot", 400, "up/escape.txt"),
        ("through-found-symlink", 400, "there"),
        ("hardlink-absolute", 400, "/etc/passwd"),
        ("hardlink-dotdot", 400, "../outside.txt"),
        ("hardlink-missing", 400, "not-in-the-archive.txt"),
        ("hardlink-through-symlink", 400, "l/passwd"),
        ("chardev", 400, "device"),
        ("blockdev", 400, "device"),
        ("fifo", 400, "FIFO"),
        ("long-name", 400, "over 4096 bytes"),
        ("long-name-gnu", 400, "over 4096 bytes"),
        ("long-part", 400, "over 255 bytes"),
        ("file-over-folder", 409, "\"dir\""),
    ];
    for &(kind, status, names) in cases {
        let file = s.dir().join(format!("{kind}.tar"));
        tool(&["hostile", kind, file.to_str().unwrap()]);
        let body = std::fs::read(&file).unwrap();
        let r = c.send(
            "PUT",
            &format!("/v1/files/archive?path={}&format=tar", p(&target)),
            &[],
            Some(&body),
        );
        assert_eq!(r.status, status, "{kind}: {}", r.text());
        let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.contains(names), "{kind}: {msg}");
        assert_eq!(
            snapshot(&[&target, &outside]),
            before,
            "{kind} changed something"
        );
        assert!(staging_left(&target).is_empty(), "{kind}: staging left");
        // Refused into a folder that does not exist: it still does not (the two that
        // clash only with what the target held are fine there).
        if matches!(kind, "through-found-symlink" | "file-over-folder") {
            c = s.client();
            continue;
        }
        let fresh = s.dir().join(format!("fresh-{kind}"));
        c = s.client();
        let r = c.send(
            "PUT",
            &format!("/v1/files/archive?path={}&format=tar", p(&fresh)),
            &[],
            Some(&body),
        );
        assert!(r.status >= 400, "{kind}: {}", r.text());
        assert!(!fresh.exists(), "{kind}");
        assert!(staging_left(s.dir()).is_empty(), "{kind}: staging left");
        c = s.client();
    }
    for escaped in [
        "/tmp/gitterm-absolute-escape.txt",
        "/tmp/gitterm-through-link.txt",
    ] {
        assert!(!Path::new(escaped).exists(), "{escaped}");
    }
    assert!(!s.dir().join("escape.txt").exists());

    // Nothing lands in the state root, even unpacked into the folder that holds it.
    let file = s.dir().join("state-root.tar");
    tool(&["hostile", "state-root", file.to_str().unwrap()]);
    let r = c.send(
        "PUT",
        &format!("/v1/files/archive?path={}&format=tar", p(s.dir())),
        &[],
        Some(&std::fs::read(&file).unwrap()),
    );
    assert_eq!(r.code(), "forbidden", "{}", r.text());
    assert!(!s.home.join("planted.txt").exists());
    assert!(
        !s.dir().join("fine.txt").exists(),
        "a refused archive left a part"
    );
    assert!(staging_left(s.dir()).is_empty());

    // Archives that are not whole: cut short anywhere, cut between two entries (no end
    // marker), garbage after the end, a gzip stream cut short.
    let good = s.dir().join("good.tar");
    let small = s.dir().join("small");
    std::fs::create_dir_all(small.join("x")).unwrap();
    for i in 0..5 {
        std::fs::write(small.join(format!("x/{i}.txt")), vec![b'a' + i as u8; 3000]).unwrap();
    }
    tool(&["pack", small.to_str().unwrap(), good.to_str().unwrap()]);
    let whole = std::fs::read(&good).unwrap();
    let good_gz = s.dir().join("good.tar.gz");
    tool(&[
        "pack",
        small.to_str().unwrap(),
        good_gz.to_str().unwrap(),
        "gz",
    ]);
    let whole_gz = std::fs::read(&good_gz).unwrap();
    // The offset just past the second file's data, padded: an entry boundary.
    let boundary = {
        let mut at = 0usize;
        let mut files = 0;
        loop {
            let h = &whole[at..at + 512];
            let size = usize::from_str_radix(
                std::str::from_utf8(&h[124..135])
                    .unwrap()
                    .trim_matches(char::from(0))
                    .trim(),
                8,
            )
            .unwrap_or(0);
            at += 512 + size.div_ceil(512) * 512;
            if h[156] == b'0' {
                files += 1;
                if files == 2 {
                    break at;
                }
            }
        }
    };
    let mut garbage = whole.clone();
    garbage.extend_from_slice(b"and then some more bytes that are not an archive");
    let cut: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "cut in the middle",
            whole[..whole.len() / 2].to_vec(),
            "tar",
        ),
        ("cut between entries", whole[..boundary].to_vec(), "tar"),
        ("garbage after the end", garbage, "tar"),
        (
            "gzip cut short",
            whole_gz[..whole_gz.len() - 6].to_vec(),
            "tar.gz",
        ),
        ("not gzip at all", whole.clone(), "tar.gz"),
    ];
    for (what, body, format) in cut {
        c = s.client();
        let r = c.send(
            "PUT",
            &format!("/v1/files/archive?path={}&format={format}", p(&target)),
            &[],
            Some(&body),
        );
        assert_eq!(r.code(), "invalid", "{what}: {}", r.text());
        assert_eq!(
            snapshot(&[&target, &outside]),
            before,
            "{what} changed something"
        );
        assert!(staging_left(&target).is_empty(), "{what}: staging left");
    }
    // The whole one is taken (so the refusals above were for what they said).
    c = s.client();
    let r = c.send(
        "PUT",
        &format!("/v1/files/archive?path={}&format=tar", p(&target)),
        &[],
        Some(&whole),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        std::fs::read(target.join("x/3.txt")).unwrap(),
        vec![b'd'; 3000]
    );
}

#[test]
fn a_client_that_goes_away_mid_upload_leaves_the_target_as_it_was() {
    let s = Server::start(&[]);
    let target = s.dir().join("target");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("a.txt"), b"before").unwrap();
    let small = s.dir().join("small");
    std::fs::create_dir(&small).unwrap();
    std::fs::write(small.join("a.txt"), vec![b'z'; 100_000]).unwrap();
    let file = s.dir().join("small.tar");
    tool(&["pack", small.to_str().unwrap(), file.to_str().unwrap()]);
    let whole = std::fs::read(&file).unwrap();
    let before = tree(&target);
    let mut c = s.client();
    let head = format!(
        "PUT /v1/files/archive?path={}&format=tar HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\n\r\n",
        p(&target),
        s.token,
        whole.len()
    );
    c.write_raw(head.as_bytes()).unwrap();
    c.write_raw(&whole[..whole.len() / 2]).unwrap();
    drop(c);
    crate::util::eventually(crate::util::PROMPT, "the staging folder to go", || {
        staging_left(&target).is_empty().then_some(())
    });
    assert_eq!(tree(&target), before);
}

#[test]
fn what_is_unpacked_is_capped_not_what_is_sent_so_a_gzip_bomb_is_stopped() {
    let s = Server::start(&["--max-file-bytes", "1048576"]);
    let target = s.dir().join("target");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("a.txt"), b"before").unwrap();
    let before = tree(&target);
    for (n, size, what) in [
        ("1", "268435456", "one 256 MiB file of zeros"),
        ("3", "524288", "three files of 512 KiB"),
    ] {
        let bomb = s.dir().join("bomb.tar.gz");
        tool(&["bomb", bomb.to_str().unwrap(), n, size]);
        assert!(std::fs::metadata(&bomb).unwrap().len() < 2 << 20, "{what}");
        let (code, v) = put_archive(&s, &target, "tar.gz", &bomb);
        assert_eq!(code, 413, "{what}: {v}");
        assert_eq!(v["error"]["code"], "too_large");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("--max-file-bytes"),
            "{v}"
        );
        assert_eq!(tree(&target), before, "{what}");
        assert!(staging_left(&target).is_empty());
    }
    // Under the cap, in: the cap is the sum of what the files hold.
    let ok = s.dir().join("ok.tar.gz");
    tool(&["bomb", ok.to_str().unwrap(), "2", "500000"]);
    let (code, v) = put_archive(&s, &target, "tar.gz", &ok);
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["bytes"], 1_000_000);
}

#[test]
fn packing_leaves_out_the_state_root_and_refuses_naming_what_the_job_user_cannot_read() {
    let s = Server::start(&[]);
    std::fs::write(s.sb.work().join("w.txt"), b"work").unwrap();
    // A hard link to a file of the state root, made by root elsewhere, is left out too.
    std::fs::hard_link(s.home.join("agent.token"), s.sb.work().join("token-link")).unwrap();
    let file = s.dir().join("all.tar");
    assert_eq!(get_archive(&s, s.dir(), "tar", &file), 200);
    let names: Vec<String> = listing(&file)
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert!(names.contains(&"work/w.txt".to_string()), "{names:?}");
    assert!(
        names.iter().all(|n| n != "root" && !n.starts_with("root/")),
        "the state root was packed: {names:?}"
    );
    assert!(!names.contains(&"work/token-link".to_string()), "{names:?}");
    let mut c = s.client();
    let r = c.get(&format!("/v1/files/archive?path={}", p(&s.home)));
    assert_eq!(r.code(), "forbidden", "{}", r.text());
    let r = c.get(&format!(
        "/v1/files/archive?path={}&format=zip",
        p(s.sb.work())
    ));
    assert_eq!(r.code(), "invalid", "{}", r.text());

    let Some(u) = TestUser::create("arch") else {
        return;
    };
    let s = Server::start(&["--job-user", &u.name]);
    let top = u.file("proj");
    std::fs::create_dir_all(top.join("sub")).unwrap();
    std::fs::write(top.join("sub/open.txt"), b"readable").unwrap();
    std::fs::write(top.join("sub/closed.txt"), b"root's").unwrap();
    let chown = |p: &Path| std::os::unix::fs::chown(p, Some(u.uid), Some(u.gid)).unwrap();
    for p in [top.clone(), top.join("sub"), top.join("sub/open.txt")] {
        chown(&p);
    }
    std::fs::set_permissions(
        top.join("sub/closed.txt"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let mut c = s.client();
    let r = c.get(&format!("/v1/files/archive?path={}", p(&top)));
    assert_eq!(r.code(), "forbidden", "{}", r.text());
    assert!(r.text().contains("sub/closed.txt"), "{}", r.text());

    // What the job user unpacks is the job user's.
    std::fs::remove_file(top.join("sub/closed.txt")).unwrap();
    let file = s.dir().join("proj.tar");
    assert_eq!(get_archive(&s, &top, "tar", &file), 200);
    let dst: PathBuf = u.file("copy");
    let (code, v) = put_archive(&s, &dst, "tar", &file);
    assert_eq!(code, 200, "{v}");
    for p in [dst.clone(), dst.join("sub"), dst.join("sub/open.txt")] {
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert_eq!((m.uid(), m.gid()), (u.uid, u.gid), "{}", p.display());
    }
    // And it may not unpack where it may not write.
    let (code, v) = put_archive(&s, Path::new("/etc/gitterm-archive-test"), "tar", &file);
    assert_eq!(code, 403, "{v}");
    assert!(!Path::new("/etc/gitterm-archive-test").exists());
}

/// Starts a chunked upload of `archive` into `target` and sends its first half (a slow
/// client), leaving the connection open.
fn half_sent(s: &Server, target: &Path, archive: &[u8]) -> crate::util::http::Client {
    let mut c = s.client();
    let head = format!(
        "PUT /v1/files/archive?path={}&format=tar HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\nTransfer-Encoding: chunked\r\n\r\n",
        p(target),
        s.token
    );
    c.write_raw(head.as_bytes()).unwrap();
    for chunk in archive[..archive.len() / 2].chunks(64 << 10) {
        c.write_raw(format!("{:x}\r\n", chunk.len()).as_bytes())
            .unwrap();
        c.write_raw(chunk).unwrap();
        c.write_raw(b"\r\n").unwrap();
    }
    c
}

/// A tar of a few files, 4 MiB in all (big enough that half of it has landed in staging).
fn big_archive(s: &Server) -> Vec<u8> {
    let src = s.dir().join("big-src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    for i in 0..4 {
        std::fs::write(
            src.join(format!("d/{i}.bin")),
            vec![b'a' + i as u8; 1 << 20],
        )
        .unwrap();
    }
    let file = s.dir().join("big.tar");
    tool(&["pack", src.to_str().unwrap(), file.to_str().unwrap()]);
    std::fs::read(&file).unwrap()
}

fn chown_to(u: &TestUser, p: &Path) {
    std::os::unix::fs::chown(p, Some(u.uid), Some(u.gid)).unwrap();
}

#[test]
fn a_server_killed_mid_unpack_leaves_no_staging_folder_after_its_next_start() {
    let Some(u) = TestUser::create("unpk") else {
        return;
    };
    let flags = ["--job-user", u.name.as_str()];
    let mut s = Server::start(&flags);
    let archive = big_archive(&s);
    // An existing target (staging inside it) and a missing one (staging beside it).
    let target = u.file("target");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("a.txt"), b"before").unwrap();
    // A folder with our kind of name that no unpack made: the job user's own, kept.
    let decoy = target.join(".gitterm-unpack-0123456789abcdef");
    std::fs::create_dir(&decoy).unwrap();
    std::fs::write(decoy.join("mine"), b"keep").unwrap();
    for p in [&target, &target.join("a.txt"), &decoy, &decoy.join("mine")] {
        chown_to(&u, p);
    }
    let fresh = u.file("fresh");
    let before = tree(&target);
    let _c1 = half_sent(&s, &target, &archive);
    let _c2 = half_sent(&s, &fresh, &archive);
    let staged = |dir: &Path| {
        staging_left(dir)
            .into_iter()
            .filter(|n| dir.join(n) != decoy)
            .collect::<Vec<_>>()
    };
    crate::util::eventually(crate::util::PROMPT, "both unpacks to be staging", || {
        let ours = staged(&target).len() + staged(&u.home).len();
        (ours == 2).then_some(())
    });
    s.kill9();
    assert_eq!(staged(&target).len(), 1, "the crash left nothing to sweep");
    assert_eq!(staged(&u.home).len(), 1, "the crash left nothing to sweep");

    let s2 = Server::start_in(std::sync::Arc::clone(&s.sb), "127.0.0.1:0", &flags);
    assert!(staged(&target).is_empty(), "{:?}", staging_left(&target));
    assert!(staged(&u.home).is_empty(), "{:?}", staging_left(&u.home));
    assert!(!fresh.exists());
    assert_eq!(tree(&target), before, "the target changed");
    assert_eq!(std::fs::read(decoy.join("mine")).unwrap(), b"keep");
    let journal = s2.home.join("unpacking");
    assert_eq!(std::fs::read_dir(&journal).unwrap().count(), 0);
    assert!(s2.log_text().contains("\"unpacks\":2"), "{}", s2.log_text());
}

#[test]
fn a_staging_folder_swapped_for_a_symlink_after_a_crash_is_not_followed_by_the_sweep() {
    let Some(u) = TestUser::create("unps") else {
        return;
    };
    let flags = ["--job-user", u.name.as_str()];
    let mut s = Server::start(&flags);
    let archive = big_archive(&s);
    let target = u.file("target");
    std::fs::create_dir(&target).unwrap();
    chown_to(&u, &target);
    let _c = half_sent(&s, &target, &archive);
    let name = crate::util::eventually(crate::util::PROMPT, "the unpack to be staging", || {
        staging_left(&target).pop()
    });
    s.kill9();
    // The job user, meanwhile, puts a symlink to a folder it wants emptied (here one of
    // root's, which it may not touch anyway) and one to its own where the staging was.
    let precious = s.dir().join("precious");
    std::fs::create_dir(&precious).unwrap();
    std::fs::write(precious.join("p.txt"), b"precious").unwrap();
    let staging = target.join(&name);
    std::fs::remove_dir_all(&staging).unwrap();
    symlink(&precious, &staging).unwrap();
    std::os::unix::fs::lchown(&staging, Some(u.uid), Some(u.gid)).unwrap();

    let s2 = Server::start_in(std::sync::Arc::clone(&s.sb), "127.0.0.1:0", &flags);
    assert_eq!(std::fs::read(precious.join("p.txt")).unwrap(), b"precious");
    assert!(std::fs::symlink_metadata(&staging).unwrap().is_symlink());
    // Looked at once, not again at every start.
    assert_eq!(
        std::fs::read_dir(s2.home.join("unpacking"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn an_unpack_that_fails_while_moving_into_place_puts_back_what_it_moved() {
    let s = Server::start(&[]);
    let target = s.dir().join("target");
    for d in ["a", "m"] {
        std::fs::create_dir_all(target.join(d)).unwrap();
    }
    std::fs::write(target.join("a/x.txt"), b"old x").unwrap();
    // A mount point in the target: the renames that move an archive into place cannot
    // cross it, and the merge only finds out after it moved what comes before ("a").
    let mnt = target.join("m");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&mnt)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|st| st.success());
    if !mounted {
        crate::util::skip::skip_root("cannot mount a tmpfs here");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _u = Unmount(mnt.clone());
    std::fs::write(mnt.join("kept.txt"), b"on the mount").unwrap();
    let src = s.dir().join("src");
    for d in ["a/new", "m"] {
        std::fs::create_dir_all(src.join(d)).unwrap();
    }
    std::fs::write(src.join("a/x.txt"), b"new x").unwrap();
    std::fs::write(src.join("a/y.txt"), b"new y").unwrap();
    std::fs::write(src.join("a/new/z.txt"), b"new z").unwrap();
    std::fs::write(src.join("m/w.txt"), b"new w").unwrap();
    let file = s.dir().join("src.tar");
    tool(&["pack", src.to_str().unwrap(), file.to_str().unwrap()]);
    let before = without_dir_times(&tree(&target));
    let (code, v) = put_archive(&s, &target, "tar", &file);
    assert_eq!(code, 409, "{v}");
    assert!(v.to_string().contains("mount point"), "{v}");
    assert_eq!(without_dir_times(&tree(&target)), before, "{v}");
    assert_eq!(std::fs::read(target.join("a/x.txt")).unwrap(), b"old x");
    assert!(staging_left(&target).is_empty());
}
