//! The module-cycle check (docs/development.md, "Structure rules"): no top-level module of
//! `rm-agent` (`config`, `executor`, `explain`, `status_file`, `runner`, ... : what `lib.rs`
//! declares) names another that names it back, directly or through others. Test code only: the
//! check is the unit test `module_cycles::tests::no_module_cycle`, so `.ci/run`'s `cargo test`
//! runs it, with no binary and no dependency of its own. A cycle fails it with the cycle's path
//! of modules and one `file:line` per edge.
//!
//! It reads the sources as the compiler finds them: from `src/lib.rs` through every `mod x;`
//! (`x.rs`, `x/mod.rs` or its `#[path]`), and lexes each file (comments, strings, character
//! literals and lifetimes are recognized, so nothing in them is read as a path).
//!
//! **What counts as "module `a` names module `b`"** (`a` ≠ `b`, both top-level): a path in `a`'s
//! code whose first segment, resolved from the crate root, is `b`:
//! - `crate::b…` and `$crate::b…`, and each item of a group, `crate::{b::X, c}`;
//! - `super::…` climbing out of `a` to the crate root, then `b` or a group, as above.
//!
//! A macro's arguments and a `macro_rules!` body count: they expand into `a`'s code. A bare `b::X`
//! needs a `use crate::b` first, which already counts; a glob of the crate root (`use
//! crate::*`) would hide what it names, so the check refuses it.
//!
//! **What does not count:** comments, doc comments and their links (a pointer for the reader,
//! which the compiler does not follow), string literals, and test code: a file declared under
//! `#[cfg(test)]` (or `#![cfg(test)]`), and any item, field or statement under `#[cfg(test)]` or
//! `#[cfg(all(test, …))]`. Test code is left out because it is not part of what is built and
//! shipped, and a test that builds its fixture from a neighbour is not a decision with two owners
//! (the executor harness runs the commands, `config`'s tests ask `runner`: with test code, those
//! close two cycles); `any(test, …)` and `not(test)` are product code. An item skipped under
//! `#[cfg(test)]` ends at its first `;`, `,` or body-closing `}` at its own depth (`let`, `use`,
//! `const`, `static` and `type` at their `;`), never later than the item really ends: where that
//! rule stops early (a comma inside `<…>`), the rest is read as product code, so a mistake can
//! only count test code, never hide product code.

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// One token of Rust source, as much of it as the check needs.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// A string literal's text as written (escapes kept: only `#[path = "…"]` reads it).
    Str(String),
    /// `::`
    PathSep,
    Punct(char),
    /// A number, character or byte literal: nothing the check reads.
    Literal,
}

