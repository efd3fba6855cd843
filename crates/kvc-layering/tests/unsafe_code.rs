//! Where kvc has `unsafe` code, the two lists that must follow it do: every crate with
//! `unsafe` in its `src/` is in `scripts/asan-tests.sh`'s default run, and every such file
//! is named in `docs/DEVELOPING.md`'s table "Unsafe code: invariants and the tests that
//! exercise them" (a directory named there, `src/simd/`, names the files under it).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use kvc_layering::repo_root as root;

/// Whether `line` uses the keyword `unsafe` before any `//` comment (`unsafe_code` in a
/// lint name and the word in comments are not uses).
fn uses_unsafe(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or_default();
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    code.match_indices("unsafe").any(|(i, w)| {
        !word(code[..i].chars().next_back()) && !word(code[i + w.len()..].chars().next())
    })
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries {
        let path = e.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// `crate/src/...rs` (relative to `crates/`) of every source file that uses `unsafe`.
fn unsafe_files() -> BTreeSet<String> {
    let crates = root().join("crates");
    let mut found = BTreeSet::new();
    for c in fs::read_dir(&crates).expect("crates/") {
        let dir = c.expect("crate directory").path();
        let mut files = Vec::new();
        rust_files(&dir.join("src"), &mut files);
        for f in files {
            let text = fs::read_to_string(&f).expect("source file");
            if text.lines().any(uses_unsafe) {
                let rel = f.strip_prefix(&crates).expect("under crates/");
                found.insert(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    assert!(
        found.iter().any(|f| f.starts_with("kvc-capi/")),
        "the scan found no unsafe code in kvc-capi: it is not looking at the sources"
    );
    found
}

/// The crates `scripts/asan-tests.sh` runs when given none: its one `all=(...)` line.
fn sanitizer_crates() -> BTreeSet<String> {
    let script = fs::read_to_string(root().join("scripts/asan-tests.sh")).expect("asan-tests.sh");
    let line = script
        .lines()
        .find_map(|l| l.strip_prefix("all=("))
        .expect("scripts/asan-tests.sh: a line `all=(crate ...)`");
    line.strip_suffix(')')
        .expect("scripts/asan-tests.sh: `all=(...)` on one line")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
fn every_crate_with_unsafe_code_is_in_the_sanitizer_run() {
    let listed = sanitizer_crates();
    let needed: BTreeSet<String> = unsafe_files()
        .iter()
        .map(|f| f.split('/').next().expect("crate").to_string())
        .collect();
    let missing: Vec<&String> = needed.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "crates with unsafe code missing from scripts/asan-tests.sh's all=(...): {missing:?}"
    );
    for c in &listed {
        assert!(
            root().join("crates").join(c).join("Cargo.toml").is_file(),
            "scripts/asan-tests.sh lists {c}, which is not a crate"
        );
    }
}

/// The first cell of each row of DEVELOPING.md's unsafe-code table, as paths relative to
/// `crates/`: `{a,b}` expanded, a bare file name taken in the directory of the path before
/// it (`kvc-capi/src/boundary.rs`, `handle.rs`).
fn unsafe_table_paths() -> Vec<String> {
    let mut paths = Vec::new();
    for row in kvc_layering::first_cells("docs/DEVELOPING.md", "### ", "Unsafe code") {
        let mut dir = String::new();
        for token in row {
            for p in kvc_layering::expand_braces(&token) {
                let p = if p.contains('/') {
                    p
                } else {
                    format!("{dir}{p}")
                };
                dir = p[..p.rfind('/').map_or(0, |i| i + 1)].to_string();
                paths.push(p);
            }
        }
    }
    assert!(
        paths.len() > 10,
        "DEVELOPING.md: the unsafe table looks empty"
    );
    paths
}

#[test]
fn the_unsafe_table_names_every_file_with_unsafe_code_and_only_real_ones() {
    let crates = root().join("crates");
    let named = unsafe_table_paths();
    let mut wrong = Vec::new();
    for p in &named {
        if !crates.join(p).exists() {
            wrong.push(format!(
                "DEVELOPING.md's unsafe table names {p}, which does not exist"
            ));
        }
    }
    for f in unsafe_files() {
        if !named
            .iter()
            .any(|p| *p == f || (p.ends_with('/') && f.starts_with(p.as_str())))
        {
            wrong.push(format!(
                "crates/{f} has unsafe code and no row in DEVELOPING.md's unsafe table"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
