//! Sessions: a terminal's state without the terminal. Each command of a session is an
//! ordinary job whose shell first sources the saved state and, on its way out (an EXIT
//! trap, which also runs after `exit` and a `set -e` failure), writes its new state to a
//! descriptor its supervisor reads. This module is the pure part: ids, the saved state and
//! its file format, the restore script, the command line that wraps a command, the parser
//! of what the shell wrote, and the rule that turns it into the next state.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::id::JobId;

/// The state file format this binary writes.
pub const STATE_FORMAT: u32 = 1;

/// The largest saved state, as its file: a command whose state is bigger is not saved.
pub const MAX_STATE_BYTES: usize = 4 << 20;

/// The largest dump a supervisor reads back from the shell.
pub const MAX_DUMP_BYTES: usize = 16 << 20;

/// The descriptor the shell sources the restore script from.
pub const RESTORE_FD: i32 = 61;
/// The descriptor the shell's EXIT trap writes its state to (opened again by path, with
/// truncation, so whatever a child wrote there before is gone).
pub const DUMP_FD: i32 = 62;

/// A validated session id: `ses_` + 20 lowercase hex characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct SessionId(String);

impl SessionId {
    /// Parses an id, refusing anything that is not exactly `ses_` + 20 lowercase hex.
    pub fn parse(s: &str) -> Option<SessionId> {
        let hex = s.strip_prefix("ses_")?;
        (hex.len() == 20 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| SessionId(s.to_string()))
    }

    /// The id made of 10 random bytes (the caller draws them from the kernel).
    pub fn from_random(bytes: [u8; 10]) -> SessionId {
        SessionId(format!("ses_{}", super::id::hex(&bytes)))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for SessionId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<SessionId, D::Error> {
        let s = String::deserialize(d)?;
        SessionId::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{s:?} is not a session id (ses_ + 20 lowercase hex)"
            ))
        })
    }
}

/// The shell a session's commands run in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Shell {
    /// `/bin/sh`, as every job: variables and the folder carry.
    #[default]
    Sh,
    /// bash: functions and aliases carry too.
    Bash,
}

impl Shell {
    /// The contract's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Shell::Sh => "sh",
            Shell::Bash => "bash",
        }
    }

    /// Parses the contract's name.
    pub fn parse(s: &str) -> Option<Shell> {
        match s {
            "sh" => Some(Shell::Sh),
            "bash" => Some(Shell::Bash),
            _ => None,
        }
    }
}

/// Bytes that are kept exactly: a JSON string when they are UTF-8, else `{"hex": "…"}`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Bytes(pub Vec<u8>);

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(&self.0) {
            Ok(t) => s.serialize_str(t),
            Err(_) => {
                use serde::ser::SerializeMap;
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("hex", &super::id::hex(&self.0))?;
                m.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Text(String),
            Hex { hex: String },
        }
        match Form::deserialize(d)? {
            Form::Text(t) => Ok(Bytes(t.into_bytes())),
            Form::Hex { hex } => unhex(&hex)
                .map(Bytes)
                .ok_or_else(|| serde::de::Error::custom("hex holds a character that is not hex")),
        }
    }
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// One variable of a session: set (exported or not), or unset by a command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Var {
    /// The value; absent: the variable was unset, and is unset again for the next command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Bytes>,
    #[serde(default)]
    pub exported: bool,
}

/// What a session carries from one command to the next (`state.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct SessionState {
    #[serde(default)]
    pub format_version: u32,
    /// The folder the last saved command ended in.
    pub cwd: String,
    #[serde(default)]
    pub vars: BTreeMap<String, Var>,
    /// bash: the functions, as `declare -f` prints them (code bash reads back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub functions: Option<Bytes>,
    /// bash: the aliases, as `alias -p` prints them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aliases: Option<Bytes>,
    /// The session's latest command that ended (saved or not): written with the state by
    /// that command's supervisor, so that a start writes nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_job_id: Option<JobId>,
}