/// A token and the line it starts on, for the failure's `file:line`.
#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    line: usize,
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// The tokens of `src`, without comments and whitespace.
fn lex(src: &str) -> Vec<Token> {
    let s: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    // The newlines inside `s[from..to]`: a comment or literal over several lines moves the count on.
    let lines_in = |from: usize, to: usize| {
        s[from..to.min(s.len())]
            .iter()
            .filter(|c| **c == '\n')
            .count()
    };
    while i < s.len() {
        let c = s[i];
        let next = s.get(i + 1).copied();
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            // Block comments nest.
            let start = i;
            let mut depth = 0usize;
            while i < s.len() {
                if s[i] == '/' && s.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if s[i] == '*' && s.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            line += lines_in(start, i);
        } else if c == '"' {
            let (text, end) = quoted(&s, i + 1);
            out.push(Token {
                tok: Tok::Str(text),
                line,
            });
            line += lines_in(i, end);
            i = end;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{1F600}') or a lifetime ('a, 'static).
            if next == Some('\\') {
                let mut j = i + 3;
                while j < s.len() && s[j] != '\'' {
                    j += 1;
                }
                out.push(Token {
                    tok: Tok::Literal,
                    line,
                });
                i = j + 1;
            } else if s.get(i + 2) == Some(&'\'') {
                out.push(Token {
                    tok: Tok::Literal,
                    line,
                });
                i += 3;
            } else {
                i += 1;
                while i < s.len() && is_ident_char(s[i]) {
                    i += 1;
                }
            }
        } else if c.is_ascii_digit() {
            while i < s.len()
                && (is_ident_char(s[i])
                    || (s[i] == '.' && s.get(i + 1).is_some_and(|d| d.is_ascii_digit())))
            {
                i += 1;
            }
            out.push(Token {
                tok: Tok::Literal,
                line,
            });
        } else if is_ident_start(c) {
            let start = i;
            while i < s.len() && is_ident_char(s[i]) {
                i += 1;
            }
            let word: String = s[start..i].iter().collect();
            let after = s.get(i).copied();
            match (word.as_str(), after) {
                // Raw strings: r"…", r#"…"#, br"…", cr#"…"#.
                ("r" | "br" | "cr", Some('"' | '#'))
                    if s[i..].iter().find(|c| **c != '#') == Some(&'"') =>
                {
                    let hashes = s[i..].iter().take_while(|c| **c == '#').count();
                    let body = i + hashes + 1;
                    let mut j = body;
                    let end = loop {
                        if j >= s.len() {
                            break s.len();
                        }
                        if s[j] == '"'
                            && s[j + 1..]
                                .iter()
                                .take(hashes)
                                .filter(|c| **c == '#')
                                .count()
                                == hashes
                        {
                            break j;
                        }
                        j += 1;
                    };
                    out.push(Token {
                        tok: Tok::Str(s[body..end].iter().collect()),
                        line,
                    });
                    line += lines_in(i, end);
                    i = (end + 1 + hashes).min(s.len());
                }
                // A raw identifier: r#type.
                ("r", Some('#')) if s.get(i + 1).is_some_and(|c| is_ident_start(*c)) => {
                    let start = i + 1;
                    i = start;
                    while i < s.len() && is_ident_char(s[i]) {
                        i += 1;
                    }
                    out.push(Token {
                        tok: Tok::Ident(s[start..i].iter().collect()),
                        line,
                    });
                }
                // Byte and C strings: b"…", c"…".
                ("b" | "c", Some('"')) => {
                    let (text, end) = quoted(&s, i + 1);
                    out.push(Token {
                        tok: Tok::Str(text),
                        line,
                    });
                    line += lines_in(i, end);
                    i = end;
                }
                // A byte literal, b'x': the quote is a character literal's.
                ("b", Some('\'')) => {}
                _ => out.push(Token {
                    tok: Tok::Ident(word),
                    line,
                }),
            }
        } else if c == ':' && next == Some(':') {
            out.push(Token {
                tok: Tok::PathSep,
                line,
            });
            i += 2;
        } else {
            out.push(Token {
                tok: Tok::Punct(c),
                line,
            });
            i += 1;
        }
    }
    out
}

/// The text of a `"`-quoted literal whose body starts at `from`, and the index after its closing
/// quote. An escape keeps its backslash: only `#[path]` reads the text, and a path has none.
fn quoted(s: &[char], from: usize) -> (String, usize) {
    let mut j = from;
    while j < s.len() && s[j] != '"' {
        j += if s[j] == '\\' { 2 } else { 1 };
    }
    let end = j.min(s.len());
    (s[from..end].iter().collect(), (end + 1).min(s.len()))
}

/// A `mod name;` declaration: a file to read.
#[derive(Debug, Clone, PartialEq)]
struct ModDecl {
    name: String,
    /// The inline modules (`mod a { … }`) the declaration sits in, outermost first.
    inline: Vec<String>,
    /// Its `#[path = "…"]`, if any.
    path: Option<String>,
    line: usize,
}

