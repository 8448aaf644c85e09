//! The import rules of the crate, checked on its source.
//!
//! Layers are the folders under `src/`, bottom to top: `model`, `text` (pure), `os`,
//! `state`, `job`, `http` (the HTTP/1.1 server and client both servers share), then the front
//! ends `cli` and `api`, and last `serve`, which starts the servers that share a process. A layer may import only the
//! layers before it in that list, so `state` may import `os` (it opens private files and
//! locks through it) but `os` never imports `state`, and `text` may import `model` but not
//! the other way round; the two front ends never import each other. Inside every folder
//! the sibling modules (files and subfolders) import each other without a circle. Edges
//! to items of a folder's own `mod.rs` (`super::Item`) do not count: the parent is not a
//! sibling. Test modules count too: a test of a low layer that needs a higher one belongs
//! higher up.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers, bottom to top; those that share a rank are sibling front ends.
const LAYERS: &[(&str, u8)] = &[
    ("model", 0),
    ("text", 1),
    ("os", 2),
    ("state", 3),
    ("job", 4),
    ("http", 5),
    ("cli", 6),
    ("api", 6),
    ("gate", 6),
    ("serve", 7),
];

/// Groups of sibling modules still tangled in circles, as `(folder, group)` exactly as
/// reported (none is left). The check fails on any other group, and on one of these that has changed
/// or is gone, so the list only shrinks.
const KNOWN_CIRCLES: &[(&str, &str)] = &[];

/// One source file: its module path (`["os", "proc"]`) and its text.
struct File {
    name: String,
    module: Vec<String>,
    text: String,
}

/// One path into the crate found in a file, made absolute.
struct Import {
    line: usize,
    /// The absolute path, e.g. `["job", "launch", "start"]`.
    to: Vec<String>,
    /// The path as written, for messages.
    written: String,
}

/// A token of Rust source that matters for paths.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Colons,
    Open,
    Close,
    Comma,
    Semi,
    Star,
    Dollar,
    Other,
}