impl SessionState {
    /// The names of the variables the session sets (never their values).
    pub fn names(&self) -> Vec<String> {
        self.vars
            .iter()
            .filter(|(_, v)| v.value.is_some())
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// A session's own record (`session.json`); its carried state is in [`SessionState`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionMeta {
    #[serde(default)]
    pub format_version: u32,
    pub id: SessionId,
    pub shell: Shell,
    /// The user its commands run as, where it is not the agent's own.
    #[serde(default)]
    pub user: Option<String>,
    pub created_at: String,
    /// Fields this binary does not know, kept on rewrite.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// What a job that is a session's command carries into its spec: enough for its
/// supervisor to restore the state in the shell and to save what the command changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionRun {
    pub id: SessionId,
    pub shell: Shell,
    /// The state before the command.
    pub state: SessionState,
    /// Names the command's own environment sets (its request `env`, its secrets): they
    /// win over the session's variables for this command.
    #[serde(default)]
    pub keep: BTreeSet<String>,
    /// The command's secret names: never saved, whatever the command does with them.
    #[serde(default)]
    pub secret_names: BTreeSet<String>,
}

/// True for a valid shell variable name.
pub fn is_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c == b'_' || c.is_ascii_alphabetic())
        && b.all(|c| c == b'_' || c.is_ascii_alphanumeric())
}

/// Variables the shell itself keeps (dynamic, read-only or its own bookkeeping), and ours:
/// never saved nor restored, so that none can break the next command.
const SHELL_OWN: &[&str] = &[
    "PWD",
    "SHLVL",
    "_",
    "PPID",
    "RANDOM",
    "SRANDOM",
    "LINENO",
    "SECONDS",
    "BASHPID",
    "BASH",
    "BASHOPTS",
    "SHELLOPTS",
    "EPOCHREALTIME",
    "EPOCHSECONDS",
    "HISTCMD",
    "FUNCNAME",
    "EUID",
    "UID",
    "GROUPS",
    "PIPESTATUS",
    "DIRSTACK",
    "HOSTNAME",
    "HOSTTYPE",
    "MACHTYPE",
    "OSTYPE",
    "COMP_WORDBREAKS",
    "OPTIND",
    "OPTARG",
    "OPTERR",
    super::env::JOB_ENV_MARKER,
];

/// Values the shells give these variables when nothing set them: a command that leaves
/// them so changed nothing.
const SHELL_DEFAULTS: &[(&str, &[u8])] = &[
    ("IFS", b" \t\n"),
    ("PS1", b"$ "),
    ("PS1", b"# "),
    ("PS2", b"> "),
    ("PS4", b"+ "),
    ("TERM", b"dumb"),
];

/// True when a variable of this name carries from one command to the next.
pub fn carried(name: &str) -> bool {
    is_name(name)
        && !SHELL_OWN.contains(&name)
        && !name.starts_with("BASH_")
        && !name.starts_with("__gitterm")
}

/// `bytes` as one single-quoted shell word, read back exactly by any POSIX shell.
pub fn quote(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 2);
    out.push(b'\'');
    for &b in bytes {
        if b == b'\'' {
            out.extend_from_slice(b"'\\''");
        } else {
            out.push(b);
        }
    }
    out.push(b'\'');
    out
}

/// What the restore script leaves each variable it touches as: `Some((value, exported))`
/// or `None` (unset).
pub type Effects = BTreeMap<String, Option<(Vec<u8>, bool)>>;

/// The variables the restore script sets or unsets (those of the session, but the ones
/// the command's own environment sets).
pub fn restore_effects(run: &SessionRun) -> Effects {
    run.state
        .vars
        .iter()
        .filter(|(k, _)| carried(k) && !run.keep.contains(*k))
        .map(|(k, v)| {
            (
                k.clone(),
                v.value.as_ref().map(|b| (b.0.clone(), v.exported)),
            )
        })
        .collect()
}