/// What one file says: the top-level modules its product code names, and the files it declares.
#[derive(Debug, Default)]
struct FileScan {
    /// Each top-level module named, with the line of the path (in the order found).
    names: Vec<(String, usize)>,
    mods: Vec<ModDecl>,
    /// What the check cannot read, with the line.
    problems: Vec<(String, usize)>,
}

fn ident(toks: &[Token], i: usize) -> Option<&str> {
    match toks.get(i) {
        Some(Token {
            tok: Tok::Ident(word),
            ..
        }) => Some(word),
        _ => None,
    }
}

fn punct(toks: &[Token], i: usize, c: char) -> bool {
    matches!(toks.get(i), Some(Token { tok: Tok::Punct(p), .. }) if *p == c)
}

fn path_sep(toks: &[Token], i: usize) -> bool {
    matches!(
        toks.get(i),
        Some(Token {
            tok: Tok::PathSep,
            ..
        })
    )
}

/// The index of the delimiter closing the one at `open`, or the end.
fn closing(toks: &[Token], open: usize) -> usize {
    let mut depth = 0usize;
    for (j, token) in toks.iter().enumerate().skip(open) {
        match token.tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return j;
                }
            }
            _ => {}
        }
    }
    toks.len()
}

/// Whether an attribute's tokens (inside `#[…]`) make its item test code: `cfg(test)` or
/// `cfg(all(…, test, …))`.
fn is_cfg_test(attr: &[Token]) -> bool {
    if ident(attr, 0) != Some("cfg") || !punct(attr, 1, '(') {
        return false;
    }
    let predicate = &attr[2..attr.len().saturating_sub(1)];
    if predicate.len() == 1 && ident(predicate, 0) == Some("test") {
        return true;
    }
    if ident(predicate, 0) != Some("all") || !punct(predicate, 1, '(') {
        return false;
    }
    // `test` directly inside `all(…)`, not inside a nested `not(test)` or `any(test, …)`.
    let mut depth = 0usize;
    predicate.iter().enumerate().skip(1).any(|(j, token)| {
        match token.tok {
            Tok::Punct('(') => depth += 1,
            Tok::Punct(')') => depth = depth.saturating_sub(1),
            _ => {}
        }
        depth == 1 && ident(predicate, j) == Some("test")
    })
}

/// `#[path = "…"]`'s path.
fn path_attr(attr: &[Token]) -> Option<String> {
    match attr {
        [
            Token {
                tok: Tok::Ident(word),
                ..
            },
            Token {
                tok: Tok::Punct('='),
                ..
            },
            Token {
                tok: Tok::Str(path),
                ..
            },
        ] if word == "path" => Some(path.clone()),
        _ => None,
    }
}

/// The index after the item, field or statement starting at `start` (after its attributes):
/// after its `;`, its `,` or the `}` closing its body, whichever comes first at its own depth;
/// before the delimiter that closes the block around it if that comes first.
fn skip_item(toks: &[Token], start: usize) -> usize {
    let mut k = start;
    if ident(toks, k) == Some("pub") {
        k += 1;
        if punct(toks, k, '(') {
            k = closing(toks, k) + 1;
        }
    }
    // These end only at their `;`: a block or a comma inside them is part of them.
    let to_semicolon = matches!(ident(toks, k), Some("let" | "use" | "static" | "type"))
        || (ident(toks, k) == Some("const")
            && !matches!(
                ident(toks, k + 1),
                Some("fn" | "unsafe" | "async" | "extern")
            ));
    let mut depth = 0usize;
    let mut j = start;
    while j < toks.len() {
        match toks[j].tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(close @ (')' | ']' | '}')) => {
                if depth == 0 {
                    return j;
                }
                depth -= 1;
                if depth == 0 && close == '}' && !to_semicolon {
                    return j + 1;
                }
            }
            Tok::Punct(';') if depth == 0 => return j + 1,
            Tok::Punct(',') if depth == 0 && !to_semicolon => return j + 1,
            _ => {}
        }
        j += 1;
    }
    j
}

