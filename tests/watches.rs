//! `/v1/files/watches`: folders watched through inotify, their changes kept per watch and
//! read by cursor, and never a silent gap (a full kernel queue, a killed server).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::util::server::Server;
use crate::util::users::TestUser;
use crate::util::{Client, LONG, PROMPT, Value, is_root, json, percent, skip_root};

fn watch(c: &mut Client, dir: &Path, recursive: bool) -> (String, String) {
    let r = c.post(
        "/v1/files/watches",
        &json!({"path": dir.to_str().unwrap(), "recursive": recursive}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    (
        v["id"].as_str().unwrap().to_string(),
        v["cursor"].as_str().unwrap().to_string(),
    )
}

/// Reads events from `cursor` until `done` holds of all read so far; returns them and
/// where to go on from.
fn read_until(
    c: &mut Client,
    id: &str,
    cursor: &str,
    within: Duration,
    done: impl Fn(&[Value]) -> bool,
) -> (Vec<Value>, String) {
    let deadline = Instant::now() + within;
    let mut all = Vec::new();
    let mut at = cursor.to_string();
    loop {
        let r = c.get(&format!(
            "/v1/files/watches/{id}/events?after={}&waitSeconds=2&limit=1000",
            percent(&at)
        ));
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        all.extend(v["events"].as_array().unwrap().iter().cloned());
        at = v["next"].as_str().unwrap().to_string();
        if done(&all) {
            return (all, at);
        }
        assert!(
            Instant::now() < deadline,
            "timed out; read {} events: {:#?}",
            all.len(),
            &all[all.len().saturating_sub(20)..]
        );
    }
}

/// Writes markers (`end0`, `end1`...) into `dir` until one is reported, reading from
/// `cursor`: a marker made while nothing watched (a server starting, a full queue) is
/// covered by a rescan, not reported itself. Returns all read and where to go on from.
fn until_reported(c: &mut Client, id: &str, cursor: &str, dir: &Path) -> (Vec<Value>, String) {
    let mut events = Vec::new();
    let mut at = cursor.to_string();
    let deadline = Instant::now() + LONG;
    for k in 0.. {
        let marker = format!("/end{k}");
        std::fs::write(dir.join(&marker[1..]), b"").unwrap();
        let (more, next) = read_until(c, id, &at, LONG, |e| {
            e.iter()
                .any(|e| e["path"].as_str().unwrap().ends_with(&marker))
                || e.last().is_some_and(|e| e["type"] == "rescan")
        });
        let done = more
            .iter()
            .any(|e| e["path"].as_str().unwrap().ends_with(&marker));
        events.extend(more);
        at = next;
        if done {
            return (events, at);
        }
        assert!(Instant::now() < deadline, "no marker was ever reported");
    }
    unreachable!()
}

fn brief(events: &[Value], top: &Path) -> Vec<String> {
    let cut = |p: &Value| {
        p.as_str().map(|p| {
            p.strip_prefix(top.to_str().unwrap())
                .unwrap_or(p)
                .to_string()
        })
    };
    events
        .iter()
        .map(|e| {
            let mut s = format!(
                "{} {}",
                e["type"].as_str().unwrap(),
                cut(&e["path"]).unwrap()
            );
            if let Some(to) = cut(&e["toPath"]) {
                s.push_str(&format!(" -> {to}"));
            }
            if e["isDir"] == true {
                s.push('/');
            }
            s
        })
        .collect()
}

#[test]
fn changes_are_reported_once_each_in_order_and_kept_until_a_client_reads_them() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let top = s.dir().join("w");
    let away = s.dir().join("away");
    std::fs::create_dir_all(&top).unwrap();
    std::fs::create_dir_all(away.join("tree/sub")).unwrap();
    std::fs::write(away.join("tree/sub/t.txt"), b"t").unwrap();
    let (id, cursor) = watch(&mut c, &top, true);

    // One step at a time, each read once it is reported, so the order is the test's.
    let mut at = cursor.clone();
    let mut all = Vec::new();
    let (t, w) = (top.clone(), away.clone());
    type Step<'a> = (Box<dyn Fn() + 'a>, Vec<&'static str>);
    let steps: Vec<Step> = vec![
        (
            Box::new(|| std::fs::write(t.join("a.txt"), b"hello").unwrap()),
            vec!["created /a.txt", "modified /a.txt"],
        ),
        (
            Box::new(|| std::fs::create_dir(t.join("d")).unwrap()),
            vec!["created /d/"],
        ),
        (
            Box::new(|| std::fs::rename(t.join("a.txt"), t.join("d/b.txt")).unwrap()),
            vec!["moved /a.txt -> /d/b.txt"],
        ),
        (
            Box::new(|| std::fs::rename(t.join("d/b.txt"), w.join("b.txt")).unwrap()),
            vec!["deleted /d/b.txt"],
        ),
        (
            Box::new(|| std::fs::rename(w.join("tree"), t.join("tree")).unwrap()),
            vec![
                "created /tree/",
                "created /tree/sub/",
                "created /tree/sub/t.txt",
            ],
        ),
        (
            Box::new(|| std::fs::rename(t.join("tree"), t.join("tree2")).unwrap()),
            vec!["moved /tree -> /tree2/"],
        ),
        (
            Box::new(|| std::fs::write(t.join("tree2/sub/new.txt"), b"n").unwrap()),
            vec!["created /tree2/sub/new.txt", "modified /tree2/sub/new.txt"],
        ),
        (
            Box::new(|| std::fs::remove_file(t.join("tree2/sub/t.txt")).unwrap()),
            vec!["deleted /tree2/sub/t.txt"],
        ),
        (
            Box::new(|| std::fs::rename(w.join("b.txt"), t.join("in.txt")).unwrap()),
            vec!["created /in.txt"],
        ),
        (
            Box::new(|| {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .open(t.join("in.txt"))
                    .unwrap();
                f.write_all(b" more").unwrap();
            }),
            vec!["modified /in.txt"],
        ),
        (
            Box::new(|| std::fs::remove_dir_all(t.join("tree2")).unwrap()),
            vec![
                "deleted /tree2/sub/new.txt",
                "deleted /tree2/sub/",
                "deleted /tree2/",
            ],
        ),
    ];
    for (act, want) in &steps {
        act();
        let (ev, next) = read_until(&mut c, &id, &at, PROMPT, |e| e.len() >= want.len());
        assert_eq!(brief(&ev, &top), *want);
        at = next;
        all.extend(ev);
    }
    // All of it is kept: read again from the start, in one answer.
    let r = c.get(&format!(
        "/v1/files/watches/{id}/events?after={}&limit=1000",
        percent(&cursor)
    ));
    assert_eq!(r.json()["events"].as_array().unwrap(), &all);
    for e in &all {
        assert!(
            crate::util::epoch_ms(e["at"].as_str().unwrap()).is_some(),
            "{e}"
        );
    }
    let next = at;
    // Passing `next` back repeats nothing; a long-poll answers as soon as one comes.
    let r = c.get(&format!(
        "/v1/files/watches/{id}/events?after={}",
        percent(&next)
    ));
    assert_eq!(r.json()["events"], json!([]));
    let writer = {
        let f = top.join("later.txt");
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            std::fs::write(f, b"x").unwrap();
        })
    };
    let r = c.get(&format!(
        "/v1/files/watches/{id}/events?after={}&waitSeconds=30",
        percent(&next)
    ));
    writer.join().unwrap();
    let got = brief(r.json()["events"].as_array().unwrap(), &top);
    let (_, next) = read_until(&mut c, &id, &next, PROMPT, |e| e.len() >= 2);
    assert_eq!(
        got.first().map(String::as_str),
        Some("created /later.txt"),
        "{got:?}"
    );

    // Folders made and filled at once: every file is reported, and once.
    for i in 0..40 {
        let d = top.join(format!("burst{i}/inner"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("f"), b"f").unwrap();
    }
    std::fs::write(top.join("end2"), b"").unwrap();
    let (events, _) = read_until(&mut c, &id, &next, PROMPT, |e| {
        e.iter()
            .any(|e| e["path"].as_str().unwrap().ends_with("/end2"))
    });
    let b = brief(&events, &top);
    for i in 0..40 {
        let want = format!("created /burst{i}/inner/f");
        assert_eq!(
            b.iter().filter(|e| **e == want).count(),
            1,
            "{want}: {b:#?}"
        );
        let dir = format!("created /burst{i}/inner/");
        assert_eq!(b.iter().filter(|e| **e == dir).count(), 1, "{dir}: {b:#?}");
    }

    // As Server-Sent Events, resumed with Last-Event-ID.
    let mut sse = s.client().unchecked();
    sse.write_raw(
        format!(
            "GET /v1/files/watches/{id}/events HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\nAccept: text/event-stream\r\nLast-Event-ID: {next}\r\n\r\n",
            s.token
        )
        .as_bytes(),
    )
    .unwrap();
    let (status, _) = sse.read_head();
    assert_eq!(status, 200);
    let mut text = String::new();
    let until = Instant::now() + PROMPT;
    while !text.contains("/end2") && Instant::now() < until {
        match sse.read_chunk() {
            Some(b) => text.push_str(&String::from_utf8_lossy(&b)),
            None => break,
        }
    }
    assert!(text.contains("event: created\ndata: "), "{text}");
    assert!(
        !text.contains("/later.txt"),
        "resumed before its cursor: {text}"
    );

    // The watch is listed, and goes when deleted.
    let r = c.get("/v1/files/watches");
    assert_eq!(r.json()["watches"][0]["id"], id.as_str());
    let r = c.call("DELETE", &format!("/v1/files/watches/{id}"), None);
    assert_eq!(r.status, 200, "{}", r.text());
    let r = c.get(&format!("/v1/files/watches/{id}/events"));
    assert_eq!(r.code(), "not_found");
    assert_eq!(c.get("/v1/files/watches").json()["watches"], json!([]));
}