/// The script the shell sources before the command: the session's variables, and with
/// bash its functions and aliases.
pub fn restore_script(run: &SessionRun) -> Vec<u8> {
    let mut s = Vec::new();
    for (name, eff) in restore_effects(run) {
        match eff {
            None => {
                s.extend_from_slice(format!("unset -v {name}\n").as_bytes());
            }
            Some((value, true)) => {
                s.extend_from_slice(format!("export {name}=").as_bytes());
                s.extend(quote(&value));
                s.push(b'\n');
            }
            Some((value, false)) => {
                // Unset first: a variable of the environment stays exported when assigned.
                s.extend_from_slice(format!("unset -v {name}\n{name}=").as_bytes());
                s.extend(quote(&value));
                s.push(b'\n');
            }
        }
    }
    if run.shell == Shell::Bash {
        if let Some(f) = &run.state.functions {
            s.extend_from_slice(&f.0);
            s.push(b'\n');
        }
        if let Some(a) = &run.state.aliases {
            // A non-interactive bash expands no alias unless told to.
            s.extend_from_slice(b"shopt -s expand_aliases\n");
            s.extend_from_slice(&a.0);
            s.push(b'\n');
        }
    }
    s
}

/// The EXIT trap. Its first group keeps `$?` and turns tracing off with its own trace sent
/// nowhere (stderr, and with bash whichever of fds 3–19 `BASH_XTRACEFD` may name); the
/// second writes the state; then the shell exits with the command's status.
fn trap_body(shell: Shell) -> String {
    let p = format!("/proc/self/fd/{DUMP_FD}");
    match shell {
        Shell::Sh => format!(
            "{{ __gitterm_s=$?; set +eux; }} 2>/dev/null; {{ command printf \"GTS1\\0%s\\0\" \
             \"${{PWD-}}\"; set; command printf \"\\0\"; export -p; command printf \
             \"\\0END\\0\"; }} >|{p} 2>/dev/null; exit \"$__gitterm_s\""
        ),
        Shell::Bash => {
            let quiet: String = (3..=19).map(|fd| format!(" {fd}>/dev/null")).collect();
            format!(
                "{{ __gitterm_s=$?; set +eux; }} 2>/dev/null{quiet}; {{ builtin printf \
                 \"GTB1\\0%s\\0\" \"${{PWD-}}\"; builtin declare -p; builtin printf \"\\0\"; \
                 builtin declare -f; builtin printf \"\\0\"; builtin alias -p; builtin printf \
                 \"\\0END\\0\"; }} >|{p} 2>/dev/null; builtin exit \"$__gitterm_s\""
            )
        }
    }
}

/// The `-c` script of a session's command: source the state, set the trap, then the
/// command as sent, on the same line (so `$LINENO` and the shell's messages read as for a
/// plain job) unless bash must expand restored aliases, which it does only on lines it
/// reads after their definition.
pub fn command_line(run: &SessionRun, command: &str) -> String {
    let sep = if run.shell == Shell::Bash && run.state.aliases.is_some() {
        "\n"
    } else {
        ""
    };
    format!(
        ". /proc/self/fd/{RESTORE_FD};trap '{}' EXIT;{sep}{command}",
        trap_body(run.shell)
    )
}

/// What a shell wrote on its way out.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Dump {
    pub cwd: Vec<u8>,
    /// Every set scalar variable: its value and whether it is exported.
    pub vars: BTreeMap<String, (Vec<u8>, bool)>,
    pub functions: Option<Vec<u8>>,
    pub aliases: Option<Vec<u8>>,
}