/// The top-level modules named by the path segments after `crate::` (or a `super::` chain that
/// reached the crate root) at `i`: one segment, or each item of a group. `None` for a glob.
fn root_names(toks: &[Token], i: usize) -> Option<Vec<String>> {
    if let Some(word) = ident(toks, i) {
        return Some(vec![word.to_owned()]);
    }
    if !punct(toks, i, '{') {
        return None;
    }
    // A group: the first segment of each of its items, at its own depth. `self` and a nested
    // glob name no top-level module.
    let end = closing(toks, i);
    let mut names = Vec::new();
    let mut depth = 0usize;
    let mut item_start = true;
    for j in i..end {
        match toks[j].tok {
            Tok::Punct('(' | '[' | '{') => {
                depth += 1;
                item_start = depth == 1;
            }
            Tok::Punct(')' | ']' | '}') => depth = depth.saturating_sub(1),
            Tok::Punct(',') if depth == 1 => item_start = true,
            Tok::Punct('*') if depth == 1 && item_start => return None,
            _ => {
                if depth == 1
                    && item_start
                    && let Some(word) = ident(toks, j)
                {
                    names.push(word.to_owned());
                }
                item_start = false;
            }
        }
    }
    Some(names)
}

/// Reads one file's tokens. `module` is the file's module path from the crate root (empty for
/// `lib.rs`).
fn scan(toks: &[Token], module: &[String]) -> FileScan {
    let mut found = FileScan::default();
    let mut depth = 0usize;
    // The inline modules open around the current token, with the brace depth inside each.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut test_item = false;
    let mut path: Option<String> = None;
    let mut i = 0;
    while i < toks.len() {
        let line = toks[i].line;
        // An attribute: #[…] or #![…].
        if punct(toks, i, '#') {
            let inner = punct(toks, i + 1, '!');
            let open = i + 1 + usize::from(inner);
            if punct(toks, open, '[') {
                let close = closing(toks, open);
                let attr = &toks[(open + 1).min(close)..close];
                if is_cfg_test(attr) {
                    if inner {
                        // The rest of the enclosing module is test code.
                        let mut j = close + 1;
                        let mut level = 0usize;
                        while j < toks.len() {
                            match toks[j].tok {
                                Tok::Punct('(' | '[' | '{') => level += 1,
                                Tok::Punct(')' | ']' | '}') if level == 0 => break,
                                Tok::Punct(')' | ']' | '}') => level -= 1,
                                _ => {}
                            }
                            j += 1;
                        }
                        i = j;
                        continue;
                    }
                    test_item = true;
                }
                if let Some(p) = path_attr(attr) {
                    path = Some(p);
                }
                i = close + 1;
                continue;
            }
        }
        if test_item {
            test_item = false;
            path = None;
            i = skip_item(toks, i);
            continue;
        }
        match &toks[i].tok {
            Tok::Ident(word) if word == "mod" => {
                if let Some(name) = ident(toks, i + 1) {
                    if punct(toks, i + 2, ';') {
                        found.mods.push(ModDecl {
                            name: name.to_owned(),
                            inline: inline.iter().map(|(n, _)| n.clone()).collect(),
                            path: path.take(),
                            line,
                        });
                        i += 3;
                        continue;
                    }
                    if punct(toks, i + 2, '{') {
                        depth += 1;
                        inline.push((name.to_owned(), depth));
                        path = None;
                        i += 3;
                        continue;
                    }
                }
            }
            Tok::Ident(word) if word == "crate" && path_sep(toks, i + 1) => {
                match root_names(toks, i + 2) {
                    Some(names) => found.names.extend(names.into_iter().map(|n| (n, line))),
                    None => found.problems.push((
                        "a glob of the crate root hides which modules it names".into(),
                        line,
                    )),
                }
            }
            Tok::Ident(word) if word == "super" && path_sep(toks, i + 1) => {
                // `super::super::…`: how far up, from the module this token is in.
                let mut climb = 0;
                let mut j = i;
                while ident(toks, j) == Some("super") && path_sep(toks, j + 1) {
                    climb += 1;
                    j += 2;
                }
                if climb == module.len() + inline.len() {
                    match root_names(toks, j) {
                        Some(names) => found.names.extend(names.into_iter().map(|n| (n, line))),
                        None => found.problems.push((
                            "a glob of the crate root hides which modules it names".into(),
                            line,
                        )),
                    }
                }
                i = j;
                continue;
            }
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                path = None;
            }
            Tok::Punct(';') => path = None,
            _ => {}
        }
        i += 1;
    }
    found
}

