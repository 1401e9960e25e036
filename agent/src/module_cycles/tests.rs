use super::*;

/// The crate's own check: `.ci/run`'s `cargo test` runs it.
#[test]
fn no_module_cycle() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace = manifest.parent().unwrap_or(manifest);
    let graph = match crate_graph(&manifest.join("src"), workspace) {
        Ok(graph) => graph,
        Err(problems) => panic!(
            "the module-cycle check cannot read the crate:\n{}",
            problems.join("\n")
        ),
    };
    // The walk found the crate: a check that read nothing would pass.
    for module in [
        "config",
        "executor",
        "explain",
        "status_file",
        "isolation",
        "polling",
    ] {
        assert!(
            graph.contains_key(module),
            "the walk from lib.rs missed `{module}`: {:?}",
            graph.keys()
        );
    }
    if let Some(report) = cycle_report(&graph) {
        panic!("{report}");
    }
}

/// The top-level modules a snippet in module `module` names, sorted (what the graph would draw
/// from it, before leaving out its own name and names that are no module).
fn names(module: &[&str], src: &str) -> Vec<String> {
    let module: Vec<String> = module.iter().map(|m| (*m).to_owned()).collect();
    let found = scan(&lex(src), &module);
    assert!(found.problems.is_empty(), "{src}: {:?}", found.problems);
    let mut names: Vec<String> = found.names.into_iter().map(|(name, _)| name).collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn what_counts_as_naming_a_module() {
    // (the file's module path, its source, the top-level modules it names)
    let cases: &[(&[&str], &str, &[&str])] = &[
        // Paths from the crate root.
        (
            &["explain"],
            "use crate::executor::allocate;",
            &["executor"],
        ),
        (
            &["explain"],
            "let d = crate::executor::PASS_INTERVAL;",
            &["executor"],
        ),
        (
            &["explain"],
            "crate :: executor\n  :: PASS_INTERVAL",
            &["executor"],
        ),
        (
            &["explain"],
            "fn f(x: Option<crate::status_file::Snapshot>) {}",
            &["status_file"],
        ),
        (
            &["explain"],
            "use crate::{allocation::{self, AllocationInput}, config::Policy, demand};",
            &["allocation", "config", "demand"],
        ),
        (
            &["explain"],
            "use crate::{\n    config,\n    lock::{self, Owner},\n};",
            &["config", "lock"],
        ),
        // A macro's arguments and a macro_rules! body are code.
        (
            &["explain"],
            "tracing::info!(\"{}\", crate::executor::PASS_INTERVAL.as_secs());",
            &["executor"],
        ),
        (
            &["output"],
            "macro_rules! m { () => { $crate::exit::code() }; }",
            &["exit"],
        ),
        // `super` climbing to the crate root from a top-level file, from a file below it, and
        // from an inline module.
        (
            &["status_file"],
            "use super::{lock, output::Style};",
            &["lock", "output"],
        ),
        (
            &["executor", "allocate"],
            "use super::super::demand::route;",
            &["demand"],
        ),
        (
            &["executor", "allocate"],
            "use super::control::Executor;",
            &[],
        ),
        (
            &["status_file"],
            "mod inner { use super::super::polling; use super::Snapshot; }",
            &["polling"],
        ),
        (
            &["status_file"],
            "mod inner { fn f() {} }\nuse super::lock;",
            &["lock"],
        ),
        // Not code: comments, doc links, strings.
        (&["config"], "// crate::executor\nfn f() {}", &[]),
        (
            &["config"],
            "/// See [`crate::executor::allocate`].\nfn f() {}",
            &[],
        ),
        (&["config"], "//! Read by `crate::notify`.\n", &[]),
        (
            &["config"],
            "/* crate::a /* nested */ crate::b */ crate::c::X",
            &["c"],
        ),
        (
            &["config"],
            "let s = \"crate::executor \\\" crate::runner\"; crate::c::f();",
            &["c"],
        ),
        (
            &["config"],
            "let s = r#\"crate::a \" crate::b\"#; crate::c::f();",
            &["c"],
        ),
        (
            &["config"],
            "let s = b\"crate::a\"; let t = br\"crate::b\"; crate::c::f();",
            &["c"],
        ),
        (
            &["config"],
            "let q = '\"'; let e = '\\''; let b = b'\"'; crate::d::f();",
            &["d"],
        ),
        (
            &["config"],
            "fn f<'a>(x: &'a str) -> &'static str { crate::e::g(x) }",
            &["e"],
        ),
        (&["config"], "#[doc = \"crate::a\"] fn f() {}", &[]),
        (&["config"], "pub(crate) fn f() {}", &[]),
        // Test code does not count; code under other cfgs does.
        (
            &["config"],
            "#[cfg(test)]\nmod tests { use crate::status_file::Snapshot; }\nuse crate::lock;",
            &["lock"],
        ),
        (
            &["config"],
            "#[cfg(test)] use crate::a::X;\nuse crate::b::Y;",
            &["b"],
        ),
        (
            &["config"],
            "#[cfg(test)] fn helper() { crate::a::f() }\nfn real() { crate::b::f() }",
            &["b"],
        ),
        (
            &["config"],
            "#[cfg(test)]\n#[path = \"x_tests.rs\"]\nmod tests;\nuse crate::b;",
            &["b"],
        ),
        (
            &["config"],
            "#[cfg(all(test, feature = \"demo\"))] use crate::a::X;\nuse crate::b;",
            &["b"],
        ),
        (
            &["config"],
            "#[cfg(any(test, feature = \"demo\"))] use crate::a::X;",
            &["a"],
        ),
        (&["config"], "#[cfg(not(test))] use crate::a::X;", &["a"]),
        (
            &["config"],
            "#[cfg(feature = \"demo\")] use crate::a::X;",
            &["a"],
        ),
        (
            &["config"],
            "struct S { #[cfg(test)] t: crate::a::T, u: crate::b::U }",
            &["b"],
        ),
        (
            &["config"],
            "fn f() { #[cfg(test)] let x = crate::a::f(); crate::b::g(); }",
            &["b"],
        ),
        (
            &["config"],
            "match x { #[cfg(test)] X => crate::a::f(), _ => crate::b::g() }",
            &["b"],
        ),
        (
            &["config"],
            "#[cfg(test)] const N: [u8; 2] = [0; 2];\nuse crate::b;",
            &["b"],
        ),
        (
            &["config"],
            "mod inner {\n#![cfg(test)]\nuse crate::a;\n}\nuse crate::b;",
            &["b"],
        ),
    ];
    for (module, src, want) in cases {
        assert_eq!(names(module, src), *want, "in {module:?}: {src}");
    }
}

#[test]
fn a_glob_of_the_crate_root_is_refused() {
    for (module, src) in [
        (&["config"][..], "use crate::*;"),
        (&["config"][..], "use super::*;"),
    ] {
        let module: Vec<String> = module.iter().map(|m| (*m).to_owned()).collect();
        let found = scan(&lex(src), &module);
        assert_eq!(found.problems.len(), 1, "{src}");
    }
    // `super::*` inside a module's own tests is its parent, not the root.
    assert_eq!(
        names(&["config"], "mod tests { use super::*; }"),
        Vec::<String>::new()
    );
}

#[test]
fn lines_follow_comments_and_strings() {
    let src = "/* one\n two */\nlet s = \"a\nb\";\nlet r = r#\"c\nd\"#;\nuse crate::x;";
    let found = scan(&lex(src), &["config".to_owned()]);
    assert_eq!(found.names, vec![("x".to_owned(), 7)]);
}

#[test]
fn module_declarations_are_found_with_their_path_and_inline_modules() {
    let src = "pub(crate) mod a;\n#[path = \"b_impl.rs\"]\nmod b;\nmod c { mod d; }\n#[cfg(test)]\nmod tests;";
    let found = scan(&lex(src), &[]);
    let got: Vec<(String, Vec<String>, Option<String>)> = found
        .mods
        .into_iter()
        .map(|m| (m.name, m.inline, m.path))
        .collect();
    assert_eq!(
        got,
        vec![
            ("a".to_owned(), vec![], None),
            ("b".to_owned(), vec![], Some("b_impl.rs".to_owned())),
            ("d".to_owned(), vec!["c".to_owned()], None),
        ]
    );
}

fn graph(edges: &[(&str, &str, usize)]) -> Graph {
    let mut graph = Graph::new();
    for (from, to, line) in edges {
        graph.entry((*to).to_owned()).or_default();
        let site = Site {
            file: format!("agent/src/{from}.rs"),
            line: *line,
        };
        graph
            .entry((*from).to_owned())
            .or_default()
            .entry((*to).to_owned())
            .or_default()
            .push(site);
    }
    graph
}

#[test]
fn a_cycle_is_named_with_one_place_per_edge() {
    let g = graph(&[
        ("a", "b", 1),
        ("b", "c", 2),
        ("c", "a", 3),
        ("d", "a", 4),
        ("c", "e", 5),
    ]);
    let report = cycle_report(&g).expect("a cycle");
    assert!(report.contains("a -> b -> c -> a"), "{report}");
    assert!(report.contains("a -> b: agent/src/a.rs:1"), "{report}");
    assert!(report.contains("b -> c: agent/src/b.rs:2"), "{report}");
    assert!(report.contains("c -> a: agent/src/c.rs:3"), "{report}");
    assert!(!report.contains(" d "), "{report}");
}

#[test]
fn each_cycle_is_reported_and_the_shortest_through_a_component() {
    // Two components; the first has a long and a short way round.
    let g = graph(&[
        ("a", "b", 1),
        ("b", "c", 2),
        ("c", "a", 3),
        ("b", "a", 4),
        ("x", "y", 5),
        ("y", "x", 6),
    ]);
    assert_eq!(
        cyclic_components(&g),
        vec![vec!["a", "b", "c"], vec!["x", "y"]]
    );
    let report = cycle_report(&g).expect("cycles");
    assert!(report.contains("a -> b -> a"), "{report}");
    assert!(
        report.contains("these modules all reach each other too: a, b, c"),
        "{report}"
    );
    assert!(report.contains("x -> y -> x"), "{report}");
}

#[test]
fn no_cycle_no_report() {
    let g = graph(&[("a", "b", 1), ("b", "c", 2), ("a", "c", 3)]);
    assert_eq!(cycle_report(&g), None);
}