/// Parses what the EXIT trap wrote; anything else (a command that wrote there itself, a
/// dump cut short) is an error, and the state is not saved.
pub fn parse_dump(shell: Shell, raw: &[u8]) -> Result<Dump, String> {
    let parts: Vec<&[u8]> = raw.split(|&b| b == 0).collect();
    let (magic, n) = match shell {
        Shell::Sh => (&b"GTS1"[..], 6),
        Shell::Bash => (&b"GTB1"[..], 7),
    };
    if parts.len() != n || parts[0] != magic || parts[n - 2] != b"END" || !parts[n - 1].is_empty() {
        return Err("the shell's state is incomplete or not in the expected form".into());
    }
    let mut dump = Dump {
        cwd: parts[1].to_vec(),
        ..Dump::default()
    };
    match shell {
        Shell::Sh => {
            let mut exported = BTreeSet::new();
            for (name, _) in parse_decls(parts[3], b"export ")? {
                exported.insert(name);
            }
            for (name, value) in parse_decls(parts[2], b"")? {
                if let Some(v) = value {
                    let x = exported.contains(&name);
                    dump.vars.insert(name, (v, x));
                }
            }
        }
        Shell::Bash => {
            for (flags_name, value) in parse_decls(parts[2], b"declare ")? {
                let (flags, name) = flags_name
                    .split_once(' ')
                    .ok_or("a declare line without flags")?;
                // Arrays, associative arrays and name references do not carry.
                if flags.contains(['a', 'A', 'n']) {
                    continue;
                }
                if let Some(v) = value {
                    dump.vars.insert(name.to_string(), (v, flags.contains('x')));
                }
            }
            dump.functions = Some(parts[3].to_vec()).filter(|f| !f.is_empty());
            dump.aliases = Some(parts[4].to_vec()).filter(|a| !a.is_empty());
        }
    }
    Ok(dump)
}

/// A declaration line: the name (with bash's flags before it) and the value, if set.
type Decl = (String, Option<Vec<u8>>);

/// Parses lines `PREFIX NAME[=WORD]` (bash's `declare -p`: PREFIX `declare `, and the
/// flags before the name come back in the name, `-x NAME`), each ending at an unquoted
/// newline.
fn parse_decls(text: &[u8], prefix: &[u8]) -> Result<Vec<Decl>, String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        if !rest.starts_with(prefix) {
            return Err(format!(
                "a line of the shell's state does not start with {:?}",
                String::from_utf8_lossy(prefix)
            ));
        }
        i += prefix.len();
        // The name (with bash's flags before it) ends at `=` or the line's end.
        let start = i;
        while i < text.len() && text[i] != b'=' && text[i] != b'\n' {
            i += 1;
        }
        let name = std::str::from_utf8(&text[start..i])
            .map_err(|_| "a variable name that is not UTF-8")?
            .to_string();
        // bash puts its flags before the name (`-x NAME`); the others print the name alone.
        let bare = if prefix == b"declare " {
            name.split_once(' ').map_or("", |(_, n)| n)
        } else {
            name.as_str()
        };
        if !is_name(bare) {
            return Err("a line of the shell's state does not name a variable".into());
        }
        let value = if i < text.len() && text[i] == b'=' {
            i += 1;
            let (v, used) = read_word(&text[i..])?;
            i += used;
            Some(v)
        } else {
            None
        };
        if i < text.len() {
            if text[i] != b'\n' {
                return Err("a line of the shell's state has text after its value".into());
            }
            i += 1;
        }
        out.push((name, value));
    }
    Ok(out)
}