/// Where an edge is made: a file, relative to the workspace, and a line.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Site {
    file: String,
    line: usize,
}

/// Top-level module → the modules it names → where, in file order.
type Graph = BTreeMap<String, BTreeMap<String, Vec<Site>>>;

/// The crate's module graph, read from `src_dir/lib.rs` down, or what could not be read.
fn crate_graph(src_dir: &Path, display_root: &Path) -> Result<Graph, Vec<String>> {
    let mut problems = Vec::new();
    let lib = src_dir.join("lib.rs");
    // (file, module path, whether the file owns a directory as lib.rs and mod.rs do)
    let mut queue = vec![(lib, Vec::<String>::new(), true)];
    let mut scanned: Vec<(String, Vec<String>, FileScan)> = Vec::new();
    while let Some((file, module, owns_dir)) = queue.pop() {
        let shown = file
            .strip_prefix(display_root)
            .unwrap_or(&file)
            .display()
            .to_string();
        let text = match std::fs::read_to_string(&file) {
            Ok(text) => text,
            Err(e) => {
                problems.push(format!("{shown}: {e}"));
                continue;
            }
        };
        let found = scan(&lex(&text), &module);
        let parent = file.parent().map_or_else(PathBuf::new, Path::to_path_buf);
        for decl in &found.mods {
            let mut child_module = module.clone();
            child_module.extend(decl.inline.iter().cloned());
            child_module.push(decl.name.clone());
            if let Some(path) = &decl.path {
                if !decl.inline.is_empty() {
                    problems.push(format!(
                        "{shown}:{}: #[path] inside an inline module: the check does not resolve it",
                        decl.line
                    ));
                    continue;
                }
                // A #[path] file resolves its own `mod`s as a mod.rs does.
                queue.push((parent.join(path), child_module, true));
                continue;
            }
            let mut dir = if owns_dir {
                parent.clone()
            } else {
                parent.join(file.file_stem().unwrap_or_default())
            };
            dir.extend(&decl.inline);
            let flat = dir.join(format!("{}.rs", decl.name));
            let nested = dir.join(&decl.name).join("mod.rs");
            if flat.is_file() {
                queue.push((flat, child_module, false));
            } else if nested.is_file() {
                queue.push((nested, child_module, true));
            } else {
                problems.push(format!(
                    "{shown}:{}: no file for `mod {};`",
                    decl.line, decl.name
                ));
            }
        }
        for (what, line) in &found.problems {
            problems.push(format!("{shown}:{line}: {what}"));
        }
        scanned.push((shown, module, found));
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let nodes: BTreeSet<String> = scanned
        .iter()
        .filter(|(_, module, _)| module.len() == 1)
        .map(|(_, module, _)| module[0].clone())
        .collect();
    let mut graph: Graph = nodes.iter().map(|n| (n.clone(), BTreeMap::new())).collect();
    for (shown, module, found) in &scanned {
        let Some(from) = module.first() else {
            continue; // lib.rs declares the modules; it is not one of them.
        };
        for (to, line) in &found.names {
            if to != from && nodes.contains(to) {
                let sites = graph
                    .entry(from.clone())
                    .or_default()
                    .entry(to.clone())
                    .or_default();
                sites.push(Site {
                    file: shown.clone(),
                    line: *line,
                });
            }
        }
    }
    for targets in graph.values_mut() {
        for sites in targets.values_mut() {
            sites.sort();
        }
    }
    Ok(graph)
}

/// The graph's strongly connected components of more than one module (each a set of modules
/// that all reach each other), each sorted, in order of their first module.
fn cyclic_components(graph: &Graph) -> Vec<Vec<String>> {
    // Kosaraju: finishing order on the graph, then reachability on the reversed graph.
    fn finish<'a>(
        graph: &'a Graph,
        node: &'a str,
        seen: &mut BTreeSet<&'a str>,
        order: &mut Vec<&'a str>,
    ) {
        if !seen.insert(node) {
            return;
        }
        for next in graph.get(node).into_iter().flat_map(BTreeMap::keys) {
            finish(graph, next, seen, order);
        }
        order.push(node);
    }
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    for node in graph.keys() {
        finish(graph, node, &mut seen, &mut order);
    }
    let mut reversed: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, targets) in graph {
        for to in targets.keys() {
            reversed.entry(to).or_default().push(from);
        }
    }
    let mut assigned = BTreeSet::new();
    let mut components = Vec::new();
    for root in order.into_iter().rev() {
        if assigned.contains(root) {
            continue;
        }
        let mut component = Vec::new();
        let mut stack = vec![root];
        assigned.insert(root);
        while let Some(node) = stack.pop() {
            component.push(node.to_owned());
            for prev in reversed.get(node).into_iter().flatten() {
                if assigned.insert(prev) {
                    stack.push(prev);
                }
            }
        }
        if component.len() > 1 {
            component.sort();
            components.push(component);
        }
    }
    components.sort();
    components
}

