//! `pending`: the line a job is writing and has not ended, in every answer about the job,
//! as a terminal shows it, redacted, and never a tail that may still become a secret.

use crate::util::*;

fn pending_is(c: &mut Client, id: &str, want: &str) -> Value {
    eventually_ok(PROMPT, &format!("pending {want:?}"), || {
        let v = c.get(&format!("/v1/jobs/{id}")).json();
        if v["pending"] == want {
            Ok(v)
        } else {
            Err(v["pending"].clone())
        }
    })
}

#[test]
fn a_prompt_without_a_newline_is_in_every_answer_until_it_is_answered() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let id = c.start_id(json!({"command": "printf 'Continue? [y/N] '; read x; echo \"got $x\"; printf '\\033[32m50%%\\033[0m\\r75%%'; read y",
               "interactive": true, "background": true}),
    );
    let v = pending_is(&mut c, &id, "Continue? [y/N] ");
    assert_eq!(v["status"], "running");
    // Not stored yet: output.log gets the line when it ends.
    assert_eq!(v["output"], "");
    // The output route carries it once the reader is at the end.
    let page = c.get(&format!("/v1/jobs/{id}/output")).json();
    assert_eq!(page["eof"], true);
    assert_eq!(page["pending"], "Continue? [y/N] ");
    // So does the CLI's record.
    let out = std::process::Command::new(BIN)
        .args(["status", &id, "--json"])
        .env("GITTERM_HOME", &s.home)
        .output()
        .unwrap();
    let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cli["pending"], "Continue? [y/N] ");
    let r = c.send("POST", &format!("/v1/jobs/{id}/stdin"), &[], Some(b"y\n"));
    assert_eq!(r.status, 200, "{}", r.text());
    // A progress bar's current frame, colours stripped, as a terminal shows it.
    let v = pending_is(&mut c, &id, "75%");
    assert_eq!(v["output"], "Continue? [y/N] got y\n");
    let r = c.send("POST", &format!("/v1/jobs/{id}/stdin"), &[], Some(b"n\n"));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = c.get(&format!("/v1/jobs/{id}?waitSeconds=30")).json();
    assert_eq!(v["status"], "succeeded", "{v}");
    assert_eq!(v["pending"], "");
    assert_eq!(v["output"], "Continue? [y/N] got y\n75%");
    assert!(!s.home.join("jobs").join(&id).join("pending").exists());
}

#[test]
fn a_pending_line_never_shows_a_secret_nor_the_start_of_one() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let scratch = s.home.join("printed");
    let id = c.start_id(json!({"command": format!("printf 'token=%s ok' \"$S\"; read a; printf '\\nkey: sk-li'; touch {}; read b", scratch.display()),
               "secretEnv": {"S": "sk-live-4f9a2b7c"}, "interactive": true, "background": true}),
    );
    let v = pending_is(&mut c, &id, "token=[redacted] ok");
    assert!(!v.to_string().contains("sk-live"), "{v}");
    let r = c.send("POST", &format!("/v1/jobs/{id}/stdin"), &[], Some(b"\n"));
    assert_eq!(r.status, 200);
    eventually(PROMPT, "the prefix printed", || {
        scratch.exists().then_some(())
    });
    // The line so far ends in what may still become the secret: it waits. The lines
    // before it are stored already (only such a tail is ever held back).
    let v = pending_is(&mut c, &id, "key: ");
    assert_eq!(v["output"], "token=[redacted] ok\n", "{v}");
    for _ in 0..20 {
        let v = c.get(&format!("/v1/jobs/{id}")).json();
        assert_eq!(v["pending"], "key: ", "{v}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let r = c.send("POST", &format!("/v1/jobs/{id}/stdin"), &[], Some(b"\n"));
    assert_eq!(r.status, 200);
    let v = c.get(&format!("/v1/jobs/{id}?waitSeconds=30")).json();
    assert_eq!(v["status"], "succeeded", "{v}");
    // At the end the whole line is stored, as it was written.
    assert_eq!(v["output"], "token=[redacted] ok\nkey: sk-li");
    for f in ["pending", "pending.tmp"] {
        assert!(!s.home.join("jobs").join(&id).join(f).exists());
    }
}

#[test]
fn a_job_without_stdin_shows_what_it_is_doing() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let id = c
        .start_id(json!({"command": "printf 'step 1\\nworking...'; sleep 30", "background": true}));
    let v = pending_is(&mut c, &id, "working...");
    assert_eq!(v["output"], "step 1\n");
    let v = c.post(&format!("/v1/jobs/{id}/cancel"), &json!({})).json();
    assert_eq!(v["status"], "cancelled");
    assert_eq!(v["pending"], "");
    assert_eq!(v["output"], "step 1\nworking...");
}