/// Reads one shell word as `set`, `export -p` and `declare -p` print values: single
/// quotes, double quotes, `$'…'` (ANSI-C) and backslashes, up to an unquoted newline
/// (not consumed). Returns the value and the bytes used.
fn read_word(s: &[u8]) -> Result<(Vec<u8>, usize), String> {
    let cut = || "a value of the shell's state ends inside its quotes".to_string();
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'\n' => break,
            b'\'' => {
                let end = s[i + 1..]
                    .iter()
                    .position(|&b| b == b'\'')
                    .ok_or_else(cut)?;
                out.extend_from_slice(&s[i + 1..i + 1 + end]);
                i += end + 2;
            }
            b'"' => {
                i += 1;
                loop {
                    match s.get(i) {
                        None => return Err(cut()),
                        Some(b'"') => break,
                        Some(b'\\') => match s.get(i + 1) {
                            Some(&c @ (b'$' | b'`' | b'"' | b'\\')) => {
                                out.push(c);
                                i += 2;
                            }
                            Some(b'\n') => i += 2,
                            _ => {
                                out.push(b'\\');
                                i += 1;
                            }
                        },
                        Some(&c) => {
                            out.push(c);
                            i += 1;
                        }
                    }
                }
                i += 1;
            }
            b'$' if s.get(i + 1) == Some(&b'\'') => {
                i += 2;
                i += ansi_c(&s[i..], &mut out).ok_or_else(cut)?;
            }
            b'\\' => match s.get(i + 1) {
                Some(b'\n') => i += 2,
                Some(&c) => {
                    out.push(c);
                    i += 2;
                }
                None => return Err(cut()),
            },
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Ok((out, i))
}

/// Decodes the body of `$'…'` up to and including its closing quote into `out`; returns
/// the bytes used, or None when it never closes.
fn ansi_c(s: &[u8], out: &mut Vec<u8>) -> Option<usize> {
    let mut i = 0;
    loop {
        let c = *s.get(i)?;
        if c == b'\'' {
            return Some(i + 1);
        }
        if c != b'\\' {
            out.push(c);
            i += 1;
            continue;
        }
        let e = *s.get(i + 1)?;
        i += 2;
        let simple = match e {
            b'a' => Some(7),
            b'b' => Some(8),
            b'e' | b'E' => Some(27),
            b'f' => Some(12),
            b'n' => Some(b'\n'),
            b'r' => Some(b'\r'),
            b't' => Some(b'\t'),
            b'v' => Some(11),
            b'\\' | b'\'' | b'"' | b'?' => Some(e),
            _ => None,
        };
        if let Some(b) = simple {
            out.push(b);
            continue;
        }
        let digits = |from: usize, max: usize, radix: u32| {
            let mut n: u32 = 0;
            let mut k = 0;
            while k < max
                && let Some(d) = s.get(from + k).and_then(|&c| (c as char).to_digit(radix))
            {
                n = n * radix + d;
                k += 1;
            }
            (n, k)
        };
        match e {
            b'0'..=b'7' => {
                let (n, k) = digits(i - 1, 3, 8);
                out.push(n as u8);
                i += k - 1;
            }
            b'x' => {
                let (n, k) = digits(i, 2, 16);
                if k == 0 {
                    out.extend_from_slice(b"\\x");
                } else {
                    out.push(n as u8);
                }
                i += k;
            }
            b'u' | b'U' => {
                let (n, k) = digits(i, if e == b'u' { 4 } else { 8 }, 16);
                match char::from_u32(n).filter(|_| k > 0) {
                    Some(ch) => {
                        let mut buf = [0; 4];
                        out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                    }
                    None => {
                        out.push(b'\\');
                        out.push(e);
                        out.extend_from_slice(&s[i..i + k]);
                    }
                }
                i += k;
            }
            b'c' => {
                let x = *s.get(i)?;
                out.push(x & 0x1f);
                i += 1;
            }
            _ => {
                out.push(b'\\');
                out.push(e);
            }
        }
    }
}

/// What a command leaves: the next state, and what was not saved because it holds a
/// secret value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub state: SessionState,
    /// Names of variables (and `cwd`, `functions`, `aliases`) whose change held a secret.
    pub dropped: Vec<String>,
}