/// Tokens with their 1-based lines, skipping comments, strings and char literals.
fn tokens(src: &str) -> Vec<(usize, Tok)> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let count_lines = |s: &[u8]| s.iter().filter(|&&c| c == b'\n').count();
    while i < b.len() {
        let c = b[i];
        let rest = &b[i..];
        if c == b'\n' {
            line += 1;
            i += 1;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if rest.starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if rest.starts_with(b"/*") {
            let (start, mut depth) = (i, 0);
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            line += count_lines(&b[start..i]);
        } else if c == b'r' && matches!(rest.get(1), Some(b'"') | Some(b'#'))
            || rest.starts_with(b"br\"")
            || rest.starts_with(b"br#")
        {
            // A raw string (or the raw identifier `r#x`, which has no quote).
            let start = i;
            let mut j = i + if c == b'b' { 2 } else { 1 };
            let hashes = b[j..].iter().take_while(|&&h| h == b'#').count();
            j += hashes;
            if b.get(j) != Some(&b'"') {
                // `r#ident`
                i = j;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            j += 1;
            while j < b.len() && !b[j..].starts_with(&close) {
                j += 1;
            }
            i = (j + close.len()).min(b.len());
            line += count_lines(&b[start..i]);
        } else if c == b'"' || rest.starts_with(b"b\"") {
            let start = i;
            i += if c == b'"' { 1 } else { 2 };
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            line += count_lines(&b[start..i.min(b.len())]);
        } else if c == b'\'' || rest.starts_with(b"b'") {
            // A char literal, or a lifetime (`'a` not closed two or so bytes later).
            let j = i + if c == b'\'' { 1 } else { 2 };
            let end = if b.get(j) == Some(&b'\\') {
                b[j..].iter().position(|&q| q == b'\'').map(|p| j + p)
            } else {
                let width = src[j..].chars().next().map_or(1, char::len_utf8);
                (b.get(j + width) == Some(&b'\'')).then_some(j + width)
            };
            match end {
                Some(e) => i = e + 1,
                None => {
                    i = j;
                    out.push((line, Tok::Other));
                }
            }
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push((line, Tok::Ident(src[start..i].to_string())));
        } else {
            let (tok, len) = match c {
                b':' if rest.starts_with(b"::") => (Tok::Colons, 2),
                b'{' => (Tok::Open, 1),
                b'}' => (Tok::Close, 1),
                b',' => (Tok::Comma, 1),
                b';' => (Tok::Semi, 1),
                b'*' => (Tok::Star, 1),
                b'$' => (Tok::Dollar, 1),
                _ => (
                    Tok::Other,
                    src[i..].chars().next().map_or(1, char::len_utf8),
                ),
            };
            out.push((line, tok));
            i += len;
        }
    }
    out
}

/// Expands a `use` tree starting at `toks[*i]` into its paths, leaving `*i` after it.
fn use_tree(toks: &[(usize, Tok)], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    while *i < toks.len() {
        match &toks[*i].1 {
            Tok::Ident(s) if s == "as" => {
                *i += 2;
                break;
            }
            Tok::Ident(s) => {
                path.push(s.clone());
                *i += 1;
            }
            Tok::Colons => *i += 1,
            Tok::Star => {
                *i += 1;
                break;
            }
            Tok::Open => {
                *i += 1;
                loop {
                    use_tree(toks, i, &path, out);
                    match toks.get(*i).map(|t| &t.1) {
                        Some(Tok::Comma) => *i += 1,
                        Some(Tok::Close) => {
                            *i += 1;
                            return;
                        }
                        _ => return,
                    }
                    if toks.get(*i).map(|t| &t.1) == Some(&Tok::Close) {
                        *i += 1;
                        return;
                    }
                }
            }
            _ => break,
        }
    }
    if path.last().is_some_and(|s| s == "self") {
        path.pop();
    }
    out.push(path);
}

/// Every `crate::`, `super::` and `self::` path of a file, made absolute. Paths that start
/// elsewhere (std, other crates, a `mod.rs` naming its own children) are not sibling edges.
fn imports(file: &File) -> Vec<Import> {
    let toks = tokens(&file.text);
    let here = file.module.clone();
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut inline: Vec<(String, usize)> = Vec::new();
    let module_at = |inline: &[(String, usize)]| {
        let mut m = here.clone();
        m.extend(inline.iter().map(|(n, _)| n.clone()));
        m
    };
    let absolute = |from: &[String], path: &[String]| -> Option<Vec<String>> {
        let mut it = path.iter().peekable();
        let mut base: Vec<String> = match it.peek().map(|s| s.as_str()) {
            Some("crate") => {
                it.next();
                Vec::new()
            }
            Some("self") => {
                it.next();
                from.to_vec()
            }
            Some("super") => from.to_vec(),
            _ => return None,
        };
        while it.peek().map(|s| s.as_str()) == Some("super") {
            it.next();
            base.pop()?;
        }
        base.extend(it.cloned());
        Some(base)
    };
    let mut i = 0;
    while i < toks.len() {
        let (line, tok) = &toks[i];
        match tok {
            Tok::Open => depth += 1,
            Tok::Close => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            Tok::Ident(kw) if kw == "mod" => {
                if let (Some((_, Tok::Ident(name))), Some((_, Tok::Open))) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    inline.push((name.clone(), depth));
                    depth += 1;
                    i += 3;
                    continue;
                }
            }
            Tok::Ident(kw) if kw == "use" => {
                let from = module_at(&inline);
                let mut j = i + 1;
                let mut paths = Vec::new();
                use_tree(&toks, &mut j, &[], &mut paths);
                for p in paths {
                    if let Some(to) = absolute(&from, &p) {
                        let written = p.join("::");
                        out.push(Import {
                            line: *line,
                            to,
                            written,
                        });
                    }
                }
                i = j;
                continue;
            }
            Tok::Ident(kw)
                if matches!(kw.as_str(), "crate" | "super" | "self")
                    && toks.get(i + 1).map(|t| &t.1) == Some(&Tok::Colons)
                    && (i == 0 || toks[i - 1].1 != Tok::Dollar)
                    && (i == 0 || toks[i - 1].1 != Tok::Colons) =>
            {
                let mut p = vec![kw.clone()];
                let mut j = i + 1;
                while toks.get(j).map(|t| &t.1) == Some(&Tok::Colons) {
                    match toks.get(j + 1) {
                        Some((_, Tok::Ident(s))) => p.push(s.clone()),
                        _ => break,
                    }
                    j += 2;
                }
                let from = module_at(&inline);
                if let Some(to) = absolute(&from, &p) {
                    let written = p.join("::");
                    out.push(Import {
                        line: *line,
                        to,
                        written,
                    });
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// One import between two sibling modules of `folder`.
struct Edge<'a> {
    folder: Vec<String>,
    from: String,
    to: String,
    file: &'a str,
    import: Import,
}

/// The sibling edges of all files: for each import, the folder where its source and its
/// target part and the two child modules there, when the target is a module.
fn edges(files: &[File]) -> Vec<Edge<'_>> {
    let modules: BTreeSet<&[String]> = files.iter().map(|f| f.module.as_slice()).collect();
    let mut out = Vec::new();
    for f in files {
        for import in imports(f) {
            let src = &f.module;
            let common = src
                .iter()
                .zip(&import.to)
                .take_while(|(a, b)| a == b)
                .count();
            let (Some(a), Some(b)) = (src.get(common), import.to.get(common)) else {
                continue;
            };
            if !modules.contains(&import.to[..=common]) {
                continue;
            }
            out.push(Edge {
                folder: src[..common].to_vec(),
                from: a.clone(),
                to: b.clone(),
                file: &f.name,
                import,
            });
        }
    }
    out
}

/// Every broken rule, one line each: imports up or across layers, and circles.
fn violations(files: &[File]) -> Vec<String> {
    violations_besides(files, &[])
}

/// [`violations`], but the circles of `known` are not reported; one of them that is no
/// longer found is.
fn violations_besides(files: &[File], known: &[(&str, &str)]) -> Vec<String> {
    let rank = |m: &str| LAYERS.iter().find(|(n, _)| *n == m).map(|(_, r)| *r);
    let edges = edges(files);
    let mut out = Vec::new();
    let mut graphs: BTreeMap<&[String], BTreeMap<&str, BTreeMap<&str, &Edge>>> = BTreeMap::new();
    for e in &edges {
        if e.folder.is_empty() {
            let (Some(from), Some(to)) = (rank(&e.from), rank(&e.to)) else {
                out.push(format!(
                    "{}:{}: `{}` joins `{}` and `{}`, which are not in the layer list",
                    e.file, e.import.line, e.import.written, e.from, e.to
                ));
                continue;
            };
            if to >= from {
                let why = if to == from {
                    "a sibling front end"
                } else {
                    "a higher layer"
                };
                out.push(format!(
                    "{}:{}: `{}` imports {why}: `{}` may import only {}",
                    e.file,
                    e.import.line,
                    e.import.written,
                    e.from,
                    below(from)
                ));
            }
        } else {
            graphs
                .entry(&e.folder)
                .or_default()
                .entry(&e.from)
                .or_default()
                .entry(&e.to)
                .or_insert(e);
        }
    }
    let mut unseen: BTreeSet<(String, String)> = known
        .iter()
        .map(|(f, c)| (f.to_string(), c.to_string()))
        .collect();
    for (folder, graph) in &graphs {
        for (group, cycle) in cycles(graph) {
            let folder = folder.join("::");
            let group = group.join(", ");
            if unseen.remove(&(folder.clone(), group.clone())) {
                continue;
            }
            let mut steps = Vec::new();
            for w in cycle.windows(2) {
                let e = graph[w[0]][w[1]];
                steps.push(format!(
                    "  {}:{}: `{}` ({} -> {})",
                    e.file, e.import.line, e.import.written, w[0], w[1]
                ));
            }
            out.push(format!(
                "circle in `{folder}` among {group}: {}\n{}",
                cycle.join(" -> "),
                steps.join("\n")
            ));
        }
    }
    for (folder, cycle) in unseen {
        out.push(format!(
            "the circle among {cycle} in `{folder}` is gone or changed: update KNOWN_CIRCLES"
        ));
    }
    out
}

/// The layers a layer of this rank may import, for messages.
fn below(rank: u8) -> String {
    let names: Vec<&str> = LAYERS
        .iter()
        .filter(|(_, r)| *r < rank)
        .map(|(n, _)| *n)
        .collect();
    if names.is_empty() {
        "nothing in the crate".into()
    } else {
        names.join(", ")
    }
}

/// The modules `start` reaches in `graph`, itself included only through a circle.
fn reach<'a>(
    graph: &BTreeMap<&'a str, BTreeMap<&'a str, &Edge>>,
    start: &'a str,
) -> BTreeMap<&'a str, &'a str> {
    // Breadth-first, each node with the one it was reached from: the shortest walks.
    let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(n) = queue.pop_front() {
        for &m in graph.get(n).into_iter().flat_map(|g| g.keys()) {
            if !prev.contains_key(m) {
                prev.insert(m, n);
                queue.push_back(m);
            }
        }
    }
    prev
}

/// Each group of modules that reach each other (sorted), with its shortest circle through
/// its first module as a closed walk (`a -> b -> a`).
#[allow(clippy::type_complexity)]
fn cycles<'a>(
    graph: &BTreeMap<&'a str, BTreeMap<&'a str, &Edge>>,
) -> Vec<(Vec<&'a str>, Vec<&'a str>)> {
    let mut grouped: BTreeSet<&str> = BTreeSet::new();
    let mut out = Vec::new();
    for &start in graph.keys() {
        let from_start = reach(graph, start);
        if grouped.contains(start) || !from_start.contains_key(start) {
            continue;
        }
        let group: Vec<&str> = from_start
            .keys()
            .copied()
            .filter(|&m| m == start || reach(graph, m).contains_key(start))
            .collect();
        let mut walk = vec![start];
        let mut n = from_start[start];
        while n != start {
            walk.push(n);
            n = from_start[n];
        }
        walk.push(start);
        walk.reverse();
        grouped.extend(group.iter().copied());
        out.push((group, walk));
    }
    out
}

/// Reads every `.rs` file of the library under `dir` (`main.rs` is a separate crate).
fn read_tree(root: &Path, dir: &Path, out: &mut Vec<File>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            read_tree(root, &path, out);
            continue;
        }
        if path.extension().is_none_or(|x| x != "rs") {
            continue;
        }
        let rel = path.strip_prefix(root).expect("under src");
        if rel == Path::new("main.rs") {
            continue;
        }
        let mut module: Vec<String> = rel
            .with_extension("")
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        let last = module.last().map(String::as_str);
        if matches!(last, Some("mod") | Some("lib")) {
            module.pop();
        }
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        out.push(File {
            name: format!("src/{}", rel.display()),
            module,
            text,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, text: &str) -> File {
        let mut module: Vec<String> = name
            .trim_end_matches(".rs")
            .split('/')
            .map(String::from)
            .collect();
        if module.last().is_some_and(|m| m == "mod") {
            module.pop();
        }
        File {
            name: format!("src/{name}"),
            module,
            text: text.to_string(),
        }
    }

    fn tree(files: &[(&str, &str)]) -> Vec<File> {
        let mut all: Vec<File> = files.iter().map(|(n, t)| file(n, t)).collect();
        // Every module the test names exists, so edges to it count.
        for (n, _) in files {
            let parts: Vec<&str> = n.trim_end_matches(".rs").split('/').collect();
            for k in 1..parts.len() {
                let m: Vec<String> = parts[..k].iter().map(|s| s.to_string()).collect();
                if !all.iter().any(|f| f.module == m) {
                    all.push(File {
                        name: format!("src/{}/mod.rs", m.join("/")),
                        module: m,
                        text: String::new(),
                    });
                }
            }
        }
        all
    }

    #[test]
    fn the_crate_imports_only_down_and_without_circles() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        read_tree(&root, &root, &mut files);
        assert!(
            files.len() > 50,
            "read only {} files under {}",
            files.len(),
            root.display()
        );
        let found = violations_besides(&files, KNOWN_CIRCLES);
        assert!(
            found.is_empty(),
            "the import rules of src/layering.rs are broken:\n{}",
            found.join("\n")
        );
    }

    #[test]
    fn an_upward_import_names_its_file_line_and_path() {
        let files = tree(&[
            (
                "os/proc.rs",
                "use crate::model::Id;\n\nfn f() { crate::job::launch::start(); }",
            ),
            ("job/launch.rs", ""),
            ("model/id.rs", ""),
        ]);
        assert_eq!(
            violations(&files),
            [
                "src/os/proc.rs:3: `crate::job::launch::start` imports a higher layer: `os` may \
              import only model, text"
            ]
        );
    }

    #[test]
    fn a_front_end_importing_the_other_is_refused_in_any_spelling() {
        let files = tree(&[
            (
                "cli/exec.rs",
                "use crate::{model, api::{self, routes::Route as R}};",
            ),
            ("api/routes.rs", "fn g() { super::super::cli::exec::run() }"),
            ("model/id.rs", ""),
        ]);
        let found = violations(&files);
        assert_eq!(found.len(), 3, "{found:#?}");
        assert!(found[0].starts_with("src/cli/exec.rs:1: `crate::api` imports a sibling front end: `cli` may import only model, text, os, state, job"), "{found:#?}");
        assert!(
            found[1].starts_with("src/cli/exec.rs:1: `crate::api::routes::Route` imports"),
            "{found:#?}"
        );
        assert!(
            found[2].starts_with(
                "src/api/routes.rs:1: `super::super::cli::exec::run` imports a sibling front end"
            ),
            "{found:#?}"
        );
    }

    #[test]
    fn comments_strings_and_lifetimes_are_not_imports() {
        let files = tree(&[
            (
                "model/id.rs",
                "// crate::job::x\n/* crate::job::x /* nested */ crate::api */\n\
                 fn f<'a>(s: &'a str) -> char { let _ = \"crate::job::x\"; \
                 let _ = r#\"crate::cli::\"#; '\"' }\nmacro_rules! m { () => { $crate::job::x } }",
            ),
            ("job/x.rs", ""),
        ]);
        assert_eq!(violations(&files), Vec::<String>::new());
    }

    #[test]
    fn a_circle_between_sibling_files_is_refused_but_the_parent_is_not_a_sibling() {
        let files = tree(&[
            ("os/mod.rs", "pub use proc::stat; pub struct Shared;"),
            ("os/proc.rs", "use super::{Shared, cgroup::Cg};\n"),
            (
                "os/cgroup.rs",
                "fn f() {}\n#[cfg(test)]\nmod tests {\n    use super::super::proc::read;\n}",
            ),
            ("os/pidfd.rs", "use super::proc::stat;"),
        ]);
        assert_eq!(
            violations(&files),
            [
                "circle in `os` among cgroup, proc: cgroup -> proc -> cgroup\n  \
              src/os/cgroup.rs:4: `super::super::proc::read` (cgroup -> proc)\n  \
              src/os/proc.rs:1: `super::cgroup::Cg` (proc -> cgroup)"
            ]
        );
    }

    #[test]
    fn a_subfolder_is_one_sibling() {
        let files = tree(&[
            ("api/app.rs", "use super::handlers::files::write;"),
            (
                "api/handlers/files.rs",
                "use crate::api::app::App; use super::Call;",
            ),
        ]);
        let found = violations(&files);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(
            found[0].starts_with("circle in `api` among app, handlers: app -> handlers -> app\n"),
            "{found:#?}"
        );
    }

    #[test]
    fn a_known_circle_hides_only_itself_and_must_still_exist() {
        let files = tree(&[
            ("api/app.rs", "use super::cors::Origins;"),
            ("api/cors.rs", "use super::app::error_response;"),
        ]);
        assert_eq!(
            violations_besides(&files, &[("api", "app, cors")]),
            Vec::<String>::new()
        );
        let grown = violations_besides(&files, &[("api", "app, cors, routes")]);
        assert_eq!(grown.len(), 2, "{grown:#?}");
        assert!(
            grown[0].starts_with("circle in `api` among app, cors: "),
            "{grown:#?}"
        );
        assert!(
            grown[1].contains("app, cors, routes in `api` is gone or changed"),
            "{grown:#?}"
        );
    }
}