/// A shortest cycle through `component`'s first module, inside the component: its modules in
/// order, the first again at the end.
fn shortest_cycle(graph: &Graph, component: &[String]) -> Vec<String> {
    let start = &component[0];
    let inside: BTreeSet<&String> = component.iter().collect();
    let mut came_from: BTreeMap<&String, &String> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(node) = queue.pop_front() {
        for next in graph.get(node).into_iter().flat_map(BTreeMap::keys) {
            if next == start {
                let mut path = vec![start.clone()];
                let mut at = node;
                while at != start {
                    path.push(at.clone());
                    at = came_from[at];
                }
                path.push(start.clone());
                path.reverse();
                return path;
            }
            if inside.contains(next) && !came_from.contains_key(next) {
                came_from.insert(next, node);
                queue.push_back(next);
            }
        }
    }
    // A component of more than one module always has a cycle through each of its modules.
    component.to_vec()
}

/// The failure message for the graph's cycles, or `None` without one.
fn cycle_report(graph: &Graph) -> Option<String> {
    let components = cyclic_components(graph);
    if components.is_empty() {
        return None;
    }
    let mut report = String::from(
        "module cycles in rm-agent (docs/development.md, \"Structure rules\"): each line is one \
         module naming the next, and one place it does so; remove every such place of one edge \
         to break the cycle\n",
    );
    for component in &components {
        let cycle = shortest_cycle(graph, component);
        report.push_str(&format!("\n  {}\n", cycle.join(" -> ")));
        for pair in cycle.windows(2) {
            let sites = &graph[&pair[0]][&pair[1]];
            let more = match sites.len() {
                1 => String::new(),
                n => format!(" (and {} more)", n - 1),
            };
            report.push_str(&format!(
                "    {} -> {}: {}:{}{more}\n",
                pair[0], pair[1], sites[0].file, sites[0].line
            ));
        }
        if component.len() + 1 > cycle.len() {
            report.push_str(&format!(
                "    (these modules all reach each other too: {}; the next run shows the next cycle)\n",
                component.join(", ")
            ));
        }
    }
    Some(report)
}