/// The state after a command that exited by itself. `env` is the environment its shell
/// started with; a variable whose value and export are as they were after the restore
/// keeps its earlier entry (so a value the request's `env` gave for this command only is
/// not saved), a changed one is saved, one that is gone is saved as unset (or forgotten,
/// where the environment never had it). A change whose name or value holds a secret
/// (`is_secret`) is not saved, nor is any change of the command's secret names.
pub fn next_state(
    run: &SessionRun,
    env: &BTreeMap<String, Vec<u8>>,
    dump: &Dump,
    is_secret: &dyn Fn(&[u8]) -> bool,
) -> Outcome {
    let prev = &run.state;
    let mut baseline: BTreeMap<String, (Vec<u8>, bool)> = env
        .iter()
        .map(|(k, v)| (k.clone(), (v.clone(), true)))
        .collect();
    for (k, eff) in restore_effects(run) {
        match eff {
            Some(v) => baseline.insert(k, v),
            None => baseline.remove(&k),
        };
    }
    let mut state = prev.clone();
    state.format_version = STATE_FORMAT;
    let mut dropped = Vec::new();
    let names: BTreeSet<&String> = baseline.keys().chain(dump.vars.keys()).collect();
    for name in names {
        if !carried(name) || run.secret_names.contains(name) {
            continue;
        }
        let (before, after) = (baseline.get(name), dump.vars.get(name));
        if before == after {
            continue;
        }
        if before.is_none()
            && let Some((v, false)) = after
            && SHELL_DEFAULTS.contains(&(name.as_str(), v.as_slice()))
        {
            continue;
        }
        match after {
            Some((value, exported)) => {
                if is_secret(value) || is_secret(name.as_bytes()) {
                    dropped.push(name.clone());
                    continue;
                }
                state.vars.insert(
                    name.clone(),
                    Var {
                        value: Some(Bytes(value.clone())),
                        exported: *exported,
                    },
                );
            }
            None if env.contains_key(name) => {
                state.vars.insert(
                    name.clone(),
                    Var {
                        value: None,
                        exported: false,
                    },
                );
            }
            None => {
                state.vars.remove(name);
            }
        }
    }
    match std::str::from_utf8(&dump.cwd) {
        Ok(c) if c.starts_with('/') && !is_secret(c.as_bytes()) => state.cwd = c.to_string(),
        Ok(c) if c.starts_with('/') => dropped.push("cwd".into()),
        _ => {}
    }
    if run.shell == Shell::Bash {
        for (what, new, slot) in [
            ("functions", &dump.functions, &mut state.functions),
            ("aliases", &dump.aliases, &mut state.aliases),
        ] {
            match new {
                Some(b) if is_secret(b) => dropped.push(what.into()),
                _ => *slot = new.clone().map(Bytes),
            }
        }
    }
    Outcome { state, dropped }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(shell: Shell, state: SessionState) -> SessionRun {
        SessionRun {
            id: SessionId::from_random([1; 10]),
            shell,
            state,
            keep: BTreeSet::new(),
            secret_names: BTreeSet::new(),
        }
    }

    /// The awkward values every carry must keep exactly.
    pub(crate) const AWKWARD: &[&[u8]] = &[
        b"",
        b"two words",
        b"  lead and trail  ",
        b"it's",
        b"\"double\"",
        b"'",
        b"''''",
        b"line1\nline2\n",
        b"\n",
        b"$HOME $(id) `id` ${x}",
        b"back\\slash\\\\ \\n \\'",
        b"a=b=c",
        b"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
        b"\xff\xfe not utf-8",
        b"tab\there\r\x01\x1b[31m",
        b"*?[a-z] ~ & ; | < > ( ) { } # !",
        b"-n",
        b"--",
    ];

    #[test]
    fn ids_are_strict() {
        assert!(SessionId::parse("ses_0123456789abcdef0123").is_some());
        for bad in [
            "",
            "ses_",
            "job_0123456789abcdef0123",
            "ses_0123456789ABCDEF0123",
            "../x",
        ] {
            assert!(SessionId::parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn bytes_round_trip_through_json() {
        for v in AWKWARD {
            let b = Bytes(v.to_vec());
            let json = serde_json::to_string(&b).unwrap();
            assert_eq!(serde_json::from_str::<Bytes>(&json).unwrap(), b, "{json}");
        }
        assert!(serde_json::from_str::<Bytes>(r#"{"hex":"zz"}"#).is_err());
    }

    #[test]
    fn dash_set_output_is_read_exactly() {
        // As dash prints `set` and `export -p`.
        let set = b"A='x'\"'\"'y\nz'\nB=''\nE='1'\nIFS=' \t\n'\n";
        let exp = b"export E='1'\nexport U\n";
        let mut raw = b"GTS1\0/tmp\0".to_vec();
        raw.extend_from_slice(set);
        raw.push(0);
        raw.extend_from_slice(exp);
        raw.extend_from_slice(b"\0END\0");
        let d = parse_dump(Shell::Sh, &raw).unwrap();
        assert_eq!(d.cwd, b"/tmp");
        assert_eq!(d.vars["A"], (b"x'y\nz".to_vec(), false));
        assert_eq!(d.vars["B"], (b"".to_vec(), false));
        assert_eq!(d.vars["E"], (b"1".to_vec(), true));
        assert_eq!(d.vars["IFS"], (b" \t\n".to_vec(), false));
        assert!(!d.vars.contains_key("U"));
    }

    #[test]
    fn bash_declare_output_is_read_exactly() {
        let decl = b"declare -- a=$'x\\'y\\nz$\\\\\"\\303\\251'\ndeclare -- b=$'\\001\\tq'\n\
declare -- c=\"\"\ndeclare -i n=\"3\"\ndeclare -a arr=([0]=\"1\" [1]=\"2\")\n\
declare -x E=\"1\"\ndeclare -x U\ndeclare -- d=\"q\\\"\\$\\`\\\\\"\n\
declare -ar BASH_VERSINFO=([0]=\"5\")\n";
        let mut raw = b"GTB1\0/\0".to_vec();
        raw.extend_from_slice(decl);
        raw.extend_from_slice(b"\0f () \n{ \n    echo hi\n}\n\0alias ll='ls -l'\n\0END\0");
        let d = parse_dump(Shell::Bash, &raw).unwrap();
        assert_eq!(d.vars["a"].0, "x'y\nz$\\\"é".as_bytes());
        assert_eq!(d.vars["b"].0, b"\x01\tq");
        assert_eq!(d.vars["c"].0, b"");
        assert_eq!(d.vars["n"].0, b"3");
        assert_eq!(d.vars["d"].0, b"q\"$`\\");
        assert_eq!(d.vars["E"], (b"1".to_vec(), true));
        assert!(!d.vars.contains_key("arr") && !d.vars.contains_key("U"));
        assert!(d.functions.unwrap().starts_with(b"f ()"));
        assert_eq!(d.aliases.unwrap(), b"alias ll='ls -l'\n");
    }

    #[test]
    fn ansi_c_escapes_decode_as_bash_reads_them() {
        let mut out = Vec::new();
        let used = ansi_c(b"\\x41\\u00e9\\U0001F600\\cA\\e\\101\\7\\q'rest", &mut out).unwrap();
        assert_eq!(out, "A\u{e9}\u{1f600}\x01\x1bA\x07\\q".as_bytes());
        assert_eq!(used, 34);
    }

    #[test]
    fn malformed_dumps_are_refused() {
        for raw in [
            &b""[..],
            b"GTS1\0/\0A='x\0\0END\0",
            b"GTS1\0/\0A=1\0\0",
            b"junkGTS1\0/\0\0\0END\0",
            b"GTS1\0/\0A=1\0\0END\0extra",
            b"GTS1\0/\0not a line\0\0END\0",
        ] {
            assert!(parse_dump(Shell::Sh, raw).is_err(), "{raw:?}");
        }
    }

    #[test]
    fn unchanged_request_values_are_not_saved_and_changes_are() {
        let mut prev = SessionState {
            cwd: "/a".into(),
            ..Default::default()
        };
        prev.vars.insert(
            "KEEP".into(),
            Var {
                value: Some(Bytes(b"session".to_vec())),
                exported: true,
            },
        );
        let mut r = run(Shell::Sh, prev);
        r.keep.insert("KEEP".into());
        r.secret_names.insert("TOKEN".into());
        let env: BTreeMap<String, Vec<u8>> = [
            ("KEEP", &b"request"[..]),
            ("HOME", b"/root"),
            ("GONE", b"1"),
            ("TOKEN", b"sekrit-value"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_vec()))
        .collect();
        let mut dump = Dump {
            cwd: b"/b".to_vec(),
            ..Default::default()
        };
        for (k, v, x) in [
            ("KEEP", &b"request"[..], true),
            ("HOME", b"/root", true),
            ("NEW", b"n", false),
            ("COPY", b"x sekrit-value y", true),
            ("TOKEN", b"changed", true),
            ("RANDOM", b"42", false),
        ] {
            dump.vars.insert(k.into(), (v.to_vec(), x));
        }
        let secret = |b: &[u8]| b.windows(12).any(|w| w == b"sekrit-value");
        let out = next_state(&r, &env, &dump, &secret);
        let s = &out.state;
        assert_eq!(s.cwd, "/b");
        assert_eq!(s.vars["KEEP"].value.as_ref().unwrap().0, b"session");
        assert_eq!(s.vars["NEW"].value.as_ref().unwrap().0, b"n");
        assert!(!s.vars["NEW"].exported);
        assert_eq!(s.vars["GONE"].value, None);
        assert!(!s.vars.contains_key("HOME") && !s.vars.contains_key("RANDOM"));
        assert!(!s.vars.contains_key("COPY") && !s.vars.contains_key("TOKEN"));
        assert_eq!(out.dropped, vec!["COPY".to_string()]);
        let json = serde_json::to_string(s).unwrap();
        assert!(!json.contains("sekrit"), "{json}");
    }

    #[test]
    fn the_restore_script_skips_what_the_command_sets_itself() {
        let mut st = SessionState::default();
        for (k, v, x) in [
            ("A", Some(&b"1"[..]), true),
            ("B", Some(b"2"), false),
            ("C", None, false),
        ] {
            st.vars.insert(
                k.into(),
                Var {
                    value: v.map(|v| Bytes(v.to_vec())),
                    exported: x,
                },
            );
        }
        let mut r = run(Shell::Sh, st);
        r.keep.insert("A".into());
        let s = String::from_utf8(restore_script(&r)).unwrap();
        assert_eq!(s, "unset -v B\nB='2'\nunset -v C\n");
    }

    proptest! {
        #[test]
        fn quoted_words_read_back_exactly(v in proptest::collection::vec(1u8..=255, 0..64)) {
            let q = quote(&v);
            let (back, used) = read_word(&q).unwrap();
            prop_assert_eq!(back, v);
            prop_assert_eq!(used, q.len());
        }

        #[test]
        fn states_round_trip_through_their_file(
            vals in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..32), 0..8)
        ) {
            let mut st = SessionState { cwd: "/x y".into(), ..Default::default() };
            for (i, v) in vals.iter().enumerate() {
                st.vars.insert(format!("V{i}"), Var { value: Some(Bytes(v.clone())), exported: i % 2 == 0 });
            }
            let json = serde_json::to_vec(&st).unwrap();
            prop_assert_eq!(serde_json::from_slice::<SessionState>(&json).unwrap(), st);
        }

        #[test]
        fn parsing_any_bytes_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_dump(Shell::Sh, &raw);
            let _ = parse_dump(Shell::Bash, &raw);
            let mut framed = b"GTB1\0/\0declare -- x=".to_vec();
            framed.extend_from_slice(&raw);
            framed.extend_from_slice(b"\0\0\0END\0");
            let _ = parse_dump(Shell::Bash, &framed);
        }
    }
}
