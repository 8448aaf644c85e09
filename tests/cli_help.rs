//! The command line's help and edges: suggestions for misspellings, a description for
//! every flag, exec's exit statuses, `exec --wait 0` printing the job id, and the status
//! tail starting at a line.

use crate::util::*;

/// Every subcommand with a help page (the top level is `[]`).
const COMMANDS: [&[&str]; 9] = [
    &[],
    &["exec"],
    &["attach"],
    &["events"],
    &["status"],
    &["logs"],
    &["cancel"],
    &["prune"],
    &["serve"],
];

/// The help page of `args` (with `flag`: `--help` or `-h`), which must exit 0.
fn help(sb: &Sandbox, args: &[&str], flag: &str) -> String {
    let mut all = args.to_vec();
    all.push(flag);
    let out = sb.run(&all);
    assert_eq!(out.code, Some(0), "{all:?}: {out:#?}");
    out.stdout
}

#[test]
fn misspellings_get_a_suggestion() {
    let sb = Sandbox::new();
    let out = sb.run(&["stauts"]);
    assert_eq!(out.code, Some(2), "{out:#?}");
    assert!(
        out.stderr.contains("similar subcommand exists: 'status'"),
        "{out:#?}"
    );
    let out = sb.run(&["exec", "--timout", "3", "--", "true"]);
    assert_eq!(out.code, Some(2), "{out:#?}");
    assert!(
        out.stderr.contains("similar argument exists: '--timeout'"),
        "{out:#?}"
    );
    assert!(sb.job_ids().is_empty(), "a misspelled exec ran a job");
}

#[test]
fn every_argument_and_flag_is_described() {
    let sb = Sandbox::new();
    for args in COMMANDS {
        for flag in ["--help", "-h"] {
            let page = help(&sb, args, flag);
            let mut section = "";
            let mut described = 0;
            for line in page.lines() {
                if !line.starts_with(' ') && line.ends_with(':') {
                    section = line;
                    continue;
                }
                if !matches!(section, "Arguments:" | "Options:" | "Commands:")
                    || line.trim().is_empty()
                {
                    continue;
                }
                // `  --name <VALUE>   Description`: the description follows two spaces.
                let entry = line.trim_start();
                let text = entry.split_once("  ").map_or("", |(_, t)| t.trim());
                assert!(
                    !text.is_empty(),
                    "{args:?} {flag}: no description for {entry:?}:\n{page}"
                );
                described += 1;
            }
            assert!(described >= 2, "{args:?} {flag}: no options found:\n{page}");
            assert!(
                page.contains("GITTERM_HOME") && page.contains("$HOME/.gitterm"),
                "{args:?} {flag}: the state root is not named:\n{page}"
            );
        }
    }
}

#[test]
fn exec_help_lists_its_exit_statuses() {
    let sb = Sandbox::new();
    let page = help(&sb, &["exec"], "--help");
    let (_, statuses) = page
        .split_once("Exit status:\n")
        .unwrap_or_else(|| panic!("no exit statuses:\n{page}"));
    for code in ["0", "1", "2", "N", "124", "125", "128+N", "130"] {
        assert!(
            statuses
                .lines()
                .any(|l| l.split_whitespace().next() == Some(code)),
            "exit status {code} is not listed:\n{page}"
        );
    }
}

#[test]
fn exec_wait_0_prints_the_job_id() {
    let sb = Sandbox::new();
    let out = sb.run(&["exec", "--wait", "0", "--", "sleep 1"]);
    for id in sb.job_ids() {
        sb.remember(&id);
    }
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert!(out.elapsed < PROMPT, "--wait 0 took {:?}", out.elapsed);
    assert_eq!(sb.job_ids().len(), 1, "{out:#?}");
    let id = sb.job_ids().pop().unwrap();
    // The id is the whole of stdout; the word on stderr is the same as for --wait N.
    assert_eq!(out.stdout, format!("{id}\n"), "{out:#?}");
    assert!(
        out.stderr.contains(&format!("job {id} is still running")),
        "{out:#?}"
    );
    assert_eq!(sb.run(&["cancel", &id]).code, Some(0));
    // Nothing of the job may outlive the cancel (the sandbox kills whatever carries its
    // id on drop, should this fail).
    sb.assert_no_leftovers();
}

/// The lines `status ID` prints after its tail marker.
fn tail_lines(sb: &Sandbox, id: &str) -> Vec<String> {
    let out = sb.run(&["status", id]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    let (_, tail) = out
        .stdout
        .split_once("--- output tail ---\n")
        .unwrap_or_else(|| panic!("no output tail: {out:#?}"));
    tail.lines().map(String::from).collect()
}

#[test]
fn status_tail_begins_at_a_line() {
    let sb = Sandbox::new();
    // Lines of different lengths: the last 8 KiB begin inside a line, which is left out.
    let (out, v) = sb.exec_json(&["--", "seq 1 3000"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    let output: String = (1..=3000).map(|n| format!("{n}\n")).collect();
    let start = output.len() - 8 * 1024;
    assert_ne!(
        output.as_bytes()[start - 1],
        b'\n',
        "the tail should begin mid-line"
    );
    let first = output[start..].split_once('\n').unwrap().1;
    let lines = tail_lines(&sb, text(&v, "id"));
    assert_eq!(
        lines.join("\n") + "\n",
        first,
        "the tail is not the output's last lines"
    );

    // Lines of 8 bytes: the last 8 KiB begin exactly at a line, which is kept.
    let (out, v) = sb.exec_json(&[
        "--",
        "i=0; while [ $i -lt 2000 ]; do printf '%07d\\n' $i; i=$((i+1)); done",
    ]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert_eq!(v["outputBytes"], 16000, "{v:#}");
    let lines = tail_lines(&sb, text(&v, "id"));
    let want: Vec<String> = (976..2000).map(|n| format!("{n:07}")).collect();
    assert_eq!(lines, want);
}