#[test]
fn cursors_limits_and_refusals_are_clear() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let top = s.dir().join("w");
    std::fs::create_dir_all(&top).unwrap();
    std::fs::write(top.join("file"), b"").unwrap();
    let (id, cursor) = watch(&mut c, &top, false);
    std::fs::write(top.join("file"), b"x").unwrap();
    let (seen, _) = read_until(&mut c, &id, &cursor, PROMPT, |e| !e.is_empty());
    let at = seen[0]["cursor"]
        .as_str()
        .unwrap()
        .rsplit_once('-')
        .unwrap()
        .1
        .to_string();
    let other_boot = format!("0ther000-{at}");
    for (bad, code) in [
        ("nonsense", "invalid"),
        (other_boot.as_str(), "gone"),
        ("zzzz-99999999", "gone"),
    ] {
        let r = c.get(&format!("/v1/files/watches/{id}/events?after={bad}"));
        assert_eq!(r.code(), code, "{bad}: {}", r.text());
    }
    let boot = cursor.rsplit_once('-').unwrap().0;
    let r = c.get(&format!(
        "/v1/files/watches/{id}/events?after={boot}-999999"
    ));
    assert_eq!(r.code(), "gone", "{}", r.text());
    for (body, code) in [
        (
            json!({"path": top.join("file").to_str().unwrap()}),
            "invalid",
        ),
        (
            json!({"path": s.dir().join("missing").to_str().unwrap()}),
            "not_found",
        ),
        (json!({"path": s.home.to_str().unwrap()}), "forbidden"),
        (
            json!({"path": top.to_str().unwrap(), "recurse": true}),
            "invalid",
        ),
    ] {
        let r = c.post("/v1/files/watches", &body);
        assert_eq!(r.code(), code, "{body}: {}", r.text());
    }
    for bad in [
        "fw_nothex",
        "job_00000000000000000000",
        "fw_00000000000000000000",
    ] {
        let r = c.get(&format!("/v1/files/watches/{bad}/events"));
        assert_eq!(r.code(), "not_found", "{bad}");
    }
    // At most 64 watches; one more is refused saying so, and nothing of it stays.
    for _ in 1..64 {
        watch(&mut c, &top, false);
    }
    let r = c.post("/v1/files/watches", &json!({"path": top.to_str().unwrap()}));
    assert_eq!(r.code(), "rate_limited", "{}", r.text());
    assert!(r.text().contains("64"), "{}", r.text());
    assert_eq!(
        c.get("/v1/files/watches").json()["watches"]
            .as_array()
            .unwrap()
            .len(),
        64
    );
    let listed = std::fs::read_dir(s.home.join("watches")).unwrap().count();
    assert_eq!(listed, 64);
    c.call("DELETE", &format!("/v1/files/watches/{id}"), None);
    watch(&mut c, &top, false);
}

