//! The modules of this crate form no import circle: each can be read, changed and tested with
//! only the modules below it in mind. A module's own directory (`layer/`, `lease/`, `memory/`)
//! counts as part of it; test modules and comments are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module name → the modules it names through `crate::`.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut texts = BTreeMap::new();
    for entry in std::fs::read_dir(&src).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        let Some(name) = path
            .file_stem()
            .and_then(|s| s.to_str())
            .map(str::to_string)
        else {
            continue;
        };
        if path.extension().is_none_or(|e| e != "rs") || name == "lib" || name == "module_graph" {
            continue;
        }
        let mut text = code_of(&path);
        if let Ok(children) = std::fs::read_dir(src.join(&name)) {
            for child in children {
                let child = child.expect("a directory entry").path();
                if child.file_stem().is_some_and(|s| s != "tests") {
                    text.push_str(&code_of(&child));
                }
            }
        }
        texts.insert(name, text);
    }
    texts
        .iter()
        .map(|(name, text)| {
            let named = crate_paths(text)
                .into_iter()
                .filter(|m| m != name && texts.contains_key(m))
                .collect();
            (name.clone(), named)
        })
        .collect()
}

/// A file's text without its line comments and its test module.
fn code_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("a source file is readable");
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => &text[..],
    };
    text.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first segment of every `crate::a::…` and of every path in `crate::{a::…, b, …}`.
fn crate_paths(text: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = BTreeSet::new();
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            found.insert(ident(rest));
            continue;
        };
        let (mut depth, mut start) = (0, 0);
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    found.insert(ident(&group[start..i]));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    found.insert(ident(&group[start..i]));
                    start = i + 1;
                }
                _ => {}
            }
        }
    }
    found
}

/// A circle through `from`, if there is one: the modules in order, `from` first and last.
fn circle_through(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Option<Vec<String>> {
    let mut stack = vec![vec![from.to_string()]];
    let mut seen = BTreeSet::new();
    while let Some(path) = stack.pop() {
        let last = path.last().expect("a path is never empty");
        for next in &graph[last] {
            if next == from {
                let mut circle = path.clone();
                circle.push(next.clone());
                return Some(circle);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push(longer);
            }
        }
    }
    None
}

#[test]
fn no_module_imports_itself_through_others() {
    let graph = graph();
    assert!(graph.len() > 20, "the modules were not found: {graph:?}");
    let circles: Vec<String> = graph
        .keys()
        .filter_map(|m| circle_through(&graph, m))
        .map(|c| c.join(" → "))
        .collect();
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_reader_sees_grouped_and_nested_imports() {
    let found = crate_paths("use crate::{a::B, c, d::{e, f}};\nlet x = crate::g::h();");
    let names: Vec<&str> = found.iter().map(String::as_str).collect();
    assert_eq!(names, ["a", "c", "d", "g"]);
}

#[test]
fn a_circle_is_found_and_shown_in_order() {
    let graph: BTreeMap<String, BTreeSet<String>> =
        [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
            .into_iter()
            .map(|(m, n)| (m.to_string(), BTreeSet::from([n.to_string()])))
            .collect();
    assert_eq!(
        circle_through(&graph, "a").map(|c| c.join(" → ")),
        Some("a → b → c → a".to_string())
    );
    assert_eq!(circle_through(&graph, "d"), None);
}
