//! Every repository path that `README.md` and `docs/*.md` name exists, so the docs cannot
//! point at a file that moved or went away (`docs/results/` holds dated records of runs
//! and is left as written), and README's Layout table has a row for every crate.
//!
//! A path is a backquoted word with a `/` whose first part is a top-level directory of the
//! repository or a crate (`kvc-cache/src/paged.rs` is `crates/kvc-cache/src/paged.rs`);
//! `{a,b}` stands for both; `fuzz/NAME` may name the fuzz target
//! `fuzz/fuzz_targets/NAME.rs`. Words with `*`, `<`, `>` or `$` are patterns, not paths,
//! and paths relative to a crate (`tests/kvq.rs`) or outside the tree (`.cache/llama`,
//! `target/asan`) are not checked here.

use std::collections::BTreeSet;
use std::fs;

use kvc_layering::{expand_braces, first_cells, repo_root};

const TOP: [&str; 9] = [
    "crates",
    "docs",
    "scripts",
    "fuzz",
    "ffi-tests",
    "integrations",
    "data",
    "include",
    "cmake",
];

/// The paths `text` names, as written (braces expanded).
fn named_paths(text: &str) -> Vec<String> {
    let mut paths = Vec::new();
    for token in text.split('`').skip(1).step_by(2) {
        if !token.contains('/')
            || token.contains(char::is_whitespace)
            || token.contains(['*', '<', '>', '$'])
        {
            continue;
        }
        let first = token.split('/').next().unwrap_or_default();
        if TOP.contains(&first) || first.starts_with("kvc-") {
            paths.extend(expand_braces(token));
        }
    }
    paths
}

fn exists(path: &str) -> bool {
    let root = repo_root();
    let fuzz_target = path
        .strip_prefix("fuzz/")
        .map(|t| root.join(format!("fuzz/fuzz_targets/{t}.rs")));
    root.join(path).exists()
        || root.join("crates").join(path).exists()
        || fuzz_target.is_some_and(|p| p.is_file())
}

#[test]
fn every_path_the_docs_name_exists() {
    let root = repo_root();
    let mut docs = vec![root.join("README.md")];
    for e in fs::read_dir(root.join("docs")).expect("docs/") {
        let p = e.expect("docs entry").path();
        if p.extension().is_some_and(|x| x == "md") {
            docs.push(p);
        }
    }
    let mut wrong = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = fs::read_to_string(doc).expect("doc");
        for p in named_paths(&text) {
            checked += 1;
            if !exists(&p) {
                let name = doc.strip_prefix(&root).unwrap_or(doc).display().to_string();
                wrong.push(format!("{name} names {p}, which does not exist"));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} paths found: the scan is broken"
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The crates README's "Layout" table names in its first column (`crates/NAME`).
fn readme_layout_crates() -> BTreeSet<String> {
    first_cells("README.md", "## ", "Layout")
        .into_iter()
        .flatten()
        .filter_map(|token| {
            let name = token.strip_prefix("crates/")?;
            Some(name.trim_end_matches('/').to_string())
        })
        .collect()
}

#[test]
fn the_readme_layout_has_a_row_for_every_crate() {
    let mut crates = BTreeSet::new();
    for e in fs::read_dir(repo_root().join("crates")).expect("crates/") {
        let p = e.expect("crates entry").path();
        if p.join("Cargo.toml").is_file() {
            crates.insert(p.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    let named = readme_layout_crates();
    let missing: Vec<_> = crates.difference(&named).collect();
    let extra: Vec<_> = named.difference(&crates).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "README.md's Layout table: no row for {missing:?}; rows for crates that are not there: {extra:?}"
    );
}

#[test]
fn a_missing_path_is_found() {
    let text = "see `kvc-quant/src/c8.rs` and `crates/kvc-types/src/{dtype,tensor}.rs`";
    let paths = named_paths(text);
    assert_eq!(
        paths,
        [
            "kvc-quant/src/c8.rs",
            "crates/kvc-types/src/dtype.rs",
            "crates/kvc-types/src/tensor.rs"
        ]
    );
    assert!(!exists(&paths[0]) && exists(&paths[1]) && exists(&paths[2]));
}