#[test]
fn a_watch_above_the_state_root_reports_nothing_inside_it() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let (id, cursor) = watch(&mut c, s.dir(), true);
    let (id2, cursor2) = watch(&mut c, s.dir(), false);
    // The agent writes its state root: a job's folder, its record, output, events.
    let job = c.start_job(json!({"command": "echo inside; echo more > out.txt"}));
    assert_eq!(job["status"], "succeeded", "{job}");
    std::fs::write(s.dir().join("end"), b"").unwrap();
    let home = s.home.to_str().unwrap().to_string();
    for (id, cursor) in [(&id, &cursor), (&id2, &cursor2)] {
        let (events, _) = read_until(&mut c, id, cursor, PROMPT, |e| {
            e.iter()
                .any(|e| e["path"].as_str().unwrap().ends_with("/end"))
        });
        let inside: Vec<&Value> = events
            .iter()
            .filter(|e| {
                let p = e["path"].as_str().unwrap();
                p == home || p.starts_with(&format!("{home}/"))
            })
            .collect();
        assert!(
            inside.is_empty(),
            "the state root was reported: {inside:#?}"
        );
    }
    let (events, _) = read_until(&mut c, &id, &cursor, PROMPT, |e| {
        e.iter()
            .any(|e| e["path"].as_str().unwrap().ends_with("/end"))
    });
    assert!(
        events
            .iter()
            .any(|e| e["path"].as_str().unwrap().ends_with("/work/out.txt")),
        "{events:#?}"
    );
}

