//! The code stays walkable: the modules of src/ form no dependency cycle, at the top level and
//! among the pipeline's stages, and no file grows past what a person reads in one go. Prints
//! the graph and the longest files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest a file of src/ may be, in lines.
const MOST_LINES: usize = 600;

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The code of a file without its comments and string literals' contents, roughly: enough
/// that a path written in a doc comment or a message does not count as a dependency.
fn code(text: &str) -> String {
    text.lines()
        .map(|l| {
            let t = l.trim_start();
            if t.starts_with("//") { "" } else { l }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Identifiers that follow `prefix` in `text` (`crate::` -> `hub`, `pipeline`, ...).
fn after(text: &str, prefix: &str) -> BTreeSet<String> {
    text.match_indices(prefix)
        .filter_map(|(i, _)| {
            let rest = text.get(i + prefix.len()..)?;
            let id: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            (!id.is_empty()).then_some(id)
        })
        .collect()
}

/// A cycle of `graph`, if it has one.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for n in graph.keys() {
        if let Some(c) = visit(n, graph, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

/// The graph of `level`-deep modules under `within` (empty: the crate), from `crate::` paths.
fn graph(within: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let mut all = Vec::new();
    files(&src(), &mut all);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in all {
        let rel = f.strip_prefix(src()).unwrap();
        let parts: Vec<String> = rel
            .with_extension("")
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if parts.len() <= within.len() || parts[..within.len()] != *within {
            continue;
        }
        let me = parts[within.len()].clone();
        if ["lib", "main", "mod"].contains(&me.as_str()) {
            continue;
        }
        let text = code(&std::fs::read_to_string(&f).unwrap());
        let mut prefix = String::from("crate::");
        for w in within {
            prefix.push_str(w);
            prefix.push_str("::");
        }
        let mut deps = after(&text, &prefix);
        // Inside a module, its siblings are reached through `super::` too: once from a file
        // beside them, once more for each folder further down (a folder's mod.rs is at its
        // folder's level).
        if !within.is_empty() {
            let is_mod = parts.last().is_some_and(|p| p == "mod");
            let depth = parts.len() - within.len() - usize::from(is_mod);
            deps.extend(after(&text, &"super::".repeat(depth)));
        }
        deps.remove(&me);
        let entry = g.entry(me).or_default();
        entry.extend(deps);
    }
    let names: BTreeSet<String> = g.keys().cloned().collect();
    for deps in g.values_mut() {
        deps.retain(|d| names.contains(d));
    }
    g
}

#[test]
fn the_modules_depend_on_each_other_without_a_cycle() {
    for within in [&[][..], &["pipeline"]] {
        let g = graph(within);
        println!("modules of src/{}:", within.join("/"));
        for (m, deps) in &g {
            println!(
                "  {m} -> {}",
                deps.iter().cloned().collect::<Vec<_>>().join(", ")
            );
        }
        assert!(g.len() > 5, "{g:?}");
        if let Some(c) = cycle(&g) {
            panic!(
                "a dependency cycle in src/{}: {}",
                within.join("/"),
                c.join(" -> ")
            );
        }
    }
}

#[test]
fn no_file_in_src_is_longer_than_a_person_reads_in_one_go() {
    let mut all = Vec::new();
    files(&src(), &mut all);
    let mut sizes: Vec<(usize, String)> = all
        .iter()
        .map(|f| {
            let n = std::fs::read_to_string(f).unwrap().lines().count();
            (n, f.strip_prefix(src()).unwrap().display().to_string())
        })
        .collect();
    sizes.sort();
    sizes.reverse();
    println!("longest files of src/: {:?}", &sizes[..5.min(sizes.len())]);
    let long: Vec<_> = sizes.iter().filter(|(n, _)| *n > MOST_LINES).collect();
    assert!(long.is_empty(), "files over {MOST_LINES} lines: {long:?}");
}