#[test]
fn a_killed_server_is_a_rescan_first_when_the_next_one_starts() {
    let mut s = Server::start(&[]);
    let mut c = s.client();
    let top = s.dir().join("w");
    std::fs::create_dir_all(&top).unwrap();
    let (id, cursor) = watch(&mut c, &top, true);
    std::fs::write(top.join("before"), b"").unwrap();
    let (_, next) = read_until(&mut c, &id, &cursor, PROMPT, |e| !e.is_empty());
    s.kill9();
    // While no server runs: nobody sees this.
    std::fs::write(top.join("unseen"), b"").unwrap();
    let s2 = Server::start_in(Arc::clone(&s.sb), "127.0.0.1:0", &[]);
    let mut c = s2.client();
    let (events, _) = until_reported(&mut c, &id, &next, &top);
    assert_eq!(events[0]["type"], "rescan", "{events:#?}");
    assert_eq!(events[0]["reason"], "restart");
    assert_eq!(events[0]["path"], top.to_str().unwrap());
    assert!(
        !events
            .iter()
            .any(|e| e["path"].as_str().unwrap().ends_with("/unseen")),
        "{events:#?}"
    );
}

/// Sets a sysctl for the length of a test, and back.
struct Sysctl {
    path: &'static str,
    old: String,
}

impl Sysctl {
    fn set(path: &'static str, value: &str) -> Option<Sysctl> {
        let old = std::fs::read_to_string(path).ok()?;
        std::fs::write(path, value).ok()?;
        Some(Sysctl {
            path,
            old: old.trim().to_string(),
        })
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        let _ = std::fs::write(self.path, &self.old);
    }
}

#[test]
fn a_burst_past_a_full_kernel_queue_is_every_event_or_a_rescan_never_a_silent_gap() {
    if !is_root() {
        skip_root("lowering fs.inotify.max_queued_events needs root");
        return;
    }
    let s = Server::start(&[]);
    let mut c = s.client();
    let top = s.dir().join("w");
    std::fs::create_dir_all(&top).unwrap();
    // The queue's length is fixed when the instance is made (the first watch): lowered
    // only for that moment, as other programs on this machine use inotify too.
    let lowered = Sysctl::set("/proc/sys/fs/inotify/max_queued_events", "64");
    let Some(lowered) = lowered else {
        skip_root("cannot write /proc/sys/fs/inotify/max_queued_events");
        return;
    };
    let (id, cursor) = watch(&mut c, &top, true);
    drop(lowered);
    const N: usize = 10_000;
    for i in 0..N {
        std::fs::write(top.join(format!("f{i:05}")), b"").unwrap();
    }
    let (events, next) = until_reported(&mut c, &id, &cursor, &top);
    let rescans: Vec<&Value> = events.iter().filter(|e| e["type"] == "rescan").collect();
    let mut seen = vec![false; N];
    for e in &events {
        if e["type"] == "created"
            && let Some(n) = e["path"].as_str().unwrap().rsplit('/').next()
            && let Some(i) = n.strip_prefix('f').and_then(|d| d.parse::<usize>().ok())
        {
            assert!(!seen[i], "f{i:05} created twice");
            seen[i] = true;
        }
    }
    let missing = seen.iter().filter(|s| !**s).count();
    assert!(
        missing == 0 || !rescans.is_empty(),
        "{missing} files were never reported and no rescan said so"
    );
    for r in &rescans {
        assert_eq!(r["path"], top.to_str().unwrap());
        assert!(
            matches!(r["reason"].as_str(), Some("overflow" | "limit")),
            "{r}"
        );
    }
    eprintln!(
        "burst of {N}: {} events, {missing} not reported one by one, {} rescans",
        events.len(),
        rescans.len()
    );
    // And live again after it.
    std::fs::write(top.join("after"), b"").unwrap();
    let (events, _) = read_until(&mut c, &id, &next, PROMPT, |e| {
        e.iter()
            .any(|e| e["path"].as_str().unwrap().ends_with("/after"))
    });
    assert!(!events.is_empty());
}

#[test]
fn a_job_user_cannot_watch_what_it_cannot_list() {
    let Some(u) = TestUser::create("watch") else {
        return;
    };
    let s = Server::start(&["--job-user", &u.name]);
    let mut c = s.client();
    let closed = s.dir().join("closed");
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(&closed, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    std::fs::write(closed.join("secret-name.txt"), b"").unwrap();
    let r = c.post(
        "/v1/files/watches",
        &json!({"path": closed.to_str().unwrap()}),
    );
    assert_eq!(r.code(), "forbidden", "{}", r.text());
    assert_eq!(c.get("/v1/files/watches").json()["watches"], json!([]));

    // Its own folder, holding one of root's it may not list: nothing inside that one.
    let mine = u.file("proj");
    std::fs::create_dir_all(&mine).unwrap();
    std::os::unix::fs::chown(&mine, Some(u.uid), Some(u.gid)).unwrap();
    let private = mine.join("roots");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let (id, cursor) = watch(&mut c, Path::new("proj"), true);
    std::fs::write(private.join("hidden-name.txt"), b"").unwrap();
    std::fs::write(mine.join("end"), b"").unwrap();
    let (events, _) = read_until(&mut c, &id, &cursor, PROMPT, |e| {
        e.iter()
            .any(|e| e["path"].as_str().unwrap().ends_with("/end"))
    });
    assert_eq!(
        events[0]["path"].as_str().unwrap(),
        mine.join("end").to_str().unwrap()
    );
    assert!(
        !events
            .iter()
            .any(|e| e["path"].as_str().unwrap().contains("hidden-name")),
        "{events:#?}"
    );
}
